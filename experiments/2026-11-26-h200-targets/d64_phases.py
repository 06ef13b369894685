"""Out-of-tree settings of the wgmma phases at head_dim 64 (issue 16's D64 targets on an H200), each under its
own name so that one run times them all beside SDPA:

* ``tma_s3``, ``tma_bc128``, ``tma_bc128_s3`` — ``tma_wgmma`` with a 3-stage ring, 128-key tiles, both;
* ``tma_wg3``, ``tma_wg3_s3`` — ``tma_wgmma`` with three warpgroups (192 query rows a block), 2 or 3 stages;
* ``ws3`` (``warp_specialized_tc`` with three consumers, as in the persistent run), ``ws3_bc128``, ``ws3_s3``;
* ``pp_bc128`` — ``pingpong`` with 128-key tiles.

    PYTHONPATH=experiments/2026-11-26-h200-targets python3 -m numba_attn.cli run --gpu --setup d64_phases \\
        --phases tma_wgmma,tma_s3,... -B 4 -H 32 -N 2048 -D 64 --dtype bfloat16 --peers torch_sdpa,torch_sdpa_cudnn
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant

register_variant("tma_wgmma", "tma_s3", order=25.1, stages=3)
register_variant("tma_wgmma", "tma_bc128", order=25.2, Bc=128)
register_variant("tma_wgmma", "tma_bc128_s3", order=25.3, Bc=128, stages=3)
register_variant("tma_wgmma", "tma_wg3", order=25.4, warpgroups=3)
register_variant("tma_wgmma", "tma_wg3_s3", order=25.5, warpgroups=3, stages=3)
register_variant("warp_specialized_tc", "ws3", order=26.6, warpgroups=3)
register_variant("warp_specialized_tc", "ws3_bc128", order=26.7, warpgroups=3, Bc=128)
register_variant("warp_specialized_tc", "ws3_s3", order=26.8, warpgroups=3, stages=3)
register_variant("pingpong", "pp_bc128", order=27.1, Bc=128)
