"""Clocks a kernel can read, for timelines of its own work (:mod:`numba_attn.phases.tensor_core.timeline`).

=========================  ==============================================
``clock64()``              ``mov.u64 %clock64``: this SM's cycle counter (the same counter for every block the SM
                           runs; not comparable between SMs)
``clock64_after(x)``       the same, read only once the 32-bit register ``x`` holds its value (a predicate made
                           from ``x`` guards the read, so a load into ``x`` must land first); 1 if ``x`` is
                           0x7FC00001 (a NaN pattern: the guard must not be foldable)
``global_ns()``            ``mov.u64 %globaltimer``: nanoseconds, the same clock on every SM (updated every
                           ~32 ns to 1 µs depending on the GPU: use it to place SMs against each other, and the
                           cycle counter for durations)
``sm_id()``                ``mov.u32 %smid``: the SM running this thread
=========================  ==============================================

In the simulator the clocks are ``time.perf_counter_ns()`` (one process: every "SM" shares it) and ``sm_id`` is 0.
"""
from __future__ import annotations

from numba_attn.gpu.backend import IS_SIMULATOR

__all__ = ["clock64", "clock64_after", "global_ns", "sm_id", "GUARD"]

GUARD = 0x7FC00001  # the value for which clock64_after returns 1 instead of a clock (never a clock: those are large)

if IS_SIMULATOR:
    import time

    import numpy as np

    def clock64():
        """Simulator: nanoseconds of ``time.perf_counter_ns`` (as uint64)."""
        return np.uint64(time.perf_counter_ns())

    def clock64_after(x):
        """Simulator: :func:`clock64` (1 if ``x`` is :data:`GUARD`, as on the GPU)."""
        return np.uint64(1) if int(x) & 0xFFFFFFFF == GUARD else clock64()

    def global_ns():
        """Simulator: nanoseconds of ``time.perf_counter_ns`` (as uint64)."""
        return np.uint64(time.perf_counter_ns())

    def sm_id():
        """Simulator: 0 (one simulated SM)."""
        return np.uint32(0)

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.inline_ptx import I32, asm_call

    _I64 = ir.IntType(64)

    def _reader(ptx, ret, bits):
        def reader(typingctx):
            def codegen(context, builder, sig, args):
                return asm_call(builder, bits, [], ptx, "=l" if bits is _I64 else "=r", [], side_effect=True)

            return ret(), codegen

        return intrinsic(reader)

    clock64 = _reader("mov.u64 $0, %clock64;", types.uint64, _I64)
    global_ns = _reader("mov.u64 $0, %globaltimer;", types.uint64, _I64)
    sm_id = _reader("mov.u32 $0, %smid;", types.uint32, I32)

    @intrinsic
    def clock64_after(typingctx, x):
        if not isinstance(x, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            text = (f"{{ .reg .pred p; setp.ne.u32 p, $1, {GUARD}; mov.u64 $0, 1; @p mov.u64 $0, %clock64; }}")
            return asm_call(builder, _I64, [I32], text, "=l,r", [v], side_effect=True)

        return types.uint64(x), codegen
