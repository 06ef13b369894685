"""Backward phase 2 — ``bwd_mma``: the five GEMMs of the backward on the tensor cores (``mma.sync.m16n8k16``).

Change against ``bwd_two_kernels``: the same split (Delta, a dK/dV kernel over K/V tiles, a dQ kernel over Q
tiles, no atomics), but every product runs as mma.sync (f16/bf16 in, f32 accumulate) on warps of 16 rows
instead of one scalar thread per key or row. dK/dV kernel: a warp owns 16 keys (K_j, V_j the A operands, dK_j,
dV_j accumulators in registers) and computes the transposed scores Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ, so
that Pᵀ and dSᵀ come out in the accumulator layout, which is the A layout of dV_j += Pᵀ·dO_i and
dK_j += dSᵀ·Q_i (no shuffle, no shared-memory round trip). dQ kernel: a warp owns 16 query rows, S = Q_i·K_jᵀ,
dP = dO_i·V_jᵀ, dQ_i += dS·K_j. Tiles are staged as packed words in padded shared memory (the block's own K_j,
V_j or Q_i, dO_i once, the other pair per step); the k-step loop is outermost, so a warp holds one k-step of its A
operands while all its S/dP accumulators grow (registers stay with dK_j, dV_j or dQ_i); the B operands of the
row-major tiles (dO_i and Q_i, K_j) come from ldmatrix.trans.

Prediction: 7 mma products of 2·N²·D FLOPs per head (S and dP twice) = 0.96 TFLOP at fp16 B1 H32 N4096 D128;
at ~75 TFLOP/s of mma.sync (tc_mma's forward reached 100 at D128; grad_kv needs 247 registers there, dK_j and
dV_j alone 128, so few warps per SM) about 13 ms on an H100/H200: ~30× faster than bwd_two_kernels (410 ms),
~10× slower than SDPA cuDNN's 1.23 ms (wgmma).

Verdict: 41.9 ms (causal 20.9), 9.8× bwd_two_kernels, 34× cuDNN: the prediction's third (H200, 86050b7;
experiments/2026-11-27-lse-backward-gpu). At D64, 64×64 tiles halve 32×32's time (12.1 vs 25.1 ms, 16× cuDNN;
experiments/2026-11-27-bwd-tiles); at D128 larger tiles need more than 48 KiB of static shared memory.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.intrinsics import (SMEM_ALIGN, ldmatrix_x4_trans, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2,
                                       unpack_bf16x2, unpack_f16x2)
from numba_attn.gpu.jit import device, kernel
from numba_attn.phases.backward.common import (backward_launch, first_row_of_key, keys_of_row, kv_head, one, refuse,
                                               score_grad_stage, tiled_mask_stage, variant_reason)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.stages import EMPTY, FULL, PLAIN


@device
def visible(i, j, Nq, Nk, causal):
    """Query row i sees key j (both in range; causal bottom-right: j <= i + Nk − Nq)."""
    return i < Nq and j < Nk and (not causal or j <= i + Nk - Nq)


def layout(D: int):
    """(DW, RW, KS, DT, ACC_REGS): words of a row, a staged row in words (padded: conflict-free fragment reads),
    k-steps over the head dimension (S = Q Kᵀ, dP = dO Vᵀ), n-tiles of dK, dV, dQ (8 columns each), the
    accumulators of 16 rows of dK, dV or dQ."""
    return D // 2, D // 2 + 4, D // 16, D // 8, 4 * (D // 8)


@functools.cache
def make_steps(D: int, bf16: bool, stage=PLAIN, dmod=one):
    """What both kernels use, ``(grad_score, mma_into, ldmatrix_rows, delta)``: one score's (P, dS), an
    m16n8k16 into accumulator registers, the ldmatrix.trans addresses, and the Delta kernel on packed words."""
    mma = mma_bf16 if bf16 else mma_f16
    unpack = unpack_bf16x2 if bf16 else unpack_f16x2
    DW = D // 2  # words of a row

    @device
    def grad_score(s, dp, ok, scale, lse_i, delta_i, idx, mods):
        """(P, dS) of one score: P = exp(M − lse_i), M = score_mod(S) (S = s·scale without one), dS = P (dP −
        Delta_i) score_mod'(S); (0, 0) where masked. ``idx``: (b, h, q_idx, kv_idx) of the variant."""
        if not ok:
            return float32(0.0), float32(0.0)
        b, h, qi, j = idx
        s = s * scale
        p = math.exp(stage.modified(s, b, h, qi, j, mods) - lse_i)
        return p, p * (dp - delta_i) * dmod(s, b, h, qi, j, mods)

    @device
    def mma_into(acc, i, a0, a1, a2, a3, b0, b1):
        """acc[i:i + 4] += A·B, one m16n8k16 on accumulator registers."""
        acc[i], acc[i + 1], acc[i + 2], acc[i + 3] = mma(a0, a1, a2, a3, b0, b1, acc[i], acc[i + 1], acc[i + 2],
                                                         acc[i + 3])

    @device
    def ldmatrix_rows(lane):
        """(row, word) offsets of this lane's ldmatrix.x4.trans address in a 16-row k-step of a row-major tile:
        matrices (rows 0-7, columns 0-7), (rows 8-15, 0-7), (0-7, 8-15), (8-15, 8-15), i.e. the B fragments
        (b0, b1) of two 8-column n-tiles."""
        lm = lane // 8
        return (lm % 2) * 8 + lane % 8, 4 * (lm // 2)

    @kernel
    def delta(o, do, dl, Nq):
        """Delta_i = Σ_d dO_id · O_id, one thread per query row: the parent's, on packed words (bfloat16 reaches
        the GPU as 16-bit patterns, which the parent's element reads would take for integers)."""
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        bh = cuda.blockIdx.y
        if i < Nq:
            acc = float32(0.0)
            for w in range(DW):
                o0, o1 = unpack(o[bh, i, w])
                d0, d1 = unpack(do[bh, i, w])
                acc += o0 * d0 + o1 * d1
            dl[bh, i] = acc


    return grad_score, mma_into, ldmatrix_rows, delta


@functools.cache
def make_grad_kv(D: int, Br: int, Bc: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """grad_kv: Bc // 16 warps (16 keys each) over Q tiles of Br rows."""
    grad_score, mma_into, ldmatrix_rows, _ = make_steps(D, bf16, stage, dmod)
    pack = pack_bf16x2 if bf16 else pack_f16x2
    DW, RW, KS, DT, ACC_REGS = layout(D)
    ST_REGS = 4 * (Br // 8)  # accumulators of Sᵀ (16 keys × Br rows)

    @kernel
    def grad_kv(q, k, v, do, lse, dl, dk, dv, scale, H, G, Nq, Nk, mods):
        """dK_j, dV_j of Bc keys of one KV head (16 per warp) over the Q tiles of its G query heads."""
        Q_i = cuda.shared.array((Br, RW), uint32, alignment=SMEM_ALIGN)
        dO_i = cuda.shared.array((Br, RW), uint32, alignment=SMEM_ALIGN)
        lse_i = cuda.shared.array(Br, float32)
        Delta_i = cuda.shared.array(Br, float32)
        tid = cuda.threadIdx.x
        lane = tid % 32
        g, t = lane // 4, lane % 4
        b_r, b_c = ldmatrix_rows(lane)
        kvh = cuda.blockIdx.y
        jb = cuda.blockIdx.x * Bc  # the block's first key
        jw = jb + 16 * (tid // 32)  # the warp's first key: this lane holds keys jw + g and jw + g + 8
        K_j = cuda.shared.array((Bc, RW), uint32, alignment=SMEM_ALIGN)  # (A fragments read from here: registers
        V_j = cuda.shared.array((Bc, RW), uint32, alignment=SMEM_ALIGN)  # go to the dK_j, dV_j accumulators)
        for e in range(tid, Bc * DW, Bc * 2):  # stage K_j, V_j once (zeros past Nk)
            r, c = e // DW, e % DW
            key_ok = jb + r < Nk
            K_j[r, c] = k[kvh, jb + r, c] if key_ok else uint32(0)
            V_j[r, c] = v[kvh, jb + r, c] if key_ok else uint32(0)
        kr = jw - jb + g  # this lane's rows of K_j, V_j: kr and kr + 8
        dK_j = cuda.local.array(ACC_REGS, float32)
        dV_j = cuda.local.array(ACC_REGS, float32)
        for e in range(ACC_REGS):
            dK_j[e] = float32(0.0)
            dV_j[e] = float32(0.0)
        Pt = cuda.local.array(ST_REGS, float32)  # Pᵀ (16 keys × Br rows), accumulator layout
        dSt = cuda.local.array(ST_REGS, float32)  # dSᵀ
        Hkv = H // G
        bh0 = (kvh // Hkv) * H + (kvh % Hkv) * G  # the first query head of this KV head
        # causal: Q tiles before the one holding the first row that sees the block's first key are skipped
        i_start = (first_row_of_key(jb, Nq, Nk, causal) // Br) * Br
        warp_row = first_row_of_key(jw, Nq, Nk, causal)  # the first row that sees one of the warp's keys
        for hq in range(G):
            bh = bh0 + hq
            for i0 in range(i_start, Nq, Br):
                kind = stage.tile_kind(mods, bh // H, bh % H, i0 // Br, jb // Bc)  # the block mask's (FULL: plain)
                if kind == EMPTY:  # block-uniform: no key of the block is seen by a row of this tile
                    continue
                for e in range(tid, Br * DW, Bc * 2):  # stage Q_i, dO_i (zeros past Nq)
                    r, c = e // DW, e % DW
                    row_ok = i0 + r < Nq
                    Q_i[r, c] = q[bh, i0 + r, c] if row_ok else uint32(0)
                    dO_i[r, c] = do[bh, i0 + r, c] if row_ok else uint32(0)
                for r in range(tid, Br, Bc * 2):
                    row_ok = i0 + r < Nq
                    lse_i[r] = lse[bh, i0 + r] if row_ok else float32(0.0)
                    Delta_i[r] = dl[bh, i0 + r] if row_ok else float32(0.0)
                cuda.syncthreads()
                if jw < Nk and warp_row < i0 + Br:  # warp-uniform: some of the warp's keys see this tile
                    for e in range(ST_REGS):
                        Pt[e] = float32(0.0)
                        dSt[e] = float32(0.0)
                    for ks in range(KS):  # Sᵀ = K_j Q_iᵀ into Pt, dPᵀ = V_j dO_iᵀ into dSt, k-step by k-step
                        c = 8 * ks + t  # A: words c, c + 4 of rows kr, kr + 8 (read once per k-step)
                        k0, k1, k2, k3 = K_j[kr, c], K_j[kr + 8, c], K_j[kr, c + 4], K_j[kr + 8, c + 4]
                        v0, v1, v2, v3 = V_j[kr, c], V_j[kr + 8, c], V_j[kr, c + 4], V_j[kr + 8, c + 4]
                        for nt in range(Br // 8):  # B[k = d, n = i] = Q_i[i, d]: words c, c + 4 of row 8nt + g
                            n = 8 * nt + g
                            mma_into(Pt, 4 * nt, k0, k1, k2, k3, Q_i[n, c], Q_i[n, c + 4])
                            mma_into(dSt, 4 * nt, v0, v1, v2, v3, dO_i[n, c], dO_i[n, c + 4])
                    for nt in range(Br // 8):  # P and dS in place: keys jw+g (e = 0, 1), jw+g+8 (e = 2, 3),
                        for e in range(4):     # rows i0 + 8nt + 2t (e = 0, 2) and + 1 (e = 1, 3)
                            r = 8 * nt + 2 * t + e % 2
                            idx = (bh // H, bh % H, i0 + r + Nk - Nq, jw + g + 8 * (e // 2))  # a variant's
                            # mask only in range (`and` short-circuits)
                            ok = visible(i0 + r, idx[3], Nq, Nk, causal) and (kind == FULL or
                                                                               stage.visible(*idx, mods))
                            Pt[4 * nt + e], dSt[4 * nt + e] = grad_score(Pt[4 * nt + e], dSt[4 * nt + e], ok, scale,
                                                                         lse_i[r], Delta_i[r], idx, mods)
                    for kk in range(Br // 16):  # dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i: two n-tiles = one A fragment
                        a0 = pack(Pt[8 * kk], Pt[8 * kk + 1])
                        a1 = pack(Pt[8 * kk + 2], Pt[8 * kk + 3])
                        a2 = pack(Pt[8 * kk + 4], Pt[8 * kk + 5])
                        a3 = pack(Pt[8 * kk + 6], Pt[8 * kk + 7])
                        e0 = pack(dSt[8 * kk], dSt[8 * kk + 1])
                        e1 = pack(dSt[8 * kk + 2], dSt[8 * kk + 3])
                        e2 = pack(dSt[8 * kk + 4], dSt[8 * kk + 5])
                        e3 = pack(dSt[8 * kk + 6], dSt[8 * kk + 7])
                        for dp in range(DT // 2):  # d-tiles 2dp, 2dp + 1; B[k = i, n = d] = dO_i[i, d], Q_i[i, d]
                            b = ldmatrix_x4_trans(dO_i, 16 * kk + b_r, 8 * dp + b_c)
                            mma_into(dV_j, 8 * dp, a0, a1, a2, a3, b[0], b[1])
                            mma_into(dV_j, 8 * dp + 4, a0, a1, a2, a3, b[2], b[3])
                            b = ldmatrix_x4_trans(Q_i, 16 * kk + b_r, 8 * dp + b_c)
                            mma_into(dK_j, 8 * dp, e0, e1, e2, e3, b[0], b[1])
                            mma_into(dK_j, 8 * dp + 4, e0, e1, e2, e3, b[2], b[3])
                cuda.syncthreads()
        for dt in range(DT):  # dK_j (× scale: S was Q Kᵀ · scale) and dV_j, two columns per word
            c = 4 * dt + t
            if jw + g < Nk:
                dk[kvh, jw + g, c] = pack(dK_j[4 * dt] * scale, dK_j[4 * dt + 1] * scale)
                dv[kvh, jw + g, c] = pack(dV_j[4 * dt], dV_j[4 * dt + 1])
            if jw + g + 8 < Nk:
                dk[kvh, jw + g + 8, c] = pack(dK_j[4 * dt + 2] * scale, dK_j[4 * dt + 3] * scale)
                dv[kvh, jw + g + 8, c] = pack(dV_j[4 * dt + 2], dV_j[4 * dt + 3])

    return grad_kv


@functools.cache
def make_grad_q(D: int, Br: int, Bc: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """grad_q: Br // 16 warps (16 rows each) over K/V tiles of Bc keys."""
    grad_score, mma_into, ldmatrix_rows, _ = make_steps(D, bf16, stage, dmod)
    pack = pack_bf16x2 if bf16 else pack_f16x2
    DW, RW, KS, DT, ACC_REGS = layout(D)
    S_REGS = 4 * (Bc // 8)  # accumulators of S (16 rows × Bc keys)

    @kernel
    def grad_q(q, k, v, do, lse, dl, dq, scale, H, G, Nq, Nk, mods):
        """dQ_i of Br query rows of one head (16 per warp) over the K/V tiles of Bc keys the rows see."""
        K_j = cuda.shared.array((Bc, RW), uint32, alignment=SMEM_ALIGN)
        V_j = cuda.shared.array((Bc, RW), uint32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        lane = tid % 32
        g, t = lane // 4, lane % 4
        b_r, b_c = ldmatrix_rows(lane)
        bh = cuda.blockIdx.y
        kvh = kv_head(bh, H, G)
        ib = cuda.blockIdx.x * Br  # the block's first row
        iw = ib + 16 * (tid // 32)  # the warp's first row: this lane holds rows iw + g and iw + g + 8
        r_lo, r_hi = iw + g, iw + g + 8
        Q_i = cuda.shared.array((Br, RW), uint32, alignment=SMEM_ALIGN)  # (A fragments read from here: registers
        dO_i = cuda.shared.array((Br, RW), uint32, alignment=SMEM_ALIGN)  # go to the dQ_i accumulators)
        for e in range(tid, Br * DW, Br * 2):  # stage Q_i, dO_i once (zeros past Nq)
            r, c = e // DW, e % DW
            row_ok = ib + r < Nq
            Q_i[r, c] = q[bh, ib + r, c] if row_ok else uint32(0)
            dO_i[r, c] = do[bh, ib + r, c] if row_ok else uint32(0)
        qr = iw - ib + g  # this lane's rows of Q_i, dO_i: qr and qr + 8
        lse_lo = lse[bh, r_lo] if r_lo < Nq else float32(0.0)
        lse_hi = lse[bh, r_hi] if r_hi < Nq else float32(0.0)
        Delta_lo = dl[bh, r_lo] if r_lo < Nq else float32(0.0)
        Delta_hi = dl[bh, r_hi] if r_hi < Nq else float32(0.0)
        dQ_i = cuda.local.array(ACC_REGS, float32)
        for e in range(ACC_REGS):
            dQ_i[e] = float32(0.0)
        S = cuda.local.array(S_REGS, float32)  # S (16 rows × Bc keys), accumulator layout
        dS = cuda.local.array(S_REGS, float32)  # dP, then dS in place
        block_keys = keys_of_row(min(ib + Br, Nq) - 1, Nq, Nk, causal)  # the keys the block's last row sees
        warp_keys = keys_of_row(min(iw + 16, Nq) - 1, Nq, Nk, causal) if iw < Nq else 0
        for j0 in range(0, block_keys, Bc):
            kind = stage.tile_kind(mods, bh // H, bh % H, ib // Br, j0 // Bc)  # the block mask's (FULL: plain)
            if kind == EMPTY:  # block-uniform: no row of the block sees a key of this tile
                continue
            for e in range(tid, Bc * DW, Br * 2):  # stage K_j, V_j (zeros past Nk)
                r, c = e // DW, e % DW
                key_ok = j0 + r < Nk
                K_j[r, c] = k[kvh, j0 + r, c] if key_ok else uint32(0)
                V_j[r, c] = v[kvh, j0 + r, c] if key_ok else uint32(0)
            cuda.syncthreads()
            if j0 < warp_keys:  # warp-uniform: the warp's rows see some key of this tile
                for e in range(S_REGS):
                    S[e] = float32(0.0)
                    dS[e] = float32(0.0)
                for ks in range(KS):  # S = Q_i K_jᵀ, dP = dO_i V_jᵀ into dS, k-step by k-step
                    c = 8 * ks + t  # A: words c, c + 4 of rows qr, qr + 8 (read once per k-step)
                    q0, q1, q2, q3 = Q_i[qr, c], Q_i[qr + 8, c], Q_i[qr, c + 4], Q_i[qr + 8, c + 4]
                    o0, o1, o2, o3 = dO_i[qr, c], dO_i[qr + 8, c], dO_i[qr, c + 4], dO_i[qr + 8, c + 4]
                    for nt in range(Bc // 8):  # B[k = d, n = j] = K_j[j, d]: words c, c + 4 of row 8nt + g
                        n = 8 * nt + g
                        mma_into(S, 4 * nt, q0, q1, q2, q3, K_j[n, c], K_j[n, c + 4])
                        mma_into(dS, 4 * nt, o0, o1, o2, o3, V_j[n, c], V_j[n, c + 4])
                for nt in range(Bc // 8):  # dS in place: rows r_lo (e = 0, 1), r_hi (e = 2, 3),
                    for e in range(4):     # keys j0 + 8nt + 2t (e = 0, 2) and + 1 (e = 1, 3)
                        hi = e // 2
                        i, j = r_hi if hi else r_lo, j0 + 8 * nt + 2 * t + e % 2
                        idx = (bh // H, bh % H, i + Nk - Nq, j)
                        ok = visible(i, j, Nq, Nk, causal) and (kind == FULL or stage.visible(*idx, mods))
                        _, dS[4 * nt + e] = grad_score(S[4 * nt + e], dS[4 * nt + e], ok, scale,
                                                       lse_hi if hi else lse_lo, Delta_hi if hi else Delta_lo, idx,
                                                       mods)
                for kk in range(Bc // 16):  # dQ_i += dS K_j: two n-tiles of dS = one A fragment
                    a0 = pack(dS[8 * kk], dS[8 * kk + 1])
                    a1 = pack(dS[8 * kk + 2], dS[8 * kk + 3])
                    a2 = pack(dS[8 * kk + 4], dS[8 * kk + 5])
                    a3 = pack(dS[8 * kk + 6], dS[8 * kk + 7])
                    for dp in range(DT // 2):  # d-tiles 2dp, 2dp + 1; B[k = j, n = d] = K_j[j, d]
                        b = ldmatrix_x4_trans(K_j, 16 * kk + b_r, 8 * dp + b_c)
                        mma_into(dQ_i, 8 * dp, a0, a1, a2, a3, b[0], b[1])
                        mma_into(dQ_i, 8 * dp + 4, a0, a1, a2, a3, b[2], b[3])
            cuda.syncthreads()
        for dt in range(DT):  # dQ_i × scale, two columns per word
            c = 4 * dt + t
            if r_lo < Nq:
                dq[bh, r_lo, c] = pack(dQ_i[4 * dt] * scale, dQ_i[4 * dt + 1] * scale)
            if r_hi < Nq:
                dq[bh, r_hi, c] = pack(dQ_i[4 * dt + 2] * scale, dQ_i[4 * dt + 3] * scale)

    return grad_q


def make_kernels(D: int, Br: int, Bc: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one):
    """The ``bwd_mma`` kernels ``(delta, grad_kv, grad_q)`` on uint32 views of the f16/bf16 arrays."""
    return (make_steps(D, bf16, stage, dmod)[3], make_grad_kv(D, Br, Bc, causal, bf16, stage, dmod),
            make_grad_q(D, Br, Bc, causal, bf16, stage, dmod))


def smem_bytes(D, Br, Bc):
    """grad_kv's shared tiles (grad_q's are the same less lse, Delta): Q_i, dO_i, K_j, V_j in padded words."""
    RW = D // 2 + 4
    return 4 * (2 * Br * RW + 2 * Br) + 4 * 2 * Bc * RW


def _resolve(problem, Br, Bc):
    """Br=0, Bc=0: 64×64 tiles up to D=64 (measured 2.1× faster than 32×32 there), 32×32 above (larger ones
    need more than 48 KiB of static shared memory at D=128)."""
    tile = 64 if problem.head_dim <= 64 else 32
    return {"Br": Br or tile, "Bc": Bc or tile}


def _supports(problem, Br, Bc):
    D = problem.head_dim
    if D % 16 or D > 128:
        return f"head_dim {D} must be a multiple of 16 and at most 128 (fragments and accumulators in registers)"
    if Br % 16 or Bc % 16 or not (16 <= Br <= 128 and 16 <= Bc <= 128):
        return f"Br={Br} and Bc={Bc} must be multiples of 16 from 16 to 128 (16 rows or keys per warp)"
    return variant_reason(problem) or refuse(problem, smem_bytes(D, Br, Bc))


@register_phase(
    name="bwd_mma", order=102, title="Backward on the tensor cores: mma.sync m16n8k16 dK/dV and dQ kernels",
    parent="bwd_two_kernels", kind="backward",
    description="""
        The parent's split (Delta, a dK/dV kernel over K/V tiles, a dQ kernel over Q tiles, no atomics) with
        every product on mma.sync.m16n8k16 (f16/bf16 in, f32 accumulate). dK/dV: a warp owns 16 keys (K, V
        the A operands, dK, dV accumulators in registers) and computes Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, whose
        accumulators are already the A fragments of dV += Pᵀ dO and dK += dSᵀ Q. dQ: a warp owns 16 rows,
        S = Q Kᵀ, dP = dO Vᵀ, dQ += dS K. Q/dO and K/V tiles staged as packed words in padded shared memory,
        the k-step loop outermost (A operands read per k-step), B of row-major tiles by ldmatrix.trans.
    """,
    lineage="FlashAttention-2 (Dao 2023), Algorithm 2 on mma.sync; PTX mma.sync m16n8k16 fragment layouts",
    planned_speedup=120.0,  # against bwd_naive, as every planned speedup: ~30x bwd_two_kernels (4x)
    dtypes=("float16", "bfloat16"),
    requires_cc=(8, 0),
    space={"Br": [16, 32, 64], "Bc": [16, 32, 64]},
    sim_params={"Br": 16, "Bc": 16},
    supports=_supports,
    resolve=_resolve,
    variants=True,
)
def bwd_mma(problem, Br=0, Bc=0):
    B, H, Hkv, Nq, Nk, G = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len, problem.group
    delta, grad_kv, grad_q = make_kernels(problem.head_dim, Br, Bc, problem.causal, problem.dtype == "bfloat16",
                                          tiled_mask_stage(problem), score_grad_stage(problem))
    kernel_mods = KernelMods(problem, Br, Bc)  # a mask function's arrays, then its block mask at (Br, Bc)
    scale = float32(problem.sm_scale)
    dl = cuda.device_array((B * H, Nq), dtype="float32")
    grid_q = ((Nq + Br - 1) // Br, B * H)
    grid_kv = ((Nk + Bc - 1) // Bc, B * Hkv)

    def run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=()):
        q, k, v, o, do, dq, dk, dv = (view_as(a, np.uint32) for a in (q, k, v, o, do, dq, dk, dv))
        mods = kernel_mods(aux=mods or None, stream=stream) if kernel_mods.variant is not None else mods
        delta[grid_q, Br, stream](o, do, dl, Nq)
        grad_kv[grid_kv, 2 * Bc, stream](q, k, v, do, lse, dl, dk, dv, scale, H, G, Nq, Nk, mods)  # Bc / 16 warps
        grad_q[grid_q, 2 * Br, stream](q, k, v, do, lse, dl, dq, scale, H, G, Nq, Nk, mods)  # Br / 16 warps

    return backward_launch("bwd_mma", run, [delta, grad_kv, grad_q], dl.nbytes, host_aux=True)
