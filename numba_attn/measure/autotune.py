"""Measured on first use: ``attention(phase=None)`` on a problem key the tuning cache has not measured on this GPU
model times the few phases that could win for the key's shape class, once, and keeps the fastest in the tuning
cache, so later calls and later processes run it without measuring (docs/DEVELOPING.md, "Dispatch", has the rule).

**When** (:func:`numba_attn.measure.policy.choose_phase`, before the dispatch table, whose rows were timed at
earlier commits): a call about to launch (``explain()`` only says it will happen) with the measurement on —
``choose_phase(autotune=...)``, else ``$NUMBA_ATTN_AUTOTUNE``, else on with a GPU and off in the simulator (which
never times: :class:`NotTimed`); never while PyTorch captures a CUDA graph. Not for fp32, decode or a variant.

**What**: the phases of :data:`MEASURED` among the candidates, at most :data:`MAX_MEASURED`, at their defaults.

**How**: on a stand-in of the caller's shape (the batch halved until it fits; fresh buffers and stream: the
caller's arrays are never touched) each candidate is compiled, run and checked (its poisoned output finite and
equal to the float64 reference on sampled rows), then all are timed in :data:`ROUNDS` interleaved rounds (a clock
drift reaches every candidate), a sample being CUDA events around calls queued behind a sleeping kernel
(:func:`numba_attn.measure.timing.events_queued`: device time, not the host's launches). A candidate that raises
or fails the check is skipped; with none left, or on any other error, the call goes on with the rule's phase.
Two lines on stderr (or the ``numba_attn`` logger) say what is timed and what won.

**Kept**: a tuning cache entry per timed phase (``measured: "first use"``); the key's best is the earliest in
:data:`MEASURED`'s order within :data:`MARGIN` of the fastest; where the cache cannot be written, the choice holds
for this process.

Verdict (H200, 885cf78): phase=None within 1.013× of the fastest phase on issue 42's nine problems
(experiments/2026-11-28-dispatch).
"""
from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

AUTOTUNE_ENV = "NUMBA_ATTN_AUTOTUNE"
# Per shape class, the phases timed on first use in this order (the first MAX_MEASURED the candidates hold).
# ws_tma_q_early first (the Hopper rule's first from D80), then ws_tma_q, its grandparent (level with it from N4096,
# experiments/2026-11-28-q-early); ws_intra_persistent, never the rule's: 0.95-1.01x ws_intra_kv with the next item
# found in a few instructions, 0.76-0.93x ws_tma_q (H200, experiments/2026-11-28-schedule); ws_tma_q_wide (up to D64:
# three consumers on 128-key tiles) first at D64, where the two before it refuse
MEASURED = {"prefill16": ("ws_tma_q_early", "ws_tma_q", "ws_tma_q_wide", "ws_intra_qs", "ws_intra_kv", "ws_intra",
                          "ws_intra_persistent",
                          "warp_specialized_tc", "tma_wgmma", "tc_wgmma", "ws_overlap", "tc_pipelined", "tc_mma")}
# measured (and in the Hopper rule, policy.hopper_order) only above a head dim (H200,
# experiments/2026-11-28-ws-intra): ws_intra 0.82-0.94x warp_specialized_tc at D64; ws_intra_qs 0.99-1.02x ws_intra
# at D128, 1.13-1.17x tma_wgmma at D256 (its two-consumer tile needs Q out of the registers)
ABOVE_HEAD_DIM = {"ws_intra": 64, "ws_intra_kv": 64, "ws_intra_persistent": 64, "ws_tma_q": 64, "ws_tma_q_early": 64,
                  "ws_intra_qs": 128}
