"""Bit-level models of the registers the intrinsics use (host NumPy): rounding to f16/bf16/tf32, the
float8 e4m3fn codes, ``prmt``, and the two elements of a packed register. The simulator fallbacks of
:mod:`numba_attn.gpu.intrinsics` compute with them, and the tests build and read registers with them.

A packed register (two f16/bf16 halves, or one tf32) is a ``uint32`` holding the bit pattern the GPU
holds: the element with the lower column/k index in the low 16 bits.
"""
from __future__ import annotations

import numpy as np

MASK32 = 0xFFFFFFFF


def checked_u32(x) -> int:
    """A register value as a Python int, refusing anything that is not a 32-bit
    unsigned integer (a float passed where a packed register belongs)."""
    if isinstance(x, (bool, float, np.floating)):
        raise TypeError(f"expected a packed 32-bit register (uint32), got {type(x).__name__} {x!r}")
    v = int(x)
    if not 0 <= v <= MASK32:
        raise ValueError(f"register value {v:#x} does not fit 32 bits")
    return v


def byte_perm_reference(a, b, sel) -> int:
    """``prmt.b32 d, a, b, sel`` (default mode, CUDA's ``__byte_perm``): byte i of d is byte
    ``n & 7`` of the 8 bytes {b, a} (a the low four), n the i-th selector nibble; with bit 3 of n
    set, that byte's sign bit replicated (0x00 or 0xFF)."""
    src = checked_u32(a) | (checked_u32(b) << 32)
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
    return ((b + 0x1000) & 0xFFFFE000) & MASK32


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
    r = checked_u32(reg)
    lo, hi = r & 0xFFFF, r >> 16
    if kind == "f16":
        return tuple(float(np.uint16(h).view(np.float16)) for h in (lo, hi))
    if kind == "bf16":
        return tuple(float(np.uint32(h << 16).view(np.float32)) for h in (lo, hi))
    raise ValueError(kind)


def tf32_value(reg) -> float:
    """The tf32 value the tensor core reads from a 32-bit register (low 13 bits ignored)."""
    return float(np.uint32(checked_u32(reg) & 0xFFFFE000).view(np.float32))
