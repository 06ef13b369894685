"""Warp-specialisation primitives: named barriers and ``setmaxnreg``, inline PTX
on the GPU, models in the simulator.

A warp-specialised kernel gives different warps (warpgroups) different jobs —
one producer issues copies, consumers compute — and synchronises groups of
warps, not the whole block:

=================================  ==============================================
``named_barrier_sync(id, n)``       ``bar.sync id, n;`` wait until ``n`` threads have arrived at barrier ``id``
``named_barrier_arrive(id, n)``     ``bar.arrive id, n;`` count this thread's arrival, do not wait
``setmaxnreg_inc(N)``               ``setmaxnreg.inc.sync.aligned.u32 N;`` (sm_90a) raise this warpgroup's
                                    registers per thread to ``N``
``setmaxnreg_dec(N)``               ``setmaxnreg.dec.sync.aligned.u32 N;`` give registers back down to ``N``
=================================  ==============================================

Named barriers: ids 1..15 (id 0 is the one ``cuda.syncthreads`` uses), ``n`` a
multiple of the warp size (32) and at most the block's threads. The hardware
counts whole warps: every thread of a warp that executes ``bar`` counts
(``bar.sync`` is ``barrier.sync.aligned``: all threads of the warp execute it
together). The usual pattern is a producer warp(group) that ``arrive``\\ s and a
consumer warp(group) that ``sync``\\ s on the same id with ``n`` = the threads
of both.

``setmaxnreg``: ``N`` is a compile-time constant, a multiple of 8 in 24..256;
all threads of the warpgroup execute the same instruction. ptxas needs to know
the kernel's register count at entry to honour it, so kernels that use it
should set ``max_registers`` (or ``launch_bounds``).

Simulator models
----------------
Named barrier ``id`` of a block is a counter and a generation number under a
condition variable: each calling thread adds one arrival (the model counts
threads, which equals the hardware's count of whole warps when whole warps
call it, the supported case); the arrival that reaches ``n`` resets the
counter, advances the generation and wakes the waiters; ``sync`` waits for the
generation to advance, ``arrive`` returns at once. Reusing an id with a
different ``n`` while arrivals are pending, an id outside 1..15, or ``n`` not a
multiple of 32 or larger than the block raise; a barrier that never fills
times out with an error instead of hanging. ``setmaxnreg`` changes no result, but
its registers are counted: a block starts with 65536 / threads a thread, ``dec``
frees some, ``inc`` waits for them, and an ``inc`` that no ``dec`` can satisfy
raises (on a GPU the block hangs); ``N`` is checked as ptxas would.
"""
from __future__ import annotations

import threading

from numba_attn.gpu.backend import IS_SIMULATOR

NAMED_BARRIERS = 16  # hardware barrier ids per block (0 = syncthreads)

__all__ = ["named_barrier_sync", "named_barrier_arrive", "setmaxnreg_inc", "setmaxnreg_dec",
           "check_maxnreg", "check_register_split", "NAMED_BARRIERS"]


def check_maxnreg(n) -> int:
    """``N`` of ``setmaxnreg``: a multiple of 8 in 24..256 (what ptxas accepts)."""
    n = int(n)
    if n % 8 or not 24 <= n <= 256:
        raise ValueError(f"setmaxnreg: {n} registers is not a multiple of 8 in 24..256")
    return n


