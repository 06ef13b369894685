"""``paged_split_k``'s ``step_heads`` (the mma path: a warp step's 16 rows are 16 / S tokens × S adjacent KV heads,
so a step reads S heads' rows of a token as S·128 contiguous bytes) under its own names, timed beside the default
(S = 1: 16 tokens of one head, a 128-byte row every Hkv·128 bytes) in one run, on ``eight_bit.py``'s presets
(``paged-8bit-16k``, ``paged-8bit-32k``).

    PYTHONPATH=experiments/2026-11-26-decode-profile python3 -m numba_attn.cli bench paged --setup step_heads \\
        --preset paged-8bit-16k --phases paged_split_k,psk_sh2,psk_sh4,psk_sh8,decode_split_k_lean
"""
from __future__ import annotations

import eight_bit  # noqa: F401  (the presets)

from numba_attn.phases.registry import register_variant

for sh in (1, 2, 4, 8):  # (psk_sh1: the default before 2 became it, for part j)
    register_variant("paged_split_k", f"psk_sh{sh}", order=35 + sh / 100, step_heads=sh)
