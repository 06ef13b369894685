"""Phase cards: one markdown page per phase, generated from the registry, the
phase's docstring and the committed results files.

    numba-attn card register_blocked            # print one card
    numba-attn card --all --out docs/phases/    # every card + docs/phases/README.md (the index)
    numba-attn card --all --check               # exit 1 when docs/phases/ differs from a regeneration

A card holds: name, order, family, title, parent (and its file), the phase's
file, its tests, its idea (the module docstring), its parameters with their
defaults, what it supports, its planned speedup, its measured rows from
``results/*.jsonl`` and the plots drawn from those files. The cards are
committed (``docs/phases/``); a test regenerates them and compares, so they
cannot drift from the code or the results.

A phase of your own (a file loaded by ``--setup``, ``$NUMBA_ATTN_PHASES`` or
``numba_attn.load_phases``) gets a card too (``numba-attn card NAME``): family
"out of tree", its file by the path it was loaded from, its tests the
``test_NAME.py`` beside it (what ``numba-attn new`` writes). ``--all`` writes
and checks the package's phases only.

A card may end with a hand-written ``## History`` section (the long story of the
phase: earlier attempts, old measurements, what was learnt): a regeneration
keeps it as it stands in the card file, so the docstring can stay short.
"""
from __future__ import annotations

import os
import sys
from collections import Counter

from numba_attn.report import records as rec
from numba_attn.userphases import shown_path

OUT_DIR = "docs/phases"
HISTORY = "## History"

FAMILY_TESTS = {
    "cuda_core": ("tests/test_roadmap.py",),
    "tensor_core": ("tests/test_tensor_core.py", "tests/test_wgmma.py"),
    "decode": ("tests/test_decode.py", "tests/test_pdl.py"),
}

FAMILY_NAMES = {"cuda_core": "CUDA-core prefill", "tensor_core": "tensor-core prefill", "decode": "decode",
                "backward": "backward (gradients)"}

# The problem a phase's "best measured time" is quoted at in the index, when it has a row there
REFERENCE_LABELS = ("B1 H32 N4096 D64 fp32", "B1 H32 N4096 D64 fp16")


def family(phase) -> str:
    """The phase family, from the module path ``numba_attn.phases.<family>.pNN_name``."""
    parts = phase.module.split(".")
    if len(parts) >= 4 and parts[0] == "numba_attn" and parts[1] == "phases":
        return parts[2]
    return ""


def test_files(phase) -> list[str]:
    if not phase.is_builtin:  # a phase of your own: the test beside its file (numba-attn new writes one)
        src = phase.source_file
        mine = os.path.join(os.path.dirname(src), f"test_{phase.name}.py") if src else ""
        if not mine or not os.path.exists(mine):
            return []
        return [os.path.join(os.path.dirname(shown_path(src)), os.path.basename(mine)).replace(os.sep, "/")]
    if phase.kind == "backward":  # tests/test_phases.py runs forward launches only
        return ["tests/test_backward.py"]
    paged = {"paged": ["tests/test_paged.py"], "varlen": ["tests/test_varlen.py"]}.get(getattr(phase, "layout", ""), [])
    return ["tests/test_phases.py", *FAMILY_TESTS.get(family(phase), ()), *paged]


def docstring(phase) -> str:
    import inspect

    mod = sys.modules.get(phase.module)
    doc = inspect.getdoc(mod) if mod is not None else None
    return (doc or phase.description or "").strip()


def idea(phase) -> str:
    """The first sentence-line of the docstring, without a ``Phase N — name:`` prefix."""
    first = docstring(phase).split("\n\n")[0].replace("\n", " ").strip()
    if "—" in first[:40] and ":" in first:
        first = first.split(":", 1)[1].strip()
    return first or phase.title


def measured_rows(name: str, files: list[str] | None = None) -> list[tuple[str, dict | None, dict]]:
    """(results file, env, row) for every ``result`` row of phase ``name`` in the committed results files."""
    out = []
    for path in files if files is not None else rec.results_files():
        for env, row in rec.with_env(rec.load(path)):
            if row.get("type") == "result" and row.get("phase") == name:
                out.append((path, env, row))
    return out


