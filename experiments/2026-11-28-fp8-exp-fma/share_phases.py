"""Out-of-tree names for timing ``fp8_exp_fma``'s shares in the same run as its default (one n-tile in four on the
FMA pipe): ``fp8_exp_fma_2`` (two in four) and ``fp8_exp_fma_3`` (three in four):

    PYTHONPATH=experiments/2026-11-28-fp8-exp-fma python3 -m numba_attn.cli run --gpu --setup share_phases \\
        --phases fp8_overlap,fp8_exp_fma,fp8_exp_fma_2,fp8_exp_fma_3 ...
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant

fp8_exp_fma_2 = register_variant("fp8_exp_fma", "fp8_exp_fma_2", fma_share=2)
fp8_exp_fma_3 = register_variant("fp8_exp_fma", "fp8_exp_fma_3", fma_share=3)
