"""What a row costs in the Numba CUDA simulator, estimated before it runs, and the guard that refuses
a row estimated over a limit (60 s by default).

Every CUDA thread of the simulator is a Python thread, so a row costs about one Python-level step per
multiply-add of the attention (``flops / 2``: the *simulated thread-steps*) times the seeds it is
checked on. How fast a step runs depends on the machine and on the phase: a tensor-core phase emulates
each ``mma.sync`` with shuffles between 32 Python threads, a CUDA-core phase with shared tiles does
little else than its arithmetic. The estimate is

    seconds ≈ seeds · thread_steps / (python_ops_per_s() · STEP_RATE[family]) + OVERHEAD_S

where :func:`python_ops_per_s` is measured once per process on this machine (a tight Python loop, best
of 9 short runs, ~20 ms) and ``STEP_RATE`` (simulated thread-steps per Python loop step, by phase family) was
calibrated from real simulator rows (one seed; 2-core machine; a Python loop at 1.16e7 steps/s; the
simulator's event-driven block manager and vectorised mma.sync): naive 4e4 thread-steps/s, smem_kv 9e5,
register_blocked 3.7e5, tc_mma 1e5, tc_wgmma 1.9e5, decode_split_k 5.7e4, decode_mma 1.6e4. Each family's
rate is near its slowest phase's, so that a row is rarely estimated below its time; rows of one family differ
by up to ~3x from it, and small problems pay more start-up per step, so an estimate is good to about 3x
either way — enough to tell a 10-second row from a 40-minute one, which is its purpose.

``NUMBA_ATTN_ALLOW_SLOW=1`` (or ``--allow-slow``, ``RunConfig(allow_slow=True)``) runs such rows anyway,
with a warning; ``NUMBA_ATTN_SIM_LIMIT_S`` sets the limit.
"""
from __future__ import annotations

import functools
import os
import time

LIMIT_S = 60.0
ENV_ALLOW = "NUMBA_ATTN_ALLOW_SLOW"
ENV_LIMIT = "NUMBA_ATTN_SIM_LIMIT_S"
OVERHEAD_S = 2.0  # compiling (interpreting) the kernels, the reference, the worker's round trip

# simulated thread-steps per second, per Python loop step per second (see the module docstring)
STEP_RATE = {"naive": 3e-3, "cuda_core": 1.5e-2, "tensor_core": 8e-3, "decode": 1e-3, "other": 1e-3}


def allow_slow_env() -> bool:
    return os.environ.get(ENV_ALLOW, "").strip().lower() not in ("", "0", "false", "no")


def limit_s(default: float = LIMIT_S) -> float:
    try:
        return float(os.environ.get(ENV_LIMIT, "") or default)
    except ValueError:
        return default


@functools.cache
def python_ops_per_s() -> float:
    """Python-level loop steps per second on this machine (an indexed multiply-add per step; the best
    of 9 runs of 20k steps, ~2 ms each: on a shared machine the best run is one that got a whole time
    slice, so this is the machine's speed rather than its momentary load)."""
    a = [1.0] * 64
    best = float("inf")
    n = 20_000
    for _ in range(9):
        t0 = time.perf_counter()
        acc = 0.0
        for j in range(n):
            acc += a[j & 63] * 0.5
        best = min(best, time.perf_counter() - t0)
    return n / max(best, 1e-9)


