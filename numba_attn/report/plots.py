"""Plots of a results file (matplotlib, Agg backend; PNG and SVG).

* ``roadmap`` — per problem, each phase's measured speedup against the
  baseline beside its planned speedup, with PyTorch SDPA as reference lines;
* ``scaling`` — time and TFLOP/s over context length (log-log) per phase,
  SDPA dashed, with an N² guide line (needs problems that differ only in length);
* ``roofline`` — each phase at its arithmetic intensity (FLOPs over the
  problem's minimum bytes) under the measured ceilings (copy bandwidth ×
  intensity, FFMA and mma); a hollow marker shows phases that move more than
  the minimum (the unfused baseline) at their modelled intensity;
* ``traffic`` — bytes each phase moves by construction (S and P materialized
  by the baseline vs the minimum for fused phases) beside the bandwidth it
  achieved on those bytes, against the measured copy ceiling;
* ``layouts`` — each paged-cache or packed ragged (varlen) problem beside its
  contiguous twin: bandwidth on the bytes read for paged caches, useful TFLOP/s
  for ragged batches (drawn only for files with such problems);
* ``steps`` — each phase against its parent measured in the same run (parent time /
  phase time per run and problem) beside the step the roadmap planned; every run
  in the file counts (drawn only where a phase and its parent share a run);
* ``counts`` — simulator files: each phase beside its parent on the same problem, what one launch did as
  counted in the simulator (global bytes, shared-memory wavefronts, barriers), normalised to the parent.

Every figure's caption gives the device, date and commit of the results.
``make_all(path, out_dir)`` draws what the file supports and returns the
files written; ``numba-attn plot RESULTS --out plots/`` calls it.
"""
from __future__ import annotations

import json
import math
import os
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from numba_attn.report.table import env_summary, latest_rows  # noqa: E402

PLOTS = ("roadmap", "scaling", "roofline", "traffic", "layouts", "steps", "counts")
ROOFLINE_PEERS = ("torch_sdpa", "torch_sdpa_fp16")  # PyTorch's own choice, in the problem's dtype and in fp16
PEER_STYLE = {"linestyle": "--", "linewidth": 1.3}
_CMAP = plt.get_cmap("tab10")
_CMAP20 = plt.get_cmap("tab20")


def _load(records_or_path):
    if isinstance(records_or_path, (str, os.PathLike)):
        from numba_attn.measure.results import load_results

        records = load_results(str(records_or_path))
        source = os.path.basename(str(records_or_path))
    else:
        source = getattr(records_or_path, "source", None) or "in-memory results"
        records = list(records_or_path)
    env, rows, ceil = latest_rows(records)
    return env, rows, {c["name"]: c for c in ceil if c.get("status") == "OK" and c.get("value")}, source


def _summary(env) -> str:
    """Device · date · commit; a commit marked ``+wip`` or ``-dirty`` is said to be an uncommitted tree."""
    text = env_summary(env)
    commit = str((env or {}).get("commit") or "")
    for mark in ("+wip", "-dirty"):
        if commit.endswith(mark):
            text = text.replace(commit[:12] + ("-dirty" if mark == "-dirty" else ""), commit)
            text = text.replace(commit, f"{commit[:-len(mark)]} (uncommitted tree)")
    return text


def _caption(fig, env, source, extra=""):
    text = f"{_summary(env)} — {source}"
    if env and env.get("synthetic"):
        text = "SYNTHETIC DATA (illustration, not a measurement) — " + text
    if extra:
        text += f"\n{extra}"
    fig.text(0.01, 0.005, text, fontsize=7.5, color="#444444", ha="left", va="bottom")
    if env and env.get("synthetic"):
        fig.text(0.5, 0.5, "SYNTHETIC", fontsize=60, color="red", alpha=0.12, ha="center", va="center",
                 rotation=25, transform=fig.transFigure)


def _save(fig, out_dir, stem, formats=("png", "svg")) -> list[str]:
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


def _phase_order(rows):
    """Phases in roadmap order, then peers."""
    order = {}
    for r in rows:
        if r.get("kind") == "phase":
            order.setdefault(r["phase"], r.get("order", 1e9) if r.get("order") is not None else 1e9)
    return sorted(order, key=lambda n: (order[n], n))


def _problems(rows):
    seen = OrderedDict()
    for r in rows:
        seen.setdefault(r.get("label"), r.get("problem"))
    return seen


PEER_COLORS = {"torch_sdpa": "#000000", "torch_sdpa_fp16": "#000000", "torch_sdpa_flash": "#d62728",
               "torch_sdpa_efficient": "#1f77b4", "torch_sdpa_cudnn": "#2ca02c", "torch_sdpa_math": "#8c564b"}
PEER_MARKERS = {"torch_sdpa": "s", "torch_sdpa_flash": "^", "torch_sdpa_efficient": "v", "torch_sdpa_cudnn": "D",
                "torch_sdpa_math": "x"}


def _colors(names):
    """Distinct colours: peers get fixed, saturated ones; phases a qualitative map (tab20 beyond 10)."""
    phases = [n for n in names if n not in PEER_COLORS]
    cmap, k = (_CMAP, 10) if len(phases) <= 10 else (_CMAP20, 20)
    out = {n: cmap(i % k) for i, n in enumerate(phases)}
    out.update({n: PEER_COLORS[n] for n in names if n in PEER_COLORS})
    return out


# phases: a (colour, marker) pair each, no two alike and no pastel: the ten tab10 colours, the marker changing
# with the colour so that phase 11 differs from phase 1 by its shape
_MARKERS = "os^DvPXph<>*"


