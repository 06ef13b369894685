"""Out-of-tree phases for the head_dim 64 gap (issue 16: ≥ 0.9× SDPA; best measured 0.87×, `tma_wgmma` at
a4371ec, against 0.77× for the phase chosen since): more computing warpgroups per SM. The CLI's ``--param``
sets one value per phase, so each variant gets a name:

* ``tma_uniform`` — ``tma_wgmma`` with ``uniform=True`` (its two blocks per SM at D64, 122–124 registers, four
  computing warpgroups per SM, each loading its own tiles);
* ``ws3`` — ``warp_specialized_tc`` with three consumer warpgroups (FlashAttention-3's D64 split: 192 query
  rows per block; 512 threads, 128 registers at entry; offline sm_90a at B4 H32 N2048 D64 fp16: 128
  registers, no spill at Bc=64; 8 bytes spilled at Bc=128);
* ``ws3_uniform`` — the same with ``uniform=True`` (offline: no spill at Bc=64, 20 bytes at Bc=128).

    PYTHONPATH=experiments/2026-11-23-hopper-tma python3 -m numba_attn.cli run --gpu --setup d64_phases \\
        --phases tma_wgmma,tma_uniform,warp_specialized_tc,ws3,ws3_uniform,ws_overlap -B 4 -H 32 -N 2048 -D 64 ...
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant
from numba_attn.phases.tensor_core.common import build_wgmma


def tma_wgmma_uniform(problem, warpgroups=0, Bc=64, stages=2):
    """tma_wgmma's kernel with the build_wgmma keyword ``uniform`` on (tma_wgmma has no such parameter)."""
    return build_wgmma(problem, warpgroups, Bc, stages, overlap=False, tma=True, uniform=True)


register_variant("tma_wgmma", "tma_uniform", order=25.5, build=tma_wgmma_uniform, note="uniform=True")
register_variant("warp_specialized_tc", "ws3", order=26.6, warpgroups=3)
register_variant("warp_specialized_tc", "ws3_uniform", order=26.7, warpgroups=3, uniform=True)
