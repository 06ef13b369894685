"""Phase 32 — ``decode_split_k_fused``: split-K with the combine in the last block.

Change against ``decode_split_k``: no second kernel. Each block writes its
partial output and log-sum-exp as before, then (after a ``threadfence``)
increments a per-(sequence, KV head, row block) counter with one atomic; the
block that finds it was the last of the ``S`` splits reads all ``S``
partials back (they are in L2) and writes the combined output with the same
``combine_splits`` device function, then resets the counter to 0 for the next
launch. This is the "last block reduces" pattern (CUDA sample
threadFenceReduction; CUTLASS serial split-K).

Why it should be faster: a decode kernel at B=1 lasts 20–100 µs, and the
second launch of ``decode_split_k`` costs a launch gap plus a small kernel
(a few µs) on the critical path, while here the combine of one tile overlaps
with the other tiles' blocks still streaming K/V. The combine work itself is
unchanged (S × rows × D × 4 bytes, from L2).

Prediction (before measuring): −2 to −5 µs per call where S > 1: ~5–10% at
B=1 with 4k–16k keys, <1% at 128k; unchanged for S = 1.

Measured (H200, same run as ``decode_split_k``, commit 26e8ca2): B=1 fp16
4k 26.0 µs (−3.5 µs, −12%), 16k 70.5 µs (−3.9 µs, 89% of the copy figure),
32k 131.0 µs (96%), 128k 482 µs (−4.9 µs, −1%); against SDPA 0.92 / 0.97 /
0.96 / 0.99×. B=1 fp32: 40.6–954 µs (78–106%), 10–13× SDPA. S = 1 shapes
unchanged, as predicted. Miss: GQA B=1 (8 KV heads, S=66) 116.7 µs against
78.0 µs with the separate combine kernel — the last block of each of the 8
tiles combines 4 rows × 128 elements × 66 splits alone (4 serial elements
per thread, 66 dependent steps each), on 8 SMs, after everything else has
finished; the separate kernel spreads the same work over 32 blocks.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32

from numba_attn.gpu.device_functions import NEG_BIG, combine_splits, ldg_f16x8, ldg_f32x4, merge_state, state_lse
from numba_attn.gpu.jit import kernel
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.gpu.warp import WARP_SIZE, group_sum, strided_max, strided_sum
from numba_attn.phases.decode.p30_decode_chunked import (check_alignment, check_decode, decode_rows, keys_per_group, lanes_per_key,
                                 vector_width)
from numba_attn.gpu.split_k import sm_count, split_plan


@functools.cache
def make_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool, FINAL: bool,
                MINB: int = 1):
    E = D // L  # elements of a row per lane
    NV = E // VW  # 16-byte loads per row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    KS = KW * T  # keys per warp step: T keys per group
    NT = NW * WARP_SIZE
    NROWS = G * Nq
    NRC = (NROWS + RB - 1) // RB  # row blocks per KV head
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8

    @kernel(launch_bounds=(NT, MINB))
    def decode_split_k_fused(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, chunk, S):
        sm_m = cuda.shared.array((NW, RB), float32)
        sm_l = cuda.shared.array((NW, RB), float32)
        sm_o = cuda.shared.array((NW, RB, D), float32)
        sm_last = cuda.shared.array(1, int32)
        Qr = cuda.local.array((RB, E), float32)
        acc = cuda.local.array((RB, E), float32)
        m = cuda.local.array(RB, float32)
        l = cuda.local.array(RB, float32)
        lim = cuda.local.array(RB, int32)
        KK = cuda.local.array((T, E), float32)
        VV = cuda.local.array((T, E), float32)
        sc = cuda.local.array((RB, T), float32)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y // NRC  # b * Hkv + kv head
        row0 = (cuda.blockIdx.y - kvh * NRC) * RB  # first of this block's query rows (g * Nq + i)
        lo = split * chunk  # this block's keys: [lo, hi)
        hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // L
        sub = lane % L
        for r in range(RB):
            row = row0 + r
            ok = row < NROWS
            g = row // Nq
            i = row - g * Nq
            bh = kvh * G + g  # = b * H + hkv * G + g
            if ok:
                lim[r] = min(hi, i + Nk - Nq + 1) if causal else hi  # keys < lim: in the split, visible
            else:
                lim[r] = 0
            for u in range(NV):
                for x in range(VW):
                    Qr[r, u * VW + x] = float32(q[bh, i, (sub + L * u) * VW + x]) * scale if ok else float32(0.0)
                    acc[r, u * VW + x] = float32(0.0)
            m[r] = NEG_BIG
            l[r] = float32(0.0)
        n_steps = max(0, (hi - lo + KS - 1) // KS)  # 0 for a split past the end
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = lo + step * KS + grp  # this group's keys: j0 + t * KW
            for t in range(T):  # all loads of the step first: T keys in flight per group
                jj = min(j0 + t * KW, hi - 1)
                for u in range(NV):
                    kx = ldv(k, kvh, jj, (sub + L * u) * VW)
                    vx = ldv(v, kvh, jj, (sub + L * u) * VW)
                    for x in range(VW):
                        KK[t, u * VW + x] = kx[x]
                        VV[t, u * VW + x] = vx[x]
            for r in range(RB):
                for t in range(T):
                    s = float32(0.0)
                    for e in range(E):
                        s += Qr[r, e] * KK[t, e]
                    sc[r, t] = group_sum(s, L)
            for r in range(RB):  # one online-softmax update per row for the T keys
                m_new = m[r]
                for t in range(T):
                    if j0 + t * KW < lim[r]:
                        m_new = max(m_new, sc[r, t])
                corr = math.exp(m[r] - m_new)
                lsum = float32(0.0)
                for t in range(T):
                    p = math.exp(sc[r, t] - m_new) if j0 + t * KW < lim[r] else float32(0.0)
                    sc[r, t] = p
                    lsum += p
                m[r] = m_new
                l[r] = l[r] * corr + lsum
                for e in range(E):
                    a = acc[r, e] * corr
                    for t in range(T):
                        a += sc[r, t] * VV[t, e]
                    acc[r, e] = a
        # merge the lane groups of the warp: common max, rescale, sum
        for r in range(RB):
            mw = strided_max(m[r], L)
            c = math.exp(m[r] - mw)
            lw = strided_sum(l[r] * c, L)
            for e in range(E):
                acc[r, e] = strided_sum(acc[r, e] * c, L)
            if lane < L:
                for u in range(NV):
                    for x in range(VW):
                        sm_o[w, r, (sub + L * u) * VW + x] = acc[r, u * VW + x]
                if lane == 0:
                    sm_m[w, r] = mw
                    sm_l[w, r] = lw
        cuda.syncthreads()
        # merge the warps' partial (m, l, O); write the output or this split's partial
        for idx in range(tid, RB * D, NT):
            r = idx // D
            d = idx - r * D
            row = row0 + r
            if row < NROWS:
                g = row // Nq
                i = row - g * Nq
                mm = NEG_BIG
                ll = float32(0.0)
                oo = float32(0.0)
                for ww in range(NW):
                    mm, ll, ca, cb = merge_state(mm, ll, sm_m[ww, r], sm_l[ww, r])
                    oo = oo * ca + cb * sm_o[ww, r, d]
                bh = kvh * G + g
                if FINAL:
                    o[bh, i, d] = oo / ll
                else:
                    part_o[split, bh * Nq + i, d] = oo / ll if ll > float32(0.0) else float32(0.0)
                    if d == 0:
                        part_lse[split, bh * Nq + i] = state_lse(mm, ll)
        if not FINAL:
            # the last block of this (sequence, KV head, row block) to finish combines the splits
            cuda.threadfence()  # this block's partials are visible device-wide before it counts
            cuda.syncthreads()
            if tid == 0:
                prev = cuda.atomic.add(counters, cuda.blockIdx.y, 1)
                sm_last[0] = 1 if prev == S - 1 else 0
            cuda.syncthreads()
            if sm_last[0] == 1:
                cuda.threadfence()
                for idx in range(tid, RB * D, NT):
                    r = idx // D
                    d = idx - r * D
                    row = row0 + r
                    if row < NROWS:
                        g = row // Nq
                        i = row - g * Nq
                        bh = kvh * G + g
                        o[bh, i, d] = combine_splits(part_o, part_lse, S, bh * Nq + i, d)
                if tid == 0:
                    counters[cuda.blockIdx.y] = 0  # ready for the next launch

    return decode_split_k_fused



def _supports(problem, warps, lanes, rows, keys, splits, blocks_per_sm, min_keys):
    return check_decode(problem, warps, lanes, rows, keys)


@register_phase(
    name="decode_split_k_fused", order=32, title="Decode: split-K, combine by the last block (one launch)",
    parent="decode_split_k", kind="decode",
    description="""
        decode_split_k without the second kernel: every block writes its partial output
        and log-sum-exp, counts itself with an atomic per (sequence, KV head, row block),
        and the last of the S splits combines them (threadfence; counter reset for the
        next launch). One launch per call.
    """,
    lineage="Flash-Decoding (Dao et al. 2023) with the last-block reduction of the CUDA "
            "threadFenceReduction sample / CUTLASS serial split-K",
    planned_speedup=42.0,
    sim_params={"warps": 2, "splits": 3},
    supports=_supports,
)
def decode_split_k_fused(problem, warps=4, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=4, min_keys=256):
    B, H, Hkv, Nq, Nk, D = (problem.batch, problem.heads, problem.kv_heads, problem.q_len,
                            problem.kv_len, problem.head_dim)
    G = problem.group
    VW = vector_width(problem.dtype)
    RB = decode_rows(problem, rows)
    L = lanes_per_key(D, VW, RB, lanes)
    T = keys_per_group(D, L, RB, keys)
    n_rc = (G * Nq + RB - 1) // RB
    S, chunk = split_plan(B * Hkv * n_rc, Nk, warps * (WARP_SIZE // L) * T, sm_count(), blocks_per_sm,
                          min_keys, splits)
    final = S == 1
    kern = make_kernel(D, VW, L, T, warps, RB, Nq, G, problem.causal, final, blocks_per_sm)
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv * n_rc)
    if final:
        part_o = cuda.device_array((1, 1, 1), dtype="float32")
        part_lse = cuda.device_array((1, 1), dtype="float32")
    else:
        part_o = cuda.device_array((S, B * H * Nq, D), dtype="float32")
        part_lse = cuda.device_array((S, B * H * Nq), dtype="float32")
    counters = cuda.device_array(B * Hkv * n_rc, dtype=np.int32)
    if isinstance(counters, np.ndarray):  # host stand-in (offline compilation)
        counters[:] = 0
    else:
        counters.copy_to_device(np.zeros(B * Hkv * n_rc, np.int32))

    def run(q, k, v, o, stream=0):
        check_alignment(k, v)
        kern[grid, warps * WARP_SIZE, stream](q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, chunk, S)

    return Launch(run, kernels=[kern], workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, L={L} lanes/key, T={T} keys/group, {RB} rows/block, "
                        f"{warps} warps")