def _styles(names):
    """{name: (colour, marker)}: peers their fixed colour and marker; phases a distinct pair each, in the
    tab10 colours no peer among ``names`` uses."""
    from matplotlib.colors import to_hex

    taken = {PEER_COLORS[n].lower() for n in names if n in PEER_COLORS}
    palette = [c for c in (to_hex(_CMAP(k)) for k in range(10)) if c not in taken]
    out, i = {}, 0
    for n in names:
        if n in PEER_COLORS:
            out[n] = (PEER_COLORS[n], PEER_MARKERS.get(n, "s"))
        else:
            out[n] = (palette[i % len(palette)], _MARKERS[(i + i // len(palette)) % len(_MARKERS)])
            i += 1
    return out


def _dtype_of(r) -> str | None:
    """The dtype a row computed in: a peer's own ``params.dtype`` (``torch_sdpa_fp16`` on an fp32 problem
    runs in fp16), else the problem's."""
    return (r.get("params") or {}).get("dtype") or (r.get("problem") or {}).get("dtype")


def _ok_time(r):
    return r.get("status") == "OK" and r.get("time_ms")


def _fmt_x(v):
    return f"{v:.0f}×" if v >= 10 else (f"{v:.1f}×" if v >= 1 else f"{v:.2f}×")


# -- roadmap -----------------------------------------------------------------------


SHORT_DT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _shape_key(p: dict) -> str:
    return json.dumps({k: v for k, v in (p or {}).items() if k not in ("dtype", "seed")}, sort_keys=True)


def _shape_label(p: dict) -> str:
    s = f"B{p.get('batch')} H{p.get('heads')}"
    if p.get("kv_heads") not in (None, p.get("heads")):
        s += f"/{p.get('kv_heads')}kv"
    s += f" N{p.get('q_len')}" if p.get("q_len") == p.get("kv_len") else f" Nq{p.get('q_len')} Nk{p.get('kv_len')}"
    s += f" D{p.get('head_dim')}" + (" causal" if p.get("causal") else "")
    return s


def _pick(rows_of_phase, prefer_dtype):
    """One row per phase and shape: the timed one in the preferred dtype, else any timed one,
    else the preferred dtype's row (for its status)."""
    ok = [r for r in rows_of_phase if _ok_time(r)]
    for pool in (ok, rows_of_phase):
        for r in pool:
            if (r.get("problem") or {}).get("dtype") == prefer_dtype:
                return r
        if pool:
            return pool[0]
    return None


def roadmap(records, out_dir, stem="roadmap", baseline="naive"):
    """Measured vs planned speedup per phase, one panel per problem shape.

    Phases that run only in fp16 (tensor cores) share the panel of the same
    shape in fp32 and are measured against the fp32 baseline (bar label
    ``name (fp16)``), as are the SDPA lines."""
    env, rows, _ceil, source = _load(records)
    rows = [r for r in rows if r.get("phase_kind", "prefill") != "decode" or r.get("kind") == "peer"]
    phases = _phase_order(rows)
    shapes = OrderedDict()
    for r in rows:
        shapes.setdefault(_shape_key(r.get("problem")), []).append(r)
    shapes = OrderedDict((k, v) for k, v in shapes.items() if any(_ok_time(r) for r in v))
    # a panel needs the baseline's time on its shape: without it there is nothing to measure bars against
    no_base = [_shape_label(v[0].get("problem") or {}) for v in shapes.values()
               if not any(r.get("kind") == "phase" and r["phase"] == baseline and _ok_time(r) for r in v)]
    if len(no_base) < len(shapes):
        shapes = OrderedDict((k, v) for k, v in shapes.items()
                             if any(r.get("kind") == "phase" and r["phase"] == baseline and _ok_time(r) for r in v))
    else:
        no_base = []
    if not phases or not shapes:
        return []
    n = len(shapes)
    ncols = 1 if len(phases) > 7 else min(n, 3)
    nrows = math.ceil(n / ncols)
    width = max(6.0, 0.55 * len(phases) + 2.5)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 4.8 * nrows + 0.8), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (sk, srows) in zip(axes.flat, shapes.items()):
        pdict = srows[0].get("problem") or {}
        base_rows = [r for r in srows if r.get("kind") == "phase" and r["phase"] == baseline]
        base = _pick(base_rows, "float32")
        base_ms = base.get("time_ms") if base is not None and _ok_time(base) else None
        base_dt = (base.get("problem") or {}).get("dtype", "float32") if base is not None else "float32"
        names = [p for p in phases if any(r["phase"] == p and r.get("kind") == "phase" for r in srows)]
        w = 0.38
        ymax, ymin = 1.0, 1.0
        ticks = []
        for i, name in enumerate(names):
            r = _pick([x for x in srows if x["phase"] == name and x.get("kind") == "phase"], base_dt)
            dt = (r.get("problem") or {}).get("dtype")
            ticks.append(name + (f" ({SHORT_DT.get(dt, dt)})" if dt != base_dt else ""))
            plan = r.get("planned_speedup")
            if plan:
                ax.bar(i + w / 2, plan, w, color="none", edgecolor="#888888", hatch="///", linewidth=0.8)
                ymax, ymin = max(ymax, plan), min(ymin, plan)
            sp = base_ms / r["time_ms"] if (base_ms and _ok_time(r)) else None
            if sp:
                ax.bar(i - w / 2, sp, w, color=_CMAP(0) if dt == base_dt else _CMAP(2))
                ax.annotate(_fmt_x(sp), (i - w / 2, sp), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 1), textcoords="offset points")
                ymax, ymin = max(ymax, sp), min(ymin, sp)
            elif _ok_time(r):  # measured, but no baseline time on this shape in this run
                ax.annotate(f"{r['time_ms']:.3g} ms (no baseline)", (i - w / 2, 1.0), ha="center", va="bottom",
                            fontsize=7, color="#555555", rotation=90)
            else:
                ax.annotate(r.get("status") or "?", (i - w / 2, 1.0), ha="center", va="bottom", fontsize=7,
                            color="#b00000", rotation=90)
        # SDPA reference lines: PyTorch's default in the baseline dtype, and the fastest SDPA of any dtype
        peers = [r for r in srows if r.get("kind") == "peer" and _ok_time(r)]
        show = []
        auto = [r for r in peers if r["phase"] == "torch_sdpa" and (r.get("problem") or {}).get("dtype") == base_dt]
        if auto:
            show.append((auto[0], f"SDPA auto ({SHORT_DT.get(base_dt, base_dt)})"))
        if peers:
            best = min(peers, key=lambda r: r["time_ms"])
            if not auto or best is not auto[0]:
                bdt = (best.get("params") or {}).get("dtype") or (best.get("problem") or {}).get("dtype")
                kind = best["phase"].replace("torch_sdpa", "").replace("_fp16", "").strip("_") or "auto"
                show.append((best, f"fastest SDPA: {kind} ({SHORT_DT.get(bdt, bdt)})"))
        for j, (pr, text) in enumerate(show):
            if base_ms:
                sp = base_ms / pr["time_ms"]
                col = ("#d62728", "#9467bd")[j % 2]
                # named in the panel's legend: a label on the line hid the bar labels it crossed
                ax.axhline(sp, color=col, label=f"{text}: {_fmt_x(sp)}", **PEER_STYLE)
                ymax, ymin = max(ymax, sp), min(ymin, sp)
        if show and base_ms:
            ax.legend(loc="upper left", fontsize=7, framealpha=0.9, borderaxespad=0.3, handlelength=2.2)
        ax.set_yscale("log")
        ax.set_ylim(max(ymin / 2, 1e-3), ymax * 3)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(ticks, rotation=40, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylabel(f"speedup over {baseline} (×, log)")
        sub = (f"{baseline} {SHORT_DT.get(base_dt, base_dt)} = {base_ms:.3g} ms" if base_ms
               else f"{baseline} not timed")
        ax.set_title(f"{_shape_label(pdict)}\n({sub})", fontsize=9)
        ax.grid(axis="y", which="both", alpha=0.25)
    handles = [plt.Rectangle((0, 0), 1, 1, color=_CMAP(0), label="measured (baseline dtype)"),
               plt.Rectangle((0, 0), 1, 1, color=_CMAP(2), label="measured (fp16 storage)"),
               plt.Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="#888888", hatch="///", label="planned"),
               Line2D([], [], color="#d62728", label="PyTorch SDPA (baseline dtype)", **PEER_STYLE),
               Line2D([], [], color="#9467bd", label="fastest SDPA (any dtype)", **PEER_STYLE)]
    H = fig.get_figheight()
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=5, bbox_to_anchor=(1.0, 1 - 0.3 / H))
    fig.suptitle("Roadmap: measured vs planned speedup per phase", fontsize=11, x=0.02, ha="left",
                 y=1 - 0.1 / H)
    fig.tight_layout(rect=(0, 0.45 / H, 1, 1 - 0.65 / H))
    extra = "bars: median kernel time of the baseline / of the phase (events, same run); " \
            "hatched: the roadmap's planned speedup; labels: failed or skipped rows"
    if no_base:
        extra += f"\nnot drawn (no {baseline} time on the shape to measure against): {'; '.join(no_base)}"
    _caption(fig, env, source, extra)
    return _save(fig, out_dir, stem)


