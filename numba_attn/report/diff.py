"""``numba-attn diff PHASE``: the lesson of a phase as a source diff.

The unified diff of the phase's module against its parent's module (the
parent named in the registry, in whichever family it lives). A phase of your
own (a file loaded by ``--setup``, ``$NUMBA_ATTN_PHASES`` or
``numba_attn.load_phases``) is diffed the same way: its file is shown by the path
it was loaded from, the package's files relative to the repository.

``--code`` diffs the code the phase compiles instead of its file: docstrings,
comments, imports and the ``@register_phase(...)`` arguments are dropped (the
remaining lines are the author's, as written), and the functions and classes
the file uses from the family's shared modules (names imported from
``numba_attn.phases.*``, followed a few calls deep) are added, each diffed
against the parent's when they differ. A phase whose idea lives in a role
function (a consumer variant, a scheduler) shows that function's code.

    numba-attn diff register_blocked                 # unified diff of the files, parent → phase
    numba-attn diff register_blocked --stat          # lines added / removed
    numba-attn diff pingpong --code                  # code only, the shared functions it calls included
    numba-attn diff pingpong --code --stat
"""
from __future__ import annotations

import ast
import difflib
import inspect
import io
import os
import sys
import textwrap
import tokenize
import types

from numba_attn.userphases import shown_path as rel

# How many calls deep --code follows a name from the phase's file into the shared modules
FOLLOW_DEPTH = 3
# Modules whose functions are the registry's machinery, not the kernel's code
NOT_FOLLOWED = ("numba_attn.phases.registry", "numba_attn.phases.discovery")


