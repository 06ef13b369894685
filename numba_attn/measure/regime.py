"""Phases and peers of one problem timed in one regime: interleaved rounds.

Why. A power-capped GPU runs a kernel faster in a burst after idle than sustained (an H200 at 690 W: SDPA cuDNN
0.413 ms against 0.475 ms at B1 H32 N4096 D128 fp16), so a ratio means something only when both sides ran in the
same regime. Timed one after the other, each row got the regime its place in the run gave it: the first
CUPTI-timed row of a process (always a phase: a problem's phases come before its peers) waits seconds for CUPTI
to start before its profiled calls, so its calls ran on a rested GPU, while every later row's profiled calls
follow its own second of back-to-back events launches, at the power cap (docs/results.md, "How a row is timed").

What. The sweep measures a problem's rows as before (check, standalone timing, kernel names, end to end) with
``RunConfig.hold``: :func:`offer`, called by :func:`~numba_attn.measure.timing.timed`, keeps each row's timed
function (and the context its calls need: the SDPA backend, grad mode) in the measuring process. Then
:func:`run_held_rounds` times them all again in ``rounds`` rounds: round r calls every implementation once, in
an order rotated per round (:func:`rotated_orders`), each with the same warm-up (``TimingConfig.warmup``), the
same number of calls (:func:`calls_for`) and the same method (CUPTI kernel time under ``--timing cupti``, else
one events batch), with NVML's clock, power and temperature sampled before and after
(:mod:`numba_attn.measure.nvml`). A row's ``time_ms`` becomes the median over its rounds (:func:`apply_rounds`;
``time_min_ms``/``time_max_ms``/``spread`` over the rounds, the standalone figures kept in ``standalone``), so no
side systematically gets the cooler GPU. Rows that cannot be held (graph-replay or launch-bound times, calls
over :data:`MAX_HOLD_MS`, little device memory left) are timed alone and say why (``regime_note``).
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from dataclasses import dataclass

from numba_attn.measure import nvml, timing

DEFAULT_ROUNDS = 5
MAX_HOLD_MS = 100.0  # a call slower than this is timed alone: its rounds would take too long
MIN_CALLS, MAX_CALLS = 3, 50  # calls per implementation and round: enough for the batch time, within these
MIN_FREE_FRACTION = 0.15  # a row is held only while this much of the device memory stays free
STANDALONE_KEYS = ("time_ms", "time_min_ms", "time_max_ms", "spread", "spread_p10_p90", "reps") \
    + nvml.NVML_FIELDS + ("nvml_note",)


def key_of(kind: str, name: str) -> str:
    return f"{kind}:{name}"


@dataclass
class Held:
    """A row's timed function, kept for the rounds: ``fn(i)`` or ``fn(i, stream)``, the stream it launches on,
    ``context()`` (a context manager its calls need, or None), its standalone time and method."""

    fn: object
    stream: object
    context: object
    time_ms: float
    method: str


class _Store:
    """This process's held functions: those of one problem at a time."""

    def __init__(self):
        self.held: dict = {}  # key → Held
        self.outcome: dict = {}  # key → True (held) or why not
        self.problem = None
        self.scope = None  # the key of the row being measured with hold on

    def release(self):
        self.held.clear()
        self.outcome.clear()
        self.problem = None


STORE = _Store()


@contextlib.contextmanager
def holding(kind: str, name: str, problem_dict: dict, hold: bool):
    """The scope of one row's measurement: with ``hold``, the function its :func:`timed` call times is kept
    (:func:`offer`); a row of another problem first releases the previous problem's functions."""
    if not hold:
        yield
        return
    pkey = json.dumps(problem_dict, sort_keys=True, default=str)
    if STORE.problem != pkey:
        STORE.release()
        STORE.problem = pkey
    STORE.scope = key_of(kind, name)
    STORE.outcome.pop(STORE.scope, None)
    try:
        yield
    finally:
        STORE.scope = None


def outcome(kind: str, name: str):
    """True when the row's function is held, else why not (None: the row was never timed)."""
    return STORE.outcome.get(key_of(kind, name))


def _free_fraction() -> float | None:
    try:
        from numba import cuda

        free, total = cuda.current_context().get_memory_info()
        return free / total if total else None
    except Exception:  # noqa: BLE001
        return None


