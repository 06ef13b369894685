"""What every timing method shares: :class:`TimingConfig`, how a launch function is called, the warm-up,
when to stop repeating samples (:func:`enough_samples`) and the summary of a series (:func:`timing_summary`).
The methods themselves: :mod:`numba_attn.measure.timing` (events, graph replay, host clock) and
:mod:`numba_attn.measure.cupti` (kernel time)."""
from __future__ import annotations

import inspect
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
    target_spread: float = 0.02  # stop early once (p90 − p10)/median of the samples is below this
    method: str = "events"  # which method gives a row's time_ms: one of TIMING_METHODS


TIMING_METHODS = ("events", "graph", "cupti")
_METHOD_NAMES = {"events": "events_batched", "graph": "graph_replay", "cupti": "cupti"}


def call_fn(fn, i, stream):
    """``fn(i)`` or ``fn(i, stream)``: launch functions may take the stream to launch on."""
    if arity(fn) >= 2:
        return fn(i, stream)
    return fn(i)


def arity(fn) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 1


def warm_up(fn, stream, cfg: TimingConfig) -> int:
    """``cfg.warmup`` calls of ``fn`` (launch indices from 0), then a synchronize; returns the next index."""
    n = 0
    for _ in range(cfg.warmup):
        call_fn(fn, n, stream)
        n += 1
    stream.synchronize()
    return n


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


def enough_samples(samples, t_start, cfg: TimingConfig) -> bool:
    n = len(samples)
    if n >= cfg.max_reps:
        return True
    if n < cfg.min_reps:
        return False
    if time.perf_counter() - t_start >= cfg.budget_s:
        return True
    return robust_spread(samples) < cfg.target_spread


def timing_summary(method, samples, **extra) -> dict:
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
