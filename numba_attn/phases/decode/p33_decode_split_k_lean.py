"""Phase 33 — ``decode_split_k_lean``: fewer instructions per key in the decode loop.

Change against ``decode_split_k_fused``: the same blocks, splits and loads;
the work between the loads is cut, because with several query rows per block
(a GQA group of 4) the loop was issue-bound, not memory-bound. Offline SASS
of the parent's loop for B=1, 8 KV heads, D=128, fp16 (4 rows, 16 lanes per
key, 2 keys per lane group): 395 instructions per warp step of 4 keys, of
which 128 FFMA and 32 HADD2 (f16→f32) are the dot products and P·V themselves; the rest: 32 SHFL + 32 FADD (one 4-stage
butterfly for each of the 8 scores), 12 MUFU + 12 FMUL (exp), 32 FMUL (the
rescale of the 4 × 8 accumulators at every step), index arithmetic. Per SM
that is ~25 µs of issue at 1.98 GHz for the 1986 keys it streams at B=1 —
close to the 29 µs memory floor, so loads and arithmetic do not overlap.

* Scores: a lane's 8 partial dot products are summed over the 16 lanes of
  its group by a reduce-scatter (each xor stage sends half of the values it
  still holds and keeps the other half: 4 + 2 + 1 shuffles, then one plain
  stage) and one all-gather (8 indexed shuffles): 16 shuffles and 8 adds
  instead of 32 and 32 (``score_plan``; a lane's values are padded to a power
  of two; with fewer lanes than values the lane keeps several).
* Scores in base 2: ``log2(e)`` is folded into the query scale, so each
  exponential is one ``ex2.approx`` (``math.exp2``) without a multiply; the
  log-sum-exp written for the combine is converted back (``m · ln 2 + log l``).
* Lazy rescale: the accumulators of a row are multiplied by
  ``exp2(m_old − m_new)`` only when the row's maximum moved (a per-lane
  branch; with random scores the running maximum rarely moves after the
  first steps), instead of at every step.
* Combine placement: the last-block combine of the parent is kept when it is
  small (``S × rows ≤ fuse_max``); otherwise (GQA at B=1: 66 splits × 4 rows,
  which the parent's last block merged alone on one SM) the combine is the
  second kernel of ``decode_split_k``. Both use the two-pass combine of
  ``combine_splits`` (maximum first, then the weighted sum, 8 splits' loads
  in flight), which replaced the one-pass merge that waited on each split.

Prediction: GQA (8 KV heads, 32k, fp16) B=8 326 → ~280 µs (−15%, the
loop's issue time); B=1 75 → ~45 µs (the combine from ~20 to ~3 µs, the loop
−15%); MHA (one row per block: 2 scores per step, little to save) unchanged
within 2%.
Verdict: 0.0495 ms at B1 H32/8kv Nq1 Nk32768 D128 fp16 (H200), short of the ~45 µs predicted: the loop was not issue-bound [results/decode-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.warp import FULL_MASK, WARP_SIZE, shfl_sync, shfl_xor_sync
from numba_attn.phases.decode.common import check_split, chunk_steps, resolve_split, split_launch, vector_width
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
def make_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool, FINAL: bool,
                FUSED: bool, MINB: int = 1):
    load_rows, load_keys, _, merge_lanes, write_rows, combine_last = chunk_steps(
        D, VW, L, T, NW, RB, Nq, G, causal, FINAL, BASE2=True)
    E = D // L  # elements of a row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    KS = KW * T  # keys per warp step: T keys per group
    NT = NW * WARP_SIZE
    NRC = (G * Nq + RB - 1) // RB  # row blocks per KV head
    NP, SPL, NR = score_plan(L, RB, T)
    LOG2L = _log2(L)
    HALF = max(1, NP // 2)
    SRC = L >> SPL  # lanes of a group that share one reduced value set
    NV_RT = RB * T

    @kernel(launch_bounds=(NT, MINB))
    def decode_split_k_lean(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, chunk, S):
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
            load_keys(k, v, KK, VV, kvh, j0, hi, sub)
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
        if FUSED and not FINAL:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid)

    return decode_split_k_lean


@register_phase(
    name="decode_split_k_lean", order=33, title="Decode: split-K with a lean inner loop (reduce-scatter scores, exp2, lazy rescale)",
    parent="decode_split_k_fused", kind="decode",
    description="""
        decode_split_k_fused with fewer instructions per key: the partial dot products
        of all rows and keys of a step are summed over the lanes of a group with a
        reduce-scatter and one all-gather instead of one butterfly per score; scores in
        base 2 (log2 e folded into the query scale, exp2); the accumulators are
        rescaled only when a row's maximum moved; the combine runs in the last block
        when it is small (S x rows <= fuse_max) and in a second kernel otherwise.
    """,
    lineage="Flash-Decoding (Dao et al. 2023); reduce-scatter/all-gather all-reduce (Rabenseifner); "
            "FlashAttention-2 exp2 scaling; lazy rescaling (FlashAttention-3 / FlashInfer)",
    planned_speedup=45.0,
    space={"warps": [4, 8], "keys": [0, 1, 2, 4], "splits": [0, 8, 16, 32, 64], "blocks_per_sm": [1, 2, 4]},
    sim_params={"warps": 2, "splits": 3},
    supports=check_split,
    resolve=resolve_split,
)
def decode_split_k_lean(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256,
                        fuse_max=64):
    final = splits == 1
    fused = splits * rows <= fuse_max
    kern = make_kernel(problem.head_dim, vector_width(problem.dtype), lanes, keys, warps, rows, problem.q_len,
                       problem.group, problem.causal, final, fused, blocks_per_sm)
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    return split_launch(problem, kern, scale, warps, lanes, rows, keys, splits, counters=True, combine=not fused,
                        notes=f", combine {'-' if final else ('fused' if fused else 'kernel')}")
