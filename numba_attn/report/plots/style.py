"""What the plots share: the latest rows of a results file, captions and saving, colours and markers of
phases and peers, the rows' common filters and labels."""
from __future__ import annotations

import json
import os
from collections import OrderedDict

import matplotlib.pyplot as plt

from numba_attn.report.table import env_summary, latest_rows

PEER_STYLE = {"linestyle": "--", "linewidth": 1.3}
CMAP = plt.get_cmap("tab10")
_CMAP20 = plt.get_cmap("tab20")


class NamedRecords(list):
    """Records that remember the file they came from (for captions)."""

    def __init__(self, records, source):
        super().__init__(records)
        self.source = source


def load_records(records_or_path) -> NamedRecords:
    """The records of a results file (named after it) or the records given (their ``source``, else "in-memory
    results")."""
    if isinstance(records_or_path, (str, os.PathLike)):
        from numba_attn.measure.results import load_results

        return NamedRecords(load_results(str(records_or_path)), os.path.basename(str(records_or_path)))
    return NamedRecords(records_or_path, getattr(records_or_path, "source", None) or "in-memory results")


def load_latest(records_or_path, need=None):
    """(env, latest rows, OK ceilings by name, source name) of a results file or of records; ``need``: a phase
    whose timed row the run must have (:func:`latest_rows`)."""
    records = load_records(records_or_path)
    env, rows, ceil = latest_rows(records, need)
    return env, rows, {c["name"]: c for c in ceil if c.get("status") == "OK" and c.get("value")}, records.source


def _summary(env) -> str:
    """Device · date · commit; a commit marked ``+wip`` or ``-dirty`` is said to be an uncommitted tree."""
    text = env_summary(env)
    commit = str((env or {}).get("commit") or "")
    for mark in ("+wip", "-dirty"):
        if commit.endswith(mark):
            text = text.replace(commit[:12] + ("-dirty" if mark == "-dirty" else ""), commit)
            text = text.replace(commit, f"{commit[:-len(mark)]} (uncommitted tree)")
    return text


def caption(fig, env, source, extra=""):
    text = f"{_summary(env)} — {source}"
    if env and env.get("synthetic"):
        text = "SYNTHETIC DATA (illustration, not a measurement) — " + text
    if extra:
        text += f"\n{extra}"
    fig.text(0.01, 0.005, text, fontsize=7.5, color="#444444", ha="left", va="bottom")
    if env and env.get("synthetic"):
        fig.text(0.5, 0.5, "SYNTHETIC", fontsize=60, color="red", alpha=0.12, ha="center", va="center",
                 rotation=25, transform=fig.transFigure)


def save_figure(fig, out_dir, stem, formats=("png", "svg")) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for fmt in formats:
        p = os.path.join(out_dir, f"{stem}.{fmt}")
        fig.savefig(p, dpi=130 if fmt == "png" else None, bbox_inches="tight", pad_inches=0.15)
        if fmt == "png":
            _shrink_png(p)
        paths.append(p)
    plt.close(fig)
    return paths


def _shrink_png(path):
    """A 256-colour palette PNG (a plot has few colours): a third of the size, the same picture."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        q.save(path, optimize=True)
    except Exception:  # noqa: BLE001 - Pillow missing or too old: the full-colour file stays
        pass


def phase_order(rows):
    """Phases in roadmap order, then peers."""
    order = {}
    for r in rows:
        if r.get("kind") == "phase":
            order.setdefault(r["phase"], r.get("order", 1e9) if r.get("order") is not None else 1e9)
    return sorted(order, key=lambda n: (order[n], n))


def problems_by_label(rows):
    seen = OrderedDict()
    for r in rows:
        seen.setdefault(r.get("label"), r.get("problem"))
    return seen


PEER_COLORS = {"torch_sdpa": "#000000", "torch_sdpa_fp16": "#000000", "torch_sdpa_flash": "#d62728",
               "torch_sdpa_efficient": "#1f77b4", "torch_sdpa_cudnn": "#2ca02c", "torch_sdpa_math": "#8c564b",
               "fa4": "#f032e6", "torch_flex": "#008080"}
PEER_MARKERS = {"torch_sdpa": "s", "torch_sdpa_flash": "^", "torch_sdpa_efficient": "v", "torch_sdpa_cudnn": "D",
                "torch_sdpa_math": "x", "fa4": "P", "torch_flex": "X"}


def colors_of(names):
    """Distinct colours: peers get fixed, saturated ones; phases a qualitative map (tab20 beyond 10)."""
    phases = [n for n in names if n not in PEER_COLORS]
    cmap, k = (CMAP, 10) if len(phases) <= 10 else (_CMAP20, 20)
    out = {n: cmap(i % k) for i, n in enumerate(phases)}
    out.update({n: PEER_COLORS[n] for n in names if n in PEER_COLORS})
    return out


# phases: a (colour, marker) pair each, no two alike and no pastel: the ten tab10 colours, the marker changing
# with the colour so that phase 11 differs from phase 1 by its shape
_MARKERS = "os^DvPXph<>*"


def styles_of(names):
    """{name: (colour, marker)}: peers their fixed colour and marker; phases a distinct pair each, in the
    tab10 colours no peer among ``names`` uses."""
    from matplotlib.colors import to_hex

    taken = {PEER_COLORS[n].lower() for n in names if n in PEER_COLORS}
    palette = [c for c in (to_hex(CMAP(k)) for k in range(10)) if c not in taken]
    out, i = {}, 0
    for n in names:
        if n in PEER_COLORS:
            out[n] = (PEER_COLORS[n], PEER_MARKERS.get(n, "s"))
        else:
            out[n] = (palette[i % len(palette)], _MARKERS[(i + i // len(palette)) % len(_MARKERS)])
            i += 1
    return out


def dtype_of(r) -> str | None:
    """The dtype a row computed in: a peer's own ``params.dtype`` (``torch_sdpa_fp16`` on an fp32 problem
    runs in fp16), else the problem's."""
    return (r.get("params") or {}).get("dtype") or (r.get("problem") or {}).get("dtype")


def ok_time(r):
    return r.get("status") == "OK" and r.get("time_ms")


def fmt_x(v):
    return f"{v:.0f}×" if v >= 10 else (f"{v:.1f}×" if v >= 1 else f"{v:.2f}×")


SHORT_DT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def shape_key(p: dict) -> str:
    return json.dumps({k: v for k, v in (p or {}).items() if k not in ("dtype", "seed")}, sort_keys=True)


def is_sdpa(row) -> bool:
    """A row of an SDPA peer (not FlashAttention-4's or FlexAttention's: the plots' "SDPA" lines are SDPA's)."""
    return row.get("kind") == "peer" and str(row.get("phase", "")).startswith("torch_sdpa")


def fastest_peer(rows, phase_row, label=None):
    """The fastest OK SDPA peer row of ``phase_row``'s run (``run_id``) on ``label`` (default: its own problem),
    in the problem's dtype; None if that run timed none."""
    label = label or phase_row.get("label")
    dt = (phase_row.get("problem") or {}).get("dtype")
    peers = [r for r in rows if is_sdpa(r) and ok_time(r) and r.get("label") == label
             and r.get("run_id") == phase_row.get("run_id") and dtype_of(r) == dt]
    return min(peers, key=lambda r: r["time_ms"]) if peers else None
