"""Phase 4 — ``segmented_out``: the output accumulator split into segments.

Change against ``q_smem``: a query row is no longer one thread's. Its D
output columns are split into NSEG = D/SEG segments, each owned by one
thread in registers (``O_seg``); each of these threads computes the row's
full dot product ``Q_i · K_j`` itself (``common.segment_rows``). SEG trades
registers (SEG instead of D per thread) and parallelism (NSEG× the threads)
against work (QKᵀ and the exps done NSEG times); SEG = D is the parent.

Prediction: at D=64 SEG=32 is ~1.2× q_smem (twice the warps, 1.5× the FLOPs,
fewer registers); at D=128 SEG=64 ~1.3× q_smem.

Verdict: 44.93 ms at B1 H32 N4096 D64 fp32 (H200), 0.80x q_smem (missed) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, load_tile_t_scaled
from numba_attn.phases.cuda_core.common import (block_walk, load_kv, register_cap, resolve_seg, segment_launch,
                                                segment_rows, segment_supports, segment_thread, start_row, store_row)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.stages import PLAIN


def smem_floats(D, Br, Bc):
    return D * Br + 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, SEG: int, causal: bool, stage=PLAIN):
    K_OFF = D * Br
    V_OFF = K_OFF + Bc * D
    NT = Br * (D // SEG)
    keys, _, tile = block_walk(Br, Bc, causal, stage)
    rows = segment_rows(D, SEG, stage)
    store = store_row(SEG, stage)

    @kernel(**register_cap(D, Br, SEG))
    def segmented_out(q, k, v, o, scale, H, G, Nq, Nk, mods):
        Q_t = dynamic_tile(0, D, Br)  # Qᵀ · scale
        K_j = dynamic_tile(K_OFF, Bc, D)
        V_j = dynamic_tile(V_OFF, Bc, D)
        tid, r, c0, i, bh, kvh = segment_thread(Br, SEG, H, G)
        row_ok = i < Nq
        load_tile_t_scaled(Q_t, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        m, l = start_row(O_seg)
        n_keys, block_keys, where = keys(i, bh, H, Nq, Nk, mods)  # a variant: its visited tiles
        for jv in range(0, block_keys, Bc):
            j0, at = tile(where, jv, mods)  # where the tile is, for the variant
            load_kv(K_j, V_j, k, v, kvh, j0, Nk, tid, NT)
            cuda.syncthreads()
            if row_ok:
                m, l = rows(Q_t, K_j, V_j, r, c0, min(Bc, n_keys - j0), m, l, O_seg, at, mods)
            cuda.syncthreads()
        if row_ok:
            store(o, bh, i, c0, O_seg, m, l, mods)

    return segmented_out


@register_phase(
    name="segmented_out", order=4, title="Output split into register segments",
    parent="q_smem",
    description="""
        D/SEG threads per query row, each owning SEG columns of O in registers and
        recomputing the row's scores (K re-read once per segment): fewer registers and
        more warps for more QKᵀ work. SEG is the parameter of the trade-off.
    """,
    lineage="Splitting the head dimension across threads, as in FlashAttention-2's "
            "work partitioning (Dao 2023) but without sharing the scores",
    planned_speedup=7.0,
    space={"Br": [32, 64, 128], "Bc": [16, 32, 64], "SEG": [8, 16, 32, 64, 128]},
    sim_params={"Br": 32, "Bc": 16, "SEG": 8},
    supports=segment_supports(smem_floats),
    resolve=resolve_seg,
    variants=True,
    lse=True,
)
def segmented_out(problem, Br=64, Bc=32, SEG=128):
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, problem.causal, stages_for(problem))
    return segment_launch(kern, problem, Br, SEG, 4 * smem_floats(problem.head_dim, Br, Bc), Bc=Bc)
