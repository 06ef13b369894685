"""Where a kernel's time goes between its tiles: a phase run with its work items' steps stamped, read back as
a timeline.

``trace_phase(name, problem)`` builds the phase inside :func:`numba_attn.phases.tensor_core.timeline.tracing`
(the warp-specialized wgmma phases: ``warp_specialized_tc``, ``ws_intra`` and their children), runs it on fresh
random inputs with a poisoned output, checks the output against float64 (a timeline of a wrong kernel is never
returned), runs it once more and reads the stamps. :class:`Timeline` turns them into nanoseconds on one clock:

* per item and consumer warpgroup: ``q`` (start until Q is in registers), ``k0`` (then until its first K tile has
  landed), ``loop`` (the tile loop from there), ``epilogue`` (O's stores issued); ``setup`` (the block's start until its consumers start the item) and ``gap`` (the SM idle
  since its previous item ended);
* :meth:`Timeline.summary`: their medians, and the tile loop fitted as ``a · tiles + b`` over the items (``a`` a
  tile, ``b`` what a loop costs beside its tiles: the pipeline's fill and drain);
* :meth:`Timeline.plot`: the items of a few SMs as bars on one time axis.

The stamps are ``%clock64`` (the SM's cycles, exact within an SM) placed against each other by ``%globaltimer``;
a stamp costs a few instructions of one lane per warpgroup, so the traced kernel runs within noise of the plain one
(check with ``time_ms`` beside the untraced phase's). The clock-to-nanosecond ratio is the median over the items of
their globaltimer span over their cycle span.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["trace_phase", "Timeline", "SEGMENTS"]

SEGMENTS = ("gap", "setup", "q", "k0", "loop", "epilogue")  # an item's parts, in order on its SM


def _key_tiles(problem, Br: int, Bc: int) -> np.ndarray:
    """Key tiles each item walks (items in ``bh · query blocks + query block`` order): all of them, or causally
    those up to its last row's last key (bottom-right aligned)."""
    n_qb = (problem.q_len + Br - 1) // Br
    qb = np.arange(n_qb)
    ends = np.full(n_qb, problem.kv_len)
    if problem.causal:
        ends = np.minimum(problem.kv_len, np.minimum(problem.q_len, (qb + 1) * Br) + problem.kv_len - problem.q_len)
    tiles = (np.maximum(ends, 0) + Bc - 1) // Bc
    return np.tile(tiles, problem.batch * problem.heads)


