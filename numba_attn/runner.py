"""The runner: phases × problems → checked, timed, self-describing result rows.

For each (phase, problem):

1. ``supports`` — out-of-range problems are recorded ``SKIP`` with the reason;
2. correctness on fresh inputs for every seed: the output buffer is poisoned,
   the phase runs, the result is compared with the float64 reference. Any
   failure makes the row ``FAIL`` and it is never timed;
3. on the GPU only, timing (:mod:`numba_attn.timing`) and the compiled kernels'
   resources (registers, static shared memory, local memory = spills and
   local arrays). A time below a physical floor is ``FAIL``;
4. the row is appended to the results file and flushed at once.

An exception becomes an ``ERROR`` row with a summary of the traceback. With a
``timeout_s``, each row runs in a worker process that is killed and replaced
when the row overruns (``TIMEOUT``), so one hung kernel does not stall the
sweep. Speedups are against the ``baseline`` phase measured in the same run.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

from .backend import BACKEND, IS_SIMULATOR
from .problem import Problem
from .reference import check, poison, reference
from .registry import Phase, get_phase, list_phases
from .timing import TimingConfig

OK, FAIL, ERROR, TIMEOUT, SKIP = "OK", "FAIL", "ERROR", "TIMEOUT", "SKIP"

# Physical floors: nothing on current GPUs moves more than 20 TB/s of HBM or
# does more than 5 PFLOP/s of dense math; a time implying either is a bug.
MAX_PLAUSIBLE_BYTES_PER_S = 20e12
MAX_PLAUSIBLE_FLOPS = 5e15


@dataclass
class RunConfig:
    seeds: tuple = (1, 2)
    timing: TimingConfig = field(default_factory=TimingConfig)
    time_kernels: bool = True  # only on the GPU
    timeout_s: float | None = None  # per row; None: in-process, no limit
    params: dict = field(default_factory=dict)  # {phase_name: {param: value}}
    baseline: str = "naive"
    peers: bool = True
    results: str | None = None
    command: str | None = None


# -- helpers -------------------------------------------------------------------

_REF_CACHE: dict = {}


def _reference(problem: Problem, seed: int):
    key = (problem, seed)
    if key not in _REF_CACHE:
        if len(_REF_CACHE) > 8:
            _REF_CACHE.clear()
        q, k, v = problem.inputs(seed)
        ref = reference(q, k, v, causal=problem.causal, scale=problem.sm_scale)
        _REF_CACHE[key] = (q, k, v, ref)
    return _REF_CACHE[key]


def _views(problem: Problem, q, k, v, o):
    """(B, H, N, D) device arrays → the (B·H, N, D) views kernels index."""
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    return (q.reshape(B * H, problem.q_len, D), k.reshape(B * Hkv, problem.kv_len, D),
            v.reshape(B * Hkv, problem.kv_len, D), o.reshape(B * H, problem.q_len, D))


def kernel_resources(kernels) -> list[dict]:
    """Registers, static shared memory and local memory per compiled kernel."""
    if IS_SIMULATOR:
        return []
    out = []
    for kern in kernels:
        name = getattr(getattr(kern, "py_func", None), "__name__", str(kern))
        for sig, ovl in list(getattr(kern, "overloads", {}).items()):
            row = {"kernel": name}
            for key, attr in (("regs", "regs_per_thread"), ("smem_static", "shared_mem_per_block"),
                              ("local_bytes", "local_mem_per_thread"),
                              ("max_threads", "max_threads_per_block")):
                try:
                    row[key] = int(getattr(ovl, attr))
                except Exception:  # pragma: no cover - introspection is best effort
                    row[key] = None
            out.append(row)
    return out


def _summarize_exception(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = ""
    for fr in reversed(tb):
        if "numba_attn" in fr.filename or "phases" in fr.filename:
            where = f" (at {os.path.basename(fr.filename)}:{fr.lineno} in {fr.name})"
            break
    msg = str(exc).strip().splitlines()
    head = msg[0] if msg else ""
    if len(head) > 300:
        head = head[:300] + "…"
    return f"{type(exc).__name__}: {head}{where}"


# -- one row -----------------------------------------------------------------


def measure(phase: Phase | str, problem: Problem, cfg: RunConfig | None = None, **overrides) -> dict:
    """Check (and on the GPU time) one phase on one problem; returns the row."""
    from numba import cuda

    cfg = cfg or RunConfig()
    phase = get_phase(phase) if isinstance(phase, str) else phase
    params = phase.resolve_params({**cfg.params.get(phase.name, {}), **overrides})
    row = {"type": "result", "phase": phase.name, "kind": "phase", "order": phase.order,
           "problem": problem.to_dict(), "label": problem.label, "params": params,
           "planned_speedup": phase.planned_speedup, "backend": BACKEND, "status": None,
           "reason": "", "flops": problem.flops(), "min_bytes": problem.min_bytes()}
    reason = phase.supports(problem, **params)
    if reason:
        row.update(status=SKIP, reason=reason)
        return row
    try:
        t0 = time.perf_counter()
        launch = phase.plan(problem, **params)
        stream = cuda.stream()
        checks = []
        for i, seed in enumerate(cfg.seeds):
            q, k, v, ref = _reference(problem, seed)
            qd, kd, vd = (cuda.to_device(a, stream=stream) for a in (q, k, v))
            od = cuda.to_device(poison(np.empty(problem.out_shape(), q.dtype), problem.dtype), stream=stream)
            t1 = time.perf_counter()
            launch(*_views(problem, qd, kd, vd, od), stream)
            stream.synchronize()
            if i == 0:
                row["first_launch_s"] = time.perf_counter() - t1  # includes compilation
                row["sim_wall_s" if IS_SIMULATOR else "plan_s"] = time.perf_counter() - t0
            out = od.copy_to_host(stream=stream)
            stream.synchronize()
            c = check(out, ref, dtype=problem.dtype, precision=phase.precision)
            checks.append(c)
            if not c.ok:
                break
        worst = max(checks, key=lambda c: (not c.ok, c.rel_err))
        row["check"] = worst.to_dict()
        row["seeds"] = list(cfg.seeds[: len(checks)])
        row["resources"] = kernel_resources(launch.kernels)
        _summarize_resources(row)
        if not worst.ok:
            row.update(status=FAIL, reason=f"wrong result (seed {cfg.seeds[len(checks) - 1]}): {worst.reason}")
            return row
        if IS_SIMULATOR or not cfg.time_kernels:
            row.update(status=OK, reason="checked; not timed (simulator)" if IS_SIMULATOR else "checked; not timed")
            return row
        row.update(_time_launch(launch, problem, qd, kd, vd, od, stream, cfg, cfg.seeds[len(checks) - 1],
                                phase.precision))
        row["status"] = OK
        _throughput(row, problem)
        floor_reason = _implausible(row, problem)
        if floor_reason:
            row.update(status=FAIL, reason=floor_reason)
    except Exception as exc:  # one phase crashing must not end the sweep
        row.update(status=ERROR, reason=_summarize_exception(exc))
    return row


def _time_launch(launch, problem, qd, kd, vd, od, stream, cfg, seed, precision=None):
    from numba import cuda

    from .timing import end_to_end, events_batched

    # rotate input sets so that the inputs of small problems are not L2-resident
    sets = [_views(problem, qd, kd, vd, od)]
    l2 = 60 * 2**20
    n_sets = int(min(8, max(1, math.ceil(3 * l2 / max(problem.min_bytes(), 1)))))
    for _ in range(n_sets - 1):
        sets.append(_views(problem, *(cuda.device_array_like(a, stream=stream) for a in (qd, kd, vd, od))))
        for src, dst in zip((qd, kd, vd), sets[-1][:3]):
            dst.copy_to_device(src.reshape(dst.shape), stream=stream)

    def fn(i):
        launch(*sets[i % len(sets)], stream)

    t = events_batched(fn, stream, cfg.timing)
    t["e2e_ms"] = end_to_end(fn, stream)
    t["input_sets"] = len(sets)
    # the timed launches must still compute the right answer: re-check set 0
    od_host = sets[0][3].copy_to_host(stream=stream)
    stream.synchronize()
    q, k, v, ref = _reference(problem, seed)  # the inputs last copied to the device
    c = check(od_host.reshape(problem.out_shape()), ref, dtype=problem.dtype, precision=precision)
    if not c.ok:
        t["post_timing_check"] = c.reason
    return t


def _throughput(row, problem):
    t = row.get("time_ms")
    if t and t > 0:
        row["tflops"] = problem.flops() / (t * 1e-3) / 1e12
        row["gbps"] = problem.min_bytes() / (t * 1e-3) / 1e9


def _implausible(row, problem) -> str:
    t = row.get("time_ms")
    if t is None or not t > 0:
        return f"time {t} ms is not positive"
    if row.get("post_timing_check"):
        return f"wrong result after timing: {row['post_timing_check']}"
    floor_s = max(problem.min_bytes() / MAX_PLAUSIBLE_BYTES_PER_S, problem.flops() / MAX_PLAUSIBLE_FLOPS)
    if t * 1e-3 < floor_s:
        return f"time {t * 1e3:.2f} µs is below the physical floor {floor_s * 1e6:.2f} µs"
    return ""


def _summarize_resources(row):
    res = row.get("resources") or []
    if res:
        row["regs"] = max((r.get("regs") or 0) for r in res)
        row["smem_static"] = max((r.get("smem_static") or 0) for r in res)
        row["local_bytes"] = max((r.get("local_bytes") or 0) for r in res)


# -- isolation -------------------------------------------------------------------


def _worker(conn):
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        kind, payload = task
        try:
            if kind == "phase":
                name, prob, cfgd = payload
                row = measure(name, Problem.from_dict(prob), _cfg_from_dict(cfgd))
            else:
                from .peers import measure_peer

                name, prob, cfgd = payload
                row = measure_peer(name, Problem.from_dict(prob), _cfg_from_dict(cfgd))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            row = {"status": ERROR, "reason": _summarize_exception(exc)}
        conn.send(row)


def _cfg_to_dict(cfg: RunConfig) -> dict:
    d = asdict(cfg)
    return d


def _cfg_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["timing"] = TimingConfig(**d["timing"])
    d["seeds"] = tuple(d["seeds"])
    return RunConfig(**d)


class _Isolated:
    """A persistent worker process; replaced when a row times out or it dies."""

    def __init__(self):
        self.proc = None
        self.conn = None

    def _start(self):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def call(self, task, timeout_s):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(task)
        if self.conn.poll(timeout_s):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            code = self.proc.exitcode if self.proc else None
            self.close(kill=True)
            return {"status": ERROR, "reason": f"worker process died (exit code {code})"}
        if not self.proc.is_alive():
            code = self.proc.exitcode
            self.close(kill=True)
            return {"status": ERROR, "reason": f"worker process died (exit code {code})"}
        self.close(kill=True)
        return {"status": TIMEOUT, "reason": f"timed out after {timeout_s:g} s"}

    def close(self, kill=False):
        if self.proc is not None:
            if kill:
                self.proc.kill()
            else:
                try:
                    self.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc = self.conn = None


# -- the sweep -----------------------------------------------------------------


def _resolve_phases(phases) -> list[Phase]:
    if phases is None:
        return list_phases()
    out = [get_phase(p) if isinstance(p, str) else p for p in phases]
    return sorted(out, key=lambda p: p.order)


class ResultsWriter:
    """Appends JSON lines and flushes each one, so an interrupted run leaves a valid file."""

    def __init__(self, path: str | None):
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(self, record: dict):
        if not self.path:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)


def run(phases=None, problems=None, *, config: RunConfig | None = None, progress=None, **kw) -> list[dict]:
    """Run ``phases`` (names or Phase objects; default all) on ``problems``
    (default: the ``tiny`` preset) and return the result rows.

    Keyword arguments are :class:`RunConfig` fields (``seeds``, ``timeout_s``,
    ``params``, ``results`` path, ...). ``progress(i, n, row_or_None, phase, problem)``
    is called before (row None) and after each row.
    """
    from .env import environment
    from .problem import PRESETS

    cfg = config or RunConfig(**kw)
    plist = _resolve_phases(phases)
    problems = list(problems) if problems is not None else PRESETS["tiny"]
    env = environment(cfg.command)
    run_id = uuid.uuid4().hex[:12]
    writer = ResultsWriter(cfg.results)
    writer.write({"type": "env", "run_id": run_id, **env})
    iso = _Isolated() if cfg.timeout_s else None
    cfgd = _cfg_to_dict(cfg)
    peers = []
    if cfg.peers and not IS_SIMULATOR:
        from .peers import peer_names

        peers = peer_names()
    tasks = [("phase", ph.name, pr) for pr in problems for ph in plist]
    tasks += [("peer", name, pr) for pr in problems for name in peers]
    rows: list[dict] = []
    baseline_time: dict = {}
    try:
        for idx, (kind, name, prob) in enumerate(tasks):
            if progress:
                progress(idx, len(tasks), None, name, prob)
            t0 = time.perf_counter()
            if iso is not None:
                row = iso.call((kind, (name, prob.to_dict(), cfgd)), cfg.timeout_s)
                if row.get("type") != "result":  # timeout/crash: rebuild the row's identity
                    row = _stub_row(kind, name, prob, row)
            elif kind == "phase":
                row = measure(name, prob, cfg)
            else:
                from .peers import measure_peer

                row = measure_peer(name, prob, cfg)
            row["wall_s"] = time.perf_counter() - t0
            row["run_id"] = run_id
            row["commit"] = env.get("commit")
            row["gpu"] = env.get("gpu")
            key = prob
            if kind == "phase" and name == cfg.baseline and row["status"] == OK and row.get("time_ms"):
                baseline_time[key] = row["time_ms"]
            if row.get("time_ms") and key in baseline_time:
                row["speedup"] = baseline_time[key] / row["time_ms"]
            writer.write(row)
            rows.append(row)
            if progress:
                progress(idx, len(tasks), row, name, prob)
    finally:
        if iso is not None:
            iso.close()
    return rows


def _stub_row(kind, name, prob: Problem, info: dict) -> dict:
    row = {"type": "result", "phase": name, "kind": kind, "problem": prob.to_dict(),
           "label": prob.label, "backend": BACKEND, "flops": prob.flops(), "min_bytes": prob.min_bytes()}
    if kind == "phase":
        try:
            ph = get_phase(name)
            row.update(order=ph.order, planned_speedup=ph.planned_speedup)
        except KeyError:
            pass
    row.update(status=info.get("status", ERROR), reason=info.get("reason", ""))
    return row
