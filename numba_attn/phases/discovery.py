"""Phases in files outside the package: how they are found and imported.

The registry (:func:`numba_attn.phases.registry.load_all`) calls :func:`load_discovered` once, after the
package's own phases: the ``.py`` files and directories of ``$NUMBA_ATTN_PHASES`` (``os.pathsep``-separated)
and the modules of the ``numba_attn.phases`` entry points. A file or entry point that fails is recorded in
``numba_attn.phases.BROKEN`` (``numba-attn list`` prints it), never raised, and nothing it registered stays.
``--setup PATH`` and ``numba_attn.load_phases`` (:mod:`numba_attn.userphases`) load files through
:func:`load_spec`.

A file is imported as the module ``numba_attn_user.<file stem>`` — stable, the same in every process (a
second file of the same stem gets a suffix from its path's hash) — so that its source, and its diff against
its parent, can be read back. Loading a file again re-runs it only when it changed (or its phases were
unregistered): the new version's phases replace the old. In a directory, files named ``_*.py``,
``test_*.py`` or ``*_test.py``, ``conftest.py`` and ``setup.py`` are not phase files.

This module imports nothing of the package: the registry is passed in (``registry``: name → Phase).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import linecache
import os
import re
import sys
import traceback
import types

ENV_VAR = "NUMBA_ATTN_PHASES"
ENTRY_POINT_GROUP = "numba_attn.phases"
USER_PACKAGE = "numba_attn_user"

# absolute path of a loaded file → {"module", "given" (the path as given), "digest", "phases" (names)}
FILES: dict[str, dict] = {}

_SKIP_FILE = re.compile(r"^(_|test_)|(_test\.py$)|^(conftest|setup)\.py$")


def is_path_spec(spec: str) -> bool:
    """Whether ``spec`` (of ``--setup`` or ``load_phases``) names a file or directory rather than a module:
    it ends in ``.py`` or holds a path separator, or it exists as a path and is no importable module."""
    spec = os.fspath(spec)
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return True
    if not os.path.exists(spec):
        return False
    if all(part.isidentifier() for part in spec.split(".")):
        try:
            return importlib.util.find_spec(spec) is None
        except (ImportError, ValueError):
            return True
    return True


def phase_files(directory: str) -> list[str]:
    """The phase files of ``directory``: its ``.py`` files (not recursive), tests and private files left out."""
    return [os.path.join(directory, f) for f in sorted(os.listdir(directory))
            if f.endswith(".py") and not _SKIP_FILE.search(f)]


def _module_name(path: str) -> str:
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0]) or "phase"
    if stem[0].isdigit():
        stem = "_" + stem
    name = f"{USER_PACKAGE}.{stem}"
    taken = {info["module"]: p for p, info in FILES.items()}
    if taken.get(name, path) != path:
        name += "_" + hashlib.sha1(path.encode()).hexdigest()[:8]
    return name


def _user_package():
    pkg = sys.modules.get(USER_PACKAGE)
    if pkg is None:
        pkg = types.ModuleType(USER_PACKAGE, "Phases loaded from user files (numba_attn.phases.discovery).")
        pkg.__path__ = []
        sys.modules[USER_PACKAGE] = pkg
    return pkg


def _phases_of(registry: dict, module: str) -> list:
    return [p for p in registry.values() if p.module == module or p.module.startswith(module + ".")]


def _registered_during(registry: dict, before: dict, module: str) -> list:
    new = [p for n, p in registry.items() if before.get(n) is not p]
    return new + [p for p in _phases_of(registry, module) if p not in new]


def _restore(registry: dict, before: dict):
    registry.clear()
    registry.update(before)


def load_file(path: str, registry: dict, given: str | None = None):
    """Import the phase file ``path`` (again when it changed); ``(module, the phases it registered)``.
    An exception in the file is raised, with the registry and ``sys.modules`` as they were."""
    ab = os.path.abspath(path)
    if not os.path.isfile(ab):
        raise FileNotFoundError(f"no such phase file: {given or path}")
    if not ab.endswith(".py"):
        raise ValueError(f"{given or path}: a phase file is a .py file")
    with open(ab, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()
    info = FILES.get(ab)
    if info is not None and info["digest"] == digest and info["module"] in sys.modules:
        current = [registry.get(n) for n in info["phases"]]
        if all(p is not None and p.module == info["module"] for p in current):
            return sys.modules[info["module"]], current  # unchanged and still registered
    name = info["module"] if info is not None else _module_name(ab)
    before = dict(registry)
    for p in _phases_of(registry, name):  # the previous version's phases: replaced by this run of the file
        registry.pop(p.name, None)
    pkg = _user_package()
    old_module = sys.modules.get(name)
    spec = importlib.util.spec_from_file_location(name, ab)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    linecache.checkcache(ab)
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        _restore(registry, before)
        if old_module is not None:
            sys.modules[name] = old_module
        else:
            sys.modules.pop(name, None)
        raise
    setattr(pkg, name.rsplit(".", 1)[1], mod)
    phases = _registered_during(registry, before, name)
    FILES[ab] = {"module": name, "given": given or path, "digest": digest, "phases": [p.name for p in phases]}
    return mod, phases


def load_module(name: str, registry: dict):
    """Import the module ``name``; ``(module, the phases registered by it or while it was imported)``."""
    before = dict(registry)
    try:
        mod = importlib.import_module(name)
    except BaseException:
        _restore(registry, before)
        raise
    return mod, _registered_during(registry, before, name)


def load_spec(spec: str, registry: dict, given: str | None = None):
    """``(module or None, phases)`` of a file, a directory or a module name (see :func:`is_path_spec`)."""
    spec = os.fspath(spec)
    if not is_path_spec(spec):
        return load_module(spec, registry)
    if os.path.isdir(spec):
        phases = []
        for f in phase_files(spec):
            phases += load_file(f, registry, os.path.join(given or spec, os.path.basename(f)))[1]
        return None, phases
    if not os.path.exists(spec):
        raise FileNotFoundError(f"no such phase file or directory: {given or spec}")
    return load_file(spec, registry, given)


def summary(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def load_discovered(broken: dict, registry: dict) -> None:
    """Load the files of ``$NUMBA_ATTN_PHASES`` and the ``numba_attn.phases`` entry points into ``registry``;
    a failure is recorded in ``broken`` (what failed → error summary), never raised."""
    for entry in [e for e in os.environ.get(ENV_VAR, "").split(os.pathsep) if e.strip()]:
        if os.path.isdir(entry):
            files = phase_files(entry)
        elif os.path.isfile(entry) and entry.endswith(".py"):
            files = [entry]
        else:
            why = "no such file or directory" if not os.path.exists(entry) else "not a .py file or a directory"
            broken[entry] = f"{ENV_VAR}: {why}"
            continue
        for f in files:
            try:
                load_file(f, registry, f)
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                broken[f] = summary(exc)
    try:
        from importlib.metadata import entry_points

        eps = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # noqa: BLE001
        broken[f"entry points {ENTRY_POINT_GROUP}"] = summary(exc)
        return
    for ep in eps:
        before = dict(registry)
        try:
            obj = ep.load()
            if ep.attr and callable(obj):
                obj()
        except Exception as exc:  # noqa: BLE001
            _restore(registry, before)
            broken[f"{ep.value} (entry point {ep.name})"] = summary(exc)
