"""numba-attn: prototype GPU attention kernels with Numba, one optimization at a time.

The backend (real CUDA or the CUDA simulator) is chosen when numba is first
needed, before numba is imported: see :mod:`numba_attn.gpu.backend`. The names
below are loaded lazily so that the CLI can pick the backend from its
arguments first.
"""
import importlib

__version__ = "0.1.0"

# NumPy-only modules (no numba): safe to import before the backend is chosen.
# ``reference`` is both a module and its main function; the function wins here.
from numba_attn.spec.problem import PRESETS, Problem  # noqa: E402,F401
from numba_attn.spec.reference import check, reference  # noqa: E402,F401

_LAZY = {
    "BACKEND": "gpu.backend", "IS_SIMULATOR": "gpu.backend",
    "list_phases": "phases.registry", "get_phase": "phases.registry", "register_phase": "phases.registry", "register_variant": "phases.registry",
    "Launch": "phases.registry", "temporary_phases": "phases.registry",
    "load_phases": "userphases", "new_phase": "userphases", "phase_diff": "report.diff",
    "attention": "api", "attention_varlen": "api", "decode_paged": "api", "explain": "api", "clear_plans": "api", "plan_cache_info": "api",
    "attention_fp8": "api_fp8",
    "run": "measure.sweep", "RunConfig": "measure.config",
    "attention_backward": "backward", "grad_reference": "spec.grad_reference",
}
# ``numba_attn.measure`` is the measurement subpackage; one row is ``numba_attn.measure.row.measure``.
_SUBPACKAGES = ("spec", "gpu", "phases", "measure", "report", "api", "cli", "testing", "userphases")

__all__ = sorted([*_LAZY, "Problem", "PRESETS", "reference", "check"])


def __getattr__(name):
    if name in _LAZY:
        mod = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(mod, name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'numba_attn' has no attribute {name!r}")
