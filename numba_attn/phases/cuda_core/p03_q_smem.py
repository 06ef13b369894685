"""Phase 3 — ``q_smem``: the Q tile staged in shared memory too.

Change against ``smem_kv``: the block's Br query rows are loaded once into
shared memory, scaled and transposed (``Q_t[d, r]``: a warp reads 32
consecutive words), instead of into the per-thread array ``Q_i``. Q + K + V
exceed 48 KiB at D=128, so the tiles share one dynamic shared-memory
allocation (``ptx_loads.dynamic_tile``).

Prediction: D=64 ~0.8× smem_kv (one more shared load per FMA of QKᵀ);
D=128 ~1.3× smem_kv (the D registers of ``Q_i`` freed: the parent spills there).

Verdict: 35.75 ms at B1 H32 N4096 D64 fp32 (H200), 0.29x smem_kv (missed) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, load_tile_t_scaled, smem_reason
from numba_attn.phases.cuda_core.common import (block_walk, kv_head, load_kv, row_block_launch, segment_rows,
                                                start_row, store_row)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.stages import PLAIN


def smem_floats(D, Br, Bc):
    return D * Br + 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, causal: bool, stage=PLAIN):
    K_OFF = D * Br
    V_OFF = K_OFF + Bc * D
    keys, _, tile = block_walk(Br, Bc, causal, stage)
    rows = segment_rows(D, D, stage)  # one segment: the thread's whole row
    store = store_row(D, stage)

    @kernel
    def q_smem(q, k, v, o, scale, H, G, Nq, Nk, mods):
        Q_t = dynamic_tile(0, D, Br)  # Qᵀ · scale
        K_j = dynamic_tile(K_OFF, Bc, D)
        V_j = dynamic_tile(V_OFF, Bc, D)
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x * Br + tid
        bh = cuda.blockIdx.y
        kvh = kv_head(bh, H, G)
        row_ok = i < Nq
        load_tile_t_scaled(Q_t, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, Br, Br, D)
        O_i = cuda.local.array(D, float32)
        m, l = start_row(O_i)
        n_keys, block_keys, where = keys(i, bh, H, Nq, Nk, mods)  # a variant: its visited tiles
        for jv in range(0, block_keys, Bc):
            j0, at = tile(where, jv, mods)  # where the tile is, for the variant
            load_kv(K_j, V_j, k, v, kvh, j0, Nk, tid, Br)
            cuda.syncthreads()
            if row_ok:
                m, l = rows(Q_t, K_j, V_j, tid, 0, min(Bc, n_keys - j0), m, l, O_i, at, mods)
            cuda.syncthreads()
        if row_ok:
            store(o, bh, i, 0, O_i, m, l, mods)

    return q_smem


def _supports(problem, Br, Bc):
    if Br % 32:
        return f"Br={Br} must be a multiple of 32 (whole warps)"
    return smem_reason(4 * smem_floats(problem.head_dim, Br, Bc))


@register_phase(
    name="q_smem", order=3, title="Q tile in shared memory too",
    parent="smem_kv",
    description="""
        The Q tile (scaled once) joins K and V in shared memory, stored transposed so a
        warp's reads are conflict-free; the per-thread Q registers are gone (no spill at
        D=128), at the cost of a shared load per FMA of QKᵀ. The tiles share one dynamic
        shared-memory allocation (more than 48 KiB at D=128).
    """,
    lineage="FlashAttention-1 (Dao et al. 2022), Algorithm 1: Q_i, K_j, V_j all in SRAM",
    planned_speedup=6.0,
    space={"Br": [16, 32, 64, 128], "Bc": [16, 32, 64, 128]},
    sim_params={"Br": 32, "Bc": 16},
    supports=_supports,
    variants=True,
    lse=True,
)
def q_smem(problem, Br=128, Bc=32):
    kern = make_kernel(problem.head_dim, Br, Bc, problem.causal, stages_for(problem))
    return row_block_launch(kern, problem, Br, Br, 4 * smem_floats(problem.head_dim, Br, Bc), Bc=Bc)
