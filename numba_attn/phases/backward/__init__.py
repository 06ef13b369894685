"""The backward family: phases that compute dQ, dK, dV (``numba_attn.attention_backward``), kind
``"backward"``. Every ``bNN_name.py`` module here is one phase; ``common.py`` holds what they share.

The registry imports this package when it loads the forward families (``registry.load_all``); a module that
fails to import is kept in ``numba_attn.phases.BROKEN``, like a forward one, and the others still register.
``list_phases()`` lists the forward phases; ``list_phases("backward")`` these.
"""
import importlib
import pkgutil
import re
import traceback

from numba_attn.phases import BROKEN

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if re.match(r"b\d+_", _m.name):
        try:
            importlib.import_module(f"{__name__}.{_m.name}")
        except Exception as _exc:  # noqa: BLE001 - reported, not hidden
            _tb = traceback.extract_tb(_exc.__traceback__)[-1]
            BROKEN[_m.name] = f"{type(_exc).__name__}: {_exc} (at {_tb.filename}:{_tb.lineno})"
