"""Plots against the measured ceilings: the roofline (``roofline``; against PyTorch SDPA for a run without
ceilings) and the bytes each phase moves with the bandwidth achieved on them (``traffic``)."""
from __future__ import annotations

import math
from collections import OrderedDict

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from numba_attn.report.plots.style import (PEER_COLORS, SHORT_DT, caption, colors_of, dtype_of, fastest_peer,
                                           load_latest, ok_time, phase_order, problems_by_label, save_figure, shape_key,
                                           styles_of)

ROOFLINE_PEERS = ("torch_sdpa", "torch_sdpa_fp16")  # PyTorch's own choice, in the problem's dtype and in fp16


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
    env, rows, ceil, source = load_latest(records)
    pts = [r for r in rows if ok_time(r) and r.get("tflops") and r.get("min_bytes")
           and (r.get("kind") == "phase" or r.get("phase") in ROOFLINE_PEERS)]
    if not pts:
        return []
    if not ceil:
        return _against_peers(env, rows, source, out_dir, stem)
    decode = all(_is_decode(r) for r in pts)
    # a peer that ran in another dtype than its problem's (torch_sdpa_fp16 on an fp32 problem) is drawn only
    # where no peer of that dtype ran on the same shape (it would sit in a column named for the other dtype)
    have = {(shape_key(r.get("problem")), dtype_of(r)) for r in pts
            if r.get("kind") == "peer" and dtype_of(r) == (r.get("problem") or {}).get("dtype")}
    pts = [r for r in pts if r.get("kind") != "peer" or dtype_of(r) == (r.get("problem") or {}).get("dtype")
           or (shape_key(r.get("problem")), dtype_of(r)) not in have]
    names = phase_order(pts) + sorted({r["phase"] for r in pts if r.get("kind") == "peer"})
    is32 = [r for r in pts if dtype_of(r) == "float32"]
    is16 = [r for r in pts if dtype_of(r) != "float32"]
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
        styles = styles_of(pnames)
        h, d = _roofline_ax(ax, ppts, ceil, styles, roof_names, decode)
        hollow, drawn_roofs = hollow or h, drawn_roofs or d
        if title:
            ax.set_title(title, fontsize=9.5)
        hs = [Line2D([], [], color=styles[n][0], marker=styles[n][1], linestyle="",
                     label=n + (f" ({SHORT_DT.get(dtype_of(next(r for r in ppts if r['phase'] == n)), '')})"
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
    caption(fig, env, source, extra)
    return save_figure(fig, out_dir, stem)


def _against_peers(env, rows, source, out_dir, stem):
    """Per problem, each phase's speed against the fastest PyTorch SDPA of the same run (SDPA time / phase
    time): the picture for a run that measured no ceilings."""
    phases = [r for r in rows if r.get("kind") == "phase" and ok_time(r)]
    probs = OrderedDict()
    for r in phases:
        pr = fastest_peer(rows, r)
        if pr is not None:
            probs.setdefault(r["label"], []).append((r, pr))
    if not probs:
        return []
    names = phase_order([r for v in probs.values() for r, _ in v])
    styles = styles_of(names)
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
    caption(fig, env, source, f"each pair from one run ({runs} runs, one per problem); SDPA: the fastest of the "
                               f"peers timed in that run, in the problem's dtype (backend ran: {', '.join(backends)})")
    return save_figure(fig, out_dir, stem)


# -- memory traffic ----------------------------------------------------------------------


def _plain_log_ticks(ax):
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def traffic(records, out_dir, stem="traffic"):
    """Bytes each phase moves by construction, and the bandwidth achieved on them."""
    env, rows, ceil, source = load_latest(records)
    rows = [r for r in rows if r.get("kind") == "phase" and r.get("min_bytes") and ok_time(r)]
    if not rows:
        return []
    names = phase_order(rows)
    labels = list(problems_by_label(rows))
    colors = colors_of(labels)
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
    caption(fig, env, source, "modelled bytes: Problem.materialized_bytes() for the unfused baseline, "
                               "min_bytes() + 2 × workspace for the others")
    return save_figure(fig, out_dir, stem)
