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