# measured (and in the Hopper rule) only at these head dims: ws_tma_q_wide's idea is D64's tile (three consumers)
ONLY_HEAD_DIMS = {"ws_tma_q_wide": (64,)}
MAX_MEASURED = 4
WARMUP = 1  # calls of each candidate before any is timed (it compiles; its output is checked)
ROUNDS = 5  # interleaved rounds: each round times every candidate once, in an order rotated per round
BATCH_MS = 5.0  # the least device time of one sample (short calls are timed several in a row)
MAX_CALLS = 100  # calls of one sample at most
METHOD = (f"first use: CUDA events around calls queued behind a sleeping kernel (device time, not the host's "
          f"launches), >= {BATCH_MS:g} ms a sample, the median of {ROUNDS} interleaved rounds")
FREE_SHARE = 0.8  # the stand-in's four arrays fit in this share of the free device memory
RANDOM_BLOCK = 1 << 20  # elements drawn per input; the rest repeats them (the draw's time independent of size)
CHECKED_ROWS = 6  # query rows per checked head, first and last among them
# a candidate later in MEASURED's order is kept only when it beats every earlier one by more than this share: two
# first-use timings within it do not order the phases (H200, 813f9cc: ws_tma_q 0.9197 against ws_tma_q_early 0.9235
# ms on first use at B2 H16 N8192 D128 causal, 0.9229 against 0.8898 in the interleaved CUPTI rounds that followed)
MARGIN = 0.02

_LOCK = threading.Lock()
_CHOSEN: dict = {}  # cache key → (phase name, why): chosen in this process (also when the cache was not written)
_FAILED: set = set()  # cache keys whose measurement chose nothing in this process: not measured again
_LOG = logging.getLogger("numba_attn")


def above_head_dim(name: str, head_dim: int) -> bool:
    """Whether ``name`` is measured on first use (and is in the Hopper rule) at ``head_dim``: above its
    :data:`ABOVE_HEAD_DIM`, at one of its :data:`ONLY_HEAD_DIMS`."""
    return head_dim > ABOVE_HEAD_DIM.get(name, 0) and head_dim in ONLY_HEAD_DIMS.get(name, (head_dim,))


class NotTimed(RuntimeError):
    """The simulator times nothing."""


def enabled(flag=None) -> bool:
    """Whether ``phase=None`` may measure on first use: ``flag`` when True or False, else
    ``$NUMBA_ATTN_AUTOTUNE`` (``0``/``off`` or ``1``/``on``), else on with a GPU and off in the simulator."""
    if flag is not None:
        return bool(flag)
    env = os.environ.get(AUTOTUNE_ENV, "").strip().lower()
    if env in ("0", "off", "false", "no"):
        return False
    if env in ("1", "on", "true", "yes"):
        return True
    return not backend.IS_SIMULATOR


def shortlist(problem, kind: str, candidates) -> list:
    """The phases measured on first use for ``problem`` (see the module docstring); empty when fewer than two."""
    if kind != "prefill" or problem.dtype not in ("float16", "bfloat16") or getattr(problem, "variant", None):
        return []
    names = {p.name: p for p in candidates}
    out = [names[n] for n in MEASURED["prefill16"]
           if n in names and above_head_dim(n, problem.head_dim)][:MAX_MEASURED]
    return out if len(out) > 1 else []


def log(msg: str) -> None:
    """One line to the ``numba_attn`` logger where logging is configured to show it (INFO), else to stderr."""
    if _LOG.hasHandlers() and _LOG.isEnabledFor(logging.INFO):
        _LOG.info(msg)
    else:
        print(f"numba-attn: {msg}", file=sys.stderr, flush=True)


def time_calls(fn, stream) -> float:
    """One sample, in ms per call, of ``fn(i, stream)``'s device time: its calls queued behind a sleeping kernel
    (:func:`numba_attn.measure.timing.events_queued`), as many as :data:`BATCH_MS` ms of device time takes (by
    one call's event time; at most :data:`MAX_CALLS`), so the host's launch rate never enters (a call shorter
    than its launch is timed by its kernels). The simulator times nothing (:class:`NotTimed`)."""
    if backend.IS_SIMULATOR:
        raise NotTimed("the simulator times nothing")
    from numba import cuda

    from numba_attn.measure.timing import events_queued

    e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
    e0.record(stream)
    fn(0, stream)
    e1.record(stream)
    e1.synchronize()
    one = max(cuda.event_elapsed_time(e0, e1), 1e-3)
    calls = int(max(2, min(MAX_CALLS, math.ceil(BATCH_MS / one))))
    return float(events_queued(fn, stream, calls=calls, samples=1, warmup=0)["time_ms"])


