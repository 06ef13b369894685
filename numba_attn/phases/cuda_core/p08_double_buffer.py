"""Phase 8 — ``double_buffer``: register-staged prefetch by every thread.

Change against ``vectorized``: the compute threads themselves fetch the next
K/V tile instead of loader warps: at the top of tile t each thread issues its
16-byte global loads of tile t+1 into registers (``ptx_loads.fetch4``),
computes tile t while they are in flight, then writes them into the free
shared stage (``ptx_loads.put4``). Two stages, one barrier per tile; the
staging costs Bc·D·2/threads registers per thread.

Prediction: the parent's loader warps were idle most of the time and the
compute warps' own latency is now hidden the same way; ~1.1× vectorized.

Verdict: 6.69 ms at B1 H32 N4096 D64 fp32 (H200), 1.06x vectorized (smaller) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, fetch4, load_tile4, put4
from numba_attn.phases.cuda_core.common import (block_walk, register_cap, resolve_seg, segment_launch,
                                                segment_rows4, segment_supports, segment_thread, start_row, store_row)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.stages import PLAIN

QPAD = 4  # Q rows padded to D+4 floats: conflict-free 16-byte row reads


def smem_floats(D, Br, Bc):
    return Br * (D + QPAD) + 2 * 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, SEG: int, causal: bool, stage=PLAIN):
    QW = D + QPAD  # Q row stride (floats)
    K_OFF = Br * QW
    V_OFF = K_OFF + 2 * Bc * D  # two stages each
    NT = Br * (D // SEG)
    rows = segment_rows4(D, SEG, stage)
    store = store_row(SEG, stage)
    keys, start, tile = block_walk(Br, Bc, causal, stage)
    STAGE = (Bc * D // 4 + NT - 1) // NT * 4  # floats staged per thread and tile (K, and V)

    @kernel(**register_cap(D, Br, SEG))
    def double_buffer(q, k, v, o, scale, H, G, Nq, Nk, mods):
        Q_s = dynamic_tile(0, Br, QW)  # Q · scale, rows padded
        tid, r, c0, i, bh, kvh = segment_thread(Br, SEG, H, G)
        row_ok = i < Nq
        load_tile4(Q_s, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        m, l = start_row(O_seg)
        n_keys, block_keys, where = keys(i, bh, H, Nq, Nk, mods)  # a variant: its visited tiles
        first = start(where, 0, mods)
        stage_k = cuda.local.array(STAGE, float32)
        stage_v = cuda.local.array(STAGE, float32)
        fetch4(stage_k, k, kvh, first, Nk, tid, NT, Bc, D)
        fetch4(stage_v, v, kvh, first, Nk, tid, NT, Bc, D)
        put4(dynamic_tile(K_OFF, Bc, D), stage_k, tid, NT, Bc, D)
        put4(dynamic_tile(V_OFF, Bc, D), stage_v, tid, NT, Bc, D)
        for jv in range(0, block_keys, Bc):
            j0, at = tile(where, jv, mods)  # where the tile is, for the variant
            st = (jv // Bc) & 1
            K_j = dynamic_tile(K_OFF + st * (Bc * D), Bc, D)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 stored; every thread is done with the other stage
            has_next = jv + Bc < block_keys
            if has_next:  # global loads of the next tile in flight during this tile's math
                j_next = start(where, jv + Bc, mods)
                fetch4(stage_k, k, kvh, j_next, Nk, tid, NT, Bc, D)
                fetch4(stage_v, v, kvh, j_next, Nk, tid, NT, Bc, D)
            if row_ok:
                m, l = rows(Q_s, K_j, V_j, r, c0, min(Bc, n_keys - j0), m, l, O_seg, at, mods)
            if has_next:  # the other stage was last read before this tile's barrier
                put4(dynamic_tile(K_OFF + (1 - st) * (Bc * D), Bc, D), stage_k, tid, NT, Bc, D)
                put4(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), stage_v, tid, NT, Bc, D)
        if row_ok:
            store(o, bh, i, c0, O_seg, m, l, mods)

    return double_buffer


@register_phase(
    name="double_buffer", order=8, title="Register-staged double buffering",
    parent="vectorized",
    description="""
        Every thread fetches its share of the next K/V tile into registers before
        computing the current tile and stores it into the free shared stage afterwards;
        the loader warps are gone.
    """,
    lineage="Software pipelining with register staging (prefetch into registers, as in "
            "pre-Ampere CUTLASS and the SGEMM of Volkov & Demmel 2008)",
    planned_speedup=15.0,
    space={"Br": [32, 64, 128], "Bc": [16, 32, 64], "SEG": [16, 32, 64, 128]},
    sim_params={"Br": 32, "Bc": 16, "SEG": 8},
    supports=segment_supports(smem_floats, vec4=True),
    resolve=resolve_seg,
    variants=True,
    lse=True,
)
def double_buffer(problem, Br=128, Bc=32, SEG=64):
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, problem.causal, stages_for(problem))
    return segment_launch(kern, problem, Br, SEG, 4 * smem_floats(problem.head_dim, Br, Bc), Bc=Bc)
