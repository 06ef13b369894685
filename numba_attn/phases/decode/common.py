"""The decode family's shared code, by role: ``rules`` (limits, tilings, split plans, supports checks),
``steps`` (the warp-step loop), ``launch`` (split-K workspace and launch), ``kv8`` (8-bit dequantisation),
``paged`` (block-table addressing, paged launch, work lists), ``frag8`` (the 8-bit fragment kernel); each
phase's kernel is in its phase's file. This module keeps the name other packages import from here."""
from __future__ import annotations

from numba_attn.phases.decode.paged import paged_scales

__all__ = ["paged_scales"]
