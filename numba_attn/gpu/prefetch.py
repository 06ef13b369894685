"""``prefetch.global.L2`` of one element of an array (the decode family's L2 prefetch of cache rows), with a
simulator fallback that changes no value and checks that the element lies in the array, as a load would."""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

if IS_SIMULATOR:
    def prefetch_l2_at(arr, row, n, col, off):
        """``prefetch.global.L2`` of flat element ``row·n + col + off`` of ``arr`` (``row`` a 32-bit index). It
        changes no value; the simulator checks that the element lies in the array, as a load's would be."""
        a = np.asarray(getattr(arr, "_ary", arr))
        if not 0 <= int(row) <= 0xFFFFFFFF:
            raise IndexError(f"row index {int(row)} is not a 32-bit unsigned value")
        i = int(row) * int(n) + int(col) + int(off)
        if not 0 <= i < a.size:
            raise IndexError(f"prefetch of flat element {i} out of bounds for size {a.size}")
else:
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda.extending import intrinsic as _intrinsic

    from numba_attn.gpu.intrinsics import asm_call, flat_ptr, global_ptr

    @_intrinsic
    def prefetch_l2_at(typingctx, arr, row, n, col, off):
        """``prefetch.global.L2`` of the line holding flat element ``row·n + col + off`` of a C-contiguous
        array (addressed as ``ld_global_v4_at`` addresses its load: one ``mad.wide.u32`` on a hoisted base):
        the bytes start towards L2 with no register waiting for them."""
        if not (isinstance(arr, _types.Array) and arr.layout == "C"
                and all(isinstance(x, _types.Integer) for x in (row, n, col, off))):
            return None
        sig = _types.void(arr, row, n, col, off)

        def codegen(context, builder, sig, args):
            ptr = flat_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], args[2], args[3:],
                            sig.args[2:])
            asm_call(builder, _ir.VoidType(), [_ir.IntType(64)], "prefetch.global.L2 [$0];", "l",
                 [global_ptr(builder, ptr)], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen
