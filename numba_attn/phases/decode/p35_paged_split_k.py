"""Phase 35 — ``paged_split_k``: split-K decode over a paged KV cache.

Change against ``decode_split_k_lean``: only how a key row is found. The
cache is FlashAttention's paged layout, (num_blocks, page_size, Hkv, D), and
key ``j`` of sequence ``b`` is row ``j % P`` of page ``block_table[b, j // P]``
(``paged_keys`` in ``decode/common.py``). A warp step's KS keys are
consecutive and steps are aligned to KS, so when pages hold whole steps
(``P % KS == 0``) the page index is one load per step; otherwise (a smaller
page, or a step of 3·8 keys) it is read per key. Each sequence has its own length
(``cache_seqlens[b]``): the splits are planned for the longest, a split past
a sequence's end is empty; every split writes a partial (no one-split
direct write) so that a sequence of length 0 gets zeros (its split 0 writes a
zero partial with log-sum-exp 0). The same kernel reads an 8-bit cache
(fp8 e4m3 or int8 bytes, two 32-bit words per 8 elements, dequantized in
registers and multiplied by the per-tensor, per-head or per-token scale).

Prediction: at page size >= 64 the same bandwidth as ``decode_split_k_lean``
(within 5%: one extra L1-cached load per step); an 8-bit cache halves the
bytes, ~1.7-1.9x faster than SDPA on the fp16 contiguous cache at KV >= 16k.
Verdict: not measured yet (no committed GPU row).
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.warp import FULL_MASK, WARP_SIZE, shfl_sync, shfl_xor_sync
from numba_attn.phases.decode.common import (PAGED_KV8, PAGED_TOKEN_SCALE, check_paged_problem, check_split,
                                             chunk_steps, paged_keys, paged_launch, resolve_split, vector_width)
from numba_attn.phases.registry import register_phase


def _log2(n: int) -> int:
    return n.bit_length() - 1


def score_plan(L: int, RB: int, T: int):
    """(NP, SPL, NR): the RB·T partial dot products of a lane are padded to
    NP (a power of two); SPL reduce-scatter stages halve them (offsets L/2,
    L/4, ...), the remaining log2(L) − SPL stages are plain xor-sums of the NR
    = NP / 2^SPL values a lane still holds. Afterwards value v sits in lane
    ``(v // NR) · (L >> SPL)`` of its group (and the lanes just above it)."""
    NP = 1
    while NP < RB * T:
        NP *= 2
    SPL = min(_log2(NP), _log2(L))
    return NP, SPL, NP >> SPL


@functools.cache
def make_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool, P: int,
                KV8: int, TOKEN: bool, FUSED: bool, MINB: int = 1):
    load_rows, _, _, merge_lanes, write_rows, combine_last = chunk_steps(
        D, VW, L, T, NW, RB, Nq, G, causal, False, BASE2=True)
    E = D // L  # elements of a row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    KS = KW * T  # keys per warp step: T keys per group
    load_keys = paged_keys(D, VW, L, T, P, KS, KV8, TOKEN)
    NT = NW * WARP_SIZE
    NRC = (G * Nq + RB - 1) // RB  # row blocks per KV head
    NP, SPL, NR = score_plan(L, RB, T)
    LOG2L = _log2(L)
    HALF = max(1, NP // 2)
    SRC = L >> SPL  # lanes of a group that share one reduced value set
    NV_RT = RB * T

    @kernel(launch_bounds=(NT, MINB))
    def paged_split_k(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, chunk, S):
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
        vals = cuda.local.array(NP, float32)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y // NRC  # b * Hkv + kv head
        row0 = (cuda.blockIdx.y - kvh * NRC) * RB  # first of this block's query rows (g * Nq + i)
        seq = kvh // Hkv
        Nk = seqlens[seq]  # this sequence's keys
        lo = split * chunk  # this block's keys: [lo, hi)
        hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // L
        sub = lane % L
        load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, hi, Nk)
        n_steps = max(0, (hi - lo + KS - 1) // KS)  # 0 for a split past the end
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = lo + step * KS + grp  # this group's keys: j0 + t * KW
            load_keys(k, v, KK, VV, table, seq, kvh - seq * Hkv, lo + step * KS, j0, hi, sub, ks, vs)
            for r in range(RB):
                for t in range(T):
                    s = float32(0.0)
                    for e in range(E):
                        s += Qr[r, e] * KK[t, e]
                    vals[r * T + t] = s
            for vi in range(NV_RT, NP):
                vals[vi] = float32(0.0)
            # reduce-scatter over the L lanes of the group: each stage sends half of the
            # values still held and keeps the other half (NP - 1 shuffles instead of
            # RB·T·log2(L)), then plain xor-sums for the stages left
            for st in range(SPL):
                off = L >> (st + 1)
                half = NP >> (st + 1)
                up = (sub & off) != 0
                for i in range(HALF):
                    if i < half:
                        a = vals[i]
                        b = vals[i + half]
                        send = a if up else b
                        keep = b if up else a
                        vals[i] = keep + shfl_xor_sync(FULL_MASK, send, off)
            for st in range(SPL, LOG2L):
                off = L >> (st + 1)
                for i in range(NR):
                    vals[i] += shfl_xor_sync(FULL_MASK, vals[i], off)
            # all-gather: every lane of the group gets the RB·T scores
            for vi in range(NV_RT):
                if L == 1:
                    sc[vi // T, vi % T] = vals[vi]
                else:
                    sc[vi // T, vi % T] = shfl_sync(FULL_MASK, vals[vi % NR], grp * L + (vi // NR) * SRC)
            for r in range(RB):  # one online-softmax update per row for the T keys (base 2)
                m_old = m[r]
                m_new = m_old
                for t in range(T):
                    if j0 + t * KW < lim[r]:
                        m_new = max(m_new, sc[r, t])
                lsum = float32(0.0)
                for t in range(T):
                    p = math.exp2(sc[r, t] - m_new) if j0 + t * KW < lim[r] else float32(0.0)
                    sc[r, t] = p
                    lsum += p
                if m_new > m_old:  # rescale only when the row's maximum moved
                    corr = math.exp2(m_old - m_new)
                    m[r] = m_new
                    l[r] = l[r] * corr + lsum
                    for e in range(E):
                        acc[r, e] *= corr
                else:
                    l[r] += lsum
                for e in range(E):
                    a = acc[r, e]
                    for t in range(T):
                        a += sc[r, t] * VV[t, e]
                    acc[r, e] = a
        merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub)  # base 2: exp2
        cuda.syncthreads()
        write_rows(o, part_o, part_lse, split, kvh, row0, tid, sm_m, sm_l, sm_o)  # lse back to natural units
        if Nk == 0 and split == 0:  # an empty sequence: a zero partial of weight 1, the output is zeros
            for idx in range(tid, RB * D, NT):  # the threads that wrote the log-sum-exps (d = 0)
                r = idx // D
                if idx == r * D and row0 + r < G * Nq:
                    bh = kvh * G + (row0 + r) // Nq
                    part_lse[0, bh * Nq + (row0 + r) % Nq] = float32(0.0)
        if FUSED:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid)

    return paged_split_k


def _supports(problem, **params):
    return check_paged_problem(problem) or check_split(problem, **params)


@register_phase(
    name="paged_split_k", order=35, title="Paged decode: split-K over the pages of a block table (fp16, fp8, int8 caches)",
    parent="decode_split_k_lean", kind="decode",
    description="""
        decode_split_k_lean on a paged KV cache (FlashAttention's flash_attn_with_kvcache
        layout): a key row is found through the block table (the page index read once per
        warp step when a page holds the step), each sequence has its own length (a length-0
        sequence gives zeros), and an 8-bit cache (fp8 e4m3 or int8, per-tensor, per-head or
        per-token scale) is dequantized in registers. Tolerance: float16's (4e-3) against
        the float64 reference on the dequantized cache, for every cache format.
    """,
    lineage="vLLM PagedAttention (Kwon et al. 2023); FlashAttention flash_attn_with_kvcache; "
            "Flash-Decoding split-K",
    planned_speedup=45.0,
    dtypes=("float16",),
    space={"warps": [4, 8], "keys": [0, 1, 2, 4], "splits": [0, 8, 16, 32, 64], "blocks_per_sm": [1, 2, 4]},
    sim_params={"warps": 2, "splits": 3},
    supports=_supports,
    resolve=resolve_split,
    layout="paged",
)
def paged_split_k(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256, fuse_max=64):
    fused = splits * rows <= fuse_max
    kern = make_kernel(problem.head_dim, vector_width(problem.dtype), lanes, keys, warps, rows, problem.q_len,
                       problem.group, problem.causal, problem.page_size, PAGED_KV8[problem.kv_dtype],
                       bool(PAGED_TOKEN_SCALE[problem.kv_scale]), fused, blocks_per_sm)
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    return paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused,
                        notes=f", combine {'fused' if fused else 'kernel'}")
