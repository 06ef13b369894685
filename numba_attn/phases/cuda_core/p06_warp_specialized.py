"""Phase 6 — ``warp_specialized``: loader warps and compute warps.

Change against ``one_barrier``: the block gets ``loader_warps`` extra warps
that only load K/V tiles; while the compute warps work on tile t from one
stage, the loaders fill the other with tile t+1, and the one barrier per tile
hands the stages over::

    loaders: load tile 0 → stage 0
    for t:  barrier
            loaders: load tile t+1 → stage (t+1)%2   |   compute: tile t from stage t%2

Prediction: with one shared load per FMA the compute warps are issue-bound,
not latency-bound, so the overlap buys little: ~1.05× one_barrier.

Verdict: 44.19 ms at B1 H32 N4096 D64 fp32 (H200), 1.08x one_barrier (as predicted) [results/roadmap-nvidia-h200.jsonl]
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
def make_kernel(D: int, Br: int, Bc: int, SEG: int, loader_warps: int, causal: bool, stage=PLAIN):
    K_OFF = D * Br
    V_OFF = K_OFF + 2 * Bc * D  # two stages each
    NT = Br * (D // SEG)  # compute threads; the loader warps come after them
    rows = segment_rows(D, SEG, stage)
    store = store_row(SEG, stage)
    keys, start, tile = block_walk(Br, Bc, causal, stage)
    NL = 32 * loader_warps

    @kernel(**register_cap(D, Br, SEG, loader_warps))
    def warp_specialized(q, k, v, o, scale, H, G, Nq, Nk, mods):
        Q_t = dynamic_tile(0, D, Br)  # Qᵀ · scale
        tid, r, c0, i, bh, kvh = segment_thread(Br, SEG, H, G)
        loader = tid >= NT
        lid = tid - NT  # loader lane
        row_ok = i < Nq and not loader
        load_tile_t_scaled(Q_t, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT + NL, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        m, l = start_row(O_seg)
        n_keys, block_keys, where = keys(i, bh, H, Nq, Nk, mods)  # a variant: its visited tiles
        first = start(where, 0, mods)
        if loader:
            load_tile(dynamic_tile(K_OFF, Bc, D), k, kvh, first, Nk, lid, NL)
            load_tile(dynamic_tile(V_OFF, Bc, D), v, kvh, first, Nk, lid, NL)
        for jv in range(0, block_keys, Bc):
            j0, at = tile(where, jv, mods)  # where the tile is, for the variant
            st = (jv // Bc) & 1
            K_j = dynamic_tile(K_OFF + st * (Bc * D), Bc, D)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 stored; every thread is done with the other stage
            if loader:
                if jv + Bc < block_keys:
                    j_next = start(where, jv + Bc, mods)
                    load_tile(dynamic_tile(K_OFF + (1 - st) * (Bc * D), Bc, D), k, kvh, j_next, Nk, lid, NL)
                    load_tile(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), v, kvh, j_next, Nk, lid, NL)
            elif row_ok:
                m, l = rows(Q_t, K_j, V_j, r, c0, min(Bc, n_keys - j0), m, l, O_seg, at, mods)
        if row_ok:
            store(o, bh, i, c0, O_seg, m, l, mods)

    return warp_specialized


@register_phase(
    name="warp_specialized", order=6, title="Loader warps and compute warps",
    parent="one_barrier",
    description="""
        ``loader_warps`` extra warps only load K/V tiles into the free stage while the compute warps
        work on the current one; one barrier per tile hands the stages over.
    """,
    lineage="Warp specialization (producer/consumer warps): CudaDMA (Bauer et al. 2011), "
            "FlashAttention-3 (Shah et al. 2024) on Hopper",
    planned_speedup=8.0,
    space={"Br": [32, 64, 128], "Bc": [16, 32, 64], "SEG": [16, 32, 64], "loader_warps": [1, 2]},
    sim_params={"Br": 32, "Bc": 16, "SEG": 8, "loader_warps": 1},
    supports=segment_supports(smem_floats, loaders=True),
    resolve=resolve_seg,
    variants=True,
    lse=True,
)
def warp_specialized(problem, Br=64, Bc=32, SEG=64, loader_warps=2):
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, loader_warps, problem.causal, stages_for(problem))
    return segment_launch(kern, problem, Br, SEG, 4 * smem_floats(problem.head_dim, Br, Bc), loader_warps, Bc=Bc)
