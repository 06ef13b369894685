"""``attention_varlen()``: attention over a packed ragged batch (FlashAttention's varlen layout), with its plan
cache; re-exported by :mod:`numba_attn.api`."""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from numba_attn import plans
from numba_attn.api_checks import layout_plan, phase_arg, probe_variant, variant_arg
from numba_attn.array_kinds import (DEVICE, TORCH, TORCH_CPU, arrays_for_checks, as_device_array, check_out,
                                    contiguous, empty_output, host_array, kind_of, numpy_as_tensor, one_kind,
                                    stream_of, tensor_as_numpy)
from numba_attn.gpu import backend
from numba_attn.measure.policy import VARLEN_DEFAULT
from numba_attn.spec.errors import AttentionInputError, check_bool
from numba_attn.spec.problem import Problem

_VARLEN_PLANS: OrderedDict = OrderedDict()


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, causal=False,
                     scale=None, phase=None, params=None, out=None, stream=None, mask_mod=None, score_mod=None,
                     aux=None):
    """Attention over a packed ragged batch, FlashAttention's ``flash_attn_varlen_func`` layout:
    ``q`` (total_q, H, D); ``k``, ``v`` (total_k, Hkv, D); ``cu_seqlens_q``, ``cu_seqlens_k`` int32
    (B + 1,), starting at 0, non-decreasing, the last entry the total (sequence b: rows
    ``cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1`` of q and ``cu_seqlens_k[b] …`` of k, v). Returns
    (total_q, H, D) of q's kind (NumPy arrays, numba device arrays or PyTorch tensors, as
    ``attention()``: the same kind, ``out`` and ``stream`` rules and errors); float16 or bfloat16.

    ``causal``: bottom-right aligned per sequence (query i of a sequence with Lq queries and Lk
    keys sees keys j <= i + Lk − Lq; needs Lq <= Lk). A sequence without queries is allowed (no
    output rows); one with queries and no keys is refused. ``max_seqlen_q``/``max_seqlen_k``: the
    longest sequences (default: read from the cu_seqlens; a given value must not be smaller); the
    grid covers ``max_seqlen_q`` query rows per sequence. The input checks (spec/varlen.py) run
    before anything is launched; the cu_seqlens are read on the host for them (device ones are
    copied back once per call, then launched on as they are).

    ``phase``: ``tc_wgmma_varlen`` (sm_90a) or ``tc_mma_varlen`` (None: the first of them that
    supports the problem and the device); ``params``: a dict of the phase's tunable parameters.

    ``mask_mod``, ``score_mod``, ``aux``: a variant, as :func:`attention` takes it (docs/variants.md); the
    functions see sequence ``b`` as batch index ``b`` and positions within the sequence (``q_idx`` aligned
    bottom-right to its keys). No block mask: every key tile up to the causal bound is visited.
    """
    from numba import cuda

    from numba_attn.spec.problem import VarlenProblem
    from numba_attn.spec.varlen import check_varlen

    params = dict(params or {})
    causal = check_bool("causal", causal)
    kind = one_kind(q, k, v, out)
    if kind == TORCH_CPU:  # the NumPy path on views of the tensors' memory
        res = attention_varlen(*arrays_for_checks(kind, q, k, v), host_array(cu_seqlens_q), host_array(cu_seqlens_k),
                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                               phase=phase, params=params,
                               out=None if out is None else tensor_as_numpy("out", out), stream=stream,
                               mask_mod=mask_mod, score_mod=score_mod, aux=aux)
        return out if out is not None else numpy_as_tensor(res)
    if kind == TORCH and backend.IS_SIMULATOR:
        raise AttentionInputError(f"q is a tensor on {q.device} but numba-attn runs in the CUDA simulator "
                                  f"(NUMBA_ATTN_BACKEND=simulator): pass CPU tensors")
    variant = None if mask_mod is None and score_mod is None else variant_arg(mask_mod, score_mod, aux)
    checked = arrays_for_checks(kind, q, k, v)
    cu_q_host, cu_k_host = host_array(cu_seqlens_q), host_array(cu_seqlens_k)
    lq, _, max_q, max_k = check_varlen(*checked, cu_q_host, cu_k_host, causal=causal, max_seqlen_q=max_seqlen_q,
                                        max_seqlen_k=max_seqlen_k)
    if out is not None:
        check_out(out, kind, q, k, v)
    Tq, H, D = map(int, q.shape)
    Hkv = int(k.shape[1])
    dtype = np.dtype(checked[0].dtype).name
    if dtype not in ("float16", "bfloat16"):
        raise AttentionInputError(f"q must be float16 or bfloat16 for attention_varlen, got {dtype}")
    _, numba_stream, launch_stream = stream_of(kind, q, stream)
    if Tq == 0 or max_q == 0:  # no queries: nothing to compute; still validate the scalar arguments
        if scale is not None:
            Problem(q_len=1, kv_len=1, head_dim=max(D, 1), scale=scale)
        return out if out is not None else empty_output(q, tuple(q.shape))
    problem = VarlenProblem(batch=len(lq), heads=H, kv_heads=Hkv, q_len=max_q, kv_len=max_k, head_dim=D, dtype=dtype,
                            causal=causal, scale=scale)
    if variant is not None:
        probe_variant(variant, len(lq), H, max_q, max(max_k, 1))
        problem = problem.replace(variant=variant)
    names = VARLEN_DEFAULT if phase is None else (phase_arg(phase).name,)
    ph, launch = layout_plan(names, "varlen", "does not read the varlen layout", VARLEN_DEFAULT, problem,
                             params, _VARLEN_PLANS)
    if kind == DEVICE:
        for name, a in (("q", q), ("k", k), ("v", v)):
            contiguous(name, a)  # refuses a non-contiguous device array
    elif kind == TORCH:
        for name, a in (("q", q), ("k", k), ("v", v)):
            if not a.is_contiguous():
                raise AttentionInputError(f"{name} is a non-contiguous tensor (strides {tuple(a.stride())}); pass "
                                          f"{name}.contiguous() (tensors are not copied implicitly)")
    qd, kd, vd = (as_device_array(kind, a) for a in (q, k, v))
    layout = tuple(a if kind_of(a) == DEVICE else (as_device_array(TORCH, a) if kind_of(a) == TORCH else
                                                  cuda.to_device(np.ascontiguousarray(h), stream=numba_stream))
                   for a, h in ((cu_seqlens_q, cu_q_host), (cu_seqlens_k, cu_k_host)))
    if kind == TORCH:
        o = out if out is not None else sys.modules["torch"].empty(tuple(q.shape), dtype=q.dtype, device=q.device)
        od = as_device_array(TORCH, o)
    elif kind == DEVICE:
        o = od = out if out is not None else cuda.device_array(tuple(q.shape), dtype=q.dtype)
    else:
        o, od = None, cuda.device_array(tuple(q.shape), dtype=qd.dtype)
    mods = {}
    if launch.kernel_mods is not None:  # a variant: this call's arrays (the plan may be another call's)
        mods["mods"] = launch.kernel_mods(variant.aux, None, 0)
    call = _VarlenCall(problem, ph, launch.params,
                       lambda a, b, c, d, s: launch.run(a, b, c, d, s, layout, **mods), launch_stream)
    plans.launch(call, qd, kd, vd, od)
    if o is not None:
        return o
    host = out if out is not None else np.empty(tuple(q.shape), dtype=np.asarray(q).dtype)
    od.copy_to_host(host.view(od.dtype), stream=numba_stream)
    if numba_stream:
        numba_stream.synchronize()
    return host


@dataclass
class _VarlenCall:
    """What :func:`numba_attn.plans.launch` reads of a plan, for one varlen call (its cu_seqlens bound in
    ``launch``)."""

    problem: object
    phase: object
    params: dict
    launch: object
    launch_stream: object
