"""Hopper's shared-memory transaction barriers (``mbarrier``) from numba: inline
PTX on the GPU, a faithful model of the barrier's state in the simulator.

An mbarrier is a 64-bit object in shared memory. It counts *arrivals* (threads
that call :func:`mbarrier_arrive`) and *transaction bytes* (bytes announced by
:func:`mbarrier_arrive_expect_tx` / :func:`mbarrier_expect_tx` and retired by
asynchronous copies such as the TMA loads of :mod:`numba_attn.gpu.tma`). Its
current *phase* completes when both the pending arrival count and the
transaction count reach zero; the phase bit then flips and the arrival count
is re-armed to the count given at :func:`mbarrier_init`. Waiters ask whether
the phase of a given parity has completed (:func:`mbarrier_try_wait_parity`,
or the loop :func:`mbarrier_wait`), so a ring of buffers needs one barrier per
stage and a phase bit the waiter flips each time round the ring.

Barriers are addressed as ``(bars, i)``: element ``i`` of a shared ``uint64``
array (``cuda.shared.array(n, uint64)``), so a kernel declares a ring of them
in one line.

=================================  ====================================================
``mbarrier_init(bars, i, count)``   ``mbarrier.init.shared::cta.b64`` (one thread; then ``syncthreads``)
``mbarrier_arrive(bars, i)``        ``mbarrier.arrive.shared::cta.b64`` → opaque state token (uint64)
``mbarrier_arrive_expect_tx``       ``mbarrier.arrive.expect_tx.shared::cta.b64`` (bytes, then arrive)
``mbarrier_expect_tx``              ``mbarrier.expect_tx.relaxed.cta.shared::cta.b64`` (no arrival)
``mbarrier_try_wait_parity``        ``mbarrier.try_wait.parity.shared::cta.b64`` → True once the phase
                                    of that parity has completed
``mbarrier_wait(bars, i, parity)``  loop on ``try_wait_parity``
``fence_proxy_async()``             ``fence.proxy.async.shared::cta`` (generic writes to shared memory
                                    become visible to the async proxy: TMA stores, wgmma operands)
=================================  ====================================================

Hardware rules the simulator enforces (an error where the GPU would be
undefined): ``count`` in 1..2^20-1; no arrival beyond the count of a phase;
transaction counts within ±(2^20-1); a barrier used before its
``mbarrier_init`` in this block.

Simulator model
---------------
The simulator runs a block's threads as real Python threads. The barrier's
state lives in the shared ``uint64`` itself, packed as bits 0-20 pending
arrivals, 21-41 expected arrivals, 42-62 transaction count (21-bit two's
complement), bit 63 the phase parity; every operation reads, updates and
writes the word under one module lock (so it is atomic, as the hardware
operations are), and phase changes notify one condition variable on which
:func:`mbarrier_wait` sleeps (with a timeout that reports a phase that never
completes instead of hanging). The token :func:`mbarrier_arrive` returns is the
packed state before the arrival (on the GPU the token is opaque).

Asynchronous copies that complete on a barrier (:mod:`numba_attn.gpu.tma`)
are queued on it at issue and carried out — data written, transaction bytes
retired — by the first ``try_wait``/``wait`` on that barrier: a kernel that
reads a buffer without waiting for its barrier reads stale data in the
simulator, as it may on the GPU.
"""
from __future__ import annotations

import threading

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

MAX_COUNT = (1 << 20) - 1  # arrivals per phase and |transaction bytes| the hardware counts

__all__ = ["mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_expect_tx",
           "mbarrier_try_wait_parity", "mbarrier_wait", "fence_proxy_async", "MAX_COUNT",
           "pack_state", "unpack_state"]

_F = (1 << 21) - 1  # one 21-bit field


def pack_state(pending: int, expected: int, tx: int, phase: int) -> int:
    """The simulator's 64-bit barrier word (host model, used by the tests)."""
    return (pending & _F) | ((expected & _F) << 21) | ((tx & _F) << 42) | ((phase & 1) << 63)


def unpack_state(word) -> tuple[int, int, int, int]:
    """(pending arrivals, expected arrivals, transaction bytes, phase parity) of a barrier word."""
    w = int(word)
    tx = (w >> 42) & _F
    if tx >> 20:
        tx -= 1 << 21
    return w & _F, (w >> 21) & _F, tx, (w >> 63) & 1


