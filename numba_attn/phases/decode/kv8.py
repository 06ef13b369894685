"""8-bit KV caches: fp8 e4m3 and int8 codes decoded to float32 or f16x2, exactly, in a few integer
instructions per four codes."""
from __future__ import annotations

from numba import float32, uint32

from numba_attn.gpu.intrinsics import byte_perm, u32_as_f32, unpack_f16x2
from numba_attn.gpu.jit import device

E4M3_UNIT = float32(256.0)  # e4m3x4_f16x2's values are the codes' values / 256: scales carry the 256


NAN_BITS = uint32(0x7FC00000)


@device
def e4m3x4_f16x2(w):
    """Four float8 e4m3fn codes (the bytes of ``w``, low first) → two f16x2 registers holding
    the codes' values / 256, exact, in four integer instructions: the byte moved to the top of a
    half (``prmt``), its sign kept, its 7 exponent and mantissa bits shifted right by one, so
    that e4m3's exponent (bias 7) lands in f16's (bias 15): every normal and subnormal e4m3
    value / 2⁸ is an f16 normal or subnormal with the same bits. The NaN codes (0x7F, 0xFF)
    come out finite: :func:`e4m3_nan_bytes` finds them."""
    lo = byte_perm(w, uint32(0), uint32(0x1404))  # halves: b0 << 8, b1 << 8
    hi = byte_perm(w, uint32(0), uint32(0x3424))  # b2 << 8, b3 << 8
    return ((lo & uint32(0x80008000)) | ((lo >> uint32(1)) & uint32(0x3F803F80)),
            (hi & uint32(0x80008000)) | ((hi >> uint32(1)) & uint32(0x3F803F80)))


@device
def e4m3_nan_bytes(w):
    """Non-zero when a byte of ``w`` is an e4m3fn NaN code (its low 7 bits all ones): a byte's
    low 7 bits plus one carries into its top bit only then (and never into the next byte)."""
    return ((w & uint32(0x7F7F7F7F)) + uint32(0x01010101)) & uint32(0x80808080)


@device
def e4m3_nan_fix(w, x, i):
    """``x`` (the value of byte ``i`` of ``w``), or NaN when that byte is a NaN code."""
    return u32_as_f32(NAN_BITS) if ((w >> uint32(8 * i)) & uint32(0x7F)) == uint32(0x7F) else x


@device
def e4m3x4_f32(w):
    """Four float8 e4m3fn codes → four float32 of their values / 256 (exact; NaN codes NaN)."""
    a, b = e4m3x4_f16x2(w)
    x0, x1 = unpack_f16x2(a)
    x2, x3 = unpack_f16x2(b)
    if e4m3_nan_bytes(w):  # rare: a NaN in the cache propagates
        x0 = e4m3_nan_fix(w, x0, 0)
        x1 = e4m3_nan_fix(w, x1, 1)
        x2 = e4m3_nan_fix(w, x2, 2)
        x3 = e4m3_nan_fix(w, x3, 3)
    return x0, x1, x2, x3


@device
def e4m3x4_f32_finite(w):
    """:func:`e4m3x4_f32` without the NaN patch (a NaN code comes out finite): for a caller
    that tests the codes for NaN itself (:func:`e4m3_nan_bytes`), once per many words."""
    a, b = e4m3x4_f16x2(w)
    x0, x1 = unpack_f16x2(a)
    x2, x3 = unpack_f16x2(b)
    return x0, x1, x2, x3


@device
def int8x4_f32(w):
    """Four int8 codes → four float32, exact, without integer-to-float conversions (a quarter-rate
    instruction): the biased byte (code + 128) placed in the mantissa of 2²³ (``prmt``), then
    2²³ + 128 subtracted."""
    u = w ^ uint32(0x80808080)
    return (u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7650))) - float32(8388736.0),
            u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7651))) - float32(8388736.0),
            u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7652))) - float32(8388736.0),
            u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7653))) - float32(8388736.0))


def kv8_decoder(kv_format: int):
    """(four codes → four float32, what the scales are multiplied by) of an 8-bit cache format
    (``kv_format`` 1: e4m3fn, values / 256, so 256; 2: int8, 1)."""
    return (e4m3x4_f32, E4M3_UNIT) if kv_format == 1 else (int8x4_f32, float32(1.0))
