"""The sweep: phases × problems (then the peers of each problem) → checked, timed rows in a results file.

``run`` measures the device's ceilings first when asked (:mod:`numba_attn.measure.ceilings`),
then, per problem, its phases and then its peers (:mod:`numba_attn.measure.peers`), so a run
cut short by ``max_total_s`` loses whole problems last. Each row is measured by
:func:`numba_attn.measure.row.measure` — in a worker process with a ``timeout_s``
(:mod:`numba_attn.measure.isolation`) — gets its speedup against the ``baseline`` phase
measured in the same run (or, with ``resume``, in the resumed file; a row of another dtype
falls back to the baseline on the same shape, fp32 preferred, and ``speedup_vs`` says so) and
its fraction of the measured ceiling that applies to it, and is appended to the results file
(:mod:`numba_attn.measure.results`) and flushed at once.

One regime per problem (``regime="interleaved"``, the default on a GPU): each row is first timed alone, as
before; then the problem's timed phases and peers are timed again in interleaved rounds in the process that
measured them (:mod:`numba_attn.measure.regime`), and a row's time is the median over its rounds. Before,
the rows' times were these standalone ones, taken one row after the other: ``plan_tasks`` puts a problem's
phases before its peers, and :func:`~numba_attn.measure.timing.timed` times a row by ``events_batched``
(back-to-back launches for up to ``budget_s``) and then, under ``--timing cupti``, by ``cupti_kernel_time``,
whose ``with profile(activities=[ProfilerActivity.CUDA])`` starts CUPTI. In a fresh worker that start takes
3-6 s with the GPU idle (the first row's ``stage_s["cupti"]`` in the committed files, ~0.1 s for later
rows), so the first row, a phase, had its profiled calls on a rested GPU and every peer its calls right after
its own second of events at the power cap: at B1 H32 N4096 D128 fp16 ``warp_specialized_tc``'s kernel time
read 4-12 % below its own events time, the cuDNN peer's within -3/+7 % of its own, and the ratio came out
0.94-1.02x where one regime gives 0.86-0.88x (docs/results.md). A problem's rows reach the results file
once their time is final; ``regime="standalone"`` (``--regime standalone``) keeps the old way.

In the simulator a phase row estimated to take more than a minute (:mod:`numba_attn.measure.simcost`:
simulated thread-steps over a rate calibrated on this machine) is not run: it is a SKIP row whose
reason gives the estimate and a shape that fits, also printed as a warning; ``allow_slow`` (``--allow-slow``,
``NUMBA_ATTN_ALLOW_SLOW=1``) runs it anyway, with a warning.

Once per run the events timing is cross-checked with a CUDA graph replay (``timing_check``;
a disagreement beyond the spread is a warning). ``max_row_ms`` skips a phase whose time,
scaled by FLOPs from its last row, would exceed it. With ``resume=True`` the OK rows already in
the file for the same package source and environment (``env_key``), the same seeds and the same
source of the phase's module (``phase_source_hash``: a phase registered from a user's module is
covered too) are not run again; FAIL, ERROR, TIMEOUT and SKIP rows are. A run holds the results
file's lock (:func:`~numba_attn.measure.results.results_lock`) from reading it to its last row,
so two runs on one file take turns instead of measuring the same rows twice.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid

from numba_attn.gpu.backend import BACKEND, IS_SIMULATOR
from numba_attn.spec.problem import PRESETS, Problem
from numba_attn.phases.registry import Phase, get_phase, list_phases
from numba_attn.measure import regime
from numba_attn.measure.ceilings import CEILINGS, attach_fractions
from numba_attn.measure.config import RunConfig, config_to_dict
from numba_attn.measure.env import env_key, environment
from numba_attn.measure.isolation import WorkerProcess, call_setup, run_task
from numba_attn.measure.peer_rows import measure_peer
from numba_attn.measure.peers import peer_names
from numba_attn.measure.results import (ResultsWriter, results_lock, resumable_rows, row_key,
                                       source_hash_of, task_key)
from numba_attn.measure.row import measure
from numba_attn.measure.status import ERROR, OK, SKIP


def run(phases=None, problems=None, *, config: RunConfig | None = None, progress=None, select=None,
        warn=None, workers: int | None = None, make_worker=None, oversubscribe: bool = False,
        **kw) -> list[dict]:
    """Run ``phases`` (names or Phase objects; default all) on ``problems``
    (default: the ``tiny`` preset) and return the result rows.

    Keyword arguments are :class:`RunConfig` fields (``seeds``, ``timeout_s``,
    ``params``, ``results`` path, ``ceilings``, ``resume``, ...).
    ``select(phase, problem) -> bool`` keeps only some (phase, problem) pairs.
    ``progress(i, n, row_or_None, phase, problem)`` is called before (row None)
    and after each row; ``warn(message)`` receives warnings (default: stderr).
    ``workers`` (with ``make_worker(i)``, e.g. a :class:`~numba_attn.measure.parallel.LocalPool`'s
    or a Ray pool's; default local worker processes, one GPU each) measures the rows on that many
    workers side by side (:func:`run_parallel`); None: one after the other, as always.
    ``oversubscribe``: more local workers than visible GPUs share them round-robin (else refused).
    """
    cfg = config or RunConfig(**kw)
    for spec in cfg.worker_setup:  # here and in every worker process
        call_setup(spec)
    plist = resolve_phases(phases)
    problems = list(problems) if problems is not None else PRESETS["tiny"]
    with results_lock(cfg.results, warn or warn_stderr):
        sweep = Sweep(cfg, progress=progress, warn=warn)
        tasks = plan_tasks(plist, problems, sweep.peers, select)
        if workers is not None or make_worker is not None:
            return run_parallel(sweep, tasks, workers, make_worker, oversubscribe)
        try:
            if cfg.ceilings:
                sweep.measure_ceilings()
            for group in problem_groups(tasks):
                sweep.run_group(group, len(tasks))
        finally:
            sweep.close()
    return sweep.rows


def problem_groups(tasks) -> list[list[tuple]]:
    """``(idx, kind, name, problem)`` of the tasks, in runs of consecutive tasks on one problem."""
    groups: list = []
    for idx, (kind, name, prob) in enumerate(tasks):
        if groups and groups[-1][-1][3] == prob:
            groups[-1].append((idx, kind, name, prob))
        else:
            groups.append([(idx, kind, name, prob)])
    return groups


def run_parallel(sweep, tasks, workers=None, make_worker=None, oversubscribe=False) -> list[dict]:
    """The rows of ``tasks`` measured on ``workers`` lanes (:class:`~numba_attn.measure.parallel.Workers`):
    the ceilings first, once, in lane 0's worker; then every (phase or peer, problem) task once, pulled
    in order by the next free lane, each problem's baseline row first (a row's speedup waits for it).
    Rows go to the results file as they finish; the returned rows are in task order."""
    from numba_attn.measure.parallel import CountingProgress, LocalPool, Workers, SharedState

    cfg = sweep.cfg
    pool = None
    if make_worker is None:
        pool = LocalPool(max(1, int(workers or 1)), cfg.worker_setup, oversubscribe=oversubscribe)
        make_worker = pool.make_worker
    n = max(1, int(workers or getattr(pool, "size", 1)))
    lanes = Workers(sweep, n, make_worker)
    try:
        lanes.share(SharedState(cfg.baseline, tasks), CountingProgress(sweep.progress) if sweep.progress else None)
        if pool is not None:
            pool.start()  # side by side; refuses different GPU models
        if cfg.ceilings:
            lanes.lanes[0].measure_ceilings()  # its rows go to sweep.rows (the lane shares the list)
        # per problem (in plan order) its baseline row first, then the others in plan order
        first_of = {}
        for i, (_, _, prob) in enumerate(tasks):
            first_of.setdefault(json.dumps(prob.to_dict(), sort_keys=True), i)
        order = sorted(range(len(tasks)), key=lambda i: (
            first_of[json.dumps(tasks[i][2].to_dict(), sort_keys=True)],
            0 if tasks[i][0] == "phase" and tasks[i][1] == cfg.baseline else 1, i))
        slots: dict = {}
        ceiling_rows = list(sweep.rows)
        jobs = ((i, len(tasks), tasks[i][0], tasks[i][1], tasks[i][2], None) for i in order)
        lanes.run(jobs, lambda job, row: slots.__setitem__(job[0], row))
        sweep.rows[:] = ceiling_rows + [slots[i] for i in sorted(slots) if slots[i] is not None]
    finally:
        lanes.close()
        if sweep.worker is not None and all(lane.worker is not sweep.worker for lane in lanes.lanes):
            sweep.worker.close()
    return sweep.rows


def resolve_phases(phases) -> list[Phase]:
    """Phase objects in roadmap order (all registered phases when ``phases`` is None)."""
    if phases is None:
        return list_phases()
    out = [get_phase(p) if isinstance(p, str) else p for p in phases]
    return sorted(out, key=lambda p: p.order)


def plan_tasks(phases, problems, peers, select=None) -> list[tuple]:
    """``(kind, name, problem)`` per row: per problem its phases, then its peers."""
    tasks = []
    for pr in problems:
        tasks += [("phase", ph.name, pr) for ph in phases if select is None or select(ph, pr)]
        tasks += [("peer", name, pr) for name in peers]
    return tasks


def shape_key(problem_dict: dict) -> str:
    """A problem without its dtype: tensor-core rows in fp16 get their speedup
    against the baseline on the same shape in fp32 (``speedup_vs`` says so)."""
    return json.dumps({k: v for k, v in problem_dict.items() if k != "dtype"}, sort_keys=True)


class Baselines:
    """The baseline phase's times: per problem, and per shape in any dtype (fp32 preferred)."""

    def __init__(self, name: str):
        self.name = name
        self.by_problem: dict = {}
        self.by_shape: dict = {}  # shape key → (time_ms, dtype)

    def note(self, kind, name, row, problem_dict):
        """Remember ``row``'s time when it is an OK, timed row of the baseline phase."""
        if kind == "phase" and name == self.name and row.get("status") == OK and row.get("time_ms"):
            t_ms = row["time_ms"]
            self.by_problem[json.dumps(problem_dict, sort_keys=True)] = t_ms
            sk = shape_key(problem_dict)
            if sk not in self.by_shape or problem_dict.get("dtype") == "float32":
                self.by_shape[sk] = (t_ms, problem_dict.get("dtype"))

    def attach_speedup(self, row, problem_dict):
        if not row.get("time_ms"):
            return
        pkey = json.dumps(problem_dict, sort_keys=True)
        if pkey in self.by_problem:
            row["speedup"] = self.by_problem[pkey] / row["time_ms"]
        elif shape_key(problem_dict) in self.by_shape:
            t_b, dt_b = self.by_shape[shape_key(problem_dict)]
            row["speedup"] = t_b / row["time_ms"]
            row["speedup_vs"] = f"{self.name} {dt_b}"


