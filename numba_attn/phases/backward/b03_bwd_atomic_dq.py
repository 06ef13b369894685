"""Backward phase 3 — ``bwd_atomic_dq``: one dK/dV kernel that also adds dQ with float32 atomics.

Change against ``bwd_two_kernels``: no dQ kernel. The dK/dV kernel already has dS_ij for its Bc keys and each Q
tile it visits; it keeps the tile's dS (Br × Bc) and its K_j in shared memory and the block computes its share
of dQ_i = scale · Σ_j dS_ij K_j over its keys, then adds it to a float32 dQ accumulator with ``atomic.add``
(Nk / Bc blocks add to each dQ tile). A last elementwise kernel writes dQ in the inputs' dtype and zeroes the
accumulator for the next call. S and dP are computed once instead of twice (FlashAttention-2's backward).

Prediction: the FLOPs per (row, key) pair drop from 14·D (S, dP twice, dV, dK, dQ) to 10·D: ~1.3× faster than
``bwd_two_kernels`` (410 ms → ~315 ms at fp16 B1 H32 N4096 D128), the atomics (Br·D per block and Q tile) hidden
behind the arithmetic; but like its parent it spills (2.3 KB a thread at D128: docs/backward.md). The order of
the atomic adds varies from run to run: dQ is not bitwise reproducible.

Verdict: at D128 1.29× its parent (417 → 323 ms; causal 1.65×), at D64 0.90× (H200, CUPTI).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT
from numba_attn.phases.backward.common import (backward_launch, first_q_head, first_q_tile, make_delta,
                                               make_q_tile_load, mask_stage, one, refuse, score_grad_stage,
                                               variant_reason)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.stages import PLAIN

FINISH_THREADS = 256  # the dQ write-out: one thread per element


@functools.cache
def make_kernels(D: int, Br: int, Bc: int, causal: bool, stage=PLAIN, dmod=one):
    load_q_tile = make_q_tile_load(D, Br, Bc)

    @kernel
    def grad_kv_dq(q, k, v, do, lse, dl, dk, dv, dq_acc, scale, H, G, Nq, Nk, mods):
        """dK_j, dV_j of Bc keys of one KV head (one thread per key) over the Q tiles of its G query heads, and
        each tile's dQ_i += scale · dS_i· K_· added to ``dq_acc`` (float32) with atomics."""
        Q_i = cuda.shared.array((Br, D), float32)
        dO_i = cuda.shared.array((Br, D), float32)
        lse_i = cuda.shared.array(Br, float32)
        Delta_i = cuda.shared.array(Br, float32)
        K_s = cuda.shared.array((Bc, D), float32)  # the block's keys, unscaled: the B operand of dQ_i
        dS_s = cuda.shared.array((Br, Bc), float32)  # the tile's dS (0 where masked)
        K_j = cuda.local.array(D, float32)
        V_j = cuda.local.array(D, float32)
        dK_j = cuda.local.array(D, float32)
        dV_j = cuda.local.array(D, float32)
        tid = cuda.threadIdx.x
        j = cuda.blockIdx.x * Bc + tid
        kvh = cuda.blockIdx.y
        key_ok = j < Nk
        for d in range(D):
            kd = float32(k[kvh, j, d]) if key_ok else float32(0.0)
            K_s[tid, d] = kd
            K_j[d] = kd * scale  # K pre-scaled: S = Q_i · K_j
            V_j[d] = float32(v[kvh, j, d]) if key_ok else float32(0.0)
            dK_j[d] = float32(0.0)
            dV_j[d] = float32(0.0)
        bh0 = first_q_head(kvh, H, G)
        i_start = first_q_tile(cuda.blockIdx.x * Bc, Nq, Nk, causal, Br)
        for g in range(G):
            bh = bh0 + g
            for i0 in range(i_start, Nq, Br):
                load_q_tile(q, do, lse, dl, Q_i, dO_i, lse_i, Delta_i, bh, i0, Nq, tid)  # (zeros past Nq)
                cuda.syncthreads()
                for r in range(Br):  # every row of the tile: dS_s holds 0 where the key is not seen
                    i = i0 + r
                    ds = float32(0.0)
                    b, h, qi = bh // H, bh % H, i + Nk - Nq  # (a variant's indices)
                    if key_ok and i < Nq and (not causal or j <= qi) and stage.visible(b, h, qi, j, mods):
                        s = float32(0.0)
                        dp = float32(0.0)
                        for d in range(D):
                            s += Q_i[r, d] * K_j[d]       # S_ij = scale · Q_i · K_j
                            dp += dO_i[r, d] * V_j[d]     # dP_ij = dO_i · V_j
                        p = math.exp(stage.modified(s, b, h, qi, j, mods) - lse_i[r])  # P_ij from the lse
                        ds = p * (dp - Delta_i[r]) * dmod(s, b, h, qi, j, mods)  # dS = P (dP − Delta) M'
                        for d in range(D):
                            dV_j[d] += p * dO_i[r, d]     # dV_j += P_ij dO_i
                            dK_j[d] += ds * Q_i[r, d]     # dK_j += dS_ij Q_i (scale applied at the end)
                    dS_s[r, tid] = ds
                cuda.syncthreads()
                for e in range(tid, Br * D, Bc):  # dQ_i[r, d] += scale · Σ_j dS_ij K_jd over the block's keys
                    r, c = e // D, e % D
                    if i0 + r < Nq:
                        acc = float32(0.0)
                        for jj in range(Bc):
                            acc += dS_s[r, jj] * K_s[jj, c]
                        cuda.atomic.add(dq_acc, (bh, i0 + r, c), acc * scale)
                cuda.syncthreads()
        if key_ok:
            for d in range(D):
                dk[kvh, j, d] = dK_j[d] * scale
                dv[kvh, j, d] = dV_j[d]

    @kernel
    def finish(dq_acc, dq, n):
        """dq = dq_acc in dq's dtype; dq_acc zeroed for the next call (flat views, one thread per element)."""
        e = cuda.grid(1)
        if e < n:
            dq[e] = dq_acc[e]
            dq_acc[e] = float32(0.0)

    return make_delta(D, Br), grad_kv_dq, finish