def _params_text(params) -> str:
    if not params:
        return "—"
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _rate(row) -> str:
    parts = []
    if row.get("tflops") is not None:
        parts.append(f"{rec.fmt_sig(row['tflops'])} TFLOP/s")
    if row.get("gbps") is not None:
        parts.append(f"{rec.fmt_sig(row['gbps'])} GB/s")
    return " · ".join(parts) or "—"


def _resources(row) -> str:
    items = [(k, row.get(k)) for k in ("regs", "smem_static", "local_bytes")]
    if all(v is None for _, v in items):
        return "—"
    return " / ".join("—" if v is None else str(v) for _, v in items)


def best_row(rows):
    """The row quoted in the index: the reference problem's when measured, else the fastest OK row."""
    ok = [(p, e, r) for p, e, r in rows if r.get("status") == "OK" and r.get("time_ms")]
    for label in REFERENCE_LABELS:
        at = [x for x in ok if x[2].get("label") == label]
        if at:
            return min(at, key=lambda x: x[2]["time_ms"])
    return min(ok, key=lambda x: x[2]["time_ms"]) if ok else None


def history(name: str, out_dir: str = OUT_DIR) -> str:
    """The hand-written ``## History`` section of the card file ``<out_dir>/<name>.md`` (to its end), or ""."""
    path = os.path.join(out_dir, f"{name}.md")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    at = text.find(f"\n{HISTORY}\n")
    return text[at + 1:] if at >= 0 else ""


def card(name: str, files: list[str] | None = None, out_dir: str | None = None) -> str:
    """The markdown card of phase ``name`` (with the ``## History`` section of its card file under ``out_dir``,
    by default the repository's docs/phases/, when it has one)."""
    from numba_attn.phases.registry import get_phase

    p = get_phase(name)
    fam = family(p)
    lines = [f"# {p.order:g} · `{p.name}` — {p.title}", ""]
    lines += ["| | |", "| --- | --- |",
              f"| order | {p.order:g} |",
              f"| family | {FAMILY_NAMES.get(fam, fam or 'out of tree')} (`{fam or p.module}`) |",
              f"| kind | {p.kind} |"]
    if p.parent:
        parent = get_phase(p.parent)
        lines.append(f"| parent | [`{parent.name}`]({parent.name}.md) — `{shown_path(parent.source_file)}` |")
        lines.append(f"| diff against the parent | `numba-attn diff {p.name}` |")
    else:
        lines.append("| parent | — (a root of the roadmap) |")
    lines += [f"| file | `{shown_path(p.source_file)}` |",
              f"| tests | {', '.join(f'`{t}`' for t in test_files(p)) or '—'} |",
              f"| lineage | {p.lineage or '—'} |",
              f"| planned speedup | {f'{p.planned_speedup:g}× naive' if p.planned_speedup else '—'} |",
              f"| dtypes | {', '.join(p.dtypes)} |",
              f"| head_dims | {', '.join(map(str, p.head_dims)) if p.head_dims else 'any'} |",
              f"| causal | {'yes' if p.causal else 'no'} |",
              f"| precision | {p.precision or 'the storage dtype'} |", ""]
    lines += ["## Idea", "", docstring(p), ""]
    lines += ["## Parameters", ""]
    if p.params:
        lines += ["| parameter | default |", "| --- | --- |"]
        lines += [f"| `{k}` | {'automatic (0)' if v == 0 and not isinstance(v, bool) else v} |"
                  for k, v in p.params.items()]
        lines += ["", "A default of 0 is chosen for the problem by the phase's `resolve` step; the rows "
                  "below record the values that ran. Glossary: `docs/DEVELOPING.md`.", ""]
    else:
        lines += ["None.", ""]
    rows = measured_rows(p.name, files)
    lines += ["## Measured", ""]
    if not rows:
        lines += ["No row in the committed results files (`results/*.jsonl`).", ""]
    else:
        shown = [x for x in rows if x[2].get("status") != "SKIP"]
        if shown:
            lines += ["| results file | status | problem | time | rate | regs / smem / local | params | commit | GPU |",
                      "| --- | --- | --- | ---: | ---: | --- | --- | --- | --- |"]
            for path, env, r in shown:
                t = rec.fmt_ms(r.get("time_ms")) if r.get("time_ms") else ("sim" if r.get("backend") == "simulator" else "—")
                lines.append(f"| `{rec.rel(path)}` | {r.get('status', '?')} | {r.get('label') or '?'} | {t} | "
                             f"{_rate(r)} | {_resources(r)} | {_params_text(r.get('params'))} | "
                             f"{rec.commit_of(r, env)} | {rec.gpu_of(r, env)} |")
            lines.append("")
        skips = Counter((rec.rel(path), (r.get("reason") or "").strip()) for path, _, r in rows
                        if r.get("status") == "SKIP")
        for (path, reason), n in sorted(skips.items()):
            lines.append(f"- SKIP ×{n} in `{path}`: {reason or 'no reason recorded'}")
        if skips:
            lines.append("")
    plots = []
    for path in sorted({x[0] for x in rows if x[2].get("status") == "OK"}):
        plots += [rec.rel(f) for f in rec.plots_of(path)]
    lines += ["## Plots", ""]
    if plots:
        lines += [f"- [`{f}`](../../{f})" for f in plots]
    else:
        lines.append("None (no plot is drawn from a results file with a measured row of this phase).")
    lines.append("")
    text = "\n".join(lines)
    kept = history(p.name, out_dir or rec.repo_path("docs", "phases")) if p.is_builtin else ""
    return text + ("\n" + kept if kept else "")


