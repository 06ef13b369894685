"""Sweeps on several workers: lanes over one Sweep, local worker processes pinned one GPU each.

:class:`Workers` runs the rows of a sweep (``tune``'s candidates, ``run``'s and ``bench``'s
(phase, problem) tasks) on ``n`` lanes side by side. A lane is a shallow copy of the
:class:`~numba_attn.measure.sweep.Sweep` (same run id, environment record, resumed rows, baselines
and results writer; its own worker), driven by a thread of this process, so every row goes through
:meth:`Sweep.run_task` unchanged and is written by the one results writer (one line per row, under a
lock); ``resume`` skips finished rows in every lane alike.

A lane's worker is a :class:`LocalWorker` (a :class:`~numba_attn.measure.isolation.WorkerProcess`
whose ``CUDA_VISIBLE_DEVICES`` is its own GPU, see :mod:`numba_attn.measure.devices`) or a Ray
actor (:mod:`numba_attn.measure.distributed`). Either way a worker that dies while measuring a row
(its process killed, a segmentation fault, its node gone) is replaced and the row retried once; a
second death is an ERROR row. A row that overruns its time limit is a TIMEOUT row, as in a
single-worker sweep (a hung kernel would hang again). Every row of a worker records it in its
``worker`` field: host, pid, ``cuda_visible_devices``, the GPU model and UUID the worker sees
(``gpu``, ``gpu_uuid``; ``gpu_index``: nvidia-smi's index when known), and its lane; a row retried
after a death says so in ``retried``.
"""
from __future__ import annotations

import copy
import os
import dataclasses
import threading

from numba_attn.measure.devices import assign_devices, check_same_model, visible_devices
from numba_attn.measure.isolation import WorkerProcess


