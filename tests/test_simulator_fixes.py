"""The simulator's ``cuda.shared.array`` race (:mod:`numba_attn.gpu.simulator_fixes`): every thread of
a block gets the one array, even when the allocation is slow enough for every thread to look it up
before the first inserts it; the simulator's own method, so slowed, gives threads their own arrays."""
import time

import numpy as np
import pytest
from numba import cuda, int32

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel  # (installs the fix in the simulator)

pytestmark = pytest.mark.simulator


class _SlowNumpy:
    """numpy whose ``empty`` sleeps: every thread of the block reaches the lookup before one inserts."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(*args, **kwargs):
        time.sleep(0.02)
        return np.empty(*args, **kwargs)


def _reversed_through_shared():
    @kernel  # (the simulator swaps the module's global ``cuda`` for its own while the kernel runs)
    def rev(out):
        s = cuda.shared.array(64, int32)
        t = cuda.threadIdx.x
        s[t] = t
        cuda.syncthreads()
        out[cuda.blockIdx.x, t] = s[63 - t]

    out = np.full((2, 64), -1, np.int32)
    rev[2, 64](out)
    return out


def _wrong(out):
    return int((out != np.arange(63, -1, -1)).sum())


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's shared arrays")
def test_slow_shared_allocation_gives_one_array(monkeypatch):
    import numba.cuda.simulator.kernelapi as kernelapi

    from numba_attn.gpu import simulator_fixes

    assert kernelapi.FakeCUDAShared.array is simulator_fixes._shared_array  # installed by numba_attn.gpu.jit
    monkeypatch.setattr(kernelapi, "np", _SlowNumpy())
    assert _wrong(_reversed_through_shared()) == 0


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's shared arrays")
def test_the_simulators_own_allocation_races(monkeypatch):
    """Negative: without the fix, the slowed allocation gives the first block's threads their own arrays."""
    import numba.cuda.simulator.kernelapi as kernelapi

    from numba_attn.gpu import simulator_fixes

    monkeypatch.setattr(kernelapi, "np", _SlowNumpy())
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", simulator_fixes.ORIGINAL)
    out = _reversed_through_shared()
    assert _wrong(out[0]) > 0  # the first block: threads that read their own, unwritten, arrays
    assert _wrong(out[1]) == 0  # the second finds the allocation made (the dict lives for the launch)


# -- the block manager: barriers by a condition variable, no polling --------------------------------------


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's block manager")
def test_barriers_pass_with_threads_that_returned_and_without_polling(monkeypatch):
    """Threads that return early no longer count at a barrier (as in the simulator's own manager); the
    others pass it many times over, and the manager asks no thread whether it is alive while they run."""
    import threading

    @kernel
    def rounds(out, n):
        s = cuda.shared.array(64, int32)
        t = cuda.threadIdx.x
        if t >= 48:  # a quarter of the block leaves at once
            return
        for r in range(n):
            s[t] = t + r
            cuda.syncthreads()
            out[cuda.blockIdx.x, t] += s[47 - t]
            cuda.syncthreads()

    calls = []
    alive = threading.Thread.is_alive
    monkeypatch.setattr(threading.Thread, "is_alive", lambda self: calls.append(1) or alive(self))
    out = np.zeros((2, 48), np.int32)
    rounds[2, 64](out, 20)
    t = np.arange(48)
    assert np.array_equal(out, np.broadcast_to(20 * (47 - t) + sum(range(20)), (2, 48)))
    assert len(calls) < 10


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's block manager")
def test_an_exception_in_one_thread_is_raised_and_stops_the_block():
    @kernel
    def fails(out):
        t = cuda.threadIdx.x
        cuda.syncthreads()
        if t == 5:
            out[100] = 1  # out of bounds: IndexError in the simulator
        cuda.syncthreads()
        out[t] = 1

    out = np.zeros(32, np.int32)
    with pytest.raises(IndexError, match="tid=\\[5"):
        fails[1, 32](out)
