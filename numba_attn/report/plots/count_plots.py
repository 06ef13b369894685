"""Simulator counts (``counts``): each phase beside its parent on the same problem, what one launch did."""
from __future__ import annotations

from collections import OrderedDict

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from numba_attn.report.plots.style import CMAP, caption, fmt_x, load_latest, save_figure

COUNT_METRICS = (("global bytes", ("sim_gmem_read_bytes", "sim_gmem_write_bytes")),
                 ("smem wavefronts", ("sim_smem_wavefronts",)),
                 ("barriers", ("sim_barriers", "sim_named_barriers")))


def count_pairs(rows) -> list[dict]:
    """(phase, parent) pairs of counted rows (``sim_*`` fields) on the same problem: per metric of
    :data:`COUNT_METRICS` the two values and phase / parent (1 when both are 0, None when only the parent's is)."""
    by_label = OrderedDict()
    for r in rows:
        if r.get("type") == "result" and r.get("kind") == "phase" and r.get("sim_gmem_read_bytes") is not None:
            by_label.setdefault(r.get("label"), {})[r["phase"]] = r
    out = []
    for label, named in by_label.items():
        for name, r in named.items():
            parent = named.get(r.get("parent"))
            if parent is None:
                continue
            vals = {}
            for metric, fields in COUNT_METRICS:
                a = sum(int(parent.get(f) or 0) for f in fields)
                b = sum(int(r.get(f) or 0) for f in fields)
                vals[metric] = (a, b, (b / a) if a else (1.0 if b == 0 else None))
            out.append({"phase": name, "parent": parent["phase"], "label": label, "order": r.get("order"),
                        "values": vals})
    first = {}  # problems in the order of their first phase, pairs by roadmap order within a problem
    for p in sorted(out, key=lambda p: p["order"] if p["order"] is not None else 1e9):
        first.setdefault(p["label"], len(first))
    out.sort(key=lambda p: (first[p["label"]], p["order"] if p["order"] is not None else 1e9, p["phase"]))
    return out


def counts(records, out_dir, stem="counts"):
    """Simulator results: each phase beside its parent on the same problem — global bytes (read + written),
    shared-memory wavefronts and barriers of one launch, as counted in the simulator, over the parent's (log
    scale; below 1: fewer). A metric the parent never did (0) is marked ``new`` above its place."""
    env, rows, _, source = load_latest(records)
    pairs = count_pairs(rows)
    if not pairs:
        return []
    colors = {m: CMAP(i) for i, (m, _) in enumerate(COUNT_METRICS)}
    fig, ax = plt.subplots(figsize=(min(18.0, max(6.5, 1.1 * len(pairs) + 3)), 4.8))
    width = 0.8 / len(COUNT_METRICS)
    shown = [1.0]
    for i, p in enumerate(pairs):
        for j, (metric, _) in enumerate(COUNT_METRICS):
            a, b, ratio = p["values"][metric]
            x = i + (j - (len(COUNT_METRICS) - 1) / 2) * width
            if ratio is None:
                ax.text(x, 1.0, "new", rotation=90, fontsize=7, ha="center", va="bottom", color=colors[metric])
                continue
            if ratio <= 0:
                ax.text(x, 1.0, "none", rotation=90, fontsize=7, ha="center", va="top", color=colors[metric])
                continue
            shown.append(ratio)
            ax.bar(x, ratio - 1.0, width * 0.92, bottom=1.0, color=colors[metric], zorder=3)  # from 1 to the ratio
            if abs(ratio - 1.0) > 0.005:  # (equal counts: no bar, no label)
                ax.text(x, ratio, fmt_x(ratio), fontsize=6.5, ha="center", va="bottom" if ratio >= 1 else "top",
                        rotation=90 if len(pairs) > 8 else 0)
    ax.set_yscale("log")
    lo, hi = min(shown), max(shown)
    ax.set_ylim(lo / 1.6, hi * 2.2)
    ax.axhline(1.0, color="black", linewidth=1.0, zorder=4)
    ax.set_xlim(-0.6, len(pairs) - 0.4)
    ax.grid(axis="y", color="#eeeeee", zorder=0)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels([f"{p['phase']}\nvs {p['parent']}" for p in pairs],
                       fontsize=7.5, rotation=30 if len(pairs) > 5 else 0, ha="right" if len(pairs) > 5 else "center")
    starts = [i for i, p in enumerate(pairs) if i == 0 or p["label"] != pairs[i - 1]["label"]]
    for n, i in enumerate(starts):  # the problem of each run of pairs, over it
        if i:
            ax.axvline(i - 0.5, color="#bbbbbb", linewidth=0.8, zorder=1)
        ax.text(i - 0.45, hi * 1.6, str(pairs[i]["label"]), fontsize=7, ha="left", va="top", color="#555555")
    ax.set_ylabel("phase / parent (one launch, counted)")
    ax.set_title("Each phase against its parent, counted in the simulator (below 1: fewer)", fontsize=9)
    handles = [Line2D([0], [0], color=colors[m], lw=6, label=m) for m, _ in COUNT_METRICS]
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    labels = sorted({str(p["label"]) for p in pairs})
    caption(fig, env, source, "counts, not times: global bytes read + written, shared-memory wavefronts "
             "(bank conflicts included), syncthreads + named barriers; "
             + (f"problem {labels[0]}" if len(labels) == 1 else f"{len(labels)} problems"))
    return save_figure(fig, out_dir, stem)
