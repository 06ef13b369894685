"""``cuda.jit`` with the project's defaults, usable under both backends.

The simulator's ``cuda.jit`` refuses GPU-only options (``forceinline``,
``lineinfo``, ``max_registers``, ``launch_bounds``, ``cache``); these wrappers
drop them there so a phase is written once.

* :func:`kernel` — a ``__global__`` kernel, ``fastmath=True`` by default
  (ftz, approximate division/sqrt, FMA contraction, ``math.exp`` → ``ex2.approx``).
* :func:`device` — a device function, force-inlined at the NVVM IR level.
"""
from __future__ import annotations

from numba import cuda

from numba_attn.gpu.backend import IS_SIMULATOR

if IS_SIMULATOR:
    from numba_attn.gpu import simulator_fixes

    simulator_fixes.install()  # cuda.shared.array made atomic (a race in the simulator's allocation)

_GPU_ONLY = ("forceinline", "lineinfo", "max_registers", "launch_bounds", "cache")


def _opts(opts: dict) -> dict:
    if IS_SIMULATOR:
        return {k: v for k, v in opts.items() if k not in _GPU_ONLY}
    return opts


def kernel(fn=None, **opts):
    opts = _opts({"fastmath": True, **opts})
    if fn is None:
        return lambda f: cuda.jit(**opts)(f)
    return cuda.jit(**opts)(fn)


def device(fn=None, **opts):
    opts = _opts({"device": True, "forceinline": True, "fastmath": True, **opts})
    if fn is None:
        return lambda f: cuda.jit(**opts)(f)
    return cuda.jit(**opts)(fn)
