"""How an intrinsic reaches an array element, on each backend.

On the GPU: the plumbing of inline PTX. :func:`asm_call` emits one ``ir.InlineAsm`` call; :func:`elem_ptr`
is the pointer to ``arr[i, j, ...]`` without numba's negative-index wrap-around; :func:`shared_addr` and
:func:`global_ptr` turn a generic pointer into the 32-bit shared-window or 64-bit global address an
instruction takes; :func:`flat_ptr` is the address of a flat element ``row·n + col + off`` with the
loop-invariant part kept in one register. ``I16``, ``I32``, ``F32``: the LLVM register types.

In the simulator (``IS_SIMULATOR``): the checked NumPy access of the fallbacks. :func:`host_array` is the
NumPy array behind a simulator array; :func:`bytes16_at` the 16 bytes at an element, refusing what the
instruction would refuse (misaligned, out of bounds, past the row); :func:`flat_elements` a run of flat
elements; :func:`index_u32` a row index that must fit 32 unsigned bits.

``SMEM_ALIGN``: declare shared tiles read by ``ldmatrix``/``cp.async``/128-bit accesses with
``alignment=SMEM_ALIGN`` (16 on the GPU; the simulator refuses the argument, so it is ``None`` there).
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.bits import MASK32

SMEM_ALIGN = None if IS_SIMULATOR else 16

if IS_SIMULATOR:
    def host_array(a):
        """The NumPy array behind a simulator device array (or ``a`` itself)."""
        return getattr(a, "_ary", a)

    def bytes16_at(arr, idx):
        """The 16 bytes at element ``idx`` of ``arr`` as 8 uint16."""
        a = np.asarray(host_array(arr))
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

    def flat_elements(arr, i, n):
        """Elements ``i … i+n−1`` of the C-contiguous array ``arr`` read as one flat array."""
        a = np.asarray(host_array(arr))
        if not a.flags.c_contiguous:
            raise ValueError("flat loads need a C-contiguous array")
        if not 0 <= i <= a.size - n:
            raise IndexError(f"flat elements {i}..{i + n - 1} out of bounds for size {a.size}")
        return a.reshape(-1)[i:i + n]

    def index_u32(row):
        """``row`` as an int, refusing what does not fit 32 unsigned bits (the GPU's 32-bit index)."""
        if not 0 <= int(row) <= MASK32:
            raise IndexError(f"row index {int(row)} is not a 32-bit unsigned value")
        return int(row)

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils

    I16 = ir.IntType(16)
    I32 = ir.IntType(32)
    F32 = ir.FloatType()

    def asm_call(builder, ret, argtys, text, cons, args, side_effect=False):
        fnty = ir.FunctionType(ret, argtys)
        return builder.call(ir.InlineAsm(fnty, text, cons, side_effect=side_effect), args)

    def elem_ptr(context, builder, aryty, ary, idxtys, idxs):
        arr = context.make_array(aryty)(context, builder, value=ary)
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(idxs, idxtys)]
        return cgutils.get_item_pointer(context, builder, aryty, arr, inds, wraparound=False)

    def shared_addr(builder, ptr):
        """Generic pointer into a shared array → 32-bit shared-window address."""
        sptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
        return builder.ptrtoint(sptr, I32)

    def global_ptr(builder, ptr):
        gptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 1))
        return builder.ptrtoint(gptr, ir.IntType(64))

    def ptx_statement(text):
        """The intrinsic ``f()`` issuing the PTX statement ``text`` (a side effect; memory clobbered)."""
        from numba.cuda.extending import intrinsic

        def statement(typingctx):
            def codegen(context, builder, sig, args):
                asm_call(builder, ir.VoidType(), [], text, "~{memory}", [], side_effect=True)
                return context.get_dummy_value()

            return types.void(), codegen

        return intrinsic(statement)

    def shared_x4_load(text):
        """The intrinsic ``f(smem, row, col) -> (w0, w1, w2, w3)`` of a 2-D shared array: ``text`` with the four
        32-bit results as ``$0``-``$3`` and the element's shared address as ``$4`` (ld.shared.v4, ldmatrix.x4)."""
        from numba.cuda.extending import intrinsic

        def load(typingctx, smem, row, col):
            if not (isinstance(smem, types.Array) and smem.ndim == 2):
                return None
            sig = types.UniTuple(types.uint32, 4)(smem, row, col)

            def codegen(context, builder, sig, args):
                ptr = elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
                res = asm_call(builder, ir.LiteralStructType([I32] * 4), [I32], text, "=r,=r,=r,=r,r,~{memory}",
                               [shared_addr(builder, ptr)], side_effect=True)
                vals = [builder.extract_value(res, i) for i in range(4)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return intrinsic(load)

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
