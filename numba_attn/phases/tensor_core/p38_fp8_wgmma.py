"""Phase 38 — ``fp8_wgmma``: both products of tc_wgmma in FP8 (e4m3), k32 steps.

Change against ``tc_wgmma``: Q, K and V are quantized per head inside the launch (amax, then e4m3 codes; V
written transposed with its keys permuted), then S = Q·Kᵀ and O += P·V run as 8-bit wgmma m64nNk32 with P
converted to e4m3 in registers; the scales fold into the softmax and the row sums. Precision ``e4m3``.

Prediction: ~1.4-1.6x tc_wgmma, ~1.0-1.2x SDPA fp16 at B1 H32 N8192 D128 non-causal.

Verdict: refuted on time, 2.245 ms at B1 H32 N8192 D128 fp16 (0.81x SDPA fp16, H200); error 5e-2 as predicted.
"""
from __future__ import annotations

import functools

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR  # first: chooses the backend before numba is imported

from numba import cuda, float32, uint32  # noqa: E402
from numba_attn.gpu.device_functions import LOG2E, NEG_BIG, fragment_rescale, fragment_softmax
from numba_attn.gpu.intrinsics import (SMEM_ALIGN, cp_async16_flat, cp_async_commit, cp_async_wait, ld_global_v4,
                                       ld_shared_v4, pack_e4m3x4, u32_as_f32, unpack_bf16x2, unpack_f16x2)
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, smem_reason
from numba_attn.gpu.warp import warp_max
from numba_attn.gpu.wgmma import e4m3_p_keys, kmajor_params, make_wgmma_rs, shared_address
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fragments import q_fragments
from numba_attn.phases.tensor_core.mask import key_ends, mask_fragments
from numba_attn.phases.tensor_core.mma_sync import u32_views
from numba_attn.phases.tensor_core.pipeline import ALIGN_BYTES

E4M3_MAX = 448.0  # the largest e4m3fn value: a head's amax maps to it
P_SCALE = 256.0  # P in [0, 1] times 256 before its conversion (normal e4m3 down to 2^-14 of the row max)
# partial maxima per head (blocks of the amax kernel per head, at most 64), blocks per head of the row
# quantization, keys per block of the V transpose (a multiple of 32) and threads per block of the
# quantization kernels; the simulator, which runs every thread of a block as a Python thread, takes fewer
# (the kernels loop over their rows with these strides, so the result does not depend on them). On the GPU
# 64 blocks per head of 128 threads fill an H200 (one or a few waves at 32 heads) and a V^T block writes
# 128 bytes of each of its D rows (a 32 KiB tile at D = 128)
NCH = 2 if IS_SIMULATOR else 64
RCH = 2 if IS_SIMULATOR else 64
VTK = 64 if IS_SIMULATOR else 128
QTH = 32 if IS_SIMULATOR else 128
HEAD_DIMS = (16, 32, 64, 128)  # rows of 32/64/128 bytes: one swizzled column block (16: padded to 32)
TILES = (32, 64, 128)  # Bc: V^T rows of 32/64/128 bytes


# -- quantization (three kernels per tensor set, before the attention kernel) --------------------

INF = float32(np.inf)
NAN_BITS = 0x7FC00000  # a float32 NaN, made from its bits (fastmath folds no arithmetic NaN away)


@device
def inf_halves(w, bf16):
    """Which halves of a word of two f16/bf16 are infinite, and which finite, from their bits (the
    kernels are compiled with fastmath: float comparisons with inf or NaN may be folded away)."""
    e = uint32(0x7F80) if bf16 else uint32(0x7C00)
    lo = uint32(w) & uint32(0x7FFF)
    hi = (uint32(w) >> uint32(16)) & uint32(0x7FFF)
    return lo == e, hi == e, (lo & e) != e, (hi & e) != e


@device
def finite_max(w, m, f, e):
    """``m``, the largest |x| bits seen, updated with the finite halves of word ``w`` (|x| of a finite
    f16/bf16 orders as its bits without the sign, below the exponent mask ``e``; infinity is ``e``,
    NaN above it); ``f`` or-ed with whether one of them is infinite."""
    lo = uint32(uint32(w) & uint32(0x7FFF))  # (numba widens integer arithmetic to 64 bits)
    hi = uint32((uint32(w) >> uint32(16)) & uint32(0x7FFF))
    if lo < e:
        m = max(m, lo)
    if hi < e:
        m = max(m, hi)
    return m, f or lo == e or hi == e


