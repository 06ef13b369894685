"""``attention()``: run one phase on arrays, the way a notebook or a test calls it.

Every input check happens before anything is compiled, allocated or launched,
and fails with :class:`~numba_attn.spec.errors.AttentionInputError` (a
``ValueError``) naming the argument and the allowed range:

* q, k, v must be 4-D NumPy or numba device arrays of one dtype among
  float32, float16, bfloat16; k and v of one shape; same batch and head_dim
  as q; q's heads a multiple of k/v's heads;
* empty problems: ``q_len == 0`` (or batch/heads 0) returns an empty output
  without launching anything; ``kv_len == 0`` with queries is an error (the
  softmax over zero keys is undefined);
* ``causal`` needs ``q_len <= kv_len`` (bottom-right alignment); ``scale``
  must be a positive finite number;
* non-contiguous NumPy inputs are **copied** to contiguous ones;
  non-contiguous device arrays are **refused** (copying them would hide a
  device-to-device copy in the call);
* ``phase``: an unknown name suggests close names; a phase that cannot run the
  problem (head_dim, dtype, causal) names the phases that can; unknown tunable
  parameters are refused with the list of the phase's parameters;
* a problem whose inputs and output do not fit in the free device memory is
  refused up front; a tile configuration the device cannot launch (threads or
  shared memory per block) is reported as such, not as a crash.

NaN/Inf inputs (``nonfinite``): by default (``"propagate"``) they are computed
like any value and the output has NaN where the float64 reference has NaN
(checked for every phase in the simulator tests, and on an H200 on 2026-11-22
with the kernels' fast-math flags); ``"raise"`` scans the inputs first and
refuses them, naming the array and the first bad element.
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.spec.errors import AttentionInputError, check_arrays, check_finite  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402
from numba_attn.phases.registry import get_phase, list_phases  # noqa: E402


def is_device_array(a) -> bool:
    """A numba device array (or, in the simulator, its stand-in)."""
    if hasattr(cuda, "is_cuda_array"):
        return cuda.is_cuda_array(a)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return isinstance(a, FakeCUDAArray)


def problem_from_arrays(q, k, v, *, causal=False, scale=None) -> Problem:
    check_arrays(q, k, v)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    return Problem(batch=B, heads=H, q_len=Nq, kv_len=Nk, head_dim=D, causal=bool(causal),
                   dtype=np.dtype(q.dtype).name, scale=scale, kv_heads=Hkv)


def pick_phase(problem: Problem, kind: str | None = None):
    """The last phase in roadmap order (the most optimized) that supports ``problem``."""
    phases = list_phases()
    if kind is None:
        kind = "decode" if problem.q_len <= 8 and any(p.kind == "decode" for p in phases) else "prefill"
    candidates = [p for p in phases if p.kind == kind and p.supports(problem) is None]
    if not candidates:
        candidates = [p for p in phases if p.supports(problem) is None]
    if not candidates:
        raise AttentionInputError(f"no registered phase supports {problem.label}")
    return candidates[-1]


def _contiguous(name, a):
    if is_device_array(a):
        ok = a.is_c_contiguous() if hasattr(a, "is_c_contiguous") else True
        if not ok:
            raise AttentionInputError(
                f"{name} is a non-contiguous device array (strides {tuple(a.strides)}); pass a C-contiguous "
                f"one, e.g. cuda.to_device(np.ascontiguousarray(...)) (device arrays are not copied implicitly)")
        return a
    return np.ascontiguousarray(a)


def _empty_output(q, shape):
    if is_device_array(q):
        return cuda.device_array(shape, dtype=q.dtype)
    return np.empty(shape, dtype=q.dtype)


def attention(q, k, v, *, causal=False, scale=None, phase=None, nonfinite="propagate", **params):
    """Softmax attention of q (B, H, Nq, D) over k, v (B, Hkv, Nk, D).

    ``phase`` names a registered phase (``None``: the most optimized phase that
    supports the problem); extra keyword arguments override its tunable
    parameters. NumPy arrays in → NumPy array out; numba device arrays in →
    device array out. Input rules and errors: see the module docstring.
    """
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    check_arrays(q, k, v)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if B == 0 or H == 0 or Nq == 0:  # nothing to compute; still validate the scalar arguments
        if causal and Nq > Nk:
            problem_from_arrays(q, k, v, causal=causal, scale=scale)  # raises the causal error
        if scale is not None:
            Problem(q_len=1, kv_len=1, head_dim=max(D, 1), scale=scale)
        if phase is not None:
            get_phase(phase)
        return _empty_output(q, (B, H, Nq, D))
    problem = problem_from_arrays(q, k, v, causal=causal, scale=scale)
    ph = get_phase(phase) if phase is not None else pick_phase(problem)
    try:
        resolved = ph.resolve_params(params)
    except ValueError as exc:
        raise AttentionInputError(str(exc)) from None
    reason = ph.supports(problem, **resolved)
    if reason:
        supporting = [p.name for p in list_phases() if p.supports(problem) is None]
        raise AttentionInputError(f"phase {ph.name!r} cannot run {problem.label}: {reason}. "
                                  f"Phases that can: {', '.join(supporting) or 'none'}")
    if nonfinite == "raise":
        for name, a in (("q", q), ("k", k), ("v", v)):
            check_finite(name, a)
    q, k, v = (_contiguous(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    on_device = is_device_array(q)
    from numba_attn.measure import limits
    from numba_attn.measure.check import to_device, to_host
    from numba_attn.measure.status import classify_exception

    free = limits.free_device_memory()
    need = problem.min_bytes() if not on_device else int(np.prod(problem.out_shape())) * problem.itemsize
    if free is not None and need > free:
        raise AttentionInputError(f"{problem.label} needs {need / 2**30:.2f} GiB of device memory for its "
                                  f"inputs and output; {free / 2**30:.2f} GiB free")
    try:
        with limits.simulated_device_limits():
            launch = ph.plan(problem, **params)
            if on_device:
                qd, kd, vd = q, k, v
            else:
                qd, kd, vd = (to_device(a) for a in (q, k, v))
            od = cuda.device_array((B, H, Nq, D), dtype=qd.dtype)
            launch(qd.reshape(B * H, Nq, D), kd.reshape(B * Hkv, Nk, D), vd.reshape(B * Hkv, Nk, D),
                   od.reshape(B * H, Nq, D))
            if not on_device:
                return to_host(od, q.dtype)
            return od
    except Exception as exc:  # noqa: BLE001
        status, why, _ = classify_exception(exc)
        if status == "SKIP" or isinstance(exc, limits.DeviceLimitError):
            raise AttentionInputError(f"phase {ph.name!r} with {resolved} cannot run {problem.label} on this "
                                      f"device: {why}. Try smaller tiles or another phase.") from exc
        raise