def stand_in(problem):
    """The problem timed for ``problem``: its shape as a plain :class:`~numba_attn.spec.problem.Problem`
    (no variant, no log-sum-exp), the batch halved while its q, k, v and output do not fit in
    :data:`FREE_SHARE` of the free device memory; None when even one sequence does not fit."""
    from numba_attn.measure import limits
    from numba_attn.spec.problem import Problem

    p = Problem(batch=problem.batch, heads=problem.heads, q_len=problem.q_len, kv_len=problem.kv_len,
                head_dim=problem.head_dim, causal=problem.causal, dtype=problem.dtype, scale=problem.scale,
                kv_heads=problem.kv_heads)
    free = limits.free_device_memory()
    while free is not None and p.min_bytes() > FREE_SHARE * free:
        if p.batch == 1:
            return None
        p = p.replace(batch=p.batch // 2)
    return p


def inputs(problem, seed: int = 0):
    """Host q, k, v of ``problem``: standard normal values in its dtype, :data:`RANDOM_BLOCK` of them drawn per
    array and repeated to fill it."""
    from numba_attn.spec.problem import numpy_dtype

    rng = np.random.default_rng(seed)
    dt = numpy_dtype(problem.dtype)
    shapes = [(problem.batch, problem.heads, problem.q_len, problem.head_dim)] + \
        [(problem.batch, problem.kv_heads, problem.kv_len, problem.head_dim)] * 2
    out = []
    for shape in shapes:
        block = rng.standard_normal(min(int(np.prod(shape)), RANDOM_BLOCK), dtype=np.float32).astype(dt)
        out.append(np.resize(block, shape))
    return out


def reference_rows(problem, q, k, v, b: int, h: int, rows) -> np.ndarray:
    """float64 attention of query rows ``rows`` of sequence ``b``, head ``h`` (causal bottom-right aligned)."""
    kvh = h // problem.group
    qs = q[b, h, rows].astype(np.float64)
    ks, vs = k[b, kvh].astype(np.float64), v[b, kvh].astype(np.float64)
    s = qs @ ks.T * problem.sm_scale
    if problem.causal:
        j = np.arange(problem.kv_len)[None, :]
        s = np.where(j > np.asarray(rows)[:, None] + problem.causal_offset, -np.inf, s)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ vs


def output_problem(problem, out: np.ndarray, q, k, v) -> str | None:
    """Why ``out`` (the host copy of a candidate's output, its kernel dtype) is wrong, or None: an element NaN,
    Inf or never written (the poison pattern is a NaN), or a checked row off the float64 reference."""
    from numba_attn.spec.problem import numpy_dtype
    from numba_attn.spec.reference import check

    bits = out.view(np.uint16)
    exponent = 0x7C00 if problem.dtype == "float16" else 0x7F80
    bad = int(np.count_nonzero((bits & exponent) == exponent))
    if bad:
        return f"{bad} of {bits.size} output elements NaN, Inf or never written"
    values = out.view(numpy_dtype(problem.dtype))
    n = problem.q_len
    rows = sorted({0, 1, n // 3, n // 2, max(0, n - 2), n - 1})[:CHECKED_ROWS]
    for b, h in sorted({(0, 0), (problem.batch - 1, problem.heads - 1)}):
        c = check(values[b, h, rows], reference_rows(problem, q, k, v, b, h, rows), dtype=problem.dtype)
        if not c.ok:
            return f"sequence {b} head {h}: {c.reason}"
    return None


def _simulated(fn):
    """``fn`` under the simulator's device limits (where a launch checks them), as a call runs there."""
    from numba_attn.measure import limits

    def run(*a, **kw):
        if backend.IS_SIMULATOR:
            with limits.simulated_device_limits():
                return fn(*a, **kw)
        return fn(*a, **kw)

    return run


def prepare_candidate(problem, ph, arrays, poisoned, stream):
    """``(fn, resolved params, why the output is wrong or None)`` of phase ``ph`` at its defaults on the stand-in
    ``problem``: planned, its output poisoned, run :data:`WARMUP` times (the first compiles) on ``arrays`` (host
    q, k, v and device q, k, v, o) and checked; ``fn(i, stream)`` runs it again (for :func:`time_calls`)."""
    from numba_attn.measure import limits
    from numba_attn.measure.check import kernel_views

    (q, k, v), (qd, kd, vd, od) = arrays
    with limits.simulated_device_limits():  # (as attention() plans)
        launch = ph.plan(problem)
    od.copy_to_device(poisoned, stream=stream)
    views = kernel_views(problem, qd, kd, vd, od)
    run = _simulated(launch)

    def fn(i, s=stream):
        run(*views, s)

    fn.phase = ph.name  # (for a log or a test's fake timer)
    for i in range(WARMUP):
        fn(i)
    stream.synchronize()
    return fn, dict(launch.params or ph.resolve(problem, {})), output_problem(problem, od.copy_to_host(), q, k, v)


def _capturing() -> bool:
    """Whether PyTorch (when imported) is capturing a CUDA graph on its current stream: nothing may synchronize."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001
        return False


def measure(problem, kind: str, candidates, gpu: str):
    """``(phase, why, params)`` measured on first use for ``problem`` on the GPU model ``gpu`` (see the module
    docstring), or None: nothing to measure, a measurement that chose nothing (the rule applies; such a key is
    not measured again in this process), or one that failed."""
    from numba_attn.measure.tuning_cache import TuningCache, cache_key, default_cache_path

    phases = shortlist(problem, kind, candidates)
    if not phases:
        return None
    key = cache_key(gpu, problem)
    names = {p.name: p for p in phases}
    if key in _FAILED:
        return None
    with _LOCK:
        if key in _CHOSEN and _CHOSEN[key][0] in names:
            name, why = _CHOSEN[key]
            return names[name], why, {}
        path = default_cache_path()
        try:
            done = [(TuningCache(path).lookup(gpu, problem, p.name) or {}, p) for p in phases]
        except (OSError, ValueError):
            done = []
        timed = [(e["time_ms"], p.name) for e, p in done if isinstance(e.get("time_ms"), (int, float))]
        if timed:  # measured before (for another candidate set, e.g. a log-sum-exp call's): not measured again
            cached = {n: t for t, n in timed}
            name = earliest_within_margin(cached, list(names))
            return names[name], (f"measured before (cache {path}: {name} {cached[name]:.4g} ms, the earliest within "
                                 f"{MARGIN:.0%} of the fastest timed here)"), {}
        if _capturing():
            return None
        try:
            got = _measure(problem, phases, gpu, key, path)
        except NotTimed:
            return None
        except Exception as exc:  # noqa: BLE001 - the caller's call goes on with the rule's phase
            log(f"measuring phase=None for {problem.label} failed ({type(exc).__name__}: {_first_line(exc)}); "
                f"the rule's phase runs")
            got = None
        if got is None:
            _FAILED.add(key)
            return None
        _CHOSEN[key] = (got[0].name, got[1])
        return got


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def _measure(problem, phases, gpu: str, key: str, path: str):
    from numba import cuda

    from numba_attn.measure.check import to_device
    from numba_attn.measure.tuning_cache import TuningCache
    from numba_attn.spec.problem import numpy_dtype
    from numba_attn.spec.reference import poison

    p = stand_in(problem)
    if p is None:
        log(f"phase=None for {problem.label}: too little free device memory to measure on first use; "
            f"the rule's phase runs")
        return None
    t0 = time.perf_counter()
    shown = p.label + (f" (the batch of {problem.label} halved to fit)" if p.batch != problem.batch else "")
    log(f"phase=None on {gpu}: timing {', '.join(ph.name for ph in phases)} on {shown}, once for this key "
        f"(compiles take seconds; {AUTOTUNE_ENV}=0 turns this off)")
    stream = cuda.stream()
    host = inputs(p)
    device = [to_device(a, stream=stream) for a in host]
    out = poison(np.empty(p.out_shape(), numpy_dtype(p.dtype)), p.dtype)
    device.append(to_device(out, stream=stream))
    poisoned = out.view(np.uint16) if p.dtype == "bfloat16" else out
    ready, resolved, skipped = {}, {}, []
    for ph in phases:  # each compiled, run and checked on the stand-in before any is timed
        try:
            fn, params, wrong = prepare_candidate(p, ph, (host, device), poisoned, stream)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is skipped
            skipped.append(f"{ph.name}: {type(exc).__name__}: {_first_line(exc)}")
            continue
        if wrong:
            skipped.append(f"{ph.name}: {wrong}")
        else:
            ready[ph.name], resolved[ph.name] = fn, params
    samples = {n: [] for n in ready}
    order = list(ready)
    for r in range(ROUNDS if len(order) > 1 else 0):  # interleaved: a drift of the clocks reaches every candidate
        for name in order[r % len(order):] + order[:r % len(order)]:
            if name in ready:
                try:
                    ms = time_calls(ready[name], stream)
                except NotTimed:
                    raise
                except Exception as exc:  # noqa: BLE001
                    skipped.append(f"{name}: {type(exc).__name__}: {_first_line(exc)}")
                    del ready[name]
                    continue
                if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
                    skipped.append(f"{name}: no time ({ms!r})")
                    del ready[name]
                else:
                    samples[name].append(float(ms))
    times = {n: float(np.median(samples[n])) for n in ready if samples[n]}
    took = time.perf_counter() - t0
    skip_text = f"; skipped: {'; '.join(skipped)}" if skipped else ""
    if not times:
        log(f"phase=None for {p.label}: no phase measured ({took:.1f} s){skip_text}; the rule's phase runs")
        return None
    best = earliest_within_margin(times, [ph.name for ph in phases])
    others = ", ".join(f"{n} {t:.4g} ms" for n, t in sorted(times.items(), key=lambda x: x[1]))
    stamp = time.time()
    entries = [(key, n, {"params": {}, "resolved": resolved[n], "time_ms": t, "results": None, "commit": None,
                         "run_id": None, "label": p.label, "measured": "first use", "method": METHOD,
                         "of": len(times), "rule": f"least time of {len(times)} on first use: {others}{skip_text}",
                         "updated": stamp}, n == best) for n, t in times.items()]
    where = f"cache {path}"
    try:
        TuningCache(path).update(entries, best=best)
    except (OSError, ValueError) as exc:
        where = f"not kept: the cache {path} could not be written ({_first_line(exc)}), chosen for this process"
    log(f"phase=None on {gpu} for this key: {best} ({others}; {took:.1f} s){skip_text}; {where}")
    names = {ph.name: ph for ph in phases}
    return names[best], (f"measured on first use ({where}: {best} {times[best]:.4g} ms on {p.label}, the earliest "
                         f"within {MARGIN:.0%} of the fastest of {others}{skip_text}; {METHOD})"), {}


def earliest_within_margin(times: dict, order: list) -> str:
    """The first phase of ``order`` whose time is within :data:`MARGIN` of the least of ``times``."""
    least = min(times.values())
    return next(n for n in order if n in times and times[n] <= least * (1 + MARGIN))
