"""The runner: phases × problems → checked, timed, self-describing result rows.

For each (phase, problem):

1. ``supports`` — out-of-range problems are recorded ``SKIP`` with the reason;
   so is a problem whose inputs do not fit in the free device memory (checked
   before anything is allocated) and a configuration the device refuses
   (too many threads or too much shared memory per block, out of memory);
2. correctness on fresh inputs for every seed: the output buffer is poisoned,
   the phase runs, the result is compared with the float64 reference. Any
   failure makes the row ``FAIL`` and it is never timed;
3. on the GPU only, timing (:mod:`numba_attn.measure.timing`) and the compiled kernels'
   resources (registers, static shared memory, local memory = spills and
   local arrays). The output is checked again after timing. A time below a
   physical floor is ``FAIL``. Once per run the events timing is cross-checked
   with a CUDA graph replay (``timing_check``; a disagreement beyond the
   spread is a warning); a row whose events time is launch-bound (the host's
   launch cost is not clearly below it) is timed by graph replay instead
   (``method: graph_replay``, the events time kept as ``events_ms``, the
   ``launch_bound`` flag kept);
4. the row gets its fraction of the measured ceiling that applies to it
   (:mod:`numba_attn.measure.ceilings`) and is appended to the results file and
   flushed at once.

An exception becomes an ``ERROR`` row with a summary of the traceback. With a
``timeout_s``, each row runs in a worker process that is killed and replaced
when the row overruns (``TIMEOUT``), so one hung kernel does not stall the
sweep; a worker whose CUDA context was poisoned by a kernel fault (illegal
address, ...) is replaced too. Speedups are against the ``baseline`` phase
measured in the same run (or, with ``resume``, in the resumed file).

Results files are JSON lines: one ``env`` record per run (environment,
commit, source hash, command), ``ceiling`` records, then ``result`` rows.
With ``resume=True`` rows already in the file for the same source and
environment (``env_key``) are not run again.
"""
from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

from numba_attn.gpu.backend import BACKEND, IS_SIMULATOR
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, poison, reference
from numba_attn.phases.registry import Phase, get_phase, list_phases
from numba_attn.measure.timing import TimingConfig

OK, FAIL, ERROR, TIMEOUT, SKIP = "OK", "FAIL", "ERROR", "TIMEOUT", "SKIP"

# Physical floors: nothing on current GPUs moves more than 20 TB/s of HBM or
# does more than 5 PFLOP/s of dense math; a time implying either is a bug.
MAX_PLAUSIBLE_BYTES_PER_S = 20e12
MAX_PLAUSIBLE_FLOPS = 5e15

# Device limits the simulator enforces the way a GPU would (see _simulated_device_limits).
MAX_THREADS_PER_BLOCK = 1024
MAX_STATIC_SMEM_BYTES = 48 * 1024
MAX_DYNAMIC_SMEM_BYTES = 227 * 1024

# Problems above this many FLOPs, or whose inputs exceed this many bytes (decode: little
# arithmetic over a large cache), get their float64 reference from torch on the GPU when available.
TORCH_REFERENCE_FLOPS = 1e11
TORCH_REFERENCE_BYTES = 2**28


def _torch_reference(problem: Problem) -> bool:
    return not IS_SIMULATOR and (problem.flops() > TORCH_REFERENCE_FLOPS
                                 or problem.min_bytes() > TORCH_REFERENCE_BYTES)


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
    ceilings: bool = False  # measure the device's ceilings first (run() only)
    compare_timing: bool | None = None  # graph-replay cross-check: None = once per run() (never in measure())
    resume: bool = False  # skip rows already in ``results`` for the same source and environment
    max_row_ms: float | None = None  # skip a phase whose predicted time per launch exceeds this
    max_total_s: float | None = None  # rows not started by then are SKIP
    worker_setup: tuple = ()  # "module:function" called in each worker process before its first row
    peer_list: tuple | None = None  # peer names (None: all of peers.PEERS)


class DeviceLimitError(RuntimeError):
    """A launch configuration the device cannot run (threads, shared memory, memory)."""


# -- helpers -------------------------------------------------------------------

