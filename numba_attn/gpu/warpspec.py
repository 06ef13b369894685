"""Warp-specialisation primitives: named barriers and ``setmaxnreg``, inline PTX
on the GPU, models in the simulator. A warp-specialised kernel gives warpgroups
different jobs (a producer issues copies, consumers compute) and synchronises
groups of warps, not the whole block:

* ``named_barrier_sync(id, n)`` — ``bar.sync id, n``: wait until ``n`` threads arrived at barrier ``id``;
* ``named_barrier_arrive(id, n)`` — ``bar.arrive id, n``: count this thread's arrival, do not wait;
* ``setmaxnreg_inc(N)`` / ``setmaxnreg_dec(N)`` — ``setmaxnreg.{inc,dec}.sync.aligned.u32 N`` (sm_90a): raise
  this warpgroup's registers a thread to ``N``, or give them back down to it.

Named barriers: ids 1..15 (0 is ``cuda.syncthreads``'), ``n`` a multiple of 32 and at most the block; the
hardware counts whole warps. The usual pattern: a producer ``arrive`` arrives, a consumer ``sync`` waits on the same id
with ``n`` = the threads of both. ``setmaxnreg``: ``N`` a compile-time multiple of 8 in 24..256, executed by the
whole warpgroup; ptxas needs the kernel's entry register count (``launch_bounds``) to honour it, and the
warpgroups' counts must fit the registers the block started with (:func:`check_register_split`).

Simulator models: a named barrier is a counter and a generation under a condition variable (one arrival a
thread; a bad id or count raises, a barrier that never fills times out with an error); ``setmaxnreg`` changes no
result but counts the block's register pool, so a split that cannot fit raises where a GPU would hang.
"""
from __future__ import annotations

import threading

from numba_attn.gpu.backend import IS_SIMULATOR

NAMED_BARRIERS = 16  # hardware barrier ids per block (0 = syncthreads)

__all__ = ["named_barrier_sync", "named_barrier_arrive", "setmaxnreg_inc", "setmaxnreg_dec",
           "check_maxnreg", "check_register_split", "entry_registers", "NAMED_BARRIERS"]


def check_maxnreg(n) -> int:
    """``N`` of ``setmaxnreg``: a multiple of 8 in 24..256 (what ptxas accepts)."""
    n = int(n)
    if n % 8 or not 24 <= n <= 256:
        raise ValueError(f"setmaxnreg: {n} registers is not a multiple of 8 in 24..256")
    return n


def entry_registers(threads: int) -> int:
    """Registers a thread of a block of ``threads`` (its launch bounds) has at launch: 65536 / threads, rounded down
    to 8, at most 255 (168 at 384 threads): the pool ``setmaxnreg`` moves is this times ``threads``."""
    return min(255, 65536 // threads // 8 * 8)


def check_register_split(threads: int, producer: int, consumer: int, consumer_warpgroups: int) -> None:
    """A block of ``threads`` launched with them as its bounds starts with ``65536 / threads`` registers a thread
    (rounded down to 8, at most 255): that pool is all ``setmaxnreg`` moves. A producer warpgroup at ``producer``
    and the consumer warpgroups at ``consumer`` must fit it, else the consumers' ``setmaxnreg.inc`` waits forever
    for registers nobody frees (a hang, not an error). Raises ValueError naming the split."""
    check_maxnreg(producer)
    check_maxnreg(consumer)
    entry = entry_registers(threads)
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
        """This block's barrier ``bar_id`` (checked; reusing an id with another count while arrivals are pending
        raises)."""
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
            self.entry = entry_registers(threads)
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
