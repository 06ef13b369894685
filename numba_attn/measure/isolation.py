"""Process isolation: rows run in a worker process that is killed and replaced when a row overruns.

With a ``timeout_s``, the sweep hands each row to a persistent :class:`WorkerProcess`; a row
that overruns becomes ``TIMEOUT`` (the worker is killed and replaced, so one hung kernel does
not stall the sweep), and a worker whose CUDA context was poisoned by a kernel fault (illegal
address, ...) or that died is replaced too. A worker exits when its parent dies.

A task is ``(kind, payload)`` with plain-data payloads: ``("phase", (name, problem_dict,
config_dict))``, ``("peer", ...)``, ``("ceilings", (names, config_dict))`` or ``("rounds", (keys,
config_dict))`` (a problem's rows timed again in interleaved rounds, :mod:`numba_attn.measure.regime`:
its rows' timed functions are kept in the process that measured them); :func:`run_task` runs one, in the
worker or in-process.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import threading
import time

from numba_attn.spec.problem import Problem
from numba_attn.measure.config import config_from_dict
from numba_attn.measure.row import measure
from numba_attn.measure.status import ERROR, OK, TIMEOUT, classify_exception, summarize_exception


def call_setup(spec: str):
    """Import ``module`` and call ``function`` of a ``"module:function"`` spec (``"module"``: import only).
    The module may also be a ``.py`` file or a directory of them (``"path/my_phase.py"``, ``"my_phases/"``,
    ``"path/file.py:function"``): its phases are registered by :func:`numba_attn.userphases.load_phases`'s
    loader, the file imported as ``numba_attn_user.<stem>``."""
    from numba_attn import userphases

    target, fn = userphases.split_setup(spec)
    if userphases.is_path_spec(target):
        m, _ = userphases.load_spec(target)
        if fn:
            if m is None:
                raise ValueError(f"--setup {spec!r}: a function needs a file, not a directory")
            getattr(m, fn)()
        return
    m = importlib.import_module(target)
    if fn:
        getattr(m, fn)()


def worker_setup(setup) -> tuple:
    """The setup specs a worker process runs: ``setup``, then the files and modules that
    ``numba_attn.load_phases`` loaded in this process (phases registered from a notebook)."""
    from numba_attn import userphases

    setup = tuple(setup)
    return setup + tuple(s for s in userphases.worker_specs() if s not in setup)


def run_task(kind, payload) -> dict:
    """Run one task (see the module docstring) and return its row (or ``{"rows": ...}`` for ceilings, the
    rounds' result for ``rounds``)."""
    if kind in ("phase", "peer"):
        from numba_attn.measure.peer_rows import measure_peer
        from numba_attn.measure.regime import holding, outcome

        name, prob, cfgd = payload
        cfg = config_from_dict(cfgd)
        with holding(kind, name, prob, cfg.hold):
            row = (measure if kind == "phase" else measure_peer)(name, Problem.from_dict(prob), cfg)
        if cfg.hold:
            row["_held"] = outcome(kind, name)  # (the sweep takes it out of the row)
        return row
    if kind == "rounds":
        from numba_attn.measure.regime import run_held_rounds

        keys, cfgd = payload
        cfg = config_from_dict(cfgd)
        return run_held_rounds(keys, cfg.timing, cfg.rounds)
    if kind == "ceilings":
        from numba_attn.measure.ceilings import measure_all

        names, cfgd = payload
        return {"type": "ceilings", "rows": measure_all(names, config_from_dict(cfgd).timing), "status": OK}
    raise ValueError(f"unknown task kind {kind!r}")


def _watch_parent(ppid: int):
    """Exit when the parent dies (killed sweep): a hung kernel must not outlive it."""

    def loop():
        while True:
            time.sleep(1.0)
            if os.getppid() != ppid:
                os._exit(3)

    threading.Thread(target=loop, daemon=True, name="numba-attn-parent-watch").start()


def identity() -> dict:
    """This process's host, pid, ``CUDA_VISIBLE_DEVICES`` and GPU (model and UUID; "simulator")."""
    import socket

    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.env import gpu_info

    out = {"host": socket.gethostname(), "pid": os.getpid(),
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu": gpu_info()["gpu"]}
    try:
        out["affinity"] = len(os.sched_getaffinity(0))  # the CPUs it may run on
    except (AttributeError, OSError):
        pass
    try:
        out["niceness"] = os.getpriority(os.PRIO_PROCESS, 0)  # its CPU priority (Ray's workers: 15)
    except (AttributeError, OSError):
        pass
    if not IS_SIMULATOR:
        try:
            from numba import cuda

            out["gpu_uuid"] = str(cuda.get_current_device().uuid)
        except Exception:  # noqa: BLE001 - informational
            pass
    return out


def apply_cpu_share():
    """Pin this process to the CPUs of ``NUMBA_ATTN_CPUS`` (comma-separated ids; set by a pool of
    several local workers, each its own share); nothing when unset or not supported."""
    spec = os.environ.get("NUMBA_ATTN_CPUS", "").strip()
    if not spec:
        return
    try:
        os.sched_setaffinity(0, {int(c) for c in spec.split(",") if c.strip()})
    except (AttributeError, OSError, ValueError):
        pass


def _exit_now():
    """A worker told to stop has sent every row: it leaves at once, without the interpreter's teardown
    (its modules, CUDA context and finalizers: measured 5-8 s per worker after a 263-kernel sweep, during
    which the command waited). The driver frees the process's GPU resources when it exits."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # noqa: BLE001 - a closed stream
            pass
    os._exit(0)


def _worker(conn, setup, ppid=None, identify=False):
    apply_cpu_share()
    if ppid is not None:
        _watch_parent(ppid)
    try:
        for spec in setup:
            call_setup(spec)
        conn.send(("ready", identity() if identify else None))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("setup_failed", summarize_exception(exc)))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            _exit_now()
        kind, payload = task
        try:
            row = run_task(kind, payload)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            status, why, poisoned = classify_exception(exc)
            row = {"status": status, "reason": why, "context_poisoned": poisoned}
        conn.send(row)
        if row.get("context_poisoned"):
            return  # a CUDA fault leaves the context unusable: the parent starts a new worker


_ENV_LOCK = threading.Lock()


class WorkerProcess:
    """A persistent worker process; replaced when a row times out, it dies, or
    a CUDA fault poisons its context. The row's time limit starts once the
    worker is ready (imports and setup are not charged to the row)."""

    START_TIMEOUT_S = 300.0

    def __init__(self, setup=(), env=None, identify=False):
        self.proc = None
        self.conn = None
        self.setup = tuple(setup)
        self.env = dict(env or {})  # set in the worker's environment before it starts (CUDA_VISIBLE_DEVICES)
        self.identify = identify  # the worker reports identity() when ready: kept in self.identity
        self.identity = None

    def _start(self):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        setup = worker_setup(self.setup)
        args = (child, setup, os.getpid(), True) if self.identify else (child, setup, os.getpid())
        self.proc = ctx.Process(target=_worker, args=args, daemon=True)
        if self.env:
            # the child's environment is this process's at spawn time: set it there, for this start only,
            # before the child imports numba (CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises)
            with _ENV_LOCK:
                saved = {k: os.environ.get(k) for k in self.env}
                os.environ.update(self.env)
                try:
                    self.proc.start()
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
        else:
            self.proc.start()
        child.close()
        if not self.conn.poll(self.START_TIMEOUT_S):
            self.close(kill=True)
            raise RuntimeError(f"worker process did not start within {self.START_TIMEOUT_S:g} s")
        try:
            msg, info = self.conn.recv()
        except EOFError:
            code = self.proc.exitcode
            self.close(kill=True)
            raise RuntimeError(f"worker process died while starting (exit code {code})") from None
        if msg != "ready":
            self.close(kill=True)
            raise RuntimeError(f"worker setup failed: {info}")
        if self.identify:
            self.identity = info

    def call(self, task, timeout_s) -> dict:
        """Run ``task`` in the worker; a row, or ``{"status", "reason"}`` when the worker
        could not start, died or overran ``timeout_s`` (then it is killed)."""
        if self.proc is None or not self.proc.is_alive():
            try:
                self._start()
            except RuntimeError as exc:
                return {"status": ERROR, "reason": str(exc)}
        self.conn.send(task)
        if self.conn.poll(timeout_s):
            try:
                row = self.conn.recv()
            except EOFError:
                code = self.proc.exitcode if self.proc else None
                self.close(kill=True)
                return {"status": ERROR, "reason": f"worker process died (exit code {code})", "worker_died": True}
            if row.get("context_poisoned"):
                self.close(kill=True)
            return row
        if not self.proc.is_alive():
            code = self.proc.exitcode
            self.close(kill=True)
            return {"status": ERROR, "reason": f"worker process died (exit code {code})", "worker_died": True}
        self.close(kill=True)
        return {"status": TIMEOUT, "reason": f"timed out after {timeout_s:g} s (worker killed and replaced)"}

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
                self.proc.join(5)
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.proc = self.conn = None
