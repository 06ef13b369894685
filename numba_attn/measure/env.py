"""The environment a result was obtained in (recorded with every results file).

``environment()`` is written as the first record of every run: date, backend,
git commit (``-dirty`` plus a hash of the diff when the tree has uncommitted
changes), a hash of the package's source files (``source_hash``: identifies
the code even where there is no git checkout, e.g. on a device machine), the
command line, library versions and the GPU (name, SMs, clocks, driver; ``nvml``: where each row's clock and
power readings come from, or ``nvml_note``: why rows have none).
``env_key()`` condenses what makes two measurements comparable (code, GPU,
libraries) into a short key; ``--resume`` only reuses rows with the same key.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

from numba_attn.gpu.backend import BACKEND, IS_SIMULATOR


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(short: bool = False) -> str | None:
    """The commit of the sources: ``NUMBA_ATTN_COMMIT`` when set (a copy of the
    tree shipped to another machine may carry stale git metadata, so the
    caller's word wins), else ``git rev-parse HEAD`` (+ ``-dirty+<diff hash>``)."""
    if os.environ.get("NUMBA_ATTN_COMMIT"):
        return os.environ["NUMBA_ATTN_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        if out.returncode != 0:
            return os.environ.get("NUMBA_ATTN_COMMIT")
        commit = out.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit = commit[:12] if short else commit
        if dirty:
            diff = subprocess.run(["git", "diff", "HEAD"], cwd=root, capture_output=True, timeout=20).stdout
            commit += "-dirty+" + hashlib.sha1(diff).hexdigest()[:8]
        return commit
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("NUMBA_ATTN_COMMIT")


def gpu_info() -> dict:
    if IS_SIMULATOR:
        return {"gpu": "simulator", "sm_count": None, "compute_capability": None}
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    info = {"gpu": name, "sm_count": int(dev.MULTIPROCESSOR_COUNT),
            "compute_capability": ".".join(map(str, dev.compute_capability))}
    try:
        from numba.cuda.cudadrv.driver import driver

        v = driver.get_version()
        info["cuda_driver_api"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    except Exception:  # pragma: no cover - informational only
        pass
    try:
        info["l2_bytes"] = int(dev.L2_CACHE_SIZE)
    except Exception:
        pass
    info.update(nvidia_smi())
    from numba_attn.measure.nvml import environment_fields

    info.update(environment_fields())  # where each row's clock and power readings come from, or why none
    return info


def nvidia_smi() -> dict:
    """Driver version and current/max clocks, as nvidia-smi reports them."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    fields = ["driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.limit",
              "temperature.gpu", "memory.total"]
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    vals = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    keys = ["driver", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "power_limit_w",
            "temperature_c", "memory_mib"]
    return dict(zip(keys, vals))


def source_hash() -> str:
    """sha1 (12 hex digits) over the package's Python sources, phases included."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha1()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:12]


ENV_KEY_FIELDS = ("source_hash", "backend", "gpu", "compute_capability", "numba", "numba_cuda", "numpy",
                  "torch", "python", "driver")


def env_key(env: dict) -> str:
    """Short key of what makes results comparable: code, device and libraries."""
    blob = json.dumps({k: env.get(k) for k in ENV_KEY_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def environment(command: str | None = None) -> dict:
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "backend": BACKEND,
        "commit": git_commit(),
        "source_hash": source_hash(),
        "command": command if command is not None else " ".join(sys.argv),
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
        "numba_cuda": _version("numba-cuda"),
        "llvmlite": _version("llvmlite"),
        "torch": _version("torch"),
    }
    env.update(gpu_info())
    return env
