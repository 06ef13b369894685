"""Bulk reductions into global float32 and bulk copies to global memory: a whole shared tile by one instruction
(Hopper's ``cp.reduce.async.bulk`` and ``cp.async.bulk``, no tensor map, their commit and waits), or 16 bytes from
registers.

==============================================  ================================================================
``bulk_reduce_add_f32(dst, doff, src, soff, n)``  ``dst[doff + e] += src[soff + e]``, e < n (flat float32 elements),
                                                by the copy engine at the L2, atomic per element
``bulk_store(dst, dbyte, src, sbyte, n)``         ``n`` bytes of shared ``src`` from byte ``sbyte`` to ``dst`` at byte
                                                ``dbyte`` of its data (the simulator: within one row of its last axis)
``bulk_commit()``                               ``cp.async.bulk.commit_group``: the operations issued since the last
                                                commit form a group (per thread)
``bulk_wait_read(n)`` / ``bulk_wait(n)``        ``cp.async.bulk.wait_group[.read] n``: every group but the newest n has
                                                read its shared source (/ and completed its writes)
``red_add_f32x4(dst, i, x0, x1, x2, x3)``       ``red.global.add.v4.f32``: ``dst[i + e] += x_e``, e < 4, from registers
==============================================  ================================================================

Sizes and addresses of the bulk operations are multiples of 16 bytes. One thread issues for data its block wrote:
the writers store to shared memory, ``fence_proxy_async()``, a barrier, then the issue; the issuer waits
(``bulk_wait_read(0)`` at least) before the source is written again and before the kernel exits.

Simulator model: an operation is recorded at issue and carried out by the wait that retires its group, so a kernel
that overwrites its source or exits before waiting loses or corrupts data as it may on the GPU.
"""
from __future__ import annotations

import threading

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

__all__ = ["bulk_reduce_add_f32", "bulk_store", "bulk_commit", "bulk_wait_read", "bulk_wait", "red_add_f32x4"]

