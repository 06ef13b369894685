"""The pools of ``--workers`` and ``--ray`` (``numba-attn run``, ``bench``, ``tune``): local worker processes
pinned one GPU each (:class:`~numba_attn.measure.parallel.LocalPool`) or Ray actors
(:mod:`numba_attn.measure.distributed`), and how many workers a command gets by default."""
from __future__ import annotations

import sys

from numba_attn.measure.devices import visible_devices
from numba_attn.measure.parallel import LocalPool, available_cpus


def check_ray(args) -> bool:
    """False (after saying how to install it) when --ray is given and Ray is not installed."""
    if getattr(args, "ray", None) is None:
        return True
    from numba_attn.measure import distributed

    if distributed.available():
        return True
    print(f"numba-attn: {distributed.INSTALL_HINT}", file=sys.stderr)
    return False


def worker_pool(args, default=None):
    """``(workers, make_worker)`` of --workers / --ray: a Ray pool, or a started
    :class:`~numba_attn.measure.parallel.LocalPool` (one GPU per worker); ``(default, None)`` when
    neither is given (None: one after the other, as without these options)."""
    if args.ray is not None:
        from numba_attn.measure import distributed

        try:
            pool = distributed.RayPool(args.ray, args.workers, allow_mixed=args.allow_mixed, setup=tuple(args.setup))
        except RuntimeError as exc:
            raise SystemExit(f"--ray: {exc}") from None
        print(f"ray: {pool.describe()}", flush=True)
        return pool.size, pool.make_worker
    n = args.workers if args.workers is not None else default
    if n is None:
        return None, None
    if n < 1:
        raise SystemExit(f"--workers must be >= 1, got {n}")
    if args.workers is None and n == 1:
        return 1, None
    try:
        pool = LocalPool(n, tuple(args.setup), oversubscribe=args.oversubscribe, allow_mixed=args.allow_mixed)
        pool.start()
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(str(exc)) from None
    print(f"workers: {pool.describe()}", flush=True)
    return n, pool.make_worker


SIM_WORKERS_MAX = 4  # simulator rows are CPU-bound: one worker process per core, at most this many


def simulator_workers(be, phases, problems) -> int | None:
    """The simulator's default --workers: one process per available core (at most ``SIM_WORKERS_MAX``) when the
    run has rows enough to share (every phase, or at least as many rows as workers); None on a GPU, where rows
    run one after another unless --workers says otherwise (they would share one GPU's clock and memory)."""
    if not be.IS_SIMULATOR:
        return None
    n = min(len(available_cpus()), SIM_WORKERS_MAX)
    rows = None if phases is None else len(phases) * max(len(problems), 1)
    if n < 2 or (rows is not None and rows < n):
        return None
    return n


def visible_gpus() -> int:
    """The GPUs local workers may use, counted without initialising CUDA here (``CUDA_VISIBLE_DEVICES``,
    else ``nvidia-smi -L``, else numba in a child process: :mod:`numba_attn.measure.devices`); at least 1."""
    return max(1, len(visible_devices()))