# -- scaling -----------------------------------------------------------------------


def _length_groups(rows):
    """Problems that differ only in length → {group label: {N: [rows]}} (≥ 2 lengths)."""
    groups = {}
    for r in rows:
        p = r.get("problem") or {}
        if p.get("q_len") != p.get("kv_len"):
            continue
        key = json.dumps({k: v for k, v in p.items() if k not in ("q_len", "kv_len", "seed")}, sort_keys=True)
        groups.setdefault(key, {}).setdefault(p["q_len"], []).append(r)
    out = {}
    for key, by_n in groups.items():
        if len(by_n) >= 2:
            p = json.loads(key)
            short = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(p.get("dtype"), p.get("dtype"))
            lab = f"B{p.get('batch')} H{p.get('heads')} D{p.get('head_dim')} {short}" + \
                  (" causal" if p.get("causal") else "")
            out[lab] = dict(sorted(by_n.items()))
    return out


def scaling(records, out_dir, stem="scaling"):
    """Time and TFLOP/s over context length, log-log, one row of panels per problem family."""
    env, rows, _ceil, source = _load(records)
    groups = _length_groups(rows)
    if not groups:
        return []
    names = _phase_order(rows) + sorted({r["phase"] for r in rows if r.get("kind") == "peer"})
    styles = _styles(names)
    colors = {n: c for n, (c, _m) in styles.items()}
    fig, axes = plt.subplots(len(groups), 2, figsize=(14, 4.3 * len(groups) + 1.2), squeeze=False)
    stops: dict = {}
    for (lab, by_n), (ax_t, ax_f) in zip(groups.items(), axes):
        plotted = []
        for name in names:
            pts = [(n, r) for n, rs in by_n.items() for r in rs if r["phase"] == name and _ok_time(r)]
            if len(pts) < 1:
                continue
            ns = [n for n, _ in pts]
            style = PEER_STYLE if pts[0][1].get("kind") == "peer" else {"linestyle": "-", "linewidth": 1.6}
            mk = styles[name][1]
            ax_t.plot(ns, [r["time_ms"] for _, r in pts], marker=mk, markersize=4, color=colors[name],
                      label=name, **style)
            ax_f.plot(ns, [r.get("tflops") or 0 for _, r in pts], marker=mk, markersize=4, color=colors[name],
                      label=name, **style)
            plotted.append(pts)
        if plotted:
            # N² guide through the median first point
            n_all = sorted(by_n)
            firsts = sorted(p[0][1]["time_ms"] * (n_all[0] / p[0][0]) ** 2 for p in plotted)
            t0 = firsts[len(firsts) // 2]
            ax_t.plot(n_all, [t0 * (n / n_all[0]) ** 2 for n in n_all], color="black", linestyle=":",
                      linewidth=1.2, label="∝ N² guide")
        for ax in (ax_t, ax_f):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context length N (q_len = kv_len)")
            ax.grid(which="both", alpha=0.25)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("median kernel time (ms, log)")
        ax_f.set_ylabel("TFLOP/s (4·D per unmasked pair)")
        ax_t.set_title(f"{lab}: time", fontsize=9)
        ax_f.set_title(f"{lab}: throughput", fontsize=9)
        hs, ls = ax_t.get_legend_handles_labels()
        ax_f.legend(hs, ls, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        for name in names:  # say where a line stops and why
            mine = [(n, r) for n, rs in by_n.items() for r in rs if r["phase"] == name]
            ok_n = [n for n, r in mine if _ok_time(r)]
            if not ok_n:
                continue
            after = [r for n, r in sorted(mine, key=lambda x: x[0]) if n > max(ok_n) and not _ok_time(r)]
            if after:
                why = after[0].get("reason") or after[0].get("status") or ""
                stops.setdefault(_stop_reason(why), []).append(f"{name} (after N={max(ok_n)})")
    fig.suptitle("Scaling with context length (solid: phases, dashed: PyTorch SDPA)", fontsize=11, x=0.02,
                 ha="left")
    notes = [f"lines stop where the next length was not run: {why}: {', '.join(who)}" for why, who in stops.items()]
    import textwrap

    notes = [textwrap.fill(n, 190) for n in notes]
    nl = sum(n.count("\n") + 1 for n in notes)
    fig.tight_layout(rect=(0, (0.35 + 0.14 * nl) / fig.get_figheight(), 1, 0.96))
    _caption(fig, env, source, "\n".join(notes))
    return _save(fig, out_dir, stem)


def _stop_reason(reason: str) -> str:
    if "predicted" in reason and "row limit" in reason:
        return "time predicted from the previous length over the benchmark's row limit"
    if "time limit" in reason:
        return "the run's time limit was reached"
    return reason.split(":")[0][:80]


# -- roofline ------------------------------------------------------------------------


def _is_decode(r) -> bool:
    return r.get("phase_kind") == "decode" or (r.get("problem") or {}).get("q_len", 99) <= 16


def _columns(pts):
    """{label: x factor}: problems at the same intensity side by side (a few % apart), so that each problem
    is one column of points, named at the top of the panel."""
    by_ai = OrderedDict()
    for r in pts:
        ai = round(math.log10(r["flops"] / r["min_bytes"]), 2)
        by_ai.setdefault(ai, [])
        if r.get("label") not in by_ai[ai]:
            by_ai[ai].append(r.get("label"))
    out = {}
    for labs in by_ai.values():
        for j, lab in enumerate(labs):
            out[lab] = 1.25 ** (j - (len(labs) - 1) / 2)
    return out


def _roofline_ax(ax, pts, ceil, styles, roof_names, decode):
    """One roofline panel: the roofs (copy bandwidth × intensity, capped by each compute ceiling), each point a
    phase (colour and marker: ``styles``) in its problem's column (named on the top axis)."""
    from matplotlib.ticker import NullLocator

    cols = _columns(pts)
    ais = [r["flops"] / r["min_bytes"] * cols[r.get("label")] for r in pts] + \
          [r["flops"] / r["model_bytes"] for r in pts if r.get("model_bytes")]
    lo, hi = min(ais) / 4, max(ais) * 8
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    bw = ceil.get("copy", {}).get("value")
    roofs = sorted([(k, ceil[k]["value"]) for k in roof_names if k in ceil], key=lambda kv: kv[1])
    prev_right = False
    prev = None
    for k, peak in roofs:
        ys = [min(peak, bw * 1e9 * x / 1e12) if bw else peak for x in xs]
        ax.plot(xs, ys, color="black" if k == "ffma" else ("#999999" if k.startswith("cublas") else "#555555"),
                linestyle={"ffma": "-", "cublas_fp16": ":"}.get(k, "-."), linewidth=1.5, zorder=1)
        # labels at the right end of the flat roof; a roof close to the one below is labelled at its left end
        ridge = peak * 1e12 / (bw * 1e9) if bw else lo
        close = prev is not None and peak / prev < 1.5 and prev_right
        if close:
            x_lab, ha = max(ridge, lo) * 1.15, "left"
        else:
            x_lab, ha = hi / 1.1, "right"
        ax.annotate(f"{k} {peak:.0f} TFLOP/s", (x_lab, peak), ha=ha, va="bottom", fontsize=7.5, zorder=4,
                    xytext=(0, 1), textcoords="offset points",
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 0.3})
        prev, prev_right = peak, not close
    if bw and not roofs:
        ax.plot(xs, [bw * 1e9 * x / 1e12 for x in xs], color="black", linewidth=1.5, zorder=1)
    if bw:  # on the slope, where it is still below the lowest roof
        top = roofs[0][1] if roofs else bw * 1e9 * hi / 1e12
        xb = min(lo * 1.3, top * 1e12 / (bw * 1e9) / 3)
        ax.annotate(f"copy {bw / 1e3:.2f} TB/s" + (" (read + write)" if decode else ""),
                    (xb, bw * 1e9 * xb / 1e12), fontsize=7.5, va="top", ha="left", xytext=(6, -2),
                    textcoords="offset points", zorder=4,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 0.3})
    hollow = False
    for r in pts:
        f = cols[r.get("label")]
        ai = r["flops"] / r["min_bytes"] * f
        c, m = styles[r["phase"]]
        ax.scatter([ai], [r["tflops"]], color=c, marker=m, s=40, zorder=3,
                   edgecolor="black" if r.get("kind") == "peer" else "none", linewidth=0.8)
        mb = r.get("model_bytes")
        if mb and mb > 1.05 * r["min_bytes"]:
            hollow = True
            ai2 = r["flops"] / mb * f
            ax.scatter([ai2], [r["tflops"]], facecolor="none", edgecolor=c, marker=m, s=40, zorder=3)
            ax.plot([ai2, ai], [r["tflops"]] * 2, color=c, linewidth=0.7, linestyle=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    top_ax = ax.secondary_xaxis("top")
    labels = list(cols)
    tx = [next(r["flops"] / r["min_bytes"] for r in pts if r.get("label") == lab) * cols[lab] for lab in labels]
    srt = sorted(tx)
    crowded = len(labels) > 3 or any(b / a < 2.5 for a, b in zip(srt, srt[1:]))
    top_ax.set_xticks(tx, labels, fontsize=7, rotation=90 if crowded else 20, ha="center" if crowded else "left")
    top_ax.xaxis.set_minor_locator(NullLocator())
    for x in top_ax.get_xticks():
        ax.axvline(x, color="#dddddd", linewidth=0.6, zorder=0)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the problem's minimum traffic: Q, K, V read, O written)",
                  fontsize=8.5)
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(which="both", alpha=0.25)
    return hollow, bool(roofs or bw)