if IS_SIMULATOR:
    from numba_attn.gpu.inline_ptx import host_array

    _state = threading.local()
    _lock = threading.Lock()

    def _bulk():
        if not hasattr(_state, "pending"):
            _state.pending, _state.groups = [], []
        return _state

    def bulk_reduce_add_f32(dst, doff, src, soff, n):
        """Record ``dst[doff:doff+n] += src[soff:soff+n]`` (flat float32 elements), checked as issued."""
        d = np.asarray(host_array(dst)).reshape(-1)
        s = np.asarray(host_array(src)).reshape(-1)
        doff, soff, n = int(doff), int(soff), int(n)
        if d.dtype != np.float32 or s.dtype != np.float32:
            raise TypeError(f"bulk_reduce_add_f32 adds float32 into float32, not {s.dtype} into {d.dtype}")
        if n <= 0 or (4 * n) % 16 or (4 * doff) % 16 or (4 * soff) % 16:
            raise ValueError(f"bulk reduction of {n} elements at offsets ({doff}, {soff}): sizes and addresses "
                             "must be multiples of 16 bytes")
        if doff < 0 or doff + n > d.size:
            raise IndexError(f"bulk reduction into elements {doff}..{doff + n - 1} of a {d.size}-element array")
        if soff < 0 or soff + n > s.size:
            raise IndexError(f"bulk reduction from shared elements {soff}..{soff + n - 1} of {s.size}")

        def do(d=d, s=s, doff=doff, soff=soff, n=n):
            with _lock:
                d[doff:doff + n] += s[soff:soff + n]

        _bulk().pending.append(do)

    def bulk_store(dst, dbyte, src, sbyte, n):
        """Record the copy of ``n`` bytes of shared ``src`` (from byte ``sbyte``) to ``dst`` at byte ``dbyte`` of its
        data (``dst``'s strides place it: within one row of its last axis), checked as issued."""
        d = np.asarray(host_array(dst))
        s = np.asarray(host_array(src)).reshape(-1).view(np.uint8)
        dbyte, sbyte, n = int(dbyte), int(sbyte), int(n)
        if n <= 0 or n % 16 or dbyte % 16 or sbyte % 16:
            raise ValueError(f"bulk store of {n} bytes at byte offsets ({dbyte}, {sbyte}): sizes and addresses "
                             "must be multiples of 16 bytes")
        if sbyte < 0 or sbyte + n > s.size:
            raise IndexError(f"bulk store from shared bytes {sbyte}..{sbyte + n - 1} of {s.size}")
        index, rest = [], dbyte
        for stride, extent in zip(d.strides, d.shape):
            index.append(rest // stride)
            rest %= stride
            if not 0 <= index[-1] < extent:
                raise IndexError(f"bulk store to byte {dbyte} of an array of shape {d.shape}, strides {d.strides}")
        if d.strides[-1] != d.itemsize or n % d.itemsize or index[-1] + n // d.itemsize > d.shape[-1]:
            raise IndexError(f"bulk store of {n} bytes from byte {dbyte}: past the row of the last axis (the "
                             f"simulator's model copies within one row of shape {d.shape})")

        def do(d=d, s=s, at=tuple(index), sbyte=sbyte, n=n):
            d[at[:-1]][at[-1]:at[-1] + n // d.itemsize] = s[sbyte:sbyte + n].view(d.dtype)

        _bulk().pending.append(do)

    def bulk_commit():
        st = _bulk()
        st.groups.append(st.pending)
        st.pending = []

    def bulk_wait_read(n):
        """Carry out every committed group but the newest ``n``."""
        st = _bulk()
        while len(st.groups) > int(n):
            for do in st.groups.pop(0):
                do()

    bulk_wait = bulk_wait_read  # (the model completes a group's writes when it reads its source)

    def red_add_f32x4(dst, i, x0, x1, x2, x3):
        """``dst[i:i + 4] += (x0, x1, x2, x3)`` (flat float32 elements, ``i`` a multiple of 4), under the lock."""
        d = np.asarray(host_array(dst)).reshape(-1)
        i = int(i)
        if d.dtype != np.float32:
            raise TypeError(f"red_add_f32x4 adds float32 into float32, not into {d.dtype}")
        if i % 4 or i < 0 or i + 4 > d.size:
            raise IndexError(f"16-byte reduction at element {i} of a {d.size}-element array (a multiple of 4, "
                             "inside it)")
        with _lock:
            d[i:i + 4] += np.array([x0, x1, x2, x3], np.float32)

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import _intrinsic, intrinsic

    from numba_attn.gpu.inline_ptx import I32, asm_call, global_ptr, ptx_statement, shared_addr

    _I64 = ir.IntType(64)
    intrinsic_literal = _intrinsic(target="cuda", prefer_literal=True)  # (the wait count: a literal)

    @intrinsic
    def bulk_reduce_add_f32(typingctx, dst, doff, src, soff, n):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
                and dst.dtype == types.float32 and src.dtype == types.float32):
            return None
        sig = types.void(dst, types.intp, src, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            d = context.make_array(sig.args[0])(context, builder, value=args[0])
            s = context.make_array(sig.args[2])(context, builder, value=args[2])
            dptr = builder.gep(d.data, [args[1]])
            sptr = builder.gep(s.data, [args[3]])
            nbytes = builder.trunc(builder.mul(args[4], ir.Constant(args[4].type, 4)), I32)
            asm_call(builder, ir.VoidType(), [_I64, I32, I32],
                     "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
                     "l,r,r,~{memory}", [global_ptr(builder, dptr), shared_addr(builder, sptr), nbytes],
                     side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def bulk_store(typingctx, dst, dbyte, src, sbyte, n):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
            return None
        sig = types.void(dst, types.intp, src, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            i8p = ir.IntType(8).as_pointer()
            d = context.make_array(sig.args[0])(context, builder, value=args[0])
            s = context.make_array(sig.args[2])(context, builder, value=args[2])
            dptr = builder.gep(builder.bitcast(d.data, i8p), [args[1]])
            sptr = builder.gep(builder.bitcast(s.data, i8p), [args[3]])
            asm_call(builder, ir.VoidType(), [_I64, I32, I32],
                     "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;",
                     "l,r,r,~{memory}", [global_ptr(builder, dptr), shared_addr(builder, sptr),
                                         builder.trunc(args[4], I32)], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen

    bulk_commit = ptx_statement("cp.async.bulk.commit_group;")

    def _wait(read):
        text = "cp.async.bulk.wait_group" + (".read" if read else "") + " {};"

        @intrinsic_literal
        def wait(typingctx, n):
            if not isinstance(n, types.IntegerLiteral):
                return None
            sig = types.void(n)
            count = n.literal_value

            def codegen(context, builder, sig, args):
                asm_call(builder, ir.VoidType(), [], text.format(count), "~{memory}", [], side_effect=True)
                return context.get_dummy_value()

            return sig, codegen

        return wait

    bulk_wait_read = _wait(True)
    bulk_wait = _wait(False)

    @intrinsic
    def red_add_f32x4(typingctx, dst, i, x0, x1, x2, x3):
        if not (isinstance(dst, types.Array) and dst.dtype == types.float32):
            return None
        sig = types.void(dst, types.intp, types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            d = context.make_array(sig.args[0])(context, builder, value=args[0])
            asm_call(builder, ir.VoidType(), [_I64] + [ir.FloatType()] * 4,
                     "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f,~{memory}",
                     [global_ptr(builder, builder.gep(d.data, [args[1]]))] + list(args[2:]), side_effect=True)
            return context.get_dummy_value()

        return sig, codegen