def check_register_split(threads: int, producer: int, consumer: int, consumer_warpgroups: int) -> None:
    """A block of ``threads`` launched with them as its bounds starts with ``65536 / threads`` registers a thread
    (rounded down to 8, at most 255): that pool is all ``setmaxnreg`` moves. A producer warpgroup at ``producer``
    and the consumer warpgroups at ``consumer`` must fit it, else the consumers' ``setmaxnreg.inc`` waits forever
    for registers nobody frees (a hang, not an error). Raises ValueError naming the split."""
    check_maxnreg(producer)
    check_maxnreg(consumer)
    entry = min(255, 65536 // threads // 8 * 8)
    need = 128 * (producer + consumer_warpgroups * consumer)
    if need > entry * threads:
        raise ValueError(f"setmaxnreg: a producer at {producer} and {consumer_warpgroups} consumer warpgroups at "
                         f"{consumer} registers need {need}, more than the {entry * threads} of a {threads}-thread "
                         f"block ({entry} a thread at launch): the consumers would wait forever")


def _check_named(bar_id, count, nthreads=None):
    bar_id, count = int(bar_id), int(count)
    if not 1 <= bar_id < NAMED_BARRIERS:
        raise ValueError(f"named barrier id {bar_id}: use 1..{NAMED_BARRIERS - 1} (0 is syncthreads)")
    if count <= 0 or count % 32:
        raise ValueError(f"named barrier thread count {count} is not a positive multiple of the warp size")
    if nthreads is not None and count > nthreads:
        raise ValueError(f"named barrier thread count {count} exceeds the block's {nthreads} threads")
    return bar_id, count


if IS_SIMULATOR:
    _TIMEOUT_S = 120.0
    _cond = threading.Condition()

    class _Named:
        def __init__(self, count):
            self.count, self.arrived, self.generation = count, 0, 0

    def _named(bar_id, count, what):
        t = threading.current_thread()
        mgr = getattr(t, "_manager", None)
        if mgr is None:
            raise RuntimeError(f"{what} can only be called from inside a kernel")
        bx, by, bz = mgr._block_dim
        bar_id, count = _check_named(bar_id, count, bx * by * bz)
        states = mgr.__dict__.setdefault("_numba_attn_named", {})
        key = (tuple(t.blockIdx), bar_id)
        st = states.get(key)
        if st is None:
            st = states[key] = _Named(count)
        if st.count != count:
            if st.arrived:
                raise RuntimeError(f"{what}: barrier {bar_id} used with {count} threads while {st.arrived} "
                                   f"arrivals for {st.count} are pending")
            st.count = count
        return st, bar_id

    def _arrive(st):
        gen = st.generation
        st.arrived += 1
        if st.arrived == st.count:
            st.arrived = 0
            st.generation += 1
            _cond.notify_all()
        return gen

    def named_barrier_sync(bar_id, count):
        """Arrive at named barrier ``bar_id`` and wait until ``count`` threads have arrived."""
        with _cond:
            st, bid = _named(bar_id, count, "named_barrier_sync")
            gen = _arrive(st)
            if not _cond.wait_for(lambda: st.generation != gen, timeout=_TIMEOUT_S):
                raise RuntimeError(f"named barrier {bid} timed out: {st.arrived} of {st.count} threads arrived")

    def named_barrier_arrive(bar_id, count):
        """Count this thread's arrival at named barrier ``bar_id`` without waiting."""
        with _cond:
            st, _ = _named(bar_id, count, "named_barrier_arrive")
            _arrive(st)

    _POOL_TIMEOUT_S = 30.0  # a setmaxnreg.inc waiting longer for registers: no thread of the block will free them

    class _Pool:
        """A block's registers (65536 / threads a thread at launch, as :func:`check_register_split` assumes) and
        what each thread holds after its last ``setmaxnreg``: the registers an ``inc`` may take are those ``dec``
        freed."""

        def __init__(self, threads):
            self.entry = min(255, 65536 // threads // 8 * 8)
            self.threads, self.free, self.held = threads, 0, {}

    def _setmaxnreg(n, inc):
        n = check_maxnreg(n)
        t = threading.current_thread()
        mgr = getattr(t, "_manager", None)
        if mgr is None:
            raise RuntimeError("setmaxnreg can only be called from inside a kernel")
        bx, by, bz = mgr._block_dim
        with _cond:
            pools = mgr.__dict__.setdefault("_numba_attn_regs", {})
            pool = pools.get(tuple(t.blockIdx))
            if pool is None:
                pool = pools[tuple(t.blockIdx)] = _Pool(bx * by * bz)
            me = tuple(t.threadIdx)
            cur = pool.held.get(me, pool.entry)
            if inc:
                if n < cur:
                    raise ValueError(f"setmaxnreg.inc to {n} registers from {cur}: inc may only raise the count")
                if not _cond.wait_for(lambda: pool.free >= n - cur, timeout=_POOL_TIMEOUT_S):
                    raise RuntimeError(
                        f"setmaxnreg.inc to {n} registers waits forever: the {pool.threads}-thread block started "
                        f"with {pool.entry} a thread and {pool.free} are free (on a GPU the kernel hangs; "
                        "check_register_split names the split)")
                pool.free -= n - cur
            else:
                if n > cur:
                    raise ValueError(f"setmaxnreg.dec to {n} registers from {cur}: dec may only lower the count")
                pool.free += cur - n
                _cond.notify_all()
            pool.held[me] = n

    def setmaxnreg_inc(n):
        """Simulator: this thread takes ``n`` registers from the block's pool (what other threads' ``dec`` freed),
        waiting until they are free; one that never frees raises, where a GPU would hang."""
        _setmaxnreg(n, True)

    def setmaxnreg_dec(n):
        """Simulator: this thread gives registers back to the block's pool, down to ``n``."""
        _setmaxnreg(n, False)

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import _intrinsic

    _i32 = ir.IntType(32)

    def _call(builder, text, cons, argtys, args):
        fnty = ir.FunctionType(ir.VoidType(), argtys)
        # convergent: the compiler may not make the call depend on more (divergent) conditions
        builder.call(ir.InlineAsm(fnty, text, cons, side_effect=True), args, attrs=("convergent",))

    def _make_bar(op):
        text = f"bar.{op} $0, $1;"

        @_intrinsic(target="cuda", prefer_literal=True)
        def bar(typingctx, bar_id, count):
            if not (isinstance(bar_id, types.Integer) and isinstance(count, types.Integer)):
                raise TypingError(f"bar.{op}: id and count must be integers")
            if isinstance(bar_id, types.IntegerLiteral) and isinstance(count, types.IntegerLiteral):
                try:  # constants are checked at compile time, as ptxas would
                    _check_named(bar_id.literal_value, count.literal_value)
                except ValueError as e:
                    raise TypingError(str(e)) from None
            sig = types.void(bar_id, count)

            def codegen(context, builder, sig, args):
                vals = [builder.trunc(context.cast(builder, v, t, types.int64), _i32)
                        for v, t in zip(args, sig.args)]
                _call(builder, text, "r,r,~{memory}", [_i32, _i32], vals)
                return context.get_dummy_value()

            return sig, codegen

        return bar

    named_barrier_sync = _make_bar("sync")
    named_barrier_arrive = _make_bar("arrive")

    def _make_setmaxnreg(op):
        @_intrinsic(target="cuda", prefer_literal=True)
        def setmaxnreg(typingctx, n):
            if not isinstance(n, types.IntegerLiteral):
                raise TypingError(f"setmaxnreg_{op}: the register count must be a compile-time constant")
            try:
                count = check_maxnreg(n.literal_value)
            except ValueError as e:
                raise TypingError(str(e)) from None
            sig = types.void(n)

            def codegen(context, builder, sig, args):
                _call(builder, f"setmaxnreg.{op}.sync.aligned.u32 {count};", "~{memory}", [], [])
                return context.get_dummy_value()

            return sig, codegen

        return setmaxnreg

    setmaxnreg_inc = _make_setmaxnreg("inc")
    setmaxnreg_dec = _make_setmaxnreg("dec")
