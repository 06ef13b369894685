"""The 8-bit fragment kernel of ``paged_mma8``: an fp8 or int8 paged cache's codes from the 16-byte loads
straight into ``mma.m16n8k16`` fragments (its loads: frag8_loads.py)."""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, float64, int32, uint32

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.intrinsics import byte_perm, cp_async_commit, cp_async_wait, mma_f16, pack_f16x2, unpack_f16x2
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import dynamic_tile
from numba_attn.gpu.warp import FULL_MASK, WARP_SIZE, shfl_sync, shfl_xor_sync, syncwarp
from numba_attn.phases.decode.frag8_loads import make_frag8_loads, make_frag8_ring
from numba_attn.phases.decode.scores import key_mask, variant_keys
from numba_attn.phases.decode.steps import chunk_steps, empty_sequence_lse
from numba_attn.variants.stages import PLAIN


@functools.cache
def make_frag8_step(D: int, Nq: int, G: int, KV_FORMAT: int, TOKEN: bool, SPLITP: bool, STEP_HEADS: int):
    """The 8-bit fragment kernel's warp step around its online softmax: the codes decoded into fragments, Qᵀ's
    fragments, Sᵀ = K·Qᵀ (``scores``), Pᵀ's fragments from the score lanes (``p_fragments``), Oᵀ += Vᵀ·Pᵀ
    (``step_pv``)."""
    from numba_attn.gpu.intrinsics import cvt_e4m3x4_f16x2, sub_f16x2

    ROWS = G * Nq * STEP_HEADS  # query rows of the block (HW > 1: one per KV head, HW heads)
    NKS = D // 16  # k-steps of Sᵀ: one word of a key per lane each
    VWL = D // 32  # words of a V row per lane (dims g·D/8 …)
    FP8 = KV_FORMAT == 1
    I8_SIGN = uint32(0x80808080)  # every byte's sign bit: int8 c → the unsigned byte c + 128
    I8_HI = uint32(0x64646464)  # the high byte of f16 1024 (x in the low byte: 1024 + x)
    I8_BIAS = uint32(0x64806480)  # f16x2 (1152, 1152)

    @device
    def k_pairs(x):
        """One word of a key's codes → the two f16x2 of a k-step (fp8: bytes 0,1 and 2,3; int8: 0,2 and 1,3).
        int8: each code c as f16 1152 + c (exact: the sign-flipped byte in the mantissa of 1024, one
        ``prmt`` per pair); the 1152 stays in, the scores start from −1152·Σq instead."""
        if FP8:
            return cvt_e4m3x4_f16x2(x)
        y = x ^ I8_SIGN
        return byte_perm(y, I8_HI, uint32(0x4240)), byte_perm(y, I8_HI, uint32(0x4341))

    @device
    def v_pairs(a, b, lo):
        """Dims (byte 0, byte 1) of keys a, b (``lo``) or (2, 3) → two f16x2 of (key a, key b) per dim.
        int8: key b's two dims first as f16x2 1152 + c (one ``prmt``), then each pair by one ``prmt`` of
        key a's byte into it, and ``sub.rn.f16x2`` of 1152 (exact)."""
        if FP8:
            return cvt_e4m3x4_f16x2(byte_perm(a, b, uint32(0x5140 if lo else 0x7362)))
        ya = a ^ I8_SIGN
        yb = byte_perm(b ^ I8_SIGN, I8_HI, uint32(0x4140 if lo else 0x4342))  # b's dims (0, 1) or (2, 3)
        return (sub_f16x2(byte_perm(ya, yb, uint32(0x5450 if lo else 0x5452)), I8_BIAS),
                sub_f16x2(byte_perm(ya, yb, uint32(0x7651 if lo else 0x7653)), I8_BIAS))

    @device
    def query_fragments(q, qb, kvh, g, t):
        """Qᵀ's B fragments into ``qb`` (row g, lane t's dims of each k-step, paired as ``k_pairs`` pairs them);
        returns the scores' start of rows 2t, 2t+1 (int8: −1152·Σq, the codes' bias; fp8: 0)."""
        qi = g - (g // Nq) * Nq
        bh = kvh * (G * STEP_HEADS) + g // Nq
        qsum = float64(0.0)  # int8: row g's sum over this lane's dims (float64: exact for f16 values)
        for kx in range(NKS):
            d0 = 4 * (4 * (t + 4 * (kx // 4)) + kx % 4)
            if g < ROWS:
                if FP8:
                    qb[2 * kx] = pack_f16x2(float32(q[bh, qi, d0]), float32(q[bh, qi, d0 + 1]))
                    qb[2 * kx + 1] = pack_f16x2(float32(q[bh, qi, d0 + 2]), float32(q[bh, qi, d0 + 3]))
                else:
                    x0 = float32(q[bh, qi, d0])
                    x1 = float32(q[bh, qi, d0 + 1])
                    x2 = float32(q[bh, qi, d0 + 2])
                    x3 = float32(q[bh, qi, d0 + 3])
                    qb[2 * kx] = pack_f16x2(x0, x2)
                    qb[2 * kx + 1] = pack_f16x2(x1, x3)
                    qsum += (float64(x0) + float64(x1)) + (float64(x2) + float64(x3))
            else:
                qb[2 * kx] = uint32(0)
                qb[2 * kx + 1] = uint32(0)
        r0 = 2 * t
        r1 = 2 * t + 1
        cb0 = float32(0.0)
        cb1 = float32(0.0)
        if not FP8:  # int8: the scores' start, −1152·Σq of rows 2t, 2t+1 (exact sum, rounded once to float32)
            qsum += shfl_xor_sync(FULL_MASK, qsum, 1)
            qsum += shfl_xor_sync(FULL_MASK, qsum, 2)
            cb = float32(qsum * float64(-1152.0))
            cb0 = shfl_sync(FULL_MASK, cb, 4 * r0)
            if ROWS > 1:  # (one row: row 2t+1 is padding everywhere)
                cb1 = shfl_sync(FULL_MASK, cb, 4 * r1)
        return cb0, cb1

    @device
    def step_pv(vw, acc, pb0, pb1, qb0, qb1):
        """Oᵀ += Vᵀ Pᵀ: m-tiles 2x, 2x+1 from word x of the four keys' V words ``vw``; Pᵀ's B fragment
        ``pb0, pb1`` (``SPLITP``: and the part f16 rounded away, ``qb0, qb1``, a second mma)."""
        for x in range(VWL):
            for half in range(2):
                a0, a1 = v_pairs(vw[x], vw[VWL + x], half == 0)
                a2, a3 = v_pairs(vw[2 * VWL + x], vw[3 * VWL + x], half == 0)
                i = 2 * x + half
                acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3] = mma_f16(
                    a0, a1, a2, a3, pb0, pb1, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])
                if SPLITP:
                    acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3] = mma_f16(
                        a0, a1, a2, a3, qb0, qb1, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])

    @device
    def scores(kw, qb, ssc, cb0, cb1):
        """Sᵀ = K·Qᵀ of a step (c0, c1: key g, rows 2t, 2t+1; c2, c3: key g+8) from the scores' start ``cb0, cb1``,
        scaled by ``ssc``: (ksc, sk0, sk1), the keys' per-token scales or the columns' scales."""
        ksc, sk0, sk1 = ssc
        s0 = cb0  # fp8: 0; int8: −1152·Σq (the codes' bias)
        s1 = cb1
        s2 = cb0
        s3 = cb1
        for kx in range(NKS):
            a0, a2 = k_pairs(kw[kx])
            a1, a3 = k_pairs(kw[NKS + kx])
            s0, s1, s2, s3 = mma_f16(a0, a1, a2, a3, qb[2 * kx], qb[2 * kx + 1], s0, s1, s2, s3)
        if TOKEN:
            s0 *= ksc[0]
            s1 *= ksc[0]
            s2 *= ksc[1]
            s3 *= ksc[1]
        else:
            s0 *= sk0
            s1 *= sk1
            s2 *= sk0
            s3 *= sk1
        return s0, s1, s2, s3

    @device
    def p_fragments(p0, p1, p2, p3, vsc, g, t):
        """Pᵀ's B fragment of lane (g, t) from the probabilities ``p0 … p3`` of the score lanes (fp8 with per-token
        scales: times the keys' V scales ``vsc``): pb0, pb1, and (``SPLITP``) qb0, qb1, the part f16 rounded
        away."""
        # Pᵀ's B fragment of lane (g, t): P[keys 2t, 2t+1 | 2t+8, 2t+9][row g], from lanes (2t | 2t+1, g // 2)
        sa = 8 * t + g // 2
        sb = sa + 4
        if ROWS > 1:  # row g is row 2t' or 2t'+1 of its source lanes: both fetched, one kept
            odd = (g & 1) != 0
            e0 = shfl_sync(FULL_MASK, p0, sa)
            e1 = shfl_sync(FULL_MASK, p1, sa)
            e2 = shfl_sync(FULL_MASK, p0, sb)
            e3 = shfl_sync(FULL_MASK, p1, sb)
            f0 = shfl_sync(FULL_MASK, p2, sa)
            f1 = shfl_sync(FULL_MASK, p3, sa)
            f2 = shfl_sync(FULL_MASK, p2, sb)
            f3 = shfl_sync(FULL_MASK, p3, sb)
            xa = e1 if odd else e0
            xb = e3 if odd else e2
            ya = f1 if odd else f0
            yb = f3 if odd else f2
        else:  # one row: only lanes g = 0 matter (the others compute padding rows)
            xa = shfl_sync(FULL_MASK, p0, sa)
            xb = shfl_sync(FULL_MASK, p0, sb)
            ya = shfl_sync(FULL_MASK, p2, sa)
            yb = shfl_sync(FULL_MASK, p2, sb)
        if TOKEN and FP8:  # each key's V scale on its probability (l is already summed)
            xa *= vsc[0]
            xb *= vsc[1]
            ya *= vsc[2]
            yb *= vsc[3]
        pb0 = pack_f16x2(xa, xb)
        pb1 = pack_f16x2(ya, yb)
        if SPLITP:  # the part of P that f16 rounded away, as a second f16 operand
            ha, hb = unpack_f16x2(pb0)
            hc, hd = unpack_f16x2(pb1)
            qb0 = pack_f16x2(xa - ha, xb - hb)
            qb1 = pack_f16x2(ya - hc, yb - hd)
        else:
            qb0 = pb0
            qb1 = pb1
        return pb0, pb1, qb0, qb1

    return query_fragments, scores, p_fragments, step_pv


