"""One phase on one problem → one result row: supports, fits, checked, timed, plausible.

1. ``supports`` — out-of-range problems are recorded ``SKIP`` with the reason;
   so is a problem whose inputs do not fit in the free device or host memory
   (checked before anything is allocated, :mod:`numba_attn.measure.limits`) and a
   configuration the device refuses (too many threads or too much shared memory
   per block, out of memory);
2. correctness on fresh inputs for every seed (:mod:`numba_attn.measure.check`):
   the output buffer is poisoned, the phase runs, the result is compared with the
   float64 reference. Any failure makes the row ``FAIL`` and it is never timed;
3. on the GPU only, timing (:func:`numba_attn.measure.timing.time_launch`) and the
   compiled kernels' resources (registers, static shared memory, local memory =
   spills and local arrays). The output is checked again after timing. A time
   below a physical floor is ``FAIL``;
4. in the simulator only, what the first checked launch did, counted
   (:mod:`numba_attn.measure.simcount`: global bytes and sectors, shared bytes,
   wavefronts and bank conflicts, barriers, mma/ldmatrix/cp.async/wgmma/TMA
   instructions) into the row's ``sim_*`` fields — one launch, one seed — when
   ``NUMBA_ATTN_SIM_COUNTS=1``: ``numba-attn run`` sets it unless ``--no-counts``
   (a counted launch takes 1-5x an uncounted one's CPU time, the default run
   about 20 % more); tune, bench and the tests count only when asked.

An exception becomes an ``ERROR`` row with a summary of the traceback
(:mod:`numba_attn.measure.status`); ``NUMBA_ATTN_RAISE=1`` raises it instead.
"""
from __future__ import annotations

import os
import time

from numba_attn.gpu.backend import BACKEND, IS_SIMULATOR
from numba_attn.spec.problem import Problem
from numba_attn.phases.registry import BACKWARD, Phase, get_phase
from numba_attn.measure import limits
from numba_attn.measure.check import check_launch, reference_name, release_references
from numba_attn.measure.config import RunConfig
from numba_attn.measure.status import FAIL, OK, SKIP, classify_exception
from numba_attn.measure.timing import time_launch
from numba_attn.measure.row_figures import (MAX_PLAUSIBLE_BYTES_PER_S, MAX_PLAUSIBLE_FLOPS,  # noqa: F401
                                            add_throughput, implausible_reason, kernel_resources,
                                            summarize_resources, timed_row)



def measure(phase: Phase | str, problem: Problem, cfg: RunConfig | None = None, **overrides) -> dict:
    """Check (and on the GPU time) one phase on one problem; returns the row."""
    from numba import cuda

    cfg = cfg or RunConfig()
    phase = get_phase(phase) if isinstance(phase, str) else phase
    params = phase.resolve_params({**cfg.params.get(phase.name, {}), **overrides})
    row = phase_row(phase, problem)
    row["params"] = params
    check_and_time = _check_and_time
    if phase.kind == BACKWARD:  # gradients: other arrays, another reference, the backward's FLOPs
        from numba_attn.measure.backward_row import BackwardWork, check_and_time_backward

        work = BackwardWork(problem)
        row.update(flops=work.flops(), min_bytes=work.min_bytes())
        check_and_time = check_and_time_backward
    reason = phase.supports(problem, **params) or empty_problem_reason(problem) or memory_reason(problem)
    if reason:
        row.update(status=SKIP, reason=reason)
        return row
    try:
        with limits.simulated_device_limits():
            check_and_time(phase, problem, cfg, params, row, cuda)
    except Exception as exc:  # one phase crashing must not end the sweep
        if os.environ.get("NUMBA_ATTN_RAISE"):  # debugging: the full traceback instead of an ERROR row
            raise
        status, why, poisoned = classify_exception(exc)
        row.update(status=status, reason=why)
        if poisoned:
            row["context_poisoned"] = True
    return row


def phase_row(phase: Phase, problem: Problem) -> dict:
    """The identity of a phase's row on ``problem``, before anything is run."""
    return {"type": "result", "phase": phase.name, "kind": "phase", "order": phase.order,
            "phase_kind": phase.kind, "precision": phase.precision, "parent": phase.parent,
            "problem": problem.to_dict(), "label": problem.label, "params": {},
            "planned_speedup": phase.planned_speedup, "backend": BACKEND, "status": None,
            "reason": "", "flops": problem.flops(), "min_bytes": problem.min_bytes()}