def smem_bytes(D, Br, Bc):
    """Q_i, dO_i (+ lse, Delta), K_j and the tile's dS, float32."""
    return 4 * (2 * Br * D + 2 * Br + Bc * D + Br * Bc)


def _resolve(problem, Br, Bc):
    """Br=0: 32 query rows while the tiles fit 48 KiB of static shared memory, else 16."""
    return {"Br": Br or (32 if smem_bytes(problem.head_dim, 32, Bc) <= STATIC_SMEM_LIMIT else 16), "Bc": Bc}


def _supports(problem, Br, Bc):
    return variant_reason(problem) or refuse(problem, smem_bytes(problem.head_dim, Br, Bc))


@register_phase(
    name="bwd_atomic_dq", order=103, title="Backward: one dK/dV kernel adding dQ with float32 atomics",
    parent="bwd_two_kernels", kind="backward",
    description="""
        The parent's dK/dV kernel (one thread per key, Q tiles in shared memory) keeps each tile's dS and its
        keys in shared memory and adds the block's share of dQ_i = scale · Σ_j dS_ij K_j to a float32
        accumulator with atomics; no dQ kernel, so S and dP are computed once. A last kernel writes dQ in the
        inputs' dtype and zeroes the accumulator. dQ's sums are not in a fixed order (not bitwise reproducible).
    """,
    lineage="FlashAttention-2 (Dao 2023), Algorithm 2 (dQ by atomic adds); Triton fused-attention tutorial 06",
    planned_speedup=5.2,  # against bwd_naive: ~1.3x bwd_two_kernels (4x)
    space={"Br": [16, 32], "Bc": [16, 32, 64]},
    sim_params={"Br": 16, "Bc": 16},
    supports=_supports,
    resolve=_resolve,
    variants=True,
)
def bwd_atomic_dq(problem, Br=0, Bc=32):
    B, H, Hkv, Nq, Nk, G = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len, problem.group
    D = problem.head_dim
    delta, grad_kv_dq, finish = make_kernels(D, Br, Bc, problem.causal, mask_stage(problem),
                                             score_grad_stage(problem))
    scale = float32(problem.sm_scale)
    dl = cuda.device_array((B * H, Nq), dtype="float32")
    dq_acc = cuda.to_device(np.zeros((B * H, Nq, D), np.float32))  # zero again after every call (finish)
    n = B * H * Nq * D
    grid_q = ((Nq + Br - 1) // Br, B * H)
    grid_kv = ((Nk + Bc - 1) // Bc, B * Hkv)

    def run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=()):
        delta[grid_q, Br, stream](o, do, dl, Nq)
        grad_kv_dq[grid_kv, Bc, stream](q, k, v, do, lse, dl, dk, dv, dq_acc, scale, H, G, Nq, Nk, mods)
        finish[(n + FINISH_THREADS - 1) // FINISH_THREADS, FINISH_THREADS, stream](dq_acc.reshape(n), dq.reshape(n),
                                                                                  n)

    return backward_launch("bwd_atomic_dq", run, [delta, grad_kv_dq, finish], dl.nbytes + dq_acc.nbytes)
