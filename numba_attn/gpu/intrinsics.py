"""Tensor-core and asynchronous-copy intrinsics: inline PTX on the GPU, exact
per-lane fallbacks in the simulator.

numba-cuda has no API for ``mma.sync``, ``ldmatrix`` or ``cp.async``. On the
GPU each function here is a ``numba.cuda.extending.intrinsic`` that emits one
PTX instruction through an llvmlite ``ir.InlineAsm``; in the CUDA simulator
(``numba_attn.gpu.backend.IS_SIMULATOR``) the same name is a pure-Python function
with the same per-lane semantics. The fallbacks of the warp-wide instructions
(``mma_*``, ``ldmatrix_*``) gather every lane's registers with
:func:`numba_attn.gpu.warp.warp_exchange`, rebuild the matrices from the PTX
fragment layout, compute, and hand each lane exactly the registers the
hardware would give it. A kernel that puts a value in the wrong fragment
register therefore gets the wrong answer in the simulator as on the GPU.

Registers
---------
A packed register (two f16/bf16 halves, or one tf32) is a ``uint32`` holding
the bit pattern the GPU holds: the element with the lower column/k index in
the low 16 bits. Kernels see f16/bf16 tensors as ``uint32`` views (two
elements per word), so a 32-bit load of ``q[bh, row, w]`` is already the
packed pair ``(row, 2w), (row, 2w+1)``.

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8";
lane = 4·g + t, g = lane // 4 in 0..7, t = lane % 4)
--------------------------------------------------------------------------
``mma.m16n8k16`` (f16, bf16), A 16×16 row-major, B 16×8 "col", C/D 16×8 f32:

* A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9)
* B: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
* C/D: c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)

``mma.m16n8k8`` (tf32), A 16×8, B 8×8, one tf32 per register:

* A: a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4)
* B: b0 = (k t, n g), b1 = (k t+4, n g)
* C/D: as above.

``ldmatrix.m8n8.x4.b16``: lanes 8i..8i+7 give the 16-byte row addresses of
matrix i (row lane % 8); each lane receives one register per matrix, holding
(row lane//4, cols 2(lane%4), 2(lane%4)+1) of it, or with ``.trans`` the
elements (rows 2(lane%4), 2(lane%4)+1; col lane//4) — i.e. the row-major
rows of the transposed matrix. Non-transposed K rows give the B operand of
QKᵀ; transposed V rows give the B operand of PV.

The functions
-------------
=========================  ==============================================
``mma_f16``/``mma_bf16``   ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.…f32``
``mma_tf32``               ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``
``ldmatrix_x4[_trans]``    ``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16``
``cp_async16``             ``cp.async.cg.shared.global`` 16 B, zero-fill when not valid
``cp_async16_flat``        the same, addresses as flat element offsets into C-contiguous arrays
``cp_async16_flat_l2_256`` the same with ``.L2::256B`` (the L2 fetches the whole 256-byte block)
``cp_async16_at_ca``       ``cp.async.ca.shared.global`` 16 B (through L1: a warp's 16-byte copies reach the L2 as whole
                           sectors; with ``.cg`` an H100 read twice the L2 sectors, see ``make_frag8_kernel``'s
                           ``NST``) from flat word ``row·n + col + off`` (``row`` 32-bit, as ``ld_global_v4_at``)
                           to flat element ``doff`` (32-bit) of a shared array
``cp_async4_at``           ``cp.async.ca.shared.global`` 4 B: flat element ``i`` (32-bit, as ``ld_at``) of a 32-bit
                           array to flat element ``doff`` of a shared one
``cp_async_commit``        ``cp.async.commit_group``
``cp_async_wait(n)``       ``cp.async.wait_group n`` (n a compile-time constant)
``ld_global_v4``           ``ld.global.nc.v4.u32`` (128-bit read-only load)
``ld_global_v2``           ``ld.global.nc.v2.u32`` (64-bit read-only load)
``byte_perm``              ``prmt.b32`` (CUDA's ``__byte_perm``: four bytes picked from two words)
``unpack_f16x2``           ``cvt.f32.f16`` of both halves of a register (exact)
``u32_as_f32``             ``mov.b32`` (a 32-bit pattern read as float32)
``st_shared_v4``           ``st.shared.v4.u32`` (128-bit shared store)
``ld_shared_v4``           ``ld.shared.v4.u32`` (128-bit shared load, as uint32 words)
``unpack_bf16x2``          one register of two bf16 → two float32 (exact: the bits shifted, no instruction)
``pack_f16x2``             ``cvt.rn.f16x2.f32`` (two floats → packed halves)
``pack_bf16x2``            ``cvt.rn.bf16x2.f32``
``pack_b16x2``             ``mov.b32 {lo, hi}`` (two 16-bit patterns → one register)
``to_tf32``                ``cvt.rna.tf32.f32``
``cvt_e4m3x4_f16x2``        ``cvt.rn.f16x2.e4m3x2`` of both halves of a word (four fp8 e4m3fn codes → two f16x2;
                           sm_89+)
``pack_e4m3x4``             ``cvt.rn.satfinite.e4m3x2.f32`` twice (four floats → four fp8 e4m3fn codes, the
                           first in the low byte; sm_89+)
``sub_f16x2``               ``sub.rn.f16x2`` (both halves)
``mad_u32``                 ``a·b + c`` in 32-bit unsigned arithmetic (numba widens integer arithmetic to 64 bits)
``add_u32``                 ``a + b`` in 32-bit unsigned arithmetic
``ld_global_v4_at``         ``ld_global_v4`` at flat word ``row·n + col + off`` of a C-contiguous array of 32-bit
                           words, ``row`` a 32-bit index (one ``mad.wide.u32`` on ``arr + col``, ``off`` constant)
``ld_global_v2_at``         the same, 8 bytes
``ld_at``                  ``ld.global`` of flat element ``i`` (a 32-bit index) of a C-contiguous array
``lds``                    ``arr[r, c]`` without negative-index wrap-around
``rows_head_major``        ``a[s:s+n].transpose(1, 0, 2)`` (a view; numba's transpose needs a set)
=========================  ==============================================

Hopper's warpgroup MMA (``wgmma.mma_async``, B operands by shared-memory
descriptor) lives in :mod:`numba_attn.gpu.wgmma`, with its own warpgroup fallback.

``lds`` exists for speed, not for a new instruction: numba's ``arr[i, j]``
adds a wrap-around select for negative indices, which hides from LLVM that
the addresses of an unrolled fragment loop differ by constants, so every one
of them is computed (and kept live) in its own 64-bit register.
``cp_async16_flat`` exists for the same reason: with a flat offset the
kernel computes a tile row's address with compile-time row lengths instead
of numba's 64-bit index arithmetic over run-time shapes.

Array arguments are indexed like the arrays themselves (2-D shared tiles,
3-D ``(bh, row, col)`` global tensors); the address is that element's.
``ldmatrix``/``cp.async``/128-bit accesses need 16-byte aligned addresses:
declare shared tiles with ``alignment=SMEM_ALIGN`` (16 on the GPU; the
simulator refuses the argument, so it is ``None`` there) and keep column
indices multiples of 16 bytes. The fallbacks check that alignment.

Memory ordering: ``ldmatrix``, ``cp.async`` and the shared store are
``volatile`` asm with a memory clobber, so the compiler neither merges them
across loop iterations nor moves them across ``syncthreads``. In the
simulator ``cp_async16`` only records the copy; it is carried out by the
``cp_async_wait`` that retires its group (all groups but the newest ``n``),
so a kernel that reads a tile before waiting for it reads stale data there
too.
"""
from __future__ import annotations

