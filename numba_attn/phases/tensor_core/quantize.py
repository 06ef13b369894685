"""Per-head e4m3 quantisation of Q, K and V for ``fp8_wgmma``: the kernels that run before its attention kernel.

``make_amax``: the largest finite |x| of each (batch, head) of Q, K and V (partial maxima, one launch);
``make_quant_rows``: Q or K as e4m3 codes of ``x · 448 / amax`` (rows of D bytes); ``make_quant_vt``: V transposed
(rows = head-dim columns, keys in the order of :func:`numba_attn.gpu.wgmma.e4m3_p_keys`, padded to whole tiles).
Non-finite values: NaN keeps its code, an infinite K value is flagged (its scores multiplied by ``kmul``).
"""
from __future__ import annotations

import functools

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR  # first: chooses the backend before numba is imported

from numba import cuda, float32, uint32  # noqa: E402
from numba_attn.gpu.intrinsics import (SMEM_ALIGN, byte_perm, ld_global_v4, ld_shared_v4, pack_e4m3x4,  # noqa: E402
                                       u32_as_f32, unpack_bf16x2, unpack_f16x2)
from numba_attn.gpu.jit import device, kernel  # noqa: E402
from numba_attn.gpu.warp import warp_max  # noqa: E402
from numba_attn.gpu.wgmma import e4m3_p_keys  # noqa: E402


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
def make_row_codes(DW: int, keys: bool):
    """A device function ``codes(x, out, kmul, h, r, c, w0, w1, w2, w3, inv, f, bf16)``: chunk ``c`` (words w0..w3,
    eight values) of row ``r`` of head ``h`` as two words of e4m3 codes of ``x · inv`` in ``out[h, r, 2c..2c+1]``.

    Infinities: a query row (``keys`` False) with one is NaN in the reference whatever it meets, so an
    infinity becomes the NaN code. A key row (``keys``) with infinities has score ±inf (or NaN) against
    each query, the sign of the sum of q_d·sign(k_d) over its infinite columns: where ``f`` (its head or block
    holds an infinity) its codes become ±448 in those columns and 0 in the others, and ``kmul[h, r]`` = inf
    (1 for the other rows; the attention kernel multiplies the scores of a flagged head or block by it)."""
    INF_NAN = not keys

    @device
    def codes(x, out, kmul, h, r, c, w0, w1, w2, w3, inv, f, bf16):
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

    return codes


@functools.cache
def make_quant_rows(DW: int, keys: bool):
    """``quant(x, out, part, bad, scale, flag, kmul, bf16)``: ``out[h, r, c]`` (uint32, four codes) = e4m3
    of row r of head h, columns 4c..4c+3, times 448/amax (amax over finite values); ``scale[h]`` =
    amax/448, ``flag[h]`` 1 when the head holds an infinity. Grid (RCH, heads), QTH threads: block
    (ch, h) takes the 16-byte chunks ch·QTH + tid + k·RCH·QTH of head h (rows of DW/4 chunks), two
    loads in flight per thread; each chunk (8 values) gives two adjacent words of codes (8 bytes)
    (:func:`make_row_codes`: infinities)."""
    CH = DW // 4  # 16-byte chunks of a row
    RS = RCH * QTH // CH  # the chunk stride of a head's blocks, in rows (a thread keeps its column)
    assert RS * CH == RCH * QTH
    chunk = make_row_codes(DW, keys)

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


def _vt_shape(D, VK, codes=False):
    """(DW, CH, TW, NL, U, NO) of a V^T block of VK keys: words of a V row (column pairs; ``codes``: column quads of
    e4m3 codes), 16-byte chunks of a V row, words of a V^T row, 16-byte loads per thread, loads in flight, (V word,
    V^T word) items per thread."""
    DW = D // 4 if codes else D // 2
    CH = DW // 4
    TW = VK // 4
    NL = VK * CH // QTH
    U = min(8, NL)
    NO = DW * TW // QTH
    assert NL % U == 0 and NO * QTH == DW * TW
    return DW, CH, TW, NL, U, NO


