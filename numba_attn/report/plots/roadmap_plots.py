"""The roadmap's plots: measured against planned speedup per phase (``roadmap``), time and TFLOP/s over
context length (``scaling``), each phase against its parent in the same run (``steps``)."""
from __future__ import annotations

import json
import math
from collections import OrderedDict

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from numba_attn.report.plots.style import (CMAP, PEER_STYLE, SHORT_DT, caption, fmt_x, is_sdpa, load_latest,
                                           load_records, ok_time, phase_order, save_figure, shape_key, styles_of)


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
    ok = [r for r in rows_of_phase if ok_time(r)]
    for pool in (ok, rows_of_phase):
        for r in pool:
            if (r.get("problem") or {}).get("dtype") == prefer_dtype:
                return r
        if pool:
            return pool[0]
    return None


def registered_plan(name: str):
    """The planned speedup (against the family's baseline) that phase ``name`` registers now; None for a
    name not registered here."""
    from numba_attn.phases.registry import get_phase

    try:
        return get_phase(name).planned_speedup
    except Exception:  # noqa: BLE001 - a row of a phase this checkout does not have
        return None


def roadmap(records, out_dir, stem="roadmap", baseline=None):
    """Measured vs planned speedup per phase, one panel per problem shape.

    Phases that run only in fp16 (tensor cores) share the panel of the same
    shape in fp32 and are measured against the fp32 baseline (bar label
    ``name (fp16)``), as are the SDPA lines. ``baseline``: the run's own
    (``bwd_naive`` for the backward family) unless given. The latest run that
    timed the baseline (a later run of a few phases only, without it, would
    leave nothing to measure against; its steps are in :func:`steps`)."""
    records = load_records(records)
    last = load_latest(records)[0]
    baseline = baseline or ((last or {}).get("config") or {}).get("baseline") or "naive"
    env, rows, _ceil, source = load_latest(records, need=baseline)
    rows = [r for r in rows if r.get("phase_kind", "prefill") != "decode" or r.get("kind") == "peer"]
    phases = phase_order(rows)
    shapes = OrderedDict()
    for r in rows:
        shapes.setdefault(shape_key(r.get("problem")), []).append(r)
    shapes = OrderedDict((k, v) for k, v in shapes.items() if any(ok_time(r) for r in v))
    # a panel needs the baseline's time on its shape: without it there is nothing to measure bars against
    no_base = [_shape_label(v[0].get("problem") or {}) for v in shapes.values()
               if not any(r.get("kind") == "phase" and r["phase"] == baseline and ok_time(r) for r in v)]
    if len(no_base) < len(shapes):
        shapes = OrderedDict((k, v) for k, v in shapes.items()
                             if any(r.get("kind") == "phase" and r["phase"] == baseline and ok_time(r) for r in v))
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
        base_ms = base.get("time_ms") if base is not None and ok_time(base) else None
        base_dt = (base.get("problem") or {}).get("dtype", "float32") if base is not None else "float32"
        names = [p for p in phases if any(r["phase"] == p and r.get("kind") == "phase" for r in srows)]
        w = 0.38
        ymax, ymin = 1.0, 1.0
        ticks = []
        for i, name in enumerate(names):
            r = _pick([x for x in srows if x["phase"] == name and x.get("kind") == "phase"], base_dt)
            dt = (r.get("problem") or {}).get("dtype")
            ticks.append(name + (f" ({SHORT_DT.get(dt, dt)})" if dt != base_dt else ""))
            plan = registered_plan(name) or r.get("planned_speedup")
            if plan:
                ax.bar(i + w / 2, plan, w, color="none", edgecolor="#888888", hatch="///", linewidth=0.8)
                ymax, ymin = max(ymax, plan), min(ymin, plan)
            sp = base_ms / r["time_ms"] if (base_ms and ok_time(r)) else None
            if sp:
                ax.bar(i - w / 2, sp, w, color=CMAP(0) if dt == base_dt else CMAP(2))
                ax.annotate(fmt_x(sp), (i - w / 2, sp), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 1), textcoords="offset points")
                ymax, ymin = max(ymax, sp), min(ymin, sp)
            elif ok_time(r):  # measured, but no baseline time on this shape in this run
                ax.annotate(f"{r['time_ms']:.3g} ms (no baseline)", (i - w / 2, 1.0), ha="center", va="bottom",
                            fontsize=7, color="#555555", rotation=90)
            else:
                ax.annotate(r.get("status") or "?", (i - w / 2, 1.0), ha="center", va="bottom", fontsize=7,
                            color="#b00000", rotation=90)
        # SDPA reference lines: PyTorch's default in the baseline dtype, and the fastest SDPA of any dtype
        peers = [r for r in srows if is_sdpa(r) and ok_time(r)]
        show = []
        auto = [r for r in peers if r["phase"] in ("torch_sdpa", "torch_sdpa_backward")
                and (r.get("problem") or {}).get("dtype") == base_dt]
        if auto:
            show.append((auto[0], f"SDPA auto ({SHORT_DT.get(base_dt, base_dt)})"))
        if peers:
            best = min(peers, key=lambda r: r["time_ms"])
            if not auto or best is not auto[0]:
                bdt = (best.get("params") or {}).get("dtype") or (best.get("problem") or {}).get("dtype")
                kind = best["phase"].replace("torch_sdpa", "").replace("_fp16", "").replace("_backward", "")
                kind = kind.strip("_") or "auto"
                show.append((best, f"fastest SDPA: {kind} ({SHORT_DT.get(bdt, bdt)})"))
        for j, (pr, text) in enumerate(show):
            if base_ms:
                sp = base_ms / pr["time_ms"]
                col = ("#d62728", "#9467bd")[j % 2]
                # named in the panel's legend: a label on the line hid the bar labels it crossed
                ax.axhline(sp, color=col, label=f"{text}: {fmt_x(sp)}", **PEER_STYLE)
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
    handles = [plt.Rectangle((0, 0), 1, 1, color=CMAP(0), label="measured (baseline dtype)"),
               plt.Rectangle((0, 0), 1, 1, color=CMAP(2), label="measured (fp16 storage)"),
               plt.Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="#888888", hatch="///", label="planned"),
               Line2D([], [], color="#d62728", label="PyTorch SDPA (baseline dtype)", **PEER_STYLE),
               Line2D([], [], color="#9467bd", label="fastest SDPA (any dtype)", **PEER_STYLE)]
    H = fig.get_figheight()
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=5, bbox_to_anchor=(1.0, 1 - 0.3 / H))
    fig.suptitle("Roadmap: measured vs planned speedup per phase", fontsize=11, x=0.02, ha="left",
                 y=1 - 0.1 / H)
    fig.tight_layout(rect=(0, 0.45 / H, 1, 1 - 0.65 / H))
    methods = sorted({str(r.get("time_method") or "events") for r in rows if ok_time(r)})
    extra = f"bars: median time of the baseline / of the phase ({', '.join(methods)}, same run); " \
            "hatched: the phase's planned speedup (its registration); labels: failed or skipped rows"
    if no_base:
        extra += f"\nnot drawn (no {baseline} time on the shape to measure against): {'; '.join(no_base)}"
    if env is not last:
        extra += (f"\nthe latest run that timed {baseline}; later runs (without it) are in the steps plot, each "
                  "phase against its parent in the same run")
    caption(fig, env, source, extra)
    return save_figure(fig, out_dir, stem)


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
    env, rows, _ceil, source = load_latest(records)
    groups = _length_groups(rows)
    if not groups:
        return []
    names = phase_order(rows) + sorted({r["phase"] for r in rows if r.get("kind") == "peer"})
    styles = styles_of(names)
    colors = {n: c for n, (c, _m) in styles.items()}
    fig, axes = plt.subplots(len(groups), 2, figsize=(14, 4.3 * len(groups) + 1.2), squeeze=False)
    stops: dict = {}
    for (lab, by_n), (ax_t, ax_f) in zip(groups.items(), axes):
        plotted = []
        for name in names:
            pts = [(n, r) for n, rs in by_n.items() for r in rs if r["phase"] == name and ok_time(r)]
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
            ok_n = [n for n, r in mine if ok_time(r)]
            if not ok_n:
                continue
            after = [r for n, r in sorted(mine, key=lambda x: x[0]) if n > max(ok_n) and not ok_time(r)]
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
    caption(fig, env, source, "\n".join(notes))
    return save_figure(fig, out_dir, stem)