import threading

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

SMEM_ALIGN = None if IS_SIMULATOR else 16

__all__ = [
    "SMEM_ALIGN", "mma_f16", "mma_bf16", "mma_tf32", "ldmatrix_x4", "ldmatrix_x4_trans",
    "cp_async16", "cp_async16_flat", "cp_async16_flat_l2_256", "cp_async16_at_ca", "cp_async4_at",
    "cp_async_commit", "cp_async_wait", "ld_global_v4",
    "st_shared_v4", "ld_shared_v4", "unpack_bf16x2", "ld_global_v2", "byte_perm", "unpack_f16x2", "u32_as_f32",
    "pack_f16x2", "pack_bf16x2", "pack_b16x2", "to_tf32", "lds", "rows_head_major", "cvt_e4m3x4_f16x2",
    "pack_e4m3x4", "e4m3_bits_reference",
    "sub_f16x2", "mad_u32", "add_u32", "ld_global_v4_at", "ld_global_v2_at", "ld_at",
]

# ---------------------------------------------------------------------------
# Bit-level helpers shared by the fallbacks and the tests (host NumPy).
# ---------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF


def _u32(x) -> int:
    """A register value as a Python int, refusing anything that is not a 32-bit
    unsigned integer (a float passed where a packed register belongs)."""
    if isinstance(x, (bool, float, np.floating)):
        raise TypeError(f"expected a packed 32-bit register (uint32), got {type(x).__name__} {x!r}")
    v = int(x)
    if not 0 <= v <= _MASK32:
        raise ValueError(f"register value {v:#x} does not fit 32 bits")
    return v


def byte_perm_reference(a, b, sel) -> int:
    """``prmt.b32 d, a, b, sel`` (default mode, CUDA's ``__byte_perm``): byte i of d is byte
    ``n & 7`` of the 8 bytes {b, a} (a the low four), n the i-th selector nibble; with bit 3 of n
    set, that byte's sign bit replicated (0x00 or 0xFF)."""
    src = _u32(a) | (_u32(b) << 32)
    out = 0
    for i in range(4):
        n = (int(sel) >> (4 * i)) & 0xF
        byte = (src >> (8 * (n & 7))) & 0xFF
        if n & 8:
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * i)
    return out


def f16_bits(x) -> int:
    """Bit pattern of float32 ``x`` rounded to float16 (round to nearest even)."""
    return int(np.asarray(np.float32(x)).astype(np.float16).view(np.uint16))


def bf16_bits(x) -> int:
    """Bit pattern of float32 ``x`` rounded to bfloat16 (round to nearest even)."""
    b = int(np.asarray(np.float32(x)).view(np.uint32))
    if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF):  # NaN stays a (quiet) NaN
        return ((b >> 16) | 0x40) & 0xFFFF
    b += 0x7FFF + ((b >> 16) & 1)
    return (b >> 16) & 0xFFFF


def tf32_bits(x) -> int:
    """``cvt.rna.tf32.f32``: keep 10 mantissa bits, round to nearest, ties away
    from zero; the low 13 bits of the result are zero."""
    b = int(np.asarray(np.float32(x)).view(np.uint32))
    if (b & 0x7F800000) == 0x7F800000:  # inf/nan: truncate (keeps inf, nan stays nan)
        return (b & 0xFFFFE000) | (0x400000 if b & 0x7FFFFF else 0)
    return ((b + 0x1000) & 0xFFFFE000) & _MASK32


E4M3_NAN_F16 = 0x7FFF  # the f16 NaN the fallback gives an e4m3 NaN code (the tests compare NaN-ness only)


def e4m3_f16_bits_reference(code) -> int:
    """``cvt.rn.f16x2.e4m3x2`` of one byte: the f16 bit pattern of the float8 e4m3fn value of ``code``
    (sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 subnormal; 0x7F and 0xFF NaN, no
    infinities). Every e4m3 value is an f16 normal (or zero), so the conversion is exact."""
    c = int(code) & 0xFF
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7:
        return E4M3_NAN_F16 | ((c & 0x80) << 8)
    val = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return f16_bits(-val if c & 0x80 else val)


E4M3_MAX = 448.0  # the largest finite float8 e4m3fn value (code 0x7E)


def e4m3_bits_reference(x) -> int:
    """``cvt.rn.satfinite.e4m3x2.f32`` of one float32: the float8 e4m3fn code of ``x`` rounded to
    nearest even; magnitudes past 448 (infinities included) saturate to ±448 (0x7E/0xFE), NaN gives
    the NaN code 0x7F; below 2^-6 the subnormal steps of 2^-9 (a tie rounds to even)."""
    import math

    v = float(np.float32(x))
    if v != v:
        return 0x7F
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a >= E4M3_MAX:
        return sign | 0x7E
    if a < 2.0 ** -6:  # subnormal: m·2^-9; m = 8 is the smallest normal (code 0x08)
        return sign | int(round(a * 2.0 ** 9))
    m, e = math.frexp(a)  # a = m·2^e, m in [0.5, 1)
    e -= 1
    q = int(round((2.0 * m - 1.0) * 8.0))  # exact: a float64 with few bits; round() ties to even
    if q == 8:
        e, q = e + 1, 0
    return sign | ((e + 7) << 3) | q