@functools.cache
def make_vt_codes(D: int, VK: int, codes: bool = False):
    """A device function ``transpose(v, vt, tile, buf, h, k0, inv, bf16)``: the VK keys from ``k0`` of head ``h``
    of V as transposed codes of ``x · inv`` (:func:`make_quant_vt`'s layout), through the shared ``tile`` (DW ×
    VK words) and the local ``buf`` (U × 4 words) the kernel owns; it waits at a block barrier before reading the
    tile and returns after its last read of it (a next call may write it after its own barrier). ``codes``: V is
    e4m3 codes already (a word = four columns), moved unchanged: each 4 × 4 byte block transposed (``inv``,
    ``bf16`` unused)."""
    DW, CH, TW, NL, U, NO = _vt_shape(D, VK, codes)

    @device
    def transpose(v, vt, tile, buf, h, k0, inv, bf16):
        tid = cuda.threadIdx.x
        n = v.shape[1]
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
            mg = k0 // 4 + m
            if mg < nw:
                x0, x1, x2, x3 = ld_shared_v4(tile, w, 4 * (m ^ ((w >> 2) & 7)))
                if codes:  # (compile-time) four keys × four columns of codes: rows 4w .. 4w + 3, unchanged
                    for j in range(4):
                        vt[h, 4 * w + j, mg] = byte_transpose(x0, x1, x2, x3, j)
                else:
                    l0, h0, i0, j0 = two(x0, bf16, True)
                    l1, h1, i1, j1 = two(x1, bf16, True)
                    l2, h2, i2, j2 = two(x2, bf16, True)
                    l3, h3, i3, j3 = two(x3, bf16, True)
                    vt[h, 2 * w, mg] = pack_e4m3x4(l0 * inv, l1 * inv, l2 * inv, l3 * inv)
                    vt[h, 2 * w + 1, mg] = pack_e4m3x4(h0 * inv, h1 * inv, h2 * inv, h3 * inv)

    return transpose


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
    DW, CH, TW, NL, U, NO = _vt_shape(D, VTK)
    transpose = make_vt_codes(D, VTK)

    @kernel
    def quant(v, vt, part, scale, bf16):
        tile = cuda.shared.array((DW, VTK), uint32, alignment=SMEM_ALIGN)
        buf = cuda.local.array((U, 4), uint32)
        h = cuda.blockIdx.y
        inv, sc = head_scale(head_max(part, h))
        if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            scale[h] = sc
        transpose(v, vt, tile, buf, h, cuda.blockIdx.x * VTK, inv, bf16)

    keys = [0] * 32
    for r in range(32):
        keys[stored_position(r)] = r
    assert keys == [int(x) for x in e4m3_p_keys()]
    quant.keys = tuple(keys)  # the order the arithmetic above implements (tests compare)
    return quant


def stored_key(p):
    """The key stored at position ``p`` of a tile (:func:`e4m3_p_keys` within each 32-key block): the inverse of
    :func:`stored_position`, key bits (p4, p1, p3, p2, p0)."""
    return (p & ~15) | (p & 1) | ((p >> 1) & 6) | ((p & 2) << 2)


position_key = device(stored_key)


@device
def byte_transpose(w0, w1, w2, w3, j):
    """Byte ``j`` of each of four words, as one word (byte b from ``wb``): row j of a 4 × 4 byte block, by three
    ``prmt`` (bytes j of w0, w1; of w2, w3; the two pairs joined)."""
    sel = uint32(j | ((4 + j) << 4))
    return byte_perm(byte_perm(w0, w1, sel), byte_perm(w2, w3, sel), uint32(0x5410))


@functools.cache
def make_codes_vt(D: int):
    """``transpose(v8, vt)``: V given as e4m3 codes (``v8`` (heads, Nk, D/4) uint32, four columns a word) into
    :func:`make_quant_vt`'s layout, the codes unchanged: ``vt[h, d, m]`` holds keys of stored positions 4m..4m+3
    (:func:`stored_key`) of column d, keys past Nk zero. Grid (⌈NkP/VTK⌉, heads), QTH threads: the block of
    :func:`make_quant_vt` (16-byte loads of the key rows into a swizzled shared tile, 16-byte reads of four keys of a
    column quad), each 4 × 4 byte block transposed (:func:`make_vt_codes` with ``codes``)."""
    DW, CH, TW, NL, U, NO = _vt_shape(D, VTK, True)
    transpose = make_vt_codes(D, VTK, True)

    @kernel
    def transpose_codes(v8, vt):
        tile = cuda.shared.array((DW, VTK), uint32, alignment=SMEM_ALIGN)
        buf = cuda.local.array((U, 4), uint32)
        transpose(v8, vt, tile, buf, cuda.blockIdx.y, cuda.blockIdx.x * VTK, float32(1.0), False)

    return transpose_codes


# -- the attention kernel -------------------------------------------------------------------


# -- block quantization (one scale a tile, one pass over the inputs) -----------------------------

