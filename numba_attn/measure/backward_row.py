"""One backward phase on one problem → one result row: :func:`numba_attn.measure.row.measure` makes it with the
steps here, so ``numba-attn run --phases bwd_mma`` records, resumes, times and compares backward rows like any
other.

1. ``supports`` (and the device and host memory) — refused problems are ``SKIP`` with the reason;
2. for every seed: fresh inputs in the problem's dtype, a random dO drawn after them and the float64 gradients
   (:func:`numba_attn.spec.grad_reference.backward_case`); o in the dtype and lse in float32 from the float64 forward; dq,
   dk, dv poisoned, the launch, each gradient checked with the dtype's tolerance. A wrong or unwritten gradient
   makes the row ``FAIL``, never timed;
3. on the GPU only: timed by the run's method (events, graph replay, CUPTI kernel time) over rotated input sets
   (each with its own poisoned gradients), then the first and last sets' gradients checked again. TFLOP/s counts
   the backward's five matrix products (:data:`BACKWARD_FLOPS`: 2.5× the forward's two).
"""
from __future__ import annotations

import math
import time

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure.row_figures import kernel_resources, summarize_resources, timed_row
from numba_attn.measure.status import FAIL, OK
from numba_attn.measure.timing import l2_bytes, end_to_end, timed
from numba_attn.spec.problem import Problem, numpy_dtype
from numba_attn.spec.reference import check, poison

BACKWARD_FLOPS = 2.5  # S = Q Kᵀ, dP = dO Vᵀ, dV = Pᵀ dO, dK = dSᵀ Q, dQ = dS K against the forward's S and P V
GRADS = ("dq", "dk", "dv")


class BackwardWork:
    """The backward's work on ``problem`` (what :func:`~numba_attn.measure.row.timed_row` divides by): its FLOPs
    and the bytes it must move (read q, k, v, o, dO and lse; write dq, dk, dv)."""

    def __init__(self, problem: Problem):
        self.problem = problem

    def flops(self) -> float:
        return BACKWARD_FLOPS * self.problem.flops()

    def min_bytes(self) -> int:
        p = self.problem
        item = numpy_dtype(p.dtype).itemsize
        q_bytes = p.batch * p.heads * p.q_len * p.head_dim * item
        kv_bytes = p.batch * p.kv_heads * p.kv_len * p.head_dim * item
        return 4 * q_bytes + 4 * kv_bytes + 4 * p.batch * p.heads * p.q_len


def _to_device(a, stream):
    from numba import cuda

    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    return cuda.to_device(a, stream=stream)


def _poisoned_grads(problem: Problem, shapes, stream):
    """Device buffers for dq, dk, dv filled with the dtype's poison pattern (an unwritten element fails)."""
    dt = numpy_dtype(problem.dtype)
    return [_to_device(poison(np.empty(s, dt), problem.dtype), stream) for s in shapes]


def _grads_errors(problem: Problem, precision, grads, ref):
    """(checks by gradient name, worst check) of device ``grads`` against the float64 reference."""
    dt = numpy_dtype(problem.dtype)
    checks = {n: check(g.copy_to_host().view(dt), r, dtype=problem.dtype, precision=precision)
              for n, g, r in zip(GRADS, grads, ref)}
    return checks, worst_check(checks)


def worst_check(checks: dict):
    """The check of ``checks`` (by gradient name) a row reports: a failed one first, else the largest error."""
    return max(checks.values(), key=lambda c: (not c.ok, c.rel_err))


def check_and_time_backward(phase, problem, cfg, params, row, cuda):
    """Steps 2 and 3 of a backward row (the module's docstring) into ``row``, for :func:`measure`."""
    from numba_attn.phases.backward.common import run_backward_launch
    from numba_attn.spec.grad_reference import backward_case
    from numba_attn.variants.blockmask import device_arrays

    t0 = time.perf_counter()
    launch = phase.plan(problem, **params)
    row["params"] = dict(launch.params or params)
    row["workspace_bytes"] = int(getattr(launch, "workspace_bytes", 0) or 0)
    variant = getattr(problem, "variant", None)
    mods = () if variant is None else device_arrays(variant.aux)
    stream = cuda.stream()
    stages = {"plan": time.perf_counter() - t0}
    row["stage_s"] = stages
    dt = numpy_dtype(problem.dtype)
    for seed in cfg.seeds:
        t1 = time.perf_counter()
        q, k, v, do, ref = backward_case(problem, seed)
        stages["reference"] = stages.get("reference", 0.0) + time.perf_counter() - t1
        inputs = [_to_device(a, stream) for a in (q, k, v, ref.o.astype(dt), ref.lse.astype(np.float32), do)]
        grads = _poisoned_grads(problem, (q.shape, k.shape, v.shape), stream)
        t1 = time.perf_counter()
        run_backward_launch(launch, inputs, grads, stream, mods)
        stream.synchronize()
        row.setdefault("first_launch_s", time.perf_counter() - t1)  # includes compilation
        checks, worst = _grads_errors(problem, phase.precision, grads, ref)
        row["rel_err"] = {n: c.rel_err for n, c in checks.items()}
        row["check"] = worst.to_dict()
        row["seeds"] = row.get("seeds", []) + [seed]
        if not worst.ok:
            bad = "; ".join(f"{n}: {c.reason}" for n, c in checks.items() if not c.ok)
            row.update(status=FAIL, reason=f"wrong gradients (seed {seed}): {bad}")
            return
    row["reference"] = "float64 gradients (spec/grad_reference.py)"
    row["resources"] = kernel_resources(launch.kernels)
    summarize_resources(row)
    work = BackwardWork(problem)
    if IS_SIMULATOR or not cfg.time_kernels:
        row.update(status=OK, reason="checked; not timed (simulator)" if IS_SIMULATOR else "checked; not timed")
        return
    t1 = time.perf_counter()
    # input sets rotated so that a small problem is not timed from the L2 cache, each with its own gradients
    n_sets = int(min(8, max(1, math.ceil(3 * l2_bytes() / max(work.min_bytes(), 1)))))
    sets = [(inputs, grads)] + [([_to_device(a.copy_to_host(), stream) for a in inputs],
                                 _poisoned_grads(problem, (q.shape, k.shape, v.shape), stream))
                                for _ in range(n_sets - 1)]

    def fn(i, s=stream):
        run_backward_launch(launch, *sets[i % len(sets)], s, mods)

    stream.synchronize()
    stages["input_sets"] = time.perf_counter() - t1
    t = timed(fn, stream, cfg.timing)
    stages.update(t.pop("stage_s", {}))
    t["e2e_ms"] = end_to_end(fn, stream)
    t["input_sets"] = len(sets)
    bad = []
    for idx in sorted({0, len(sets) - 1}):  # the last set's gradients started poisoned
        checks, worst = _grads_errors(problem, phase.precision, sets[idx][1], ref)
        if not worst.ok:
            bad.append(f"set {idx}: " + "; ".join(f"{n}: {c.reason}" for n, c in checks.items() if not c.ok))
    if bad:
        t["post_timing_check"] = "; ".join(bad)
    timed_row(row, work, t)
