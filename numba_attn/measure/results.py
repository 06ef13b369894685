"""Results files: JSON lines, appended and flushed one record at a time, read back for reports and resume.

A file holds one ``env`` record per run (environment, commit, source hash, command), ``ceiling``
records, then ``result`` rows. ``task_key``/``row_key`` give a row's identity (what was run, on
what, with which requested parameters), so that a resumed run skips the rows a file already
holds for the same source and environment (``env_key``).
"""
from __future__ import annotations

import json
import os

import numpy as np

from numba_attn.spec.problem import Problem


class ResultsWriter:
    """Appends JSON lines and flushes each one, so an interrupted run leaves a valid file."""

    def __init__(self, path: str | None):
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            # a previous run killed mid-line: end that line so the next record starts clean
            if os.path.exists(path) and os.path.getsize(path) > 0:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    last = f.read(1)
                if last != b"\n":
                    with open(path, "a", encoding="utf-8") as f:
                        f.write("\n")

    def write(self, record: dict):
        if not self.path:
            return
        line = json.dumps(record, default=json_default, allow_nan=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def json_default(o):
    """NumPy scalars as Python numbers; anything else as its ``str``."""
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return str(o)


def load_results(path: str) -> list[dict]:
    """Every record of a results file; a truncated line (a run killed while
    writing) is skipped, so an interrupted file always loads."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def resumable_rows(path: str | None, env_key: str) -> list[dict]:
    """The result and ceiling rows of ``path`` measured with the same source and environment."""
    if not path or not os.path.exists(path):
        return []
    return [r for r in load_results(path) if r.get("type") in ("result", "ceiling") and r.get("env_key") == env_key]


def task_key(kind: str, name: str, problem: Problem | dict | None, params: dict | None) -> str:
    """Identity of a row for ``resume``: what was run, on what, with which parameters."""
    prob = problem.to_dict() if isinstance(problem, Problem) else problem
    return json.dumps([kind, name, prob, params or {}], sort_keys=True, default=json_default)


def row_key(row: dict) -> str:
    """:func:`task_key` of a recorded row (its requested parameters, not the resolved ones)."""
    if row.get("type") == "ceiling":
        return task_key("ceiling", row.get("name"), None, None)
    params = row.get("requested_params") if "requested_params" in row else None
    return task_key(row.get("kind"), row.get("phase"), row.get("problem"), params)
