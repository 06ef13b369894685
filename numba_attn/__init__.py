"""numba-attn: prototype GPU attention kernels with Numba, one optimization at a time.

The backend (real CUDA or the CUDA simulator) is chosen when numba is first
needed, before numba is imported: see :mod:`numba_attn.backend`. The names
below are loaded lazily so that the CLI can pick the backend from its
arguments first.
"""
import importlib

__version__ = "0.1.0"

# NumPy-only modules (no numba): safe to import before the backend is chosen.
# ``reference`` is both a module and its main function; the function wins here.
from .problem import PRESETS, Problem  # noqa: E402,F401
from .reference import check, reference  # noqa: E402,F401

_LAZY = {
    "BACKEND": "backend", "IS_SIMULATOR": "backend",
    "list_phases": "registry", "get_phase": "registry", "register_phase": "registry", "Launch": "registry",
    "attention": "api",
    "run": "runner", "measure": "runner", "RunConfig": "runner",
}

__all__ = sorted([*_LAZY, "Problem", "PRESETS", "reference", "check"])


def __getattr__(name):
    if name in _LAZY:
        mod = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(mod, name)
    if name in ("runner", "registry", "problem", "api", "backend", "timing", "env",
                "peers", "warp", "device_functions", "jit", "phases", "report", "errors"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'numba_attn' has no attribute {name!r}")
