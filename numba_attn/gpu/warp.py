"""Warp-level primitives that also run in the CUDA simulator.

On the GPU these names are numba's own intrinsics (``cuda.shfl_xor_sync``
...). The simulator has none of them, so there they are implemented with the
simulator's own execution model: every CUDA thread is a Python thread, and the
lanes of one warp meet at a per-warp barrier, publish their values and read
their partner's. The semantics follow the PTX ``shfl.sync`` rules for a full
32-lane (or last, partial) warp:

* ``shfl_sync(mask, v, src)`` returns lane ``src % 32``'s value;
* ``shfl_xor_sync(mask, v, k)`` returns lane ``lane ^ k``'s value;
* ``shfl_down_sync(mask, v, d)`` returns lane ``lane + d``'s value, or the
  caller's own value when that lane is past the warp;
* ``shfl_up_sync(mask, v, d)`` likewise with ``lane - d``.

A lane that never reaches the exchange (divergent shuffle) makes the others
time out with an error instead of computing garbage, so a kernel whose
shuffles are not warp-convergent fails in the simulator as it would be
undefined on the GPU. ``warp_exchange`` is the building block that the
tensor-core fallbacks use too.
"""
from __future__ import annotations

import operator
import threading

import numpy as np
from numba import cuda

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import device

FULL_MASK = 0xFFFFFFFF
WARP_SIZE = 32

if IS_SIMULATOR:
    _lock = threading.Lock()
    _TIMEOUT_S = 120.0

    class _WarpState:
        """The barrier and the two alternating value buffers of ``nlanes`` threads
        (of ``size`` places) that exchange values."""
        def __init__(self, nlanes, size=WARP_SIZE):
            self.nlanes = nlanes
            self.barrier = threading.Barrier(nlanes, timeout=_TIMEOUT_S)
            self.buffers = ([None] * size, [None] * size)
            self.generation = [0] * size

    def kernel_thread(what):
        """(simulated CUDA thread, its block's manager); ``what`` names the caller in the error."""
        t = threading.current_thread()
        mgr = getattr(t, "_manager", None)
        if mgr is None:
            raise RuntimeError(f"{what} can only be called from inside a kernel")
        return t, mgr

    def _state(mgr, key, nlanes, size=WARP_SIZE):
        """The block's exchange state for ``key``, made by the first thread to arrive."""
        with _lock:
            states = mgr.__dict__.setdefault("_numba_attn_warps", {})
            st = states.get(key)
            if st is None:
                st = states[key] = _WarpState(nlanes, size)
        return st

    def _exchange(st, idx, value, error):
        """Place ``idx`` of ``st`` passes ``value``; every place's value once all arrived."""
        gen = st.generation[idx]
        st.generation[idx] = gen + 1
        buf = st.buffers[gen & 1]
        buf[idx] = value
        try:
            st.barrier.wait()
        except threading.BrokenBarrierError:
            raise RuntimeError(error) from None
        return buf

    def _warp():
        t, mgr = kernel_thread("warp primitives")
        bx, by, bz = mgr._block_dim
        nthreads = bx * by * bz
        warp, lane = divmod(t.thread_id, WARP_SIZE)
        return _state(mgr, (tuple(t.blockIdx), warp), min(WARP_SIZE, nthreads - warp * WARP_SIZE)), lane

    def warp_exchange(value):
        """Every lane passes its value; each gets the list of all lanes' values.

        One barrier per exchange: values alternate between two buffers, so a
        lane can only overwrite a buffer after every lane has passed the next
        barrier, i.e. finished reading it.
        """
        st, lane = _warp()
        return _exchange(st, lane, value, "warp-level exchange timed out: not every lane of the warp reached it "
                                          "(divergent shuffle/syncwarp/mma)")[: st.nlanes]

    def _same_type(value, other):
        return type(value)(other) if isinstance(value, (np.generic, int, float)) else other

    def shfl_sync(mask, value, src_lane):
        vals = warp_exchange(value)
        src = int(src_lane) % WARP_SIZE
        return _same_type(value, vals[src] if src < len(vals) else value)

    def shfl_xor_sync(mask, value, lane_mask):
        _, lane = _warp()
        vals = warp_exchange(value)
        src = lane ^ int(lane_mask)
        return _same_type(value, vals[src] if src < len(vals) else value)

    def shfl_down_sync(mask, value, delta):
        _, lane = _warp()
        vals = warp_exchange(value)
        src = lane + int(delta)
        return _same_type(value, vals[src] if src < len(vals) else value)

    def shfl_up_sync(mask, value, delta):
        _, lane = _warp()
        vals = warp_exchange(value)
        src = lane - int(delta)
        return _same_type(value, vals[src] if src >= 0 else value)

    def syncwarp(mask=FULL_MASK):
        warp_exchange(None)

    def ballot_sync(mask, predicate):
        vals = warp_exchange(bool(predicate))
        return sum(1 << i for i, p in enumerate(vals) if p)

    def laneid():
        return _warp()[1]

else:
    shfl_sync = cuda.shfl_sync
    shfl_xor_sync = cuda.shfl_xor_sync
    shfl_down_sync = cuda.shfl_down_sync
    shfl_up_sync = cuda.shfl_up_sync

    @device
    def syncwarp(mask):
        """``__syncwarp(mask)`` (a device function: numba's ``cuda.syncwarp``
        only types as an attribute of ``cuda``, not under another name)."""
        cuda.syncwarp(mask)

    ballot_sync = cuda.ballot_sync

    def warp_exchange(value):  # pragma: no cover - simulator only
        raise RuntimeError("warp_exchange is the simulator's fallback mechanism")

    def laneid():  # pragma: no cover
        raise RuntimeError("use cuda.laneid inside kernels")


