"""The correctness gate: a launch's output against the float64 reference, on fresh inputs.

The references (and the inputs they were computed from) are cached per (problem, seed), so the
phases of a sweep share them; large problems get theirs from torch on the GPU when available. A
reference not cached yet is computed in a thread while ``check_launch`` launches the phase for the
first time (its compilation: a worker's first row used to pay both, one after the other).
``check_launch`` poisons the output buffer, launches, and compares for every seed, stopping at
the first wrong result; ``recheck_outputs`` checks the outputs of the timed launches again.
"""
from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.spec.problem import Problem, numpy_dtype
from numba_attn.spec.reference import Check, check, poison, reference, usable_torch

# Problems above this many FLOPs, or whose inputs exceed this many bytes (decode: little
# arithmetic over a large cache), get their float64 reference from torch on the GPU when available.
TORCH_REFERENCE_FLOPS = 1e11
TORCH_REFERENCE_BYTES = 2**28

REFERENCE_CACHE_BYTES = 24 * 2**30  # inputs and references of both seeds of a B=32, 16k-key decode problem
_REFERENCE_CACHE: dict = {}  # (problem, seed) -> a settled Future of the reference, with .inputs (q, k, v)
_PENDING: dict = {}  # (problem, seed) -> the Future of a reference being computed
_REFERENCE_LOCK = threading.Lock()
REFERENCE_SECONDS = {"draw": 0.0, "compute": 0.0}  # this process's time drawing inputs and computing references


# -- the reference, cached -------------------------------------------------------


def uses_torch_reference(problem: Problem) -> bool:
    """Whether the reference of ``problem`` is computed with torch on the GPU (large problems)."""
    return not IS_SIMULATOR and (problem.flops() > TORCH_REFERENCE_FLOPS
                                 or problem.min_bytes() > TORCH_REFERENCE_BYTES)


def reference_name(problem: Problem) -> str:
    """What computed the reference, as recorded in a row's ``reference``."""
    return "torch-float64-cuda" if uses_torch_reference(problem) else "numpy-float64"


def _compute_reference(problem: Problem, q, k, v, device="cuda"):
    if getattr(problem, "e4m3_inputs", False):  # codes with the problem's scales: the values they stand for
        q, k, v = problem.decoded(q, k, v)
    if getattr(problem, "page_size", 0):  # a paged cache: k, v are the caches (spec/paged.py)
        from numba_attn.spec.paged import problem_reference

        return problem_reference(problem, q, k, v)
    if getattr(problem, "varlen", False):  # packed sequences (spec/varlen.py)
        from numba_attn.spec.varlen import problem_reference as varlen_reference

        return varlen_reference(problem, q, k, v)
    if getattr(problem, "variant", None) is not None:  # the variant's functions over the whole score matrix
        return reference(q, k, v, causal=problem.causal, scale=problem.sm_scale, variant=problem.variant)
    ref = None
    if uses_torch_reference(problem):
        ref = reference_torch(q, k, v, causal=problem.causal, scale=problem.sm_scale, device=device)
    if ref is None:
        ref = reference(q, k, v, causal=problem.causal, scale=problem.sm_scale)
    return ref


def _current_gpu() -> str:
    """torch's name of the GPU this thread's numba context is on ("cuda:N"): a new thread's torch
    would otherwise use device 0."""
    try:
        from numba import cuda

        return f"cuda:{cuda.get_current_device().id}"
    except Exception:  # (no usable device: the torch reference then falls back to NumPy)
        return "cuda"


def pending_reference(problem: Problem, seed: int):
    """(q, k, v, reference): the inputs for ``seed`` drawn now, the float64 reference a
    :class:`~concurrent.futures.Future`, computed in a thread unless cached (``check_launch``
    launches, and so compiles, while it is computed); the result is cached as by
    :func:`cached_reference`, and a second caller of the same key waits for the first's."""
    key = (problem, seed)
    with _REFERENCE_LOCK:
        fut = _REFERENCE_CACHE.get(key) or _PENDING.get(key)
        if fut is None:
            fut = _PENDING[key] = Future()
            mine = True
        else:
            mine = False
    if not mine:
        if not fut.done() and not hasattr(fut, "inputs"):  # the owner is still drawing the inputs
            fut.result()
        return (*fut.inputs, fut)
    try:
        t0 = time.perf_counter()
        q, k, v = problem.inputs(seed)
        REFERENCE_SECONDS["draw"] += time.perf_counter() - t0
    except BaseException as e:
        _settle(key, fut, error=e)
        raise
    fut.inputs = (q, k, v)
    device = _current_gpu() if uses_torch_reference(problem) else "cuda"

    def compute():
        t1 = time.perf_counter()
        try:
            ref = _compute_reference(problem, q, k, v, device)
        except BaseException as e:  # (seen by whoever waits for it)
            _settle(key, fut, error=e)
            return
        REFERENCE_SECONDS["compute"] += time.perf_counter() - t1
        _settle(key, fut, result=ref)

    if uses_torch_reference(problem) and not _room_beside(problem):
        compute()  # the device has no room for both at once: one after the other, as before
    else:
        threading.Thread(target=compute, name="numba-attn-reference", daemon=True).start()
    return q, k, v, fut