if IS_SIMULATOR:
    _TIMEOUT_S = 120.0
    _cond = threading.Condition(threading.RLock())  # re-entrant: a queued copy retires its bytes under it

    from numba_attn.gpu.warp import kernel_thread

    def _word(bars, i, what):
        """(numpy array, index, block key of the barrier, block manager)."""
        from numba_attn.gpu.wgmma import shared_buffer

        t, mgr = kernel_thread(what)
        a = np.asarray(getattr(bars, "_ary", bars))
        if a.ndim != 1 or a.dtype.itemsize != 8 or a.dtype.kind not in "ui":
            raise TypeError(f"{what}: barriers are elements of a 1-D shared uint64 array, got {a.dtype} {a.shape}")
        i = int(i)
        if not 0 <= i < a.shape[0]:
            raise IndexError(f"{what}: barrier {i} out of bounds for {a.shape[0]} barriers")
        buf, off = shared_buffer(a)
        off += 8 * i
        if off % 8:
            raise ValueError(f"{what}: barrier address {off} is not 8-byte aligned")
        return a, i, (tuple(t.blockIdx), buf.__array_interface__["data"][0], off), mgr

    def _registry(mgr):
        return mgr.__dict__.setdefault("_numba_attn_mbarriers", {})

    def _checked(bars, i, what):
        a, i, key, mgr = _word(bars, i, what)
        if key not in _registry(mgr):
            raise RuntimeError(f"{what}: mbarrier {i} used before mbarrier_init in this block")
        return a, i, key, mgr

    def _update(a, i, d_pending=0, d_tx=0, what=""):
        """Apply an arrival / a transaction change under the lock; flip the phase when
        both counts reach zero. Returns the word before the change."""
        w = a.view(np.uint64)
        old = int(w[i])
        pending, expected, tx, phase = unpack_state(old)
        if d_pending and pending - d_pending < 0:
            raise RuntimeError(f"{what}: more arrivals than the barrier's count {expected} in one phase")
        pending -= d_pending
        tx += d_tx
        if abs(tx) > MAX_COUNT:
            raise RuntimeError(f"{what}: transaction count {tx} out of the hardware's range ±{MAX_COUNT}")
        if pending == 0 and tx == 0:
            pending, phase = expected, phase ^ 1
        w[i] = pack_state(pending, expected, tx, phase)
        _cond.notify_all()  # every change: a waiter re-checks its phase (and lands queued copies)
        return old

    def complete_tx(bars, i, nbytes):
        """Retire ``nbytes`` transaction bytes (what an async copy does when it lands)."""
        with _cond:
            a, i, _, _ = _checked(bars, i, "complete_tx")
            _update(a, i, d_tx=-int(nbytes), what="complete_tx")

    def enqueue_copy(bars, i, do):
        """Queue ``do()`` (an async copy that writes its data and retires its bytes
        with :func:`complete_tx`) on barrier ``(bars, i)``."""
        with _cond:
            _, _, key, mgr = _checked(bars, i, "async copy")
            mgr.__dict__.setdefault("_numba_attn_mbar_copies", {}).setdefault(key, []).append(do)
            _cond.notify_all()  # a thread already waiting lands the copy (the data arrives at the wait)

    def _run_copies(key, mgr):
        copies = mgr.__dict__.get("_numba_attn_mbar_copies", {}).pop(key, [])
        for do in copies:
            do()

    def mbarrier_init(bars, i, count):
        """Initialise barrier ``i`` of ``bars`` for ``count`` arrivals per phase (phase 0)."""
        count = int(count)
        if not 1 <= count <= MAX_COUNT:
            raise ValueError(f"mbarrier_init: count {count} outside 1..{MAX_COUNT}")
        with _cond:
            a, i, key, mgr = _word(bars, i, "mbarrier_init")
            _registry(mgr)[key] = True
            mgr.__dict__.get("_numba_attn_mbar_copies", {}).pop(key, None)
            a.view(np.uint64)[i] = pack_state(count, count, 0, 0)

    def mbarrier_arrive(bars, i):
        """One arrival; returns the state token (the word before the arrival)."""
        with _cond:
            a, i, _, _ = _checked(bars, i, "mbarrier_arrive")
            return np.uint64(_update(a, i, d_pending=1, what="mbarrier_arrive"))

    def _expect(bars, i, nbytes, arrivals, what):
        """Announce ``nbytes`` transaction bytes with ``arrivals`` (0 or 1) arrivals, one atomic step."""
        nbytes = int(nbytes)
        if not 0 <= nbytes <= MAX_COUNT:
            raise ValueError(f"{what}: {nbytes} bytes outside 0..{MAX_COUNT}")
        with _cond:
            a, i, _, _ = _checked(bars, i, what)
            return _update(a, i, d_pending=arrivals, d_tx=nbytes, what=what)

    def mbarrier_arrive_expect_tx(bars, i, nbytes):
        """Announce ``nbytes`` transaction bytes, then arrive (one atomic step)."""
        return np.uint64(_expect(bars, i, nbytes, 1, "mbarrier_arrive_expect_tx"))

    def mbarrier_expect_tx(bars, i, nbytes):
        """Announce ``nbytes`` transaction bytes without arriving."""
        _expect(bars, i, nbytes, 0, "mbarrier_expect_tx")

    def _try(bars, i, parity, what):
        a, i, key, mgr = _checked(bars, i, what)
        _run_copies(key, mgr)
        return unpack_state(a.view(np.uint64)[i])[3] != (int(parity) & 1)

    def mbarrier_try_wait_parity(bars, i, parity):
        """True when the phase of parity ``parity`` has completed (the barrier is in
        the phase after it), False while it is the current phase."""
        with _cond:
            return _try(bars, i, parity, "mbarrier_try_wait_parity")

    def mbarrier_wait(bars, i, parity):
        """Wait until the phase of parity ``parity`` has completed."""
        with _cond:
            if not _cond.wait_for(lambda: _try(bars, i, parity, "mbarrier_wait"), timeout=_TIMEOUT_S):
                p, e, tx, ph = unpack_state(np.asarray(getattr(bars, "_ary", bars)).view(np.uint64)[int(i)])
                raise RuntimeError(f"mbarrier_wait timed out on barrier {int(i)} waiting for parity {int(parity)}: "
                                   f"phase {ph}, {p} of {e} arrivals pending, {tx} transaction bytes pending "
                                   "(missing arrivals or copies)")

    def fence_proxy_async():
        """No-op in the simulator (it has a single memory proxy)."""
        return None

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.inline_ptx import asm_call, ptx_statement, shared_addr
    from numba_attn.gpu.jit import device

    _i32 = ir.IntType(32)
    _i64 = ir.IntType(64)

    def _check_bars(bars, i, what):
        if not (isinstance(bars, types.Array) and bars.ndim == 1 and bars.dtype in (types.uint64, types.int64)):
            raise TypingError(f"{what}: barriers are elements of a 1-D shared uint64 array, got {bars}")
        if not isinstance(i, types.Integer):
            raise TypingError(f"{what}: barrier index must be an integer, got {i}")

    def bar_addr(context, builder, aryty, ary, ity, idx):
        """32-bit shared-window address of barrier ``ary[idx]``."""
        a = context.make_array(aryty)(context, builder, value=ary)
        ptr = builder.gep(a.data, [context.cast(builder, idx, ity, types.intp)])
        return shared_addr(builder, ptr)

    def _as_i32(context, builder, val, ty):
        return builder.trunc(context.cast(builder, val, ty, types.int64), _i32)

    def _barrier_op(what, ptx, constraints, token, value):
        """The intrinsic ``what(bars, i[, value])``: ``ptx`` on the address of ``bars[i]`` (and ``value`` as a
        32-bit operand when ``value``), returning the 64-bit state token when ``token``."""
        def codegen(context, builder, sig, args):
            ops = [bar_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])]
            if value:
                ops.append(_as_i32(context, builder, args[2], sig.args[2]))
            r = asm_call(builder, _i64 if token else ir.VoidType(), [_i32] * len(ops), ptx, constraints, ops,
                         side_effect=True)
            return r if token else context.get_dummy_value()

        def typed(bars, i, *rest):
            _check_bars(bars, i, what)
            return (types.uint64 if token else types.void)(bars, i, *rest), codegen

        def with_value(typingctx, bars, i, value):
            return typed(bars, i, value)

        def without(typingctx, bars, i):
            return typed(bars, i)

        typer = with_value if value else without  # (an intrinsic takes no *args)
        typer.__name__ = typer.__qualname__ = what
        return intrinsic(typer)

    mbarrier_init = _barrier_op("mbarrier_init", "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}",
                                False, True)
    mbarrier_arrive = _barrier_op("mbarrier_arrive", "mbarrier.arrive.shared::cta.b64 $0, [$1];",
                                  "=l,r,~{memory}", True, False)
    mbarrier_arrive_expect_tx = _barrier_op(
        "mbarrier_arrive_expect_tx", "mbarrier.arrive.expect_tx.shared::cta.b64 $0, [$1], $2;",
        "=l,r,r,~{memory}", True, True)
    mbarrier_expect_tx = _barrier_op("mbarrier_expect_tx", "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$0], $1;",
                                     "r,r,~{memory}", False, True)

    @intrinsic
    def mbarrier_try_wait_parity(typingctx, bars, i, parity):
        _check_bars(bars, i, "mbarrier_try_wait_parity")
        sig = types.boolean(bars, i, parity)

        def codegen(context, builder, sig, args):
            addr = bar_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            par = builder.and_(_as_i32(context, builder, args[2], sig.args[2]), ir.Constant(_i32, 1))
            r = asm_call(builder, _i32, [_i32, _i32],
                     "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n"
                     "selp.u32 $0, 1, 0, p;\n}", "=r,r,r,~{memory}", [addr, par], side_effect=True)
            return builder.icmp_unsigned("!=", r, ir.Constant(_i32, 0))

        return sig, codegen

    @device
    def mbarrier_wait(bars, i, parity):
        """Wait until the phase of parity ``parity`` of barrier ``bars[i]`` has completed."""
        while not mbarrier_try_wait_parity(bars, i, parity):
            pass

    fence_proxy_async = ptx_statement("fence.proxy.async.shared::cta;")