def roofline(records, out_dir, stem="roofline"):
    """Achieved TFLOP/s at the problem's arithmetic intensity under the roofs measured in the same run: decode
    (memory-bound) under the bandwidth only; prefill under the compute ceilings, one panel per storage
    precision when there are many phases; each peer only in the panel of the dtype it ran in.

    A run without ceilings (``--no-ceilings``) has no roofs: a roofline would be points on an intensity axis
    that says nothing about them. Its phases are drawn against PyTorch SDPA of the same run instead
    (:func:`_against_peers`), the figure saying why."""
    env, rows, ceil, source = _load(records)
    pts = [r for r in rows if _ok_time(r) and r.get("tflops") and r.get("min_bytes")
           and (r.get("kind") == "phase" or r.get("phase") in ROOFLINE_PEERS)]
    if not pts:
        return []
    if not ceil:
        return _against_peers(env, rows, source, out_dir, stem)
    decode = all(_is_decode(r) for r in pts)
    # a peer that ran in another dtype than its problem's (torch_sdpa_fp16 on an fp32 problem) is drawn only
    # where no peer of that dtype ran on the same shape (it would sit in a column named for the other dtype)
    have = {(_shape_key(r.get("problem")), _dtype_of(r)) for r in pts
            if r.get("kind") == "peer" and _dtype_of(r) == (r.get("problem") or {}).get("dtype")}
    pts = [r for r in pts if r.get("kind") != "peer" or _dtype_of(r) == (r.get("problem") or {}).get("dtype")
           or (_shape_key(r.get("problem")), _dtype_of(r)) not in have]
    names = _phase_order(pts) + sorted({r["phase"] for r in pts if r.get("kind") == "peer"})
    is32 = [r for r in pts if _dtype_of(r) == "float32"]
    is16 = [r for r in pts if _dtype_of(r) != "float32"]
    if not decode and len(names) > 12 and is32 and is16:
        panels = [("fp32 storage: CUDA cores (FFMA) and tf32 tensor cores", is32, ("ffma", "mma_tf32")),
                  ("fp16/bf16 storage: tensor cores", is16, ("mma_fp16", "wgmma_fp16", "cublas_fp16"))]
    else:
        roof_names = () if decode else ("ffma", "mma_tf32", "mma_fp16", "wgmma_fp16", "cublas_fp16")
        panels = [("", pts, roof_names)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels) + 2.6, 6.6), squeeze=False)
    hollow = drawn_roofs = False
    for ax, (title, ppts, roof_names) in zip(axes[0], panels):
        # colours and markers per panel: the fewer names, the more distinct
        pnames = [n for n in names if any(r["phase"] == n for r in ppts)]
        styles = _styles(pnames)
        h, d = _roofline_ax(ax, ppts, ceil, styles, roof_names, decode)
        hollow, drawn_roofs = hollow or h, drawn_roofs or d
        if title:
            ax.set_title(title, fontsize=9.5)
        hs = [Line2D([], [], color=styles[n][0], marker=styles[n][1], linestyle="",
                     label=n + (f" ({SHORT_DT.get(_dtype_of(next(r for r in ppts if r['phase'] == n)), '')})"
                                if n == "torch_sdpa_fp16" else ""),
                     markeredgecolor="black" if n in PEER_COLORS else "none") for n in pnames]
        if h:
            hs.append(Line2D([], [], color="gray", marker="o", markerfacecolor="none", linestyle="",
                             label="at modelled bytes\n(S, P materialized)"))
        ax.legend(handles=hs, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if decode:
        head = ("Decode roofline: memory-bound, every point far left of the compute roofs (black edge: SDPA)\n"
                "the copy roof counts bytes read + written; decode mostly reads, and a read-only stream can "
                "pass it (no read-only ceiling in this file)")
        extra = "roof: measured copy bandwidth × intensity (compute ceilings are off the chart for decode)"
    else:
        head = "Roofline: phases under the ceilings measured in the same run (black edge: PyTorch SDPA)"
        extra = ("roofs: measured copy bandwidth × intensity, capped by the measured FFMA, numba mma.sync "
                 "(mma_*), wgmma and cuBLAS (cublas_fp16, dotted) throughput")
    extra += "; columns: one per problem (named on top), side by side where problems share an intensity"
    fig.suptitle(head, fontsize=10.5, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.93 if decode else 0.96))
    _caption(fig, env, source, extra)
    return _save(fig, out_dir, stem)