def hold_refusal(timing_cfg, t: dict, free_fraction=None) -> str | None:
    """Why a row timed as ``t`` is not held for the rounds (it is then timed alone), or None."""
    method = getattr(timing_cfg, "method", "events") or "events"
    if method == "graph":
        return "graph replay is timed alone (interleaved rounds time by events or CUPTI)"
    want = "cupti" if method == "cupti" else "events_batched"
    ran = t.get("time_method")
    if ran != want or t.get("time_ms") is None:
        return f"its time is {ran}'s, not {want}'s (a launch-bound or failed timing): timed alone"
    if t["time_ms"] > MAX_HOLD_MS:
        return f"{t['time_ms']:.0f} ms a call (over {MAX_HOLD_MS:g} ms): rounds would take too long; timed alone"
    frac = (free_fraction or _free_fraction)()
    if frac is not None and frac < MIN_FREE_FRACTION:
        return f"{frac:.0%} of the device memory free: its inputs are not kept for the rounds; timed alone"
    return None


def offer(fn, stream, timing_cfg, t: dict, context=None):
    """Keep ``fn`` for the rounds when a row is measured inside :func:`holding` (else nothing)."""
    k = STORE.scope
    if k is None:
        return
    why = hold_refusal(timing_cfg, t)
    if why:
        STORE.held.pop(k, None)
        STORE.outcome[k] = why
        return
    STORE.held[k] = Held(fn, stream, context, float(t["time_ms"]), t["time_method"])
    STORE.outcome[k] = True


timing.ROW_HOOKS.append(offer)  # timing.timed() tells it of every row (timing imports nothing of this module)


# -- the rounds (pure: the segment is a function) ---------------------------------------------------------


def rotated_orders(keys, rounds: int) -> list[list]:
    """Round r's order: ``keys`` rotated by r steps (by about n/rounds keys a step when there are more keys than
    rounds), so that no implementation always comes first or always follows the same one."""
    keys = list(keys)
    n = len(keys)
    if n == 0:
        return [[] for _ in range(rounds)]
    step = max(1, round(n / rounds)) if rounds < n else 1
    return [keys[(r * step) % n:] + keys[:(r * step) % n] for r in range(rounds)]


def calls_for(times_ms, batch_ms: float) -> int:
    """The calls per implementation and round, the same for all: enough for ``batch_ms`` at the median time,
    within [MIN_CALLS, MAX_CALLS]."""
    med = statistics.median(times_ms) if times_ms else 1.0
    return int(min(MAX_CALLS, max(MIN_CALLS, math.ceil(batch_ms / max(med, 1e-6)))))


def interleaved_rounds(keys, segment, rounds: int) -> dict:
    """Call ``segment(key)`` (a dict with ``time_ms``, optionally ``start``/``end`` NVML samples) for every key
    in every round, in :func:`rotated_orders`; a key whose segment raises is dropped from the later rounds.
    Returns ``orders``, ``segments`` (key → its segments, each with ``round`` and ``position``) and
    ``failed`` (key → why)."""
    orders = rotated_orders(keys, rounds)
    segs: dict = {k: [] for k in keys}
    failed: dict = {}
    for r, order in enumerate(orders):
        for pos, k in enumerate(order):
            if k in failed:
                continue
            try:
                res = dict(segment(k))
            except Exception as exc:  # noqa: BLE001 - the row keeps its standalone time and says why
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                failed[k] = f"round {r}: {type(exc).__name__}: {msg}"[:300]
                continue
            res.update(round=r, position=pos)
            segs[k].append(res)
    return {"orders": orders, "segments": segs, "failed": failed}


def summarize(segments) -> dict:
    """One implementation's rounds: the median of its round times is its time; min, max and spread over the
    rounds; its times and positions per round; NVML's readings, the mean over the rounds."""
    from numba_attn.measure.samples import robust_spread

    times = [s["time_ms"] for s in segments]
    med = statistics.median(times)
    out = {"time_ms": med, "time_min_ms": min(times), "time_max_ms": max(times),
           "spread": (max(times) - min(times)) / med if med > 0 else float("inf"),
           "spread_p10_p90": robust_spread(times), "reps": len(times),
           "regime_times_ms": times, "regime_positions": [s["position"] for s in segments]}
    out.update(nvml.row_fields([(s.get("start"), s.get("end")) for s in segments]))
    return out


# -- on the GPU -------------------------------------------------------------------------------------------


def segment_config(warmup: int, calls: int):
    """A TimingConfig for one segment: ``warmup`` calls, then exactly ``calls`` calls in one sample."""
    from numba_attn.measure.samples import TimingConfig

    return TimingConfig(warmup=warmup, min_reps=1, max_reps=1, budget_s=0.0, batch_ms=1e12, max_inner=calls,
                        target_spread=0.0)


