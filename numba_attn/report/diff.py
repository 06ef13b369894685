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
Options resolved: a function called with compile-time constants (a literal
``skip=True``, ``loads="tma"``, a constant default, a constant of its caller)
is shown with the ``if`` branches they rule out pruned, named with the
constants that decided them (``make_register_blocked[skip=True]``).
What the code is (pruning, following): :mod:`numba_attn.report.codeview`.

    numba-attn diff register_blocked                 # unified diff of the files, parent → phase
    numba-attn diff register_blocked --stat          # lines added / removed
    numba-attn diff pingpong --code                  # code only, the shared functions it calls included
    numba-attn diff pingpong --code --stat
"""
from __future__ import annotations

import difflib
import inspect
import os
import sys

from numba_attn.report.codeview import FOLLOW_DEPTH, NOT_FOLLOWED, code_units, evaluate, strip_to_code  # noqa: F401
from numba_attn.userphases import shown_path as rel


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


def _unit_label(side: str, phase, unit: str) -> str:
    if not unit:
        return _label(side, rel(phase.source_file))
    mod, qualname = unit.split(":", 1)
    path = rel(inspect.getsourcefile(sys.modules[mod]) or mod)
    return f"{_label(side, path)}:{qualname}"


def _code_diffs(phase, parent):
    """([(from label, to label, parent lines, phase lines)] for the file and every followed unit that
    differs, [the units both use unchanged]). A function compiled with other constants on the phase's side
    is diffed against its most similar form on the parent's side (the parent's other forms are not shown)."""
    b_units = code_units(phase)
    a_units = code_units(parent, own=any(u.split(":")[0] == parent.module for u in b_units))
    shared_texts = ({(u.split("[")[0], t) for u, t in a_units.items()}
                    & {(u.split("[")[0], t) for u, t in b_units.items()})
    shared = sorted({u.split("[")[0] for u, t in b_units.items() if u and (u.split("[")[0], t) in shared_texts})
    left = {u: t for u, t in a_units.items() if (u.split("[")[0], t) not in shared_texts}
    right = {u: t for u, t in b_units.items() if (u.split("[")[0], t) not in shared_texts}
    pairs, used = [], set()
    for unit in sorted(right, key=lambda u: (u != "", u)):
        base = unit.split("[")[0]
        options = [u for u in a_units if u.split("[")[0] == base]  # shared forms too: the closest may be one
        best = max(options, key=lambda u: difflib.SequenceMatcher(None, a_units[u], right[unit]).quick_ratio(),
                   default=None)
        pairs.append((best, unit))
        used.add(best)
    bases = {u.split("[")[0] for u in b_units}  # a form of a function the phase also compiles is no removal
    pairs += [(unit, None) for unit in sorted(left) if unit not in used and unit.split("[")[0] not in bases]
    pairs.sort(key=lambda pair: (bool(pair[1] or pair[0]), (pair[1] or pair[0]).split("[")[0]))
    out = []
    for a, b in pairs:
        out.append((_unit_label("a", parent, a) if a is not None else "/dev/null",
                    _unit_label("b", phase, b) if b is not None else "/dev/null",
                    a_units.get(a, "").splitlines(keepends=True) if a is not None else [],
                    b_units.get(b, "").splitlines(keepends=True) if b is not None else []))
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