def _fastest_peer(rows, phase_row, label=None):
    """The fastest OK SDPA peer row of ``phase_row``'s run (``run_id``) on ``label`` (default: its own problem),
    in the problem's dtype; None if that run timed none."""
    label = label or phase_row.get("label")
    dt = (phase_row.get("problem") or {}).get("dtype")
    peers = [r for r in rows if r.get("kind") == "peer" and _ok_time(r) and r.get("label") == label
             and r.get("run_id") == phase_row.get("run_id") and _dtype_of(r) == dt]
    return min(peers, key=lambda r: r["time_ms"]) if peers else None


def _against_peers(env, rows, source, out_dir, stem):
    """Per problem, each phase's speed against the fastest PyTorch SDPA of the same run (SDPA time / phase
    time): the picture for a run that measured no ceilings."""
    phases = [r for r in rows if r.get("kind") == "phase" and _ok_time(r)]
    probs = OrderedDict()
    for r in phases:
        pr = _fastest_peer(rows, r)
        if pr is not None:
            probs.setdefault(r["label"], []).append((r, pr))
    if not probs:
        return []
    names = _phase_order([r for v in probs.values() for r, _ in v])
    styles = _styles(names)
    fig, ax = plt.subplots(figsize=(min(13.0, 1.1 * len(probs) * max(1, len(names)) ** 0.5 + 3.5), 5.2))
    w = 0.8 / max(len(names), 1)
    vals, seen = [1.0], set()
    for i, (lab, pairs) in enumerate(probs.items()):
        for j, n in enumerate(names):
            pair = next(((r, pr) for r, pr in pairs if r["phase"] == n), None)
            if pair is None:
                continue
            v = pair[1]["time_ms"] / pair[0]["time_ms"]
            vals.append(v)
            x = i + (j - (len(names) - 1) / 2) * w
            ax.bar(x, v, w, color=styles[n][0], label=None if n in seen else n)
            seen.add(n)
            ax.annotate(f"{v:.2f}", (x, v), ha="center", va="top", fontsize=7, xytext=(0, -3),
                        textcoords="offset points", color="white", fontweight="bold")
    ax.axhline(1.0, color="black", linewidth=1.2, linestyle="--")
    ax.annotate("PyTorch SDPA (its fastest backend in the run) = 1", (0.99, 1.0), xycoords=("axes fraction", "data"),
                ha="right", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 0.5})
    ax.set_ylim(0, max(vals) * 1.18)
    ax.set_xticks(range(len(probs)))
    ax.set_xticklabels(list(probs), rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(probs) - 0.4)
    ax.set_ylabel("speed against PyTorch SDPA\n(SDPA time / phase time, same run; > 1: faster)")
    ax.grid(axis="y", alpha=0.25)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    backends = sorted({pr.get("sdpa_backend_ran") or pr["phase"] for v in probs.values() for _, pr in v})
    fig.suptitle("No roofline: this run measured no ceilings (--no-ceilings), so there are no roofs to draw.\n"
                 "Instead: each phase against PyTorch SDPA measured in the same run", fontsize=10.5, x=0.02,
                 ha="left")
    fig.tight_layout(rect=(0, 0.06, 1, 0.9))
    runs = len({r["run_id"] for v in probs.values() for r, _ in v})
    _caption(fig, env, source, f"each pair from one run ({runs} runs, one per problem); SDPA: the fastest of the "
                               f"peers timed in that run, in the problem's dtype (backend ran: {', '.join(backends)})")
    return _save(fig, out_dir, stem)


# -- memory traffic ----------------------------------------------------------------------


