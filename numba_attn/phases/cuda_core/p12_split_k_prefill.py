"""Phase 12 — ``split_k_prefill``: split-K for prefill with few query blocks.

Change against ``smem_kv``: when the ``ceil(q_len / Br) × batch × heads``
blocks do not fill the GPU (a short chunk appended to a long KV cache), the
KV range is also split over ``S`` blocks (grid z), as ``decode_split_k``
does: each runs the parent's loop over its chunk and writes a normalized
partial output and its log-sum-exp per row; ``combine_splits`` merges them
exactly. ``S = 1`` (``split_plan``) launches the parent's single kernel.

Prediction: no change where ``S = 1`` (the square long-context preset); for a
1024-token chunk appended to a 32k cache at B=1, H=32 (256 blocks, under one
wave) S = 3 should run ~1.5–2× faster than ``smem_kv``.

Verdict: 10.49 ms at B1 H32 N4096 D64 fp32 (H200), 0.99x smem_kv (S = 1 there) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.device_functions import NEG_BIG, state_lse, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.phases.cuda_core.common import kv_head, load_kv, static_kv_reason, store_row, tile_rows
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.variants.stages import FULL
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, causal: bool, FINAL: bool):
    rows = tile_rows(D)
    store = store_row(D)

    @kernel
    def split_k_prefill(q, k, v, o, part_o, part_lse, scale, H, G, Nq, Nk, chunk):
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
        for j0 in range(lo, block_keys, Bc):
            load_kv(K_j, V_j, k, v, kvh, j0, Nk, tid, Br)
            cuda.syncthreads()
            if row_ok:
                m, l = rows(Q_i, K_j, V_j, min(Bc, n_keys - j0), m, l, O_i, (0, 0, 0, j0, FULL), ())
            cuda.syncthreads()
        if row_ok:
            if FINAL:
                store(o, bh, i, 0, O_i, m, l)
            else:
                inv_l = float32(1.0) / l if l > float32(0.0) else float32(0.0)
                for d in range(D):
                    part_o[split, bh * Nq + i, d] = O_i[d] * inv_l
                part_lse[split, bh * Nq + i] = state_lse(m, l)

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
    variants="its split-K combine has no zero for a row that no split saw (0/0); smem_kv or causal_skip run them",
)
def split_k_prefill(problem, Br=128, Bc=32, splits=0, blocks_per_sm=4, min_keys=1024):
    B, H, Nq, Nk, D = problem.batch, problem.heads, problem.q_len, problem.kv_len, problem.head_dim
    n_qb = (Nq + Br - 1) // Br
    S, chunk = split_plan(n_qb * B * H, Nk, Bc, sm_count(), blocks_per_sm, min_keys, splits)  # splits: resolved
    final = S == 1
    kern = make_kernel(D, Br, Bc, problem.causal, final)
    scale = float32(problem.sm_scale)
    grid = (n_qb, B * H, S)
    if final:
        part_o = cuda.device_array((1, 1, 1), dtype="float32")
        part_lse = cuda.device_array((1, 1), dtype="float32")
        kernels = [kern]
    else:
        part_o = cuda.device_array((S, B * H * Nq, D), dtype="float32")
        part_lse = cuda.device_array((S, B * H * Nq), dtype="float32")
        combine = make_combine_kernel(Nq)
        kernels = [kern, combine]

    def run(q, k, v, o, stream=0):
        kern[grid, Br, stream](q, k, v, o, part_o, part_lse, scale, H, problem.group, Nq, Nk, chunk)
        if not final:
            combine[B * H * Nq, D, stream](part_o, part_lse, o, S)

    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys")
