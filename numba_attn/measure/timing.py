"""Timing on the GPU, with the host's launch cost kept out of the kernel time.

Two independent methods, compared once per run by the runner:

``events_batched`` (the method every row uses)
    After warm-up launches, each sample is one pair of CUDA events recorded
    around ``inner`` back-to-back launches on one stream; the sample is the
    elapsed time divided by ``inner``. ``inner`` is chosen so that a batch lasts
    at least ``batch_ms``. While the kernel runs longer than the host needs to
    enqueue the next launch (numba: ~25 µs per launch), the queue never drains
    and the GPU runs the launches back to back, so the host's cost is hidden;
    the per-launch host cost is measured separately and a sample is flagged
    ``launch_bound`` when the GPU time is not clearly above it.

``graph_replay`` (the cross-check)
    The same launches are captured once into a CUDA graph (numba-cuda accepts a
    ``cuda.core`` ``GraphBuilder`` as the launch stream) and the graph is
    replayed between two events. A replay has no Python in it, so it also shows
    how much of an events time is launch gaps. When capture is impossible
    (a phase that synchronizes or allocates inside its launch function), the
    fallback is ``host_clock``: many launches and one synchronize, timed on the
    host clock; the result says which method ran.

Samples are repeated until ``min_reps`` samples and then until the spread of
the samples is below ``target_spread`` or ``budget_s`` seconds are used, at
most ``max_reps``; the median is reported with min and max.

Inputs are rotated between launches (``fn(i)`` receives the launch index) so
that problems smaller than the L2 cache are not timed from the cache.

``end_to_end`` times one Python call plus a synchronize on the host clock: what
a caller of ``attention()`` waits, launch overhead included.

``time_launch`` is how a checked launch of a phase is timed: rotated input copies, events,
end to end, the optional cross-check, graph replay for launch-bound rows, and the outputs
of the timed launches checked again.
"""
from __future__ import annotations

import inspect
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import poison


@dataclass
class TimingConfig:
    warmup: int = 3
    min_reps: int = 10
    max_reps: int = 200
    budget_s: float = 2.0
    batch_ms: float = 20.0
    max_inner: int = 500
    target_spread: float = 0.02  # stop early once (p90 − p10)/median of the samples is below this


def _call(fn, i, stream):
    """``fn(i)`` or ``fn(i, stream)``: launch functions may take the stream to launch on."""
    if _arity(fn) >= 2:
        return fn(i, stream)
    return fn(i)


def _arity(fn) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 1


def _quantile(xs, q):
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def robust_spread(samples) -> float:
    """(p90 − p10) / median: the spread used to stop repeating (ignores one outlier)."""
    med = statistics.median(samples)
    if not med > 0:
        return float("inf")
    return (_quantile(samples, 0.9) - _quantile(samples, 0.1)) / med


def _enough(samples, t_start, cfg: TimingConfig) -> bool:
    n = len(samples)
    if n >= cfg.max_reps:
        return True
    if n < cfg.min_reps:
        return False
    if time.perf_counter() - t_start >= cfg.budget_s:
        return True
    return robust_spread(samples) < cfg.target_spread


def _summary(method, samples, **extra) -> dict:
    med = statistics.median(samples)
    return {
        "method": method,
        "time_ms": med,
        "time_min_ms": min(samples),
        "time_max_ms": max(samples),
        "spread": (max(samples) - min(samples)) / med if med > 0 else float("inf"),
        "spread_p10_p90": robust_spread(samples),
        "reps": len(samples),
        **extra,
    }


def events_batched(fn, stream, cfg: TimingConfig | None = None) -> dict:
    """Time ``fn(i)`` (or ``fn(i, stream)``; enqueues one launch on ``stream``) with CUDA events."""
    from numba import cuda

    cfg = cfg or TimingConfig()
    n = 0
    for _ in range(cfg.warmup):
        _call(fn, n, stream)
        n += 1
    stream.synchronize()
    e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
    # one launch, to size the batches
    e0.record(stream)
    _call(fn, n, stream)
    n += 1
    e1.record(stream)
    e1.synchronize()
    single_ms = cuda.event_elapsed_time(e0, e1)
    inner = int(max(1, min(cfg.max_inner, math.ceil(cfg.batch_ms / max(single_ms, 1e-3)))))
    samples, host = [], []
    t_start = time.perf_counter()
    while not _enough(samples, t_start, cfg):
        e0.record(stream)
        h0 = time.perf_counter()
        for _ in range(inner):
            _call(fn, n, stream)
            n += 1
        h1 = time.perf_counter()
        e1.record(stream)
        e1.synchronize()
        samples.append(cuda.event_elapsed_time(e0, e1) / inner)
        host.append((h1 - h0) / inner * 1e3)
    host_ms = statistics.median(host)
    out = _summary("events_batched", samples, inner=inner, host_launch_us=host_ms * 1e3)
    out["launch_bound"] = host_ms >= 0.8 * out["time_ms"]
    return out