@functools.cache
def make_amax(DW: int):
    """``amax(q, k, v, part, bad, bf16)``: q, k, v the (heads, N, DW) uint32 views of f16/bf16 rows (Q
    with its heads and length, K and V with theirs), one launch for the three: block (ch, h) takes
    head h of Q, head h - HQ of K (h < HQ + HK) or head h - HQ - HK of V (HQ, HK the head counts), and
    writes ``part[h, ch]`` the largest finite |x| of the 16-byte chunks ch·QTH + tid + k·NCH·QTH of
    the head (rows of DW/4 chunks), ``bad[h, ch]`` 1 where one of them is infinite. Grid (NCH, HQ + 2·HK),
    QTH threads, two 16-byte loads (``ld.global.nc.v4``) in flight per thread. NaN is skipped here: its
    code carries it. The maximum is taken on the bits (exactly the float maximum) and converted once."""
    CH = DW // 4  # 16-byte chunks of a row (D = 16: 2)
    RS = NCH * QTH // CH  # the chunk stride of a head's blocks, in rows (a thread keeps its column)
    NW = QTH // 32  # warps per block
    assert RS * CH == NCH * QTH

    @device
    def scan(x, hh, ch, tid, bf16):
        """(largest finite |x| bits, any infinity) of this thread's chunks of head ``hh`` of ``x``."""
        e = uint32(0x7F80) if bf16 else uint32(0x7C00)
        n = x.shape[1]
        m = uint32(0)
        f = False
        i = ch * QTH + tid
        r = i // CH
        c = 4 * (i % CH)
        while r < n:
            a0, a1, a2, a3 = ld_global_v4(x, hh, r, c)
            b0 = b1 = b2 = b3 = uint32(0)  # zeros: no effect on the maximum
            if r + RS < n:
                b0, b1, b2, b3 = ld_global_v4(x, hh, r + RS, c)
            m, f = finite_max(a0, m, f, e)
            m, f = finite_max(a1, m, f, e)
            m, f = finite_max(a2, m, f, e)
            m, f = finite_max(a3, m, f, e)
            m, f = finite_max(b0, m, f, e)
            m, f = finite_max(b1, m, f, e)
            m, f = finite_max(b2, m, f, e)
            m, f = finite_max(b3, m, f, e)
            r += 2 * RS
        return m, f

    @kernel
    def amax(q, k, v, part, bad, bf16):
        red = cuda.shared.array((2, NW), float32)
        tid = cuda.threadIdx.x
        ch = cuda.blockIdx.x
        h = cuda.blockIdx.y
        hq = q.shape[0]
        hk = k.shape[0]
        if h < hq:
            m, f = scan(q, h, ch, tid, bf16)
        elif h < hq + hk:
            m, f = scan(k, h - hq, ch, tid, bf16)
        else:
            m, f = scan(v, h - hq - hk, ch, tid, bf16)
        if bf16:  # the bits of the largest finite |x| as float32 (exact)
            a = u32_as_f32(uint32(m) << uint32(16))
        else:
            a, unused = unpack_f16x2(uint32(m))
        a = warp_max(a)
        fb = warp_max(float32(1.0) if f else float32(0.0))
        if tid % 32 == 0:
            red[0, tid // 32] = a
            red[1, tid // 32] = fb
        cuda.syncthreads()
        if tid == 0:
            for w in range(1, NW):
                a = max(a, red[0, w])
                fb = max(fb, red[1, w])
            part[h, ch] = a
            bad[h, ch] = fb

    return amax


@device
def head_max(arr, h):
    """The largest of ``arr[h, 0:NCH]`` (the amax kernel's partial results of head h) in every thread:
    each warp reads them (NCH ≤ 64: two per lane) and reduces them with shuffles, no barrier."""
    m = float32(0.0)
    for c in range(cuda.threadIdx.x % 32, NCH, 32):
        m = max(m, arr[h, c])
    return warp_max(m)


@device
def head_scale(m):
    """(448 / amax, amax / 448) of a head whose largest finite |x| is ``m`` (amax 0: 1, 1)."""
    if m > float32(0.0):
        return float32(E4M3_MAX) / m, m / float32(E4M3_MAX)
    return float32(1.0), float32(1.0)


@device
def two(w, bf16, inf_nan):
    """The two f16/bf16 values of word ``w`` as float32 and whether each is infinite; with
    ``inf_nan`` an infinity becomes NaN (its e4m3 code is then the NaN code 0x7F)."""
    if bf16:
        a, b = unpack_bf16x2(w)
    else:
        a, b = unpack_f16x2(w)
    ia, ib, fa, fb = inf_halves(w, bf16)
    if inf_nan:
        if ia:
            a = u32_as_f32(uint32(NAN_BITS))
        if ib:
            b = u32_as_f32(uint32(NAN_BITS))
    return a, b, ia, ib


@functools.cache
def make_quant_rows(DW: int, keys: bool):
    """``quant(x, out, part, bad, scale, flag, kmul, bf16)``: ``out[h, r, c]`` (uint32, four codes) = e4m3
    of row r of head h, columns 4c..4c+3, times 448/amax (amax over finite values); ``scale[h]`` =
    amax/448, ``flag[h]`` 1 when the head holds an infinity. Grid (RCH, heads), QTH threads: block
    (ch, h) takes the 16-byte chunks ch·QTH + tid + k·RCH·QTH of head h (rows of DW/4 chunks), two
    loads in flight per thread; each chunk (8 values) gives two adjacent words of codes (8 bytes).

    Infinities: a query row (``keys`` False) with one is NaN in the reference whatever it meets, so an
    infinity becomes the NaN code. A key row (``keys``) with infinities has score ±inf (or NaN) against
    each query, the sign of the sum of q_d·sign(k_d) over its infinite columns: its codes become ±448 in
    those columns and 0 in the others, and ``kmul[h, r]`` = inf (1 for the other rows of a flagged head;
    the attention kernel multiplies the scores of a flagged head by it)."""
    CH = DW // 4  # 16-byte chunks of a row
    RS = RCH * QTH // CH  # the chunk stride of a head's blocks, in rows (a thread keeps its column)
    INF_NAN = not keys
    assert RS * CH == RCH * QTH

    @device
    def chunk(x, out, kmul, h, r, c, w0, w1, w2, w3, inv, f, bf16):
        """The codes of chunk ``c`` of row ``r`` (its words w0..w3)."""
        a, b, ia, ib = two(w0, bf16, INF_NAN)
        cc, d, ic, id_ = two(w1, bf16, INF_NAN)
        a2, b2, ia2, ib2 = two(w2, bf16, INF_NAN)
        c2, d2, ic2, id2 = two(w3, bf16, INF_NAN)
        if keys and f != float32(0.0):  # a head with an infinity (rare): is it in this key row?
            rowinf = False
            for w in range(DW):
                u0, u1, f0, f1 = inf_halves(x[h, r, w], bf16)
                rowinf = rowinf or u0 or u1
            if c == 0:
                kmul[h, r] = INF if rowinf else float32(1.0)
            if rowinf:  # the infinite columns' signs only (saturated to ±448), the others 0
                a = a if ia else float32(0.0)
                b = b if ib else float32(0.0)
                cc = cc if ic else float32(0.0)
                d = d if id_ else float32(0.0)
                a2 = a2 if ia2 else float32(0.0)
                b2 = b2 if ib2 else float32(0.0)
                c2 = c2 if ic2 else float32(0.0)
                d2 = d2 if id2 else float32(0.0)
        out[h, r, 2 * c] = pack_e4m3x4(a * inv, b * inv, cc * inv, d * inv)
        out[h, r, 2 * c + 1] = pack_e4m3x4(a2 * inv, b2 * inv, c2 * inv, d2 * inv)

    @kernel
    def quant(x, out, part, bad, scale, flag, kmul, bf16):
        h = cuda.blockIdx.y
        inv, sc = head_scale(head_max(part, h))
        f = head_max(bad, h)
        if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            scale[h] = sc
            flag[h] = f
        n = x.shape[1]
        i = cuda.blockIdx.x * QTH + cuda.threadIdx.x
        r = i // CH
        c = i % CH
        while r < n:
            a0, a1, a2, a3 = ld_global_v4(x, h, r, 4 * c)
            b0 = b1 = b2 = b3 = uint32(0)
            if r + RS < n:
                b0, b1, b2, b3 = ld_global_v4(x, h, r + RS, 4 * c)
            chunk(x, out, kmul, h, r, c, a0, a1, a2, a3, inv, f, bf16)
            if r + RS < n:
                chunk(x, out, kmul, h, r + RS, c, b0, b1, b2, b3, inv, f, bf16)
            r += 2 * RS

    return quant


def stored_position(r):
    """The position at which key ``r`` of a tile is stored (its 32-key block kept): the inverse of
    :func:`e4m3_p_keys`, whose key has the bits (p4, p1, p3, p2, p0) of position p."""
    return (r & ~15) | (r & 1) | ((r & 6) << 1) | ((r >> 2) & 2)


key_position = device(stored_position)


@functools.cache
def make_quant_vt(D: int):
    """``quant(v, vt, part, scale, bf16)``: the transposed codes of V, ``vt[h, d, m]`` (uint32: keys
    4m..4m+3 of the stored order, row d), the keys of each 32-key block in the order of
    :func:`e4m3_p_keys` (stored position p holds key ``32·(p // 32) + keys[p % 32]``), keys past
    the end zero, an infinity the NaN code. Grid (⌈NkP/VTK⌉, heads), QTH threads: block (t, h) takes
    the VTK keys t·VTK.. of head h through shared memory. Its threads read the tile's rows in 16-byte
    chunks (consecutive threads on consecutive chunks, up to eight loads in flight) and store each word (the
    column pair w of a key) at ``tile[w, position]``, the stored position of the key (16-byte groups
    XOR-swizzled by (w / 4) mod 8: fewer bank conflicts); then thread (w, m) reads the four keys of
    stored positions 4m..4m+3 of column pair w (one 16-byte shared load) and writes the words m of
    rows 2w and 2w+1: consecutive threads on consecutive words, VTK bytes of a row per block."""
    DW = D // 2  # column pairs: words of a V row
    CH = DW // 4  # 16-byte chunks of a V row
    TW = VTK // 4  # words of a V^T row per block
    NL = VTK * CH // QTH  # 16-byte loads per thread
    U = min(8, NL)  # loads in flight
    NO = DW * TW // QTH  # (column pair, word) items per thread
    assert NL % U == 0 and NO * QTH == DW * TW

    @kernel
    def quant(v, vt, part, scale, bf16):
        tile = cuda.shared.array((DW, VTK), uint32, alignment=SMEM_ALIGN)
        buf = cuda.local.array((U, 4), uint32)
        tid = cuda.threadIdx.x
        h = cuda.blockIdx.y
        inv, sc = head_scale(head_max(part, h))
        if cuda.blockIdx.x == 0 and tid == 0:
            scale[h] = sc
        n = v.shape[1]
        k0 = cuda.blockIdx.x * VTK
        for it in range(NL // U):
            for u in range(U):
                e = tid + (it * U + u) * QTH
                j = k0 + e // CH
                if j < n:
                    buf[u, 0], buf[u, 1], buf[u, 2], buf[u, 3] = ld_global_v4(v, h, j, 4 * (e % CH))
                else:  # keys past the end: zero codes
                    for b in range(4):
                        buf[u, b] = uint32(0)
            for u in range(U):
                e = tid + (it * U + u) * QTH
                p = key_position(e // CH)
                c = e % CH
                for b in range(4):  # column pair 4c + b, swizzled by (4c + b) / 4 = c
                    tile[4 * c + b, 4 * ((p >> 2) ^ (c & 7)) + (p & 3)] = buf[u, b]
        cuda.syncthreads()
        nw = vt.shape[2]
        for it in range(NO):
            i = tid + it * QTH
            w = i // TW
            m = i % TW
            mg = cuda.blockIdx.x * TW + m
            if mg < nw:
                x0, x1, x2, x3 = ld_shared_v4(tile, w, 4 * (m ^ ((w >> 2) & 7)))
                l0, h0, i0, j0 = two(x0, bf16, True)
                l1, h1, i1, j1 = two(x1, bf16, True)
                l2, h2, i2, j2 = two(x2, bf16, True)
                l3, h3, i3, j3 = two(x3, bf16, True)
                vt[h, 2 * w, mg] = pack_e4m3x4(l0 * inv, l1 * inv, l2 * inv, l3 * inv)
                vt[h, 2 * w + 1, mg] = pack_e4m3x4(h0 * inv, h1 * inv, h2 * inv, h3 * inv)

    keys = [0] * 32
    for r in range(32):
        keys[stored_position(r)] = r
    assert keys == [int(x) for x in e4m3_p_keys()]
    quant.keys = tuple(keys)  # the order the arithmetic above implements (tests compare)
    return quant


# -- the attention kernel -------------------------------------------------------------------

def qk_depth(D):
    """The bytes of a Q/K row of codes: D, at least 32 (the smallest swizzle; D=16 padded with zero codes)."""
    return max(D, 32)


def fp8_smem_bytes(D, Bc, stages):
    """The ring (K tiles of Bc×qk_depth(D) bytes, V^T tiles of D×Bc bytes, ``stages`` each) and the
    alignment pad."""
    return stages * Bc * (qk_depth(D) + D) + ALIGN_BYTES


@functools.cache
def make_fp8_kernel(D: int, WG: int, Bc: int, STAGES: int, G: int, causal: bool, bf16: bool, permute: bool = True):
    """The FP8 wgmma kernel ``(q8, k8, vt8, o, qs, ks, vs, kflag, kmul, sl2, H, Nq, Nk)``: q8 (B·H, Nq, D/4)
    and k8 (B·Hkv, NkP, D/4) uint32 codes, vt8 (B·Hkv, D, NkP/4) the transposed permuted V codes, o the
    uint32 view of the output, qs/ks/vs the heads' scales; a KV head with ``kflag`` set (an infinite K
    value) has its scores multiplied by ``kmul`` (inf for the keys holding one: ±inf scores).
    ``permute=False`` packs P in the plain key order
    (wrong against the permuted V: the tests' negative case)."""
    W = 4 * WG
    NTH = 32 * W
    Br = 64 * WG
    DQ = qk_depth(D)  # bytes of a Q/K row of codes
    KS = DQ // 32  # k32 steps of Q·Kᵀ
    KK = Bc // 32  # k32 steps of P·V
    NT = Bc // 8
    mask = mask_fragments(NT, Bc, causal)  # keys past Nk and (causal) above the diagonal
    DT = D // 8
    NQ = 4 * KS
    NS = Bc // 2
    NO = D // 2
    NP = 4 * KK
    TILEK = Bc * DQ  # bytes of one K stage
    TILEV = D * Bc  # bytes of one V^T stage
    VBASE = STAGES * TILEK  # the V^T stages follow the K stages
    KVR = STAGES * (TILEK + TILEV) // 16
    CHK = DQ // 16  # 16-byte chunks of a K row
    CHV = Bc // 16  # of a V^T row
    NCK = Bc * CHK  # chunks of a K tile
    NCV = D * CHV  # of a V^T tile
    WAIT = STAGES - 2
    softmax = fragment_softmax(NT)
    rescale = fragment_rescale(DT)
    ends = key_ends(Br, 64, causal)
    load_q = q_fragments(KS, False, DQ // 4)
    store = store_fragments(DT, "bf16" if bf16 else "f16")
    qk_off, qk_lbo, qk_sbo = kmajor_params(Bc, KS, DQ)
    pv_off, pv_lbo, pv_sbo = kmajor_params(D, KK, Bc)
    qk = make_wgmma_rs("e4m3", Bc, False, True, qk_off, qk_lbo, qk_sbo, DQ)
    pv = make_wgmma_rs("e4m3", D, False, False, pv_off, pv_lbo, pv_sbo, Bc)
    SWK = DQ // 16 - 1
    SWV = Bc // 16 - 1
    PS = float32(P_SCALE)

    @device
    def copy_v(KV, vt8, nkw, e, tile, buf, kvh):
        """Chunk ``e`` of the V^T tile: head-dim row e // CHV, its keys' 16-byte chunk e mod CHV."""
        rv = e // CHV
        cv = e % CHV
        so = (VBASE + buf * TILEV + rv * Bc + 16 * (cv ^ (((rv * Bc) >> 7) & SWV))) // 4
        go = (kvh * D + rv) * nkw + tile * (Bc // 4) + 4 * cv
        cp_async16_flat(KV, so, vt8, go, True)

    @device
    def copy_tile(KV, k8, vt8, tile, buf, tid, kvh):
        """Thread ``tid``'s cp.async copies of tile ``tile`` (K rows and V^T columns of its keys;
        the key axis is padded to whole tiles) into ring stage ``buf``, 16 bytes each, swizzled."""
        nkw = vt8.shape[2]  # words of a V^T row (NkP / 4)
        # one loop over both tiles when they have as many chunks (D >= 32: fewer live registers), else two
        for e in range(tid, NCK, NTH):
            r = e // CHK  # K: key row r, chunk c
            c = e % CHK
            so = (buf * TILEK + r * DQ + 16 * (c ^ (((r * DQ) >> 7) & SWK))) // 4
            go = ((kvh * k8.shape[1]) + tile * Bc + r) * (DQ // 4) + 4 * c
            cp_async16_flat(KV, so, k8, go, True)
            if NCV == NCK:
                copy_v(KV, vt8, nkw, e, tile, buf, kvh)
        if NCV != NCK:
            for e in range(tid, NCV, NTH):
                copy_v(KV, vt8, nkw, e, tile, buf, kvh)

    def body(q8, k8, vt8, o, qs, ks, vs, kflag, kmul, sl2, H, Nq, Nk):
        base = dynamic_tile(0, 1, 4)
        pad = ((ALIGN_BYTES - (shared_address(base) & (ALIGN_BYTES - 1))) & (ALIGN_BYTES - 1)) // 4
        KV = dynamic_tile(pad, KVR, 4)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        bh = b * H + h
        kvh = b * (H // G) + h // G
        blk0 = cuda.blockIdx.x * Br
        wg0 = blk0 + 64 * (warp // 4)
        row0 = blk0 + 16 * warp
        off = Nk - Nq
        sl2q = sl2 * qs[bh] * ks[kvh]  # scores in code units
        lscale = PS / vs[kvh]  # the row sums in the units of O's accumulators
        kinf = kflag[kvh] != float32(0.0)  # block-uniform: only a head with an infinite K value

        qf = cuda.local.array(NQ, uint32)
        r_lo = row0 + g
        load_q(qf, 0, q8, bh, r_lo, Nq, t)
        acc = cuda.local.array(NO, float32)
        for i in range(NO):
            acc[i] = float32(0.0)
        s = cuda.local.array(NS, float32)
        pf = cuda.local.array(NP, uint32)
        m_lo = NEG_BIG
        m_hi = NEG_BIG
        l_lo = float32(0.0)
        l_hi = float32(0.0)

        kv_end, wg_end = ends(blk0, wg0, Nq, Nk, off)  # the block's keys, this warpgroup's
        n_tiles = (kv_end + Bc - 1) // Bc

        for st in range(STAGES - 1):
            if st < n_tiles:
                copy_tile(KV, k8, vt8, st, st, tid, kvh)
            cp_async_commit()

        for it in range(n_tiles):
            cp_async_wait(WAIT)
            cuda.syncthreads()
            nxt = it + STAGES - 1
            if nxt < n_tiles:
                copy_tile(KV, k8, vt8, nxt, nxt % STAGES, tid, kvh)
            cp_async_commit()
            st = it % STAGES
            j0 = it * Bc
            if j0 < wg_end:
                qk(s, qf, 0, KV, st * TILEK)
                if kinf:  # keys with infinite values: ±inf scores (kmul inf; 1 elsewhere)
                    for nt in range(NT):
                        for e in range(4):
                            s[4 * nt + e] *= kmul[kvh, j0 + nt * 8 + 2 * t + (e % 2)]
                mask(s, 0, j0, row0, row0 + g, t, Nk, off)
                m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2q)
                l_lo = l_lo * corr_lo + rs_lo
                l_hi = l_hi * corr_hi + rs_hi
                for kk in range(KK):  # n-tiles 4kk..4kk+3 → the four A registers of k-step kk
                    i0 = 16 * kk
                    if permute:  # bytes: (nt 4kk, e 0/1; nt 4kk+1, e 0/1) = stored keys 4t..4t+3
                        pf[4 * kk + 0] = pack_e4m3x4(s[i0] * PS, s[i0 + 1] * PS, s[i0 + 4] * PS, s[i0 + 5] * PS)
                        pf[4 * kk + 1] = pack_e4m3x4(s[i0 + 2] * PS, s[i0 + 3] * PS, s[i0 + 6] * PS,
                                                     s[i0 + 7] * PS)
                        pf[4 * kk + 2] = pack_e4m3x4(s[i0 + 8] * PS, s[i0 + 9] * PS, s[i0 + 12] * PS,
                                                     s[i0 + 13] * PS)
                        pf[4 * kk + 3] = pack_e4m3x4(s[i0 + 10] * PS, s[i0 + 11] * PS, s[i0 + 14] * PS,
                                                     s[i0 + 15] * PS)
                    else:  # the accumulator values in their own order (wrong against the permuted V)
                        pf[4 * kk + 0] = pack_e4m3x4(s[i0] * PS, s[i0 + 1] * PS, s[i0 + 2] * PS, s[i0 + 3] * PS)
                        pf[4 * kk + 1] = pack_e4m3x4(s[i0 + 4] * PS, s[i0 + 5] * PS, s[i0 + 6] * PS,
                                                     s[i0 + 7] * PS)
                        pf[4 * kk + 2] = pack_e4m3x4(s[i0 + 8] * PS, s[i0 + 9] * PS, s[i0 + 10] * PS,
                                                     s[i0 + 11] * PS)
                        pf[4 * kk + 3] = pack_e4m3x4(s[i0 + 12] * PS, s[i0 + 13] * PS, s[i0 + 14] * PS,
                                                     s[i0 + 15] * PS)
                rescale(acc, 0, corr_lo, corr_hi)
                pv(acc, pf, 0, KV, VBASE + st * TILEV)
        cp_async_wait(0)
        store(o, bh, r_lo, acc, 0, l_lo * lscale, l_hi * lscale, Nq, t)

    body.__name__ = body.__qualname__ = "fp8_wgmma"
    return kernel(body, launch_bounds=(NTH,)) if NTH > 256 else kernel(body)


# -- host side ------------------------------------------------------------------------------

def resolve_fp8(problem, warpgroups, Bc, stages):
    """warpgroups=0: 3 at D=128 (as tc_wgmma: 168 registers with Bc=64, no spills, sm_90a offline
    compile), 2 otherwise."""
    if warpgroups < 0:
        raise ValueError("warpgroups (per block) must be at least 1 (0: by head_dim)")
    return {"warpgroups": warpgroups or (3 if problem.head_dim == 128 else 2), "Bc": Bc, "stages": stages}


def supports_fp8(problem, warpgroups, Bc, stages):
    D = problem.head_dim
    if D not in HEAD_DIMS:
        return (f"head_dim {D}: the FP8 kernel takes rows of 32, 64 or 128 bytes (head_dim 16 padded to 32, "
                "32, 64, 128: one swizzled column block of e4m3 codes)")
    if Bc not in TILES:
        return f"Bc={Bc}: the transposed V tile has rows of Bc bytes: 32, 64 or 128"
    if warpgroups > 3:
        return f"warpgroups={warpgroups}: at most 3 (168 registers a thread at 384 threads)"
    if warpgroups == 3 and D == 128 and Bc == 128:
        return ("warpgroups=3 with Bc=128 at head_dim 128: 64 score and 64 output accumulators do not fit the "
                "168 registers of a 384-thread block (120-148 bytes of spills, wgmma serialized; sm_90a offline "
                "compile); use Bc=64 or warpgroups <= 2")
    if stages < 2:
        return "stages must be at least 2"
    return smem_reason(fp8_smem_bytes(D, Bc, stages))


def build_fp8(problem, warpgroups, Bc, stages, permute=True):
    """The :class:`Launch`: the quantization kernels (amax, codes of Q and K, transposed codes of V)
    into scratch allocated here, then the attention kernel."""
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    Nq, Nk = problem.q_len, problem.kv_len
    bf16 = problem.dtype == "bfloat16"
    NkP = (Nk + Bc - 1) // Bc * Bc
    kern = make_fp8_kernel(D, warpgroups, Bc, stages, problem.group, problem.causal, bf16, permute)
    amax = make_amax(D // 2)
    qrows = make_quant_rows(D // 2, False)
    krows = make_quant_rows(D // 2, True)
    qvt = make_quant_vt(D)
    BH, BHkv = B * H, B * Hkv
    DQ = qk_depth(D)
    q8 = cuda.to_device(np.zeros((BH, Nq, DQ // 4), np.uint32))  # D=16: the codes of columns 16..31 stay zero
    k8 = cuda.to_device(np.zeros((BHkv, NkP, DQ // 4), np.uint32))  # rows past Nk stay zero
    vt8 = cuda.to_device(np.zeros((BHkv, D, NkP // 4), np.uint32))
    part = cuda.to_device(np.zeros((BH + 2 * BHkv, NCH), np.float32))  # the heads of Q, then K, then V
    bad = cuda.to_device(np.zeros((BH + 2 * BHkv, NCH), np.float32))
    cuts = ((0, BH), (BH, BH + BHkv), (BH + BHkv, BH + 2 * BHkv))
    parts = [part[a:b] for a, b in cuts]
    bads = [bad[a:b] for a, b in cuts]
    scales = [cuda.to_device(np.ones(n, np.float32)) for n in (BH, BHkv, BHkv)]
    flags = [cuda.to_device(np.zeros(n, np.float32)) for n in (BH, BHkv)]
    kmul = cuda.to_device(np.ones((BHkv, NkP), np.float32))  # rows past Nk stay 1 (their scores are masked)
    sl2 = float32(problem.sm_scale * LOG2E)
    Br = 64 * warpgroups
    grid = ((Nq + Br - 1) // Br, H, B)
    nbytes = fp8_smem_bytes(D, Bc, stages)
    nthreads = 128 * warpgroups
    opted = []

    def run(q, k, v, o, stream=0):
        qw, kw, vw, ow = u32_views(q, k, v, o)
        amax[(NCH, BH + 2 * BHkv), QTH, stream](qw, kw, vw, part, bad, bf16)
        qrows[(RCH, BH), QTH, stream](qw, q8, parts[0], bads[0], scales[0], flags[0], kmul, bf16)
        krows[(RCH, BHkv), QTH, stream](kw, k8, parts[1], bads[1], scales[1], flags[1], kmul, bf16)
        qvt[((NkP + VTK - 1) // VTK, BHkv), QTH, stream](vw, vt8, parts[2], scales[2], bf16)
        args = (q8, k8, vt8, ow, scales[0], scales[1], scales[2], flags[1], kmul, sl2, H, Nq, Nk)
        if opted:
            kern[grid, nthreads, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, nthreads, stream, nbytes, *args)
            opted.append(True)

    ws = q8.nbytes + k8.nbytes + vt8.nbytes
    return Launch(run, kernels=[kern, amax, qrows, krows, qvt], workspace_bytes=ws)


@register_phase(
    name="fp8_wgmma", order=38, title="Tensor cores: wgmma in FP8 (e4m3), per-head scales",
    parent="tc_wgmma",
    requires_cc="sm_90a",
    description="""
        tc_wgmma with both products in FP8: Q, K and V quantized per (batch, head) to e4m3
        (scale amax/448) by kernels inside the launch, V written transposed with the keys of each
        32-key block permuted; S = Q·Kᵀ with wgmma m64nBc k32 e4m3 (Q in registers, K K-major in
        shared memory), P converted in registers to e4m3 in the permuted order (no shuffles) and
        O += P·V with V^T as the K-major operand; the scales folded into the softmax exponent and
        the final normalization. Layout it requires: V^T in e4m3, keys padded to whole tiles
        (made by the launch). Precision e4m3: not chosen automatically.
        Prediction: ~1.5x tc_wgmma at D128 (FP8 wgmma twice the f16 rate, softmax unchanged).
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), FP8 forward: e4m3 wgmma, in-register P layout "
            "matched by permuting V; per-head scales",
    planned_speedup=225.0,  # tc_wgmma's 150 and the predicted 1.5x
    space={"warpgroups": [1, 2, 3], "Bc": [64, 128], "stages": [2, 3]},
    dtypes=("float16", "bfloat16"),
    head_dims=HEAD_DIMS,
    precision="e4m3",
    sim_params={"warpgroups": 1, "Bc": 32, "stages": 2},
    supports=supports_fp8,
    resolve=resolve_fp8,
)
def fp8_wgmma(problem, warpgroups=0, Bc=64, stages=2):
    """Quantize (per head), then the FP8 wgmma kernel."""
    return build_fp8(problem, warpgroups, Bc, stages)
