"""What fits: device and host memory a check needs against what is free, and the device limits
the simulator enforces the way a GPU would (threads and shared memory per block).

Everything here runs before a launch, so a problem or a configuration that does not fit becomes
a ``SKIP`` row with the reason (or an ``AttentionInputError`` from ``attention()``), not a crash.
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.spec.problem import Problem

# Device limits the simulator enforces the way a GPU would (see simulated_device_limits).
MAX_THREADS_PER_BLOCK = 1024
MAX_STATIC_SMEM_BYTES = 48 * 1024
MAX_DYNAMIC_SMEM_BYTES = 227 * 1024


class DeviceLimitError(RuntimeError):
    """A launch configuration the device cannot run (threads, shared memory, memory)."""


# -- memory budget -------------------------------------------------------------


def free_device_memory() -> int | None:
    """Free device memory in bytes (None in the simulator or when unknown)."""
    if IS_SIMULATOR:
        return None
    try:
        from numba import cuda

        free, _total = cuda.current_context().get_memory_info()
        return int(free)
    except Exception:  # noqa: BLE001
        return None


def free_host_memory() -> int | None:
    """Available physical host memory in bytes (None when unknown)."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def host_bytes_needed(problem: Problem) -> int:
    """Host memory a check needs: inputs drawn in float32 then cast, the float64
    output of the reference and the output copied back."""
    n_in = problem.batch * (problem.heads * problem.q_len + 2 * problem.kv_heads * problem.kv_len) * problem.head_dim
    n_out = problem.batch * problem.heads * problem.q_len * problem.head_dim
    return n_in * (4 + problem.itemsize) + n_out * (8 + 8 + problem.itemsize)


def device_bytes_needed(problem: Problem) -> int:
    """Device memory a check needs before any workspace: q, k, v and o once."""
    return problem.min_bytes()


# -- device limits in the simulator ------------------------------------------------


@contextlib.contextmanager
def simulated_device_limits():
    """In the simulator, refuse launches a GPU would refuse: more than 1024
    threads per block, more than 48 KiB of static or 227 KiB of dynamic shared
    memory per block. (The simulator itself runs them.)"""
    if not IS_SIMULATOR:
        yield
        return
    from numba.cuda.simulator import kernel as simk
    from numba.cuda.simulator import kernelapi as sima

    from numba_attn.gpu import simulator_fixes

    simulator_fixes.install()  # (the array outside these limits is the locked one too)
    orig_call, orig_array = simk.FakeCUDAKernel.__call__, sima.FakeCUDAShared.array

    def call(self, *args):
        if not self._device and not simk._kernel_context and self.block_dim is not None:
            bd = self.block_dim
            n = int(np.prod([bd] if isinstance(bd, int) else list(bd)))
            if n > MAX_THREADS_PER_BLOCK:
                raise DeviceLimitError(f"a block of {n} threads exceeds the device limit of "
                                       f"{MAX_THREADS_PER_BLOCK} threads per block")
            if self.dynshared_size > MAX_DYNAMIC_SMEM_BYTES:
                raise DeviceLimitError(f"{self.dynshared_size} B of dynamic shared memory exceeds the "
                                       f"device limit of {MAX_DYNAMIC_SMEM_BYTES} B per block")
        return orig_call(self, *args)

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return orig_array(self, shape, dtype, alignment)
        f = sys._getframe(1)  # the simulator keys static arrays by the kernel's source line (not this wrapper's)
        return simulator_fixes.static_shared(self, (f.f_code.co_filename, f.f_lineno), shape, dtype,
                                             on_new=static_limit)

    def static_limit(allocations):
        total = sum(a.nbytes for a in allocations.values())
        if total > MAX_STATIC_SMEM_BYTES:
            raise DeviceLimitError(f"{total} B of static shared memory per block exceeds the device "
                                   f"limit of {MAX_STATIC_SMEM_BYTES} B")

    simk.FakeCUDAKernel.__call__, sima.FakeCUDAShared.array = call, array
    try:
        yield
    finally:
        simk.FakeCUDAKernel.__call__, sima.FakeCUDAShared.array = orig_call, orig_array
