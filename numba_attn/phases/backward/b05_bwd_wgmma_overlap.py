"""Backward phase 5 — ``bwd_wgmma_overlap``: each tile's element-wise work runs while a product is in flight.

Change against ``bwd_wgmma``: the same kernels, with another tile step (the schedule). ``bwd_wgmma`` issues a
pair of products and waits for both before any element-wise work, so the tensor cores idle while the warpgroup
computes exponentials and score gradients. Here wgmma's commit groups complete in order, and a wait for all
but the newest group lets the older one's accumulators be read while the newer one runs:

* dK/dV tile: issue Sᵀ = K_j Q_iᵀ, issue dPᵀ = V_j dO_iᵀ; wait for Sᵀ (one group left) → Pᵀ = exp(Sᵀ·scale − lse)
  while dPᵀ runs → issue dV_j += Pᵀ dO_i; wait for dPᵀ (dV's group left) → dSᵀ = Pᵀ∘(dPᵀ − Delta) while dV runs →
  issue dK_j += dSᵀ Q_i; wait for both (the ring's stage is refilled next).
* dQ tile: issue S, issue dP; wait for S → P while dP runs; wait → dS; dQ_i += dS K_j, waited for.

Prediction: the dK/dV kernel (60% of bwd_wgmma's time at fp16 B1 H32 N4096 D128) hides most of its exponentials
and score gradients behind the products (~25% of its time), the dQ kernel its exponentials: ~1.2× bwd_wgmma.

Verdict: 1.00-1.03× bwd_wgmma (H200, 0138c5a; N4096 D128 2.53 against 2.60 ms): refuted. Two blocks of one
warpgroup share an SM, so one block's element-wise work already ran under the other's products.
[experiments/2026-11-27-bwd-wgmma]
"""
from __future__ import annotations

import functools

from numba_attn.gpu.jit import device
from numba_attn.gpu.wgmma import make_wgmma_wait
from numba_attn.phases.backward.common import one
from numba_attn.phases.backward.wgmma_steps import (M, kv_elementwise, launch_backward, make_products, q_elementwise,
                                                    tile_bytes, wgmma_registration)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.stages import PLAIN


@functools.cache
def overlapped_kv_tile(D: int, Br: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """One Q tile of the dK/dV kernel, element-wise work under the products in flight (module docstring)."""
    issue_scores, _, pack, accumulate = make_products(bf16, Br, D, STAGES)
    wait_older = make_wgmma_wait(1, Br // 2)  # all but the newest group: the older accumulators readable
    wait_kv = make_wgmma_wait(0, D // 2, D // 2)
    probabilities, score_grads = kv_elementwise(Br, causal, stage, dmod)
    OWN, TILE = tile_bytes(M, D), tile_bytes(Br, D)

    @device
    def kv_tile(regs, own, ring, rows, sb, i0, j_lo, t, Nq, Nk, scale, var):
        St, dPt, pf, dsf, dK, dV, Gt = regs
        issue_scores(St, own, 0, ring, sb * TILE)  # Sᵀ = K_j Q_iᵀ
        issue_scores(dPt, own, OWN, ring, (STAGES + sb) * TILE)  # dPᵀ = V_j dO_iᵀ
        wait_older(St, St)  # Sᵀ done, dPᵀ in flight
        probabilities(St, Gt, rows, sb, i0, j_lo, t, Nq, Nk, scale, var)
        pack(pf, St)
        accumulate(dV, pf, 0, ring, (STAGES + sb) * TILE)  # dV_j += Pᵀ dO_i, in flight
        wait_older(dPt, dPt)  # dPᵀ done, dV in flight
        score_grads(St, dPt, Gt, rows, sb, t)
        pack(dsf, dPt)
        accumulate(dK, dsf, 0, ring, sb * TILE)  # dK_j += dSᵀ Q_i
        wait_kv(dV, dK)

    return kv_tile


@functools.cache
def overlapped_q_tile(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """One K/V tile of the dQ kernel, the exponentials under dP in flight."""
    issue_scores, _, pack, accumulate = make_products(bf16, Bc, D, STAGES)
    wait_older = make_wgmma_wait(1, Bc // 2)
    wait_dp = make_wgmma_wait(0, Bc // 2)
    wait_q = make_wgmma_wait(0, D // 2)
    probabilities, score_grads = q_elementwise(Bc, causal, stage, dmod)
    OWN, TILE = tile_bytes(M, D), tile_bytes(Bc, D)

    @device
    def q_tile(regs, own, ring, sb, j0, r_lo, stats, t, Nq, Nk, scale, var):
        S, dS, dsf, dQ, G = regs
        lse_lo, lse_hi, dl_lo, dl_hi = stats
        issue_scores(S, own, 0, ring, sb * TILE)  # S = Q_i K_jᵀ
        issue_scores(dS, own, OWN, ring, (STAGES + sb) * TILE)  # dP = dO_i V_jᵀ
        wait_older(S, S)  # S done, dP in flight
        probabilities(S, G, j0, r_lo, lse_lo, lse_hi, t, Nq, Nk, scale, var)
        wait_dp(dS, dS)
        score_grads(S, dS, G, dl_lo, dl_hi)
        pack(dsf, dS)
        accumulate(dQ, dsf, 0, ring, sb * TILE)  # dQ_i += dS K_j
        wait_q(dQ, dQ)

    return q_tile


@register_phase(
    name="bwd_wgmma_overlap", order=105,
    title="Backward on wgmma, element-wise work under the products in flight (wait for all but the newest group)",
    parent="bwd_wgmma", kind="backward",
    description="""
        bwd_wgmma's kernels with another tile step: wgmma groups complete in order, so a wait for all but the
        newest lets Pᵀ be computed while dPᵀ runs and dSᵀ while dV += Pᵀ dO runs (dQ kernel: P while dP runs).
    """,
    lineage="FlashAttention-3 (Shah et al. 2024): softmax overlapped with the asynchronous wgmma of the next product",
    planned_speedup=1200.0,  # against bwd_naive, as every planned speedup: ~1.2x bwd_wgmma (1000)
    **wgmma_registration(),
)
def bwd_wgmma_overlap(problem, Br=32, Bc=64, stages=2):
    return launch_backward("bwd_wgmma_overlap", problem, Br, Bc, stages, overlapped_kv_tile, overlapped_q_tile)
