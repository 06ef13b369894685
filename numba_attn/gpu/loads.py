"""Loads and stores of 32-bit words, and array views, without numba's index arithmetic.

=========================  ==============================================
``ld_global_v4``           ``ld.global.nc.v4.u32`` (128-bit read-only load) at ``arr[b, r, c]``
``ld_global_v2``           ``ld.global.nc.v2.u32`` (64-bit read-only load)
``ld_global_v4_at``        ``ld_global_v4`` at flat word ``row·n + col + off`` of a C-contiguous array of 32-bit
                           words, ``row`` a 32-bit index (one ``mad.wide.u32`` on ``arr + col``); ``_v2_at``: 8 bytes
``ld_at``                  ``ld.global`` of flat element ``i`` (a 32-bit index) of a C-contiguous array
``st_shared_v4``           ``st.shared.v4.u32`` (128-bit shared store)
``ld_shared_v4``           ``ld.shared.v4.u32`` (128-bit shared load, as uint32 words)
``st_shared_b16``          ``st.shared.b16``: the low 16 bits of a word at byte ``byte`` of a shared array
``st_shared_b32``          ``st.shared.b32``: a 32-bit word at byte ``byte`` (a multiple of 4) of a shared array;
                           ``ld_shared_b32``: ``ld.shared.b32``, the word there as uint32
``st_shared_f32x4``        ``st.shared.v4.f32``: four floats at float ``i`` (a multiple of 4) of a shared float32 array
``lds``                    ``arr[r, c]`` without negative-index wrap-around
``lds2``, ``ld_f32x4``     2 (4) floats at ``arr[r, c]`` of a 2-D float32 array by one 8 (16)-byte aligned load
``st_f32x4``               four floats stored at ``arr[r, c]`` of a 2-D float32 array by one 16-byte store
``rows_head_major``        ``a[s:s+n].transpose(1, 0, 2)`` (a view; numba's transpose needs a set)
=========================  ==============================================

``lds`` exists for speed, not for a new instruction: numba's ``arr[i, j]`` adds a wrap-around select for negative
indices, which hides from LLVM that the addresses of an unrolled fragment loop differ by constants.

Kernels see f16/bf16 tensors as ``uint32`` views (two elements per word): a 32-bit load of ``q[bh, row, w]`` is
the pair ``(row, 2w), (row, 2w+1)``. Vector accesses need aligned addresses; the fallbacks check them and the bounds.
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

if IS_SIMULATOR:
    from numba_attn.gpu.bits import checked_u32
    from numba_attn.gpu.inline_ptx import bytes16_at, flat_elements, host_array, index_u32

    def ld_global_v4(arr, b, r, c):
        """Four 32-bit words at ``arr[b, r, c]`` (16 bytes) as uint32."""
        words = bytes16_at(arr, (b, r, c)).view(np.uint32)
        return tuple(np.uint32(w) for w in words)

    def st_shared_v4(arr, r, c, x0, x1, x2, x3):
        """Store four 32-bit words at ``arr[r, c]`` (16 bytes)."""
        a = np.asarray(host_array(arr))
        bytes16_at(a, (r, c))
        n = 16 // a.itemsize
        words = np.array([checked_u32(x) for x in (x0, x1, x2, x3)], np.uint32)
        a[int(r), int(c):int(c) + n] = words.view(a.dtype)

    def st_shared_b16(arr, byte, bits):
        """Store the low 16 bits of ``bits`` at byte ``byte`` (even) of the shared array ``arr``."""
        a = np.asarray(host_array(arr)).reshape(-1).view(np.uint8)
        byte = int(byte)
        if byte % 2 or not 0 <= byte <= a.size - 2:
            raise IndexError(f"16-bit store at byte {byte} of a {a.size}-byte array (even, inside it)")
        a[byte:byte + 2] = np.array([checked_u32(bits) & 0xFFFF], np.uint16).view(np.uint8)

    def st_shared_b32(arr, byte, bits):
        """Store the 32-bit word ``bits`` at byte ``byte`` (a multiple of 4) of the shared array ``arr``."""
        a = np.asarray(host_array(arr)).reshape(-1).view(np.uint8)
        byte = int(byte)
        if byte % 4 or not 0 <= byte <= a.size - 4:
            raise IndexError(f"32-bit store at byte {byte} of a {a.size}-byte array (a multiple of 4, inside it)")
        a[byte:byte + 4] = np.array([checked_u32(bits)], np.uint32).view(np.uint8)

    def ld_shared_b32(arr, byte):
        """The 32-bit word at byte ``byte`` (a multiple of 4) of the shared array ``arr``, as uint32 (its bits as
        stored: no float conversion on the way)."""
        a = np.asarray(host_array(arr)).reshape(-1).view(np.uint8)
        byte = int(byte)
        if byte % 4 or not 0 <= byte <= a.size - 4:
            raise IndexError(f"32-bit load at byte {byte} of a {a.size}-byte array (a multiple of 4, inside it)")
        return np.uint32(a[byte:byte + 4].view(np.uint32)[0])

    def st_shared_f32x4(arr, i, x0, x1, x2, x3):
        """Store four floats at flat element ``i`` (a multiple of 4: 16-byte aligned) of a float32 array."""
        a = np.asarray(host_array(arr)).reshape(-1)
        i = int(i)
        if a.dtype != np.float32 or i % 4 or not 0 <= i <= a.size - 4:
            raise IndexError(f"16-byte float store at element {i} of a {a.size}-element {a.dtype} array "
                             "(float32, a multiple of 4, inside it)")
        a[i:i + 4] = np.array([x0, x1, x2, x3], np.float32)

    def ld_shared_v4(arr, r, c):
        """Four 32-bit words at ``arr[r, c]`` (16 bytes) of a 2-D shared array as uint32."""
        words = bytes16_at(arr, (r, c)).view(np.uint32)
        return tuple(np.uint32(w) for w in words)

    def ld_global_v2(arr, b, r, c):
        """Two 32-bit words at ``arr[b, r, c]`` (8 bytes, 8-byte aligned) as uint32."""
        a = np.asarray(host_array(arr))
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

    def _f32x4_at(arr, r, c):
        a = np.asarray(host_array(arr))
        if a.dtype != np.float32 or a.ndim != 2:
            raise TypeError(f"16-byte float access to a 2-D float32 array, not {a.ndim}-D {a.dtype}")
        bytes16_at(a, (r, c))  # 16-byte aligned, inside the row
        return a

    def ld_f32x4(arr, r, c):
        """``arr[r, c:c+4]`` of a 2-D float32 array (16 bytes: ``c`` a multiple of 4) as four float32."""
        a = _f32x4_at(arr, r, c)
        return tuple(np.float32(x) for x in a[int(r), int(c):int(c) + 4])

    def st_f32x4(arr, r, c, x0, x1, x2, x3):
        """Store four floats at ``arr[r, c:c+4]`` of a 2-D float32 array (16 bytes: ``c`` a multiple of 4)."""
        a = _f32x4_at(arr, r, c)
        a[int(r), int(c):int(c) + 4] = np.array([x0, x1, x2, x3], np.float32)

    def rows_head_major(a, s, n):
        """Rows ``s … s+n−1`` of a 3-D (tokens, heads, W) array as the (heads, n, W) view."""
        return np.asarray(host_array(a))[int(s):int(s) + int(n)].transpose(1, 0, 2)

    def lds(arr, r, c):
        """``arr[r, c]`` of a 2-D (shared) array, indices must be non-negative."""
        r, c = int(r), int(c)
        a = host_array(arr)
        if not (0 <= r < a.shape[0] and 0 <= c < a.shape[1]):
            raise IndexError(f"lds index ({r}, {c}) out of bounds for shape {a.shape}")
        return a[r, c]

    def lds2(arr, r, c):
        """``(arr[r, c], arr[r, c + 1])`` of a 2-D float32 (shared) array; ``c`` even (one 8-byte load on the GPU:
        the row's start must be 8-byte aligned, as every row of a float32 tile whose rows are an even count of
        elements and whose base is 8-byte aligned is)."""
        r, c = int(r), int(c)
        a = host_array(arr)
        if a.dtype != np.float32:
            raise TypeError(f"lds2 reads a float32 array, not {a.dtype}")
        if c % 2 or a.shape[1] % 2:
            raise ValueError(f"lds2 at column {c} of rows of {a.shape[1]}: both must be even (8-byte aligned)")
        if not (0 <= r < a.shape[0] and 0 <= c and c + 2 <= a.shape[1]):
            raise IndexError(f"lds2 index ({r}, {c}) out of bounds for shape {a.shape}")
        return a[r, c], a[r, c + 1]

    def _words_at(arr, row, n, col, off, k):
        if np.asarray(host_array(arr)).itemsize != 4:
            raise TypeError("ld_global_v*_at reads an array of 32-bit words")
        i = index_u32(row) * int(n) + int(col) + int(off)
        if i % k:
            raise ValueError(f"flat word {i} is not {4 * k}-byte aligned")
        return tuple(np.uint32(w) for w in flat_elements(arr, i, k).view(np.uint32))

    def ld_global_v4_at(arr, row, n, col, off):
        """Four 32-bit words at flat word ``row·n + col + off`` of ``arr`` (16 bytes, ``row`` a 32-bit index;
        on the GPU ``arr + col`` is computed once where ``col`` is loop-invariant, ``off`` a constant)."""
        return _words_at(arr, row, n, col, off, 4)

    def ld_global_v2_at(arr, row, n, col, off):
        """Two 32-bit words at flat word ``row·n + col + off`` of ``arr`` (8 bytes, ``row`` a 32-bit index)."""
        return _words_at(arr, row, n, col, off, 2)

    def ld_at(arr, i):
        """Flat element ``i`` (a 32-bit index) of ``arr``."""
        return flat_elements(arr, index_u32(i), 1)[0]

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.inline_ptx import (I32, asm_call, elem_ptr, flat_ptr, global_ptr, shared_addr,
                                           shared_x4_load)

    def _ld_global_nc_words(n, pointer):
        """The codegen of ``ld.global.nc.v{n}.u32`` at ``pointer(context, builder, sig, args)`` (generic): the n
        words as the tuple ``sig`` returns."""
        def codegen(context, builder, sig, args):
            regs = ",".join(f"${i}" for i in range(n))
            ret = ir.LiteralStructType([I32] * n)
            res = asm_call(builder, ret, [ir.IntType(64)], f"ld.global.nc.v{n}.u32 {{{regs}}}, [${n}];",
                           ",".join(["=r"] * n) + ",l", [global_ptr(builder, pointer(context, builder, sig, args))],
                           side_effect=True)
            vals = [builder.extract_value(res, i) for i in range(n)]
            return context.make_tuple(builder, sig.return_type, vals)

        return codegen

    def _make_ld_global(n):
        """``ld.global.nc.v{n}.u32``: n 32-bit words at ``arr[b, r, c]`` of a 3-D array (n = 2: an
        array of 32-bit words)."""
        codegen = _ld_global_nc_words(n, lambda context, builder, sig, args: elem_ptr(
            context, builder, sig.args[0], args[0], sig.args[1:], args[1:]))

        @intrinsic
        def ld_global(typingctx, arr, b, r, c):
            if not (isinstance(arr, types.Array) and arr.ndim == 3 and (n == 4 or arr.dtype.bitwidth == 32)):
                return None
            return types.UniTuple(types.uint32, n)(arr, b, r, c), codegen

        return ld_global

    ld_global_v4 = _make_ld_global(4)
    ld_global_v2 = _make_ld_global(2)

    @intrinsic
    def st_shared_v4(typingctx, arr, r, c, x0, x1, x2, x3):
        if not (isinstance(arr, types.Array) and arr.ndim == 2):
            return None
        sig = types.void(arr, r, c, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            ptr = elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:3], args[1:3])
            asm_call(builder, ir.VoidType(), [I32] * 5, "st.shared.v4.u32 [$0], {$1,$2,$3,$4};",
                 "r,r,r,r,r,~{memory}", [shared_addr(builder, ptr)] + list(args[3:]), side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    ld_shared_v4 = shared_x4_load("ld.shared.v4.u32 {$0,$1,$2,$3}, [$4];")

    def _make_st_shared(bits):
        """``st.shared.b{bits}``: the low ``bits`` of a word at a byte of a shared array. (An LLVM store through a
        shared-space pointer, not inline PTX: the compiler folds the constant part of the byte offsets of an
        unrolled loop into the instruction, instead of one address register a store.)"""
        width = ir.IntType(bits)

        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, value=args[0])
            p8 = builder.gep(builder.bitcast(a.data, ir.PointerType(ir.IntType(8))), [args[1]])
            p = builder.addrspacecast(builder.bitcast(p8, ir.PointerType(width)), ir.PointerType(width, 3))
            builder.store(builder.trunc(args[2], width) if bits < 32 else args[2], p, align=bits // 8)
            return context.get_dummy_value()

        @intrinsic
        def st_shared(typingctx, arr, byte, value):
            if not isinstance(arr, types.Array):
                return None
            return types.void(arr, types.intp, types.uint32), codegen

        return st_shared

    st_shared_b16 = _make_st_shared(16)
    st_shared_b32 = _make_st_shared(32)

    def _ld_shared_b32_codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, value=args[0])
        p8 = builder.gep(builder.bitcast(a.data, ir.PointerType(ir.IntType(8))), [args[1]])
        p = builder.addrspacecast(builder.bitcast(p8, ir.PointerType(ir.IntType(32))), ir.PointerType(ir.IntType(32), 3))
        return builder.load(p, align=4)

    @intrinsic
    def ld_shared_b32(typingctx, arr, byte):
        """``ld.shared.b32`` at byte ``byte`` of a shared array, as uint32 (an LLVM load through a shared-space
        pointer, as the stores: constant byte offsets fold into the instruction)."""
        if not isinstance(arr, types.Array):
            return None
        return types.uint32(arr, types.intp), _ld_shared_b32_codegen

    @intrinsic
    def st_shared_f32x4(typingctx, arr, i, x0, x1, x2, x3):
        """(An LLVM store of a 16-byte aligned <4 x float> through a shared-space pointer: one ``st.shared.v4.f32``,
        the constant part of ``i`` folded into the instruction.)"""
        if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
            return None
        sig = types.void(arr, types.intp, types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, value=args[0])
            vec = ir.VectorType(ir.FloatType(), 4)
            p = builder.addrspacecast(builder.bitcast(builder.gep(a.data, [args[1]]), ir.PointerType(vec)),
                                      ir.PointerType(vec, 3))
            v = ir.Constant(vec, ir.Undefined)
            for k in range(4):
                v = builder.insert_element(v, args[2 + k], ir.Constant(ir.IntType(32), k))
            builder.store(v, p, align=16)
            return context.get_dummy_value()

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
            return builder.load(elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:]))

        return sig, codegen

    def _make_ld_f32xn(n):
        """A load of ``n`` floats at ``arr[r, c]`` of a 2-D float32 array as one ``4·n``-byte aligned <n x float>
        load (``ld.shared.v2.f32``, ``LDG.E.128``...), where ``n`` scalar loads of neighbouring columns stay ``n``
        loads (the compiler cannot know their alignment); a plain load, coherent with the kernel's own stores (unlike
        ``ld.global.nc``)."""
        @intrinsic
        def ld_f32xn(typingctx, arr, r, c):
            if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == types.float32):
                return None
            sig = types.UniTuple(types.float32, n)(arr, r, c)

            def codegen(context, builder, sig, args):
                ptr = elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
                vec = ir.VectorType(ir.FloatType(), n)
                v = builder.load(builder.bitcast(ptr, ir.PointerType(vec, ptr.type.addrspace)), align=4 * n)
                vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(n)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return ld_f32xn

    lds2 = _make_ld_f32xn(2)
    ld_f32x4 = _make_ld_f32xn(4)

    @intrinsic
    def st_f32x4(typingctx, arr, r, c, x0, x1, x2, x3):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == types.float32):
            return None
        sig = types.void(arr, r, c, types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            ptr = elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:3], args[1:3])
            vec = ir.VectorType(ir.FloatType(), 4)
            v = ir.Constant(vec, ir.Undefined)
            for k in range(4):
                v = builder.insert_element(v, args[3 + k], ir.Constant(ir.IntType(32), k))
            builder.store(v, builder.bitcast(ptr, ir.PointerType(vec, ptr.type.addrspace)), align=16)
            return context.get_dummy_value()

        return sig, codegen

    def _make_ld_global_at(n):
        """``ld.global.nc.v{n}.u32`` at flat word ``row·m + col + off`` of a C-contiguous array of 32-bit words."""
        codegen = _ld_global_nc_words(n, lambda context, builder, sig, args: flat_ptr(
            context, builder, sig.args[0], args[0], sig.args[1], args[1], args[2], args[3:], sig.args[2:]))

        @intrinsic
        def ld_global_at(typingctx, arr, row, m, col, off):
            if not (isinstance(arr, types.Array) and arr.layout == "C" and arr.dtype.bitwidth == 32
                    and all(isinstance(x, types.Integer) for x in (row, m, col, off))):
                return None
            return types.UniTuple(types.uint32, n)(arr, row, m, col, off), codegen

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
