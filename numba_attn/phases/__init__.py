"""Every module in this package is a phase (or a family of phases) of the
roadmap; importing the package registers them all. One optimization = one
small module whose diff against its parent's module shows that optimization.

A module that fails to import does not take the others down: the failure is
kept in ``BROKEN`` (module name → error summary), reported by
``numba-attn list`` and by the tests, and the remaining phases still run.
"""
import importlib
import pkgutil
import traceback

from .. import backend  # noqa: F401  (chooses CUDA or the simulator before numba is imported)

BROKEN: dict[str, str] = {}

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name.startswith("_"):
        continue
    try:
        importlib.import_module(f"{__name__}.{_m.name}")
    except Exception as _exc:  # noqa: BLE001 - reported, not hidden
        _tb = traceback.extract_tb(_exc.__traceback__)[-1]
        BROKEN[_m.name] = f"{type(_exc).__name__}: {_exc} (at {_tb.filename}:{_tb.lineno})"
