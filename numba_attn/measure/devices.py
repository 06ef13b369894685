"""The GPUs a sweep's local workers may use, found without initialising CUDA in this process.

:func:`visible_devices` lists them:

1. ``CUDA_VISIBLE_DEVICES`` set: its comma-separated entries, in order (indexes, ``GPU-``/``MIG-``
   UUIDs or their prefixes); an empty value or ``-1`` means no GPU. Each entry is what a worker gets as
   its own ``CUDA_VISIBLE_DEVICES``, so the i-th worker runs on the i-th listed device, whatever
   ordering the user's entries assumed.
2. Else ``nvidia-smi -L`` (one line per GPU: index, model, UUID): each worker gets a GPU's UUID, which
   names one device whatever ``CUDA_DEVICE_ORDER`` says.
3. Else (no ``nvidia-smi``) numba's ``len(cuda.gpus)`` in a child process, entries ``0 .. n-1``.

The model and UUID of an entry come from ``nvidia-smi -L`` when it runs (entries matched by index or
UUID); otherwise they are unknown here, and each worker reports its own when it starts.
:func:`assign_devices` gives worker i its entry (more workers than devices only with
``oversubscribe``); :func:`check_same_model` refuses a sweep over different GPU models unless
``allow_mixed`` (a tuning or a results file is for one model).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys

ENV = "CUDA_VISIBLE_DEVICES"
_SMI_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")


@dataclasses.dataclass(frozen=True)
class Device:
    """One GPU a worker may own: ``token`` is the worker's ``CUDA_VISIBLE_DEVICES``."""

    token: str
    index: int | None = None  # nvidia-smi's index, when known
    model: str | None = None
    uuid: str | None = None

    def describe(self) -> str:
        return f"{self.token}" + (f" ({self.model})" if self.model else "")


def parse_nvidia_smi_list(text: str) -> list[Device]:
    """The GPUs of ``nvidia-smi -L`` output (MIG lines under a GPU are not listed)."""
    out = []
    for line in text.splitlines():
        m = _SMI_LINE.match(line.strip())
        if m:
            out.append(Device(token=m.group(3), index=int(m.group(1)), model=m.group(2), uuid=m.group(3)))
    return out


def nvidia_smi_list() -> str | None:
    """``nvidia-smi -L``'s output, or None when it is not there or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def _count_in_child() -> int:
    code = "from numba import cuda\ntry:\n    print(len(cuda.gpus))\nexcept Exception:\n    print(0)\n"
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
        return int(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0


def visible_devices(env: dict | None = None, smi_text: str | None = None, count_in_child=_count_in_child) -> list:
    """The devices this process may hand to workers (see the module docstring). ``env`` (default
    ``os.environ``) and ``smi_text`` (default: run ``nvidia-smi -L``) are for tests."""
    env = os.environ if env is None else env
    if smi_text is None:
        smi_text = nvidia_smi_list()
    listed = parse_nvidia_smi_list(smi_text) if smi_text else []
    value = env.get(ENV)
    if value is None:
        if listed:
            return listed
        return [Device(token=str(i), index=i) for i in range(count_in_child())]
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    out = []
    for tok in tokens:
        if tok.startswith("-"):  # CUDA stops at the first invalid entry; -1 hides every GPU
            break
        match = None
        if tok.isdigit():
            match = next((d for d in listed if d.index == int(tok)), None)
        else:
            match = next((d for d in listed if d.uuid and d.uuid.startswith(tok)), None)
        out.append(Device(token=tok, index=match.index if match else (int(tok) if tok.isdigit() else None),
                          model=match.model if match else None, uuid=match.uuid if match else None))
    return out


def assign_devices(n: int, devices: list, oversubscribe: bool = False) -> list:
    """Worker i's device: ``devices[i]``; with ``oversubscribe``, more workers than devices share
    them round-robin. Raises ValueError when ``n`` exceeds the devices without it."""
    if n < 1:
        raise ValueError(f"--workers must be >= 1, got {n}")
    if not devices:
        raise ValueError(f"--workers {n}: no visible GPU ({ENV}={os.environ.get(ENV)!r}; nvidia-smi -L lists none)")
    if n > len(devices) and not oversubscribe:
        listed = ", ".join(d.describe() for d in devices)
        raise ValueError(f"--workers {n}: only {len(devices)} GPU(s) visible ({listed}); one worker per GPU "
                         f"(pass --oversubscribe to share GPUs between workers)")
    return [devices[i % len(devices)] for i in range(n)]


def check_same_model(models, allow_mixed: bool = False, what: str = "the workers"):
    """Refuse different GPU models (unknown ones, None, are left out) unless ``allow_mixed``."""
    found = sorted({m for m in models if m})
    if len(found) > 1 and not allow_mixed:
        raise RuntimeError(f"{what} run on different GPU models ({', '.join(found)}); a sweep is for one "
                           f"model: pass --allow-mixed to run anyway")
    return found