def graph_replay(fn, stream, cfg: TimingConfig | None = None, launches_per_graph: int | None = None) -> dict:
    """Capture ``launches_per_graph`` calls of ``fn(i, s)`` into one CUDA graph and
    time its replays with events. ``fn`` must launch on the stream it is given.

    Raises when capture fails (the caller falls back to :func:`host_clock`).
    """
    from numba import cuda

    try:
        from cuda.core import Stream as CoreStream
    except ImportError:  # pragma: no cover - cuda.core is a numba-cuda dependency
        from cuda.core.experimental import Stream as CoreStream

    cfg = cfg or TimingConfig()
    if _arity(fn) < 2:
        raise TypeError("graph capture needs fn(i, stream)")
    # size the graph like an events batch
    probe = events_batched(fn, stream, TimingConfig(warmup=1, min_reps=1, max_reps=1, budget_s=0,
                                                    batch_ms=cfg.batch_ms, max_inner=cfg.max_inner))
    inner = launches_per_graph or probe["inner"]
    handle = stream.handle.value if hasattr(stream.handle, "value") else int(stream.handle)
    core = CoreStream.from_handle(int(handle or 0))
    gb = core.create_graph_builder()
    gb.begin_building("thread_local")
    try:
        for i in range(inner):
            fn(i, gb)
    finally:
        gb.end_building()
    graph = gb.complete()
    try:
        graph.upload(core)
        e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
        for _ in range(max(1, cfg.warmup)):
            graph.launch(core)
        stream.synchronize()
        samples = []
        t_start = time.perf_counter()
        while not _enough(samples, t_start, cfg):
            e0.record(stream)
            graph.launch(core)
            e1.record(stream)
            e1.synchronize()
            samples.append(cuda.event_elapsed_time(e0, e1) / inner)
    finally:
        graph.close()
        gb.close()
    return _summary("graph_replay", samples, inner=inner)


def host_clock(fn, stream, cfg: TimingConfig | None = None) -> dict:
    """Fallback second method: ``inner`` launches then one synchronize, on the host
    clock (includes launch gaps when the kernel is shorter than a launch)."""
    cfg = cfg or TimingConfig()
    for i in range(cfg.warmup):
        _call(fn, i, stream)
    stream.synchronize()
    t0 = time.perf_counter()
    _call(fn, 0, stream)
    stream.synchronize()
    single_ms = (time.perf_counter() - t0) * 1e3
    inner = int(max(1, min(cfg.max_inner, math.ceil(cfg.batch_ms / max(single_ms, 1e-3)))))
    samples = []
    t_start = time.perf_counter()
    while not _enough(samples, t_start, cfg):
        t0 = time.perf_counter()
        for i in range(inner):
            _call(fn, i, stream)
        stream.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / inner)
    return _summary("host_clock", samples, inner=inner)