def _plain_log_ticks(ax):
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def traffic(records, out_dir, stem="traffic"):
    """Bytes each phase moves by construction, and the bandwidth achieved on them."""
    env, rows, ceil, source = _load(records)
    rows = [r for r in rows if r.get("kind") == "phase" and r.get("min_bytes") and _ok_time(r)]
    if not rows:
        return []
    names = _phase_order(rows)
    labels = list(_problems(rows))
    colors = _colors(labels)
    width = min(13.0, max(8.0, 0.45 * len(names) * max(1, len(labels)) ** 0.5 + 4))
    fig, (ax_b, ax_g) = plt.subplots(2, 1, figsize=(width, 9.0), sharex=True)
    w = 0.8 / max(len(labels), 1)
    materialized = any((r.get("model_bytes") or 0) > 1.05 * r["min_bytes"] for r in rows)
    for j, lab in enumerate(labels):
        by = {r["phase"]: r for r in rows if r.get("label") == lab}
        xs, bys, gbs = [], [], []
        for i, n in enumerate(names):
            r = by.get(n)
            if r is None:
                continue
            mb = r.get("model_bytes") or r["min_bytes"]
            xs.append(i + (j - (len(labels) - 1) / 2) * w)
            bys.append(mb / 2**30)
            gbs.append(mb / (r["time_ms"] * 1e-3) / 1e9)
        ax_b.bar(xs, bys, w, color=colors[lab], label=lab)
        ax_g.bar(xs, gbs, w, color=colors[lab], label=lab)
        if materialized:
            anyr = next(iter(by.values()))
            ax_b.axhline(anyr["min_bytes"] / 2**30, color=colors[lab], linestyle=":", linewidth=1)
    bw = ceil.get("copy", {}).get("value")
    if bw:
        ax_g.axhline(bw, color="black", linestyle="--", linewidth=1.3)
        # placed in axes x-coordinates: a data x at the edge of the bars may fall outside and not be drawn
        ax_g.annotate(f"copy ceiling {bw:.0f} GB/s (read + write)", (0.99, bw), xycoords=("axes fraction", "data"),
                      ha="right", va="bottom", fontsize=8.5, xytext=(0, 2), textcoords="offset points",
                      bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 0.5})
    ax_g.set_xticks(range(len(names)))
    ax_g.set_xticklabels(names, rotation=30, ha="right", fontsize=9)
    # a log axis only for values spread over more than a decade; a narrow range (decode's bandwidths,
    # 2.7-4.7 TB/s) is drawn on a linear axis from 0, where bar lengths compare honestly
    scale = {}
    for ax, vals in ((ax_b, [(r.get("model_bytes") or r["min_bytes"]) / 2**30 for r in rows]),
                     (ax_g, [(r.get("model_bytes") or r["min_bytes"]) / (r["time_ms"] * 1e-3) / 1e9 for r in rows]
                      + ([bw] if bw else []))):
        ax.grid(axis="y", which="both", alpha=0.25)
        if max(vals) / min(vals) > 10:
            ax.set_yscale("log")
            _plain_log_ticks(ax)
            ax.set_ylim(10 ** math.floor(math.log10(min(vals))), max(vals) * 1.6)  # bars start at a decade
            scale[ax] = "log"
        else:
            ax.set_ylim(0, max(vals) * 1.12)
            scale[ax] = "linear"
    ax_b.set_ylabel("device-memory traffic\nby construction (GiB" + (", log)" if scale[ax_b] == "log" else ")"))
    if materialized:
        ax_b.set_title("Bytes moved: S and P materialized (unfused baseline) vs the minimum (fused phases)\n"
                       "dotted: the minimum (Q, K, V read once, O written once)", fontsize=9)
    else:
        ax_b.set_title("Bytes moved: every phase here moves the minimum\n"
                       "(Q, K, V read once, O written once) plus its workspace", fontsize=9)
    ax_g.set_ylabel("achieved GB/s on those bytes" + (" (log)" if scale[ax_g] == "log" else ""))
    ax_g.set_title("Bandwidth achieved on the modelled bytes", fontsize=9)
    ax_b.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle("Memory traffic per phase", fontsize=11, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    _caption(fig, env, source, "modelled bytes: Problem.materialized_bytes() for the unfused baseline, "
                               "min_bytes() + 2 × workspace for the others")
    return _save(fig, out_dir, stem)


# -- serving layouts: paged KV caches and packed ragged batches against their contiguous twins ------


def layouts(records, out_dir, stem="layouts"):
    """Each paged or varlen problem beside its contiguous twin, on the measure that compares them fairly:
    a paged KV cache by the bandwidth on the bytes actually read (the twin holds the same bytes), under
    the measured copy ceiling; a packed ragged batch by useful TFLOP/s (the real pairs only, for the
    twin too: the padded batch pays for its padding). Hatched bars: rows of the twin."""
    from numba_attn.spec.problem import Problem, layout_of, twin_of

    env, rows, ceil, source = _load(records)
    # SDPA as PyTorch chooses it (its backend in the legend); the forced backends would crowd the groups
    rows = [r for r in rows if _ok_time(r) and r.get("problem")
            and (r.get("kind") == "phase" or r["phase"] == "torch_sdpa")]
    by_label = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    groups = {"paged": [], "varlen": []}
    for lab, rs in by_label.items():
        prob = Problem.from_dict(rs[0]["problem"])
        kind = layout_of(prob)
        if kind in groups:
            twin = twin_of(prob)
            groups[kind].append((prob, rs, by_label.get(twin.label, [])))
    kinds = [k for k in groups if groups[k]]
    if not kinds:
        return []
    names = []
    for k in kinds:
        for _, rs, ts in groups[k]:
            for r in rs + ts:
                if r["phase"] not in names:
                    names.append(r["phase"])
    phase_names = [n for n in _phase_order([r for k in kinds for _, rs, ts in groups[k] for r in rs + ts])]
    names = phase_names + [n for n in names if n not in phase_names]
    # the layout phases and their contiguous parents in colours no peer uses
    palette = ["#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#bcbd22", "#8c564b", "#7f7f7f", "#1f77b4"]
    colors = {n: PEER_COLORS.get(n) or palette[i % len(palette)] for i, n in enumerate(names)}
    backends = sorted({r.get("sdpa_backend_ran") for r in rows if r["phase"] == "torch_sdpa"} - {None})
    # one small panel per problem, four to a row (a long file wraps into more rows, readable at page width)
    import textwrap

    ncols = min(4, max(len(groups[k]) for k in kinds))
    rows_of = [math.ceil(len(groups[k]) / ncols) for k in kinds]
    fig = plt.figure(figsize=(10.0, 2.75 * sum(rows_of) + 0.8 * len(kinds) + 0.9), layout="constrained")
    sfs = fig.subfigures(len(kinds) + 1, 1, height_ratios=[r * 2.75 + 0.8 for r in rows_of] + [0.55])
    bw = ceil.get("copy", {}).get("value")
    for sf, k, nr in zip(sfs, kinds, rows_of):
        entries = groups[k]
        axs = sf.subplots(nr, ncols, sharey=True, squeeze=False)
        for ax in axs.flat[len(entries):]:
            ax.axis("off")
        for ax, (prob, rs, ts) in zip(axs.flat, entries):
            flops = prob.flops()
            x = 0
            for n in names:
                for twin, pool in ((False, rs), (True, ts)):
                    r = next((y for y in pool if y["phase"] == n), None)
                    if r is None:
                        continue
                    t = r["time_ms"] * 1e-3
                    val = (r["min_bytes"] / t / 1e9) if k == "paged" else (flops / t / 1e12)
                    ax.bar(x, val, 0.8, color=colors[n], hatch="//" if twin else None,
                           edgecolor="white" if twin else None, linewidth=0)
                    x += 1
            if k == "paged" and bw:
                ax.axhline(bw, color="black", linestyle="--", linewidth=1.1)
            ax.set_xticks([])
            ax.set_xlim(-0.7, max(x, 1) - 0.3)
            ax.grid(axis="y", alpha=0.25)
            lab = prob.label.replace(" fp16", "").replace(" D128", "").replace(" paged", "")
            ax.set_title("\n".join(textwrap.wrap(lab, 24)), fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
        for ax in axs[:, 0]:
            ax.set_ylabel("GB/s on the bytes read" if k == "paged" else "useful TFLOP/s\n(real pairs only)",
                          fontsize=8.5)
        if k == "paged":
            head = ("Paged KV cache (solid) against the contiguous cache of the same bytes (hatched: every "
                    "sequence at the mean length)")
        else:
            head = ("Packed ragged batch, cu_seqlens (solid) against the padded batch (hatched: every sequence "
                    "at the longest length; the same useful FLOPs)")
        sf.suptitle(textwrap.fill(head, 95), fontsize=9.5, x=0.01, ha="left")
    handles = [Line2D([0], [0], color=colors[n], lw=7,
                      label=n + (f" ({', '.join(backends)})" if n == "torch_sdpa" and backends else ""))
               for n in names]
    if "paged" in kinds and bw:
        handles.append(Line2D([0], [0], color="black", linestyle="--", lw=1.1,
                              label=f"copy ceiling {bw:.0f} GB/s\n(read + write: a read-only\nstream may pass it)"))
    sfs[0].legend(handles=handles, fontsize=7.5, loc="outside right upper")
    fig.suptitle("Serving layouts against their contiguous twins", fontsize=11, x=0.01, ha="left")
    _caption(fig, env, source, "rows measured in the same run; a bar is missing where its row did not finish; "
                               "bars in the order of the legend")
    return _save(fig, out_dir, stem)


# -- steps: each phase against its parent, in the same run -------------------------------------------


def step_pairs(records) -> list[dict]:
    """(phase, parent) pairs measured in the same run (``run_id``) on the same problem, both OK: one dict per
    pair with the measured step (parent time / phase time), the planned one (the phases' planned speedups'
    ratio), the problem's label and the parameters either side asked for (empty: defaults)."""
    by_run = OrderedDict()
    for r in records:
        if r.get("type") == "result" and r.get("kind") == "phase" and _ok_time(r) and r.get("run_id"):
            by_run.setdefault((r["run_id"], r.get("label")), {}).setdefault(r["phase"], r)
    out = []
    for (run_id, label), phases in by_run.items():
        for name, r in phases.items():
            parent = phases.get(r.get("parent"))
            if parent is None:
                continue
            planned = None
            if r.get("planned_speedup") and parent.get("planned_speedup"):
                planned = r["planned_speedup"] / parent["planned_speedup"]
            out.append({"phase": name, "parent": parent["phase"], "order": r.get("order"), "label": label,
                        "run_id": run_id, "measured": parent["time_ms"] / r["time_ms"], "planned": planned,
                        "params": r.get("requested_params") or {}, "parent_params": parent.get("requested_params") or {},
                        "commit": r.get("commit") or ""})
    return out


def steps(records, out_dir, stem="steps"):
    """One optimization at a time: for every phase whose parent ran beside it (same run, same problem), the
    measured step (parent time / phase time; above 1: the idea paid) as one dot per run and problem, beside the
    step the roadmap planned (a grey line). Every run in the file counts, not only the latest."""
    if isinstance(records, (str, os.PathLike)):
        from numba_attn.measure.results import load_results

        source, records = os.path.basename(str(records)), load_results(str(records))
    else:
        source = getattr(records, "source", None) or "in-memory results"
        records = list(records)
    pairs = step_pairs(records)
    if not pairs:
        return []
    envs = [r for r in records if r.get("type") == "env"]
    order = {}
    for p in pairs:
        order.setdefault(p["phase"], (p["order"] if p["order"] is not None else 1e9, p["phase"]))
    names = sorted(order, key=order.get)
    labels = list(OrderedDict.fromkeys(p["label"] for p in pairs))
    colors = {lab: _CMAP(i % 10) for i, lab in enumerate(labels)}
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.5, 1.6 * len(names) + 3)), 4.6))
    for i, name in enumerate(names):
        mine = [p for p in pairs if p["phase"] == name]
        planned = next((p["planned"] for p in mine if p["planned"]), None)
        if planned:
            ax.hlines(planned, i - 0.32, i + 0.32, color="#888888", linewidth=4, zorder=1)
        for j, p in enumerate(mine):
            x = i + (j - (len(mine) - 1) / 2) * min(0.5 / max(len(mine), 1), 0.08)
            tuned = bool(p["params"] or p["parent_params"])
            ax.scatter(x, p["measured"], color=colors[p["label"]], marker="D" if tuned else "o", s=30, zorder=3,
                       edgecolor="black", linewidth=0.4)
    ax.axhline(1.0, color="black", linewidth=1.0)
    values = [p["measured"] for p in pairs] + [p["planned"] for p in pairs if p["planned"]] + [1.0]
    # room for the markers at both ends (a step of 0.3× sat on the bottom edge, half cut off); a log axis
    # when the steps span more than 3× (2× slower and 2× faster then lie equally far from 1)
    if max(values) / min(values) > 3:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks([t for t in (0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10, 20)
                       if min(values) / 1.2 <= t <= max(values) * 1.2])
        ax.set_ylim(min(values) / 1.2, max(values) * 1.2)
    else:
        pad = 0.08 * (max(values) - min(values))
        ax.set_ylim(min(values) - pad, max(values) + pad)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.grid(axis="y", color="#eeeeee", zorder=0)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{n}\nvs {next(p['parent'] for p in pairs if p['phase'] == n)}" for n in names], fontsize=8,
                       rotation=30 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
    ax.set_ylabel("parent time / phase time (same run)" + (", log" if ax.get_yscale() == "log" else ""))
    ax.set_title("Each step against its parent: measured (dots: one per run and problem; ◆ non-default "
                 "parameters) and planned (grey)", fontsize=9)
    handles = [Line2D([0], [0], marker="o", color="w", markerfacecolor=colors[lab], markeredgecolor="black",
                      markersize=7, label=lab) for lab in labels]
    handles.append(Line2D([0], [0], color="#888888", lw=4, label="planned step"))
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    runs = len({p["run_id"] for p in pairs})
    _caption(fig, envs[-1] if envs else None, source,
             f"{len(pairs)} pairs from {runs} runs; CUPTI or event time as each run recorded; ratios only within a run")
    return _save(fig, out_dir, stem)


