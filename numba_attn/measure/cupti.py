"""Kernel time from CUPTI (``TimingConfig.method = "cupti"``, ``--timing cupti``).

The device's own start and end of every kernel, recorded by CUPTI through ``torch.profiler``
(``ProfilerActivity.CUDA``). CUPTI sees every kernel of the process, so numba's launches (on any stream) are seen as
well as PyTorch's. After the warm-up, ``calls`` back-to-back calls are profiled (one more before them, left out); a
call's time is the sum of the durations of the kernels it launched (a split-K phase: split + combine; a memset it
makes counts as a kernel), and the row's time is the median over the calls (:func:`per_call_kernels`). It needs a
GPU and PyTorch (:func:`cupti_status` says why not). No launch gaps and no event overhead are in it, and phases and
peers are timed by exactly the same code: the method to publish ratios with. The same code is not the same regime:
the first ``profile()`` of a process starts CUPTI (3-6 s, the GPU idle) just before its calls, so a problem's rows
are compared in interleaved rounds (:mod:`numba_attn.measure.regime`).
"""
from __future__ import annotations

import math
import statistics
import time

from numba_attn.measure.samples import TimingConfig, call_fn, timing_summary, warm_up

# device activities that are not the call's own work: copies (the harness's inputs and outputs). A memset is
# counted as a kernel, as the call's work (cuDNN's backward makes one of 0.7-0.8 µs a call at B1 H32 N4096, H200;
# a phase zeroing a buffer in a kernel was always counted)
_NOT_KERNELS = ("memcpy",)
KERNEL_NAME_CHARS = 160  # kernel names recorded in a row are cut to this length


def cupti_status() -> str | None:
    """None when kernel times can be recorded here (a GPU, PyTorch with its profiler), else why not."""
    try:
        from numba_attn.gpu.backend import IS_SIMULATOR
    except Exception:  # noqa: BLE001 - the backend module always imports; be safe in workers
        IS_SIMULATOR = False
    if IS_SIMULATOR:
        return ("kernel time (--timing cupti) needs a GPU: the simulator runs no kernel on a device, "
                "so nothing is timed there")
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return (f"kernel time (--timing cupti) needs PyTorch's profiler (CUPTI): torch is not importable "
                f"({type(exc).__name__}: {exc})")
    if not hasattr(ProfilerActivity, "CUDA"):
        return "kernel time (--timing cupti) needs torch.profiler.ProfilerActivity.CUDA; this torch has none"
    if not torch.cuda.is_available():
        return "kernel time (--timing cupti) needs a CUDA device visible to PyTorch; torch sees none"
    return None


def _is_device_event(e) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and str(dt).split(".")[-1] == "CUDA"


def kernel_events(events) -> list[tuple[str, float, float]]:
    """``(name, start_us, duration_us)`` of the device kernels among profiler events, by start.

    ``events``: ``torch.profiler.profile(...).events()`` (``FunctionEvent``: ``device_type``,
    ``name``, ``time_range`` with ``start`` and ``elapsed_us()``; torch 2.4 and later), or
    anything shaped like it. Copies on the device are left out; memsets are kept (a call's own work)."""
    out = []
    for e in events:
        if not _is_device_event(e):
            continue
        name = str(getattr(e, "name", "") or getattr(e, "key", ""))
        if name.lower().startswith(_NOT_KERNELS):
            continue
        tr = getattr(e, "time_range", None)
        if tr is not None:
            start, dur = float(tr.start), float(tr.elapsed_us())
        else:  # older or reduced events: the device time of the event itself
            start = float(getattr(e, "start_us", 0.0) or 0.0)
            dur = getattr(e, "device_time_total", None)
            if dur is None:
                dur = getattr(e, "cuda_time_total", 0.0)
            dur = float(dur or 0.0)
        out.append((name, start, dur))
    out.sort(key=lambda x: x[1])
    return out


def kernel_totals(averages) -> list[tuple[str, float, int]]:
    """``(name, total_us, count)`` of the device kernels in ``prof.key_averages()``: the fallback when
    the events carry no device kernels with times (per call only as a mean, no per-call spread)."""
    out = []
    for a in averages:
        if not _is_device_event(a):
            continue
        name = str(getattr(a, "key", "") or "")
        if name.lower().startswith(_NOT_KERNELS):
            continue
        tot = getattr(a, "self_device_time_total", None)
        if tot is None:
            tot = getattr(a, "self_cuda_time_total", 0.0)
        out.append((name, float(tot or 0.0), int(getattr(a, "count", 1) or 1)))
    return out


