"""(Needs commit 75e82a4: ``head_group`` was measured slower on every problem of part f and removed after it.)
``paged_split_k``'s ``head_group`` (the mma path: a block reads 2, 4 or 8 adjacent KV heads, its 8 warps shared
among them) under its own names, timed beside the default (one KV head a block) in one run, on ``eight_bit.py``'s
presets (B8 H32 D128 P64 at 16k and 32k keys, fp8 per head, int8 per head and per token).

    PYTHONPATH=experiments/2026-11-26-decode-profile python3 -m numba_attn.cli bench paged --setup head_group \\
        --preset paged-8bit-16k --phases paged_split_k,psk_hg2,psk_hg4,psk_hg8,decode_split_k_lean
"""
from __future__ import annotations

import eight_bit  # noqa: F401  (the presets)

from numba_attn.phases.registry import register_variant

for hg in (2, 4, 8):
    register_variant("paged_split_k", f"psk_hg{hg}", order=35 + hg / 100, head_group=hg)
