"""Programmatic dependent launch (Hopper): a second kernel whose blocks are
resident before the first kernel has finished.

Split-K decode is two kernels in one stream: the split kernel writes partial
outputs, the combine kernel merges them. A plain launch of the combine only
starts once the split kernel has completed and its blocks have left; the
combine's blocks are then scheduled, start, and load — microseconds of an
attention call that, at B=1, takes ~40 µs. With *programmatic stream
serialization* (CUDA 12, sm_90) the second kernel may be launched while the
first still runs:

* the first kernel executes ``griddepcontrol.launch_dependents``
  (:func:`launch_dependents`) — once every one of its blocks has done so (or
  exited), the dependent grid is launched and its blocks take free slots;
* the dependent kernel executes ``griddepcontrol.wait``
  (:func:`grid_dependency_wait`) before it touches the first kernel's
  results: it returns when the first grid has *completed and its memory
  operations are visible* — the same guarantee a plain stream order gives.

Only the dependent launch carries the attribute (:func:`launch_after`); the
first kernel of the pair is launched normally, so it still waits for all
earlier work in the stream.

On the host, numba has no launch option for this; :func:`launch_after`
prepares the arguments as numba's own launch does and calls
``cuda.core.launch`` with ``LaunchConfig(programmatic_stream_serialization=True)``.
Where that is not possible (the simulator, a device before sm_90, a
``cuda.core`` without the option) it launches normally, and
:func:`pdl_available` says which.

Simulator: the two device functions are no-ops, which is exact there — the
simulator runs one grid to completion before the next starts, so the wait
has nothing to wait for and launching dependents early changes nothing.
"""
from __future__ import annotations

import functools

from numba_attn.gpu.backend import IS_SIMULATOR

if IS_SIMULATOR:

    def grid_dependency_wait():
        """``griddepcontrol.wait`` (no-op in the simulator: earlier grids have completed)."""
        return None

    def launch_dependents():
        """``griddepcontrol.launch_dependents`` (no-op in the simulator)."""
        return None

else:
    from numba_attn.gpu.inline_ptx import ptx_statement

    # until the grids this one depends on have completed and their memory is visible (at once after a plain launch)
    grid_dependency_wait = ptx_statement("griddepcontrol.wait;")
    # this block no longer holds back the launch of a dependent grid
    launch_dependents = ptx_statement("griddepcontrol.launch_dependents;")


@functools.cache
def pdl_available() -> str | None:
    """None when :func:`launch_after` launches with programmatic stream
    serialization here, else the reason it launches normally."""
    if IS_SIMULATOR:
        return "simulator"
    from numba import cuda

    if not cuda.is_available():
        return "no CUDA device"
    cc = cuda.get_current_device().compute_capability
    if cc < (9, 0):
        return f"compute capability {cc[0]}.{cc[1]} < 9.0"
    try:
        from cuda.core import LaunchConfig

        LaunchConfig(grid=1, block=1, programmatic_stream_serialization=True)
    except Exception as exc:  # noqa: BLE001  (older cuda.core: no such option)
        return f"cuda.core LaunchConfig: {type(exc).__name__}: {exc}"
    return None


#: compute capability to compile for when no device is asked (offline compilation sets it)
TARGET_CC: tuple | None = None


def uses_griddepcontrol() -> bool:
    """Whether kernels may contain ``griddepcontrol`` (sm_90 and later, or the simulator)."""
    if IS_SIMULATOR:
        return True
    if TARGET_CC is not None:
        return tuple(TARGET_CC[:2]) >= (9, 0)
    from numba import cuda

    return cuda.is_available() and cuda.get_current_device().compute_capability >= (9, 0)


_COMPILED: dict = {}


def _compiled(kern, args):
    """numba's compiled kernel for these arguments (compiling it if needed)."""
    argtypes = tuple(kern.typeof_pyval(a) for a in args)
    key = (id(kern), argtypes)
    hit = _COMPILED.get(key)
    if hit is None or hit[0] is not kern:
        hit = _COMPILED[key] = (kern, kern.compile(argtypes))
    return hit[1]


def launch_after(kern, grid, block, stream, shmem, *args) -> bool:
    """``kern[grid, block, stream, shmem](*args)`` as a programmatic dependent
    launch on the previous kernel of ``stream`` (True), or a plain launch where
    that is not available (False). ``kern`` must call
    :func:`grid_dependency_wait` before it reads what the previous kernel wrote."""
    if pdl_available() is not None:
        kern[grid, block, stream, shmem](*args)
        return False
    from cuda.core import LaunchConfig, launch
    from numba.cuda.cudadrv import driver

    k = _compiled(kern, args)
    retr, kargs = [], []
    core_stream = driver._to_core_stream(stream)
    for t, v in zip(k.argument_types, args):
        k._prepare_args(t, v, core_stream, retr, kargs)
    cfg = LaunchConfig(grid=grid, block=block, shmem_size=shmem, programmatic_stream_serialization=True)
    launch(core_stream, cfg, k._codelibrary.get_cufunc().kernel, *kargs)
    for wb in retr:
        wb()
    return True


__all__ = ["grid_dependency_wait", "launch_dependents", "launch_after", "pdl_available", "uses_griddepcontrol"]
