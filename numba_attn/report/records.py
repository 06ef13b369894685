"""Committed results files, read for the generated docs (phase cards, README tables).

A results file (``results/<benchmark>-<gpu>.jsonl``) is JSON lines written by the
runner: an ``env`` record, then ``ceiling`` and ``result`` rows carrying its
``run_id``. Only the files directly under ``results/`` count as committed
results; ``results/archive/`` is the lab notebook and is not read here.
"""
from __future__ import annotations

import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def repo_path(*parts: str) -> str:
    return os.path.join(ROOT, *parts)


def rel(path: str) -> str:
    """``path`` relative to the repository root, with forward slashes."""
    return os.path.relpath(os.path.abspath(path), ROOT).replace(os.sep, "/")


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def results_files(root: str | None = None) -> list[str]:
    """The committed results files (``results/*.jsonl``), sorted by name."""
    return sorted(glob.glob(os.path.join(root or repo_path("results"), "*.jsonl")))


def with_env(records: list[dict]) -> list[tuple[dict | None, dict]]:
    """Each ``result``/``ceiling`` row with the ``env`` record of its run."""
    envs = {r["run_id"]: r for r in records if r.get("type") == "env" and r.get("run_id") is not None}
    last = None
    out = []
    for r in records:
        if r.get("type") == "env":
            last = r
            continue
        # a row without a run id (a script's own rows) belongs to the env record written before it
        out.append((envs.get(r.get("run_id"), last) if r.get("run_id") is not None else last, r))
    return out


def commit_of(row: dict, env: dict | None) -> str:
    c = row.get("commit") or (env or {}).get("commit")
    return str(c) if c else "not recorded"


def gpu_of(row: dict, env: dict | None) -> str:
    return str(row.get("gpu") or (env or {}).get("gpu") or "?")


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def plot_stem(path: str, records: list[dict] | None = None) -> str:
    """The plot-file prefix of a results file: ``roadmap-nvidia-h200.jsonl`` →
    ``roadmap`` (plots ``plots/roadmap_*.png``); '' when the name carries no
    benchmark part (``nvidia-h200.jsonl``)."""
    stem = os.path.basename(path)[:-len(".jsonl")] if path.endswith(".jsonl") else os.path.basename(path)
    records = records if records is not None else load(path)
    gpus = {_slug(r["gpu"]) for r in records if r.get("type") == "env" and r.get("gpu")}
    for g in sorted(gpus, key=len, reverse=True):
        if stem == g:
            return ""
        if stem.endswith("-" + g):
            return stem[:-len(g) - 1].replace("-", "_")
    return stem.replace("-", "_")


def plots_of(path: str, records: list[dict] | None = None, plots_dir: str | None = None) -> list[str]:
    """The committed PNG plots drawn from the results file ``path`` (by ``numba-attn bench``)."""
    stem = plot_stem(path, records)
    if not stem:
        return []
    d = plots_dir or repo_path("plots")
    return sorted(glob.glob(os.path.join(d, f"{stem}_*.png")))


def fmt_sig(x, sig: int = 3) -> str:
    """``x`` with ``sig`` significant digits (at least one decimal below 100, none above 1000)."""
    if x is None:
        return "—"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}" if sig > 3 else f"{x:.0f}"
    digits = sig - 1 - int(__import__("math").floor(__import__("math").log10(abs(x))))
    return f"{x:.{max(digits, 0)}f}"


def fmt_ms(ms) -> str:
    """A kernel time: 191.5 ms, 31.0 ms, 4.24 ms, 0.391 ms."""
    if ms is None:
        return "—"
    return f"{fmt_sig(ms, 4 if ms >= 100 else 3)} ms"


def fmt_us(ms) -> str:
    return "—" if ms is None else f"{fmt_sig(ms * 1000.0, 3)} µs"
