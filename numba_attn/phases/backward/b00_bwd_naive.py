"""Backward phase 0 — ``bwd_naive``: the unfused gradients, P and dS in global memory.

The backward as a framework without a fused kernel runs it, five kernels, one thread per element: P (from
the forward's lse, no softmax again) and dP = dO Vᵀ; Delta = rowsum(dO ∘ O); dS = P ∘ (dP − Delta) in place of
dP; dQ = scale · dS K (one thread per element of dQ); dK = scale · dSᵀ Q and dV = Pᵀ dO (one thread per element
of dK and dV, summing over the G query heads of its KV head: no atomics). Causal: masked P is written 0 without
its dot products, and the sums stop at the last key a row sees (the first row that sees a key).

Prediction: the baseline of the family; P and dS (2 · 4 · Nq · Nk bytes per head) make two round trips
through HBM, so it is bandwidth-bound like ``naive`` and a few times slower than the forward ``naive``.

Verdict: 857 ms at fp16 B1 H32 N4096 D128 (causal 443), 700× SDPA cuDNN's backward (H200;
experiments/2026-11-27-lse-backward-gpu).
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32

from numba_attn.gpu.jit import kernel
from numba_attn.phases.backward.common import (backward_launch, element, first_q_head, first_row_of_key, keys_of_row,
                                               kv_head, make_delta, mask_stage, one, score_grad_stage, variant_reason)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.stages import PLAIN

TILE_X, TILE_Y = 32, 8  # thread block of the element-wise kernels
ROWS_PER_BLOCK = 128  # Delta: one thread per query row


@functools.cache
def make_kernels(D: int, causal: bool, stage=PLAIN, dmod=one):
    SCORED = stage.scored  # a score function: its derivative at S kept in gm for dS

    @kernel
    def probs(q, k, v, do, lse, p, dp, gm, scale, H, G, Nq, Nk, mods):
        """P[bh, i, j] = exp(M_ij − lse_i), M = score_mod(S) (S = scale · Q_i · K_j without one), and
        dP[bh, i, j] = dO_i · V_j (0 where masked); with a score function gm[bh, i, j] = score_mod'(S_ij)."""
        j, i, bh = element()
        if i >= Nq or j >= Nk:
            return
        if j >= keys_of_row(i, Nq, Nk, causal) or not stage.visible(bh // H, bh % H, i + Nk - Nq, j, mods):
            p[bh, i, j] = float32(0.0)
            dp[bh, i, j] = float32(0.0)
            if SCORED:
                gm[bh, i, j] = float32(0.0)  # (read by scores_grad: never left unwritten)
            return
        kvh = kv_head(bh, H, G)
        s = float32(0.0)
        dpv = float32(0.0)
        for d in range(D):
            s += float32(q[bh, i, d]) * float32(k[kvh, j, d])
            dpv += float32(do[bh, i, d]) * float32(v[kvh, j, d])
        b, h, qi = bh // H, bh % H, i + Nk - Nq  # (a variant's indices)
        p[bh, i, j] = math.exp(stage.modified(s * scale, b, h, qi, j, mods) - lse[bh, i])  # from the forward's lse
        dp[bh, i, j] = dpv
        if SCORED:
            gm[bh, i, j] = dmod(s * scale, b, h, qi, j, mods)

    @kernel
    def scores_grad(p, ds, gm, dl, Nq, Nk):
        """dS = P ∘ (dP − Delta) (∘ score_mod'(S) with a score function), in place of dP."""
        j, i, bh = element()
        if i < Nq and j < Nk:
            ds[bh, i, j] = p[bh, i, j] * (ds[bh, i, j] - dl[bh, i])
            if SCORED:
                ds[bh, i, j] *= gm[bh, i, j]

    @kernel
    def grad_q(ds, k, dq, scale, H, G, Nq, Nk):
        """dQ[bh, i, d] = scale · Σ_j dS_ij K_jd over the keys row i sees."""
        d, i, bh = element()
        if i >= Nq or d >= D:
            return
        kvh = kv_head(bh, H, G)
        acc = float32(0.0)
        for j in range(keys_of_row(i, Nq, Nk, causal)):
            acc += ds[bh, i, j] * float32(k[kvh, j, d])
        dq[bh, i, d] = acc * scale

    @kernel
    def grad_kv(p, ds, q, do, dk, dv, scale, H, G, Nq, Nk):
        """dK[kvh, j, d] = scale · Σ_h Σ_i dS_ij Q_id and dV[kvh, j, d] = Σ_h Σ_i P_ij dO_id, h over the G query
        heads of KV head kvh, i over the rows that see key j."""
        d, j, kvh = element()
        if j >= Nk or d >= D:
            return
        bh0 = first_q_head(kvh, H, G)
        acc_k = float32(0.0)
        acc_v = float32(0.0)
        for g in range(G):
            bh = bh0 + g
            for i in range(first_row_of_key(j, Nq, Nk, causal), Nq):
                acc_k += ds[bh, i, j] * float32(q[bh, i, d])
                acc_v += p[bh, i, j] * float32(do[bh, i, d])
        dk[kvh, j, d] = acc_k * scale
        dv[kvh, j, d] = acc_v

    return probs, make_delta(D, ROWS_PER_BLOCK), scores_grad, grad_q, grad_kv


def grids(problem):
    """(grid over (Nk, Nq, B·H), grid over (D, Nq, B·H), grid over (D, Nk, B·Hkv), Delta's grid)."""
    B, H, Hkv, Nq, Nk, D = (problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len,
                            problem.head_dim)
    up = lambda n, t: (n + t - 1) // t  # noqa: E731
    return ((up(Nk, TILE_X), up(Nq, TILE_Y), B * H), (up(D, TILE_X), up(Nq, TILE_Y), B * H),
            (up(D, TILE_X), up(Nk, TILE_Y), B * Hkv), (up(Nq, ROWS_PER_BLOCK), B * H))


@register_phase(
    name="bwd_naive", order=100, title="Backward, unfused: P and dS in global memory",
    parent=None, kind="backward",
    description="""
        Five kernels, one thread per element: P recomputed from the forward's lse and dP = dO Vᵀ written to
        global memory, Delta = rowsum(dO ∘ O), dS = P ∘ (dP − Delta) in place, dQ = scale · dS K, and dK =
        scale · dSᵀ Q, dV = Pᵀ dO summed over the query heads of a KV head (no atomics).
    """,
    lineage="Backpropagation through softmax attention (FlashAttention, Dao et al. 2022, Appendix B.2)",
    planned_speedup=1.0,
    supports=variant_reason,
    variants=True,
)
def bwd_naive(problem):
    B, H, Nq, Nk, D, G = problem.batch, problem.heads, problem.q_len, problem.kv_len, problem.head_dim, problem.group
    stage = mask_stage(problem)
    probs, delta, scores_grad, grad_q, grad_kv = make_kernels(D, problem.causal, stage, score_grad_stage(problem))
    scale = float32(problem.sm_scale)
    p = cuda.device_array((B * H, Nq, Nk), dtype="float32")
    ds = cuda.device_array((B * H, Nq, Nk), dtype="float32")
    dl = cuda.device_array((B * H, Nq), dtype="float32")
    gm = cuda.device_array((B * H, Nq, Nk) if stage.scored else (1, 1, 1), dtype="float32")  # score_mod'(S)
    g_s, g_q, g_kv, g_dl = grids(problem)
    block = (TILE_X, TILE_Y)

    def run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=()):
        probs[g_s, block, stream](q, k, v, do, lse, p, ds, gm, scale, H, G, Nq, Nk, mods)
        delta[g_dl, ROWS_PER_BLOCK, stream](o, do, dl, Nq)
        scores_grad[g_s, block, stream](p, ds, gm, dl, Nq, Nk)
        grad_q[g_q, block, stream](ds, k, dq, scale, H, G, Nq, Nk)
        grad_kv[g_kv, block, stream](p, ds, q, do, dk, dv, scale, H, G, Nq, Nk)

    return backward_launch("bwd_naive", run, [probs, delta, scores_grad, grad_q, grad_kv],
                           p.nbytes + ds.nbytes + dl.nbytes + gm.nbytes)
