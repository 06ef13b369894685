"""Every module in this package is a phase (or a family of phases) of the
roadmap; importing the package registers them all. One optimization = one
small module whose diff against its parent's module shows that optimization.
"""
import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