_REF_CACHE: dict = {}
_REF_CACHE_BYTES = 24 * 2**30  # inputs and references of both seeds of a B=32, 16k-key decode problem


def _reference(problem: Problem, seed: int):
    key = (problem, seed)
    if key not in _REF_CACHE:
        size = sum(x.nbytes for entry in _REF_CACHE.values() for x in entry)  # q, k, v and the reference
        if len(_REF_CACHE) > 8 or size > _REF_CACHE_BYTES:
            _REF_CACHE.clear()
        q, k, v = problem.inputs(seed)
        ref = None
        if _torch_reference(problem):
            ref = _reference_torch(q, k, v, causal=problem.causal, scale=problem.sm_scale)
        if ref is None:
            ref = reference(q, k, v, causal=problem.causal, scale=problem.sm_scale)
        _REF_CACHE[key] = (q, k, v, ref)
    return _REF_CACHE[key]


def _reference_torch(q, k, v, *, causal, scale):
    """The same float64 reference computed with torch on the GPU (large problems),
    a (head, query chunk) at a time; None when torch/CUDA is not usable."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001
        return None
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    out = np.empty((B, H, Nq, D), np.float64)
    chunk = int(max(1, min(Nq, (256 * 2**20) // (8 * max(Nk, 1)))))
    dev = torch.device("cuda")
    with torch.no_grad():
        jj = torch.arange(Nk, device=dev)[None, :]
        for b in range(B):
            for hk in range(Hkv):
                kh = torch.from_numpy(np.asarray(k[b, hk], np.float64)).to(dev)
                vh = torch.from_numpy(np.asarray(v[b, hk], np.float64)).to(dev)
                for h in range(hk * G, hk * G + G):
                    qh = torch.from_numpy(np.asarray(q[b, h], np.float64)).to(dev)
                    for i0 in range(0, Nq, chunk):
                        s = (qh[i0:i0 + chunk] @ kh.T) * scale
                        if causal:
                            ii = torch.arange(i0, min(i0 + chunk, Nq), device=dev)[:, None]
                            s = s.masked_fill(jj > ii + (Nk - Nq), float("-inf"))
                        m = s.max(dim=1, keepdim=True).values
                        p = torch.exp(s - m)
                        out[b, h, i0:i0 + chunk] = ((p @ vh) / p.sum(dim=1, keepdim=True)).cpu().numpy()
    torch.cuda.empty_cache()
    return out


def to_device(a, stream=0):
    """Host array → device array. bfloat16 (``ml_dtypes``) has no buffer-protocol
    code numba accepts, so it travels as its 16-bit pattern (``uint16``); the
    phases read it as such."""
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    return cuda_module().to_device(a, stream=stream)


def to_host(d, like_dtype, stream=0):
    """Device array → host array in ``like_dtype`` (undoing the bfloat16 view)."""
    out = d.copy_to_host(stream=stream)
    return out.view(like_dtype) if out.dtype != like_dtype else out


def cuda_module():
    from numba import cuda

    return cuda


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


# CUDA errors after which the context is unusable: the worker must be replaced.
_STICKY = ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
           "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
           "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT")
# Errors that mean "this configuration does not fit the device": SKIP with the reason.
_LIMITS = ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
           "too many resources requested", "uses too much shared data", "too much shared data",
           "CUDA_ERROR_INVALID_VALUE", "exceeds the device limit", "DeviceLimitError")


def classify_exception(exc: BaseException) -> tuple[str, str, bool]:
    """(status, reason, context_poisoned) for an exception raised by a phase."""
    text = f"{type(exc).__name__}: {exc}"
    summary = text.strip().splitlines()[0][:300] if isinstance(exc, DeviceLimitError) else _summarize_exception(exc)
    if isinstance(exc, DeviceLimitError) or any(s in text for s in _LIMITS):
        return SKIP, f"device limit: {summary}", False
    if any(s in text for s in _STICKY):
        return ERROR, summary, True
    return ERROR, summary, False


def free_device_memory() -> int | None:
    """Free device memory in bytes (None in the simulator or when unknown)."""
    if IS_SIMULATOR:
        return None
    try:
        from numba import cuda

        free, _total = cuda.current_context().get_memory_info()
        return int(free)
    except Exception:  # noqa: BLE001
        return None


def free_host_memory() -> int | None:
    """Available physical host memory in bytes (None when unknown)."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def host_bytes_needed(problem: Problem) -> int:
    """Host memory a check needs: inputs drawn in float32 then cast, the float64
    output of the reference and the output copied back."""
    n_in = problem.batch * (problem.heads * problem.q_len + 2 * problem.kv_heads * problem.kv_len) * problem.head_dim
    n_out = problem.batch * problem.heads * problem.q_len * problem.head_dim
    return n_in * (4 + problem.itemsize) + n_out * (8 + 8 + problem.itemsize)