def per_call_kernels(kernels, calls: int, warmup: int = 0) -> dict:
    """Split the kernels of ``warmup + calls`` back-to-back calls into calls and time each call.

    ``kernels``: ``(name, start_us, duration_us)`` by start (:func:`kernel_events`). Every call is
    expected to launch the same kernels in the same order; the first ``warmup`` calls' kernels are
    left out. A call's time is the sum of its kernels' durations. Returns ``per_call_ms`` (one per
    call), ``kernels`` (per kernel of a call: its name and median time per call, ms),
    ``kernels_per_call`` and ``irregular`` (None, or why the calls could not be told apart; then
    every call is given the mean time per call over all the profiled calls, warm-up included)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    total = calls + warmup
    n = len(kernels)
    if n == 0:
        raise RuntimeError("the profiler recorded no kernel: CUPTI saw none of the calls' launches")
    irregular = None
    if n % total == 0:
        k = n // total
        body = list(kernels[warmup * k:])
        chunks = [body[i * k:(i + 1) * k] for i in range(calls)]
        names = [c[0] for c in chunks[0]]
        if all([c[0] for c in ch] == names for ch in chunks):
            return {"per_call_ms": [sum(c[2] for c in ch) / 1e3 for ch in chunks],
                    "kernels": [{"name": names[j][:KERNEL_NAME_CHARS],
                                 "time_ms": statistics.median(ch[j][2] for ch in chunks) / 1e3}
                                for j in range(k)],
                    "kernels_per_call": k, "irregular": None}
        irregular = "the calls did not launch the same kernels in the same order"
    else:
        irregular = f"{n} kernels for {total} calls: not the same number per call"
    by_name: dict = {}
    for name, _start, dur in kernels:
        by_name[name] = by_name.get(name, 0.0) + dur
    mean_ms = sum(by_name.values()) / total / 1e3
    return {"per_call_ms": [mean_ms] * calls,
            "kernels": [{"name": name[:KERNEL_NAME_CHARS], "time_ms": tot / total / 1e3}
                        for name, tot in by_name.items()],
            "kernels_per_call": n / total, "irregular": irregular + "; the time is the mean per call"}


def cupti_kernel_time(fn, stream, cfg: TimingConfig | None = None, calls: int | None = None) -> dict:
    """Kernel time of ``fn(i)`` (or ``fn(i, stream)``) from CUPTI through ``torch.profiler``.

    After ``cfg.warmup`` calls outside the profiler, ``1 + calls`` calls are profiled back to back
    (the first is left out); ``calls`` (default: enough for ``5 * batch_ms`` of work, between
    ``min_reps`` and ``max_reps``). Raises ``RuntimeError`` with :func:`cupti_status`'s reason when
    it cannot run."""
    reason = cupti_status()
    if reason:
        raise RuntimeError(reason)
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = cfg or TimingConfig()
    n = warm_up(fn, stream, cfg)
    t0 = time.perf_counter()
    call_fn(fn, n, stream)
    n += 1
    stream.synchronize()
    single_ms = (time.perf_counter() - t0) * 1e3
    if calls is None:
        calls = int(max(cfg.min_reps, min(cfg.max_reps, math.ceil(5 * cfg.batch_ms / max(single_ms, 1e-3)))))
    warm = 1
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(warm + calls):
            call_fn(fn, n, stream)
            n += 1
        stream.synchronize()
        torch.cuda.synchronize()
    kernels = kernel_events(prof.events())
    if kernels:
        agg = per_call_kernels(kernels, calls, warmup=warm)
    else:  # no per-kernel events: the averages' device totals, as a mean per call
        totals = kernel_totals(prof.key_averages())
        if not totals:
            raise RuntimeError("the profiler recorded no kernel: CUPTI saw none of the calls' launches")
        per_call = sum(t for _, t, _ in totals) / (warm + calls) / 1e3
        agg = {"per_call_ms": [per_call] * calls,
               "kernels": [{"name": nm[:KERNEL_NAME_CHARS], "time_ms": t / (warm + calls) / 1e3}
                           for nm, t, _ in totals],
               "kernels_per_call": sum(c for _, _, c in totals) / (warm + calls),
               "irregular": "no per-kernel events (key_averages totals): the time is the mean per call"}
    out = timing_summary("cupti", agg["per_call_ms"], calls=calls, kernels=agg["kernels"],
                         kernels_per_call=agg["kernels_per_call"])
    if agg["irregular"]:
        out["cupti_irregular"] = agg["irregular"]
    return out
