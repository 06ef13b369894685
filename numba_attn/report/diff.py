"""``numba-attn diff PHASE``: the lesson of a phase as a source diff.

The unified diff of the phase's module against its parent's module (the
parent named in the registry, in whichever family it lives). What a family
shares lives in its ``common.py``, so the diff shows the one change. A phase of
your own (a file loaded by ``--setup``, ``$NUMBA_ATTN_PHASES`` or
``numba_attn.load_phases``) is diffed the same way: its file is shown by the path
it was loaded from, the package's files relative to the repository.

    numba-attn diff register_blocked          # unified diff, parent → phase
    numba-attn diff register_blocked --stat   # lines added / removed
"""
from __future__ import annotations

import difflib
import os

from numba_attn.userphases import shown_path as rel


def _read(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines(keepends=True)


def _label(side: str, path: str) -> str:
    """``a/numba_attn/...`` for a file of the repository, the path itself for one outside it."""
    return path if os.path.isabs(path) or path.startswith(("..", "~")) else f"{side}/{path}"


def phase_diff(name: str, context: int = 3) -> str:
    """Header naming both files, then the unified diff parent → phase (``numba-attn diff NAME``)."""
    from numba_attn.phases.registry import get_phase

    phase = get_phase(name)
    if not phase.parent:
        return f"{phase.name} (order {phase.order:g}) has no parent: it is a root of the roadmap " \
               f"({rel(phase.source_file)}).\n"
    parent = get_phase(phase.parent)
    a, b = rel(parent.source_file), rel(phase.source_file)
    head = (f"# {phase.name} (order {phase.order:g}) against its parent {parent.name} (order {parent.order:g})\n"
            f"# parent: {a}\n# phase:  {b}\n")
    body = "".join(difflib.unified_diff(_read(parent.source_file), _read(phase.source_file),
                                        fromfile=_label("a", a), tofile=_label("b", b), n=context))
    if body and not body.endswith("\n"):
        body += "\n"
    return head + (body or "# (no difference)\n")


def phase_diff_stat(name: str) -> str:
    """``git diff --stat``-like summary: lines added and removed against the parent."""
    from numba_attn.phases.registry import get_phase

    phase = get_phase(name)
    if not phase.parent:
        return f"{phase.name} has no parent: nothing to compare.\n"
    parent = get_phase(phase.parent)
    added = removed = 0
    for line in difflib.unified_diff(_read(parent.source_file), _read(phase.source_file), n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    a, b = rel(parent.source_file), rel(phase.source_file)
    total = added + removed
    scale = min(1.0, 40.0 / total) if total else 1.0
    plus, minus = round(added * scale), round(removed * scale)
    return (f"{parent.name} → {phase.name}\n"
            f" {a} → {b} | {total} {'+' * plus}{'-' * minus}\n"
            f" 1 file changed, {added} insertion{'s' * (added != 1)}(+), "
            f"{removed} deletion{'s' * (removed != 1)}(-)\n")
