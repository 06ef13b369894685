"""Phase 9 — ``register_blocked``: micro-tiles of S and O in registers.

Change against ``double_buffer``: the work of a block is no longer split by
query row. Each thread computes a TM×TN micro-tile of the score tile S
(TM query rows × TN keys) and a TM×TD micro-tile of the output O (TM rows ×
TD = D·TN/Bc columns), both held in registers:

* S = Q Kᵀ as outer products: for each d the thread loads a Q fragment (TM
  values) and a K fragment (TN values) with 16-byte shared loads and does
  TM·TN FMAs, so a value read from shared memory serves TN (or TM) FMAs
  instead of one. Q and K sit transposed in shared memory (Qᵀ: D × Br,
  Kᵀ: D × Bc) so both fragments are contiguous; a warp's lanes read 4 Q
  pieces and 8 K pieces (broadcasts, no bank conflict).
* tile-wise online softmax: one rescale per tile and row instead of one per
  key. The row maximum of the tile is reduced over the KG = Bc/TN lanes that
  share the rows (xor shuffles inside the warp), then
  ``online_softmax_rescale2`` (base 2: log2(e) is folded into the Q scale,
  so p = exp2(s − m) is one ex2 per score). The running sum l stays a
  per-thread partial sum and is reduced once at the end.
* P goes through shared memory (Pᵀ: Bc × Br) and O += P V is again an outer
  product per key: a P fragment (TM) and a V fragment (TD) per FMA block.
* the K/V double buffering of the parent (register staging, two shared
  stages) is kept; K is staged transposed.

Per thread and tile the inner loops issue one 16-byte shared load per
TM·TN/2 (S) or TM·TD/(TM/4 + TD/4) (O) FMAs, instead of one shared load
per FMA (or per 4 FMAs with the parent's vector loads): the kernel should
move from shared-memory-issue-bound to FFMA-bound.

Prediction: the parent runs at ~6 TFLOP/s at
B1 H32 N4096 D64 fp32 (one shared load per 4 FMAs and per-key exps);
this phase should reach 25–30 TFLOP/s on an H200 (FFMA ceiling ≈ 44 in
numba, ~85% of the issued instructions FFMA), i.e. ≥ 0.75× SDPA fp32
(≈ 34 TFLOP/s) and 30× the naive baseline. Registers ≈ 100–128 with
TM = TN = 4, no local memory.

Causal: the loop stops at the last key the block's last row sees (as in
every phase since ``smem_kv``); every element of every tile is compared
with its row's causal limit and with kv_len. ``causal_skip`` masks only the
tiles that need it.

Verdict: 4.29 ms at B1 H32 N4096 D64 fp32 (H200), 1.56x double_buffer, 0.94x SDPA fp32 [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.phases.cuda_core.common import (geometry, make_register_blocked, register_blocked_reason,
                                                resolve_register_blocked, row_block_launch)
from numba_attn.phases.registry import register_phase


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
)
def register_blocked(problem, Br=128, Bc=32, TM=4, TN=0, maxreg=0):
    """TN=0: 8 keys per thread up to head_dim 64, 4 above; maxreg=0: no cap below the
    launch bounds' (the kernel itself is ``common.make_register_blocked``)."""
    kern = make_register_blocked(problem.head_dim, Br, Bc, TM, TN, maxreg, problem.causal,
                                 skip=False, heavy_first=False)
    _, NT, _, smem = geometry(problem.head_dim, Br, Bc, TM, TN)
    return row_block_launch(kern, problem, Br, NT, smem * 4, scale=problem.sm_scale * LOG2E)
