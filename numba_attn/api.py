"""``attention()``: run one phase on arrays, the way a notebook or a test calls it."""
from __future__ import annotations

import numpy as np
from numba import cuda

from .errors import AttentionInputError
from .problem import Problem
from .registry import get_phase, list_phases

# fastest first when the caller does not name a phase (roadmap order, last wins)


def is_device_array(a) -> bool:
    """A numba device array (or, in the simulator, its stand-in)."""
    if hasattr(cuda, "is_cuda_array"):
        return cuda.is_cuda_array(a)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return isinstance(a, FakeCUDAArray)


def problem_from_arrays(q, k, v, *, causal=False, scale=None) -> Problem:
    for name, a in (("q", q), ("k", k), ("v", v)):
        if getattr(a, "ndim", None) != 4:
            raise AttentionInputError(
                f"{name} must be a 4-D array (batch, heads, length, head_dim); got "
                f"{'shape ' + str(tuple(a.shape)) if hasattr(a, 'shape') else type(a).__name__}")
    B, H, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Bk != B:
        raise AttentionInputError(f"q and k must have the same batch size; got {B} and {Bk}")
    if Dk != D:
        raise AttentionInputError(f"q and k must have the same head_dim; got {D} and {Dk}")
    if Hkv < 1 or H % Hkv:
        raise AttentionInputError(f"q heads ({H}) must be a multiple of k/v heads ({Hkv})")
    dts = {np.dtype(a.dtype).name for a in (q, k, v)}
    if len(dts) != 1:
        raise AttentionInputError(f"q, k and v must share one dtype; got {sorted(dts)}")
    return Problem(batch=B, heads=H, q_len=Nq, kv_len=Nk, head_dim=D, causal=bool(causal),
                   dtype=dts.pop(), scale=scale, kv_heads=Hkv)


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


def attention(q, k, v, *, causal=False, scale=None, phase=None, **params):
    """Softmax attention of q (B, H, Nq, D) over k, v (B, Hkv, Nk, D).

    ``phase`` names a registered phase (``None``: the most optimized phase that
    supports the problem); extra keyword arguments override its tunable
    parameters. NumPy arrays in → NumPy array out; numba device arrays in →
    device array out. Non-contiguous NumPy inputs are copied to contiguous ones.
    """
    problem = problem_from_arrays(q, k, v, causal=causal, scale=scale)
    ph = get_phase(phase) if phase is not None else pick_phase(problem)
    reason = ph.supports(problem, **ph.resolve_params(params))
    if reason:
        supporting = [p.name for p in list_phases() if p.supports(problem) is None]
        raise AttentionInputError(f"phase {ph.name!r} cannot run {problem.label}: {reason}. "
                                  f"Phases that can: {', '.join(supporting) or 'none'}")
    on_device = is_device_array(q)
    launch = ph.plan(problem, **params)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if on_device:
        qd, kd, vd = q, k, v
    else:
        qd, kd, vd = (cuda.to_device(np.ascontiguousarray(a)) for a in (q, k, v))
    od = cuda.device_array((B, H, Nq, D), dtype=qd.dtype)
    launch(qd.reshape(B * H, Nq, D), kd.reshape(B * Hkv, Nk, D), vd.reshape(B * Hkv, Nk, D),
           od.reshape(B * H, Nq, D))
    return od if on_device else od.copy_to_host()