# the thread pools of the libraries a worker uses (OpenMP: torch; OpenBLAS, MKL: NumPy) and of the
# input draws (numba_attn.spec.rand); each defaults to every core of the host
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_ATTN_THREADS")


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def _topology(cpu: int):
    """(package, core) of a logical CPU from Linux's sysfs, or None where it cannot be read."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as f:
            pkg = int(f.read())
        with open(base + "core_id") as f:
            core = int(f.read())
        return pkg, core
    except (OSError, ValueError):
        return None


def by_core(cpus, topology=_topology) -> list[int]:
    """``cpus`` ordered so that the hardware threads of one physical core are neighbours (package, core,
    then CPU id), so contiguous shares hold whole cores: Linux often numbers a core's two threads n and
    n + cores, and halves by id would then put two workers' compilers on the two threads of every core.
    Unchanged where the topology cannot be read."""
    cpus = list(cpus)
    keys = {c: topology(c) for c in cpus}
    if any(k is None for k in keys.values()):
        return cpus
    return sorted(cpus, key=lambda c: (keys[c], c))


def cpu_shares(n: int, cpus=None, topology=_topology) -> list[list[int]]:
    """``n`` disjoint, contiguous shares of ``cpus`` (default: this process's), as even as possible,
    each at least one CPU (shares repeat when there are fewer CPUs than workers); a physical core's
    hardware threads stay in one share where the shares allow (:func:`by_core`)."""
    cpus = by_core(cpus if cpus is not None else available_cpus(), topology)
    if n <= 0 or not cpus:
        return []
    if len(cpus) < n:
        return [[cpus[i % len(cpus)]] for i in range(n)]
    base, extra = divmod(len(cpus), n)
    out, at = [], 0
    for i in range(n):
        k = base + (1 if i < extra else 0)
        out.append(cpus[at:at + k])
        at += k
    return out


def share_env(cpus: list[int]) -> dict:
    """A worker's environment for its CPU share: the thread pools sized to it (where this process's
    environment does not already size them) and ``NUMBA_ATTN_CPUS``, which the worker applies as its
    affinity when it starts (:func:`numba_attn.measure.isolation.apply_cpu_share`)."""
    env = {k: str(len(cpus)) for k in THREAD_ENV if not os.environ.get(k)}
    env["NUMBA_ATTN_CPUS"] = ",".join(str(c) for c in cpus)
    return env


class LocalWorker(WorkerProcess):
    """Lane ``lane``'s worker process on ``device`` (a :class:`~numba_attn.measure.devices.Device`,
    or None: the process's own environment, e.g. in the simulator); see the module docstring.
    ``cpus``: its share of the host's CPUs when several workers share the host (None: all of them),
    so that the libraries' thread pools, sized to every core by default, do not oversubscribe the
    host n times over."""

    def __init__(self, setup=(), device=None, lane: int = 0, cpus=None):
        env = {"CUDA_VISIBLE_DEVICES": device.token} if device is not None else {}
        if cpus:
            env.update(share_env(cpus))
        super().__init__(setup, env=env, identify=True)
        self.cpus = list(cpus) if cpus else None
        self.device, self.lane = device, lane

    def start(self) -> dict:
        """Start the process now (else at the first row) and return its identity."""
        if self.proc is None or not self.proc.is_alive():
            self._start()
        return self.record()

    def record(self) -> dict:
        rec = dict(self.identity or {})
        rec["lane"] = self.lane
        if self.cpus:
            rec["cpus"] = len(self.cpus)
        if self.device is not None:
            rec.setdefault("cuda_visible_devices", self.device.token)
            if self.device.uuid:
                rec.setdefault("gpu_uuid", self.device.uuid)
            if self.device.index is not None:
                rec.setdefault("gpu_index", self.device.index)  # nvidia-smi's index
        return rec

    def call(self, task, timeout_s) -> dict:
        row = super().call(task, timeout_s)
        if row.get("worker_died"):
            first = row.get("reason", "")
            row = super().call(task, timeout_s)  # a new process: the row is retried once
            if row.get("worker_died"):
                row["reason"] = f"{row.get('reason', '')} twice (the row was retried once in a new worker process)"
            else:
                row["retried"] = f"{first}; retried once in a new worker process"
        row["worker"] = self.record()
        return row


class LocalPool:
    """``n`` local workers; ``devices``: one per worker (None: no ``CUDA_VISIBLE_DEVICES`` of their
    own; ``"auto"``: the visible GPUs, refused when fewer than ``n`` unless ``oversubscribe``; in the
    simulator none). ``start()`` starts them side by side and refuses different GPU models (as
    reported by each worker) unless ``allow_mixed``."""

    def __init__(self, n: int, setup=(), devices="auto", *, oversubscribe=False, allow_mixed=False):
        if devices == "auto":
            from numba_attn.gpu.backend import IS_SIMULATOR

            devices = None if IS_SIMULATOR else assign_devices(n, visible_devices(), oversubscribe)
        elif devices is not None:
            devices = list(devices)
            if len(devices) < n:
                devices = assign_devices(n, devices, oversubscribe)
        self.size, self.allow_mixed = n, allow_mixed
        check_same_model([d.model for d in devices or ()], allow_mixed, "the visible GPUs")
        shares = cpu_shares(n) if n > 1 else [None]  # several workers: each its own share of the CPUs
        self.workers = [LocalWorker(setup, devices[i] if devices else None, i, shares[i]) for i in range(n)]
        self.identities: list = []

    def start(self) -> list:
        out: list = [None] * self.size
        errors: list = []

        def go(i):
            try:
                out[i] = self.workers[i].start()
            except RuntimeError as exc:
                errors.append(f"worker {i}: {exc}")

        threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.close()
            raise RuntimeError("; ".join(errors))
        self.identities = out
        try:
            check_same_model([i.get("gpu") for i in out], self.allow_mixed)
        except RuntimeError:
            self.close()
            raise
        return out

    def describe(self) -> str:
        ids = self.identities or [w.record() for w in self.workers]
        return f"{self.size} local worker(s): " + ", ".join(
            f"{i.get('gpu') or '?'}" + (f" (CUDA_VISIBLE_DEVICES={i['cuda_visible_devices']})"
                                        if i.get("cuda_visible_devices") else "") for i in ids)

    def make_worker(self, i):
        return self.workers[i]

    def close(self):
        threads = [threading.Thread(target=w.close, daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


class _LockedWriter:
    def __init__(self, writer):
        self.writer = writer
        self.lock = threading.Lock()

    def write(self, record):
        with self.lock:
            self.writer.write(record)


class SharedState:
    """What the lanes of one run share: the timing cross-check (claimed by one row) and, per problem,
    whether its baseline row is done (a row's speedup waits for it, as in a single-worker run)."""

    def __init__(self, baseline: str | None = None, tasks=()):
        self.lock = threading.Lock()
        self.timing_claimed = False
        self.baseline = baseline
        self.pending = {prob.label + repr(prob.to_dict()): threading.Event()
                        for kind, name, prob in tasks if kind == "phase" and name == baseline}

    def claim_timing_check(self) -> bool:
        with self.lock:
            if self.timing_claimed:
                return False
            self.timing_claimed = True
            return True

    def _event(self, prob):
        return self.pending.get(prob.label + repr(prob.to_dict()))

    def wait_for_baseline(self, kind, name, prob):
        if kind == "phase" and name == self.baseline:
            return
        ev = self._event(prob)
        if ev is not None:
            ev.wait()

    def done(self, kind, name, prob):
        if kind == "phase" and name == self.baseline:
            ev = self._event(prob)
            if ev is not None:
                ev.set()


class Workers:
    """``n`` measuring lanes over one Sweep (see the module docstring). ``make_worker(i)`` gives lane
    i's worker (an object with ``call(task, timeout_s)`` and ``close()``); without it lane 0 keeps the
    sweep's worker (None: rows in-process) and the others get a :class:`WorkerProcess`."""

    def __init__(self, sweep, n: int, make_worker=None):
        self.sweep = sweep
        sweep.writer = _LockedWriter(sweep.writer)
        self.lanes = []
        for i in range(n):
            lane = copy.copy(sweep)
            if make_worker is not None:
                lane.worker = make_worker(i)
            elif i > 0 or sweep.worker is None and n > 1:
                lane.worker = WorkerProcess(sweep.cfg.worker_setup)
            self.lanes.append(lane)
        self.lock = threading.Lock()

    def close(self):
        """Close the lanes' workers at once: a worker process's exit (its CUDA context and libraries torn
        down) takes a while, and one after another the sweep would wait for each in turn."""
        threads = [threading.Thread(target=lane.worker.close, daemon=True) for lane in self.lanes
                   if lane.worker is not None]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def share(self, shared: SharedState, progress=None):
        """Let the lanes share ``shared`` and report through ``progress`` (called under a lock)."""
        for lane in self.lanes:
            lane.shared = shared
            if progress is not None:
                lane.progress = progress

    def run(self, jobs, on_row, stop=None, lanes=None):
        """Measure ``jobs`` (an iterator of ``(idx, n, kind, name, problem, params[, tag])``, pulled under
        a lock so a strategy can ask for the next candidate after seeing rows; ``params`` None: the
        sweep's own, else the phase's requested parameters; ``tag``: the rows' ``round``, a repeat kept
        apart from the first measurement) on the lanes (``lanes``: only those, by index); ``on_row(job,
        row)`` after each row; ``stop()`` true: no job is started any more. An item may be a list of jobs:
        one lane measures them in a row (candidates that share compiled kernels). An exception in a lane
        stops the others from starting rows and is raised here."""
        it = iter(jobs)
        failed: list = []

        def lane_loop(lane):
            todo: list = []
            while True:
                with self.lock:
                    if failed or (stop is not None and stop()):
                        return
                    if not todo:
                        item = next(it, None)
                        if item is None:
                            return
                        todo = list(item) if isinstance(item, list) else [item]
                    job = todo.pop(0)
                idx, n, kind, name, prob, params = job[:6]
                lane.row_tag = job[6] if len(job) > 6 else None
                if params is not None:
                    lane.cfg = dataclasses.replace(self.sweep.cfg, params={name: params})
                before = len(lane.rows)
                try:
                    lane.run_task(idx, n, kind, name, prob)
                except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
                    failed.append(exc)
                    return
                finally:
                    shared = getattr(lane, "shared", None)
                    if shared is not None:
                        shared.done(kind, name, prob)
                row = lane.rows[before] if len(lane.rows) > before else None
                with self.lock:
                    on_row(job, row)

        for lane in self.lanes:
            lane.rows = []
        chosen = self.lanes if lanes is None else [self.lanes[i] for i in lanes]
        threads = [threading.Thread(target=lane_loop, args=(lane,), daemon=True) for lane in chosen]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for lane in chosen:
            self.sweep.rows.extend(lane.rows)
            lane.row_tag = None
        if failed:
            raise failed[0]


class CountingProgress:
    """A sweep's ``progress`` for lanes: called under a lock, the rows numbered in the order they
    finish (so "i/n" and the ETA count finished rows)."""

    def __init__(self, progress):
        self.progress = progress
        self.lock = threading.Lock()
        self.finished = 0

    def __call__(self, i, n, row, name, problem):
        with self.lock:
            if problem is None:  # the ceilings
                return self.progress(i, n, row, name, problem)
            k = self.finished
            if row is not None:
                self.finished += 1
            return self.progress(k, n, row, name, problem)