def device_bytes_needed(problem: Problem) -> int:
    """Device memory a check needs before any workspace: q, k, v and o once."""
    return problem.min_bytes()


@contextlib.contextmanager
def _simulated_device_limits():
    """In the simulator, refuse launches a GPU would refuse: more than 1024
    threads per block, more than 48 KiB of static or 227 KiB of dynamic shared
    memory per block. (The simulator itself runs them.)"""
    if not IS_SIMULATOR:
        yield
        return
    from numba.cuda.simulator import kernel as simk
    from numba.cuda.simulator import kernelapi as sima

    orig_call, orig_array = simk.FakeCUDAKernel.__call__, sima.FakeCUDAShared.array

    def call(self, *args):
        if not self._device and not simk._kernel_context and self.block_dim is not None:
            bd = self.block_dim
            n = int(np.prod([bd] if isinstance(bd, int) else list(bd)))
            if n > MAX_THREADS_PER_BLOCK:
                raise DeviceLimitError(f"a block of {n} threads exceeds the device limit of "
                                       f"{MAX_THREADS_PER_BLOCK} threads per block")
            if self.dynshared_size > MAX_DYNAMIC_SMEM_BYTES:
                raise DeviceLimitError(f"{self.dynshared_size} B of dynamic shared memory exceeds the "
                                       f"device limit of {MAX_DYNAMIC_SMEM_BYTES} B per block")
        return orig_call(self, *args)

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return orig_array(self, shape, dtype, alignment)
        # the simulator keys static arrays by the caller's source line: key by
        # the kernel's line here too (not by this wrapper's)
        from numba.core import types
        from numba.np import numpy_support

        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        f = sys._getframe(1)
        caller = (f.f_code.co_filename, f.f_lineno)
        res = self._allocations.get(caller)
        if res is None:
            res = np.empty(shape, dtype)
            self._allocations[caller] = res
            total = sum(a.nbytes for a in self._allocations.values())
            if total > MAX_STATIC_SMEM_BYTES:
                raise DeviceLimitError(f"{total} B of static shared memory per block exceeds the device "
                                       f"limit of {MAX_STATIC_SMEM_BYTES} B")
        return res

    simk.FakeCUDAKernel.__call__, sima.FakeCUDAShared.array = call, array
    try:
        yield
    finally:
        simk.FakeCUDAKernel.__call__, sima.FakeCUDAShared.array = orig_call, orig_array


# -- one row -----------------------------------------------------------------


