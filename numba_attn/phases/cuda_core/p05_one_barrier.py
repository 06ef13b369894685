"""Phase 5 — ``one_barrier``: one barrier per K/V tile instead of two.

Change against ``segmented_out``: K and V get two shared-memory stages. The
load of tile t+1 goes into the stage tile t−1 used, so the single barrier at
the top of iteration t covers both hazards (read after write of tile t, write
after read of tile t−1)::

    load tile 0 → stage 0
    for t:  barrier;  load tile t+1 → stage (t+1)%2;  compute tile t from stage t%2

Prediction: a barrier pair sits between ~3000 FMAs per thread (D=64, SEG=32,
Bc=32), so removing one gains little: ~1.05× segmented_out.

Verdict: 47.55 ms at B1 H32 N4096 D64 fp32 (H200), 0.94x segmented_out (missed) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.device_functions import load_tile
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, load_tile_t_scaled
from numba_attn.phases.cuda_core.common import (block_walk, register_cap, resolve_seg, segment_launch, segment_rows,
                                                segment_supports, segment_thread, start_row, store_row)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.stages import PLAIN


def smem_floats(D, Br, Bc):
    return D * Br + 2 * 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, SEG: int, causal: bool, stage=PLAIN):
    K_OFF = D * Br
    V_OFF = K_OFF + 2 * Bc * D  # two stages each
    NT = Br * (D // SEG)
    rows = segment_rows(D, SEG, stage)
    store = store_row(SEG, stage)
    keys, start, tile = block_walk(Br, Bc, causal, stage)

    @kernel(**register_cap(D, Br, SEG))
    def one_barrier(q, k, v, o, scale, H, G, Nq, Nk, mods):
        Q_t = dynamic_tile(0, D, Br)  # Qᵀ · scale
        tid, r, c0, i, bh, kvh = segment_thread(Br, SEG, H, G)
        row_ok = i < Nq
        load_tile_t_scaled(Q_t, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        m, l = start_row(O_seg)
        n_keys, block_keys, where = keys(i, bh, H, Nq, Nk, mods)  # a variant: its visited tiles
        first = start(where, 0, mods)
        load_tile(dynamic_tile(K_OFF, Bc, D), k, kvh, first, Nk, tid, NT)
        load_tile(dynamic_tile(V_OFF, Bc, D), v, kvh, first, Nk, tid, NT)
        for jv in range(0, block_keys, Bc):
            j0, at = tile(where, jv, mods)  # where the tile is, for the variant
            st = (jv // Bc) & 1
            K_j = dynamic_tile(K_OFF + st * (Bc * D), Bc, D)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 stored; every thread is done with the other stage
            if jv + Bc < block_keys:
                j_next = start(where, jv + Bc, mods)
                load_tile(dynamic_tile(K_OFF + (1 - st) * (Bc * D), Bc, D), k, kvh, j_next, Nk, tid, NT)
                load_tile(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), v, kvh, j_next, Nk, tid, NT)
            if row_ok:
                m, l = rows(Q_t, K_j, V_j, r, c0, min(Bc, n_keys - j0), m, l, O_seg, at, mods)
        if row_ok:
            store(o, bh, i, c0, O_seg, m, l, mods)

    return one_barrier


@register_phase(
    name="one_barrier", order=5, title="One barrier per K/V tile (two stages)",
    parent="segmented_out",
    description="""
        Two shared-memory stages for K and V: the next tile is loaded into the stage the
        previous tile used, right after the single barrier of the iteration, so each tile
        costs one barrier instead of two.
    """,
    lineage="Ping-pong shared buffers with one __syncthreads per tile (standard CUDA "
            "tiling practice, e.g. CUTLASS's two-stage mainloop)",
    planned_speedup=7.5,
    space={"Br": [32, 64, 128], "Bc": [16, 32, 64], "SEG": [8, 16, 32, 64, 128]},
    sim_params={"Br": 32, "Bc": 16, "SEG": 8},
    supports=segment_supports(smem_floats),
    resolve=resolve_seg,
    variants=True,
    lse=True,
)
def one_barrier(problem, Br=64, Bc=32, SEG=64):
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, problem.causal, stages_for(problem))
    return segment_launch(kern, problem, Br, SEG, 4 * smem_floats(problem.head_dim, Br, Bc), Bc=Bc)