def _room_beside(problem: Problem) -> bool:
    """Whether the device has room for the torch reference's working set (one batch entry of K, V, Q and
    O in float64, up to three 256 MiB score chunks) beside the phase's own arrays and 1 GiB to spare."""
    from numba_attn.measure.limits import device_bytes_needed, free_device_memory

    free = free_device_memory()
    if free is None:
        return False
    p = problem
    entry = (2 * p.kv_heads * p.kv_len + 2 * p.heads * p.q_len) * p.head_dim * 8 + 3 * (256 << 20)
    return free > entry + 2 * device_bytes_needed(problem) + (1 << 30)


def _settle(key, fut, result=None, error=None):
    with _REFERENCE_LOCK:
        _PENDING.pop(key, None)
        if error is None:
            size = sum(x.nbytes for f in _REFERENCE_CACHE.values() for x in (*f.inputs, f.result()))
            if len(_REFERENCE_CACHE) > 8 or size > REFERENCE_CACHE_BYTES:
                _REFERENCE_CACHE.clear()
            _REFERENCE_CACHE[key] = fut
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)


def cached_reference(problem: Problem, seed: int):
    """(q, k, v, reference) of ``problem``'s inputs for ``seed``, computed once and cached."""
    q, k, v, ref = pending_reference(problem, seed)
    return q, k, v, ref.result()


def release_references() -> bool:
    """Empty the reference cache and give its memory back; True when there was anything to free."""
    with _REFERENCE_LOCK:
        if not _REFERENCE_CACHE:
            return False
        _REFERENCE_CACHE.clear()
    gc.collect()
    return True


def _torch_on_device(torch, a, dev):
    """A host array on the device as float64: float16 and bfloat16 travel in their 16 bits and are
    widened there (a quarter of the float64 bytes over the bus), other dtypes as float32 or float64."""
    name = a.dtype.name
    if name == "float16":
        t = torch.from_numpy(np.ascontiguousarray(a))
    elif name == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    elif name == "float64":
        t = torch.from_numpy(np.ascontiguousarray(a))
    else:
        t = torch.from_numpy(np.asarray(a, np.float32))
    return t.to(dev).double()