def measure(phase: Phase | str, problem: Problem, cfg: RunConfig | None = None, **overrides) -> dict:
    """Check (and on the GPU time) one phase on one problem; returns the row."""
    from numba import cuda

    cfg = cfg or RunConfig()
    phase = get_phase(phase) if isinstance(phase, str) else phase
    params = phase.resolve_params({**cfg.params.get(phase.name, {}), **overrides})
    row = {"type": "result", "phase": phase.name, "kind": "phase", "order": phase.order,
           "phase_kind": phase.kind, "precision": phase.precision, "parent": phase.parent,
           "problem": problem.to_dict(), "label": problem.label, "params": params,
           "planned_speedup": phase.planned_speedup, "backend": BACKEND, "status": None,
           "reason": "", "flops": problem.flops(), "min_bytes": problem.min_bytes()}
    reason = phase.supports(problem, **params)
    if not reason and problem.q_len * problem.kv_len * problem.batch * problem.heads == 0:
        reason = f"empty problem (q_len={problem.q_len}, kv_len={problem.kv_len}): nothing to measure"
    if reason:
        row.update(status=SKIP, reason=reason)
        return row
    free = free_device_memory()
    need = device_bytes_needed(problem)
    if free is not None and need > free:
        row.update(status=SKIP, reason=f"problem needs {need / 2**30:.2f} GiB of device memory for q, k, v "
                                       f"and o; {free / 2**30:.2f} GiB free")
        return row
    host_free, host_need = free_host_memory(), host_bytes_needed(problem)
    if host_free is not None and host_need > 0.5 * host_free and _REF_CACHE:
        _REF_CACHE.clear()  # cached references of earlier problems: give their memory back first
        import gc

        gc.collect()
        host_free = free_host_memory()
    if host_free is not None and host_need > 0.9 * host_free:
        row.update(status=SKIP, reason=f"checking this problem needs ~{host_need / 2**30:.1f} GiB of host memory "
                                       f"(inputs and float64 reference); {host_free / 2**30:.1f} GiB available")
        return row
    try:
        with _simulated_device_limits():
            _measure_checked(phase, problem, cfg, params, row, cuda)
    except Exception as exc:  # one phase crashing must not end the sweep
        if os.environ.get("NUMBA_ATTN_RAISE"):  # debugging: the full traceback instead of an ERROR row
            raise
        status, why, poisoned = classify_exception(exc)
        row.update(status=status, reason=why)
        if poisoned:
            row["context_poisoned"] = True
    return row


def _measure_checked(phase, problem, cfg, params, row, cuda):
    t0 = time.perf_counter()
    launch = phase.plan(problem, **params)
    row["params"] = dict(launch.params or params)  # the parameters that ran, automatic ones resolved
    row["workspace_bytes"] = int(getattr(launch, "workspace_bytes", 0) or 0)
    row["model_bytes"] = model_bytes(phase.name, problem, row["workspace_bytes"], cfg.baseline)
    stream = cuda.stream()
    checks = []
    for i, seed in enumerate(cfg.seeds):
        q, k, v, ref = _reference(problem, seed)
        qd, kd, vd = (to_device(a, stream=stream) for a in (q, k, v))
        od = to_device(poison(np.empty(problem.out_shape(), q.dtype), problem.dtype), stream=stream)
        t1 = time.perf_counter()
        launch(*_views(problem, qd, kd, vd, od), stream)
        stream.synchronize()
        if i == 0:
            row["first_launch_s"] = time.perf_counter() - t1  # includes compilation
            row["sim_wall_s" if IS_SIMULATOR else "plan_s"] = time.perf_counter() - t0
        out = to_host(od, q.dtype, stream=stream)
        stream.synchronize()
        c = check(out, ref, dtype=problem.dtype, precision=phase.precision)
        checks.append(c)
        if not c.ok:
            break
    worst = max(checks, key=lambda c: (not c.ok, c.rel_err))
    row["check"] = worst.to_dict()
    row["seeds"] = list(cfg.seeds[: len(checks)])
    row["reference"] = "torch-float64-cuda" if _torch_reference(problem) else "numpy-float64"
    row["resources"] = kernel_resources(launch.kernels)
    _summarize_resources(row)
    if not worst.ok:
        row.update(status=FAIL, reason=f"wrong result (seed {cfg.seeds[len(checks) - 1]}): {worst.reason}")
        return
    if IS_SIMULATOR or not cfg.time_kernels:
        row.update(status=OK, reason="checked; not timed (simulator)" if IS_SIMULATOR else "checked; not timed")
        return
    row.update(_time_launch(launch, problem, qd, kd, vd, od, stream, cfg, cfg.seeds[len(checks) - 1],
                            phase.precision))
    row["status"] = OK
    _throughput(row, problem)
    floor_reason = _implausible(row, problem)
    if floor_reason:
        row.update(status=FAIL, reason=floor_reason)


def model_bytes(phase_name: str, problem: Problem, workspace_bytes: int, baseline: str = "naive") -> int:
    """Bytes the phase moves through device memory by construction: the baseline
    materializes S and P (``Problem.materialized_bytes``); a fused phase moves the
    minimum plus its workspace written once and read once."""
    if phase_name == baseline:
        return problem.materialized_bytes()
    return problem.min_bytes() + 2 * int(workspace_bytes or 0)


