"""Phase 9 — ``register_blocked``: micro-tiles of S and O in registers.

Change against ``double_buffer``: each thread computes a TM×TN micro-tile of
the score tile S and a TM×TD micro-tile of O (TD = D·TN/Bc) in registers, as
outer products of 16-byte fragments of Qᵀ, Kᵀ (S = Q Kᵀ), Pᵀ and V (O += P V)
in shared memory: a value read from shared memory serves TN (or TM) FMAs
instead of one. The online softmax is tile-wise in base 2 (one rescale per
tile and row, ``online_softmax_rescale2``); K/V stay double-buffered.

Prediction: from shared-load-issue-bound to FFMA-bound: 25–30 TFLOP/s at
B1 H32 N4096 D64 fp32 on an H200 (parent ~6), ≥ 0.75× SDPA fp32, with
100–128 registers at TM = TN = 4 and no local memory.

Verdict: 4.29 ms at B1 H32 N4096 D64 fp32 (H200), 1.56x double_buffer, 0.94x SDPA [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.phases.cuda_core.common import (geometry, make_register_blocked, register_blocked_reason,
                                                resolve_register_blocked, row_block_launch)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import wants_lse
from numba_attn.variants.stages import stages_of


def _supports(problem, Br, Bc, TM, TN, maxreg):
    return register_blocked_reason(problem, Br, Bc, TM, TN)


@register_phase(
    name="register_blocked", order=9, title="Register-blocked micro-tiles of S and O",
    parent="double_buffer",
    description="""
        Each thread computes a TM×TN micro-tile of S and a TM×TD micro-tile of O in
        registers from 16-byte fragments of Qᵀ, Kᵀ, Pᵀ and V in shared memory (outer
        products), with a tile-wise online softmax in base 2 (one rescale per tile and
        row, log2(e) folded into the Q scale). K/V stay double-buffered.
    """,
    lineage="Register blocking of SGEMM (Volkov & Demmel 2008; CUTLASS thread-level tiles) "
            "applied to both GEMMs of FlashAttention-2 (Dao 2023) on CUDA cores",
    planned_speedup=60.0,
    space={"Br": [64, 128], "Bc": [16, 32, 64], "TM": [2, 4, 8], "TN": [0, 4, 8]},
    sim_params={"Br": 32, "Bc": 16, "TM": 4, "TN": 4, "maxreg": 0},
    supports=_supports,
    resolve=resolve_register_blocked,
    variants=True,
    lse=True,
)
def register_blocked(problem, Br=128, Bc=32, TM=4, TN=0, maxreg=0):
    """TN=0: 8 keys per thread up to head_dim 64, 4 above; maxreg=0: no cap below the
    launch bounds' (the kernel itself is ``common.make_register_blocked``)."""
    kern = make_register_blocked(problem.head_dim, Br, Bc, TM, TN, maxreg, problem.causal, wants_lse(problem),
                                 skip=False, heavy_first=False, stage=stages_of(problem.variant))
    _, NT, _, smem = geometry(problem.head_dim, Br, Bc, TM, TN)
    return row_block_launch(kern, problem, Br, NT, smem * 4, scale=problem.sm_scale * LOG2E, Bc=Bc)