def second_method(fn, stream, cfg: TimingConfig | None = None) -> dict:
    """Graph replay, or the host clock (with the capture error) when capture fails."""
    try:
        return graph_replay(fn, stream, cfg)
    except Exception as exc:  # noqa: BLE001 - the fallback says why
        stream.synchronize()
        out = host_clock(fn, stream, cfg)
        out["graph_error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        return out


def compare_methods(events: dict, other: dict) -> dict:
    """How far two timings of the same launches disagree, against their spreads.

    ``disagree`` is True when the medians differ by more than the larger of the
    two min–max spreads (and 2 %): more than the run-to-run noise explains.
    """
    e, g = events["time_ms"], other["time_ms"]
    rel = (g - e) / e if e > 0 else float("inf")
    tol = max(events.get("spread", 0.0), other.get("spread", 0.0), 0.02)
    out = {"events_ms": e, "second_ms": g, "second_method": other.get("method"),
           "rel_diff": rel, "tolerance": tol, "disagree": abs(rel) > tol}
    if other.get("graph_error"):
        out["graph_error"] = other["graph_error"]
    if out["disagree"]:
        why = ""
        if other.get("method") == "graph_replay" and rel < 0 and events.get("launch_bound"):
            why = " (launch-bound: graph replay has no launch gaps, events time the launch rate)"
        out["warning"] = (f"timing methods disagree: events {e * 1e3:.2f} µs vs {other.get('method')} "
                          f"{g * 1e3:.2f} µs ({rel:+.1%}, spread {tol:.1%}){why}")
    return out


def end_to_end(fn, stream, reps: int = 10, budget_s: float = 1.0) -> float:
    """Median wall time (ms) of one call plus synchronize, launch cost included
    (at least 3 calls; fewer than ``reps`` when they would exceed ``budget_s``)."""
    times = []
    t_start = time.perf_counter()
    for i in range(reps):
        if i >= 3 and time.perf_counter() - t_start > budget_s:
            break
        t0 = time.perf_counter()
        _call(fn, i, stream)
        stream.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# -- a launch of a phase -----------------------------------------------------------


def l2_bytes() -> int:
    """The device's L2 cache size (60 MiB when it cannot be read)."""
    try:
        from numba import cuda

        return int(cuda.get_current_device().L2_CACHE_SIZE)
    except Exception:  # noqa: BLE001
        return 60 * 2**20


def time_launch(launch, problem: Problem, device_arrays, stream, cfg: TimingConfig, *, compare: bool,
                seed: int, precision=None) -> dict:
    """Time a checked ``launch`` on ``device_arrays`` = (q, k, v, o), the inputs of ``seed``.

    Input sets are rotated (copies on the device, enough to exceed 3x the L2 cache, at most 8)
    so small problems are not timed from the cache; ``events_batched`` times every row, with
    ``end_to_end`` beside it; ``compare`` adds the second method's cross-check
    (``timing_check``). A launch-bound row is timed by graph replay when capture works (the
    events time kept as ``events_ms``). The first and last input sets' outputs are checked
    again (``post_timing_check`` says what went wrong)."""
    from numba import cuda

    # imported here: this module is imported (for TimingConfig) before the backend is chosen
    from numba_attn.measure.check import kernel_views, recheck_outputs

    qd, kd, vd, od = device_arrays
    sets = [kernel_views(problem, qd, kd, vd, od)]
    l2 = l2_bytes()
    n_sets = int(min(8, max(1, math.ceil(3 * l2 / max(problem.min_bytes(), 1)))))
    poisoned = poison(np.empty(problem.out_shape(), qd.dtype), problem.dtype)
    for _ in range(n_sets - 1):
        new = [cuda.device_array_like(a, stream=stream) for a in (qd, kd, vd)]
        for src, dst in zip((qd, kd, vd), new):
            dst.copy_to_device(src, stream=stream)
        new.append(cuda.to_device(poisoned, stream=stream))
        sets.append(kernel_views(problem, *new))

    def fn(i, s=stream):
        launch(*sets[i % len(sets)], s)

    t = events_batched(fn, stream, cfg)
    t["e2e_ms"] = end_to_end(fn, stream)
    t["input_sets"] = len(sets)
    t["l2_bytes"] = l2
    if compare:
        other = second_method(fn, stream, cfg)
        t["timing_check"] = compare_methods(t, other)
    if t.get("launch_bound"):
        # events then time the host's launch rate, not the kernel: a graph replay
        # has no Python between launches, so its time is the kernel's. The row
        # keeps the events time and the flag; if capture fails the events time stays.
        g = (other if compare and other.get("method") == "graph_replay"
             else second_method(fn, stream, cfg))
        if g.get("method") == "graph_replay":
            t["events_ms"] = t["time_ms"]
            for key in ("method", "time_ms", "time_min_ms", "time_max_ms", "spread", "spread_p10_p90", "reps",
                        "inner"):
                if key in g:
                    t[key] = g[key]
        else:
            t["graph_error"] = g.get("graph_error", "")
    # the timed launches must still compute the right answer: re-check the
    # first set and the last (whose output started poisoned)
    bad = recheck_outputs(problem, seed, [(idx, sets[idx][3]) for idx in sorted({0, len(sets) - 1})],
                          precision, stream)
    if bad:
        t["post_timing_check"] = bad
    return t
