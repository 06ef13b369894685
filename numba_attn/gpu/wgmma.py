"""Hopper warpgroup MMA (``wgmma.mma_async``) from numba: inline PTX on the GPU,
an exact warpgroup fallback in the simulator.

The four warps of a *warpgroup* (128 threads, warps 4i..4i+3) issue one 64×N×16 product together (64×N×32 for
e4m3); B (and optionally A) is read by the tensor cores from shared memory through a 64-bit matrix descriptor:
no ``ldmatrix``, no B fragment in registers (``mma.sync``, ``intrinsics.py``, reaches about half the tensor
rate on sm_90). It needs ``sm_90a``, which numba-cuda 0.30 selects for a 9.0 device.

* :func:`make_wgmma_rs` — ``op(acc, a, a_off, smem, byte_off)``: ``acc`` the thread's N/2 float32 accumulators
  (read unless ``zero``), ``a`` the A fragments in uint32 registers (4 a k-step from ``a_off``: packed f16/bf16
  pairs, or four e4m3 codes), B ``byte_off`` bytes into ``smem`` with the offsets, LBO and SBO of
  :func:`kmajor_params` / :func:`mnmajor_params`;
* :func:`make_wgmma_ss` — the same with A from shared memory too (K-major, or transposed with ``a_layout``);
* one call is one asm statement: fence, the chained products, commit and wait; with ``wait=False`` the product
  stays in flight until a :func:`make_wgmma_wait` that passes its accumulators through.

The swizzled tile layout, the fragment layouts and the FP8 operands: docs/tensor-core-notes.md, "wgmma operands".
In the simulator ``op`` gathers the 128 threads' registers (:func:`numba_attn.gpu.warp.group_exchange`), reads B
through the descriptor's address arithmetic and the swizzle, computes in float64 and rounds to float32 once: a
wrong fragment index, layout or misaligned tile fails there as on the GPU.
"""
from __future__ import annotations

import functools

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

SWIZZLE_MODE = {128: 1, 64: 2, 32: 3}  # descriptor bits 62-63 for 128/64/32-byte swizzles
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "e4m3": 1}  # per input element; a k-step is 32 bytes of K in every kind

__all__ = ["make_wgmma_rs", "make_wgmma_ss", "a_from_shared", "make_wgmma_wait", "make_ring_copy", "shared_address", "row_bytes", "swizzle_chunk", "tile_offset", "kmajor_params",
           "mnmajor_params", "b_addresses", "wgmma_reference", "SWIZZLE_MODE", "e4m3_p_keys", "e4m3_p_registers"]


def row_bytes(D: int) -> int:
    """Bytes per swizzled row of a tile with ``D`` 16-bit columns: 128 (64
    elements, column blocks of 64) for D ≥ 64, else 2·D (D = 16 or 32: the
    32- and 64-byte swizzles)."""
    if D % 16 or D < 16:
        raise ValueError(f"wgmma tiles need a multiple of 16 columns, not {D}")
    if D < 64 and D not in (16, 32):
        raise ValueError(f"D={D}: below 64 columns only 16 and 32 have a swizzle mode")
    if D >= 64 and D % 64:
        raise ValueError(f"D={D}: above 64 columns tiles are whole 64-column blocks")
    return min(128, 2 * D)


