"""The roadmap: every ``pNN_name.py`` module below is one phase, grouped in
families that share code through their ``common.py``:

* ``cuda_core/``   — prefill on CUDA cores (p00 naive … p12 split-K prefill)
* ``tensor_core/`` — prefill on tensor cores (p20 mma.sync … p24 wgmma overlap)
* ``decode/``      — q_len ≤ 16 against a long KV cache (p30 … p34)

Importing the package registers them all (``registry.py`` holds the registry).
One optimization = one small module whose diff against its parent's module
shows that optimization (``numba-attn diff PHASE``).

A module that fails to import does not take the others down: the failure is
kept in ``BROKEN`` (module name → error summary), reported by
``numba-attn list`` and by the tests, and the remaining phases still run.

Phases outside the package are loaded after these, when the registry is first
read (``registry.load_all``, :mod:`numba_attn.phases.discovery`): the ``.py``
files and directories of ``$NUMBA_ATTN_PHASES`` and the modules of the
``numba_attn.phases`` entry points; one that fails is kept in ``BROKEN`` too
(under its path, or its entry point), never raised.
"""
import importlib
import pkgutil
import re
import traceback

from numba_attn.gpu import backend  # noqa: F401  (chooses CUDA or the simulator before numba is imported)

FAMILIES = ("cuda_core", "tensor_core", "decode")
BROKEN: dict[str, str] = {}


def _import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception as _exc:  # noqa: BLE001 - reported, not hidden
        _tb = traceback.extract_tb(_exc.__traceback__)[-1]
        BROKEN[name.rsplit(".", 1)[-1]] = f"{type(_exc).__name__}: {_exc} (at {_tb.filename}:{_tb.lineno})"


for _family in FAMILIES:
    _pkg = importlib.import_module(f"{__name__}.{_family}")
    for _m in sorted(pkgutil.iter_modules(_pkg.__path__), key=lambda m: m.name):
        if re.match(r"p\d+_", _m.name):
            _import(f"{__name__}.{_family}.{_m.name}")

LOADED = True  # every phase module of the package imported: the registry may now load the phases outside it