# -- counts: each phase beside its parent, counted in the simulator ------------------------------------------

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
    env, rows, _, source = _load(records)
    pairs = count_pairs(rows)
    if not pairs:
        return []
    colors = {m: _CMAP(i) for i, (m, _) in enumerate(COUNT_METRICS)}
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
                ax.text(x, ratio, _fmt_x(ratio), fontsize=6.5, ha="center", va="bottom" if ratio >= 1 else "top",
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
    _caption(fig, env, source, "counts, not times: global bytes read + written, shared-memory wavefronts "
             "(bank conflicts included), syncthreads + named barriers; "
             + (f"problem {labels[0]}" if len(labels) == 1 else f"{len(labels)} problems"))
    return _save(fig, out_dir, stem)


# -- headline: per family, the best phase beside the best SDPA of the same run -------------------------------

# (family, results file stem, phase family test, problem label, label of the peer's problem (None: the same))
HEADLINE = (
    ("CUDA-core prefill, fp32", "roadmap", "cuda_core", "B1 H32 N4096 D128 fp32", None),
    ("Tensor-core prefill, fp16", "tensor-core-tma", "tensor_core", "B1 H32 N4096 D128 fp16", None),
    ("Decode, fp16 (GQA 32/8)", "decode", "decode", "B8 H32/8kv Nq1 Nk32768 D128 fp16", None),
    ("Paged decode, fp16, 64-token pages", "paged", "paged", "B8 H32 Nq1 Nk16384 D128 fp16 paged P64",
     "B8 H32 Nq1 Nk16384 D128 fp16"),
)


def _family_of(name: str) -> str | None:
    """cuda_core, tensor_core, decode (contiguous cache) or paged for a registered phase; None otherwise (peers,
    variants defined only in an experiment's setup)."""
    try:
        from numba_attn.api import get_phase

        ph = get_phase(name)
    except Exception:  # noqa: BLE001 - not a registered phase
        return None
    fam = ph.module.split(".")[-2] if ph.module.count(".") >= 2 else None
    if fam == "decode" and getattr(ph, "layout", "contiguous") == "paged":
        return "paged"
    return fam


def headline_pairs(results_dir=None, gpu="nvidia-h200", spec=HEADLINE) -> list[dict]:
    """Per family of ``spec``: the fastest registered phase of the family (default parameters) on the problem,
    and the fastest SDPA peer in the problem's dtype, both from the same run (``run_id``: one env record, one
    commit) of ``results/<stem>-<gpu>.jsonl``; the latest run of the file that has both. A family whose file or
    run is missing is left out."""
    from numba_attn.measure.results import load_results
    from numba_attn.report import records as rec

    results_dir = results_dir or rec.repo_path("results")
    out = []
    for family, stem, fam, label, peer_label in spec:
        path = os.path.join(results_dir, f"{stem}-{gpu}.jsonl")
        if not os.path.exists(path):
            continue
        records = load_results(path)
        envs = {r.get("run_id"): r for r in records if r.get("type") == "env"}
        # a problem measured twice in one run (overlapping presets): its last rows, as latest_rows keeps them
        last = OrderedDict()
        for r in records:
            if r.get("type") == "result":
                last[(r.get("run_id"), r.get("phase"), json.dumps(r.get("problem"), sort_keys=True))] = r
        rows = [r for r in last.values() if _ok_time(r)]
        best = None
        for run_id in reversed(list(OrderedDict.fromkeys(r.get("run_id") for r in rows if r.get("run_id")))):
            mine = [r for r in rows if r.get("run_id") == run_id and r.get("kind") == "phase"
                    and r.get("label") == label and not r.get("requested_params") and _family_of(r["phase"]) == fam]
            if not mine:
                continue
            ph = min(mine, key=lambda r: r["time_ms"])
            pr = _fastest_peer(rows, ph, peer_label or label)
            if pr is not None:
                best = (ph, pr, envs.get(run_id) or {})
                break
        if best is None:
            continue
        ph, pr, env = best
        out.append({"family": family, "file": os.path.basename(path), "label": label,
                    "peer_label": peer_label or label, "phase": ph["phase"], "phase_ms": ph["time_ms"],
                    "peer": pr["phase"], "peer_ms": pr["time_ms"],
                    "peer_backend": pr.get("sdpa_backend_ran") or "", "ratio": pr["time_ms"] / ph["time_ms"],
                    "run_id": ph["run_id"], "commit": str(env.get("commit") or "")[:7],
                    "date": str(env.get("date") or "")[:10], "gpu": env.get("gpu") or gpu,
                    "time_method": ph.get("time_method") or "events"})
    return out


def headline(out_dir="plots", results_dir=None, gpu="nvidia-h200", stem="headline") -> list[str]:
    """One picture for the README: per family, the best phase's speed against the best PyTorch SDPA measured in
    the same run (SDPA time / phase time, so that 1 is SDPA's speed), the problem and both times named."""
    pairs = headline_pairs(results_dir, gpu)
    if not pairs:
        return []
    fig, ax = plt.subplots(figsize=(9.0, 1.05 * len(pairs) + 1.9))
    ys = list(range(len(pairs)))[::-1]
    for y, p in zip(ys, pairs):
        col = "#2ca02c" if p["ratio"] >= 1 else "#1f77b4"
        ax.barh(y, p["ratio"], 0.5, color=col)
        ax.annotate(f"{p['ratio']:.2f}×", (p["ratio"], y), xytext=(-5, 0), textcoords="offset points", va="center",
                    ha="right", fontsize=11, fontweight="bold", color="white")
        backend = p["peer_backend"] or p["peer"].replace("torch_sdpa", "").strip("_") or "auto"
        peer = f"SDPA ({backend})"
        where = "" if p["peer_label"] == p["label"] else " on the contiguous cache"
        ax.annotate(f"{p['phase']} {_fmt_ms(p['phase_ms'])}  vs  {peer}{where} {_fmt_ms(p['peer_ms'])}",
                    (0.0, y), xytext=(2, -21), textcoords="offset points", va="top", ha="left", fontsize=8,
                    color="#333333")
    ax.axvline(1.0, color="black", linewidth=1.3, linestyle="--")
    ax.annotate("PyTorch SDPA = 1", (1.0, ys[0] + 0.45), ha="center", va="bottom", fontsize=8.5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0}, zorder=5)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{p['family']}\n{p['label']}" for p in pairs], fontsize=9)
    ax.set_ylim(-0.9, len(pairs) - 0.3)
    ax.set_xlim(0, max(1.25, max(p["ratio"] for p in pairs) * 1.18))
    ax.set_xlabel("speed against PyTorch SDPA in the same run (SDPA time / our time; above 1: faster)")
    ax.grid(axis="x", alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    gpus = sorted({p["gpu"] for p in pairs})
    ax.set_title(f"numba-attn's fastest kernel per family against PyTorch SDPA, {' / '.join(gpus)}",
                 fontsize=11, loc="left")
    cites = [f"{p['family'].split(',')[0]}: results/{p['file']} (commit {p['commit']}, {p['date']}, "
             f"{p['time_method']} time)" for p in pairs]
    text = "\n".join(["each pair measured in one run (one command, one commit); SDPA: the fastest of its backends "
                      "timed in that run, in the problem's dtype"] + cites)
    fig.tight_layout(rect=(0, (0.25 + 0.13 * len(cites)) / fig.get_figheight(), 1, 1))
    fig.text(0.01, 0.005, text, fontsize=7, color="#444444", ha="left", va="bottom")
    return _save(fig, out_dir, stem)


def _fmt_ms(ms: float) -> str:
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms" if ms >= 1 else (f"{ms:.3f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} µs")


def make_all(records, out_dir="plots", prefix="", which=PLOTS) -> list[str]:
    """Draw every plot the results support; returns the files written."""
    if isinstance(records, (str, os.PathLike)):
        from numba_attn.measure.results import load_results

        source = os.path.basename(str(records))
        records = load_results(str(records))
    else:
        source = None
    files = []
    fns = {"roadmap": roadmap, "scaling": scaling, "roofline": roofline, "traffic": traffic, "layouts": layouts,
           "steps": steps, "counts": counts}
    for name in which:
        stem = f"{prefix}{name}"
        recs = _Named(records, source) if source else records
        files += fns[name](recs, out_dir, stem=stem)
    return files


class _Named(list):
    """Records that remember the file they came from (for captions)."""

    def __init__(self, records, source):
        super().__init__(records)
        self.source = source


def synthetic_records(device="synthetic device") -> list[dict]:
    """A small, clearly labelled synthetic results set for tests and for the
    report notebook when no measured file exists. Not a measurement."""
    from numba_attn.spec.problem import Problem

    env = {"type": "env", "env_key": "synthetic", "synthetic": True, "gpu": device, "date": "1970-01-01",
           "commit": "synthetic", "backend": "synthetic"}
    recs = [env]
    for name, val, unit in (("ffma", 50.0, "TFLOP/s"), ("mma_fp16", 400.0, "TFLOP/s"), ("copy", 3000.0, "GB/s")):
        recs.append({"type": "ceiling", "kind": "ceiling", "name": name, "value": val, "unit": unit,
                     "status": "OK", "env_key": "synthetic"})
    phases = [("naive", 0, 1.0, 1.0, True), ("fused_rowwise", 1, 4.0, 3.0, False),
              ("smem_kv", 2, 6.0, 7.5, False), ("tc_mma", 3, 30.0, 22.0, False)]
    for n in (1024, 2048, 4096):
        p = Problem(batch=1, heads=32, q_len=n, head_dim=64)
        base = 20.0 * (n / 4096) ** 2
        for k, (name, order, plan, sp, mat) in enumerate(phases):
            t = base / sp
            r = {"type": "result", "kind": "phase", "phase": name, "order": order, "planned_speedup": plan,
                 "parent": phases[k - 1][0] if k else None, "run_id": f"synthetic-{n}",
                 "problem": p.to_dict(), "label": p.label, "status": "OK", "time_ms": t, "speedup": sp,
                 "flops": p.flops(), "min_bytes": p.min_bytes(), "env_key": "synthetic",
                 "model_bytes": p.materialized_bytes() if mat else p.min_bytes(), "phase_kind": "prefill"}
            r["tflops"] = p.flops() / (t * 1e-3) / 1e12
            r["gbps"] = p.min_bytes() / (t * 1e-3) / 1e9
            recs.append(r)
        for peer, sp in (("torch_sdpa", 18.0), ("torch_sdpa_flash", 40.0)):
            t = base / sp
            recs.append({"type": "result", "kind": "peer", "phase": peer, "problem": p.to_dict(), "label": p.label,
                         "status": "OK", "time_ms": t, "flops": p.flops(), "min_bytes": p.min_bytes(),
                         "tflops": p.flops() / (t * 1e-3) / 1e12, "env_key": "synthetic"})
    return recs
