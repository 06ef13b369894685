"""What a ``numba-attn`` command does before its work: the backend of ``--simulator`` / ``--gpu``, the CUDA
check and the ``--setup`` files (numba is imported only inside these functions, after the backend is chosen)."""
from __future__ import annotations

import os
import sys


def select_backend(args):
    """The backend of ``--simulator`` / ``--gpu`` (else $NUMBA_ATTN_BACKEND or auto). A process chooses its
    backend once, before numba is imported: when ``main()`` runs in a process that has chosen the other one
    already (a test, a notebook), the flag is refused rather than ignored, and the environment is left
    alone (worker processes inherit it and must run the backend of this process)."""
    flag = "--simulator" if getattr(args, "simulator", False) else "--gpu" if getattr(args, "gpu", False) else None
    want = {"--simulator": "simulator", "--gpu": "cuda"}.get(flag)
    if want is not None and "numba_attn.gpu.backend" not in sys.modules:
        os.environ["NUMBA_ATTN_BACKEND"] = want
    from numba_attn.gpu import backend

    if want is not None and backend.BACKEND != want:
        if want == backend.CUDA and not backend.gpu_present():
            raise SystemExit("--gpu: no CUDA GPU is available")
        raise SystemExit(f"{flag}: this process already runs the {backend.BACKEND} backend (chosen once, before "
                         f"numba is imported); leave {flag} out, or run numba-attn in a new process")
    return backend


def check_cuda(be):
    """Refuse a GPU run without a GPU or without the CUDA toolkit's NVVM, in one line each."""
    if not be.gpu_present():
        raise SystemExit("--gpu: no CUDA GPU is available")
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as exc:  # noqa: BLE001  (NvvmSupportError and friends)
        raise SystemExit(nvvm_message(exc)) from None


def nvvm_message(exc) -> str:
    return (f"the CUDA toolkit's NVVM (the compiler numba-cuda needs) was not found ({type(exc).__name__}). "
            "Install it with numba-cuda's extra matching the driver: pip install \"numba-cuda[cu12]>=0.30,<0.31\" "
            "(or [cu13]; or this package's extras: pip install -e \".[cu12]\").")


def run_setup(specs):
    """Run the --setup specs here; a relative file or directory becomes absolute in ``specs`` (worker
    processes, Ray actors, may start in another directory)."""
    from numba_attn.measure.isolation import call_setup
    from numba_attn.userphases import absolute_setup

    for i, spec in enumerate(specs):
        try:
            call_setup(spec)
        except Exception as exc:  # noqa: BLE001
            raise SystemExit(f"--setup {spec!r} failed: {type(exc).__name__}: {exc}") from None
        specs[i] = absolute_setup(spec)
