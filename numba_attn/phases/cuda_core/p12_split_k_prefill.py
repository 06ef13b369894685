"""Phase 12 — ``split_k_prefill``: split-K for prefill with few query blocks.

Change against ``smem_kv``: when the ``ceil(q_len / Br) × batch × heads``
blocks do not fill the GPU (a short chunk appended to a long KV cache), the
KV range is also split over ``S`` blocks (grid z), as ``decode_split_k``
does: each runs the parent's loop over its chunk and writes a normalized
partial output and its log-sum-exp per row; ``combine_splits`` merges them
exactly. ``S = 1`` (``split_plan``) launches the parent's single kernel.
With a variant a split that saw none of a row's keys writes a zero partial and the
log-sum-exp ``SEEN_NOTHING_LSE``, so the combine gives 0 for a row no split saw.

Prediction: no change where ``S = 1`` (the square long-context preset); for a
1024-token chunk appended to a 32k cache at B=1, H=32 (256 blocks, under one
wave) S = 3 should run ~1.5–2× faster than ``smem_kv``.

Verdict: 10.49 ms at B1 H32 N4096 D64 fp32 (H200), 0.99x smem_kv (S = 1 there) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32

from numba_attn.gpu.device_functions import NEG_BIG, state_lse, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.phases.cuda_core.common import kv_head, load_kv, static_kv_reason, store_row, tile_rows
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.sinks import lse_parts, stages_for, with_lse
from numba_attn.variants.stages import EMPTY, PLAIN, SEEN_NOTHING
from numba_attn.gpu.split_k import make_combine_kernel, make_combine_lse_kernel, sm_count, split_plan

# the log-sum-exp of a partial that saw no key of its row (the decode family's SEEN_NOTHING_LSE): above the
# combine's empty-split bound, so weighed (a row no split saw is 0), and far below any real log-sum-exp
SEEN_NOTHING_LSE = np.float32(-1e28)


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, causal: bool, FINAL: bool, stage=PLAIN):
    rows = tile_rows(D, stage)
    store = store_row(D, stage)

    @kernel
    def split_k_prefill(q, k, v, o, part_o, part_lse, scale, H, G, Nq, Nk, chunk, mods):
        K_j = cuda.shared.array((Bc, D), float32)
        V_j = cuda.shared.array((Bc, D), float32)
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x * Br + tid
        bh = cuda.blockIdx.y
        split = cuda.blockIdx.z
        kvh = kv_head(bh, H, G)
        row_ok = i < Nq
        Q_i = cuda.local.array(D, float32)
        O_i = cuda.local.array(D, float32)
        for d in range(D):
            Q_i[d] = float32(q[bh, i, d]) * scale if row_ok else float32(0.0)
            O_i[d] = float32(0.0)
        m = NEG_BIG
        l = float32(0.0)
        lo = split * chunk  # this block's keys: [lo, hi)
        hi = min(Nk, lo + chunk)
        n_keys = min(visible_keys(i, Nq, Nk, causal), hi)
        # keys any row of this block can see: the block's last row sees the most
        block_keys = min(visible_keys(min(cuda.blockIdx.x * Br + Br, Nq) - 1, Nq, Nk, causal), hi)
        b, h, qt = bh // H, bh % H, cuda.blockIdx.x
        for j0 in range(lo, block_keys, Bc):  # chunk is whole tiles: a split's tiles are the block mask's
            kind = stage.tile_kind(mods, b, h, qt, j0 // Bc)
            if kind != EMPTY:  # (a variant's empty tile is never loaded; always FULL without one)
                load_kv(K_j, V_j, k, v, kvh, j0, Nk, tid, Br)
                cuda.syncthreads()
                if row_ok:
                    at = (b, h, i + Nk - Nq, j0, kind)  # where the tile is, for the variant
                    m, l = rows(Q_i, K_j, V_j, min(Bc, n_keys - j0), m, l, O_i, at, mods)
                cuda.syncthreads()
        if row_ok:
            if FINAL:
                store(o, bh, i, 0, O_i, m, l, mods)
            else:
                inv_l = float32(1.0) / l if l > float32(0.0) else float32(0.0)
                for d in range(D):
                    part_o[split, bh * Nq + i, d] = O_i[d] * inv_l
                lse = state_lse(m, l)
                if stage.active and not (m > SEEN_NOTHING and l > float32(0.0)):
                    lse = SEEN_NOTHING_LSE  # this split saw no key of the row: weighed 0, or 1 where none did
                part_lse[split, bh * Nq + i] = lse

    return split_k_prefill


def _supports(problem, Br, Bc, splits, blocks_per_sm, min_keys):
    reason = static_kv_reason(problem, Bc)
    if reason:
        return reason
    if problem.head_dim > 1024:
        return "combine kernel: head_dim > 1024 threads"
    if problem.q_len < 1 or problem.kv_len < 1:
        return "needs q_len >= 1 and kv_len >= 1"
    return None


def _resolve(problem, **params):
    """splits=0: as many splits as fill the GPU's block slots (``split_plan``)."""
    n_blocks = -(-problem.q_len // params["Br"]) * problem.batch * problem.heads
    S, _ = split_plan(n_blocks, problem.kv_len, params["Bc"], sm_count(), params["blocks_per_sm"],
                      params["min_keys"], params["splits"])
    return {**params, "splits": S}


@register_phase(
    name="split_k_prefill", order=12, title="Split-K prefill: KV range split over blocks + LSE combine",
    parent="smem_kv",
    description="""
        The parent's kernel with the KV range also split over S blocks (grid z) when the
        query blocks alone do not fill the GPU (long KV, few query rows); each block
        writes a normalized partial output and its log-sum-exp, and the split-K combine
        kernel shared with decode_split_k merges them exactly. S = 1 is the parent.
    """,
    lineage="Split-KV / Flash-Decoding (Dao et al. 2023) applied to prefill chunks; "
            "FlashAttention-2 num_splits heuristic",
    planned_speedup=6.0,
    space={"Br": [32, 64, 128], "Bc": [16, 32, 64], "splits": [0, 2, 4, 8]},
    launch_params=("splits",),  # the split count is a launch argument: its candidates mostly share kernels
    sim_params={"Br": 16, "Bc": 16, "splits": 3},
    supports=_supports,
    resolve=_resolve,
    variants=True,
    lse=True,
)
def split_k_prefill(problem, Br=128, Bc=32, splits=0, blocks_per_sm=4, min_keys=1024):
    B, H, Nq, Nk, D = problem.batch, problem.heads, problem.q_len, problem.kv_len, problem.head_dim
    n_qb = (Nq + Br - 1) // Br
    S, chunk = split_plan(n_qb * B * H, Nk, Bc, sm_count(), blocks_per_sm, min_keys, splits)  # splits: resolved
    final = S == 1
    stage = stages_for(problem)
    lse_stage = lse_parts(stage)[0]
    kern = make_kernel(D, Br, Bc, problem.causal, final, stage)
    scale = float32(problem.sm_scale)
    grid = (n_qb, B * H, S)
    if final:
        part_o = cuda.device_array((1, 1, 1), dtype="float32")
        part_lse = cuda.device_array((1, 1), dtype="float32")
        kernels = [kern]
    else:
        part_o = cuda.device_array((S, B * H * Nq, D), dtype="float32")
        part_lse = cuda.device_array((S, B * H * Nq), dtype="float32")
        combine = make_combine_lse_kernel(Nq) if lse_stage else make_combine_kernel(Nq)
        kernels = [kern, combine]

    kernel_mods = KernelMods(problem, Br, Bc)  # the variant's arrays and its block mask of (Br × Bc) tiles

    def run(q, k, v, o, stream=0, mods=None, lse=None):
        kern[grid, Br, stream](q, k, v, o, part_o, part_lse, scale, H, problem.group, Nq, Nk, chunk,
                               with_lse(kernel_mods(stream=stream) if mods is None else mods, lse))
        if not final and lse is not None:  # (the combine writes the rows' log-sum-exp from the splits')
            combine[B * H * Nq, D, stream](part_o, part_lse, o, S, lse)
        elif not final:
            combine[B * H * Nq, D, stream](part_o, part_lse, o, S)

    variant = problem.variant is not None
    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys", kernel_mods=kernel_mods if variant else None,
                  replayable=not variant)