def swizzle_chunk(r: int, c: int, rb: int) -> int:
    """Stored position of 16-byte chunk ``c`` of row ``r`` within its row (rows of
    ``rb`` bytes, the tile 8·rb-byte aligned): the hardware XORs address bits
    4.. with bits 7.., i.e. the chunk with ``(r·rb >> 7) mod (rb/16)``."""
    return c ^ (((r * rb) >> 7) & (rb // 16 - 1))


def tile_offset(rows: int, r: int, c: int, rb: int) -> int:
    """Byte offset of 16-byte chunk ``c`` (elements 8c..8c+7) of row ``r`` in a
    swizzled tile of ``rows`` rows (host model; kernels inline the formula)."""
    per = rb // 16
    blk, cc = divmod(c, per)
    return blk * rows * rb + r * rb + 16 * swizzle_chunk(r, cc, rb)


def kmajor_params(rows: int, ksteps: int, rb: int):
    """(k-step offsets, LBO, SBO) of a K-major operand (rows = N, columns = K):
    k-step s (16 columns, 32 bytes) starts in column block s // (rb/32), at
    byte 32·(s mod (rb/32)) of the row; SBO = 8 rows; LBO unused (16)."""
    per = rb // 32
    offs = tuple((s // per) * rows * rb + (s % per) * 32 for s in range(ksteps))
    return offs, 16, 8 * rb


def mnmajor_params(rows: int, ksteps: int, rb: int):
    """(k-step offsets, LBO, SBO) of an MN-major operand (rows = K, columns = N):
    k-step s = rows 16s..16s+15; LBO = from one column block to the next
    (``rows·rb``), SBO = 8 rows."""
    offs = tuple(16 * rb * s for s in range(ksteps))
    return offs, rows * rb, 8 * rb


def padded_columns(D: int) -> int:
    """The columns of a swizzled tile holding rows of ``D`` 16-bit elements (D a multiple
    of 8): D rounded up to whole k-steps (16), then to a swizzle mode: 16 or 32, else
    whole 64-column blocks (D = 16, 32 and multiples of 64: D itself)."""
    dk = (D + 15) // 16 * 16
    if dk in (16, 32):
        return dk
    return (dk + 63) // 64 * 64


def e4m3_p_keys():
    """The key order that makes an f32 accumulator fragment the e4m3 A fragment of the next product
    without shuffles (FlashAttention-3's FP8 P·V): ``keys[p]`` is the key (0..31 within a 32-key
    block) whose V row must be stored at position p of the k32 step. A thread holds, of each 8-key
    n-tile of S, the keys 2t and 2t+1 (:func:`_d_index`); register r of the k32 A fragment takes the
    stored positions 4t..4t+3 (+16 for r ≥ 2, :func:`_a_index` with ``esize`` 1). Packing the
    thread's values of n-tiles 4kk, 4kk+1 (registers 0, 1) and 4kk+2, 4kk+3 (registers 2, 3) in
    order puts key 8·(2·(p // 16) + (p mod 4) // 2) + 2·((p mod 16) // 4) + p mod 2 at position p."""
    p = np.arange(32)
    return 8 * (2 * (p // 16) + (p % 4) // 2) + 2 * ((p % 16) // 4) + p % 2


def e4m3_p_registers(ksteps: int):
    """Host model of the conversion: for each thread and each A register of ``ksteps`` k32 steps of
    P·V, the indices (4, low byte first) of the thread's S accumulator values (:func:`_d_index` of
    N = 32·ksteps) packed into it: register 4kk + r takes values 16kk + 8·(r // 2) + (r mod 2)·2
    + (0, 1, 4, 5)."""
    kk = np.arange(ksteps)[:, None, None]
    r = np.arange(4)[None, :, None]
    b = np.array([0, 1, 4, 5])[None, None, :]
    return (16 * kk + 8 * (r // 2) + 2 * (r % 2) + b).reshape(4 * ksteps, 4)


@functools.cache
def make_ring_copy(D: int, Bc: int, STAGES: int, NTH: int, DP: int = 0, packed: bool = False):
    """A device function ``copy(KV, k, v, tile, buf, tid, kvh, Nk)`` issuing thread
    ``tid``'s share (of ``NTH`` threads) of the ``cp.async`` copies of K/V tile
    ``tile`` (keys ``tile·Bc`` …, rows past ``Nk`` zero-filled) into buffer
    ``buf`` of a ring of ``STAGES`` swizzled tiles: K buffers first, then V
    buffers, each ``Bc × D`` 16-bit elements in the layout of :func:`tile_offset`.
    ``KV`` is a 32-bit view of the ring (offsets in words); ``k``/``v`` are the
    32-bit views of the (batch·kv heads, Nk, D) tensors, ``kvh`` the row of
    the first axis. One 16-byte chunk per thread and pass, rows ``NTH/(D/8)``
    apart. Shared by the wgmma phases. ``DP`` (> D, from :func:`padded_columns`): the tiles
    have DP columns; the chunk that completes the last k-step of an odd multiple of 8
    columns is zero-filled, the columns past it are never written nor read. ``packed``: ``k``/``v``
    are token-major (tokens, kv heads, D) instead (the varlen layout) and ``kvh`` is the row of
    the sequence's first key times the kv heads plus the head: a head's keys are ``k.shape[1]·D/2``
    words apart."""
    from numba_attn.gpu.intrinsics import cp_async16_flat
    from numba_attn.gpu.jit import device

    DP = DP or D
    RB = row_bytes(DP)
    PER = RB // 16  # 16-byte chunks per swizzled row
    SWM = PER - 1
    GVEC = D // 8  # 16-byte chunks per K/V row in global memory
    VEC = (D + 15) // 16 * 2  # chunks per row copied (past GVEC: zero-filled)
    RSTEP = NTH // VEC  # tile rows per pass of the block
    CTH = RSTEP * VEC  # threads that copy (all of them when VEC divides the block)
    CPT = (Bc + RSTEP - 1) // RSTEP  # passes per tile
    DW = D // 2  # words per global row
    TW = Bc * DP * 2 // 4  # words of one buffer
    VOFF = STAGES * TW  # the V buffers follow the K buffers

    @device
    def copy(KV, k, v, tile, buf, tid, kvh, Nk):
        lr0 = tid // VEC
        lc = tid % VEC
        if CTH < NTH:  # VEC does not divide the block: the last threads copy nothing
            lr0 = Bc if tid >= CTH else lr0
        blk_w = (lc // PER) * Bc * RB // 4  # word offset of this chunk's column block
        lcc = lc % PER
        g_base = kvh * Nk * DW + 4 * lc
        if VEC > GVEC:  # the zero-filled chunk reads nothing; its address stays inside the row
            g_base = kvh * Nk * DW + 4 * min(lc, GVEC - 1)
        rw = DW  # words from one key of a head to the next
        if packed:
            g_base = kvh * DW + 4 * (min(lc, GVEC - 1) if VEC > GVEC else lc)
            rw = k.shape[1] * DW
        for i in range(CPT):
            r = lr0 + i * RSTEP
            if r < Bc:
                row = tile * Bc + r
                so = buf * TW + blk_w + r * (RB // 4) + 4 * (lcc ^ (((r * RB) >> 7) & SWM))
                go = g_base + min(row, Nk - 1) * rw
                if VEC > GVEC:
                    ok = row < Nk and lc < GVEC
                else:
                    ok = row < Nk
                cp_async16_flat(KV, so, k, go, ok)
                cp_async16_flat(KV, so + VOFF, v, go, ok)

    return copy


def _swizzle(addr, rb):
    return addr ^ (((addr >> 7) & (rb // 16 - 1)) << 4)


def b_addresses(start: int, N: int, offsets: tuple, lbo: int, sbo: int, trans_b: bool, rb: int, esize: int = 2):
    """Byte address of every element (k, n) of the B operand (KS·ksteps × N, KS = 32/esize
    elements of ``esize`` bytes per k-step) that the descriptor arithmetic and the swizzle
    select (host model). 8-bit B (``esize`` 1) is K-major only."""
    KS = 32 // esize
    k = np.arange(KS * len(offsets))[:, None]
    n = np.arange(N)[None, :]
    s, kk = k // KS, k % KS
    start = start + np.asarray(offsets)[s]
    if trans_b:  # MN-major: n contiguous within blocks of rb/2 elements
        if esize != 2:
            raise ValueError("an MN-major (transposed) B operand needs 16-bit elements")
        lin = start + (n // (rb // 2)) * lbo + 2 * (n % (rb // 2)) + (kk // 8) * sbo + (kk % 8) * rb
    else:  # K-major: k contiguous within a row (32 bytes per k-step), 8 rows per SBO
        lin = start + (n // 8) * sbo + (n % 8) * rb + esize * kk
    return _swizzle(lin, rb)


@functools.cache
def _a_index(ksteps: int, esize: int = 2):
    """Row and column of the low element of each A register of each thread (``esize``
    bytes per element: 2, a register holds columns c, c+1 of k16 steps; 1, columns
    c..c+3 of k32 steps — the same byte positions, see the module notes)."""
    T = np.arange(128)[:, None]
    i = np.arange(4 * ksteps)[None, :]
    w, lane = T // 32, T % 32
    g, t = lane // 4, lane % 4
    s, r = i // 4, i % 4
    rows = 16 * w + g + 8 * (r % 2)
    cols = (32 // esize) * s + (4 // esize) * t + (16 // esize) * (r // 2)
    return rows, cols


@functools.cache
def _d_index(N: int):
    """Row and column of each accumulator value of each thread."""
    T = np.arange(128)[:, None]
    j = np.arange(N // 2)[None, :]
    w, lane = T // 32, T % 32
    g, t = lane // 4, lane % 4
    nt, e = j // 4, j % 4
    return 16 * w + g + 8 * (e // 2), 8 * nt + 2 * t + (e % 2)


def _halves(words, kind):
    words = np.asarray(words, np.uint32)
    lo, hi = words & 0xFFFF, words >> 16
    if kind == "f16":
        conv = lambda h: h.astype(np.uint16).view(np.float16).astype(np.float64)  # noqa: E731
    else:
        conv = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    return conv(lo), conv(hi)


def _b16(vals, kind):
    vals = np.asarray(vals, np.uint16)
    if kind == "f16":
        return vals.view(np.float16).astype(np.float64)
    return (vals.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@functools.cache
def _e4m3_table():
    """float64 value of each of the 256 float8 e4m3fn codes (NaN for 0x7F, 0xFF), through the
    exact decoder of ``cvt.rn.f16x2.e4m3x2``'s fallback (every e4m3 value is an f16)."""
    from numba_attn.gpu.intrinsics import e4m3_f16_bits_reference

    bits = np.array([e4m3_f16_bits_reference(c) for c in range(256)], np.uint16)
    return bits.view(np.float16).astype(np.float64)


def _bytes4(words):
    """The four bytes of each word as float64 e4m3 values, low byte first."""
    words = np.asarray(words, np.uint32)
    tab = _e4m3_table()
    return [tab[(words >> (8 * j)) & 0xFF] for j in range(4)]


def _operand(kind, smem_bytes, addr, what):
    """The float64 values of the 16-bit (or e4m3) elements at byte addresses ``addr`` of the shared bytes."""
    esize = ELEMENT_BYTES[kind]
    if addr.min() < 0 or addr.max() + esize > smem_bytes.size:
        raise IndexError(f"wgmma {what} operand reads bytes [{addr.min()}, {addr.max() + esize}) outside the "
                         f"{smem_bytes.size}-byte shared array")
    if esize == 1:
        return _e4m3_table()[smem_bytes[addr]]
    return _b16(smem_bytes[addr].astype(np.uint16) | (smem_bytes[addr + 1].astype(np.uint16) << 8), kind)


def a_from_shared(kind, smem_bytes, start, offsets, rb, a_layout=None):
    """The 64 × 16·ksteps A operand of a wgmma that reads A from shared memory (16-bit): K-major, the K-major tile
    model of :func:`b_addresses` with 64 rows; ``a_layout = (offsets, lbo, sbo)``: MN-major (transposed: rows = K,
    the 64 M columns contiguous), the MN-major model with those parameters (host model)."""
    if a_layout is not None:
        a_offs, lbo, sbo = a_layout
        return _operand(kind, smem_bytes, b_addresses(start, 64, a_offs, lbo, sbo, True, rb), "A").T
    return _operand(kind, smem_bytes, b_addresses(start, 64, offsets, 16, 8 * rb, False, rb), "A").T


def wgmma_reference(kind, N, a_regs, c, smem_bytes, start, offsets, lbo, sbo, trans_b, rb, a_matrix=None):
    """All 128 threads' A registers (128 × 4·ksteps uint32) and accumulators
    (128 × N/2 float32, or None for zero) plus the shared bytes → every
    thread's D fragment (128 × N/2 float32). Host model of one fused call:
    exact products summed in float64, one rounding to float32. ``a_matrix``: A itself (64 × K float64,
    read from shared memory by :func:`a_from_shared`) in place of the registers."""
    ksteps = len(offsets)
    esize = ELEMENT_BYTES[kind]
    if a_matrix is None:
        A = np.zeros((64, (32 // esize) * ksteps))
        rows, cols = _a_index(ksteps, esize)
        parts = _bytes4(a_regs) if esize == 1 else _halves(a_regs, kind)
        for j, part in enumerate(parts):
            A[rows, cols + j] = part
    else:
        A = a_matrix
    B = _operand(kind, smem_bytes, b_addresses(start, N, offsets, lbo, sbo, trans_b, rb, esize), "B")
    D = A @ B
    drow, dcol = _d_index(N)
    if c is not None:
        C = np.zeros((64, N))
        C[drow, dcol] = np.asarray(c, np.float64)
        D = D + C
    return D.astype(np.float32)[drow, dcol]


def _check(kind, N, offsets, rb, trans_b=False):
    """Refuse an unsupported wgmma shape; (accumulator registers per thread N/2, k-steps)."""
    ksteps = len(offsets)
    if rb not in SWIZZLE_MODE:
        raise ValueError(f"row bytes {rb}: must be 32, 64 or 128")
    if kind not in ELEMENT_BYTES:
        raise ValueError(f"wgmma kind must be f16, bf16 or e4m3, not {kind!r}")
    if kind == "e4m3" and trans_b:
        raise ValueError("wgmma with 8-bit (e4m3) inputs takes only a K-major B operand: no trans_b "
                         "(store the operand transposed in shared memory instead)")
    if N % 8 or not 8 <= N <= 256:
        raise ValueError(f"wgmma N must be a multiple of 8 in [8, 256], not {N}")
    if ksteps < 1:
        raise ValueError("wgmma needs at least one k-step")
    return N // 2, ksteps


def _check_a_layout(a_layout, ksteps):
    """``a_layout`` of :func:`make_wgmma_ss`: None (A K-major) or (offsets, LBO, SBO) of an MN-major A, one offset
    a k-step: A read transposed (``imm-trans-a`` of 16-bit wgmma), a tile whose rows are the K index and whose 64
    columns are the product's rows (:func:`mnmajor_params`; the backward's dQ = dS·K reads dS so from its dSᵀ tiles)."""
    if a_layout is not None and (len(a_layout) != 3 or len(a_layout[0]) != ksteps):
        raise ValueError(f"a_layout must be (offsets of the {ksteps} k-steps, LBO, SBO) of an MN-major A, "
                         f"not {a_layout!r}")


if IS_SIMULATOR:
    from numba_attn.gpu.warp import group_exchange

    def shared_buffer(arr):
        """The whole shared buffer behind ``arr`` as bytes, and ``arr``'s byte offset in it."""
        a = np.asarray(getattr(arr, "_ary", arr))
        base = a
        while isinstance(base.base, np.ndarray):
            base = base.base
        start = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return base.reshape(-1).view(np.uint8), int(start)

    def shared_address(arr):
        """Byte offset of ``arr``'s first element in its shared buffer (the
        simulator's stand-in for the shared-window address; buffers start at 0)."""
        return np.uint32(shared_buffer(arr)[1])

    @functools.cache
    def make_wgmma_rs(kind: str, N: int, trans_b: bool, zero: bool, offsets: tuple, lbo: int, sbo: int,
                      rb: int = 128, wait: bool = True):
        """(The simulator computes at issue; ``wait=False`` only changes the GPU code.)"""
        NA, ksteps = _check(kind, N, offsets, rb, trans_b)

        def wgmma_rs(acc, a, a_off, smem, byte_off):
            a_off = int(a_off)
            regs = np.array([int(a[a_off + i]) for i in range(4 * ksteps)], np.uint32)
            c = None if zero else np.array([acc[i] for i in range(NA)], np.float32)
            buf, base = shared_buffer(smem)
            start = base + int(byte_off)
            vals = group_exchange((regs, c, start), 4)
            starts = {v[2] for v in vals}
            if len(starts) != 1:
                raise RuntimeError(f"wgmma: the threads of a warpgroup passed different B addresses {sorted(starts)}")
            if start % 16:
                raise ValueError(f"wgmma: B operand address {start} is not 16-byte aligned")
            R = np.stack([v[0] for v in vals])
            C = None if zero else np.stack([v[1] for v in vals])
            D = wgmma_reference(kind, N, R, C, buf, start, offsets, lbo, sbo, trans_b, rb)
            t = _thread_id() % 128
            for i in range(NA):
                acc[i] = D[t, i]

        return wgmma_rs

    @functools.cache
    def make_wgmma_ss(kind: str, N: int, trans_b: bool, zero: bool, offsets: tuple, lbo: int, sbo: int,
                      rb: int = 128, wait: bool = True, a_layout=None):
        """(The simulator computes at issue; ``wait=False`` only changes the GPU code.)"""
        NA, ksteps = _check(kind, N, offsets, rb, trans_b)
        if kind == "e4m3":
            raise ValueError("make_wgmma_ss takes 16-bit operands (f16, bf16)")
        _check_a_layout(a_layout, ksteps)
        a_offsets = kmajor_params(64, ksteps, rb)[0]

        def wgmma_ss(acc, smem_a, a_off, smem, byte_off):
            c = None if zero else np.array([acc[i] for i in range(NA)], np.float32)
            buf_a, base_a = shared_buffer(smem_a)
            buf, base = shared_buffer(smem)
            a_start, start = base_a + int(a_off), base + int(byte_off)
            vals = group_exchange((c, a_start, start), 4)
            if len({(v[1], v[2]) for v in vals}) != 1:
                raise RuntimeError("wgmma: the threads of a warpgroup passed different A or B addresses")
            if start % 16 or a_start % 16:
                raise ValueError(f"wgmma: operand addresses {a_start} (A), {start} (B) are not 16-byte aligned")
            C = None if zero else np.stack([v[0] for v in vals])
            A = a_from_shared(kind, buf_a, a_start, a_offsets, rb, a_layout)
            D = wgmma_reference(kind, N, None, C, buf, start, offsets, lbo, sbo, trans_b, rb, a_matrix=A)
            t = _thread_id() % 128
            for i in range(NA):
                acc[i] = D[t, i]

        return wgmma_ss

    @functools.cache
    def make_wgmma_wait(pending: int, n1: int, n2: int = 0):
        """Simulator: products complete at issue, so the wait has nothing to do
        (a kernel that reads an accumulator before its wait is wrong on the GPU
        only; the GPU tests cover the asynchronous phases)."""

        def wgmma_wait(acc1, acc2):
            return None

        return wgmma_wait

    def _thread_id():
        import threading

        return threading.current_thread().thread_id

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.intrinsics import asm_call, shared_addr

    _i32 = ir.IntType(32)
    _i64 = ir.IntType(64)
    _f32 = ir.FloatType()

    @intrinsic
    def shared_address(typingctx, arr):
        """The 32-bit shared-window address of ``arr``'s first element."""
        if not isinstance(arr, types.Array):
            return None
        sig = types.uint32(arr)

        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, value=args[0])
            return shared_addr(builder, a.data)

        return sig, codegen

    @functools.cache
    def make_wgmma_rs(kind: str, N: int, trans_b: bool, zero: bool, offsets: tuple, lbo: int, sbo: int,
                      rb: int = 128, wait: bool = True):
        NA, ksteps = _check(kind, N, offsets, rb, trans_b)
        nin = 0 if zero else NA
        flag = NA + nin
        a_idx = [flag + 1 + i for i in range(4 * ksteps)]
        d_idx = [flag + 1 + 4 * ksteps + s for s in range(ksteps)]
        outs = ",".join(f"${i}" for i in range(NA))
        lines = ["{", ".reg .pred p, q;", f"setp.ne.b32 p, ${flag}, 0;", f"setp.eq.b32 q, ${flag}, ${flag};",
                 "wgmma.fence.sync.aligned;"]
        for s in range(ksteps):
            a4 = ",".join(f"${a_idx[4 * s + i]}" for i in range(4))
            if kind == "e4m3":  # k32; 8-bit types have no transpose immediates
                lines.append(f"wgmma.mma_async.sync.aligned.m64n{N}k32.f32.e4m3.e4m3 {{{outs}}}, {{{a4}}}, "
                             f"${d_idx[s]}, {'p' if s == 0 else 'q'}, 1, 1;")
            else:
                lines.append(f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{kind}.{kind} {{{outs}}}, {{{a4}}}, "
                             f"${d_idx[s]}, {'p' if s == 0 else 'q'}, 1, 1, {1 if trans_b else 0};")
        lines += ["wgmma.commit_group.sync.aligned;"] + (["wgmma.wait_group.sync.aligned 0;"] if wait else []) + ["}"]
        text = "\n".join(lines)
        cons = ",".join(["=f"] * NA + [str(i) for i in range(nin)] + ["r"] * (1 + 4 * ksteps) + ["l"] * ksteps
                        + ["~{memory}"])
        hi_bits = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (SWIZZLE_MODE[rb] << 62)

        @intrinsic
        def wgmma_rs(typingctx, acc, a, a_off, smem, byte_off):
            if not (isinstance(acc, types.Array) and isinstance(a, types.Array) and isinstance(smem, types.Array)):
                return None
            sig = types.void(acc, a, types.intp, smem, types.intp)

            def codegen(context, builder, sig, args):
                acc_v, a_v, a_off_v, sm_v, off_v = args
                acc_a = context.make_array(sig.args[0])(context, builder, value=acc_v)
                a_a = context.make_array(sig.args[1])(context, builder, value=a_v)
                sm_a = context.make_array(sig.args[3])(context, builder, value=sm_v)
                acc_p = [builder.gep(acc_a.data, [ir.Constant(_i64, i)]) for i in range(NA)]
                ins = [builder.load(p) for p in acc_p] if not zero else []
                a_vals = [builder.load(builder.gep(a_a.data, [builder.add(a_off_v, ir.Constant(a_off_v.type, i))]))
                          for i in range(4 * ksteps)]
                addr = builder.add(shared_addr(builder, sm_a.data), builder.trunc(off_v, _i32))
                d0 = builder.or_(builder.and_(builder.lshr(builder.zext(addr, _i64), ir.Constant(_i64, 4)),
                                              ir.Constant(_i64, 0x3FFF)), ir.Constant(_i64, hi_bits))
                descs = [builder.add(d0, ir.Constant(_i64, offsets[s] >> 4)) for s in range(ksteps)]
                flag_v = ir.Constant(_i32, 0 if zero else 1)
                ret = ir.LiteralStructType([_f32] * NA)
                res = asm_call(builder, ret, [_f32] * nin + [_i32] * (1 + 4 * ksteps) + [_i64] * ksteps, text, cons,
                           ins + [flag_v] + a_vals + descs, side_effect=True)
                for i in range(NA):
                    builder.store(builder.extract_value(res, i), acc_p[i])
                return context.get_dummy_value()

            return sig, codegen

        return wgmma_rs

    @functools.cache
    def make_wgmma_ss(kind: str, N: int, trans_b: bool, zero: bool, offsets: tuple, lbo: int, sbo: int,
                      rb: int = 128, wait: bool = True, a_layout=None):
        NA, ksteps = _check(kind, N, offsets, rb, trans_b)
        if kind == "e4m3":
            raise ValueError("make_wgmma_ss takes 16-bit operands (f16, bf16)")
        _check_a_layout(a_layout, ksteps)
        a_offsets = kmajor_params(64, ksteps, rb)[0] if a_layout is None else a_layout[0]
        trans_a = 0 if a_layout is None else 1
        nin = 0 if zero else NA
        flag = NA + nin
        a_idx = [flag + 1 + s for s in range(ksteps)]
        d_idx = [flag + 1 + ksteps + s for s in range(ksteps)]
        outs = ",".join(f"${i}" for i in range(NA))
        lines = ["{", ".reg .pred p, q;", f"setp.ne.b32 p, ${flag}, 0;", f"setp.eq.b32 q, ${flag}, ${flag};",
                 "wgmma.fence.sync.aligned;"]
        for s in range(ksteps):
            lines.append(f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{kind}.{kind} {{{outs}}}, ${a_idx[s]}, "
                         f"${d_idx[s]}, {'p' if s == 0 else 'q'}, 1, 1, {trans_a}, {1 if trans_b else 0};")
        lines += ["wgmma.commit_group.sync.aligned;"] + (["wgmma.wait_group.sync.aligned 0;"] if wait else []) + ["}"]
        text = "\n".join(lines)
        cons = ",".join(["=f"] * NA + [str(i) for i in range(nin)] + ["r"] + ["l"] * (2 * ksteps) + ["~{memory}"])
        a_lbo, a_sbo = (16, 8 * rb) if a_layout is None else a_layout[1:]  # (K-major A: LBO unused)
        a_hi = ((a_lbo >> 4) << 16) | ((a_sbo >> 4) << 32) | (SWIZZLE_MODE[rb] << 62)
        hi_bits = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (SWIZZLE_MODE[rb] << 62)

        def descriptor(builder, arr, off, hi):
            addr = builder.add(shared_addr(builder, arr.data), builder.trunc(off, _i32))
            return builder.or_(builder.and_(builder.lshr(builder.zext(addr, _i64), ir.Constant(_i64, 4)),
                                            ir.Constant(_i64, 0x3FFF)), ir.Constant(_i64, hi))

        @intrinsic
        def wgmma_ss(typingctx, acc, smem_a, a_off, smem, byte_off):
            if not (isinstance(acc, types.Array) and isinstance(smem_a, types.Array)
                    and isinstance(smem, types.Array)):
                return None
            sig = types.void(acc, smem_a, types.intp, smem, types.intp)

            def codegen(context, builder, sig, args):
                acc_v, sa_v, a_off_v, sm_v, off_v = args
                acc_a = context.make_array(sig.args[0])(context, builder, value=acc_v)
                sa_a = context.make_array(sig.args[1])(context, builder, value=sa_v)
                sm_a = context.make_array(sig.args[3])(context, builder, value=sm_v)
                acc_p = [builder.gep(acc_a.data, [ir.Constant(_i64, i)]) for i in range(NA)]
                ins = [builder.load(p) for p in acc_p] if not zero else []
                a0 = descriptor(builder, sa_a, a_off_v, a_hi)
                b0 = descriptor(builder, sm_a, off_v, hi_bits)
                a_descs = [builder.add(a0, ir.Constant(_i64, a_offsets[s] >> 4)) for s in range(ksteps)]
                b_descs = [builder.add(b0, ir.Constant(_i64, offsets[s] >> 4)) for s in range(ksteps)]
                flag_v = ir.Constant(_i32, 0 if zero else 1)
                ret = ir.LiteralStructType([_f32] * NA)
                res = asm_call(builder, ret, [_f32] * nin + [_i32] + [_i64] * (2 * ksteps), text, cons,
                               ins + [flag_v] + a_descs + b_descs, side_effect=True)
                for i in range(NA):
                    builder.store(builder.extract_value(res, i), acc_p[i])
                return context.get_dummy_value()

            return sig, codegen

        return wgmma_ss

    @functools.cache
    def make_wgmma_wait(pending: int, n1: int, n2: int = 0):
        """``wgmma.wait_group pending`` that passes the ``n1`` (and ``n2``) values of
        the accumulator arrays through as in/out operands: every later use of an
        accumulator reads it after the wait (the role of CUTLASS's
        ``warpgroup_fence_operand``)."""
        n = n1 + n2
        text = f"wgmma.wait_group.sync.aligned {int(pending)};"
        cons = ",".join(["=f"] * n + [str(i) for i in range(n)] + ["~{memory}"])

        @intrinsic
        def wgmma_wait(typingctx, acc1, acc2):
            if not (isinstance(acc1, types.Array) and isinstance(acc2, types.Array)):
                return None
            sig = types.void(acc1, acc2)

            def codegen(context, builder, sig, args):
                ptrs = []
                for ary, aty, cnt in ((args[0], sig.args[0], n1), (args[1], sig.args[1], n2)):
                    a = context.make_array(aty)(context, builder, value=ary)
                    ptrs += [builder.gep(a.data, [ir.Constant(_i64, i)]) for i in range(cnt)]
                vals = [builder.load(p) for p in ptrs]
                res = asm_call(builder, ir.LiteralStructType([_f32] * n), [_f32] * n, text, cons, vals,
                           side_effect=True)
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()

            return sig, codegen

        return wgmma_wait
