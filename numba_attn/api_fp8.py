"""``attention_fp8``: attention of q, k, v given as e4m3 codes with per-head scales (:mod:`numba_attn.spec.fp8_inputs`).

``attention(phase="fp8_overlap")`` takes float16/bfloat16 inputs and quantizes them before every call (four
kernels reading Q, K and V twice: ~10% of the call at B1 H32 N8192 D128). A model whose Q, K and V are already
e4m3 (an FP8 projection, an FP8 KV cache) passes the codes and their scales here instead: only V's codes are
rearranged (transposed, keys in the order the kernel's P fragments need: one kernel), then the FP8 kernel runs.
"""
from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402
from numba_attn.array_kinds import (DEVICE, NUMPY, TORCH, TORCH_CPU, as_device_array, contiguous,  # noqa: E402
                                    dtype_name, host_array, kind_of, numpy_as_tensor, stream_of)
from numba_attn.phases.registry import get_phase  # noqa: E402
from numba_attn.spec.errors import AttentionInputError, check_bool  # noqa: E402
from numba_attn.spec.fp8_inputs import Fp8InputProblem  # noqa: E402

# the phases that read e4m3 codes (e4m3_inputs=True)
FP8_INPUT_PHASES = ("fp8_overlap", "fp8_ws", "fp8_exp_fma", "fp8_lazy")
_PLANS: OrderedDict = OrderedDict()  # (phase, problem, params) -> Launch, the 16 most recent


