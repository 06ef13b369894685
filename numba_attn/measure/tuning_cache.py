"""The tuning cache: the best configuration per (GPU model, problem key) and phase, that ``numba-attn tune``
writes (:mod:`numba_attn.measure.tune`) and ``attention()`` reads (:func:`cached_params`)."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile

from numba_attn.measure.config import default_results_dir

WRITE_HOOKS: list = []  # called after this process writes a tuning cache (numba_attn.plans registers its own)

try:
    import fcntl
except ImportError:  # Windows: no lock
    fcntl = None

CACHE_ENV = "NUMBA_ATTN_TUNING_CACHE"


def default_cache_path() -> str:
    """``$NUMBA_ATTN_TUNING_CACHE``, else ``tuning-cache.json`` in the per-user results directory."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.expanduser(env)
    return os.path.join(default_results_dir(), "tuning-cache.json")


def length_bucket(n: int) -> int:
    """The power of two at or above ``n`` (the kv_len bucket of a cache key)."""
    b = 1
    while b < n:
        b *= 2
    return b


def cache_key(gpu: str, problem) -> str:
    """The cache key of ``problem`` on a ``gpu`` model: dtype, causal, head_dim, the GQA ratio
    (query heads per KV head), decode (q_len == 1) or prefill, and the power-of-two bucket of
    kv_len. Batch and head counts are not part of it."""
    group = problem.heads // problem.kv_heads
    mode = "q1" if problem.q_len == 1 else "prefill"
    return (f"{gpu}|{problem.dtype}|{'causal' if problem.causal else 'full'}|D{problem.head_dim}|G{group}"
            f"|{mode}|kv{length_bucket(problem.kv_len)}")


@contextlib.contextmanager
def _file_lock(path: str):
    if fcntl is None:
        yield
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class TuningCache:
    """The tuning cache: ``{"version": 1, "entries": {key: {"phases": {phase: entry}, "best_phase":
    name}}}`` with :func:`cache_key` keys; an entry holds ``params`` (the requested values of the
    best configuration), ``resolved`` (what ran), ``time_ms`` (null in the simulator), the
    ``results`` file, ``commit``, ``run_id``, the problem ``label`` and ``updated`` (a Unix time).
    ``best_phase`` is the phase with the least time among the key's entries (without times: the one
    the last tuning chose; measured on first use: the one it chose). Written atomically (a temporary
    file renamed over it) under an exclusive lock on ``<path>.lock``, re-read inside the lock, so
    concurrent tunings merge."""

    def __init__(self, path: str | None = None):
        self.path = path or default_cache_path()

    def load(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {"version": 1, "entries": {}}
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: not a tuning cache ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise ValueError(f"{self.path}: not a tuning cache (no 'entries' object)")
        return data

    def lookup(self, gpu: str, problem, phase: str | None = None):
        """The entry of ``phase`` (or, when None, of the key's best phase, with ``"phase"`` set) for
        ``problem`` on ``gpu``; None when there is none."""
        try:
            group = self.load()["entries"].get(cache_key(gpu, problem))
        except ValueError:
            return None
        if not group:
            return None
        name = phase or group.get("best_phase")
        entry = group.get("phases", {}).get(name)
        return {**entry, "phase": name} if entry else None

    def update(self, updates: list[tuple[str, str, dict, bool]], best: str | None = None):
        """Merge ``(key, phase, entry, chosen)`` tuples: an existing entry is replaced when the new
        one is faster, or when either has no time (the newer tuning wins); ``chosen`` marks the
        phase the tuning chose for the key (used as best_phase when no entry of the key is timed).
        ``best``: the keys' best_phase instead of the least time (first use's choice within its margin)."""
        with _file_lock(self.path):
            data = self.load()
            for key, phase, entry, chosen in updates:
                group = data["entries"].setdefault(key, {"phases": {}})
                old = group["phases"].get(phase)
                if old is None or old.get("time_ms") is None or entry.get("time_ms") is None \
                        or entry["time_ms"] <= old["time_ms"]:
                    group["phases"][phase] = entry
                timed = {n: e["time_ms"] for n, e in group["phases"].items() if e.get("time_ms")}
                if timed:
                    group["best_phase"] = min(timed, key=timed.get)
                elif chosen or "best_phase" not in group:
                    group["best_phase"] = phase
            for key, _, _, _ in updates if best else ():
                data["entries"][key]["best_phase"] = best
            d = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tuning-cache.", dir=d)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
            finally:
                for hook in WRITE_HOOKS:  # (numba_attn.plans: this process's plans see the entries at their next call)
                    hook()

    def format(self) -> str:
        data = self.load()
        lines = [f"tuning cache {self.path}: {len(data['entries'])} key(s)"]
        for key in sorted(data["entries"]):
            group = data["entries"][key]
            lines.append(f"{key}  best: {group.get('best_phase')}")
            for name, e in sorted(group.get("phases", {}).items()):
                t = f"{e['time_ms']:.4g} ms" if e.get("time_ms") else "untimed (simulator)"
                lines.append(f"  {name:22s} {json.dumps(e.get('params', {}), sort_keys=True)}  {t}  "
                             f"[{e.get('results')} {e.get('commit') or ''}]")
        return "\n".join(lines)


def cached_params(problem, phase_name: str | None = None, gpu: str | None = None):
    """``(phase, params, path)`` from the tuning cache for ``problem`` on this GPU model (the key's
    best phase when ``phase_name`` is None), or None."""
    path = default_cache_path()
    if not os.path.exists(path):
        return None
    if gpu is None:
        from numba_attn.measure.env import gpu_info

        gpu = gpu_info()["gpu"]
    entry = TuningCache(path).lookup(gpu, problem, phase_name)
    if not entry or not isinstance(entry.get("params"), dict):
        return None
    return entry["phase"], dict(entry["params"]), path