@functools.cache
def make_frag8_softmax(D: int, Nq: int, G: int, causal: bool, STEP_HEADS: int, stage=PLAIN):
    """``step_softmax``: the 8-bit fragment kernel's online softmax (base 2) of rows 2t, 2t+1 over a warp step's 16
    keys: the keys a row sees, a variant's scores, the maxima over the lanes of a row, P and the lazy rescale."""
    ROWS = G * Nq * STEP_HEADS
    LHW = STEP_HEADS.bit_length() - 1
    NMT = D // 16  # m-tiles of Oᵀ (dims)
    _, visible = key_mask(causal, Nq)
    VARIANT = stage.active
    vk = variant_keys(stage, True)  # (base-2 scores)

    @device
    def step_softmax(acc, s, state, rows, j0, g, key, mods):
        """Scores ``s`` = (s0..s3) of keys g, g+8 for rows 2t, 2t+1; ``state``: (m0, m1, l0, l1); ``rows``: (r0, r1,
        lim0, lim1); ``key``: (seq, h, Nk). Returns p0..p3 and the new state (``acc`` rescaled in place)."""
        s0, s1, s2, s3 = s
        m0, m1, l0, l1 = state
        r0, r1, lim0, lim1 = rows
        seq, h, Nk = key
        # online softmax (base 2) of rows 2t, 2t+1 over the step's 16 keys (the 8 lanes of a t; HW > 1: rows)
        ja = j0 + (g >> LHW)  # the tokens of rows g, g+8
        jb = j0 + ((g + 8) >> LHW)
        ok0 = visible(ja, lim0)
        ok1 = visible(ja, lim1)
        ok2 = visible(jb, lim0)
        ok3 = visible(jb, lim1)
        if STEP_HEADS > 1:  # a row's score counts in its own head's column only (rows g, g+8: head g % HW)
            hg = g & (STEP_HEADS - 1)
            ok0 = ok0 and hg == r0
            ok1 = ok1 and hg == r1
            ok2 = ok2 and hg == r0
            ok3 = ok3 and hg == r1
        if VARIANT:  # the variant on the keys rows 2t, 2t+1 see (query head h·G + r // Nq; HW > 1: h + r)
            hq0 = h * G + r0 // Nq
            hq1 = h * G + r1 // Nq
            if ok0 and r0 < ROWS:
                s0 = vk.score(s0, seq, hq0, r0 % Nq + Nk - Nq, ja, mods)
            if ok1 and r1 < ROWS:
                s1 = vk.score(s1, seq, hq1, r1 % Nq + Nk - Nq, ja, mods)
            if ok2 and r0 < ROWS:
                s2 = vk.score(s2, seq, hq0, r0 % Nq + Nk - Nq, jb, mods)
            if ok3 and r1 < ROWS:
                s3 = vk.score(s3, seq, hq1, r1 % Nq + Nk - Nq, jb, mods)
        # (a NaN score, from a NaN code in K, is left out of the maxima as fmaxf leaves it: P, l, O are NaN)
        mx0 = max(max(NEG_BIG, s0 if ok0 else NEG_BIG), s2 if ok2 else NEG_BIG)
        mx1 = max(max(NEG_BIG, s1 if ok1 else NEG_BIG), s3 if ok3 else NEG_BIG)
        for off in (4, 8, 16):
            mx0 = max(mx0, shfl_xor_sync(FULL_MASK, mx0, off))
            mx1 = max(mx1, shfl_xor_sync(FULL_MASK, mx1, off))
        mn0 = max(m0, mx0)
        mn1 = max(m1, mx1)
        p0 = math.exp2(s0 - mn0) if ok0 else float32(0.0)
        p1 = math.exp2(s1 - mn1) if ok1 else float32(0.0)
        p2 = math.exp2(s2 - mn0) if ok2 else float32(0.0)
        p3 = math.exp2(s3 - mn1) if ok3 else float32(0.0)
        if mn0 > m0 or mn1 > m1:  # rescale only when a row's maximum moved
            c0 = math.exp2(m0 - mn0)
            c1 = math.exp2(m1 - mn1)
            l0 *= c0
            l1 *= c1
            for i in range(NMT):
                acc[4 * i] *= c0
                acc[4 * i + 1] *= c1
                acc[4 * i + 2] *= c0
                acc[4 * i + 3] *= c1
            m0 = mn0
            m1 = mn1
        l0 += p0 + p2
        l1 += p1 + p3
        return p0, p1, p2, p3, m0, m1, l0, l1

    return step_softmax


