"""Serving layouts (``layouts``): paged KV caches and packed ragged (varlen) batches beside their
contiguous twins."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from numba_attn.report.plots.style import PEER_COLORS, caption, load_latest, ok_time, phase_order, save_figure


def layouts(records, out_dir, stem="layouts"):
    """Each paged or varlen problem beside its contiguous twin, on the measure that compares them fairly:
    a paged KV cache by the bandwidth on the bytes actually read (the twin holds the same bytes), under
    the measured copy ceiling; a packed ragged batch by useful TFLOP/s (the real pairs only, for the
    twin too: the padded batch pays for its padding). Hatched bars: rows of the twin."""
    from numba_attn.spec.problem import Problem, layout_of, twin_of

    env, rows, ceil, source = load_latest(records)
    # SDPA as PyTorch chooses it (its backend in the legend); the forced backends would crowd the groups
    rows = [r for r in rows if ok_time(r) and r.get("problem")
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
    phase_names = [n for n in phase_order([r for k in kinds for _, rs, ts in groups[k] for r in rs + ts])]
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
    caption(fig, env, source, "rows measured in the same run; a bar is missing where its row did not finish; "
                               "bars in the order of the legend")
    return save_figure(fig, out_dir, stem)