def time_segment(held: Held, method: str, warmup: int, calls: int, mon=None) -> dict:
    """One implementation's turn in a round: its context entered, NVML read, ``warmup`` calls, ``calls`` timed
    calls (CUPTI kernel time, or one events batch), NVML read again."""
    from numba_attn.measure.cupti import cupti_kernel_time

    mon = mon or nvml.monitor()
    with held.context() if held.context is not None else contextlib.nullcontext():
        start = mon.sample()
        if method == "cupti":
            r = cupti_kernel_time(held.fn, held.stream, segment_config(warmup, calls), calls=calls)
        else:
            r = timing.events_batched(held.fn, held.stream, segment_config(warmup, calls))
        end = mon.sample()
    return {"time_ms": r["time_ms"], "start": start, "end": end}


def warm_profiler():
    """One empty profiler session: a process's first starts CUPTI (seconds, the GPU idle), which must not fall
    before one implementation's calls only."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):
        torch.cuda.synchronize()


def run_held_rounds(keys, timing_cfg, rounds: int = DEFAULT_ROUNDS, segment=None) -> dict:
    """The rounds over the held functions of ``keys`` (in this process), then every held function released.
    Returns ``results`` (key → :func:`summarize`), ``left_out`` (key → why it was not in the rounds) and the
    rounds' ``orders``, ``calls``, ``warmup``, ``rounds``, ``method`` and ``wall_s``."""
    t0 = time.perf_counter()
    try:
        entries = {k: STORE.held[k] for k in keys if k in STORE.held}
        left_out = {}
        for k in keys:
            if k not in entries:
                why = STORE.outcome.get(k)
                left_out[k] = why if isinstance(why, str) else "not held in the measuring process (not timed, " \
                                                                "or its worker was replaced)"
        method = "cupti" if getattr(timing_cfg, "method", "events") == "cupti" else "events"
        warmup = int(timing_cfg.warmup)
        calls = calls_for([e.time_ms for e in entries.values()], timing_cfg.batch_ms)
        meta = {"type": "rounds", "rounds": int(rounds), "calls": calls, "warmup": warmup, "method": method,
                "group": list(keys)}
        if len(entries) < 2:
            for k in entries:
                left_out[k] = "the only implementation of its problem held for the rounds: timed alone"
            return {**meta, "results": {}, "left_out": left_out, "orders": [], "wall_s": time.perf_counter() - t0}
        if segment is None:
            if method == "cupti":
                warm_profiler()
            mon = nvml.monitor()

            def segment(k):
                return time_segment(entries[k], method, warmup, calls, mon)

        out = interleaved_rounds(list(entries), segment, int(rounds))
        left_out.update(out["failed"])
        results = {k: summarize(s) for k, s in out["segments"].items() if s and k not in out["failed"]}
        return {**meta, "results": results, "left_out": left_out, "orders": out["orders"],
                "wall_s": time.perf_counter() - t0}
    finally:
        STORE.release()


# -- the rows (in the sweep) ------------------------------------------------------------------------------


class _Work:
    """What a row is credited with (its ``flops`` and ``min_bytes`` fields), for the throughput."""

    def __init__(self, row):
        self.row = row

    def flops(self):
        return self.row.get("flops") or 0

    def min_bytes(self):
        return self.row.get("min_bytes") or 0


def apply_rounds(row: dict, result: dict, meta: dict) -> dict:
    """``row`` timed by the rounds: its standalone figures moved to ``standalone``, the rounds' in their place,
    the throughput recomputed (FAIL when the time cannot be right), the regime recorded."""
    from numba_attn.measure.row_figures import add_throughput, implausible_reason
    from numba_attn.measure.status import FAIL

    row["standalone"] = {k: row.pop(k) for k in STANDALONE_KEYS if k in row}
    row.update(result)
    row.update(regime="interleaved", regime_rounds=meta["rounds"], regime_calls=meta["calls"],
               regime_warmup=meta["warmup"], regime_method=meta["method"], regime_group=meta["group"])
    work = _Work(row)
    add_throughput(row, work)
    reason = implausible_reason(row, work)
    if reason:
        row.update(status=FAIL, reason=reason)
    return row


def other_regime(row: dict, wanted: str) -> bool:
    """Whether a timed row of a results file was timed the other way than ``wanted`` (``--resume`` then measures
    it again): an interleaved row for a standalone run, a row timed alone by ``--regime standalone`` (or before
    there were regimes) for an interleaved one."""
    if row.get("time_ms") is None or row.get("type") != "result":
        return False
    if wanted == "standalone":
        return row.get("regime") == "interleaved"
    return row.get("regime") is None or "--regime standalone" in (row.get("regime_note") or "")


def mark_alone(row: dict, note: str) -> dict:
    """A timed row that was not in interleaved rounds: ``regime`` standalone and why."""
    if row.get("time_ms") is not None and "regime" not in row:
        row["regime"] = "standalone"
        row["regime_note"] = note
    return row