def attention_fp8(q, k, v, q_descale, k_descale, v_descale, *, causal=False, scale=None, out_dtype="bfloat16",
                  phase=None, stream=None, **params):
    """Softmax attention of e4m3 inputs: q (B, H, Nq, D), k, v (B, Hkv, Nk, D) ``float8_e4m3fn`` (PyTorch tensors,
    ml_dtypes NumPy arrays, or numba device arrays of their bytes, uint8), the values ``code · descale``.

    ``q_descale``: a scalar, (B, H) or (B, Hkv) (shared by a KV head's query heads); ``k_descale``, ``v_descale``: a
    scalar or (B, Hkv) (FlashAttention-3's ``descale_q/k/v``); finite and > 0, float32. Returns (B, H, Nq, D) in
    ``out_dtype`` (``"bfloat16"`` or ``"float16"``) of q's kind; numba device arrays hold bfloat16 as uint16 bits.
    ``causal`` is bottom-right aligned as :func:`numba_attn.attention`'s; ``scale`` defaults to 1/sqrt(D).

    ``phase``: ``fp8_overlap`` (None), ``fp8_ws``, ``fp8_exp_fma`` or ``fp8_lazy``; ``params`` its parameters. Head dims
    32, 64, 128. The reference of these inputs is exact (:func:`numba_attn.spec.fp8_inputs.reference`): the error it
    reports is the kernel's (P in e4m3), not the inputs' rounding. Every input is checked before a launch, refused
    naming the argument. ``stream`` as :func:`numba_attn.attention` takes it (CUDA tensors: PyTorch's current stream
    by default). The call does not synchronize except for NumPy and CPU inputs (their result is copied back).
    """
    kind = kind_of(q)
    for name, a in (("k", k), ("v", v)):
        if kind_of(a) != kind:
            raise AttentionInputError(f"{name} is {kind_of(a) or type(a).__name__} but q is {kind}: q, k, v must be "
                                      f"of one kind")
    if kind not in (NUMPY, DEVICE, TORCH, TORCH_CPU):
        raise AttentionInputError(f"q must be a NumPy array, a numba device array or a PyTorch tensor; got "
                                  f"{type(q).__name__}")
    if kind == TORCH and backend.IS_SIMULATOR:
        raise AttentionInputError(f"q is a tensor on {q.device} but numba-attn runs in the CUDA simulator: pass CPU "
                                  f"tensors")
    B, H, Hkv, Nq, Nk, D = _check_shapes(q, k, v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        dt = dtype_name(name, a)
        if dt not in ("float8_e4m3", "uint8") or (dt == "uint8" and kind != DEVICE):
            raise AttentionInputError(f"{name} has dtype {dt}; attention_fp8 takes float8_e4m3fn codes (uint8 bytes "
                                      f"for numba device arrays); attention() takes float16/bfloat16")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if kind == TORCH and not a.is_contiguous():
            raise AttentionInputError(f"{name} is a non-contiguous tensor (strides {tuple(a.stride())}); pass "
                                      f"{name}.contiguous() (tensors are not copied implicitly)")
        if kind == DEVICE:
            contiguous(name, a)  # refuses a non-contiguous device array
    if out_dtype not in ("float16", "bfloat16", "fp16", "bf16"):
        raise AttentionInputError(f"out_dtype must be 'bfloat16' or 'float16', got {out_dtype!r}")
    out_dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(out_dtype, out_dtype)
    descale = (_descale("q_descale", q_descale, B, H, Hkv, True), _descale("k_descale", k_descale, B, H, Hkv),
               _descale("v_descale", v_descale, B, H, Hkv))  # device arrays as they are, host values on the device
    if B * H * Nq == 0:  # no query rows: an empty output, nothing launched
        return _empty(kind, q, (B, H, Nq, D), out_dtype)
    if Nk == 0:
        raise AttentionInputError("kv_len (dimension 2 of k and v) must be >= 1 when there are queries: the softmax "
                                  "over zero keys is undefined")
    try:
        problem = Fp8InputProblem(batch=B, heads=H, kv_heads=Hkv, q_len=Nq, kv_len=Nk, head_dim=D,
                                  causal=check_bool("causal", causal), dtype=out_dtype, scale=scale)
    except ValueError as e:
        raise AttentionInputError(str(e)) from e
    name = "fp8_overlap" if phase is None else (phase if isinstance(phase, str) else phase.name)
    ph = get_phase(name)
    if not ph.e4m3_inputs:
        raise AttentionInputError(f"phase {name!r} does not read e4m3 inputs (use {' or '.join(FP8_INPUT_PHASES)})")
    reason = ph.supports(problem, **ph.resolve_params(params))
    if reason:
        raise AttentionInputError(f"phase {name!r} cannot run {problem.label}: {reason}")
    key = (name, problem, tuple(sorted(params.items())))
    launch = _PLANS.get(key)
    if launch is None:
        launch = _PLANS[key] = ph.plan(problem, **params)
        while len(_PLANS) > 16:
            _PLANS.popitem(last=False)
    qd, kd, vd = (as_device_array(kind, a).reshape(-1, a.shape[2], D) for a in (q, k, v))
    stream = stream_of(kind, q, stream)[1]
    out = None
    if kind == TORCH:  # written in place: a tensor of q's device
        torch = sys.modules["torch"]
        out = torch.empty((B, H, Nq, D), dtype=getattr(torch, out_dtype), device=q.device)
        od = cuda.as_cuda_array(out.view(torch.int16) if out_dtype == "bfloat16" else out).reshape(B * H, Nq, D)
    else:
        od = cuda.device_array((B * H, Nq, D), dtype=np.float16 if out_dtype == "float16" else np.uint16)
    launch.run(qd, kd, vd, od, stream, None, descale=tuple(_on_device(d) for d in descale))
    return out if out is not None else _output(kind, od.reshape(B, H, Nq, D), out_dtype)


def _check_shapes(q, k, v):
    for name, a in (("q", q), ("k", k), ("v", v)):
        if len(a.shape) != 4:
            raise AttentionInputError(f"{name} must be 4-d (batch, heads, seq_len, head_dim), got shape "
                                      f"{tuple(a.shape)}")
    B, H, Nq, D = map(int, q.shape)
    if tuple(k.shape) != tuple(v.shape):
        raise AttentionInputError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    Bk, Hkv, Nk, Dk = map(int, k.shape)
    if Bk != B:
        raise AttentionInputError(f"k has batch {Bk}, q has {B}")
    if Dk != D:
        raise AttentionInputError(f"k head_dim {Dk} != q head_dim {D}")
    if Hkv < 1 or H % Hkv:
        raise AttentionInputError(f"q heads ({H}) must be a multiple of k's and v's kv_heads ({Hkv})")
    return B, H, Hkv, Nq, Nk, D


def _descale(name, s, B, H, Hkv, per_query_head=False):
    """A descale argument as float32 (B·H,) for q (``per_query_head``) or (B·Hkv,): a scalar broadcast; q's (B, Hkv)
    repeated over each KV head's query heads. Host values are refused unless finite and > 0. A CUDA tensor or numba
    device array of float32 and the exact shape (B, H) or (B, Hkv) (q: (B, H)) is passed on as it is, its shape
    and dtype checked but not its values (reading them would synchronize the call)."""
    heads = H if per_query_head else Hkv
    shapes = f"(B, H) = ({B}, {H}) or (B, Hkv) = ({B}, {Hkv})" if per_query_head else f"(B, Hkv) = ({B}, {Hkv})"
    if kind_of(s) in (TORCH, DEVICE):
        if tuple(s.shape) != (B, heads) or dtype_name(name, s) != "float32":
            raise AttentionInputError(f"{name} on the device must be float32 of shape ({B}, {heads}), got "
                                      f"{dtype_name(name, s)} {tuple(s.shape)} (or pass host values)")
        if kind_of(s) == TORCH:
            if not s.is_contiguous():
                raise AttentionInputError(f"{name} is a non-contiguous tensor; pass {name}.contiguous()")
            return cuda.as_cuda_array(s.detach()).reshape(B * heads)
        return s.reshape(B * heads)
    a = host_array(s)
    if a is None:
        raise AttentionInputError(f"{name} is required: the scale of the codes (value = code · {name})")
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        a = np.full((B, heads), float(a))
    elif per_query_head and a.shape == (B, Hkv) and H != Hkv:
        a = np.repeat(a, H // Hkv, axis=1)
    if a.shape != (B, heads):
        raise AttentionInputError(f"{name} must be a scalar or of shape {shapes}, got {a.shape}")
    if not (np.isfinite(a).all() and (a > 0).all()):
        bad = tuple(int(i) for i in np.argwhere(~(np.isfinite(a) & (a > 0)))[0])
        raise AttentionInputError(f"{name}{list(bad)} = {a[bad]}: every scale must be finite and > 0")
    return np.ascontiguousarray(a.reshape(-1), dtype=np.float32)


_SCALES: OrderedDict = OrderedDict()  # host scales' bytes -> their device copy, the 64 most recent


def _on_device(d):
    """A host descale (float32 NumPy) on the device, copied once per distinct value (a layer's scales are fixed:
    a repeated call copies nothing and does not synchronize); a device array as it is."""
    if not isinstance(d, np.ndarray):
        return d
    key = d.tobytes()
    hit = _SCALES.get(key)
    if hit is None:
        hit = _SCALES[key] = cuda.to_device(d)
        while len(_SCALES) > 64:
            _SCALES.popitem(last=False)
    else:
        _SCALES.move_to_end(key)
    return hit


def _empty(kind, q, shape, out_dtype):
    """An empty output of q's kind and ``out_dtype``."""
    if kind == TORCH:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, out_dtype), device=q.device)
    od = cuda.device_array(shape, dtype=np.float16 if out_dtype == "float16" else np.uint16)
    return _output(kind, od, out_dtype)


def _output(kind, od, out_dtype):
    """The output of q's kind (not a CUDA tensor: written in place): a device array, or a host array (ml_dtypes
    bfloat16), or a CPU tensor."""
    if kind == DEVICE:
        return od
    host = od.copy_to_host()
    if out_dtype == "bfloat16":
        import ml_dtypes

        host = host.view(ml_dtypes.bfloat16)
    return numpy_as_tensor(host) if kind == TORCH_CPU else host