def warn_stderr(msg):
    print(f"warning: {msg}", file=sys.stderr, flush=True)


class Sweep:
    """The state of one ``run``: its environment record, results file, worker, resumed rows,
    baseline times, ceilings and the rows so far."""

    def __init__(self, cfg: RunConfig, *, progress=None, warn=None):
        self.cfg = cfg
        self.progress = progress
        self.warn = warn or warn_stderr
        self.env = environment(cfg.command)
        self.env_key = env_key(self.env)
        self.run_id = uuid.uuid4().hex[:12]
        previous = resumable_rows(cfg.results, self.env_key) if cfg.resume else []
        previous = [r for r in previous if not regime.other_regime(r, cfg.regime)]  # timed the other way: again
        self.done = {row_key(r): r for r in previous}
        self.writer = ResultsWriter(cfg.results)
        self.writer.write({"type": "env", "run_id": self.run_id, "env_key": self.env_key,
                           "resumed_rows": len(self.done), "config": config_to_dict(cfg), **self.env})
        self.worker = WorkerProcess(cfg.worker_setup) if cfg.timeout_s else None
        self.peers = []
        if cfg.peers and not IS_SIMULATOR:
            self.peers = list(cfg.peer_list) if cfg.peer_list is not None else peer_names()
        self.rows: list[dict] = []
        self.ceilings: dict = {}  # name → OK ceiling row
        self.t_start = time.perf_counter()
        self.baselines = Baselines(cfg.baseline)
        self.last_time: dict = {}  # phase → (flops, time_ms) of its last timed row, for max_row_ms
        self.timing_checked = False
        self.shared = None  # what the lanes of a run on several workers share (measure/parallel.py)
        for r in previous:
            self.baselines.note(r.get("kind"), r.get("phase"), r, r.get("problem"))
            if r.get("timing_check"):
                self.timing_checked = True

    def close(self):
        if self.worker is not None:
            self.worker.close()

    def code_hash(self, kind, name) -> str | None:
        """The source hash of a phase's module (None for peers: the package hash covers them)."""
        if kind != "phase":
            return None
        try:
            return source_hash_of(get_phase(name).module)
        except KeyError:
            return None

    def stamp(self, row):
        row["run_id"] = self.run_id
        row["env_key"] = self.env_key
        row["commit"] = self.env.get("commit")
        row["gpu"] = self.env.get("gpu")

    def _report(self, idx, n, row, name, prob):
        if self.progress:
            self.progress(idx, n, row, name, prob)

    # -- ceilings first, in the same process/context as the phases -----------------

    def measure_ceilings(self):
        keys = [task_key("ceiling", n, None, None) for n in CEILINGS]
        ceil_rows = [self.done[k] for k in keys if k in self.done]
        if len(ceil_rows) == len(CEILINGS):
            for r in ceil_rows:
                r["resumed"] = True
        else:
            t0 = time.perf_counter()
            task = ("ceilings", (list(CEILINGS), config_to_dict(self.cfg)))
            if self.worker is not None:
                # no limit without a timeout_s (a run on several workers has workers even then)
                res = self.worker.call(task, None if self.cfg.timeout_s is None else max(self.cfg.timeout_s, 120))
            else:
                res = run_task(*task)
            ceil_rows = res.get("rows") or [{"type": "ceiling", "kind": "ceiling", "name": n,
                                             "phase": f"ceiling.{n}", "status": res.get("status", ERROR),
                                             "reason": res.get("reason", ""), "value": None} for n in CEILINGS]
            for r in ceil_rows:
                self.stamp(r)
                self.writer.write(r)
            self._report(-1, 0, {"status": "ceilings", "wall_s": time.perf_counter() - t0}, "ceilings", None)
        for r in ceil_rows:
            self.rows.append(r)
            if r.get("status") == OK and r.get("value"):
                self.ceilings[r["name"]] = r

    # -- a problem's rows: one regime ---------------------------------------------------

    def interleaves(self, group) -> bool:
        """Whether a problem's rows are timed again in interleaved rounds (:mod:`numba_attn.measure.regime`):
        on a GPU, ``regime`` interleaved, one row after the other (not on several workers), and at least two
        implementations of the problem."""
        return (self.cfg.regime == "interleaved" and not IS_SIMULATOR and self.cfg.time_kernels
                and self.shared is None and len(group) >= 2)

    def run_group(self, group, n: int):
        """The rows of one problem (``(idx, kind, name, problem)`` each): measured one after the other, each
        timed alone as always; then, when :meth:`interleaves`, every timed row again in interleaved rounds in
        the process that measured them, whose median becomes the row's time. The rows reach the results
        file (and the progress) once their time is final."""
        if not self.interleaves(group):
            for idx, kind, name, prob in group:
                self.run_task(idx, n, kind, name, prob)
            return
        measured = []
        for idx, kind, name, prob in group:
            row = self.measure_task(idx, n, kind, name, prob, hold=True)
            if row is not None:
                measured.append((idx, kind, name, prob, row))
        keys = [regime.key_of(kind, name) for _, kind, name, _, row in measured
                if row.get("_held") is not None and row.get("status") == OK]
        if any(m[4].get("_held") is not None for m in measured):  # (the rounds also release what was held)
            self.time_rounds(group[0][3], keys, [m[4] for m in measured])
        for idx, kind, name, prob, row in measured:
            self.finish_row(idx, n, kind, name, prob, row)

    def time_rounds(self, prob: Problem, keys, rows):
        """The rounds over ``keys`` (in the worker that measured them), applied to ``rows``."""
        t0 = time.perf_counter()
        task = ("rounds", (keys, config_to_dict(self.cfg)))
        if self.worker is not None:
            res = self.worker.call(task, self.cfg.timeout_s)
        else:
            try:
                res = run_task(*task)
            except Exception as exc:  # noqa: BLE001 - the rows keep their standalone times and say why
                res = {"status": ERROR, "reason": f"{type(exc).__name__}: {exc}"[:300]}
        by_key = {regime.key_of(r.get("kind"), r.get("phase")): r for r in rows}
        if res.get("type") != "rounds":
            for k in keys:
                by_key[k]["_held"] = f"interleaved rounds failed ({res.get('status')}: {res.get('reason')}); " \
                                     f"timed alone"
            return
        for k, r in by_key.items():
            if k in res["results"]:
                regime.apply_rounds(r, res["results"][k], res)
                r.pop("_held", None)
                r.setdefault("stage_s", {})["rounds"] = time.perf_counter() - t0
            elif k in res["left_out"]:
                r["_held"] = res["left_out"][k]

    def alone_note(self, row) -> str:
        """Why a timed row was not in interleaved rounds."""
        why = row.pop("_held", None)
        if isinstance(why, str):
            return why
        if self.cfg.regime != "interleaved":
            return "--regime standalone: each row timed alone"
        if self.shared is not None:
            return "rows on several workers: each timed alone"
        return "timed alone (not in interleaved rounds with other rows)"

    # -- one row -------------------------------------------------------------------

    def run_task(self, idx: int, n: int, kind: str, name: str, prob: Problem):
        row = self.measure_task(idx, n, kind, name, prob)
        if row is not None:
            self.finish_row(idx, n, kind, name, prob, row)

    def measure_task(self, idx: int, n: int, kind: str, name: str, prob: Problem, hold: bool = False):
        """The row of one task before its speedup and the results file (None: resumed, already recorded);
        ``hold``: its timed function is kept for its problem's interleaved rounds."""
        params_req = self.cfg.params.get(name, {}) if kind == "phase" else {}
        code = self.code_hash(kind, name)
        tag = getattr(self, "row_tag", None)  # a repeat with another purpose (a tuning's final round)
        key = task_key(kind, name, prob, params_req, self.cfg.seeds, code, tag)
        self._report(idx, n, None, name, prob)
        if key in self.done:
            row = dict(self.done[key])
            row["resumed"] = True
            self.rows.append(row)
            self._report(idx, n, row, name, prob)
            return None
        t0 = time.perf_counter()
        reason = self.skip_reason(kind, name, prob, t0)
        slow = None if reason else self.slow_row(kind, name, prob, params_req)
        if slow is not None and not self.allow_slow():
            reason = slow[1]  # (printed with the row)
        row = _stub_row(kind, name, prob, {"status": SKIP, "reason": reason}) if reason else \
            self.measure_row(kind, name, prob, hold)
        if slow is not None:
            row["sim_estimate_s"] = round(slow[0], 1)
        row["requested_params"] = params_req
        row["requested_seeds"] = list(self.cfg.seeds)
        if tag:
            row["round"] = tag
        if code is not None:
            row["phase_source_hash"] = code
        row["wall_s"] = time.perf_counter() - t0
        return row

    def finish_row(self, idx: int, n: int, kind: str, name: str, prob: Problem, row: dict):
        """Stamp, speedup, ceiling fractions, the regime it was timed in; then to the results file."""
        regime.mark_alone(row, self.alone_note(row))
        t1 = time.perf_counter()
        self.stamp(row)
        if self.shared is not None:
            self.shared.wait_for_baseline(kind, name, prob)
        self.annotate(kind, name, prob, row)
        if isinstance(row.get("stage_s"), dict):
            row["stage_s"]["after_row"] = time.perf_counter() - t1  # stamp, baseline wait, annotation
        self.writer.write(row)
        self.rows.append(row)
        self._report(idx, n, row, name, prob)

    def skip_reason(self, kind, name, prob: Problem, now: float) -> str | None:
        """Why a row is not run: the run's time limit reached, or the phase predicted too slow."""
        cfg = self.cfg
        if cfg.max_total_s is not None and now - self.t_start > cfg.max_total_s:
            return f"the run's time limit of {cfg.max_total_s:g} s was reached before this row"
        if cfg.max_row_ms and kind == "phase" and name in self.last_time:
            f0, ms0 = self.last_time[name]
            pred = ms0 * prob.flops() / max(f0, 1)
            if pred > cfg.max_row_ms:
                return (f"predicted {pred:.0f} ms per launch (scaled by FLOPs from {ms0:.1f} ms on a "
                        f"smaller problem) exceeds the row limit of {cfg.max_row_ms:g} ms")
        return None

    def allow_slow(self) -> bool:
        from numba_attn.measure.simcost import allow_slow_env

        return bool(self.cfg.allow_slow) or allow_slow_env()

    def slow_row(self, kind, name, prob: Problem, params_req) -> tuple | None:
        """In the simulator: ``(estimated seconds, one line)`` for a phase row estimated over the limit that
        the phase supports (a row it does not support is a quick SKIP of its own), else None. With
        ``allow_slow`` the line is a warning and the row runs."""
        if not IS_SIMULATOR or kind != "phase":
            return None
        from numba_attn.measure import simcost

        try:
            ph = get_phase(name)
            if ph.supports(prob, **ph.resolve_params(dict(params_req or {}))):
                return None
        except Exception:  # noqa: BLE001 - the row itself reports a bad parameter or shape
            return None
        limit = self.cfg.sim_limit_s if self.cfg.sim_limit_s is not None else simcost.limit_s()
        seeds = len(self.cfg.seeds)
        if simcost.estimate_s(ph, prob, seeds) <= limit:
            return None
        command = self.cfg.command or ""
        prefix = f"numba-attn run --phases {name} " if command.startswith("numba-attn bench") else ""
        est, line = simcost.describe(ph, prob, seeds, cli=command.startswith("numba-attn"), limit=limit, prefix=prefix)
        if self.allow_slow():
            self.warn(f"{line.split('; try ')[0].split('; pass ')[0]}; running it anyway (allowed)")
        return est, line

    def measure_row(self, kind, name, prob: Problem, hold: bool = False) -> dict:
        """The row of a phase or a peer, in the worker process when there is one; the first
        phase row of a run (not resumed) carries the timing cross-check. ``hold``: its timed function is
        kept in that process for the problem's interleaved rounds (the row's ``_held`` says whether)."""
        want = self.cfg.compare_timing is not False and not self.timing_checked and kind == "phase"
        if want and self.shared is not None:
            want = self.shared.claim_timing_check()  # one row of the run, whichever lane it is in
        cfg_row = dataclasses.replace(self.cfg, compare_timing=want, hold=hold)
        if self.worker is not None:
            info = self.worker.call((kind, (name, prob.to_dict(), config_to_dict(cfg_row))), self.cfg.timeout_s)
            row = info
            if row.get("type") != "result":  # timeout/crash: rebuild the row's identity
                row = _stub_row(kind, name, prob, row)
                # a worker of several (measure/parallel.py) records itself, and a retry after its death
                row.update({k: info[k] for k in ("worker", "retried") if k in info})
            return row
        if hold:  # in this process: as a worker would
            return run_task(kind, (name, prob.to_dict(), config_to_dict(cfg_row)))
        if kind == "phase":
            return measure(name, prob, cfg_row)
        return measure_peer(name, prob, cfg_row)

    def annotate(self, kind, name, prob: Problem, row):
        """Speedup, the phase's last time, a peer's precision, ceiling fractions, timing warnings."""
        pdict = prob.to_dict()
        self.baselines.note(kind, name, row, pdict)
        self.baselines.attach_speedup(row, pdict)
        if row.get("time_ms") and kind == "phase":
            self.last_time[name] = (prob.flops(), row["time_ms"])
        if kind == "peer" and row.get("params", {}).get("dtype", "float32") != "float32":
            row.setdefault("precision", row["params"]["dtype"])
        attach_fractions(row, self.ceilings)
        tc = row.get("timing_check")
        if tc:
            self.timing_checked = True
            if tc.get("warning"):
                self.warn(f"{name} [{prob.label}]: {tc['warning']}")


def _stub_row(kind, name, prob: Problem, info: dict) -> dict:
    """A row that was not measured (skipped, timed out, its worker died): its identity and why."""
    row = {"type": "result", "phase": name, "kind": kind, "problem": prob.to_dict(),
           "label": prob.label, "backend": BACKEND, "flops": prob.flops(), "min_bytes": prob.min_bytes()}
    if kind == "phase":
        try:
            ph = get_phase(name)
            row.update(order=ph.order, planned_speedup=ph.planned_speedup, phase_kind=ph.kind,
                       precision=ph.precision, parent=ph.parent)
        except KeyError:
            pass
    row.update(status=info.get("status", ERROR), reason=info.get("reason", ""))
    return row
