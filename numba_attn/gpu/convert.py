"""Conversions and packing of registers, and 32-bit integer arithmetic.

=========================  ==============================================
``pack_f16x2``             ``cvt.rn.f16x2.f32`` (two floats → packed halves, the first in the low half)
``pack_bf16x2``            ``cvt.rn.bf16x2.f32``
``pack_b16x2``             ``mov.b32 {lo, hi}`` (two 16-bit patterns → one register)
``unpack_f16x2``           ``cvt.f32.f16`` of both halves of a register (exact)
``unpack_bf16x2``          one register of two bf16 → two float32 (exact: the bits shifted, no instruction)
``to_tf32``                ``cvt.rna.tf32.f32``
``cvt_e4m3x4_f16x2``       ``cvt.rn.f16x2.e4m3x2`` of both halves of a word (four fp8 e4m3fn codes → two f16x2;
                           sm_89+)
``pack_e4m3x4``            ``cvt.rn.satfinite.e4m3x2.f32`` twice (four floats → four fp8 e4m3fn codes, the
                           first in the low byte; sm_89+)
``sub_f16x2``              ``sub.rn.f16x2`` (both halves)
``byte_perm``              ``prmt.b32`` (CUDA's ``__byte_perm``: four bytes picked from two words)
``u32_as_f32``             ``mov.b32`` (a 32-bit pattern read as float32)
``f32_as_u32``             ``mov.b32`` (a float32's 32-bit pattern)
``add_rm_f32``             ``add.rm.f32`` (a + b rounded toward -inf: with 1.5·2^23 added, floor(a) in the low bits)
``mad_u32``                ``a·b + c`` in 32-bit unsigned arithmetic (numba widens integer arithmetic to 64 bits)
``add_u32``                ``a + b`` in 32-bit unsigned arithmetic
=========================  ==============================================

In the simulator each is computed from the bit models of :mod:`numba_attn.gpu.bits`.
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

if IS_SIMULATOR:
    from numba_attn.gpu.bits import (MASK32, bf16_bits, byte_perm_reference, checked_u32, e4m3_bits_reference,
                                     e4m3_f16_bits_reference, f16_bits, half_lo_hi, tf32_bits)

    def unpack_bf16x2(w):
        """One register of two bf16 → (low, high) as float32 (exact)."""
        b = checked_u32(w)
        lo, hi = np.array([(b & 0xFFFF) << 16, b & 0xFFFF0000], np.uint32).view(np.float32)
        return np.float32(lo), np.float32(hi)

    def byte_perm(a, b, sel):
        """``prmt.b32``: four bytes picked from the eight of {b, a} (:func:`byte_perm_reference`)."""
        return np.uint32(byte_perm_reference(a, b, sel))

    def unpack_f16x2(w):
        """One register of two f16 → (low, high) as float32 (exact)."""
        lo, hi = np.array([checked_u32(w)], np.uint32).view(np.float16)
        return np.float32(lo), np.float32(hi)

    def u32_as_f32(x):
        """A 32-bit pattern read as float32."""
        return np.array([checked_u32(x)], np.uint32).view(np.float32)[0]

    def f32_as_u32(x):
        """A float32's 32-bit pattern (the value rounded to float32 first, as a register holds it)."""
        return np.array([x], np.float32).view(np.uint32)[0]

    def add_rm_f32(a, b):
        """a + b of two float32, rounded toward -inf (``add.rm.f32``): the exact sum (float64: exact for the
        operands this takes) rounded down."""
        exact = float(np.float32(a)) + float(np.float32(b))
        r = np.float32(exact)
        return np.nextafter(r, np.float32(-np.inf)) if float(r) > exact else r

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
        b = checked_u32(w)
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
        return np.uint32((int(a) * int(b) + int(c)) & MASK32)

    def add_u32(a, b):
        """``a + b`` modulo 2³²."""
        return np.uint32((int(a) + int(b)) & MASK32)

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.inline_ptx import F32, I16, I32, asm_call

    @intrinsic
    def unpack_bf16x2(typingctx, w):
        if not isinstance(w, types.Integer):
            return None
        sig = types.UniTuple(types.float32, 2)(w)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.uint32)
            lo = builder.bitcast(builder.shl(x, ir.Constant(I32, 16)), F32)
            hi = builder.bitcast(builder.and_(x, ir.Constant(I32, 0xFFFF0000)), F32)
            return context.make_tuple(builder, sig.return_type, [lo, hi])

        return sig, codegen

    def _u32_asm(nargs, ptx):
        """The intrinsic ``f(a, b, ...)`` of ``nargs`` integers (as uint32) → uint32 by ``ptx``."""
        def codegen(context, builder, sig, args):
            ys = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return asm_call(builder, I32, [I32] * nargs, ptx, ",".join(["=r"] + ["r"] * nargs), ys)

        def typed(*xs):
            return (types.uint32(*xs), codegen) if all(isinstance(x, types.Integer) for x in xs) else None

        def two(typingctx, a, b):
            return typed(a, b)

        def three(typingctx, a, b, c):
            return typed(a, b, c)

        return intrinsic({2: two, 3: three}[nargs])  # (an intrinsic takes no *args)

    def _u32_to_pair(ptx, reg, ty):
        """The intrinsic ``f(w)`` of one integer (as uint32) → two ``ty`` by ``ptx`` (``reg``: their constraint)."""
        def typer(typingctx, w):
            if not isinstance(w, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                x = context.cast(builder, args[0], sig.args[0], types.uint32)
                res = asm_call(builder, ir.LiteralStructType([F32 if reg == "f" else I32] * 2), [I32], ptx,
                               f"={reg},={reg},r", [x])
                vals = [builder.extract_value(res, i) for i in range(2)]
                return context.make_tuple(builder, sig.return_type, vals)

            return types.UniTuple(ty, 2)(w), codegen

        return intrinsic(typer)

    byte_perm = _u32_asm(3, "prmt.b32 $0, $1, $2, $3;")
    unpack_f16x2 = _u32_to_pair(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }", "f", types.float32)

    @intrinsic
    def f32_as_u32(typingctx, x):
        if not isinstance(x, types.Float):
            return None
        sig = types.uint32(x)

        def codegen(context, builder, sig, args):
            return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.float32), I32)

        return sig, codegen

    @intrinsic
    def u32_as_f32(typingctx, x):
        if not isinstance(x, types.Integer):
            return None
        sig = types.float32(x)

        def codegen(context, builder, sig, args):
            return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.uint32), F32)

        return sig, codegen

    def _make_pack(cvt):
        @intrinsic
        def pack(typingctx, lo, hi):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                lo, hi = args
                # cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the upper half
                return asm_call(builder, I32, [F32, F32], cvt + " $0, $1, $2;", "=r,f,f", [hi, lo])

            return sig, codegen

        return pack

    pack_f16x2 = _make_pack("cvt.rn.f16x2.f32")
    pack_bf16x2 = _make_pack("cvt.rn.bf16x2.f32")

    @intrinsic
    def pack_b16x2(typingctx, lo, hi):
        sig = types.uint32(types.uint16, types.uint16)

        def codegen(context, builder, sig, args):
            return asm_call(builder, I32, [I16, I16], "mov.b32 $0, {$1, $2};", "=r,h,h", list(args))

        return sig, codegen

    cvt_e4m3x4_f16x2 = _u32_to_pair("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
                                    "cvt.rn.f16x2.e4m3x2 $1, hi; }", "r", types.uint32)

    @intrinsic
    def pack_e4m3x4(typingctx, x0, x1, x2, x3):
        sig = types.uint32(types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            # cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte of the 16-bit d
            return asm_call(builder, I32, [F32] * 4,
                        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }", "=r,f,f,f,f",
                        list(args))

        return sig, codegen

    sub_f16x2 = _u32_asm(2, "sub.rn.f16x2 $0, $1, $2;")

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

    @intrinsic
    def add_rm_f32(typingctx, a, b):
        sig = types.float32(types.float32, types.float32)

        def codegen(context, builder, sig, args):
            return asm_call(builder, F32, [F32, F32], "add.rm.f32 $0, $1, $2;", "=f,f,f", list(args))

        return sig, codegen

    @intrinsic
    def to_tf32(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            return asm_call(builder, I32, [F32], "cvt.rna.tf32.f32 $0, $1;", "=r,f", list(args))

        return sig, codegen
