"""Backward phase 4 — ``bwd_wgmma``: the five GEMMs on Hopper's warpgroup MMA, tiles from a cp.async ring.

Change against ``bwd_mma``: the same split (Delta, a dK/dV kernel over K/V blocks, a dQ kernel over Q blocks, no
atomics), but a block is one warpgroup of 64 keys (dK/dV) or 64 query rows (dQ) issuing ``wgmma.mma_async``, and
the tiles it steps over arrive through a ring of STAGES swizzled buffers filled by cp.async while the previous
tile is computed (the forward ``tc_wgmma``'s ring, :func:`numba_attn.gpu.wgmma.make_ring_copy`).

* dK/dV: Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ read both operands from shared memory (``make_wgmma_ss``: K_j and V_j
  as 64-row A tiles, Q_i and dO_i K-major B tiles); Pᵀ = exp(Sᵀ·scale − lse_i) and dSᵀ = Pᵀ∘(dPᵀ − Delta_i) come
  out in the accumulator layout, which is the A fragment of dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i (register A,
  dO_i and Q_i as transposed MN-major B). dK_j and dV_j (64 × D f32) stay in registers over every Q tile of the
  KV head's G query heads.
* dQ: S = Q_i·K_jᵀ and dP = dO_i·V_jᵀ from shared memory (Q_i, dO_i staged once), dS = P∘(dP − Delta_i), then
  dQ_i += dS·K_j (register A, K_j transposed).

Prediction: mma.sync ran the backward at ~24 TFLOP/s (bwd_mma: 41.9 ms at fp16 B1 H32 N4096 D128, 2.5 × the
forward's 0.55 TFLOP). wgmma at ~3× mma.sync's rate (the forward's tc_wgmma reached ~520 TFLOP/s) with the
loads overlapped, minus the element-wise work between products that nothing overlaps here: ~5 ms, ~8×
bwd_mma (~1000× bwd_naive), still ~3.5× cuDNN's 1.37 ms.

Verdict: 2.60 ms at fp16 B1 H32 N4096 D128 (H200, 0138c5a): 16× bwd_mma, 0.52× SDPA cuDNN's 1.33 ms; D64 1.55 ms
(0.54×). The first version, reading each row's lse and Delta from global memory in the element loop, took 4.26 ms.
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
def waited_kv_tile(D: int, Br: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """One Q tile of the dK/dV kernel, each pair of products waited for at once: Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ,
    Pᵀ and dSᵀ, then dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i."""
    issue_scores, wait_two, pack, accumulate = make_products(bf16, Br, D, STAGES)
    wait_kv = make_wgmma_wait(0, D // 2, D // 2)
    probabilities, score_grads = kv_elementwise(Br, causal, stage, dmod)
    OWN, TILE = tile_bytes(M, D), tile_bytes(Br, D)

    @device
    def kv_tile(regs, own, ring, rows, sb, i0, j_lo, t, Nq, Nk, scale, var):
        St, dPt, pf, dsf, dK, dV, Gt = regs
        issue_scores(St, own, 0, ring, sb * TILE)  # Sᵀ = K_j Q_iᵀ
        issue_scores(dPt, own, OWN, ring, (STAGES + sb) * TILE)  # dPᵀ = V_j dO_iᵀ
        wait_two(St, dPt)
        probabilities(St, Gt, rows, sb, i0, j_lo, t, Nq, Nk, scale, var)
        score_grads(St, dPt, Gt, rows, sb, t)
        pack(pf, St)
        pack(dsf, dPt)
        accumulate(dV, pf, 0, ring, (STAGES + sb) * TILE)  # dV_j += Pᵀ dO_i
        accumulate(dK, dsf, 0, ring, sb * TILE)  # dK_j += dSᵀ Q_i
        wait_kv(dV, dK)

    return kv_tile


@functools.cache
def waited_q_tile(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """One K/V tile of the dQ kernel, each product waited for at once: S = Q_i K_jᵀ and dP = dO_i V_jᵀ, dS, then
    dQ_i += dS K_j."""
    issue_scores, wait_two, pack, accumulate = make_products(bf16, Bc, D, STAGES)
    wait_q = make_wgmma_wait(0, D // 2)
    probabilities, score_grads = q_elementwise(Bc, causal, stage, dmod)
    OWN, TILE = tile_bytes(M, D), tile_bytes(Bc, D)

    @device
    def q_tile(regs, own, ring, sb, j0, r_lo, stats, t, Nq, Nk, scale, var):
        S, dS, dsf, dQ, G = regs
        lse_lo, lse_hi, dl_lo, dl_hi = stats
        issue_scores(S, own, 0, ring, sb * TILE)  # S = Q_i K_jᵀ
        issue_scores(dS, own, OWN, ring, (STAGES + sb) * TILE)  # dP = dO_i V_jᵀ
        wait_two(S, dS)
        probabilities(S, G, j0, r_lo, lse_lo, lse_hi, t, Nq, Nk, scale, var)
        score_grads(S, dS, G, dl_lo, dl_hi)
        pack(dsf, dS)
        accumulate(dQ, dsf, 0, ring, sb * TILE)  # dQ_i += dS K_j
        wait_q(dQ, dQ)

    return q_tile


@register_phase(
    name="bwd_wgmma", order=104, title="Backward on Hopper's wgmma: warpgroup dK/dV and dQ kernels, a cp.async ring",
    parent="bwd_mma", kind="backward",
    description="""
        bwd_mma's split (Delta, a dK/dV kernel over K/V blocks, a dQ kernel over Q blocks, no atomics) on
        wgmma.mma_async: a block is one warpgroup owning 64 keys (dK/dV) or 64 query rows (dQ); Sᵀ = K Qᵀ,
        dPᵀ = V dOᵀ (and S, dP) read both operands from swizzled shared memory, Pᵀ and dSᵀ go from the
        accumulators to the register A operand of dV += Pᵀ dO, dK += dSᵀ Q (dQ += dS K), the other operand
        transposed from shared memory. The tiles a block steps over arrive through a cp.async ring of STAGES
        buffers while the previous one is computed.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) backward: wgmma with shared-memory descriptors, register-sourced "
            "P and dS; Triton tutorial 06's dK/dV over K/V blocks and dQ over Q blocks",
    planned_speedup=1000.0,  # against bwd_naive, as every planned speedup: ~8x bwd_mma (120)
    **wgmma_registration(),
)
def bwd_wgmma(problem, Br=32, Bc=64, stages=2):
    return launch_backward("bwd_wgmma", problem, Br, Bc, stages, waited_kv_tile, waited_q_tile)