def index(files: list[str] | None = None) -> str:
    """``docs/phases/README.md``: every phase, one line each."""
    from numba_attn.phases.registry import list_phases

    lines = ["# Phases", "",
             "Generated by `numba-attn card --all --out docs/phases/` from the registry, the phase docstrings "
             "and the committed results files (`results/*.jsonl`); do not edit by hand. Best measured time: "
             f"at {' or '.join(REFERENCE_LABELS)} when measured there, else the fastest row (problem given).", "",
             "| order | phase | parent | family | idea | best measured time |",
             "| ---: | --- | --- | --- | --- | --- |"]
    for p in [p for p in list_phases() if p.is_builtin]:
        b = best_row(measured_rows(p.name, files))
        best = (f"{rec.fmt_ms(b[2]['time_ms'])} ({b[2].get('label')}, `{rec.rel(b[0])}`)" if b else "not measured")
        parent = f"[`{p.parent}`]({p.parent}.md)" if p.parent else "—"
        lines.append(f"| {p.order:g} | [`{p.name}`]({p.name}.md) | {parent} | {FAMILY_NAMES.get(family(p), family(p))} "
                     f"| {idea(p).replace('|', '/')} | {best} |")
    lines.append("")
    return "\n".join(lines)


def render_all(files: list[str] | None = None, out_dir: str = OUT_DIR) -> dict[str, str]:
    """{file name: text} of every card of the package's phases and the index (phases of your own, loaded
    from files, are not the package's documentation); each card keeps the History section of its file under
    ``out_dir``."""
    from numba_attn.phases.registry import list_phases

    out = {f"{p.name}.md": card(p.name, files, out_dir) for p in list_phases() if p.is_builtin}
    out["README.md"] = index(files)
    return out


def write_all(out_dir: str = OUT_DIR) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for fname, text in render_all(out_dir=out_dir).items():
        path = os.path.join(out_dir, fname)
        with open(path, "w") as f:
            f.write(text)
        written.append(path)
    return written


def check_all(out_dir: str = OUT_DIR) -> list[str]:
    """The card files under ``out_dir`` that differ from a regeneration (missing or stale ones included)."""
    want = render_all(out_dir=out_dir)
    bad = []
    for fname, text in want.items():
        path = os.path.join(out_dir, fname)
        if not os.path.exists(path) or open(path).read() != text:
            bad.append(path)
    if os.path.isdir(out_dir):
        bad += [os.path.join(out_dir, f) for f in sorted(os.listdir(out_dir))
                if f.endswith(".md") and f not in want]
    return bad
