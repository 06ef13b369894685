"""``paged_split_k`` and ``paged_worklist`` with ``ahead=True`` (a warp reads its next step's page index during
this step) under their own names, timed beside the defaults in one run, and the preset ``paged-uniform``
(``paged_uniform.py``):

    PYTHONPATH=experiments/2026-11-26-h200-targets python3 -m numba_attn.cli bench paged --setup ahead_phases \\
        --preset paged-uniform --preset paged-ragged --phases paged_split_k,psk_ahead,paged_worklist,pwl_ahead,...
"""
from __future__ import annotations

import paged_uniform  # noqa: F401  (the preset)

from numba_attn.phases.registry import register_variant

register_variant("paged_split_k", "psk_ahead", order=35.1, ahead=True)
register_variant("paged_worklist", "pwl_ahead", order=39.1, ahead=True)