@device
def block_finite_max(red, m, f, bf16):
    """The largest finite |x| of a block's values and whether one of them is infinite, in every thread: each
    thread's ``m`` (the largest |x| bits it saw, :func:`finite_max`) and ``f``, reduced over its warp and then over
    the block's warps through ``red`` (a shared (2, warps) array), with two block barriers."""
    if bf16:  # the bits of the largest finite |x| as float32 (exact)
        a = u32_as_f32(uint32(m) << uint32(16))
    else:
        a, unused = unpack_f16x2(uint32(m))
    a = warp_max(a)
    fb = warp_max(float32(1.0) if f else float32(0.0))
    tid = cuda.threadIdx.x
    if tid % 32 == 0:
        red[0, tid // 32] = a
        red[1, tid // 32] = fb
    cuda.syncthreads()
    a = red[0, 0]
    fb = red[1, 0]
    for w in range(1, QTH // 32):
        a = max(a, red[0, w])
        fb = max(fb, red[1, w])
    cuda.syncthreads()  # (red may be written again)
    return a, fb


@device
def tile_scan(x, h, r0, rows, CH, m, f, bf16):
    """``(m, f)`` updated with this thread's 16-byte chunks of rows r0 .. r0+rows-1 of head ``h`` (rows of CH chunks;
    rows past the end skipped)."""
    e = uint32(0x7F80) if bf16 else uint32(0x7C00)
    n = x.shape[1]
    for i in range(cuda.threadIdx.x, rows * CH, QTH):
        r = r0 + i // CH
        if r < n:
            a0, a1, a2, a3 = ld_global_v4(x, h, r, 4 * (i % CH))
            m, f = finite_max(a0, m, f, e)
            m, f = finite_max(a1, m, f, e)
            m, f = finite_max(a2, m, f, e)
            m, f = finite_max(a3, m, f, e)
    return m, f


@device
def tile_scale(red, x, h, r0, rows, CH, bf16):
    """``(inv, sc, fb)`` of rows r0 .. r0+rows-1 of head ``h`` (rows of CH 16-byte chunks), in every thread of the
    block: 448/amax and amax/448 of their finite values (:func:`head_scale`) and 1 where one of them is infinite
    (:func:`tile_scan`, then :func:`block_finite_max` through ``red``)."""
    m, f = tile_scan(x, h, r0, rows, CH, uint32(0), False, bf16)
    a, fb = block_finite_max(red, m, f, bf16)
    inv, sc = head_scale(a)
    return inv, sc, fb


@functools.cache
def make_block_quant_rows(DW: int, R: int, keys: bool):
    """``quant(x, out, scale, flag, kmul, bf16)``: tile b of head h, rows b·R .. b·R+R-1 of Q or K, as e4m3 codes
    of ``x · 448 / amax`` with the tile's own amax (finite values): ``scale[h, b]`` = amax/448, ``flag[h, b]`` 1
    where the tile holds an infinity (:func:`make_row_codes`). Grid (⌈N/R⌉, heads), QTH threads: the block reads
    its tile once for the maximum and again (from L2) for the codes."""
    CH = DW // 4
    NW = QTH // 32  # warps a block
    chunk = make_row_codes(DW, keys)

    @kernel
    def quant(x, out, scale, flag, kmul, bf16):
        red = cuda.shared.array((2, NW), float32)
        h = cuda.blockIdx.y
        r0 = cuda.blockIdx.x * R
        inv, sc, fb = tile_scale(red, x, h, r0, R, CH, bf16)
        if cuda.threadIdx.x == 0:
            scale[h, cuda.blockIdx.x] = sc
            flag[h, cuda.blockIdx.x] = fb
        n = x.shape[1]
        for i in range(cuda.threadIdx.x, R * CH, QTH):
            r = r0 + i // CH
            if r < n:
                c = i % CH
                w0, w1, w2, w3 = ld_global_v4(x, h, r, 4 * c)
                chunk(x, out, kmul, h, r, c, w0, w1, w2, w3, inv, fb, bf16)

    return quant


@functools.cache
def make_block_quant_vt(D: int, Bc: int):
    """``quant(v, vt, scale, bf16)``: tile b of head h, keys b·Bc .. b·Bc+Bc-1 of V, as :func:`make_quant_vt`'s
    transposed codes with the tile's own amax: ``scale[h, b]`` = amax/448. Grid (NkP/Bc, heads), QTH threads: the
    block reads its tile once for the maximum, then transposes it 64 keys at a time (:func:`make_vt_codes`, the
    second read from L2)."""
    VK = 64
    DW, CH, TW, NL, U, NO = _vt_shape(D, VK)
    assert Bc % VK == 0
    transpose = make_vt_codes(D, VK)
    PARTS = Bc // VK
    NW = QTH // 32  # warps a block

    @kernel
    def quant(v, vt, scale, bf16):
        red = cuda.shared.array((2, NW), float32)
        tile = cuda.shared.array((DW, VK), uint32, alignment=SMEM_ALIGN)
        buf = cuda.local.array((U, 4), uint32)
        h = cuda.blockIdx.y
        k0 = cuda.blockIdx.x * Bc
        inv, sc, fb = tile_scale(red, v, h, k0, Bc, CH, bf16)
        if cuda.threadIdx.x == 0:
            scale[h, cuda.blockIdx.x] = sc
        for part in range(PARTS):
            transpose(v, vt, tile, buf, h, k0 + part * VK, inv, bf16)
            cuda.syncthreads()  # the tile is read: the next part may write it

    return quant