def half_lo_hi(reg, kind: str):
    """The two elements of a packed register as float64 (low half first)."""
    r = _u32(reg)
    lo, hi = r & 0xFFFF, r >> 16
    if kind == "f16":
        return tuple(float(np.uint16(h).view(np.float16)) for h in (lo, hi))
    if kind == "bf16":
        return tuple(float(np.uint32(h << 16).view(np.float32)) for h in (lo, hi))
    raise ValueError(kind)


def tf32_value(reg) -> float:
    """The tf32 value the tensor core reads from a 32-bit register (low 13 bits ignored)."""
    return float(np.uint32(_u32(reg) & 0xFFFFE000).view(np.float32))


# ---------------------------------------------------------------------------
# Host-side reference models of the fragment layouts (used by the simulator
# fallbacks, and by the tests to build and read fragments).
# ---------------------------------------------------------------------------


def mma_k16_reference(regs, kind: str):
    """All 32 lanes' ``(a0..a3, b0, b1, c0..c3)`` → each lane's ``(d0..d3)`` for
    ``mma.m16n8k16`` with f16/bf16 inputs (computed in float64, rounded to f32)."""
    def place(A, B, g, t, a0, a1, a2, a3, b0, b1):
        A[g, 2 * t:2 * t + 2] = half_lo_hi(a0, kind)
        A[g + 8, 2 * t:2 * t + 2] = half_lo_hi(a1, kind)
        A[g, 2 * t + 8:2 * t + 10] = half_lo_hi(a2, kind)
        A[g + 8, 2 * t + 8:2 * t + 10] = half_lo_hi(a3, kind)
        B[2 * t:2 * t + 2, g] = half_lo_hi(b0, kind)
        B[2 * t + 8:2 * t + 10, g] = half_lo_hi(b1, kind)

    return _mma_reference(regs, 16, place)


def mma_k8_tf32_reference(regs):
    """Like :func:`mma_k16_reference` for ``mma.m16n8k8`` with tf32 inputs."""
    def place(A, B, g, t, a0, a1, a2, a3, b0, b1):
        A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = map(tf32_value, (a0, a1, a2, a3))
        B[t, g], B[t + 4, g] = tf32_value(b0), tf32_value(b1)

    return _mma_reference(regs, 8, place)


def _mma_reference(regs, K, place):
    """``D = A @ B + C`` of an ``m16n8kK`` mma from all 32 lanes' registers:
    ``place(A, B, g, t, a0..a3, b0, b1)`` puts a lane's A and B fragments
    (lane = 4 g + t); C is f32 in both layouts. Each lane's ``(d0..d3)``."""
    A = np.zeros((16, K))
    B = np.zeros((K, 8))
    C = np.zeros((16, 8))
    for lane, r in enumerate(regs):
        g, t = divmod(lane, 4)
        place(A, B, g, t, *r[:6])
        c0, c1, c2, c3 = r[6:]
        C[g, 2 * t:2 * t + 2] = (float(c0), float(c1))
        C[g + 8, 2 * t:2 * t + 2] = (float(c2), float(c3))
    return _split_d(A @ B + C)


def _split_d(D):
    D = D.astype(np.float32)
    out = []
    for lane in range(32):
        g, t = divmod(lane, 4)
        out.append((D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]))
    return out


def ldmatrix_reference(rows, trans: bool):
    """``rows[m]`` = the 8 row contents (8 uint16 each) of matrix m, m < 4 →
    each lane's 4 registers of ``ldmatrix.x4`` (optionally ``.trans``)."""
    out = []
    for lane in range(32):
        g, t = divmod(lane, 4)
        regs = []
        for m in range(4):
            M = rows[m]
            if trans:
                lo, hi = int(M[2 * t][g]), int(M[2 * t + 1][g])
            else:
                lo, hi = int(M[g][2 * t]), int(M[g][2 * t + 1])
            regs.append(np.uint32(lo | (hi << 16)))
        out.append(tuple(regs))
    return out


# ---------------------------------------------------------------------------
# Simulator fallbacks
# ---------------------------------------------------------------------------

