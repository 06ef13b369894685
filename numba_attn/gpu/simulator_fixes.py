"""Two fixes to Numba's CUDA simulator, installed whenever the simulator is the backend: a race in
``cuda.shared.array`` and a block manager that waits instead of polling.

**The race.**

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

**The polling.** The simulator's ``BlockManager.run`` finds out that every thread of a block has reached
``syncthreads()`` by looping over the threads' flags and ``is_alive()`` without pause: the main thread takes
the GIL from the block's threads a million times for a few-second kernel (cProfile of a tc_pipelined test:
957,229 ``is_alive`` calls, two thirds of the run). :func:`install` replaces it by a condition variable:
the last thread to arrive at a barrier (or to finish, while others wait) releases it, and the manager sleeps
until every thread has finished or one has raised. The semantics are the simulator's: a barrier is passed
once every thread still running has reached it; a thread's exception aborts the others and is raised.

**The device calls.** Every call of a device function in the simulator enters ``swapped_cuda_module``: a
context manager, two locks and a reference count, to point the function module's ``cuda`` at the launch's
fake module and back (a fifth of a tensor-core kernel's time). :func:`install` swaps a module once, at the
first device call into it during a launch, and restores every swapped module when the launch ends.
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


def _release(mgr) -> None:
    """Let the threads waiting at the block's barrier go on (under ``mgr._na_cond``)."""
    mgr._na_waiting = 0
    mgr._na_generation += 1
    mgr._na_cond.notify_all()


def _syncthreads(self) -> None:
    """``BlockThread.syncthreads``: wait until every running thread of the block has arrived."""
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    mgr = self._manager
    with mgr._na_cond:
        generation = mgr._na_generation
        mgr._na_waiting += 1
        if mgr._na_waiting + mgr._na_done == mgr._na_threads:
            _release(mgr)
        else:
            while mgr._na_generation == generation:
                mgr._na_cond.wait()
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


def _block_run(self, grid_point, *args):
    """``BlockManager.run``: every thread of the block started, then the manager waits for their ends."""
    from numba.cuda.simulator.kernel import BlockThread

    import numpy as np

    self._na_cond = threading.Condition()
    self._na_waiting = self._na_done = self._na_generation = 0
    self._na_threads = int(np.prod(self._block_dim))
    failed = []
    threads = []

    def target():
        try:
            self._f(*args)
        except BaseException:
            failed.append(threading.current_thread())
            raise
        finally:
            with self._na_cond:
                self._na_done += 1
                if self._na_waiting and self._na_waiting + self._na_done == self._na_threads:
                    _release(self)  # (the threads still running all wait: this one will not come)
                self._na_cond.notify_all()

    for block_point in np.ndindex(*self._block_dim):
        t = BlockThread(target, self, grid_point, block_point, self._debug)
        threads.append(t)
    for t in threads:
        t.start()
    with self._na_cond:
        while self._na_done < self._na_threads and not failed:
            self._na_cond.wait()
    if failed:  # abort the others (their next barrier raises), raise the first exception
        bad = failed[0]
        bad.join()  # (BlockThread.run records the exception as it returns)
        for t in threads:
            t.abort = True
        with self._na_cond:
            _release(self)
        raise bad.exception[0].with_traceback(bad.exception[1])
    for t in threads:
        t.join()
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])


_swapped: dict = {}  # id(module globals) -> (globals, the names that held numba.cuda): during one launch
_swap_lock = threading.Lock()


def _calls(original_call):
    """``FakeCUDAKernel.__call__``: a device call swaps its module's ``cuda`` once per launch; a launch restores
    every module swapped during it."""
    from numba import cuda
    from numba.cuda.simulator import kernel

    def call(self, *args):
        context = kernel._kernel_context
        if context is None:  # a launch from the host (or a device function called outside any kernel)
            if self._device:
                return original_call(self, *args)
            try:
                return original_call(self, *args)
            finally:
                with _swap_lock:
                    for g, names in _swapped.values():
                        for name in names:
                            g[name] = cuda
                    _swapped.clear()
        g = self.fn.__globals__
        if id(g) not in _swapped:
            with _swap_lock:
                if id(g) not in _swapped:
                    names = [k for k, v in g.items() if v is cuda]
                    for name in names:
                        g[name] = context
                    _swapped[id(g)] = (g, names)
        return self.fn(*args)

    call._numba_attn = True
    return call


def install() -> None:
    """Make ``cuda.shared.array`` atomic, the block manager event-driven and device calls cheap in the
    simulator (idempotent)."""
    global ORIGINAL
    from numba.cuda.simulator import kernel, kernelapi

    if kernelapi.FakeCUDAShared.array is _shared_array:
        return
    ORIGINAL = kernelapi.FakeCUDAShared.array
    kernelapi.FakeCUDAShared.array = _shared_array
    kernel.BlockThread.syncthreads = _syncthreads
    kernel.BlockManager.run = _block_run
    if not getattr(kernel.FakeCUDAKernel.__call__, "_numba_attn", False):
        kernel.FakeCUDAKernel.__call__ = _calls(kernel.FakeCUDAKernel.__call__)