def _butterfly(vals, op, stages):
    """Emulate the xor-butterfly on all lanes' values, in the GPU's order."""
    vals = list(vals)
    for k in stages:
        vals = [op(vals[i], vals[i ^ k]) if (i ^ k) < len(vals) else vals[i] for i in range(len(vals))]
    return vals


if IS_SIMULATOR:
    # One exchange instead of one per stage (each exchange is a barrier of 32
    # Python threads); the stages are replayed on the gathered values so the
    # rounding is the GPU's.
    def _reduce(x, op, stages):
        _, lane = _warp()
        return type(x)(_butterfly(warp_exchange(x), op, stages)[lane])

    def warp_max(x):
        return _reduce(x, max, (16, 8, 4, 2, 1))

    def warp_sum(x):
        return _reduce(x, lambda a, b: a + b, (16, 8, 4, 2, 1))

    def quad_max(x):
        return _reduce(x, max, (2, 1))

    def quad_sum(x):
        return _reduce(x, lambda a, b: a + b, (2, 1))

else:

    @device
    def warp_max(x):
        """Max over the 32 lanes of a warp (butterfly: every lane gets the result)."""
        return group_max(x, WARP_SIZE)

    @device
    def warp_sum(x):
        """Sum over the 32 lanes of a warp (butterfly: every lane gets the result)."""
        return group_sum(x, WARP_SIZE)

    @device
    def quad_max(x):
        """Max over the 4 consecutive lanes that hold one row of an mma C fragment."""
        x = max(x, shfl_xor_sync(FULL_MASK, x, 2))
        x = max(x, shfl_xor_sync(FULL_MASK, x, 1))
        return x

    @device
    def quad_sum(x):
        """Sum over the 4 consecutive lanes that hold one row of an mma C fragment."""
        x += shfl_xor_sync(FULL_MASK, x, 2)
        x += shfl_xor_sync(FULL_MASK, x, 1)
        return x


# -- reductions over lane groups (several keys per warp, one group of lanes per key) --


def _group_stages(width):
    """xor-butterfly stages reducing within aligned groups of ``width`` lanes."""
    out, off = [], width // 2
    while off >= 1:
        out.append(off)
        off //= 2
    return tuple(out)


def _strided_stages(width):
    """xor-butterfly stages reducing over the lanes that share ``lane % width``."""
    out, off = [], WARP_SIZE // 2
    while off >= width:
        out.append(off)
        off //= 2
    return tuple(out)


if IS_SIMULATOR:

    def group_sum(x, width):
        return _reduce(x, lambda a, b: a + b, _group_stages(int(width))) if width > 1 else x

    def group_max(x, width):
        return _reduce(x, max, _group_stages(int(width))) if width > 1 else x

    def strided_sum(x, width):
        return _reduce(x, lambda a, b: a + b, _strided_stages(int(width))) if width < WARP_SIZE else x

    def strided_max(x, width):
        return _reduce(x, max, _strided_stages(int(width))) if width < WARP_SIZE else x

else:

    def _xor_reduce(maximum, within_group):
        """The device function ``f(x, width)``: the sum (``maximum``: max) of ``x`` over the lanes ``off``,
        ``off/2``, … apart (xor shuffles): from width/2 down to 1 ``within_group``, else from 16 down to ``width``.
        One function each, calling none: the kernels' PTX stays as when the four were written out."""
        combine = max if maximum else operator.add

        @device
        def reduce(x, width):
            off = width // 2 if within_group else WARP_SIZE // 2
            last = 1 if within_group else width
            while off >= last:
                x = combine(x, shfl_xor_sync(FULL_MASK, x, off))
                off //= 2
            return x

        return reduce

    group_sum = _xor_reduce(False, True)  # over each aligned group of ``width`` lanes (a compile-time power of two)
    group_max = _xor_reduce(True, True)
    strided_sum = _xor_reduce(False, False)  # over the lanes that share ``lane % width``: combines a warp's groups
    strided_max = _xor_reduce(True, False)

# -- warpgroup exchange (simulator fallback of the warpgroup-wide wgmma) --------

if IS_SIMULATOR:
    def group_exchange(value, warps):
        """Like :func:`warp_exchange` over the ``warps`` consecutive warps of a
        group aligned to a multiple of ``warps`` (a Hopper warpgroup is 4): every
        thread passes its value and gets the list of all the group's values,
        ordered by thread index within the group. The block must hold whole
        groups; a thread that never arrives makes the others time out."""
        t, mgr = kernel_thread("group_exchange")
        bx, by, bz = mgr._block_dim
        n = WARP_SIZE * int(warps)
        if (bx * by * bz) % n:
            raise RuntimeError(f"a warpgroup exchange needs whole groups of {n} threads "
                               f"(block of {bx * by * bz})")
        grp, idx = divmod(t.thread_id, n)
        st = _state(mgr, (tuple(t.blockIdx), "group", n, grp), n, n)
        return _exchange(st, idx, value, "warpgroup exchange timed out: not every thread of the group reached it "
                                         "(divergent wgmma)")

else:

    def group_exchange(value, warps):  # pragma: no cover - simulator only
        raise RuntimeError("group_exchange is the simulator's fallback mechanism")