def _stop_reason(reason: str) -> str:
    if "predicted" in reason and "row limit" in reason:
        return "time predicted from the previous length over the benchmark's row limit"
    if "time limit" in reason:
        return "the run's time limit was reached"
    return reason.split(":")[0][:80]


# -- steps: each phase against its parent, in the same run -------------------------------------------


def step_pairs(records) -> list[dict]:
    """(phase, parent) pairs measured in the same run (``run_id``) on the same problem, both OK: one dict per
    pair with the measured step (parent time / phase time), the planned one (the phases' planned speedups'
    ratio, as registered now), the problem's label and the parameters either side asked for (empty: defaults)."""
    by_run = OrderedDict()
    for r in records:
        if r.get("type") == "result" and r.get("kind") == "phase" and ok_time(r) and r.get("run_id"):
            by_run.setdefault((r["run_id"], r.get("label")), {}).setdefault(r["phase"], r)
    out = []
    for (run_id, label), phases in by_run.items():
        for name, r in phases.items():
            parent = phases.get(r.get("parent"))
            if parent is None:
                continue
            planned = None  # the plans registered now (as the roadmap's), else the rows' (conventions change)
            mine, theirs = (registered_plan(x["phase"]) or x.get("planned_speedup") for x in (r, parent))
            if mine and theirs:
                planned = mine / theirs
            out.append({"phase": name, "parent": parent["phase"], "order": r.get("order"), "label": label,
                        "run_id": run_id, "measured": parent["time_ms"] / r["time_ms"], "planned": planned,
                        "params": r.get("requested_params") or {},
                        "parent_params": parent.get("requested_params") or {},
                        "commit": r.get("commit") or ""})
    return out


def steps(records, out_dir, stem="steps"):
    """One optimization at a time: for every phase whose parent ran beside it (same run, same problem), the
    measured step (parent time / phase time; above 1: the idea paid) as one dot per run and problem, beside the
    step the roadmap planned (a grey line). Every run in the file counts, not only the latest."""
    records = load_records(records)
    source = records.source
    pairs = step_pairs(records)
    if not pairs:
        return []
    envs = [r for r in records if r.get("type") == "env"]
    order = {}
    for p in pairs:
        order.setdefault(p["phase"], (p["order"] if p["order"] is not None else 1e9, p["phase"]))
    names = sorted(order, key=order.get)
    labels = list(OrderedDict.fromkeys(p["label"] for p in pairs))
    colors = {lab: CMAP(i % 10) for i, lab in enumerate(labels)}
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
    caption(fig, envs[-1] if envs else None, source,
             f"{len(pairs)} pairs from {runs} runs; CUPTI or event time as each run recorded; ratios only within a run")
    return save_figure(fig, out_dir, stem)
