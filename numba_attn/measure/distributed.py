"""Sweeps on a Ray cluster (tune's candidates, run's and bench's rows): one actor per GPU, rows
streamed back into one results file.

:class:`RayPool` connects to a cluster (``address``: ``"auto"`` joins a running one or starts a
local one, ``"ray://host:10001"`` a remote one) and starts one actor per GPU (``num_gpus=1``; in
the simulator CPU-only actors, ``num_cpus=1``). Each actor reports its host and GPU model; a sweep
refuses actors of different GPU models unless ``allow_mixed`` (a tuning is for one GPU model).
Each actor measures rows through a local :class:`~numba_attn.measure.parallel.LocalWorker`
(so a hung or crashed kernel becomes a TIMEOUT or ERROR row, and a worker process that dies is
replaced and its row retried once, as locally). The parent drives one
actor per lane of :class:`~numba_attn.measure.tune.Workers`: the actor only measures; stamping,
the results file and the cache stay in the parent, so one sweep has one results file. An actor
that dies (its node left the cluster) is replaced by a new one and its row retried once; a second
death is an ERROR row. ``--resume`` skips candidates whose OK rows the results file already has.

Ray is an optional extra: ``pip install -e ".[ray]"``.
"""
from __future__ import annotations

import os

INSTALL_HINT = '--ray needs Ray: pip install -e ".[ray]" (or pip install "ray>=2.9")'


def available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def normal_priority() -> int:
    """Give this process (and the worker process it starts) the normal CPU priority, where allowed;
    returns its niceness. Ray starts its worker processes at niceness 15 (``RAY_worker_niceness``) so
    that its own daemons come first, and a measuring worker inherits it: then its compiler yields
    the CPU to every other process of the host. (A sweep's compilation on Ray actors took 15-19 %
    longer than in one or two local workers: 2× H200, the same 160 kernels; whether the niceness is
    why was not measured there.) Lowering the niceness needs the privilege to (root, or
    CAP_SYS_NICE); without it the process keeps its niceness."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (AttributeError, OSError):
        pass
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return 0


def _actor_class(ray):
    @ray.remote(max_restarts=0)
    class MeasureActor:
        def __init__(self, setup=()):
            from numba_attn.measure.parallel import LocalWorker

            normal_priority()
            # the GPU Ray gave this actor (its CUDA_VISIBLE_DEVICES) is inherited by the worker process;
            # a worker process that dies is replaced and its row retried once, as locally
            self.worker = LocalWorker(setup)

        def identity(self) -> dict:
            import socket

            from numba_attn.measure.env import gpu_info

            return {"host": socket.gethostname(), "gpu": gpu_info()["gpu"], "niceness": normal_priority()}

        def call(self, task, timeout_s):
            return self.worker.call(task, timeout_s)

        def close(self):
            self.worker.close()

    return MeasureActor


class RayPool:
    """Actors on a Ray cluster, one per GPU (``size``: how many; default all GPUs of the cluster,
    in the simulator the cluster's CPUs up to 4)."""

    def __init__(self, address="auto", size=None, *, allow_mixed=False, setup=()):
        import ray

        from numba_attn.gpu.backend import IS_SIMULATOR

        self.ray = ray
        # a local instance started here runs its workers at the normal priority (see normal_priority)
        os.environ.setdefault("RAY_worker_niceness", "0")
        if not ray.is_initialized():
            if address in (None, "auto", "local"):
                try:
                    ray.init(address="auto", ignore_reinit_error=True, log_to_driver=False)
                except ConnectionError:
                    ray.init(ignore_reinit_error=True, log_to_driver=False)
            else:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        res = ray.cluster_resources()
        self.opts = {"num_cpus": 1} if IS_SIMULATOR else {"num_gpus": 1, "num_cpus": 1}
        if size is None:
            size = min(4, int(res.get("CPU", 1))) if IS_SIMULATOR else int(res.get("GPU", 0))
        if size < 1:
            raise RuntimeError(f"the Ray cluster has no GPU (resources: {res})")
        self.size, self.setup, self.allow_mixed = size, tuple(setup), allow_mixed
        self.cls = _actor_class(ray)
        self.actors = [self._new_actor() for _ in range(size)]
        self.identities = ray.get([a.identity.remote() for a in self.actors])
        from numba_attn.measure.devices import check_same_model

        check_same_model([i["gpu"] for i in self.identities], allow_mixed, "the actors")

    def _new_actor(self):
        return self.cls.options(**self.opts).remote(self.setup)

    def describe(self) -> str:
        return f"{self.size} actor(s): " + ", ".join(f"{i['host']} {i['gpu']}" for i in self.identities)

    def make_worker(self, i):
        return RayWorker(self, i)


class RayWorker:
    """Lane i's worker: ``call`` runs the task on actor i, replacing a dead actor and retrying once."""

    def __init__(self, pool: RayPool, i: int):
        self.pool, self.i = pool, i

    def call(self, task, timeout_s) -> dict:
        ray = self.pool.ray
        for attempt in (1, 2):
            actor = self.pool.actors[self.i]
            try:
                row = ray.get(actor.call.remote(task, timeout_s))
                if isinstance(row, dict):
                    row.setdefault("host", self.pool.identities[self.i]["host"])
                return row
            except ray.exceptions.RayActorError as exc:
                self.pool.actors[self.i] = self.pool._new_actor()
                self.pool.identities[self.i] = ray.get(self.pool.actors[self.i].identity.remote())
                if attempt == 2:
                    return {"status": "ERROR", "reason": f"the Ray actor died twice ({exc})"}
        return {"status": "ERROR", "reason": "unreachable"}

    def close(self):
        try:
            self.pool.ray.get(self.pool.actors[self.i].close.remote())
            self.pool.ray.kill(self.pool.actors[self.i])
        except Exception:  # noqa: BLE001
            pass