def empty_problem_reason(problem: Problem) -> str | None:
    if problem.q_len * problem.kv_len * problem.batch * problem.heads == 0:
        return f"empty problem (q_len={problem.q_len}, kv_len={problem.kv_len}): nothing to measure"
    return None


def memory_reason(problem: Problem) -> str | None:
    """Why ``problem`` cannot be checked here (device or host memory), or None. Cached
    references of earlier problems are released first when host memory is short."""
    free = limits.free_device_memory()
    need = limits.device_bytes_needed(problem)
    if free is not None and need > free:
        return (f"problem needs {need / 2**30:.2f} GiB of device memory for q, k, v "
                f"and o; {free / 2**30:.2f} GiB free")
    host_free, host_need = limits.free_host_memory(), limits.host_bytes_needed(problem)
    if host_free is not None and host_need > 0.5 * host_free and release_references():
        host_free = limits.free_host_memory()
    if host_free is not None and host_need > 0.9 * host_free:
        return (f"checking this problem needs ~{host_need / 2**30:.1f} GiB of host memory "
                f"(inputs and float64 reference); {host_free / 2**30:.1f} GiB available")
    return None


def _check_and_time(phase, problem, cfg, params, row, cuda):
    t0 = time.perf_counter()
    launch = phase.plan(problem, **params)
    row["params"] = dict(launch.params or params)  # the parameters that ran, automatic ones resolved
    row["workspace_bytes"] = int(getattr(launch, "workspace_bytes", 0) or 0)
    row["model_bytes"] = model_bytes(phase.name, problem, row["workspace_bytes"], cfg.baseline)
    stream = cuda.stream()
    stages = {"plan": time.perf_counter() - t0}
    row["stage_s"] = stages  # where the row's wall time went, by step (seconds)
    counted = None
    if sim_counts_enabled():
        from numba_attn.measure.simcount import FirstLaunchCounted

        counted = FirstLaunchCounted(launch)  # the first seed's launch, counted
    checked = check_launch(counted or launch, problem, cfg.seeds, phase.precision, stream)
    stages.update(checked.stage_s or {})
    if counted is not None and counted.counts:
        row.update(counted.counts)
    if checked.seeds:
        row["first_launch_s"] = checked.first_launch_s  # includes compilation
        row["sim_wall_s" if IS_SIMULATOR else "plan_s"] = checked.first_launch_end - t0
    row["check"] = checked.worst.to_dict()
    row["seeds"] = checked.seeds
    row["reference"] = reference_name(problem)
    row["resources"] = kernel_resources(launch.kernels)
    summarize_resources(row)
    if not checked.ok:
        row.update(status=FAIL, reason=f"wrong result (seed {checked.seeds[-1]}): {checked.worst.reason}")
        return
    if IS_SIMULATOR or not cfg.time_kernels:
        row.update(status=OK, reason="checked; not timed (simulator)" if IS_SIMULATOR else "checked; not timed")
        return
    timing = time_launch(launch, problem, checked.device_arrays, stream, cfg.timing,
                         compare=bool(cfg.compare_timing), seed=checked.seeds[-1], precision=phase.precision)
    stages.update(timing.pop("stage_s", {}))
    timed_row(row, problem, timing)


def sim_counts_enabled() -> bool:
    """Whether rows count their first launch: in the simulator, with ``NUMBA_ATTN_SIM_COUNTS=1`` (``numba-attn run``
    sets it unless ``--no-counts``)."""
    return IS_SIMULATOR and os.environ.get("NUMBA_ATTN_SIM_COUNTS", "0").strip().lower() in ("1", "yes", "true", "on")


# -- figures derived for a row -------------------------------------------------------


def model_bytes(phase_name: str, problem: Problem, workspace_bytes: int, baseline: str = "naive") -> int:
    """Bytes the phase moves through device memory by construction: the baseline
    materializes S and P (``Problem.materialized_bytes``); a fused phase moves the
    minimum plus its workspace written once and read once."""
    if phase_name == baseline:
        return problem.materialized_bytes()
    return problem.min_bytes() + 2 * int(workspace_bytes or 0)
