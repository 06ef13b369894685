"""No module of numba_attn reaches into another one's private names (``_name``): what a module offers to
the others has a public name. Read from the source with ``ast`` (nothing is imported): ``from numba_attn.x
import _y``, relative imports alike, and ``x._y`` where ``x`` is an imported numba_attn module. numba's own
private names (``numba.cuda...``) and other libraries' are not the project's and are not checked."""
import ast
import pathlib

import numba_attn

PACKAGE = pathlib.Path(numba_attn.__file__).parent
ROOT = PACKAGE.parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _source(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(path: pathlib.Path, module: str | None = None) -> list[str]:
    """``file:line: what`` for each private name of another numba_attn module that ``path`` (the module
    ``module``, by default the one at that path) uses."""
    module = module or _module_name(path)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], {}  # modules: local name -> numba_attn module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = _source(node, module, path.name == "__init__.py")
            if src != "numba_attn" and not src.startswith("numba_attn."):
                continue
            for alias in node.names:
                if _private(alias.name) and src != module:
                    found.append(f"{shown}:{node.lineno}: from {src} import {alias.name}")
                if _is_module(f"{src}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{src}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("numba_attn"):
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:
                        modules["numba_attn"] = "numba_attn"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in modules:
            target = ".".join([modules[value.id], *reversed(chain)])
            if _is_module(target) and target != module:
                found.append(f"{shown}:{node.lineno}: {target}.{node.attr}")
    return found


def test_no_module_imports_a_private_name_of_another():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in private_imports(path)]
    assert not found, "private names used across modules (give them a public name):\n" + "\n".join(found)


def test_the_check_sees_each_form(tmp_path):
    text = ("from numba_attn.measure.timing import _hidden\n"
            "from .sweep import _also\n"
            "from numba_attn.phases import registry\n"
            "import numba_attn.measure.tune as tuning\n"
            "from numba.cuda.cudadrv.driver import _to_core_stream\n"
            "x = registry._REGISTRY, tuning._cache, registry.__name__\n")
    probe = tmp_path / "probe.py"
    probe.write_text(text, encoding="utf-8")
    found = private_imports(probe, "numba_attn.measure.probe")
    assert [line.split(": ", 1)[1] for line in found] == [
        "from numba_attn.measure.timing import _hidden", "from numba_attn.measure.sweep import _also",
        "numba_attn.phases.registry._REGISTRY", "numba_attn.measure.tune._cache"]
