"""Backward phase 8 — ``bwd_wgmma_kvreg``: K_j and V_j held in registers as the A of Sᵀ and dPᵀ.

Change against ``bwd_wgmma_ss``: a warpgroup's Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ read their A, the block's own 64
keys of K_j and V_j, from shared memory at every Q tile, though those tiles never change during the walk. Here each
thread loads its A fragments once, after K_j and V_j land (D/4 words each: 16 + 16 registers at D64), and both
products become RS wgmma: only B (Q_i, dO_i) is read from shared memory.

Why: on an H100 the kernel is bound by its shared-memory wavefronts (experiments/2026-11-28-bwd-smem: "Mem Busy" as
cuDNN's, 1.3× cuDNN's wavefronts at D128). The 64×64 SS products (Sᵀ, dPᵀ and dQ's halves) are 44% of them, half of
each SS product's bytes are its A: Sᵀ's and dPᵀ's A are ~15% of all wavefronts. At D128 the fragments would take
64 registers beside the 255 the kernel has: D64 only (217 registers there).

Prediction: ~1.08-1.12× ``bwd_wgmma_ss`` at fp16/bf16 B1 H32 N4096 D64 (0.87-0.89× cuDNN non-causal on an H200,
bf03580), so ~0.94-0.99× cuDNN; registers ~249, no spill.

Verdict: 1.08× the parent non-causal (the range's bottom), 1.05× causal (under it), 0.95-0.97× cuDNN (H200,
cfcea7d): ``phase=None``'s first choice at D64.
"""
from __future__ import annotations

import functools

from numba_attn.gpu.jit import device
from numba_attn.gpu.loads import ld_shared_b32
from numba_attn.gpu.wgmma import kmajor_params, make_wgmma_rs, row_bytes
from numba_attn.phases.backward.b07_bwd_wgmma_ss import make_grad_ss, resolve_ss, smem_bytes, supports_ss
from numba_attn.phases.backward.wgmma_steps import M, launch_fused, tile_bytes
from numba_attn.phases.registry import register_phase


@functools.cache
def kv_in_registers(bf16: bool, D: int, Bc: int, STAGES: int):
    """``(issue, load_kv, NKV)`` as :func:`~numba_attn.phases.backward.b07_bwd_wgmma_ss.kv_in_shared`'s, with K_j's and
    V_j's A fragments in ``kv`` (NKV = D/4 words each): ``load_kv`` reads them once from the warpgroup's swizzled
    K-major tiles, ``issue`` runs Sᵀ and dPᵀ as RS products on the ring's Q_i and dO_i."""
    rb = row_bytes(D)
    offs, lbo, sbo = kmajor_params(M, D // 16, rb)
    scores_rs = make_wgmma_rs("bf16" if bf16 else "f16", M, False, True, offs, lbo, sbo, rb, False)
    WGS, TILE, KS = Bc // M, tile_bytes(M, D), D // 16

    @device
    def load_a(a, sm, tile_b, ww, g, t):
        # word 4s + r of k-step s (columns 16s ..): row 16ww + g (+8 if r is odd), columns 16s + 2t, 2t + 1 (+8 if
        # r ≥ 2), as the accumulator layout packs them (the wgmma A fragment); 16-byte chunk c of row k sits at
        # c ^ (k mod 8) of its 128-byte row, and k mod 8 = g
        base = tile_b + (16 * ww + g) * rb + 4 * t
        for s in range(KS):
            for r in range(4):
                chunk = (2 * (s % 4) + r // 2) ^ g
                a[4 * s + r] = ld_shared_b32(sm, base + (s // 4) * M * rb + 8 * rb * (r % 2) + 16 * chunk)

    @device
    def load_kv(kv, sm, own_b, w, ww, g, t):
        load_a(kv[0], sm, own_b + w * TILE, ww, g, t)  # K_j's 64 keys of this warpgroup
        load_a(kv[1], sm, own_b + (WGS + w) * TILE, ww, g, t)  # V_j's

    @device
    def issue(St, dPt, kv, sm, sb, own_b, ring_b, w):
        scores_rs(St, kv[0], 0, sm, ring_b + sb * TILE)  # Sᵀ = K_j Q_iᵀ, K_j from the registers
        scores_rs(dPt, kv[1], 0, sm, ring_b + (STAGES + sb) * TILE)  # dPᵀ = V_j dO_iᵀ

    return issue, load_kv, D // 4


def _supports_kvreg(problem, Bc, stages, dq="red", rs=None):
    if problem.head_dim != 64:
        return (f"head_dim {problem.head_dim}: K_j's and V_j's fragments take D/2 registers (64 at D128) beside "
                f"the 255 bwd_wgmma_ss holds there; head_dim 64 only")
    return supports_ss(problem, Bc, stages, dq, rs)


@register_phase(
    name="bwd_wgmma_kvreg", order=108,
    title="Backward in one wgmma kernel, K_j and V_j in registers as the A of Sᵀ and dPᵀ",
    parent="bwd_wgmma_ss", kind="backward",
    description="""
        bwd_wgmma_ss with the block's own K_j and V_j loaded once into registers as wgmma A fragments: Sᵀ = K_j Q_iᵀ
        and dPᵀ = V_j dO_iᵀ become RS products, reading only Q_i and dO_i from shared memory at each tile.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024): wgmma with A from registers where an operand stays for a loop",
    planned_speedup=1700.0,  # against bwd_naive: ~1.1x bwd_wgmma_ss (1550)
    dtypes=("float16", "bfloat16"), requires_cc="sm_90a", head_dims=(64,),
    space={"Bc": [64, 128], "stages": [3, 4], "dq": ["bulk", "red"], "rs": [False, True]},
    sim_params={"Bc": 128, "stages": 3}, supports=_supports_kvreg, resolve=resolve_ss, variants=True,
)
def bwd_wgmma_kvreg(problem, Bc=0, stages=3, dq="red", rs=None):
    return launch_fused("bwd_wgmma_kvreg", problem, Bc, stages, make_grad_ss, smem_bytes, dq == "red", bool(rs),
                        kv_in_registers)
