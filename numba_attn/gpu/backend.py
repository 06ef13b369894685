"""Backend selection: real CUDA or Numba's CUDA simulator.

Numba reads ``NUMBA_ENABLE_CUDASIM`` once, when it is first imported, so the
choice has to be made before anything imports numba. ``numba_attn`` imports
this module first and decides here:

* ``NUMBA_ATTN_BACKEND=simulator`` (or ``NUMBA_ENABLE_CUDASIM=1``) forces the
  simulator;
* ``NUMBA_ATTN_BACKEND=cuda`` forces real CUDA (and fails if there is no GPU);
* otherwise (``auto``) CUDA is used when the driver reports a device, the
  simulator when it does not.
"""
from __future__ import annotations

import ctypes
import os
import sys

SIMULATOR = "simulator"
CUDA = "cuda"


def gpu_present() -> bool:
    """True when the CUDA driver loads and reports at least one device.

    Asks libcuda directly so that numba need not be imported to decide.
    """
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.cuInit(0) != 0:
                return False
            count = ctypes.c_int(0)
            if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                return False
            return count.value > 0
        except AttributeError:
            return False
    return False


def _requested() -> str:
    want = (os.environ.get("NUMBA_ATTN_BACKEND") or "auto").strip().lower()
    if want in ("sim", "cudasim"):
        want = SIMULATOR
    if want not in ("auto", SIMULATOR, CUDA):
        raise ValueError(
            f"NUMBA_ATTN_BACKEND={want!r}: expected 'auto', 'cuda' or 'simulator'")
    if want == "auto" and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        want = SIMULATOR
    return want


def select(backend: str | None = None) -> str:
    """Choose the backend and set ``NUMBA_ENABLE_CUDASIM`` accordingly.

    Must run before numba is imported; if numba is already imported in a
    different mode, raises with a message saying how to restart.
    """
    want = backend or _requested()
    if want == "auto":
        want = CUDA if gpu_present() else SIMULATOR
    if "numba" in sys.modules:
        from numba import config  # already imported: we can only check
        active = SIMULATOR if config.ENABLE_CUDASIM else CUDA
        if active != want:
            raise RuntimeError(
                f"numba was imported with the {active} backend before numba_attn could "
                f"select {want}. Set NUMBA_ATTN_BACKEND={want} (or NUMBA_ENABLE_CUDASIM="
                f"{int(want == SIMULATOR)}) before anything imports numba, e.g. restart "
                "the kernel/interpreter.")
        return active
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if want == SIMULATOR else "0"
    os.environ["NUMBA_ATTN_BACKEND"] = want
    return want


BACKEND = select()
IS_SIMULATOR = BACKEND == SIMULATOR
if IS_SIMULATOR:
    # The simulator runs every CUDA thread as a Python thread and a barrier
    # wakes them one GIL hand-over at a time; a shorter switch interval makes
    # barriers (syncthreads, warp exchanges) about 3x cheaper.
    sys.setswitchinterval(5e-4)


def describe() -> str:
    if IS_SIMULATOR:
        return "simulator (Numba CUDA simulator on the CPU: correctness only, timings not meaningful)"
    return "cuda"
