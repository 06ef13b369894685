"""What became of a row: the five statuses, and how an exception raised by a phase maps to one.

``OK`` checked (and on the GPU timed); ``FAIL`` a wrong result or an implausible time (never
timed after a wrong result); ``ERROR`` an exception; ``TIMEOUT`` the row overran its time limit
(its worker process was killed); ``SKIP`` the phase does not support the problem, the problem
does not fit the device, or the run's limits were reached, with the reason.
"""
from __future__ import annotations

import os
import traceback

from numba_attn.measure.limits import DeviceLimitError

OK, FAIL, ERROR, TIMEOUT, SKIP = "OK", "FAIL", "ERROR", "TIMEOUT", "SKIP"

# CUDA errors after which the context is unusable: the worker must be replaced.
STICKY_ERRORS = ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
                 "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
                 "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT")
# Errors that mean "this configuration does not fit the device": SKIP with the reason.
LIMIT_ERRORS = ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                "too many resources requested", "uses too much shared data", "too much shared data",
                "CUDA_ERROR_INVALID_VALUE", "exceeds the device limit", "DeviceLimitError")


def summarize_exception(exc: BaseException) -> str:
    """``Type: first line of the message (at file:line in function)``, the frame being the
    innermost one in this package (a phase, usually)."""
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


def classify_exception(exc: BaseException) -> tuple[str, str, bool]:
    """(status, reason, context_poisoned) for an exception raised by a phase."""
    text = f"{type(exc).__name__}: {exc}"
    summary = text.strip().splitlines()[0][:300] if isinstance(exc, DeviceLimitError) else summarize_exception(exc)
    if isinstance(exc, DeviceLimitError) or any(s in text for s in LIMIT_ERRORS):
        return SKIP, f"device limit: {summary}", False
    if any(s in text for s in STICKY_ERRORS):
        return ERROR, summary, True
    return ERROR, summary, False