def thread_steps(problem) -> int:
    """The problem's multiply-adds (``flops / 2``): one simulated thread-step each."""
    return max(1, int(problem.flops()) // 2)


def family(phase) -> str:
    if phase.name == "naive":
        return "naive"
    parts = (getattr(phase, "module", "") or "").split(".")
    for fam in ("cuda_core", "tensor_core", "decode"):
        if fam in parts:
            return fam
    return "other"  # a phase registered from a user's module: the slow families' rate


def estimate_s(phase, problem, seeds: int = 2) -> float:
    rate = python_ops_per_s() * STEP_RATE[family(phase)]
    return max(1, int(seeds)) * thread_steps(problem) / rate + OVERHEAD_S


def duration(s: float) -> str:
    if s < 90:
        return f"~{s:.0f} s"
    if s < 90 * 60:
        return f"~{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"~{s / 3600:.1f} h"
    return f"~{s / 86400:.0f} days"


def _pow2_below(n: int) -> int:
    """The largest power of two below ``n`` (1 for n <= 2)."""
    return max(1, 1 << (max(1, n - 1).bit_length() - 1))


def _supported(phase, problem) -> bool:
    try:
        return not phase.supports(problem, **phase.resolve_params({}))
    except Exception:  # noqa: BLE001 - a shape the phase refuses
        return False


def fitting_problem(phase, problem, seeds: int = 2, limit: float = LIMIT_S):
    """A smaller problem of the same kind the phase supports, estimated within half the limit: batch 1,
    one head, head_dim 32 (64, then the given one, when the phase needs them), then the lengths halved.
    None when even that does not fit."""
    base = dict(batch=1, heads=1, kv_heads=1)
    if hasattr(problem, "mean_len"):
        base["mean_len"] = 0
    for d in sorted({min(problem.head_dim, 32), min(problem.head_dim, 64), problem.head_dim}):
        try:
            p = problem.replace(**base, head_dim=d)
        except Exception:  # noqa: BLE001
            continue
        while estimate_s(phase, p, seeds) > limit / 2 and max(p.q_len, p.kv_len) > 16:
            q = p.q_len if p.q_len <= 16 else _pow2_below(p.q_len)
            k = max(q, _pow2_below(p.kv_len)) if p.causal else max(1, _pow2_below(p.kv_len))
            try:
                p = p.replace(q_len=q, kv_len=k)
            except Exception:  # noqa: BLE001
                break
        if estimate_s(phase, p, seeds) <= limit and _supported(phase, p):
            return p
    return None


def _shape_hint(problem, cli: bool) -> str:
    """The problem as command-line options (a plain problem on the command line) or keywords."""
    from numba_attn.spec.problem import Problem

    if cli and type(problem) is Problem:
        s = f"-B {problem.batch} -H {problem.heads} -N {problem.q_len} -D {problem.head_dim}"
        if problem.kv_len != problem.q_len:
            s += f" --kv-len {problem.kv_len}"
        return s
    s = f"batch={problem.batch}, heads={problem.heads}, q_len={problem.q_len}"
    if problem.kv_len != problem.q_len:
        s += f", kv_len={problem.kv_len}"
    return s + f", head_dim={problem.head_dim}"


def describe(phase, problem, seeds: int = 2, *, cli: bool = True, limit: float | None = None,
             prefix: str = "") -> tuple[float, str]:
    """``(estimated seconds, one line)``: the row, its estimate, a shape that fits (after ``prefix``, e.g.
    the command that takes it), how to run it anyway."""
    limit = limit_s() if limit is None else limit
    est = estimate_s(phase, problem, seeds)
    fit = fitting_problem(phase, problem, seeds, limit)
    hint = f"try {prefix}{_shape_hint(fit, cli)}, or " if fit is not None else ""
    how = "--allow-slow" if cli else f"allow_slow=True ({ENV_ALLOW}=1)"
    line = (f"{phase.name} {problem.label}: {duration(est)} in the simulator ({thread_steps(problem) * max(1, seeds):.1e} "
            f"simulated thread-steps; an estimate, within ~3x) over the {limit:g} s limit; {hint}pass {how}")
    return est, line


def slow_reason(phase, problem, seeds: int = 2, *, cli: bool = True, limit: float | None = None) -> str | None:
    """The one-line reason a row is refused in the simulator, or None when it is estimated within the limit."""
    limit = limit_s() if limit is None else limit
    if estimate_s(phase, problem, seeds) <= limit:
        return None
    return describe(phase, problem, seeds, cli=cli, limit=limit)[1]