@functools.cache
def make_frag8_finish(D: int, WARPS: int, Nq: int, G: int, causal: bool, FUSED: bool, STEP_HEADS: int, TOKEN: bool,
                      stage=PLAIN):
    """The 8-bit fragment kernel's epilogue: a warp's state into shared memory (``warp_state``), then the block's
    rows written from them (``finish``; ``FUSED``: the last split combines; ``stage``: a variant's, a row that saw
    no key a zero partial)."""
    ROWS = G * Nq * STEP_HEADS  # query rows of the block
    _, _, _, _, write_rows, combine_last = chunk_steps(D, 8, 1, 1, WARPS, ROWS, Nq, G * STEP_HEADS, causal, False,
                                                       BASE2=True, stage=stage)
    THREADS = WARPS * WARP_SIZE
    EMPTY_SEQUENCE = empty_sequence_lse(stage)
    D8 = D // 8
    NMT = D // 16  # m-tiles of Oᵀ (dims)

    @device
    def warp_state(sm, acc, state, vs, heads, rows, w, g):
        """The warp's state into shared memory: l summed over the 8 lanes of a row pair, O rows 2t, 2t+1 (per-head V
        scales ``vs`` of the columns' KV ``heads``). ``state``: (m0, m1, l0, l1); ``rows``: (r0, r1)."""
        sm_m, sm_l, sm_o, _, _ = sm
        m0, m1, l0, l1 = state
        c0h, c1h = heads
        r0, r1 = rows
        for off in (4, 8, 16):
            l0 += shfl_xor_sync(FULL_MASK, l0, off)
            l1 += shfl_xor_sync(FULL_MASK, l1, off)
        vh0 = float32(1.0) if TOKEN else vs[0, c0h]
        vh1 = float32(1.0) if TOKEN else vs[0, c1h]
        for i in range(NMT):
            d = g * D8 + 2 * i
            if r0 < ROWS:
                sm_o[w, r0, d] = acc[4 * i] * vh0
                sm_o[w, r0, d + 1] = acc[4 * i + 2] * vh0
            if r1 < ROWS:
                sm_o[w, r1, d] = acc[4 * i + 1] * vh1
                sm_o[w, r1, d + 1] = acc[4 * i + 3] * vh1
        if g == 0:
            if r0 < ROWS:
                sm_m[w, r0] = m0
                sm_l[w, r0] = l0
            if r1 < ROWS:
                sm_m[w, r1] = m1
                sm_l[w, r1] = l1

    @device
    def finish(out, sm, split, kvh, Nk, tid, mods):
        """The block's rows written from the warps' states in shared memory (``FUSED``: the last split combines).
        ``out``: (o, part_o, part_lse, counters, S); ``sm``: (sm_m, sm_l, sm_o, sm_last, ring)."""
        o, part_o, part_lse, counters, S = out
        sm_m, sm_l, sm_o, sm_last, _ = sm
        cuda.syncthreads()
        write_rows(o, part_o, part_lse, split, kvh, 0, tid, sm_m, sm_l, sm_o, mods)  # lse back to natural units
        if Nk == 0 and split == 0:  # an empty sequence: a zero partial of weight 1, the output is zeros
            for idx in range(tid, ROWS * D, THREADS):  # the threads that wrote the log-sum-exps (d = 0)
                r = idx // D
                if idx == r * D:
                    part_lse[0, (kvh * G * STEP_HEADS + r // Nq) * Nq + r % Nq] = EMPTY_SEQUENCE
        if FUSED:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, 0, tid, cuda.blockIdx.y, mods)

    return warp_state, finish


@functools.cache
def make_frag8_kernel(D: int, WARPS: int, Nq: int, G: int, causal: bool, FUSED: bool, MIN_BLOCKS: int, P: int,
                      KV_FORMAT: int, TOKEN: bool, SPLITP: bool = True, PREFETCH: int = 0, STEP_HEADS: int = 1,
                      STAGES: int = 0, stage=PLAIN):
    """``paged_split_k``'s kernel with ``mma`` (an 8-bit paged cache, float16 query, D a multiple of 64,
    at most 8 query rows per KV head): the codes go from the 16-byte loads straight into tensor-core
    fragments, with no float32 per element and no shared memory. A warp step is 16 keys, two
    ``mma.m16n8k16`` problems with the keys on M and the (at most 8) query rows on N:

    * Sᵀ = K·Qᵀ: lane (g, t) loads the D/16 words of keys g and g+8 that lane t of a k-step owns
      (16-byte chunks t, t+4, …); one word is the A fragment of one k-step (its four codes → two
      f16x2, in the order the query's B fragment is packed in: a dot product does not care which
      dims a k-step holds). c0..c3 = scores of keys g, g+8 for rows 2t, 2t+1.
    * Oᵀ += Vᵀ·Pᵀ: lane (g, t) loads D/8 codes (dims g·D/8 …) of keys 2t, 2t+1, 2t+8, 2t+9; ``prmt``
      pairs a dim of two keys (the A fragment of m-tile i: dims g·D/8 + 2i, + 2i+1); Pᵀ's B fragment
      comes from the score lanes by shuffles. Accumulators: D/16 m-tiles × 4 float32 per lane.

    Decoding: fp8 by ``cvt.rn.f16x2.e4m3x2``; int8 as f16 1152 + c by one ``prmt`` (exact), K's bias taken out
    of the scores' start (−1152·Σq), V's by an exact f16x2 subtraction; P split into two f16 halves (``SPLITP``).
    Scales in fp32 on the scores, on P or on the accumulators (details in docs/decode-notes.md).

    Options (their mechanisms and measurements in docs/decode-notes.md, "The 8-bit fragment kernel's options"):
    ``PREFETCH`` > 0 (``prefetch``): a warp prefetches into L2 the cache rows of its step ``PREFETCH`` rounds ahead;
    ``STEP_HEADS`` = HW > 1 (``step_heads``; one query row per KV head): a warp step's 16 rows are 16 / HW tokens ×
    HW adjacent KV heads, the heads' query rows in the N columns, a score counting only in its own head's column;
    ``STAGES`` > 1 (``stages``): the cache bytes reach the fragments through a ``cp.async.ca`` ring of ``STAGES``
    warp steps per warp in dynamic shared memory (XOR-swizzled rows, int8's per-token scales queued in registers).
    ``stage``: a variant's (``scores.py``, on the scores of the keys a row sees; ``mods``: the kernel's last
    argument)."""
    from numba_attn.gpu.intrinsics import add_u32, mad_u32

    prefetch_step, load_step = make_frag8_loads(D, P, KV_FORMAT, TOKEN, STEP_HEADS)
    ring_offsets, issue_step, ring_k, ring_scales, ring_v = make_frag8_ring(D, P, KV_FORMAT, TOKEN, STEP_HEADS, STAGES)
    query_fragments, scores, p_fragments, step_pv = make_frag8_step(D, Nq, G, KV_FORMAT, TOKEN, SPLITP, STEP_HEADS)
    warp_state, finish = make_frag8_finish(D, WARPS, Nq, G, causal, FUSED, STEP_HEADS, TOKEN, stage)
    step_softmax = make_frag8_softmax(D, Nq, G, causal, STEP_HEADS, stage)
    ROWS = G * Nq * STEP_HEADS  # query rows of the block (HW > 1: one per KV head, HW heads)
    KEYS_PER_STEP = 16 // STEP_HEADS  # tokens of a warp step
    key_limit, _ = key_mask(causal, Nq)  # the keys a row sees (scores.py)
    NKS = D // 16  # k-steps of Sᵀ: one word of a key per lane each
    NKC = NKS // 4  # 16-byte chunks of a key row per lane
    VWL = D // 32  # words of a V row per lane (dims g·D/8 …)
    NMT = D // 16  # m-tiles of Oᵀ (dims)
    NQB, NACC, NVW = 2 * NKS, 4 * NMT, 4 * VWL  # (local array sizes: compile-time constants)
    THREADS = WARPS * WARP_SIZE
    FP8 = KV_FORMAT == 1
    D4 = D // 4  # 32-bit words of a cache row of one head
    CPR = D // 16  # 16-byte chunks of a cache row of one head
    NCP = 16 * CPR // WARP_SIZE  # ring: 16-byte copies per lane per step, of K and of V each
    SLOT = 32  # ring rows of a step: K's 16, then V's 16
    RING_WORDS = max(1, WARPS * STAGES * SLOT) * D4  # (dynamic_tile's sizes: closure constants, not expressions)
    WAIT = max(0, STAGES - 2)  # cp.async groups left in flight when a step's bytes are needed
    NVC = max(1, VWL // 4)  # ring: 16-byte reads of a V row per lane
    NKOF, NVOF = 2 * NKC, 4 * NVC  # (local array sizes)
    NSQ = max(1, (STAGES - 1) * 4)  # ring: a lane's int8 per-token scales, 4 a step, queued for STAGES − 1 steps

    @device
    def frag_block(q, out, cache, scale, Hkv, Nk, seq, chunk, sm, mods):
        """The block of split ``blockIdx.x``, KV head (group) ``blockIdx.y`` of sequence ``seq`` (``Nk`` keys).
        ``out``: (o, part_o, part_lse, counters, S); ``cache``: (k, v, ks, vs, table);
        ``sm``: (sm_m, sm_l, sm_o, sm_last, ring)."""
        k, v, ks, vs, table = cache
        ring = sm[4]
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y  # b * Hkv + kv head (one row block: NR ≤ 8); HW > 1: b * Hkv / HW + group of HW heads
        h = (kvh - seq * (Hkv // STEP_HEADS)) * STEP_HEADS  # the (first) KV head
        lo = split * chunk
        hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        w = add_u32(tid >> 5, 0)  # (a 32-bit warp index: int64 tid // 32 was spilled across the key loop, 8 B)
        lane = tid % WARP_SIZE
        g = lane // 4
        t = lane % 4
        qb = cuda.local.array(NQB, uint32)
        cb0, cb1 = query_fragments(q, qb, kvh, g, t)  # Qᵀ's B fragments; the scores' start
        r0 = 2 * t  # keys < lim of rows 2t, 2t+1 (causal: bottom-right aligned; a padding row sees the split)
        r1 = 2 * t + 1
        lim0 = key_limit(r0 - (r0 // Nq) * Nq, hi, Nk) if r0 < ROWS else hi
        lim1 = key_limit(r1 - (r1 // Nq) * Nq, hi, Nk) if r1 < ROWS else hi
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = float32(0.0)
        kw = cuda.local.array(NQB, uint32)  # keys g, g+8: NKS words each
        vw = cuda.local.array(NVW, uint32)  # keys 2t, 2t+1, 2t+8, 2t+9: VWL words each
        ksc = cuda.local.array(2, float32)
        vsc = cuda.local.array(4, float32)
        c0h = h + (min(r0, ROWS - 1) if STEP_HEADS > 1 else 0)  # the KV heads of columns 2t, 2t+1 (HW > 1: one each)
        c1h = h + (min(r1, ROWS - 1) if STEP_HEADS > 1 else 0)
        sk0 = scale * ks[0, c0h] if not TOKEN else scale
        sk1 = scale * ks[0, c1h] if not TOKEN else scale
        tbl = mad_u32(seq, table.shape[1], 0) if not FP8 or STAGES else 0  # int8, ring: the block-table row, flat
        m0 = NEG_BIG
        m1 = NEG_BIG
        l0 = float32(0.0)
        l1 = float32(0.0)
        n_steps = max(0, (hi - lo + KEYS_PER_STEP - 1) // KEYS_PER_STEP)  # 0 for a split past the end
        rk = uint32(0)  # the ring (32-bit row indices): the slot of this step (K's rows; V's 16 on) ...
        wr = uint32(0)  # ... and the slot the step NST − 1 rounds ahead is copied into (the last step's)
        rend = uint32(0)  # (the end of the warp's slots)
        hi32 = add_u32(hi, 0)
        if STAGES:  # the warp's first NST − 1 steps in flight
            csrc = cuda.local.array(NCP, uint32)
            cdst = cuda.local.array(NCP, uint32)
            kof = cuda.local.array(NKOF, uint32)
            vof = cuda.local.array(NVOF, uint32)
            sof = cuda.local.array(4, uint32)
            sq = cuda.local.array(NSQ, float32)  # per-token scales of the steps in flight, this step's first
            for i in range(NSQ):
                sq[i] = float32(0.0)
            ring_offsets(h, Hkv, lane, g, t, csrc, cdst, kof, vof, sof)
            rk = mad_u32(w, STAGES * SLOT, 0)  # the warp's slot 0
            for st in range(STAGES - 1):
                if TOKEN:
                    ring_scales(sq, ksc, vsc, scale)  # (moves the queue up: step st's scales go last)
                if w + st * WARPS < n_steps:
                    issue_step(cache, ring, sq, tbl, Hkv, add_u32(lo, (w + st * WARPS) * KEYS_PER_STEP), hi32,
                               add_u32(rk, st * SLOT), lane, (csrc, cdst, sof))
                cp_async_commit()
            wr = add_u32(rk, (STAGES - 1) * SLOT)
            rend = add_u32(rk, STAGES * SLOT)
        for step in range(w, n_steps, WARPS):  # warp-uniform: the shuffles and mma stay convergent
            j0 = lo + step * KEYS_PER_STEP
            if STAGES:
                cp_async_wait(WAIT)  # this lane's copies of this step have landed ...
                syncwarp(FULL_MASK)  # ... and every lane's; every lane is done with slot wr (the last step's)
                if TOKEN:
                    ring_scales(sq, ksc, vsc, scale)
                jn = add_u32(j0, (STAGES - 1) * WARPS * KEYS_PER_STEP)
                if jn < hi32:
                    issue_step(cache, ring, sq, tbl, Hkv, jn, hi32, wr, lane, (csrc, cdst, sof))
                cp_async_commit()
                ring_k(ring, kw, rk, kof)  # (V's words where they are used)
            else:
                load_step(cache, (kw, vw, ksc, vsc), scale, tbl, seq, h, Hkv, j0, hi, g, t)
            if PREFETCH:  # the warp's step PF rounds ahead: towards L2 while this one computes
                jn = j0 + PREFETCH * 16 * WARPS
                if jn < hi:
                    prefetch_step(cache, tbl, seq, h, Hkv, jn, hi, g, t)
            s0, s1, s2, s3 = scores(kw, qb, (ksc, sk0, sk1), cb0, cb1)  # Sᵀ = K Qᵀ, scaled
            p0, p1, p2, p3, m0, m1, l0, l1 = step_softmax(acc, (s0, s1, s2, s3), (m0, m1, l0, l1), (r0, r1, lim0, lim1),
                                                          j0, g, (seq, h, Nk), mods)  # base 2, over 16 keys
            if TOKEN and not FP8:  # int8: keys g, g+8's V scales on their probabilities here, before the shuffles
                p0 *= vsc[0]
                p1 *= vsc[0]
                p2 *= vsc[1]
                p3 *= vsc[1]
            pb0, pb1, qb0, qb1 = p_fragments(p0, p1, p2, p3, vsc, g, t)  # Pᵀ's B fragments
            if STAGES:  # V's words from the ring only now: K's registers are free again
                ring_v(ring, vw, rk, vof, g)
                wr = rk  # the next step NST − 1 rounds ahead goes into this slot, and the next slot is read
                rk = add_u32(rk, SLOT) if add_u32(rk, SLOT) != rend else add_u32(rk, SLOT - STAGES * SLOT)
            step_pv(vw, acc, pb0, pb1, qb0, qb1)  # Oᵀ += Vᵀ Pᵀ
        warp_state(sm, acc, (m0, m1, l0, l1), vs, (c0h, c1h), (r0, r1), w, g)
        finish(out, sm, split, kvh, Nk, tid, mods)

    @kernel(launch_bounds=(THREADS, MIN_BLOCKS))
    def paged_split_k_mma8(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, chunk, S,
                           mods):
        sm_m = cuda.shared.array((WARPS, ROWS), float32)
        sm_l = cuda.shared.array((WARPS, ROWS), float32)
        sm_o = cuda.shared.array((WARPS, ROWS, D), float32)
        sm_last = cuda.shared.array(1, int32)
        if STAGES:  # the ring (dynamic shared memory: ring_bytes)
            ring = dynamic_tile(0, 1, RING_WORDS)  # (flat: 32-bit word offsets)
        else:
            ring = sm_m
        seq = cuda.blockIdx.y // (Hkv // STEP_HEADS)
        frag_block(q, (o, part_o, part_lse, counters, S), (k, v, ks, vs, table), scale, Hkv, seqlens[seq], seq, chunk,
                   (sm_m, sm_l, sm_o, sm_last, ring), mods)  # the sequence's own number of keys

    return paged_split_k_mma8