def _l2_bytes() -> int:
    try:
        from numba import cuda

        return int(cuda.get_current_device().L2_CACHE_SIZE)
    except Exception:  # noqa: BLE001
        return 60 * 2**20


def _time_launch(launch, problem, qd, kd, vd, od, stream, cfg, seed, precision=None):
    from numba import cuda

    from numba_attn.measure.timing import compare_methods, end_to_end, events_batched, second_method

    # rotate input sets so that the inputs of small problems are not L2-resident
    sets = [_views(problem, qd, kd, vd, od)]
    l2 = _l2_bytes()
    n_sets = int(min(8, max(1, math.ceil(3 * l2 / max(problem.min_bytes(), 1)))))
    poisoned = poison(np.empty(problem.out_shape(), qd.dtype), problem.dtype)
    for _ in range(n_sets - 1):
        new = [cuda.device_array_like(a, stream=stream) for a in (qd, kd, vd)]
        for src, dst in zip((qd, kd, vd), new):
            dst.copy_to_device(src, stream=stream)
        new.append(cuda.to_device(poisoned, stream=stream))
        sets.append(_views(problem, *new))

    def fn(i, s=stream):
        launch(*sets[i % len(sets)], s)

    t = events_batched(fn, stream, cfg.timing)
    t["e2e_ms"] = end_to_end(fn, stream)
    t["input_sets"] = len(sets)
    t["l2_bytes"] = l2
    if cfg.compare_timing:
        other = second_method(fn, stream, cfg.timing)
        t["timing_check"] = compare_methods(t, other)
    if t.get("launch_bound"):
        # events then time the host's launch rate, not the kernel: a graph replay
        # has no Python between launches, so its time is the kernel's. The row
        # keeps the events time and the flag; if capture fails the events time stays.
        g = (other if cfg.compare_timing and other.get("method") == "graph_replay"
             else second_method(fn, stream, cfg.timing))
        if g.get("method") == "graph_replay":
            t["events_ms"] = t["time_ms"]
            for key in ("method", "time_ms", "time_min_ms", "time_max_ms", "spread", "spread_p10_p90", "reps",
                        "inner"):
                if key in g:
                    t[key] = g[key]
        else:
            t["graph_error"] = g.get("graph_error", "")
    # the timed launches must still compute the right answer: re-check the
    # first set and the last (whose output started poisoned)
    q, k, v, ref = _reference(problem, seed)  # the inputs last copied to the device
    for idx in sorted({0, len(sets) - 1}):
        od_host = to_host(sets[idx][3], q.dtype, stream=stream)
        stream.synchronize()
        c = check(od_host.reshape(problem.out_shape()), ref, dtype=problem.dtype, precision=precision)
        if not c.ok:
            t["post_timing_check"] = f"input set {idx}: {c.reason}"
            break
    return t


def _throughput(row, problem):
    t = row.get("time_ms")
    if t and t > 0:
        row["tflops"] = problem.flops() / (t * 1e-3) / 1e12
        row["gbps"] = problem.min_bytes() / (t * 1e-3) / 1e9
        if row.get("model_bytes"):
            row["model_gbps"] = row["model_bytes"] / (t * 1e-3) / 1e9


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


def _call_setup(spec: str):
    import importlib

    mod, _, fn = spec.partition(":")
    m = importlib.import_module(mod)
    if fn:
        getattr(m, fn)()


def _run_task(kind, payload):
    if kind == "phase":
        name, prob, cfgd = payload
        return measure(name, Problem.from_dict(prob), _cfg_from_dict(cfgd))
    if kind == "peer":
        from numba_attn.measure.peers import measure_peer

        name, prob, cfgd = payload
        return measure_peer(name, Problem.from_dict(prob), _cfg_from_dict(cfgd))
    if kind == "ceilings":
        from numba_attn.measure.ceilings import measure_all

        names, cfgd = payload
        return {"type": "ceilings", "rows": measure_all(names, _cfg_from_dict(cfgd).timing), "status": OK}
    raise ValueError(f"unknown task kind {kind!r}")