def _read(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines(keepends=True)


def _label(side: str, path: str) -> str:
    """``a/numba_attn/...`` for a file of the repository, the path itself for one outside it."""
    return path if os.path.isabs(path) or path.startswith(("..", "~")) else f"{side}/{path}"


def _pair(name: str):
    """(phase, parent) from the registry; parent None for a root of the roadmap."""
    from numba_attn.phases.registry import get_phase

    phase = get_phase(name)
    return phase, (get_phase(phase.parent) if phase.parent else None)


def _unified(a: list[str], b: list[str], fromfile: str, tofile: str, context: int) -> str:
    body = "".join(difflib.unified_diff(a, b, fromfile=fromfile, tofile=tofile, n=context))
    return body if not body or body.endswith("\n") else body + "\n"


def _count(a: list[str], b: list[str]) -> tuple[int, int]:
    added = removed = 0
    for line in difflib.unified_diff(a, b, n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


# ---------------------------------------------------------------- code only


def _is_register_phase(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else node
    return (isinstance(func, ast.Name) and func.id == "register_phase") or \
        (isinstance(func, ast.Attribute) and func.attr == "register_phase")


def strip_to_code(source: str) -> str:
    """``source`` without docstrings, comments, imports, blank runs and ``@register_phase(...)`` arguments;
    the other lines as written."""
    source = textwrap.dedent(source)
    lines = source.splitlines()
    drop: set[int] = set()  # 0-based line numbers
    replace: dict[int, str] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                drop.update(range(body[0].lineno - 1, body[0].end_lineno))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(range(node.lineno - 1, node.end_lineno))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                if _is_register_phase(dec) and dec.end_lineno > dec.lineno:
                    indent = lines[dec.lineno - 1][:len(lines[dec.lineno - 1]) - len(lines[dec.lineno - 1].lstrip())]
                    replace[dec.lineno - 1] = f"{indent}@register_phase(...)"
                    drop.update(range(dec.lineno, dec.end_lineno))
    cut: dict[int, int] = {}  # line → column where its comment starts
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0] - 1] = tok.start[1]
    out: list[str] = []
    for i, line in enumerate(lines):
        if i in drop:
            continue
        line = replace.get(i, line)
        if i in cut:
            line = line[:cut[i]].rstrip()
            if not line.strip():
                continue
        if not line.strip() and (not out or not out[-1].strip()):
            continue
        out.append(line.rstrip())
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def _names_used(tree: ast.AST) -> list[tuple[str, ...]]:
    """Every name and dotted attribute chain read in ``tree`` (``a``, ``a.b``, ``a.b.c``), in order."""
    seen, out = set(), []
    for node in ast.walk(tree):
        chain: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and (chain or isinstance(node, ast.Name)):
            key = (cur.id, *reversed(chain))
            if key not in seen:
                seen.add(key)
                out.append(key)
    return out


def _followed(obj) -> bool:
    mod = getattr(obj, "__module__", "") or ""
    return mod.startswith("numba_attn.phases.") and mod not in NOT_FOLLOWED


def _resolve(namespace: dict, chain: tuple[str, ...]):
    obj = namespace.get(chain[0])
    for attr in chain[1:]:
        if not isinstance(obj, types.ModuleType):
            break
        obj = getattr(obj, attr, None)
    return obj


def _source_of(obj):
    """(module, qualified name, source) of a function or class of the package's phases, else None."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if getattr(obj, "py_func", None) is not None:  # a numba dispatcher
        obj = obj.py_func
    if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not _followed(obj):
        return None
    try:
        return obj.__module__, obj.__qualname__, inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def code_units(phase, depth: int = FOLLOW_DEPTH) -> dict[str, str]:
    """{unit: stripped code} of what ``phase`` compiles: its file (unit ``""``), and every function or
    class of the package's other phase modules its file uses, followed ``depth`` calls deep (unit
    ``module:qualname``)."""
    module = sys.modules[phase.module]
    units = {"": strip_to_code(inspect.getsource(module))}
    todo = [(vars(module), ast.parse(inspect.getsource(module)), 0)]
    while todo:
        namespace, tree, level = todo.pop(0)
        if level >= depth:
            continue
        for chain in _names_used(tree):
            found = _source_of(_resolve(namespace, chain))
            if found is None or found[0] == phase.module:
                continue
            mod, qualname, src = found
            key = f"{mod}:{qualname}"
            if key in units:
                continue
            units[key] = strip_to_code(src)
            todo.append((vars(sys.modules[mod]), ast.parse(textwrap.dedent(src)), level + 1))
    return units


def _unit_label(side: str, phase, unit: str) -> str:
    if not unit:
        return _label(side, rel(phase.source_file))
    mod, qualname = unit.split(":", 1)
    path = rel(inspect.getsourcefile(sys.modules[mod]) or mod)
    return f"{_label(side, path)}:{qualname}"


def _code_diffs(phase, parent):
    """[(from label, to label, parent lines, phase lines)] for the file and every followed unit that differs."""
    a_units, b_units = code_units(parent), code_units(phase)
    order = [""] + sorted((set(a_units) | set(b_units)) - {""})
    out = []
    for unit in order:
        a, b = a_units.get(unit, ""), b_units.get(unit, "")
        if a == b:
            continue
        out.append((_unit_label("a", parent, unit) if unit in a_units else "/dev/null",
                    _unit_label("b", phase, unit) if unit in b_units else "/dev/null",
                    a.splitlines(keepends=True), b.splitlines(keepends=True)))
    shared = sorted(u for u in set(a_units) & set(b_units) if u and a_units[u] == b_units[u])
    return out, shared


def _params(p) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.params.items()) or "none"


# ---------------------------------------------------------------- entry points


def phase_diff(name: str, context: int = 3, code: bool = False) -> str:
    """Header naming both files, then the unified diff parent → phase (``numba-attn diff NAME``); with
    ``code``, the diff of the code it compiles (``numba-attn diff NAME --code``)."""
    phase, parent = _pair(name)
    if parent is None:
        return f"{phase.name} (order {phase.order:g}) has no parent: it is a root of the roadmap " \
               f"({rel(phase.source_file)}).\n"
    a, b = rel(parent.source_file), rel(phase.source_file)
    head = (f"# {phase.name} (order {phase.order:g}) against its parent {parent.name} (order {parent.order:g})\n"
            f"# parent: {a}\n# phase:  {b}\n")
    if not code:
        body = _unified(_read(parent.source_file), _read(phase.source_file), _label("a", a), _label("b", b), context)
        return head + (body or "# (no difference)\n")
    diffs, shared = _code_diffs(phase, parent)
    head += (f"# code only: no docstrings, comments, imports or registration; with the shared functions each calls\n"
             f"# parameters: {parent.name}: {_params(parent)}\n#             {phase.name}: {_params(phase)}\n")
    if shared:
        head += "# shared and unchanged: " + ", ".join(u.split(":", 1)[1] for u in shared) + "\n"
    body = "".join(_unified(x, y, fa, fb, context) for fa, fb, x, y in diffs)
    return head + (body or "# (no difference in code)\n")


def code_diff_counts(name: str) -> tuple[int, int]:
    """(code lines added, removed) of ``numba-attn diff NAME --code``; (0, 0) for a root."""
    phase, parent = _pair(name)
    if parent is None:
        return 0, 0
    added = removed = 0
    for _, _, a, b in _code_diffs(phase, parent)[0]:
        plus, minus = _count(a, b)
        added, removed = added + plus, removed + minus
    return added, removed


def phase_diff_stat(name: str, code: bool = False) -> str:
    """``git diff --stat``-like summary: lines added and removed against the parent (with ``code``: per unit of
    ``--code``)."""
    phase, parent = _pair(name)
    if parent is None:
        return f"{phase.name} has no parent: nothing to compare.\n"
    a, b = rel(parent.source_file), rel(phase.source_file)
    if code:
        rows = []
        for fa, fb, x, y in _code_diffs(phase, parent)[0]:
            plus, minus = _count(x, y)
            shown = fb if fb != "/dev/null" else fa
            rows.append((shown[2:] if shown.startswith(("a/", "b/")) else shown, plus, minus))
    else:
        plus, minus = _count(_read(parent.source_file), _read(phase.source_file))
        rows = [(f"{a} → {b}", plus, minus)]
    added, removed = sum(r[1] for r in rows), sum(r[2] for r in rows)
    out = [f"{parent.name} → {phase.name}{' (code)' if code else ''}\n"]
    for label, plus, minus in rows:
        total = plus + minus
        scale = min(1.0, 40.0 / total) if total else 1.0
        out.append(f" {label} | {total} {'+' * round(plus * scale)}{'-' * round(minus * scale)}\n")
    what = "file" if len(rows) == 1 else "files"
    out.append(f" {len(rows)} {what if not code else ('unit' if len(rows) == 1 else 'units')} changed, "
               f"{added} insertion{'s' * (added != 1)}(+), {removed} deletion{'s' * (removed != 1)}(-)\n")
    return "".join(out)
