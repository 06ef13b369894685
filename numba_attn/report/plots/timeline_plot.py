"""A traced call's work items on one time axis (:class:`numba_attn.measure.timeline.Timeline`): a row a consumer
warpgroup of a few SMs, each item a run of coloured parts (setup, Q, the first K tile, the tile loop, the
epilogue), the SM's idle
time between items left blank."""
from __future__ import annotations

import numpy as np

from numba_attn.report.plots.style import CMAP

COLORS = {"setup": "#bbbbbb", "q": CMAP(3), "k0": CMAP(2), "loop": CMAP(0), "epilogue": CMAP(1)}


def plot_timeline(tl, path, sms: int = 8, title: str | None = None):
    """Draw ``tl``'s first ``sms`` SMs (by their first item's start) to ``path``; returns ``path``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t = tl.t
    start, end = tl.item_span()
    first = {s: start[tl.sm == s].min() for s in np.unique(tl.sm)}
    shown = sorted(first, key=first.get)[:sms]
    persistent = len(np.unique(tl.block)) < len(tl.block)
    begin = t["producer"] if persistent else t["block"]
    W = tl.warpgroups
    fig, ax = plt.subplots(figsize=(12, 0.45 * W * len(shown) + 1.6))
    for row_sm, s in enumerate(shown):
        for i in np.flatnonzero(tl.sm == s):
            for w in range(W):
                y = row_sm * (W + 0.6) + w
                parts = [("setup", min(begin[i], t["start"][i, w]), t["start"][i, w]),
                         ("q", t["start"][i, w], t["q"][i, w]), ("k0", t["q"][i, w], t["k0"][i, w]),
                         ("loop", t["k0"][i, w], t["loop"][i, w]),
                         ("epilogue", t["loop"][i, w], t["stored"][i, w])]
                for name, a, b in parts:
                    ax.broken_barh([(a / 1e3, max(b - a, 0) / 1e3)], (y, 0.8), color=COLORS[name], linewidth=0)
                if w == 0:
                    ax.text(t["k0"][i, 0] / 1e3, y + 0.4, str(int(tl.tiles[i])), fontsize=6, va="center",
                            color="white")
    ax.set_yticks([r * (W + 0.6) + W / 2 for r in range(len(shown))])
    ax.set_yticklabels([f"SM {s}" for s in shown])
    ax.invert_yaxis()
    ax.set_xlabel("µs from the call's first stamp (numbers: the item's key tiles)")
    s = tl.summary()
    item = s["q_us"] + s["k0_us"] + s["loop_us"] + s["epilogue_us"]
    ax.set_title(title or (f"{tl.phase} on {s['problem']}: item {item:.2f} µs median (Q {s['q_us']:.2f}, first K "
                           f"{s['k0_us']:.2f}, loop {s['loop_us']:.2f}, epilogue {s['epilogue_us']:.2f}); a tile "
                           f"{s['tile_us']:.2f} µs"), fontsize=9)
    ax.legend(handles=[Patch(color=c, label=n) for n, c in COLORS.items()], loc="upper right", fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