if IS_SIMULATOR:
    from numba_attn.gpu.warp import WARP_SIZE, warp_exchange

    def _lane():
        from numba_attn.gpu import warp

        return warp.laneid()

    def _full_warp(vals, what):
        if len(vals) != WARP_SIZE:
            raise RuntimeError(f"{what} needs a full warp of 32 lanes (got {len(vals)})")

    def _mma_fallback(kind, args):
        if len(args) != 10:
            raise TypeError("mma takes a0, a1, a2, a3, b0, b1, c0, c1, c2, c3")
        regs = tuple(_u32(a) for a in args[:6]) + tuple(np.float32(c) for c in args[6:])
        vals = warp_exchange(regs)
        _full_warp(vals, "mma.sync")
        lane = _lane()
        d = mma_k8_tf32_reference(vals) if kind == "tf32" else mma_k16_reference(vals, kind)
        return tuple(np.float32(x) for x in d[lane])

    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C, m16n8k16, f16 inputs (packed uint32), f32 accumulators."""
        return _mma_fallback("f16", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C, m16n8k16, bf16 inputs (packed uint32), f32 accumulators."""
        return _mma_fallback("bf16", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

    def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C, m16n8k8, tf32 inputs (uint32 from :func:`to_tf32`), f32 accumulators."""
        return _mma_fallback("tf32", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

    def _np(a):
        return getattr(a, "_ary", a)

    def _row16(arr, idx):
        """The 16 bytes at element ``idx`` of ``arr`` as 8 uint16."""
        a = np.asarray(_np(arr))
        idx = tuple(int(i) for i in idx)
        if len(idx) != a.ndim:
            raise IndexError(f"{len(idx)} indices for a {a.ndim}-D array")
        n = 16 // a.itemsize
        if (idx[-1] * a.itemsize) % 16:
            raise ValueError(f"address of element {idx} is not 16-byte aligned (row start must be)")
        for i, s in zip(idx, a.shape):
            if not 0 <= i < s:
                raise IndexError(f"index {idx} out of bounds for shape {a.shape}")
        if idx[-1] + n > a.shape[-1]:
            raise IndexError(f"16 bytes at {idx} run past the row (shape {a.shape})")
        return np.ascontiguousarray(a[idx[:-1]][idx[-1]:idx[-1] + n]).view(np.uint16)

    def _ldmatrix(arr, row, col, trans):
        vals = warp_exchange((arr, int(row), int(col)))
        _full_warp(vals, "ldmatrix")
        rows = [[_row16(a, (r, c)) for (a, r, c) in vals[8 * m:8 * m + 8]] for m in range(4)]
        return ldmatrix_reference(rows, trans)[_lane()]

    def ldmatrix_x4(smem, row, col):
        """Four 8×8 b16 matrices; this lane gives the address of ``smem[row, col]``
        (row lane%8 of matrix lane//8) and gets one register per matrix."""
        return _ldmatrix(smem, row, col, False)

    def ldmatrix_x4_trans(smem, row, col):
        """As :func:`ldmatrix_x4`, each matrix transposed."""
        return _ldmatrix(smem, row, col, True)

    # cp.async: per-thread queue of recorded copies; committed groups are
    # carried out by the wait that retires them.
    _cp = threading.local()

    def _cp_state():
        if not hasattr(_cp, "pending"):
            _cp.pending, _cp.groups = [], []
        return _cp

    def cp_async16(dst, drow, dcol, src, sb, srow, scol, valid):
        """Copy 16 bytes from ``src[sb, srow, scol]`` to ``dst[drow, dcol]``
        asynchronously; when ``valid`` is false the 16 bytes are zero-filled and
        nothing is read."""
        st = _cp_state()
        d = np.asarray(_np(dst))
        di = (int(drow), int(dcol))
        _row16(d, di)  # validate the destination now, as the instruction would
        if valid:
            data = _row16(src, (sb, srow, scol)).copy()
        else:
            data = np.zeros(8, np.uint16)

        def do(d=d, di=di, data=data):
            n = 16 // d.itemsize
            d[di[0], di[1]:di[1] + n] = data.view(d.dtype)

        st.pending.append(do)

    def _cp_flat(dst, doff, src, soff, valid, nbytes):
        """Record a copy of ``nbytes`` from flat element ``soff`` of ``src`` to flat element ``doff`` of ``dst``
        (zeros when not ``valid``), checked as the instruction would be."""
        d = np.asarray(_np(dst)).reshape(-1)
        sflat = np.asarray(_np(src)).reshape(-1)
        doff, soff = int(doff), int(soff)
        if doff < 0 or soff < 0:
            raise IndexError(f"negative offset ({doff}, {soff})")
        if nbytes == 4 and (d.itemsize != 4 or sflat.itemsize != 4):
            raise TypeError("cp_async4_flat copies one element of 32-bit arrays")
        if (doff * d.itemsize) % nbytes or (soff * sflat.itemsize) % nbytes:
            raise ValueError(f"cp.async offsets ({doff}, {soff}) are not {nbytes}-byte aligned")
        n_d = nbytes // d.itemsize
        if doff + n_d > d.size:
            raise IndexError(f"{nbytes} bytes at flat offset {doff} run past the shared array ({d.size} elements)")
        if valid:
            n_s = nbytes // sflat.itemsize
            if soff + n_s > sflat.size:
                raise IndexError(f"{nbytes} bytes at flat offset {soff} run past the source ({sflat.size} elements)")
            data = np.ascontiguousarray(sflat[soff:soff + n_s]).view(np.uint8).copy()
        else:
            data = np.zeros(nbytes, np.uint8)

        def do(d=d, doff=doff, data=data, n_d=n_d):
            d[doff:doff + n_d] = data.view(d.dtype)

        _cp_state().pending.append(do)

    def cp_async16_flat(dst, doff, src, soff, valid):
        """As :func:`cp_async16`, the element addresses given as flat offsets
        (in elements) from the start of C-contiguous arrays."""
        _cp_flat(dst, doff, src, soff, valid, 16)

    cp_async16_flat_l2_256 = cp_async16_flat  # the L2 prefetch hint changes no result

    def cp_async16_at_ca(dst, doff, src, row, n, col, off, valid):
        """16 bytes from flat word ``row·n + col + off`` of ``src`` (``row`` a 32-bit index, as
        :func:`ld_global_v4_at`) to flat element ``doff`` (32-bit) of ``dst`` (``.ca``: the L1 allocation
        changes no result)."""
        _cp_flat(dst, _u32_index(doff), src, _u32_index(row) * int(n) + int(col) + int(off), valid, 16)

    def cp_async4_at(dst, doff, src, i, valid):
        """4 bytes: flat element ``i`` (a 32-bit index, as :func:`ld_at`) of the 32-bit array ``src`` to flat
        element ``doff`` of ``dst`` (zero when not ``valid``)."""
        _cp_flat(dst, _u32_index(doff), src, _u32_index(i), valid, 4)

    def cp_async_commit():
        st = _cp_state()
        st.groups.append(st.pending)
        st.pending = []

    def cp_async_wait(n):
        """Wait until at most ``n`` committed groups are still in flight."""
        st = _cp_state()
        while len(st.groups) > int(n):
            for do in st.groups.pop(0):
                do()

    def ld_global_v4(arr, b, r, c):
        """Four 32-bit words at ``arr[b, r, c]`` (16 bytes) as uint32."""
        words = _row16(arr, (b, r, c)).view(np.uint32)
        return tuple(np.uint32(w) for w in words)

    def st_shared_v4(arr, r, c, x0, x1, x2, x3):
        """Store four 32-bit words at ``arr[r, c]`` (16 bytes)."""
        a = np.asarray(_np(arr))
        _row16(a, (r, c))
        n = 16 // a.itemsize
        words = np.array([_u32(x) for x in (x0, x1, x2, x3)], np.uint32)
        a[int(r), int(c):int(c) + n] = words.view(a.dtype)

    def ld_shared_v4(arr, r, c):
        """Four 32-bit words at ``arr[r, c]`` (16 bytes) of a 2-D shared array as uint32."""
        words = _row16(arr, (r, c)).view(np.uint32)
        return tuple(np.uint32(w) for w in words)

    def unpack_bf16x2(w):
        """One register of two bf16 → (low, high) as float32 (exact)."""
        b = _u32(w)
        lo, hi = np.array([(b & 0xFFFF) << 16, b & 0xFFFF0000], np.uint32).view(np.float32)
        return np.float32(lo), np.float32(hi)

    def ld_global_v2(arr, b, r, c):
        """Two 32-bit words at ``arr[b, r, c]`` (8 bytes, 8-byte aligned) as uint32."""
        a = np.asarray(_np(arr))
        idx = (int(b), int(r), int(c))
        if a.ndim != 3 or a.itemsize != 4:
            raise TypeError("ld_global_v2 reads a 3-D array of 32-bit words")
        if idx[2] % 2:
            raise ValueError(f"address of element {idx} is not 8-byte aligned")
        for i, n in zip(idx, a.shape):
            if not 0 <= i < n:
                raise IndexError(f"index {idx} out of bounds for shape {a.shape}")
        if idx[2] + 2 > a.shape[2]:
            raise IndexError(f"8 bytes at {idx} run past the row (shape {a.shape})")
        w = np.ascontiguousarray(a[idx[0], idx[1], idx[2]:idx[2] + 2]).view(np.uint32)
        return np.uint32(w[0]), np.uint32(w[1])

    def byte_perm(a, b, sel):
        """``prmt.b32``: four bytes picked from the eight of {b, a} (:func:`byte_perm_reference`)."""
        return np.uint32(byte_perm_reference(a, b, sel))

    def unpack_f16x2(w):
        """One register of two f16 → (low, high) as float32 (exact)."""
        lo, hi = np.array([_u32(w)], np.uint32).view(np.float16)
        return np.float32(lo), np.float32(hi)

    def u32_as_f32(x):
        """A 32-bit pattern read as float32."""
        return np.array([_u32(x)], np.uint32).view(np.float32)[0]

    def rows_head_major(a, s, n):
        """Rows ``s … s+n−1`` of a 3-D (tokens, heads, W) array as the (heads, n, W) view."""
        return np.asarray(_np(a))[int(s):int(s) + int(n)].transpose(1, 0, 2)

    def lds(arr, r, c):
        """``arr[r, c]`` of a 2-D (shared) array, indices must be non-negative."""
        r, c = int(r), int(c)
        a = _np(arr)
        if not (0 <= r < a.shape[0] and 0 <= c < a.shape[1]):
            raise IndexError(f"lds index ({r}, {c}) out of bounds for shape {a.shape}")
        return a[r, c]

    def pack_f16x2(lo, hi):
        """Two float32 → one register: f16(lo) in the low half, f16(hi) in the high half."""
        return np.uint32(f16_bits(lo) | (f16_bits(hi) << 16))

    def pack_bf16x2(lo, hi):
        """Two float32 → one register of two bf16 (round to nearest even)."""
        return np.uint32(bf16_bits(lo) | (bf16_bits(hi) << 16))

    def pack_b16x2(lo, hi):
        """Two 16-bit patterns (uint16 array elements) → one register."""
        lo, hi = int(lo), int(hi)
        if not (0 <= lo <= 0xFFFF and 0 <= hi <= 0xFFFF):
            raise ValueError("pack_b16x2 takes 16-bit patterns")
        return np.uint32(lo | (hi << 16))

    def to_tf32(x):
        """float32 → tf32 register (``cvt.rna``)."""
        return np.uint32(tf32_bits(x))

    def cvt_e4m3x4_f16x2(w):
        """Four e4m3fn codes (the bytes of ``w``, low first) → (f16x2 of bytes 0, 1; f16x2 of bytes 2, 3),
        exact (:func:`e4m3_f16_bits_reference`; a NaN code gives an f16 NaN)."""
        b = _u32(w)
        h = [e4m3_f16_bits_reference((b >> (8 * i)) & 0xFF) for i in range(4)]
        return np.uint32(h[0] | (h[1] << 16)), np.uint32(h[2] | (h[3] << 16))

    def pack_e4m3x4(x0, x1, x2, x3):
        """Four float32 → one register of four e4m3fn codes, ``x0`` in the low byte (round to nearest
        even, saturating to ±448, NaN to 0x7F: :func:`e4m3_bits_reference`)."""
        return np.uint32(e4m3_bits_reference(x0) | (e4m3_bits_reference(x1) << 8)
                         | (e4m3_bits_reference(x2) << 16) | (e4m3_bits_reference(x3) << 24))

    def sub_f16x2(a, b):
        """Both f16 halves of ``a`` minus those of ``b``, rounded to nearest even (``sub.rn.f16x2``)."""
        x, y = half_lo_hi(a, "f16"), half_lo_hi(b, "f16")  # float64: the exact difference, rounded once
        return np.uint32(f16_bits(np.float16(x[0] - y[0])) | (f16_bits(np.float16(x[1] - y[1])) << 16))

    def mad_u32(a, b, c):
        """``a·b + c`` modulo 2³² (the 32-bit ``mul.lo``/``add`` of the GPU)."""
        return np.uint32((int(a) * int(b) + int(c)) & _MASK32)

    def add_u32(a, b):
        """``a + b`` modulo 2³²."""
        return np.uint32((int(a) + int(b)) & _MASK32)

    def _flat(arr, i, n):
        """Elements ``i … i+n−1`` of the C-contiguous array ``arr`` read as one flat array."""
        a = np.asarray(_np(arr))
        if not a.flags.c_contiguous:
            raise ValueError("flat loads need a C-contiguous array")
        if not 0 <= i <= a.size - n:
            raise IndexError(f"flat elements {i}..{i + n - 1} out of bounds for size {a.size}")
        return a.reshape(-1)[i:i + n]

    def _u32_index(row):
        if not 0 <= int(row) <= _MASK32:
            raise IndexError(f"row index {int(row)} is not a 32-bit unsigned value")
        return int(row)

    def _words_at(arr, row, n, col, off, k):
        if np.asarray(_np(arr)).itemsize != 4:
            raise TypeError("ld_global_v*_at reads an array of 32-bit words")
        i = _u32_index(row) * int(n) + int(col) + int(off)
        if i % k:
            raise ValueError(f"flat word {i} is not {4 * k}-byte aligned")
        return tuple(np.uint32(w) for w in _flat(arr, i, k).view(np.uint32))

    def ld_global_v4_at(arr, row, n, col, off):
        """Four 32-bit words at flat word ``row·n + col + off`` of ``arr`` (16 bytes, ``row`` a 32-bit index;
        on the GPU ``arr + col`` is computed once where ``col`` is loop-invariant, ``off`` a constant)."""
        return _words_at(arr, row, n, col, off, 4)

    def ld_global_v2_at(arr, row, n, col, off):
        """Two 32-bit words at flat word ``row·n + col + off`` of ``arr`` (8 bytes, ``row`` a 32-bit index)."""
        return _words_at(arr, row, n, col, off, 2)

    def ld_at(arr, i):
        """Flat element ``i`` (a 32-bit index) of ``arr``."""
        return _flat(arr, _u32_index(i), 1)[0]

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import _intrinsic, intrinsic

    intrinsic_literal = _intrinsic(target="cuda", prefer_literal=True)

    _i16 = ir.IntType(16)
    _i32 = ir.IntType(32)
    _f32 = ir.FloatType()

    def asm_call(builder, ret, argtys, text, cons, args, side_effect=False):
        fnty = ir.FunctionType(ret, argtys)
        return builder.call(ir.InlineAsm(fnty, text, cons, side_effect=side_effect), args)

    def _elem_ptr(context, builder, aryty, ary, idxtys, idxs):
        arr = context.make_array(aryty)(context, builder, value=ary)
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(idxs, idxtys)]
        return cgutils.get_item_pointer(context, builder, aryty, arr, inds, wraparound=False)

    def shared_addr(builder, ptr):
        """Generic pointer into a shared array → 32-bit shared-window address."""
        sptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
        return builder.ptrtoint(sptr, _i32)

    def global_ptr(builder, ptr):
        gptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 1))
        return builder.ptrtoint(gptr, ir.IntType(64))

    def _make_mma(ptx):
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            regs = (a0, a1, a2, a3, b0, b1)
            accs = (c0, c1, c2, c3)
            if not all(isinstance(r, types.Integer) for r in regs):
                return None
            if not all(isinstance(c, (types.Float, types.Integer)) for c in accs):
                return None
            sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, sig, args):
                ret = ir.LiteralStructType([_f32] * 4)
                res = asm_call(builder, ret, [_i32] * 6 + [_f32] * 4,
                           ptx + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                           "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", list(args))
                vals = [builder.extract_value(res, i) for i in range(4)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return mma

    mma_f16 = _make_mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    mma_bf16 = _make_mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    mma_tf32 = _make_mma("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")

    def _make_ldmatrix(trans):
        text = ("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "")
                + ".shared.b16 {$0,$1,$2,$3}, [$4];")

        @intrinsic
        def ldm(typingctx, smem, row, col):
            if not (isinstance(smem, types.Array) and smem.ndim == 2):
                return None
            sig = types.UniTuple(types.uint32, 4)(smem, row, col)

            def codegen(context, builder, sig, args):
                ptr = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
                ret = ir.LiteralStructType([_i32] * 4)
                res = asm_call(builder, ret, [_i32], text, "=r,=r,=r,=r,r,~{memory}",
                           [shared_addr(builder, ptr)], side_effect=True)
                vals = [builder.extract_value(res, i) for i in range(4)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return ldm

    ldmatrix_x4 = _make_ldmatrix(False)
    ldmatrix_x4_trans = _make_ldmatrix(True)

    @intrinsic
    def cp_async16(typingctx, dst, drow, dcol, src, sb, srow, scol, valid):
        if not (isinstance(dst, types.Array) and dst.ndim == 2
                and isinstance(src, types.Array) and src.ndim == 3):
            return None
        sig = types.void(dst, drow, dcol, src, sb, srow, scol, types.boolean)

        def codegen(context, builder, sig, args):
            dptr = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:3], args[1:3])
            sptr = _elem_ptr(context, builder, sig.args[3], args[3], sig.args[4:7], args[4:7])
            nbytes = builder.select(args[7], ir.Constant(_i32, 16), ir.Constant(_i32, 0))
            asm_call(builder, ir.VoidType(), [_i32, ir.IntType(64), _i32],
                 "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                 [shared_addr(builder, dptr), global_ptr(builder, sptr), nbytes], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    def _make_cp_async_flat(hint=""):
        """``cp.async.cg.shared.global{hint}`` of 16 bytes at flat element offsets."""
        text = f"cp.async.cg.shared.global{hint} [$0], [$1], 16, $2;"

        @intrinsic
        def cp_async_flat(typingctx, dst, doff, src, soff, valid):
            if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
                    and isinstance(doff, types.Integer) and isinstance(soff, types.Integer)):
                return None
            sig = types.void(dst, types.intp, src, types.intp, types.boolean)

            def codegen(context, builder, sig, args):
                d = context.make_array(sig.args[0])(context, builder, value=args[0])
                s_ = context.make_array(sig.args[2])(context, builder, value=args[2])
                dptr = builder.gep(d.data, [args[1]])
                sptr = builder.gep(s_.data, [args[3]])
                nbytes = builder.select(args[4], ir.Constant(_i32, 16), ir.Constant(_i32, 0))
                asm_call(builder, ir.VoidType(), [_i32, ir.IntType(64), _i32], text, "r,l,r,~{memory}",
                     [shared_addr(builder, dptr), global_ptr(builder, sptr), nbytes], side_effect=True)
                return context.get_dummy_value()

            return sig, codegen

        return cp_async_flat

    cp_async16_flat = _make_cp_async_flat()
    cp_async16_flat_l2_256 = _make_cp_async_flat(".L2::256B")

    def _cp_async_at_codegen(size, context, builder, sig, args, sptr):
        """``cp.async.ca`` of ``size`` bytes from the global ``sptr`` to flat element ``args[1]`` (32-bit) of the
        shared array ``args[0]``; ``args[-1]``: valid (else zero-fill, nothing read)."""
        d = context.make_array(sig.args[0])(context, builder, value=args[0])
        doff = builder.zext(context.cast(builder, args[1], sig.args[1], types.uint32), ir.IntType(64))
        dptr = builder.gep(d.data, [doff])
        nbytes = builder.select(args[-1], ir.Constant(_i32, size), ir.Constant(_i32, 0))
        asm_call(builder, ir.VoidType(), [_i32, ir.IntType(64), _i32],
             f"cp.async.ca.shared.global [$0], [$1], {size}, $2;", "r,l,r,~{memory}",
             [shared_addr(builder, dptr), global_ptr(builder, sptr), nbytes], side_effect=True)
        return context.get_dummy_value()

    @intrinsic
    def cp_async16_at_ca(typingctx, dst, doff, src, row, n, col, off, valid):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and src.layout == "C"
                and src.dtype.bitwidth == 32 and all(isinstance(x, types.Integer) for x in (doff, row, n, col, off))):
            return None
        sig = types.void(dst, doff, src, row, n, col, off, types.boolean)

        def codegen(context, builder, sig, args):
            sptr = flat_ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3], args[4], args[5:7],
                             sig.args[4:7])
            return _cp_async_at_codegen(16, context, builder, sig, args, sptr)

        return sig, codegen

    @intrinsic
    def cp_async4_at(typingctx, dst, doff, src, i, valid):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and src.layout == "C"
                and dst.dtype.bitwidth == 32 and src.dtype.bitwidth == 32
                and isinstance(doff, types.Integer) and isinstance(i, types.Integer)):
            return None
        sig = types.void(dst, doff, src, i, types.boolean)

        def codegen(context, builder, sig, args):
            sptr = flat_ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            return _cp_async_at_codegen(4, context, builder, sig, args, sptr)

        return sig, codegen

    @intrinsic
    def cp_async_commit(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            asm_call(builder, ir.VoidType(), [], "cp.async.commit_group;", "~{memory}", [], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic_literal
    def cp_async_wait(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            return None
        count = int(n.literal_value)
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            asm_call(builder, ir.VoidType(), [], f"cp.async.wait_group {count};", "~{memory}", [],
                 side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    def _ld_global_nc_words(context, builder, sig, ptr, n):
        """``ld.global.nc.v{n}.u32`` at ``ptr`` (generic): the n words as the tuple ``sig`` returns."""
        regs = ",".join(f"${i}" for i in range(n))
        ret = ir.LiteralStructType([_i32] * n)
        res = asm_call(builder, ret, [ir.IntType(64)], f"ld.global.nc.v{n}.u32 {{{regs}}}, [${n}];",
                   ",".join(["=r"] * n) + ",l", [global_ptr(builder, ptr)], side_effect=True)
        vals = [builder.extract_value(res, i) for i in range(n)]
        return context.make_tuple(builder, sig.return_type, vals)

    def _make_ld_global(n):
        """``ld.global.nc.v{n}.u32``: n 32-bit words at ``arr[b, r, c]`` of a 3-D array (n = 2: an
        array of 32-bit words)."""

        @intrinsic
        def ld_global(typingctx, arr, b, r, c):
            if not (isinstance(arr, types.Array) and arr.ndim == 3 and (n == 4 or arr.dtype.bitwidth == 32)):
                return None
            sig = types.UniTuple(types.uint32, n)(arr, b, r, c)

            def codegen(context, builder, sig, args):
                ptr = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
                return _ld_global_nc_words(context, builder, sig, ptr, n)

            return sig, codegen

        return ld_global

    ld_global_v4 = _make_ld_global(4)
    ld_global_v2 = _make_ld_global(2)

    @intrinsic
    def st_shared_v4(typingctx, arr, r, c, x0, x1, x2, x3):
        if not (isinstance(arr, types.Array) and arr.ndim == 2):
            return None
        sig = types.void(arr, r, c, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:3], args[1:3])
            asm_call(builder, ir.VoidType(), [_i32] * 5, "st.shared.v4.u32 [$0], {$1,$2,$3,$4};",
                 "r,r,r,r,r,~{memory}", [shared_addr(builder, ptr)] + list(args[3:]), side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def ld_shared_v4(typingctx, arr, r, c):
        if not (isinstance(arr, types.Array) and arr.ndim == 2):
            return None
        sig = types.UniTuple(types.uint32, 4)(arr, r, c)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
            ret = ir.LiteralStructType([_i32] * 4)
            res = asm_call(builder, ret, [_i32], "ld.shared.v4.u32 {$0,$1,$2,$3}, [$4];",
                       "=r,=r,=r,=r,r,~{memory}", [shared_addr(builder, ptr)], side_effect=True)
            vals = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def unpack_bf16x2(typingctx, w):
        if not isinstance(w, types.Integer):
            return None
        sig = types.UniTuple(types.float32, 2)(w)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.uint32)
            lo = builder.bitcast(builder.shl(x, ir.Constant(_i32, 16)), _f32)
            hi = builder.bitcast(builder.and_(x, ir.Constant(_i32, 0xFFFF0000)), _f32)
            return context.make_tuple(builder, sig.return_type, [lo, hi])

        return sig, codegen

    @intrinsic
    def byte_perm(typingctx, a, b, sel):
        if not all(isinstance(x, types.Integer) for x in (a, b, sel)):
            return None
        sig = types.uint32(a, b, sel)

        def codegen(context, builder, sig, args):
            xs = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return asm_call(builder, _i32, [_i32] * 3, "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", xs)

        return sig, codegen

    @intrinsic
    def unpack_f16x2(typingctx, w):
        if not isinstance(w, types.Integer):
            return None
        sig = types.UniTuple(types.float32, 2)(w)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.uint32)
            res = asm_call(builder, ir.LiteralStructType([_f32] * 2), [_i32],
                       "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
                       "=f,=f,r", [x])
            vals = [builder.extract_value(res, i) for i in range(2)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def u32_as_f32(typingctx, x):
        if not isinstance(x, types.Integer):
            return None
        sig = types.float32(x)

        def codegen(context, builder, sig, args):
            return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.uint32), _f32)

        return sig, codegen

    @intrinsic
    def rows_head_major(typingctx, a, s, n):
        """Rows ``s … s+n−1`` of a 3-D (tokens, heads, W) array as a (heads, n, W) view (layout A):
        the shape and strides of the first two axes swapped, the data pointer at row ``s``."""
        if not (isinstance(a, types.Array) and a.ndim == 3
                and isinstance(s, types.Integer) and isinstance(n, types.Integer)):
            return None
        retty = a.copy(layout="A")
        sig = retty(a, s, n)

        def codegen(context, builder, sig, args):
            from numba.cuda.np.arrayobj import populate_array

            aryty = sig.args[0]
            ary = context.make_array(aryty)(context, builder, value=args[0])
            start = context.cast(builder, args[1], sig.args[1], types.intp)
            rows = context.cast(builder, args[2], sig.args[2], types.intp)
            zero = context.get_constant(types.intp, 0)
            data = cgutils.get_item_pointer(context, builder, aryty, ary, [start, zero, zero], wraparound=False)
            shape = cgutils.unpack_tuple(builder, ary.shape, 3)
            strides = cgutils.unpack_tuple(builder, ary.strides, 3)
            out = context.make_array(sig.return_type)(context, builder)
            populate_array(out, data=data, shape=cgutils.pack_array(builder, [shape[1], rows, shape[2]]),
                           strides=cgutils.pack_array(builder, [strides[1], strides[0], strides[2]]),
                           itemsize=ary.itemsize, meminfo=None)
            return out._getvalue()

        return sig, codegen

    @intrinsic
    def lds(typingctx, arr, r, c):
        if not (isinstance(arr, types.Array) and arr.ndim == 2):
            return None
        sig = arr.dtype(arr, r, c)

        def codegen(context, builder, sig, args):
            # a plain load (the compiler may schedule and combine it), without
            # numba's negative-index wrap-around, so that addresses of an
            # unrolled loop fold into one base register plus constant offsets
            return builder.load(_elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:]))

        return sig, codegen

    def _make_pack(cvt):
        @intrinsic
        def pack(typingctx, lo, hi):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                lo, hi = args
                # cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the upper half
                return asm_call(builder, _i32, [_f32, _f32], cvt + " $0, $1, $2;", "=r,f,f", [hi, lo])

            return sig, codegen

        return pack

    pack_f16x2 = _make_pack("cvt.rn.f16x2.f32")
    pack_bf16x2 = _make_pack("cvt.rn.bf16x2.f32")

    @intrinsic
    def pack_b16x2(typingctx, lo, hi):
        sig = types.uint32(types.uint16, types.uint16)

        def codegen(context, builder, sig, args):
            return asm_call(builder, _i32, [_i16, _i16], "mov.b32 $0, {$1, $2};", "=r,h,h", list(args))

        return sig, codegen

    @intrinsic
    def cvt_e4m3x4_f16x2(typingctx, w):
        if not isinstance(w, types.Integer):
            return None
        sig = types.UniTuple(types.uint32, 2)(w)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.uint32)
            res = asm_call(builder, ir.LiteralStructType([_i32] * 2), [_i32],
                       "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
                       "cvt.rn.f16x2.e4m3x2 $1, hi; }", "=r,=r,r", [x])
            vals = [builder.extract_value(res, i) for i in range(2)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def pack_e4m3x4(typingctx, x0, x1, x2, x3):
        sig = types.uint32(types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            # cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte of the 16-bit d
            return asm_call(builder, _i32, [_f32] * 4,
                        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }", "=r,f,f,f,f",
                        list(args))

        return sig, codegen

    @intrinsic
    def sub_f16x2(typingctx, a, b):
        if not (isinstance(a, types.Integer) and isinstance(b, types.Integer)):
            return None
        sig = types.uint32(a, b)

        def codegen(context, builder, sig, args):
            xs = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return asm_call(builder, _i32, [_i32] * 2, "sub.rn.f16x2 $0, $1, $2;", "=r,r,r", xs)

        return sig, codegen

    @intrinsic
    def mad_u32(typingctx, a, b, c):
        if not all(isinstance(x, types.Integer) for x in (a, b, c)):
            return None
        sig = types.uint32(a, b, c)

        def codegen(context, builder, sig, args):
            x, y, z = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return builder.add(builder.mul(x, y), z)  # plain i32 arithmetic: LLVM may fold it (mad, lea)

        return sig, codegen

    @intrinsic
    def add_u32(typingctx, a, b):
        if not all(isinstance(x, types.Integer) for x in (a, b)):
            return None
        sig = types.uint32(a, b)

        def codegen(context, builder, sig, args):
            x, y = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return builder.add(x, y)

        return sig, codegen

    def flat_ptr(context, builder, aryty, ary, rowty, row, n=None, cols=(), coltys=()):
        """Pointer to flat element ``zext(u32 row)·n + col + off`` of a C-contiguous array (generic space):
        ``base = data + col`` kept as one opaque value (a ``mov``: the compiler hoists it out of a loop where
        ``col`` is invariant instead of reassociating it into the row's product), then ``+ zext(row)·n``
        (one ``mad.wide.u32``), then ``+ off`` (a constant: the load's immediate offset)."""
        data = context.make_array(aryty)(context, builder, value=ary).data
        i64 = ir.IntType(64)
        size = ir.Constant(i64, context.get_abi_sizeof(context.get_data_type(aryty.dtype)))
        base = builder.bitcast(data, ir.PointerType(ir.IntType(8)))
        off = builder.zext(context.cast(builder, row, rowty, types.uint32), i64)
        if n is None:
            return builder.bitcast(builder.gep(base, [builder.mul(off, size)]), data.type)
        col, cst = [builder.mul(context.cast(builder, v, t, types.int64), size) for v, t in zip(cols, coltys[1:])]
        base = builder.ptrtoint(builder.gep(base, [col]), i64)
        base = asm_call(builder, i64, [i64], "mov.b64 $0, $1;", "=l,l", [base])
        base = builder.inttoptr(base, ir.PointerType(ir.IntType(8)))
        off = builder.mul(off, builder.mul(context.cast(builder, n, coltys[0], types.int64), size))
        return builder.bitcast(builder.gep(builder.gep(base, [off]), [cst]), data.type)

    def _make_ld_global_at(n):
        """``ld.global.nc.v{n}.u32`` at flat word ``row·m + col + off`` of a C-contiguous array of 32-bit words."""

        @intrinsic
        def ld_global_at(typingctx, arr, row, m, col, off):
            if not (isinstance(arr, types.Array) and arr.layout == "C" and arr.dtype.bitwidth == 32
                    and all(isinstance(x, types.Integer) for x in (row, m, col, off))):
                return None
            sig = types.UniTuple(types.uint32, n)(arr, row, m, col, off)

            def codegen(context, builder, sig, args):
                ptr = flat_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], args[2], args[3:],
                                sig.args[2:])
                return _ld_global_nc_words(context, builder, sig, ptr, n)

            return sig, codegen

        return ld_global_at

    ld_global_v4_at = _make_ld_global_at(4)
    ld_global_v2_at = _make_ld_global_at(2)

    @intrinsic
    def ld_at(typingctx, arr, i):
        if not (isinstance(arr, types.Array) and arr.layout == "C" and isinstance(i, types.Integer)):
            return None
        sig = arr.dtype(arr, i)

        def codegen(context, builder, sig, args):
            ptr = flat_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            gptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 1))
            return builder.load(gptr)  # a plain load: the compiler may schedule it

        return sig, codegen

    @intrinsic
    def to_tf32(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            return asm_call(builder, _i32, [_f32], "cvt.rna.tf32.f32 $0, $1;", "=r,f", list(args))

        return sig, codegen
