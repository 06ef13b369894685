"""Timing on the GPU, with the host's launch cost kept out of the kernel time.

Method (``events_batched``): after warm-up launches, each sample is one pair
of CUDA events recorded around ``inner`` back-to-back launches on one stream;
the sample is the elapsed time divided by ``inner``. ``inner`` is chosen so
that a batch lasts at least ``batch_ms``. While the kernel runs longer than
the host needs to enqueue the next launch (numba: ~25 µs per launch), the
queue never drains and the GPU runs the launches back to back, so the host's
cost is hidden; the per-launch host cost is measured separately and a sample
is flagged ``launch_bound`` when the GPU time is not clearly above it.
Samples are repeated until ``min_reps`` samples and ``budget_s`` seconds, at
most ``max_reps``; the median is reported with min and max.

Inputs are rotated between launches (``fn(i)`` receives the launch index) so
that problems smaller than the L2 cache are not timed from the cache.

``end_to_end`` times one Python call plus a synchronize on the host clock: what
a caller of ``attention()`` waits, launch overhead included.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass


@dataclass
class TimingConfig:
    warmup: int = 3
    min_reps: int = 10
    max_reps: int = 200
    budget_s: float = 2.0
    batch_ms: float = 20.0
    max_inner: int = 500


def events_batched(fn, stream, cfg: TimingConfig | None = None) -> dict:
    """Time ``fn(i)`` (enqueues one launch on ``stream``) with CUDA events."""
    from numba import cuda

    cfg = cfg or TimingConfig()
    n = 0
    for _ in range(cfg.warmup):
        fn(n)
        n += 1
    stream.synchronize()
    e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
    # one launch, to size the batches
    e0.record(stream)
    fn(n)
    n += 1
    e1.record(stream)
    e1.synchronize()
    single_ms = cuda.event_elapsed_time(e0, e1)
    inner = int(max(1, min(cfg.max_inner, math.ceil(cfg.batch_ms / max(single_ms, 1e-3)))))
    samples, host = [], []
    t_start = time.perf_counter()
    while len(samples) < cfg.max_reps and (len(samples) < cfg.min_reps
                                           or time.perf_counter() - t_start < cfg.budget_s):
        e0.record(stream)
        h0 = time.perf_counter()
        for _ in range(inner):
            fn(n)
            n += 1
        h1 = time.perf_counter()
        e1.record(stream)
        e1.synchronize()
        samples.append(cuda.event_elapsed_time(e0, e1) / inner)
        host.append((h1 - h0) / inner * 1e3)
    med = statistics.median(samples)
    host_ms = statistics.median(host)
    return {
        "method": "events_batched",
        "time_ms": med,
        "time_min_ms": min(samples),
        "time_max_ms": max(samples),
        "spread": (max(samples) - min(samples)) / med if med > 0 else float("inf"),
        "reps": len(samples),
        "inner": inner,
        "host_launch_us": host_ms * 1e3,
        "launch_bound": host_ms >= 0.8 * med,
    }


def end_to_end(fn, stream, reps: int = 10) -> float:
    """Median wall time (ms) of one call plus synchronize, launch cost included."""
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        stream.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