def _watch_parent(ppid: int):
    """Exit when the parent dies (killed sweep): a hung kernel must not outlive it."""
    import threading

    def loop():
        while True:
            time.sleep(1.0)
            if os.getppid() != ppid:
                os._exit(3)

    threading.Thread(target=loop, daemon=True, name="numba-attn-parent-watch").start()


def _worker(conn, setup, ppid=None):
    if ppid is not None:
        _watch_parent(ppid)
    try:
        for spec in setup:
            _call_setup(spec)
        conn.send(("ready", None))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("setup_failed", _summarize_exception(exc)))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        kind, payload = task
        try:
            row = _run_task(kind, payload)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            status, why, poisoned = classify_exception(exc)
            row = {"status": status, "reason": why, "context_poisoned": poisoned}
        conn.send(row)
        if row.get("context_poisoned"):
            return  # a CUDA fault leaves the context unusable: the parent starts a new worker


def _cfg_to_dict(cfg: RunConfig) -> dict:
    return asdict(cfg)


def _cfg_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["timing"] = TimingConfig(**d["timing"])
    d["seeds"] = tuple(d["seeds"])
    d["worker_setup"] = tuple(d.get("worker_setup") or ())
    if d.get("peer_list") is not None:
        d["peer_list"] = tuple(d["peer_list"])
    return RunConfig(**d)


class _Isolated:
    """A persistent worker process; replaced when a row times out, it dies, or
    a CUDA fault poisons its context. The row's time limit starts once the
    worker is ready (imports and setup are not charged to the row)."""

    START_TIMEOUT_S = 300.0

    def __init__(self, setup=()):
        self.proc = None
        self.conn = None
        self.setup = tuple(setup)

    def _start(self):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, self.setup, os.getpid()), daemon=True)
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

    def call(self, task, timeout_s):
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
                return {"status": ERROR, "reason": f"worker process died (exit code {code})"}
            if row.get("context_poisoned"):
                self.close(kill=True)
            return row
        if not self.proc.is_alive():
            code = self.proc.exitcode
            self.close(kill=True)
            return {"status": ERROR, "reason": f"worker process died (exit code {code})"}
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


