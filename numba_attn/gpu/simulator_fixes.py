"""A fix for a race in Numba's CUDA simulator, installed whenever the simulator is the backend.

The simulator runs each CUDA thread of a block as a Python thread. ``cuda.shared.array`` is
``FakeCUDAShared.array``: the first thread to reach an allocation (identified by its source file
and line) makes the array, and the threads that come later find it in a dict. The lookup and the
insertion are not atomic::

    res = self._allocations.get(caller)
    if res is None:
        res = np.empty(shape, dtype)     # another thread can run here ...
        self._allocations[caller] = res  # ... and the last one to insert wins

When the interpreter switches threads between the lookup and the insertion (more likely under
load, and with the short switch interval :mod:`~numba_attn.gpu.backend` sets), two threads of the
launch's first block get different arrays for one ``__shared__`` array: what one thread writes,
the others never read. A kernel's result is then wrong now and then, in no way a GPU would be
(``tests/test_simulator_fixes.py`` makes the race happen every time by slowing the allocation).
The runner's and ``attention()``'s launches had it fixed already, inside
:func:`~numba_attn.measure.limits.simulated_device_limits`; ``decode_paged()`` and the tests' own
launches did not run under it, and one of them failed once in a while.

:func:`install` replaces the method with one that does the lookup and the insertion under a lock.
Everything else (what identifies an allocation, dynamic shared memory, the refusal of
``alignment``) is the simulator's own.
"""
from __future__ import annotations

import sys
import threading

_lock = threading.Lock()
ORIGINAL = None  # the simulator's own FakeCUDAShared.array, kept for the negative test


def static_shared(alloc, caller, shape, dtype, on_new=None):
    """The static shared array ``caller`` ((file, line) of the ``cuda.shared.array`` call) of the
    simulator's ``FakeCUDAShared`` ``alloc``, looked up and, the first time, made in one step under
    a lock; ``on_new(allocations)`` runs (under the lock) after a new array is added, e.g. to refuse
    what a device would (:func:`numba_attn.measure.limits.simulated_device_limits`)."""
    from numba.cuda.simulator import kernelapi

    if isinstance(dtype, kernelapi.types.Type):  # (the simulator's own names for numba's types)
        dtype = kernelapi.numpy_support.as_dtype(dtype)
    with _lock:
        res = alloc._allocations.get(caller)
        if res is None:
            res = alloc._allocations[caller] = kernelapi.np.empty(shape, dtype)
            if on_new is not None:
                on_new(alloc._allocations)
    return res


def _shared_array(self, shape, dtype, alignment=None):
    if alignment is not None or shape == 0:  # refusal, or dynamic shared memory: no lookup to race
        return ORIGINAL(self, shape, dtype, alignment)
    frame = sys._getframe(1)
    return static_shared(self, (frame.f_code.co_filename, frame.f_lineno), shape, dtype)  # as the simulator keys it


def install() -> None:
    """Make ``cuda.shared.array`` atomic in the simulator (idempotent)."""
    global ORIGINAL
    from numba.cuda.simulator import kernelapi

    if kernelapi.FakeCUDAShared.array is _shared_array:
        return
    ORIGINAL = kernelapi.FakeCUDAShared.array
    kernelapi.FakeCUDAShared.array = _shared_array
