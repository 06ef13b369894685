"""Phase 1 — ``fused_rowwise``: one fused kernel, one thread per query row.

Change against ``naive``: S and P never exist in memory. Each thread owns one
query row ``i``: it keeps ``Q_i`` (pre-multiplied by the softmax scale) and
its output accumulator in per-thread arrays, walks the keys one at a time,
and folds each score into the running max ``m`` and sum ``l`` with the
online-softmax update. K and V are read straight from global memory.

Prediction: the round trips of S and P and two of the three launches
disappear; the time drops to the arithmetic (two exps per key) plus the K/V
reads from L1/L2.

Verdict: 32.24 ms at B1 H32 N4096 D64 fp32 (H200), 5.94x naive [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.device_functions import row_key_step, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.phases.cuda_core.common import kv_head, row_block_launch, start_row_q, store_row
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.stages import PLAIN


@functools.cache
def make_kernel(D: int, THREADS: int, causal: bool, stage=PLAIN):
    key_step = row_key_step(D, stage.modified)
    store = store_row(D, stage)

    @kernel
    def fused_rowwise(q, k, v, o, scale, H, G, Nq, Nk, mods):
        i = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        bh = cuda.blockIdx.y
        if i >= Nq:
            return
        kvh = kv_head(bh, H, G)
        Q_i = cuda.local.array(D, float32)
        O_i = cuda.local.array(D, float32)
        m, l = start_row_q(Q_i, O_i, q, bh, i, scale, True)
        at = (bh // H, bh % H, i + Nk - Nq)  # (b, h, q_idx): where the row is, for the variant
        for j in range(visible_keys(i, Nq, Nk, causal)):
            if stage.visible(at[0], at[1], at[2], j, mods):  # s = Q_i·K_j, online softmax, O_i += p·V_j
                m, l = key_step(Q_i, O_i, k, v, kvh, j, m, l, at, mods)
        store(o, bh, i, 0, O_i, m, l, mods)

    return fused_rowwise


@register_phase(
    name="fused_rowwise", order=1, title="Fused, one thread per query row",
    parent="naive",
    description="""
        One kernel instead of three: each thread computes one output row with the
        online softmax (running max m, running sum l, rescaled accumulator), so S
        and P are never written. K and V are read straight from global memory.
    """,
    lineage="Online softmax (Milakov & Gimelshein 2018) fused into attention, as in "
            "FlashAttention (Dao et al. 2022) before tiling",
    planned_speedup=4.0,
    space={"threads": [32, 64, 128, 256]},
    variants=True,
    lse=True,
)
def fused_rowwise(problem, threads=128):
    kern = make_kernel(problem.head_dim, threads, problem.causal, stages_for(problem))
    return row_block_launch(kern, problem, threads, threads)