# -- results files ---------------------------------------------------------------


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
            # a previous run killed mid-line: end that line so the next record starts clean
            if os.path.exists(path) and os.path.getsize(path) > 0:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    last = f.read(1)
                if last != b"\n":
                    with open(path, "a", encoding="utf-8") as f:
                        f.write("\n")

    def write(self, record: dict):
        if not self.path:
            return
        line = json.dumps(record, default=_json_default, allow_nan=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return str(o)


def load_results(path: str) -> list[dict]:
    """Every record of a results file; a truncated line (a run killed while
    writing) is skipped, so an interrupted file always loads."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def task_key(kind: str, name: str, problem: Problem | dict | None, params: dict | None) -> str:
    """Identity of a row for ``resume``: what was run, on what, with which parameters."""
    prob = problem.to_dict() if isinstance(problem, Problem) else problem
    return json.dumps([kind, name, prob, params or {}], sort_keys=True, default=_json_default)


def row_key(row: dict) -> str:
    if row.get("type") == "ceiling":
        return task_key("ceiling", row.get("name"), None, None)
    params = row.get("requested_params") if "requested_params" in row else None
    return task_key(row.get("kind"), row.get("phase"), row.get("problem"), params)


# -- the sweep -----------------------------------------------------------------


def run(phases=None, problems=None, *, config: RunConfig | None = None, progress=None, select=None,
        warn=None, **kw) -> list[dict]:
    """Run ``phases`` (names or Phase objects; default all) on ``problems``
    (default: the ``tiny`` preset) and return the result rows.

    Keyword arguments are :class:`RunConfig` fields (``seeds``, ``timeout_s``,
    ``params``, ``results`` path, ``ceilings``, ``resume``, ...).
    ``select(phase, problem) -> bool`` keeps only some (phase, problem) pairs.
    ``progress(i, n, row_or_None, phase, problem)`` is called before (row None)
    and after each row; ``warn(message)`` receives warnings (default: stderr).
    """
    from numba_attn.measure.ceilings import CEILINGS, attach_fractions
    from numba_attn.measure.env import env_key, environment
    from numba_attn.spec.problem import PRESETS

    cfg = config or RunConfig(**kw)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr, flush=True))
    for spec in cfg.worker_setup:  # here and in every worker process
        _call_setup(spec)
    plist = _resolve_phases(phases)
    problems = list(problems) if problems is not None else PRESETS["tiny"]
    env = environment(cfg.command)
    ekey = env_key(env)
    run_id = uuid.uuid4().hex[:12]

    previous: list[dict] = []
    if cfg.resume and cfg.results and os.path.exists(cfg.results):
        previous = [r for r in load_results(cfg.results)
                    if r.get("type") in ("result", "ceiling") and r.get("env_key") == ekey]
    done = {row_key(r): r for r in previous}

    writer = ResultsWriter(cfg.results)
    writer.write({"type": "env", "run_id": run_id, "env_key": ekey, "resumed_rows": len(done),
                  "config": _cfg_to_dict(cfg), **env})
    iso = _Isolated(cfg.worker_setup) if cfg.timeout_s else None
    peers = []
    if cfg.peers and not IS_SIMULATOR:
        from numba_attn.measure.peers import peer_names

        peers = list(cfg.peer_list) if cfg.peer_list is not None else peer_names()

    rows: list[dict] = []
    ceilings: dict = {}
    t_run = time.perf_counter()

    def stamp(row):
        row["run_id"] = run_id
        row["env_key"] = ekey
        row["commit"] = env.get("commit")
        row["gpu"] = env.get("gpu")

    # -- ceilings first, in the same process/context as the phases -----------
    if cfg.ceilings:
        ceil_rows = [done[task_key("ceiling", n, None, None)] for n in CEILINGS
                     if task_key("ceiling", n, None, None) in done]
        if len(ceil_rows) != len(CEILINGS):
            t0 = time.perf_counter()
            if iso is not None:
                res = iso.call(("ceilings", (list(CEILINGS), _cfg_to_dict(cfg))), max(cfg.timeout_s, 120))
            else:
                res = _run_task("ceilings", (list(CEILINGS), _cfg_to_dict(cfg)))
            ceil_rows = res.get("rows") or [{"type": "ceiling", "kind": "ceiling", "name": n,
                                             "phase": f"ceiling.{n}", "status": res.get("status", ERROR),
                                             "reason": res.get("reason", ""), "value": None} for n in CEILINGS]
            for r in ceil_rows:
                stamp(r)
                writer.write(r)
            if progress:
                progress(-1, 0, {"status": "ceilings", "wall_s": time.perf_counter() - t0}, "ceilings", None)
        else:
            for r in ceil_rows:
                r["resumed"] = True
        for r in ceil_rows:
            rows.append(r)
            if r.get("status") == OK and r.get("value"):
                ceilings[r["name"]] = r

    # -- phases, then peers -------------------------------------------------------
    # per problem: its phases, then its peers (a run cut short by max_total_s loses whole problems last)
    tasks = []
    for pr in problems:
        tasks += [("phase", ph.name, pr) for ph in plist if select is None or select(ph, pr)]
        tasks += [("peer", name, pr) for name in peers]
    baseline_time: dict = {}
    last_time: dict = {}  # phase → (flops, time_ms) of its last timed row, for max_row_ms
    timing_checked = False
    baseline_shape: dict = {}  # same shape, other dtype: (time, dtype), fp32 preferred

    def note_baseline(problem_dict, t_ms):
        baseline_time[json.dumps(problem_dict, sort_keys=True)] = t_ms
        sk = _shape_key(problem_dict)
        if sk not in baseline_shape or problem_dict.get("dtype") == "float32":
            baseline_shape[sk] = (t_ms, problem_dict.get("dtype"))

    for r in previous:
        if r.get("kind") == "phase" and r.get("phase") == cfg.baseline and r.get("status") == OK \
                and r.get("time_ms"):
            note_baseline(r["problem"], r["time_ms"])
        if r.get("timing_check"):
            timing_checked = True
    try:
        for idx, (kind, name, prob) in enumerate(tasks):
            params_req = cfg.params.get(name, {}) if kind == "phase" else {}
            key = task_key(kind, name, prob, params_req)
            pkey = json.dumps(prob.to_dict(), sort_keys=True)
            if key in done:
                row = dict(done[key])
                row["resumed"] = True
                rows.append(row)
                if progress:
                    progress(idx, len(tasks), None, name, prob)
                    progress(idx, len(tasks), row, name, prob)
                continue
            if progress:
                progress(idx, len(tasks), None, name, prob)
            t0 = time.perf_counter()
            skip_reason = None
            if cfg.max_total_s is not None and t0 - t_run > cfg.max_total_s:
                skip_reason = f"the run's time limit of {cfg.max_total_s:g} s was reached before this row"
            elif cfg.max_row_ms and kind == "phase" and name in last_time:
                f0, ms0 = last_time[name]
                pred = ms0 * prob.flops() / max(f0, 1)
                if pred > cfg.max_row_ms:
                    skip_reason = (f"predicted {pred:.0f} ms per launch (scaled by FLOPs from {ms0:.1f} ms on a "
                                   f"smaller problem) exceeds the row limit of {cfg.max_row_ms:g} ms")
            if skip_reason:
                row = _stub_row(kind, name, prob, {"status": SKIP, "reason": skip_reason})
            else:
                want = cfg.compare_timing is not False and not timing_checked and kind == "phase"
                cfg_row = RunConfig(**{**cfg.__dict__, "compare_timing": want})
                if iso is not None:
                    row = iso.call((kind, (name, prob.to_dict(), _cfg_to_dict(cfg_row))), cfg.timeout_s)
                    if row.get("type") != "result":  # timeout/crash: rebuild the row's identity
                        row = _stub_row(kind, name, prob, row)
                elif kind == "phase":
                    row = measure(name, prob, cfg_row)
                else:
                    row = _peer(name, prob, cfg_row)
            row["requested_params"] = params_req
            row["wall_s"] = time.perf_counter() - t0
            stamp(row)
            if kind == "phase" and name == cfg.baseline and row["status"] == OK and row.get("time_ms"):
                note_baseline(prob.to_dict(), row["time_ms"])
            if row.get("time_ms") and pkey in baseline_time:
                row["speedup"] = baseline_time[pkey] / row["time_ms"]
            elif row.get("time_ms") and _shape_key(prob.to_dict()) in baseline_shape:
                t_b, dt_b = baseline_shape[_shape_key(prob.to_dict())]
                row["speedup"] = t_b / row["time_ms"]
                row["speedup_vs"] = f"{cfg.baseline} {dt_b}"
            if row.get("time_ms") and kind == "phase":
                last_time[name] = (prob.flops(), row["time_ms"])
            if kind == "peer" and row.get("params", {}).get("dtype", "float32") != "float32":
                row.setdefault("precision", row["params"]["dtype"])
            attach_fractions(row, ceilings)
            tc = row.get("timing_check")
            if tc:
                timing_checked = True
                if tc.get("warning"):
                    warn(f"{name} [{prob.label}]: {tc['warning']}")
            writer.write(row)
            rows.append(row)
            if progress:
                progress(idx, len(tasks), row, name, prob)
    finally:
        if iso is not None:
            iso.close()
    return rows


def _shape_key(problem_dict: dict) -> str:
    """A problem without its dtype: tensor-core rows in fp16 get their speedup
    against the baseline on the same shape in fp32 (``speedup_vs`` says so)."""
    return json.dumps({k: v for k, v in problem_dict.items() if k != "dtype"}, sort_keys=True)


def _peer(name, prob, cfg):
    from numba_attn.measure.peers import measure_peer

    return measure_peer(name, prob, cfg)


def _stub_row(kind, name, prob: Problem, info: dict) -> dict:
    row = {"type": "result", "phase": name, "kind": kind, "problem": prob.to_dict(),
           "label": prob.label, "backend": BACKEND, "flops": prob.flops(), "min_bytes": prob.min_bytes()}
    if kind == "phase":
        try:
            ph = get_phase(name)
            row.update(order=ph.order, planned_speedup=ph.planned_speedup, phase_kind=ph.kind,
                       precision=ph.precision, parent=ph.parent)
        except KeyError:
            pass
    row.update(status=info.get("status", ERROR), reason=info.get("reason", ""))
    return row