@dataclass
class Timeline:
    """The stamps of one traced call (``raw``: one row an item, :mod:`numba_attn.phases.tensor_core.timeline`),
    in nanoseconds from the call's first stamp."""

    phase: str
    problem: object
    params: dict
    raw: np.ndarray
    warpgroups: int
    tiles: np.ndarray  # key tiles of each item
    ns_per_cycle: float = field(init=False)
    sm: np.ndarray = field(init=False)
    block: np.ndarray = field(init=False)
    t: dict = field(init=False)  # name -> (items,) or (items, warpgroups) in ns

    def __post_init__(self):
        from numba_attn.phases.tensor_core.timeline import CONSUMER_STEPS, PRODUCER_SLOTS

        raw = self.raw.astype(np.int64)  # (cycle counts and ns since boot fit in 63 bits)
        W, S = self.warpgroups, len(CONSUMER_STEPS)
        missing = int(np.count_nonzero(raw[:, 3:] == 0)) + int(np.count_nonzero(raw[:, 3:] == 1))
        if missing:
            raise ValueError(f"{missing} stamps never written (or Q's guard value hit): not a whole traced call")
        self.sm = (self.raw[:, 0] >> np.uint64(32)).astype(np.int64)
        self.block = (self.raw[:, 0] & np.uint64(0xFFFFFFFF)).astype(np.int64)
        cons = raw[:, PRODUCER_SLOTS:PRODUCER_SLOTS + S * W].reshape(len(raw), W, S)
        g0, g1 = raw[:, 1] - raw[:, 1].min(), raw[:, -1] - raw[:, 1].min()  # (small integers before any float:
        c0, c1 = raw[:, 3], cons[:, 0, S - 1]  # float64 of ns since boot is only 256-ns exact)
        ok = (c1 > c0) & (g1 > g0)
        ratio = float(np.median((g1[ok] - g0[ok]) / (c1[ok] - c0[ok]))) if ok.any() else 1.0
        self.ns_per_cycle = ratio
        # each SM's cycles onto the global clock: its own first cycle, then the median offset of its items'
        # producer stamps
        base = np.empty(len(raw), np.int64)
        origin = np.empty(len(raw), np.float64)
        for s in np.unique(self.sm):
            on = self.sm == s
            base[on] = raw[on, 2].min()
            origin[on] = np.median(g0[on] - (c0[on] - base[on]) * ratio)

        def ns(c):
            return ((c - base) * ratio + origin) if c.ndim == 1 else ((c - base[:, None]) * ratio + origin[:, None])

        t = {"block": ns(raw[:, 2]), "producer": ns(raw[:, 3]), "loaded": ns(raw[:, 4])}
        for i, step in enumerate(CONSUMER_STEPS):
            t[step] = ns(cons[:, :, i])
        zero = min(v.min() for v in t.values())
        self.t = {k: v - zero for k, v in t.items()}

    # -- the parts of each item ------------------------------------------------------------------------------
    def item_span(self):
        """(start, end) of each item: its first consumer's start, its last consumer's stores issued (ns)."""
        return self.t["start"].min(axis=1), self.t["stored"].max(axis=1)

    def segments(self) -> dict:
        """name → per-item ns (:data:`SEGMENTS`): ``q``, ``k0``, ``loop``, ``epilogue`` the slowest consumer
        warpgroup's;
        ``setup`` from the block's start to the item's (a persistent block's later items: 0); ``gap`` from the SM's
        previous item's end to this item's block start (a persistent block's later items: to the item's start;
        NaN for an SM's first item)."""
        t = self.t
        start, end = self.item_span()
        setup = np.zeros(len(start))
        gap = np.full(len(start), np.nan)
        for s in np.unique(self.sm):
            idx = np.flatnonzero(self.sm == s)
            order = idx[np.argsort(start[idx])]
            first = np.r_[True, self.block[order[1:]] != self.block[order[:-1]]]  # a block's first item
            setup[order[first]] = start[order[first]] - t["block"][order[first]]
            begin = np.where(first, t["block"][order], start[order])  # (a new block: until its start)
            gap[order[1:]] = begin[1:] - end[order[:-1]]
        return {"gap": gap, "setup": setup, "q": (t["q"] - t["start"]).max(axis=1),
                "k0": (t["k0"] - t["q"]).max(axis=1), "loop": (t["loop"] - t["k0"]).max(axis=1),
                "epilogue": (t["stored"] - t["loop"]).max(axis=1)}

    def summary(self) -> dict:
        """Medians of the segments (µs), the tile loop fitted over the items (``tile_us``, ``loop_fixed_us``; a
        single tile count: ``loop / tiles`` and no fixed part), what an item costs beside its tiles (its span, gap
        and setup less ``tile_us`` a tile), the call's span and the items an SM ran."""
        seg = self.segments()
        med = {k: float(np.nanmedian(v)) / 1e3 if np.isfinite(v).any() else None for k, v in seg.items()}
        tiles = self.tiles.astype(np.float64)
        loop = (seg["k0"] + seg["loop"]) / 1e3  # (the first K's wait is part of the loop's fixed cost)
        if len(np.unique(tiles)) > 1:
            a, b = np.polyfit(tiles, loop, 1)
        else:
            a, b = float(np.median(loop / tiles)), 0.0
        start, end = self.item_span()
        item = (end - start) / 1e3
        _, per_sm = np.unique(self.sm, return_counts=True)
        return {"phase": self.phase, "problem": self.problem.label, "params": self.params,
                "items": int(len(self.raw)), "sms": int(len(per_sm)), "items_per_sm": float(np.mean(per_sm)),
                "span_us": float(end.max() - min(start.min(), self.t["block"].min())) / 1e3,
                "ns_per_cycle": self.ns_per_cycle,
                **{f"{k}_us": v for k, v in med.items()},
                "tile_us": float(a), "loop_fixed_us": float(b),
                "item_beside_tiles_us": float(np.median(item - a * tiles + (np.nan_to_num(seg["gap"])
                                                                           + seg["setup"]) / 1e3))}

    def to_dict(self) -> dict:
        """The summary and the raw stamps (a list per item), for a results file."""
        return {**self.summary(), "raw": self.raw.tolist()}

    # -- the picture -----------------------------------------------------------------------------------------
    def plot(self, path, sms: int = 8, title: str | None = None):
        """The items of the first ``sms`` SMs as bars on one time axis (µs), a row a consumer warpgroup, coloured
        by part; written to ``path`` (png or svg)."""
        from numba_attn.report.plots.timeline_plot import plot_timeline

        return plot_timeline(self, path, sms=sms, title=title)


def trace_phase(name: str, problem, params: dict | None = None, seed: int = 0, warmup: int = 2) -> Timeline:
    """The :class:`Timeline` of phase ``name`` on ``problem`` (``params`` its overrides), on the current backend
    (the simulator runs it too, at its own clock). Raises ValueError when the phase cannot be traced or its output
    is wrong."""
    from numba import cuda

    from numba_attn.measure.autotune import inputs, output_problem
    from numba_attn.measure.check import kernel_views, to_device
    from numba_attn.measure.limits import simulated_device_limits
    from numba_attn.phases.registry import get_phase
    from numba_attn.phases.tensor_core.timeline import tracing
    from numba_attn.spec.problem import numpy_dtype
    from numba_attn.spec.reference import poison

    ph = get_phase(name)
    with tracing(), simulated_device_limits():
        launch = ph.plan(problem, **(params or {}))
    if launch.timeline is None:
        raise ValueError(f"phase {name!r} has no traced kernel (the warp-specialized wgmma phases have one)")
    stream = cuda.stream()
    host = inputs(problem, seed)
    qd, kd, vd = (to_device(a, stream=stream) for a in host)
    out = poison(np.empty(problem.out_shape(), numpy_dtype(problem.dtype)), problem.dtype)
    od = to_device(out, stream=stream)
    views = kernel_views(problem, qd, kd, vd, od)
    for _ in range(max(1, warmup)):
        launch(*views, stream)
    stream.synchronize()
    wrong = output_problem(problem, od.copy_to_host(), *host)
    if wrong:
        raise ValueError(f"phase {name!r} traced on {problem.label}: wrong output ({wrong}); no timeline")
    launch(*views, stream)  # the call read: every item's row written again
    stream.synchronize()
    p = launch.params
    Br = 64 * p["warpgroups"]
    return Timeline(name, problem, dict(p), launch.timeline.copy_to_host(), p["warpgroups"],
                    _key_tiles(problem, Br, p["Bc"]))
