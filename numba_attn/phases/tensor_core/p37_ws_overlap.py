"""Phase 37 — ``ws_overlap``: warp specialisation with the next tile's Q·Kᵀ in flight during the softmax.

Change against ``warp_specialized_tc``: each consumer warpgroup runs ``tc_wgmma_overlap``'s mainloop
(:func:`.p24_tc_wgmma_overlap.overlap_mainloop`) with the registers setmaxnreg gives it, so the second score set
costs no occupancy here; three ring stages, ``uniform`` on by default.

Prediction: +5-10% against warp_specialized_tc at B1 H32 N4096 D128 fp16 (~0.48 ms); refuted below +2%.

Verdict: refuted, 0.567 ms at B1 H32 N4096 D128 fp16 (0.83x SDPA, H200), 1.03x warp_specialized_tc's time.
[results/tensor-core-tma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import (TWO_CONSUMERS_SIM, build_wgmma, resolve_two_consumers,
                                                  two_consumers_reason, wgmma_registration)
from numba_attn.phases.tensor_core.p24_tc_wgmma_overlap import overlap_mainloop

MAX_BC = 64  # Bc=128: the two score sets and O need more than 232 registers (spills, serialized wgmma)


def _supports(problem, warpgroups, Bc, stages, **_):
    if Bc > MAX_BC:
        return (f"Bc={Bc}: the second score set (Bc/2 registers) does not fit above Bc={MAX_BC} "
                "(spills, serialized wgmma)")
    return two_consumers_reason(problem, warpgroups, Bc, stages, "the register split is made for", min_stages=3)


@register_phase(
    name="ws_overlap", order=37,
    title="Tensor cores: warp specialisation with the next Q·Kᵀ issued before this tile's softmax",
    parent="warp_specialized_tc",
    description="""
        warp_specialized_tc whose consumer warpgroups issue S_{j+1} = Q·K_{j+1}ᵀ before the
        softmax of tile j and retire it with P_j·V_j in one wgmma wait (FlashAttention-3's
        intra-warpgroup overlap), with the registers setmaxnreg gives the consumers; three
        ring stages.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.2 intra-warpgroup overlapping of GEMMs and softmax",
    planned_speedup=170.0,  # warp_specialized_tc's 160 and the predicted +5-10%
    **wgmma_registration(_supports, resolve_two_consumers,
                         {"warpgroups": [2], "Bc": [64], "stages": [3, 4], "uniform": [False, True]},
                         TWO_CONSUMERS_SIM),
)
def ws_overlap(problem, warpgroups=0, Bc=64, stages=3, uniform=True):
    """warp_specialized_tc's producer with tc_wgmma_overlap's mainloop; ``uniform`` as there (on by default here)."""
    return build_wgmma(problem, warpgroups, Bc, stages, overlap_mainloop, loads="ws", uniform=uniform)
