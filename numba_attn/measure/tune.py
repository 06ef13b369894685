"""Tuning: measure a phase's candidate configurations on a problem and keep the best in a cache.

``tune(phases, problems)`` takes each phase's declared parameter space
(:attr:`~numba_attn.phases.registry.Phase.space`, pruned by ``resolve`` and ``supports()`` in
:func:`~numba_attn.phases.registry.candidate_configs`), orders it by a strategy, and measures every
candidate exactly like a row of ``numba-attn run``: :meth:`Sweep.run_task
<numba_attn.measure.sweep.Sweep.run_task>` with the candidate as the phase's requested parameters,
so each one passes the correctness gate (poisoned output, float64 reference, every seed) before it
is timed, runs in a worker process with a time limit, and is streamed to the JSON-lines results
file (``plot``, ``compare`` and ``--resume`` read it like any run). A candidate that FAILs, raises
or times out is recorded and never chosen.

Strategies: ``grid`` (declaration order, the default first), ``random`` (the default first, then a
seeded shuffle), ``bayes`` (Optuna's TPE sampler through its ask-and-tell interface; optional
extra ``tune``). The budget is a number of configurations per (phase, problem) or seconds for the
whole tuning (no candidate is started after it).

Workers: ``workers`` worker processes measure candidates side by side
(:class:`~numba_attn.measure.parallel.Workers`, each driven by a thread of this process); each row
is written by the one results writer. Several local workers own one GPU each
(:class:`~numba_attn.measure.parallel.LocalPool`: ``CUDA_VISIBLE_DEVICES`` per worker); a worker
that dies is replaced and its candidate retried once. :mod:`numba_attn.measure.distributed` puts
the workers on a Ray cluster instead.

The best configuration: the OK candidate with the least ``time_ms``, where candidates within the
measurement's noise of it tie (``TIE_TOLERANCE`` or twice the larger sample spread, whichever is
larger) and a tie goes to the earliest candidate in strategy order, the default first; so the choice
does not flip between runs, or between one worker and several, on noise. The tolerance is three
standard deviations of the difference of two rows: one candidate timed twice on one H200, minutes
apart, differed by 0.7 % (standard deviation over eight candidates, -0.4 % to +1.8 %), so the
difference of two candidates' rows has a standard deviation of about 1 %. With a 1 % tolerance one
sweep chose differently with one worker and with two: a decode_mma configuration measured 0.9 % faster
than the default in one run (a tie) and 1.05 % in the other (not). At 3 % a candidate replaces the
default only when it is clearly faster. Candidates timed on several devices are not compared
directly: two GPUs of one model differ by 1-2 % on the same kernel (measured: the default and its
explicit twin 1.6 % apart on two H200s), more than that noise. So when the timed candidates of a
(phase, problem) ran on more than one device, those within ``FINAL_WINDOW`` of the fastest (at most
``FINAL_MAX``, and the earliest of them in strategy order) are timed again one after another by one
worker, on one device (a final round: rows with ``round: "final"``, kept apart from the first ones by
``--resume``), and the rule is applied to those rows. With the grid and random strategies every
(phase, problem)'s candidates go through the workers as one stream of kernel groups (a worker that
finishes one phase's last group starts the next phase's, and a pair whose rows are all in has its final
round handed out next), then the final rounds left, each pair's on one worker, the pairs on whichever
workers are free. The simulator does not time
(rows have no ``time_ms``), so there the stand-in rule is: every OK candidate ties, and the default
configuration is chosen when it is OK, else the first OK candidate in strategy order. No time is
invented: a simulator cache entry has ``time_ms: null``.

The tuning cache (:class:`~numba_attn.measure.tuning_cache.TuningCache`) is one JSON file; see its docstring for the
key.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time

from numba_attn.phases.registry import candidate_configs, get_phase
from numba_attn.measure.config import RunConfig
from numba_attn.measure.parallel import LocalPool, Workers
from numba_attn.measure.results import results_lock
from numba_attn.measure.status import OK
# the cache, re-exported: the CLI, plans, policy, dispatch and the tests read these names here
from numba_attn.measure.tuning_cache import (CACHE_ENV, TuningCache, cache_key, cached_params,  # noqa: F401
                                             default_cache_path, length_bucket)

STRATEGIES = ("grid", "random", "bayes")
OPTUNA_HINT = 'the bayes strategy needs Optuna: pip install -e ".[tune]" (or pip install "optuna>=3")'


# -- strategies and the budget -------------------------------------------------------------------

def parse_budget(text) -> tuple[int | None, float | None]:
    """``"40"`` → 40 configurations per (phase, problem); ``"30s"`` (or ``"2m"``) → seconds in all."""
    if text is None:
        return None, None
    s = str(text).strip().lower()
    try:
        if s.endswith("s"):
            v = float(s[:-1])
            return None, v
        if s.endswith("m"):
            return None, float(s[:-1]) * 60
        v = int(s)
    except ValueError:
        raise ValueError(f"--budget {text!r}: a number of configurations (e.g. 40) or seconds (e.g. 30s)") from None
    if v < 1:
        raise ValueError(f"--budget must be at least 1 configuration; got {text!r}")
    return v, None


def order_candidates(cands: list[dict], strategy: str, seed: int) -> list[dict]:
    """``grid``: as enumerated; ``random``: the default first, the rest shuffled with ``seed``."""
    if strategy == "random" and len(cands) > 1:
        rest = cands[1:]
        random.Random(seed).shuffle(rest)
        return [cands[0]] + rest
    return list(cands)


def kernel_groups(phase, chosen: list[dict]) -> list[list[int]]:
    """The indices of ``chosen`` grouped by the parameters that shape the compiled kernel (all but
    the phase's ``launch_params``), groups in order of first appearance, each in strategy order.
    A worker measures a group in a row: its candidates mostly reuse the kernels the first one
    compiled in that worker's process, where handing them out one by one to whichever worker is free
    makes every worker compile nearly every kernel (measured: two workers gained 1.14x on a
    145-candidate decode sweep, each candidate's plan taking 1.19 s instead of 0.07 s)."""
    launch = set(getattr(phase, "launch_params", ()) or ())
    if not launch:
        return [[i] for i in range(len(chosen))]
    groups: dict = {}
    for i, c in enumerate(chosen):
        full = {**phase.params, **c}
        key = json.dumps({k: v for k, v in full.items() if k not in launch}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


# -- the tuning ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Tuned:
    """The outcome of tuning one phase on one problem."""

    phase: str
    problem: object
    candidates: int  # after pruning
    measured: list  # (params, row) in strategy order
    best: dict | None = None  # the chosen requested params
    best_row: dict | None = None
    rule: str = ""
    final: list = dataclasses.field(default_factory=list)  # (params, row) of the final round, strategy order
    final_done: bool = False  # the final round was run (or found to be unneeded)

    @property
    def ok(self) -> list:
        return [(p, r) for p, r in self.measured if r and r.get("status") == OK]


def default_timing() -> str:
    """The timing method of a sweep that names none: ``graph`` on a GPU, so every candidate is timed by
    one method. With ``events`` a row switches to graph replay when its batches are launch-bound, and
    near the launch rate that happens to some candidates of a sweep and not to others: in one decode
    sweep two thirds of decode_mma's rows were graph replays and a third events, and one candidate's
    graph replay measured 3.9 % under the default's events time in a final round. ``events`` in the
    simulator (nothing is timed there)."""
    from numba_attn.gpu.backend import IS_SIMULATOR

    return "events" if IS_SIMULATOR else "graph"


FINAL_WINDOW = 0.05  # a multi-device sweep's candidates within 5 % of the fastest are timed again on one device
FINAL_MAX = 4  # at most this many of them (the fastest), and the earliest of them in strategy order
DEVICE_SPREAD = 0.02  # two GPUs of one model time one kernel up to this far apart (measured 1.6 % on two H200s)


def _device(row) -> str:
    w = row.get("worker") or {}
    return str(w.get("gpu_uuid") or w.get("cuda_visible_devices") or w.get("host") or "")


def final_round(tuned: Tuned) -> list:
    """The candidates to time again on one device, as ``(index in measured, params)`` in strategy order:
    when the timed OK candidates ran on more than one device (two GPUs of one model differ by ~1-2 % on
    the same kernel, more than the tie rule's noise), those within ``FINAL_WINDOW`` of the fastest, at
    most ``FINAL_MAX`` (the fastest of them) and the earliest of them in strategy order, which the tie
    rule prefers (without it, a default measured 2.5 % behind on the slower GPU was left out of a
    final round of four faster twins and could not be chosen); none on one device, with fewer than two
    such candidates, or when the earliest of them is within ``TIE_TOLERANCE - DEVICE_SPREAD`` of the
    fastest: on any one device it would still tie, so the rule chooses it from the first rows (in one
    sweep three of four phases' defaults were the fastest, and their final rounds were 6 of 10 final rows)."""
    timed = [(i, p, r) for i, (p, r) in enumerate(tuned.measured)
             if r and r.get("status") == OK and r.get("time_ms")]
    if len({_device(r) for _, _, r in timed}) < 2:
        return []
    fastest = min(r["time_ms"] for _, _, r in timed)
    near = sorted((r["time_ms"], i, p) for i, p, r in timed if r["time_ms"] <= fastest * (1 + FINAL_WINDOW))
    if len(near) < 2:
        return []
    earliest = min(near, key=lambda x: x[1])
    if earliest[0] <= fastest * (1 + TIE_TOLERANCE - DEVICE_SPREAD):
        return []  # the earliest is chosen whatever the devices' difference: a final round cannot change it
    chosen = near[:FINAL_MAX]
    if earliest not in chosen:
        chosen.append(earliest)
    return sorted(((i, p) for _, i, p in chosen), key=lambda x: x[0])


TIE_TOLERANCE = 0.03  # candidates within 3 % of the fastest tie (see the module docstring)


def choose_best(tuned: Tuned):
    """Sets ``best``/``best_row``/``rule`` (see the module docstring for the rule). With a final round
    (:func:`final_round`) whose candidates all passed again, the rule is applied to its rows only."""
    ok = tuned.ok
    if not ok:
        tuned.rule = "no candidate passed the correctness check"
        return
    timed = [(p, r) for p, r in ok if r.get("time_ms")]
    final = [(p, r) for p, r in tuned.final if r and r.get("status") == OK and r.get("time_ms")]
    first = len(timed)
    if final and len(final) == len(tuned.final):
        timed = final
    if timed:
        fastest = min(r["time_ms"] for _, r in timed)
        fast_row = min(timed, key=lambda x: x[1]["time_ms"])[1]
        tied = []
        for p, r in timed:  # in strategy order: the default first
            tol = max(TIE_TOLERANCE, 2 * max(float(r.get("spread_p10_p90") or 0),
                                             float(fast_row.get("spread_p10_p90") or 0)))
            if r["time_ms"] <= fastest * (1 + tol):
                tied.append((p, r))
        p, r = tied[0]
        tuned.best, tuned.best_row = p, r
        tuned.rule = f"least time of {len(timed)} timed OK candidate(s): {r['time_ms']:.4g} ms"
        if timed is final:
            tuned.rule = (f"least time in a final round on one device ({_device(r) or 'one worker'}) of the "
                          f"{len(final)} candidates within {FINAL_WINDOW:.0%} of the fastest of {first} timed on "
                          f"several: {r['time_ms']:.4g} ms")
        if len(tied) > 1:
            tuned.rule += (f" ({len(tied)} within the noise of the fastest, {fastest:.4g} ms: the earliest in "
                           f"strategy order)")
        methods = sorted({str(r.get("time_method")) for _, r in timed if r.get("time_method")})
        if len(methods) > 1:  # e.g. --timing events near the launch rate: see default_timing()
            tuned.rule += f" [compared across timing methods: {', '.join(methods)}]"
        return
    default = [(p, r) for p, r in ok if not p]
    p, r = default[0] if default else ok[0]
    tuned.best, tuned.best_row = p, r
    tuned.rule = ("no times (simulator): every OK candidate ties; "
                  + ("the default is OK and chosen" if default else "the default is not OK: the first OK candidate"))


def tune(phases, problems, *, config: RunConfig | None = None, budget=None, strategy: str = "grid",
         workers: int = 1, cache: str | None = None, seed: int = 0, space: dict | None = None,
         fixed: dict | None = None, progress=None, warn=None, make_worker=None, write_cache: bool = True,
         oversubscribe: bool = False, timings: dict | None = None):
    """Tune ``phases`` (names) on ``problems``; returns a list of :class:`Tuned`, one per (phase,
    problem) with candidates. ``space`` ({phase: {param: values}}) replaces a phase's declared
    space, ``fixed`` ({phase: {param: value}}) pins parameters. ``make_worker(i)`` places worker
    i elsewhere (Ray); ``oversubscribe``: more local workers than visible GPUs share them. The chosen
    configurations go to the cache unless ``write_cache`` is False. ``timings`` (a dict) receives the
    seconds of each stage: ``setup`` (the sweep's environment and the local workers' start), ``rows``
    (the candidates), ``final`` (the final rounds), ``close`` (the workers closed) and ``cache``."""
    from numba_attn.measure.sweep import Sweep, warn_stderr

    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    optuna = None
    if strategy == "bayes":
        try:
            import optuna
        except ImportError:
            raise RuntimeError(OPTUNA_HINT) from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = config or RunConfig()
    cfg = dataclasses.replace(cfg, peers=False, ceilings=False)
    max_configs, max_seconds = parse_budget(budget)
    plist = [get_phase(p) if isinstance(p, str) else p for p in phases]
    backward = [p.name for p in plist if p.kind == "backward"]
    if backward:  # the candidates are runner rows, forward launches
        raise ValueError(f"{', '.join(backward)}: backward phases are not tuned yet (tune runs forward launches)")
    space, fixed = space or {}, fixed or {}
    out: list[Tuned] = []
    t0 = time.perf_counter()

    def stop():
        return max_seconds is not None and time.perf_counter() - t0 > max_seconds

    clock = {"t": t0}
    stages = timings if timings is not None else {}

    def lap(name):
        now = time.perf_counter()
        stages[name] = round(stages.get(name, 0.0) + now - clock["t"], 3)
        clock["t"] = now

    with results_lock(cfg.results, warn or warn_stderr):
        sweep = Sweep(cfg, progress=progress, warn=warn)
        local = None
        if make_worker is None and int(workers) > 1:
            local = LocalPool(int(workers), cfg.worker_setup, oversubscribe=oversubscribe)  # one GPU each
            local.start()
            make_worker = local.make_worker
        pool = Workers(sweep, max(1, int(workers)), make_worker)
        lap("setup")
        try:
            pairs = []  # (phase, problem, Tuned, chosen candidates, n) in the order of the problems and phases
            for prob in problems:
                for ph in plist:
                    cands = candidate_configs(ph, prob, space.get(ph.name), fixed.get(ph.name))
                    if not cands:
                        continue
                    tuned = Tuned(ph.name, prob, len(cands), [])
                    n = min(len(cands), max_configs) if max_configs else len(cands)
                    if strategy == "bayes":  # asks for each candidate after seeing the rows: one pair at a time
                        _run_bayes(optuna, pool, ph, prob, cands, n, seed, tuned, stop)
                        _final_rounds(pool, [(ph, prob, tuned, None, n)], stop)
                        choose_best(tuned)
                    pairs.append((ph, prob, tuned, None if strategy == "bayes" else
                                  order_candidates(cands, strategy, seed)[:n], n))
            grid = [x for x in pairs if x[3] is not None]
            lap("rows")
            if grid:
                _run_pipelined(pool, grid, stop)
                lap("rows")
                _final_rounds(pool, grid, stop)
                lap("final")
                for _, _, tuned, _, _ in grid:
                    choose_best(tuned)
            out = [tuned for _, _, tuned, _, _ in pairs]
        finally:
            pool.close()
            lap("close")
    if write_cache:
        write_to_cache(out, cache, cfg.results, sweep)
    lap("cache")
    return out


def _run_pipelined(pool, pairs, stop):
    """Every (phase, problem)'s candidates in one run of the lanes, kernel group by kernel group in the
    order of the pairs: a lane that finishes the last group of one pair goes on with the next pair's
    groups instead of waiting for the other lanes at each phase's end (measured: those waits and the
    final rounds were 6 s of a 163 s two-worker sweep of four phases). A pair whose rows are all in by
    the time a lane asks for work has its final round (:func:`final_round`, one group: one lane) handed
    out next, ahead of the remaining groups, so only the last pairs' final rounds are left for
    :func:`_final_rounds` after the stream (measured: 5.9 s of a 132 s two-worker sweep)."""
    slots: dict = {}
    for ph, prob, tuned, chosen, n in pairs:
        slots[(ph.name, prob)] = {}
    final_slots: dict = {}
    ready: list = []  # pairs whose first-round rows are all in, in the order they completed

    def final_group(ph, prob, tuned, n):
        tuned.measured = [slots[(ph.name, prob)][i] for i in sorted(slots[(ph.name, prob)])]
        tuned.final_done = True
        finals = final_round(tuned)
        if not finals:
            return None
        final_slots[(ph.name, prob)] = (tuned, {}, len(finals))
        return [(i, n, "phase", ph.name, prob, p, "final") for i, p in finals]

    def jobs():
        for ph, prob, tuned, chosen, n in pairs:
            for group in kernel_groups(ph, chosen):  # one worker measures a group in a row
                while ready:  # (jobs are pulled under the pool's lock, as on_row runs)
                    g = final_group(*ready.pop(0))
                    if g is not None:
                        yield g
                yield [(i, n, "phase", ph.name, prob, chosen[i]) for i in group]

    wanted = {(ph.name, prob): (len(chosen), (ph, prob, tuned, n)) for ph, prob, tuned, chosen, n in pairs}

    def on_row(job, row):
        key = (job[3], job[4])
        if len(job) > 6:  # a final-round row
            final_slots[key][1][job[0]] = (job[5], row)
            return
        slots[key][job[0]] = (job[5], row)
        if len(slots[key]) == wanted[key][0]:
            ready.append(wanted[key][1])

    pool.run(jobs(), on_row, stop)
    for ph, prob, tuned, chosen, n in pairs:
        got = slots[(ph.name, prob)]
        tuned.measured = [got[i] for i in sorted(got)]
    for tuned, got, k in final_slots.values():
        if len(got) == k:  # a final round cut short (the budget's time) is not used
            tuned.final = [got[i] for i in sorted(got)]


def _final_rounds(pool, pairs, stop):
    """The final rounds (:func:`final_round`) of ``pairs``: each pair's candidates timed again one after
    another by one lane (one device), different pairs on whichever lanes are free."""
    groups, slots = [], {}
    for ph, prob, tuned, _, n in pairs:
        if tuned.final_done:  # run while the other pairs' rows were measured (_run_pipelined)
            continue
        tuned.final_done = True
        finals = final_round(tuned)
        if finals:
            slots[(ph.name, prob)] = (tuned, {})
            groups.append([(i, n, "phase", ph.name, prob, p, "final") for i, p in finals])
    if not groups or stop():
        return
    pool.run(iter(groups), lambda job, row: slots[(job[3], job[4])][1].__setitem__(job[0], (job[5], row)), stop)
    for tuned, got in slots.values():
        tuned.final = [got[i] for i in sorted(got)]


def _run_bayes(optuna, pool, ph, prob, cands, n, seed, tuned, stop):
    """Optuna TPE over the candidates' parameters, asked one trial per free worker; a configuration
    outside the pruned candidates is told as pruned. Optuna minimizes the measured time; in the
    simulator (no time) an OK candidate is told 0.0 (a tie) and a failed one as failed."""
    from optuna.distributions import CategoricalDistribution

    names = sorted({k for c in cands for k in c})
    dists = {k: CategoricalDistribution(sorted({c.get(k, ph.params[k]) for c in cands}, key=repr)) for k in names}
    valid = {json.dumps({k: c.get(k, ph.params[k]) for k in names}, sort_keys=True, default=str): c for c in cands}
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial({k: ph.params[k] for k in names})  # the default first
    seen, slots, trials = set(), {}, {}

    def jobs():
        i = 0
        attempts = 0
        while i < n and attempts < 20 * n:
            attempts += 1
            trial = study.ask(dists)
            key = json.dumps(trial.params, sort_keys=True, default=str)
            cand = valid.get(key)
            if cand is None or key in seen:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            seen.add(key)
            trials[i] = trial
            yield (i, n, "phase", ph.name, prob, cand)
            i += 1

    def on_row(job, row):
        slots[job[0]] = (job[5], row)
        trial = trials[job[0]]
        if row and row.get("status") == OK:
            study.tell(trial, float(row.get("time_ms") or 0.0))
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    pool.run(jobs(), on_row, stop)
    tuned.measured = [slots[i] for i in sorted(slots)]


def write_to_cache(results: list[Tuned], cache: str | None, results_path: str | None, sweep) -> TuningCache:
    """One entry per tuned (phase, problem) with a chosen configuration; per problem the chosen
    phase (least time, or in the simulator the first phase tuned with an OK configuration)."""
    tc = TuningCache(cache)
    gpu = sweep.env.get("gpu") or "unknown"
    updates = []
    by_problem: dict = {}
    for t in results:
        if t.best is None:
            continue
        by_problem.setdefault(cache_key(gpu, t.problem), []).append(t)
    for key, ts in by_problem.items():
        timed = [t for t in ts if t.best_row.get("time_ms")]
        chosen = min(timed, key=lambda t: t.best_row["time_ms"]) if timed else ts[0]
        for t in ts:
            updates.append((key, t.phase, {
                "params": t.best, "resolved": t.best_row.get("params", {}), "time_ms": t.best_row.get("time_ms"),
                "results": results_path, "commit": sweep.env.get("commit"), "run_id": sweep.run_id,
                "label": t.problem.label, "candidates": t.candidates, "measured": len(t.measured),
                "rule": t.rule, "updated": time.time()}, t is chosen))
    if updates:
        tc.update(updates)
    return tc