def reference_torch(q, k, v, *, causal, scale, device="cuda"):
    """The same float64 reference computed with torch on the GPU (large problems), a batch entry
    at a time (its K and V widened to float64 on the device, the query rows of a KV head's group
    in chunks); None when torch/CUDA is not usable. ``device``: where torch computes it ("cpu" in
    the tests of a machine without a GPU)."""
    torch = usable_torch(device)
    if torch is None:
        return None
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    out = np.empty((B, H, Nq, D), np.float64)
    rows = G * Nq  # the query rows of one KV head, ordered (head in the group, query)
    chunk = int(max(1, min(rows, (256 * 2**20) // (8 * max(Nk, 1)))))
    dev = torch.device(device)
    with torch.no_grad():
        jj = torch.arange(Nk, device=dev)[None, :]
        for b in range(B):
            kb, vb, qb = (_torch_on_device(torch, x[b], dev) for x in (k, v, q))
            ob = torch.empty((H, Nq, D), dtype=torch.float64, device=dev)
            for hk in range(Hkv):
                qg = qb[hk * G:(hk + 1) * G].reshape(rows, D)
                og = ob[hk * G:(hk + 1) * G].view(rows, D)
                for r0 in range(0, rows, chunk):
                    s = (qg[r0:r0 + chunk] @ kb[hk].T) * scale
                    if causal:
                        ii = (torch.arange(r0, min(r0 + chunk, rows), device=dev) % Nq)[:, None]
                        s = s.masked_fill(jj > ii + (Nk - Nq), float("-inf"))
                    m = s.max(dim=1, keepdim=True).values
                    p = torch.exp(s - m)
                    og[r0:r0 + chunk] = (p @ vb[hk]) / p.sum(dim=1, keepdim=True)
            out[b] = ob.cpu().numpy()
            del kb, vb, qb, ob
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            torch.cuda.empty_cache()
    return out


# -- host <-> device -------------------------------------------------------------


def to_device(a, stream=0):
    """Host array → device array. bfloat16 (``ml_dtypes``) has no buffer-protocol
    code numba accepts, so it travels as its 16-bit pattern (``uint16``); the
    phases read it as such."""
    from numba import cuda

    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    elif a.dtype.name == "float8_e4m3fn":  # an 8-bit cache travels as its bytes
        a = a.view(np.uint8)
    return cuda.to_device(a, stream=stream)


def to_host(d, like_dtype, stream=0):
    """Device array → host array in ``like_dtype`` (undoing the bfloat16 view)."""
    out = d.copy_to_host(stream=stream)
    return out.view(like_dtype) if out.dtype != like_dtype else out


def kernel_views(problem: Problem, q, k, v, o):
    """(B, H, N, D) device arrays → the (B·H, N, D) views kernels index."""
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    if getattr(problem, "page_size", 0):  # the caches as they are (num_blocks, page_size, Hkv, D)
        return q.reshape(B * H, problem.q_len, D), k, v, o.reshape(B * H, problem.q_len, D)
    if getattr(problem, "varlen", False):  # packed sequences as they are: (total, heads, D)
        return q, k, v, o
    return (q.reshape(B * H, problem.q_len, D), k.reshape(B * Hkv, problem.kv_len, D),
            v.reshape(B * Hkv, problem.kv_len, D), o.reshape(B * H, problem.q_len, D))


# -- the check of a launch ---------------------------------------------------------


@dataclass
class LaunchCheck:
    """The outcome of :func:`check_launch`."""

    worst: Check  # the worst check over the seeds run (a failure if any failed)
    seeds: list  # the seeds checked, in order (the check stops at the first failure)
    first_launch_s: float  # wall time of the first launch, compilation included
    first_launch_end: float  # ``time.perf_counter()`` when the first launch had finished
    device_arrays: tuple  # (q, k, v, o) on the device, of the last seed checked
    stage_s: dict = None  # seconds spent: "reference" (inputs drawn, then waiting for the reference),
    # (of which "reference_draw" and "reference_compute" when computed here),
    # "inputs" (host to device, output poisoned), "launch" (every seed, the first's compilation
    # included), "compare" (output back and compared)

    @property
    def ok(self) -> bool:
        return self.worst.ok


def check_launch(launch, problem: Problem, seeds, precision, stream) -> LaunchCheck:
    """For each seed: inputs to the device, the output buffer poisoned, one launch, the
    output compared with the float64 reference; stops at the first wrong result."""
    checks, first_s, first_end, arrays = [], 0.0, 0.0, ()
    stages = dict.fromkeys(("reference", "inputs", "launch", "compare"), 0.0)
    before = dict(REFERENCE_SECONDS)
    for i, seed in enumerate(seeds):
        t0 = time.perf_counter()
        q, k, v, pending = pending_reference(problem, seed)  # the reference computed while the launch compiles
        t1 = time.perf_counter()
        qd, kd, vd = (to_device(a, stream=stream) for a in (q, k, v))
        od = to_device(poison(np.empty(problem.out_shape(), numpy_dtype(problem.dtype)), problem.dtype),
                       stream=stream)  # (the output's dtype: e4m3 inputs give float16/bfloat16)
        stream.synchronize()
        arrays = (qd, kd, vd, od)
        t2 = time.perf_counter()
        launch(*kernel_views(problem, qd, kd, vd, od), stream)
        stream.synchronize()
        t3 = time.perf_counter()
        if i == 0:
            first_end, first_s = t3, t3 - t2
        out = to_host(od, numpy_dtype(problem.dtype), stream=stream)
        stream.synchronize()
        t4 = time.perf_counter()
        ref = pending.result()
        t5 = time.perf_counter()  # (the wait for the reference counts as "reference", not "compare")
        c = check(out, ref, dtype=problem.dtype, precision=precision)
        checks.append(c)
        for name, dt in zip(stages, (t1 - t0 + t5 - t4, t2 - t1, t3 - t2, time.perf_counter() - t5 + t4 - t3)):
            stages[name] += dt
        if not c.ok:
            break
    for name in REFERENCE_SECONDS:  # of "reference": drawing the inputs, computing the reference
        stages[f"reference_{name}"] = REFERENCE_SECONDS[name] - before[name]
    worst = max(checks, key=lambda c: (not c.ok, c.rel_err))
    return LaunchCheck(worst, list(seeds[: len(checks)]), first_s, first_end, arrays, stages)


def checked_launches(cases, names=()):
    """One checked launch per case, for a profiler (Nsight Compute flushes the caches before each profiled launch,
    so the checked launch is the profiled one): ``cases`` maps a name to (phase name, problem, params); ``names``
    picks some (all when empty). Each output is compared with the float64 reference before the next case, and a
    wrong one stops the run (``SystemExit``), so no profile is of a launch that computed something else."""
    from numba import cuda

    from numba_attn.phases.registry import get_phase

    stream = cuda.stream()
    for name in names or cases:
        phase_name, prob, params = cases[name]
        phase = get_phase(phase_name)
        launch = phase.plan(prob, **params)
        got = check_launch(launch, prob, [1], phase.precision, stream)
        print(f"{name}: {phase_name} {prob.label} seed {prob.seed} params {launch.params}: "
              f"{'ok' if got.ok else 'WRONG'} (rel err {got.worst.rel_err:.2e})", flush=True)
        if not got.ok:
            raise SystemExit(f"{name}: wrong result, {got.worst.reason}")


def recheck_outputs(problem: Problem, seed: int, outputs, precision, stream) -> str:
    """Check device outputs (``(B·H, N, D)`` views) of launches on ``seed``'s inputs again;
    the first failure's reason, or "" when all are right."""
    q, k, v, ref = cached_reference(problem, seed)
    for idx, od in outputs:
        od_host = to_host(od, numpy_dtype(problem.dtype), stream=stream)
        stream.synchronize()
        c = check(od_host.reshape(problem.out_shape()), ref, dtype=problem.dtype, precision=precision)
        if not c.ok:
            return f"input set {idx}: {c.reason}"
    return ""
