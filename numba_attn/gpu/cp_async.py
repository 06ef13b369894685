"""Asynchronous global → shared copies: ``cp.async`` of 16 or 4 bytes, its commit and its wait.

=========================  ==============================================
``cp_async16``             ``cp.async.cg.shared.global`` 16 B, zero-fill when not valid
``cp_async16_flat``        the same, addresses as flat element offsets into C-contiguous arrays
``cp_async16_flat_l2_256`` the same with ``.L2::256B`` (the L2 fetches the whole 256-byte block)
``cp_async16_at_ca``       ``cp.async.ca.shared.global`` 16 B (through L1: a warp's 16-byte copies reach the L2 as whole
                           sectors; with ``.cg`` an H100 read twice the L2 sectors) from flat word
                           ``row·n + col + off`` (``row`` 32-bit) to flat element ``doff`` (32-bit) of a shared array
``cp_async4_at``           ``cp.async.ca.shared.global`` 4 B: flat element ``i`` (32-bit) of a 32-bit array to flat
                           element ``doff`` of a shared one
``cp_async_commit``        ``cp.async.commit_group``
``cp_async_wait(n)``       ``cp.async.wait_group n`` (n a compile-time constant)
=========================  ==============================================

``cp_async16_flat`` exists for speed: with a flat offset the kernel computes a tile row's address with
compile-time row lengths instead of numba's 64-bit index arithmetic over run-time shapes.

Memory ordering: every copy is ``volatile`` asm with a memory clobber, so the compiler neither merges
copies across loop iterations nor moves them across ``syncthreads``. In the simulator a copy is only
recorded; it is carried out by the ``cp_async_wait`` that retires its group (all groups but the newest
``n``), so a kernel that reads a tile before waiting for it reads stale data there too.
"""
from __future__ import annotations

import threading

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

if IS_SIMULATOR:
    from numba_attn.gpu.inline_ptx import bytes16_at, host_array, index_u32

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
        d = np.asarray(host_array(dst))
        di = (int(drow), int(dcol))
        bytes16_at(d, di)  # validate the destination now, as the instruction would
        if valid:
            data = bytes16_at(src, (sb, srow, scol)).copy()
        else:
            data = np.zeros(8, np.uint16)

        def do(d=d, di=di, data=data):
            n = 16 // d.itemsize
            d[di[0], di[1]:di[1] + n] = data.view(d.dtype)

        st.pending.append(do)

    def _cp_flat(dst, doff, src, soff, valid, nbytes):
        """Record a copy of ``nbytes`` from flat element ``soff`` of ``src`` to flat element ``doff`` of ``dst``
        (zeros when not ``valid``), checked as the instruction would be."""
        d = np.asarray(host_array(dst)).reshape(-1)
        sflat = np.asarray(host_array(src)).reshape(-1)
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
        _cp_flat(dst, index_u32(doff), src, index_u32(row) * int(n) + int(col) + int(off), valid, 16)

    def cp_async4_at(dst, doff, src, i, valid):
        """4 bytes: flat element ``i`` (a 32-bit index, as :func:`ld_at`) of the 32-bit array ``src`` to flat
        element ``doff`` of ``dst`` (zero when not ``valid``)."""
        _cp_flat(dst, index_u32(doff), src, index_u32(i), valid, 4)

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

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import _intrinsic, intrinsic

    from numba_attn.gpu.inline_ptx import I32, asm_call, elem_ptr, flat_ptr, global_ptr, ptx_statement, shared_addr

    intrinsic_literal = _intrinsic(target="cuda", prefer_literal=True)

    @intrinsic
    def cp_async16(typingctx, dst, drow, dcol, src, sb, srow, scol, valid):
        if not (isinstance(dst, types.Array) and dst.ndim == 2
                and isinstance(src, types.Array) and src.ndim == 3):
            return None
        sig = types.void(dst, drow, dcol, src, sb, srow, scol, types.boolean)

        def codegen(context, builder, sig, args):
            dptr = elem_ptr(context, builder, sig.args[0], args[0], sig.args[1:3], args[1:3])
            sptr = elem_ptr(context, builder, sig.args[3], args[3], sig.args[4:7], args[4:7])
            nbytes = builder.select(args[7], ir.Constant(I32, 16), ir.Constant(I32, 0))
            asm_call(builder, ir.VoidType(), [I32, ir.IntType(64), I32],
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
                nbytes = builder.select(args[4], ir.Constant(I32, 16), ir.Constant(I32, 0))
                asm_call(builder, ir.VoidType(), [I32, ir.IntType(64), I32], text, "r,l,r,~{memory}",
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
        nbytes = builder.select(args[-1], ir.Constant(I32, size), ir.Constant(I32, 0))
        asm_call(builder, ir.VoidType(), [I32, ir.IntType(64), I32],
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

    cp_async_commit = ptx_statement("cp.async.commit_group;")

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
