"""Phase 7 — ``vectorized``: 16-byte loads and a conflict-free padded Q layout.

Change against ``warp_specialized``: every memory access of the main loop
moves four elements at a time: global → shared with one 16-byte
``ld.global.nc.v4.f32`` (inline PTX, ``ptx_loads.ldg4``) and one
``st.shared.v4.f32``; shared → registers with one ``ld.shared.v4.f32``
(``ptx_loads.lds4``, in ``common.segment_rows4``). Q is row-major again,
padded to D+4 floats per row so that a quarter-warp's 16-byte reads hit 8
different bank groups.

Prediction: the kernels are bound by shared-load issue; 4× fewer load
instructions should give ~1.8× warp_specialized at D=64.

Verdict: 7.07 ms at B1 H32 N4096 D64 fp32 (H200), 6.25x warp_specialized (far above) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, load_tile4
from numba_attn.phases.cuda_core.common import (block_walk, register_cap, resolve_seg, segment_launch,
                                                segment_rows4, segment_supports, segment_thread, start_row, store_row)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.stages import PLAIN

ONE = float32(1.0)
QPAD = 4  # Q rows padded to D+4 floats: conflict-free 16-byte row reads


def smem_floats(D, Br, Bc):
    return Br * (D + QPAD) + 2 * 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, SEG: int, loader_warps: int, causal: bool, stage=PLAIN):
    QW = D + QPAD  # Q row stride (floats)
    K_OFF = Br * QW
    V_OFF = K_OFF + 2 * Bc * D  # two stages each
    NT = Br * (D // SEG)  # compute threads; the loader warps come after them
    rows = segment_rows4(D, SEG, stage)
    store = store_row(SEG, stage)
    keys, start, tile = block_walk(Br, Bc, causal, stage)
    NL = 32 * loader_warps

    @kernel(**register_cap(D, Br, SEG, loader_warps))
    def vectorized(q, k, v, o, scale, H, G, Nq, Nk, mods):
        Q_s = dynamic_tile(0, Br, QW)  # Q · scale, rows padded
        tid, r, c0, i, bh, kvh = segment_thread(Br, SEG, H, G)
        loader = tid >= NT
        lid = tid - NT  # loader lane
        row_ok = i < Nq and not loader
        load_tile4(Q_s, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT + NL, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        m, l = start_row(O_seg)
        n_keys, block_keys, where = keys(i, bh, H, Nq, Nk, mods)  # a variant: its visited tiles
        first = start(where, 0, mods)
        if loader:
            load_tile4(dynamic_tile(K_OFF, Bc, D), k, kvh, first, Nk, ONE, lid, NL, Bc, D)
            load_tile4(dynamic_tile(V_OFF, Bc, D), v, kvh, first, Nk, ONE, lid, NL, Bc, D)
        for jv in range(0, block_keys, Bc):
            j0, at = tile(where, jv, mods)  # where the tile is, for the variant
            st = (jv // Bc) & 1
            K_j = dynamic_tile(K_OFF + st * (Bc * D), Bc, D)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 stored; every thread is done with the other stage
            if loader:
                if jv + Bc < block_keys:
                    j_next = start(where, jv + Bc, mods)
                    load_tile4(dynamic_tile(K_OFF + (1 - st) * (Bc * D), Bc, D), k, kvh, j_next, Nk, ONE,
                               lid, NL, Bc, D)
                    load_tile4(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), v, kvh, j_next, Nk, ONE,
                               lid, NL, Bc, D)
            elif row_ok:
                m, l = rows(Q_s, K_j, V_j, r, c0, min(Bc, n_keys - j0), m, l, O_seg, at, mods)
        if row_ok:
            store(o, bh, i, c0, O_seg, m, l, mods)

    return vectorized


def _supports(problem, Br, Bc, SEG, loader_warps):
    if problem.head_dim > 192 and loader_warps >= 1:
        return (f"head_dim {problem.head_dim} > 192: the launch runs out of resources on an H100 at 256 "
                f"(measured; experiments/2026-11-22-head-dims/)")
    return segment_supports(smem_floats, loaders=True, vec4=True)(problem, Br, Bc, SEG, loader_warps)


@register_phase(
    name="vectorized", order=7, title="16-byte loads, padded conflict-free Q tile",
    parent="warp_specialized",
    description="""
        16-byte global loads (inline PTX ld.global.nc.v4) and 16-byte shared loads and
        stores for Q, K and V; Q row-major with rows padded to D+4 floats so a
        quarter-warp's 16-byte row reads hit distinct banks.
    """,
    lineage="Vectorized memory access (CUDA best-practices: 128-bit loads) and shared-memory "
            "padding against bank conflicts",
    planned_speedup=14.0,
    space={"Br": [32, 64, 128], "Bc": [16, 32, 64], "SEG": [16, 32, 64], "loader_warps": [1, 2]},
    sim_params={"Br": 32, "Bc": 16, "SEG": 8, "loader_warps": 1},
    supports=_supports,
    resolve=resolve_seg,
    variants=True,
    lse=True,
)
def vectorized(problem, Br=64, Bc=32, SEG=64, loader_warps=1):
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, loader_warps, problem.causal, stages_for(problem))
    return segment_launch(kern, problem, Br, SEG, 4 * smem_floats(problem.head_dim, Br, Bc), loader_warps, Bc=Bc)
