"""``attention()``: run one phase on arrays, the way a notebook or a test calls it.

Every input check happens before anything is compiled, allocated or launched, and fails with
:class:`~numba_attn.spec.errors.AttentionInputError` (a ``ValueError``) naming the argument and the allowed
range. Plans are cached: checks that depend on more than the arrays' kind, shape, dtype and contiguity run once
per plan. The full list of checks, the copies made and the NaN/Inf policy (``nonfinite``): docs/input-checks.md.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn import plans  # noqa: E402
# problem_from_arrays, SlowSimulationWarning and attention_varlen re-exported: callers read them here
from numba_attn.api_checks import (SlowSimulationWarning, check_host_memory, layout_plan,  # noqa: F401
                                   phase_arg, probe_variant, problem_from_arrays, sinks_arg, variant_arg,
                                   warn_if_slow)
from numba_attn.api_varlen import attention_varlen  # noqa: F401
from numba_attn.array_kinds import (DEVICE, NUMPY, TORCH, TORCH_CPU, address, arrays_for_checks,  # noqa: E402
                                    as_device_array, check_finite_input, check_out, contiguous, dtype_name,
                                    empty_output, host_array, kind_of, numpy_as_tensor, numpy_dtype_of, one_kind,
                                    stream_of, swap_axes_1_2, tensor_as_numpy)
from numba_attn.array_kinds import is_device_array  # noqa: F401  (re-exported)
# the choice of phase=None, re-exported: tests, notebooks and integrations read these names from numba_attn.api
from numba_attn.measure.policy import (NEVER_DEFAULT, PAGED_DEFAULT, PAGED_DEFAULT_ONE_ROW,  # noqa: E402,F401
                                       PAGED_DEFAULT_RAGGED, PAGED_MEAN_STEPS, PREFERENCE, VARLEN_DEFAULT,
                                       choose_phase, device_name, measured_rows, paged_default, paged_mean_bucket,
                                       pick_phase, tuned_choice)
from numba_attn.phases.registry import get_phase, list_phases  # noqa: E402,F401  (get_phase re-exported)
from numba_attn.plans import clear_plans, plan_cache_info  # noqa: E402,F401  (re-exported)
from numba_attn.spec.errors import AttentionInputError, check_arrays, check_bool  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402


def _plan(q, k, v, causal, scale, phase, allow_tf32, params, variant=None, lse=False, measure=False):
    """Everything checked before a launch: ``(problem, phase, resolved params, why)``; problem is
    None for an empty problem (nothing to launch). ``variant``: the call's mask/score functions; ``lse``:
    the phase must write the rows' log-sum-exp (a phase without it is refused, ``phase=None`` skips it);
    ``measure``: a call about to launch, which may time ``phase=None``'s candidates on first use
    (:mod:`numba_attn.measure.autotune`; ``explain()`` only says so)."""
    causal = check_bool("causal", causal)
    allow_tf32 = check_bool("allow_tf32", allow_tf32)
    ph = phase_arg(phase) if phase is not None else None
    check_arrays(q, k, v)
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if B == 0 or H == 0 or Nq == 0:  # nothing to compute; still validate the scalar arguments
        if causal and Nq > Nk:
            problem_from_arrays(q, k, v, causal=causal, scale=scale)  # raises the causal error
        if scale is not None:
            Problem(q_len=1, kv_len=1, head_dim=max(D, 1), scale=scale)
        if ph is not None:
            ph.resolve_params(params)
        return None, ph, None, "empty problem: nothing to compute"
    problem = problem_from_arrays(q, k, v, causal=causal, scale=scale)
    if variant is not None:
        probe_variant(variant, B, H, Nq, Nk)
        problem = problem.replace(variant=variant)
    if lse:
        from numba_attn.variants.sinks import lse_problem

        problem = lse_problem(problem)
    chosen = {}
    if ph is None:
        ph, why, chosen = choose_phase(problem, allow_tf32=allow_tf32, measure=measure)
    else:
        why = "named by the caller"
    if not params:  # no parameters given: the tuning cache's, when it has an entry for this problem
        hit = tuned_choice(problem, ph)
        if hit and hit[1]:  # (an entry measured on first use holds the defaults: nothing tuned)
            params.update(hit[1])  # the caller's (empty) keyword dict: attention() plans with it
            why += f"; parameters tuned (cache {hit[2]})"
        else:
            params.update(chosen)  # the dispatch table's parameters ({} otherwise)
    resolved = ph.resolve_params(params)  # AttentionInputError naming the parameter
    reason = ph.supports(problem, **resolved)
    if reason:
        supporting = [p.name for p in list_phases() if p.supports(problem) is None]
        raise AttentionInputError(f"phase {ph.name!r} cannot run {problem.label}: {reason}. "
                                  f"Phases that can: {', '.join(supporting) or 'none'}")
    return problem, ph, ph.resolve(problem, resolved), why


@dataclass
class Explanation:
    """What ``attention()`` would run: the phase, its parameters resolved for the problem, and why."""

    phase: object  # the Phase (None for an empty problem)
    params: dict
    why: str
    problem: Problem | None = None

    @property
    def name(self) -> str | None:
        return self.phase.name if self.phase is not None else None

    def __str__(self):
        label = self.problem.label if self.problem is not None else "empty problem"
        return f"{self.name} {self.params} on {label}: {self.why}"


# -- the public calls ----------------------------------------------------------------------------


def explain(q, k, v, *, causal=False, scale=None, phase=None, allow_tf32=False, nonfinite="propagate",
            mask_mod=None, score_mod=None, aux=None, return_lse=False, sinks=None, **params) -> Explanation:
    """The phase ``attention(q, k, v, ...)`` with the same arguments would run, its resolved
    parameters (:meth:`Phase.resolve`) and why it was chosen; checks the same inputs (NumPy
    arrays, numba device arrays or tensors), launches nothing and uses no cached plan."""
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    kind = one_kind(q, k, v, None)
    q, k, v = arrays_for_checks(kind, q, k, v)
    lse = check_bool("return_lse", return_lse) or sinks is not None
    problem, ph, resolved, why = _plan(q, k, v, causal, scale, phase, allow_tf32, params,
                                       variant_arg(mask_mod, score_mod, aux), lse)
    if problem is not None and kind != TORCH:
        check_host_memory(problem, (q, k, v))
    return Explanation(ph, dict(resolved or {}), why, problem)


def attention(q, k, v, *, causal=False, scale=None, phase=None, allow_tf32=False, nonfinite="propagate",
              out=None, stream=None, mask_mod=None, score_mod=None, block_mask=None, aux=None, return_lse=False,
              sinks=None, **params):
    """Softmax attention of q (B, H, Nq, D) over k, v (B, Hkv, Nk, D).

    ``phase`` names a registered phase (a registered ``Phase`` object is taken by its name);
    ``None`` chooses one by the documented rule of :func:`choose_phase` (see
    :func:`explain` for what it chose and why): never a phase computing below the input precision
    unless ``allow_tf32=True`` (as PyTorch's flag: float32 inputs may then run on tf32 tensor
    cores); a phase named explicitly runs at its own precision. Extra keyword arguments override
    its tunable parameters (positive integers for tile sizes, see the registry's rules). A forced
    ``splits`` is taken as given: splits beyond the key tiles get no keys and are combined
    correctly (checked in the simulator for every split-K phase), but they are still launched, so
    leave ``splits=0`` (planned from the keys and the SM count) unless measuring.

    Inputs and output, of one kind:

    * NumPy arrays → NumPy array (copied to the device and back);
    * numba device arrays → numba device array (no copy);
    * PyTorch CUDA tensors → a CUDA tensor on the same device (no copy: the kernels read the
      tensors' memory); PyTorch CPU tensors → a CPU tensor (like NumPy arrays: in the simulator
      that is the whole computation; float32/float16 are read without a copy, bfloat16 through
      ``ml_dtypes``). Mixing kinds (a tensor q with a NumPy k) is refused naming the argument.
      torch is never imported by numba-attn: a tensor is recognised by its type. CUDA tensors
      must be on numba's current device (checked when the call plans) and C-contiguous (call
      ``.contiguous()``). Forward only: no gradient flows back through the result.

    ``out``: a preallocated output of q's kind, shape, dtype (and device), C-contiguous and
    sharing no memory with q, k, v; written in place and returned. Without it every call allocates
    its output: ``torch.empty`` (PyTorch's caching allocator) for tensors, one
    ``cuda.device_array`` for numba arrays (numba's allocator may free earlier arrays, which
    synchronizes, then) — pass ``out=`` where that matters.

    ``mask_mod``, ``score_mod``, ``aux``, ``block_mask``: an attention variant written in Python, its
    arrays and its block mask (docs/variants.md, :mod:`numba_attn.variants`).

    ``return_lse``: return ``(out, lse)``, lse (B, H, Nq) float32 of out's kind: each row's log-sum-exp over
    the keys it sees, natural log of Σ exp(score·scale) (-inf for a row that sees none), written by the phase
    from its running max and sum (phases registered with ``lse=True``; ``phase=None`` picks one of them).
    ``sinks``: per-head sink logits (H,) (gpt-oss, transformers' ``s_aux``): one more key of that score and
    value 0 in each row's softmax, applied from the log-sum-exp (:mod:`numba_attn.variants.sinks`).

    ``stream``: CUDA tensors are computed on PyTorch's current stream
    (``torch.cuda.current_stream()``), other inputs on the default stream; ``stream=`` (a numba
    stream or a ``torch.cuda.Stream``) overrides either. The call does not synchronize (except for
    NumPy inputs, whose result is copied back, and ``nonfinite="raise"``, which reads the inputs).

    Plans are cached: the first call with a (kind, shapes, dtype, contiguity, causal, scale, phase,
    parameters, allow_tf32, device, stream) plans (checks, chooses, compiles, allocates the
    phase's scratch buffers, queries memory); later calls with the same arguments only check the
    output and launch (:func:`plan_cache_info`, :func:`clear_plans`). Input rules and errors: see
    the module docstring.
    """
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    kind = one_kind(q, k, v, out)
    plain = mask_mod is None and score_mod is None and aux is None  # (no variant: its checks cost host time)
    variant = None if plain else variant_arg(mask_mod, score_mod, aux)
    if block_mask is not None and (variant is None or not variant.has_mask):
        raise AttentionInputError("block_mask given without a mask_mod it was made from")
    return_lse = False if return_lse is False else check_bool("return_lse", return_lse)
    sink_logits = None if sinks is None else sinks_arg(sinks, int(q.shape[1]) if len(q.shape) == 4 else -1)
    lse = return_lse or sink_logits is not None
    if kind == TORCH_CPU:  # the NumPy path on views of the tensors' memory
        res = attention(*arrays_for_checks(kind, q, k, v), causal=causal, scale=scale, phase=phase,
                        allow_tf32=allow_tf32, nonfinite=nonfinite,
                        out=None if out is None else tensor_as_numpy("out", out), stream=stream,
                        mask_mod=mask_mod, score_mod=score_mod, block_mask=block_mask, aux=aux,
                        return_lse=return_lse, sinks=sink_logits, **params)
        if return_lse:
            o, lse_host = res
            return (out if out is not None else numpy_as_tensor(o)), numpy_as_tensor(lse_host)
        return out if out is not None else numpy_as_tensor(res)
    if kind == TORCH and backend.IS_SIMULATOR:
        raise AttentionInputError(f"q is a tensor on {q.device} but numba-attn runs in the CUDA simulator "
                                  f"(NUMBA_ATTN_BACKEND=simulator): pass CPU tensors")
    stream_key, numba_stream, launch_stream = stream_of(kind, q, stream)
    key = plans.plan_key(kind, q, k, v, causal, scale, phase, allow_tf32, params, stream_key)
    if variant is not None and key is not None:
        key = key + (("variant",) + variant.signature(),)
    if lse and key is not None:
        key = key + ("lse",)
    plan = plans.cached(key)
    if plan is None:
        return _finish(_plan_and_launch(kind, key, q, k, v, causal, scale, phase, allow_tf32, nonfinite, out,
                                        numba_stream, launch_stream, params, variant, block_mask, lse,
                                        sink_logits), return_lse, lse)
    if out is not None:
        check_out(out, kind, q, k, v)
    if nonfinite == "raise":
        for name, a in (("q", q), ("k", k), ("v", v)):
            check_finite_input(kind, name, a)
    if lse:
        mods = _mods(plan, variant, block_mask) if variant is not None else None
        return _finish(plans.run(plan, kind, q, k, v, out, mods=mods, lse=True, sinks=sink_logits), return_lse, lse)
    if variant is not None:
        return plans.run(plan, kind, q, k, v, out, mods=_mods(plan, variant, block_mask))
    if plan.replay is not None:  # the first call's launches at this call's addresses
        if kind == TORCH:  # (q is C-contiguous: empty_like is a C-contiguous output, made with less host time)
            o = out if out is not None else sys.modules["torch"].empty_like(q)
            plan.replay((q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()))
        else:
            o = out if out is not None else cuda.device_array(q.shape, dtype=q.dtype)
            plan.replay(tuple(address(DEVICE, a) for a in (q, k, v, o)))
        return o
    return plans.run(plan, kind, q, k, v, out)


def _mods(plan, variant, block_mask):
    """The kernels' ``mods`` for this call's arrays (None: the plan's own, made with its first call's)."""
    kernel_mods = plan.launch.kernel_mods
    if kernel_mods is None or (not variant.aux and block_mask is None):
        return None
    from numba_attn.variants.mods import VariantError

    try:
        return kernel_mods(variant.aux, block_mask, plan.launch_stream or 0)
    except (VariantError, ValueError) as e:
        raise AttentionInputError(f"block_mask: {e}") from e


def _finish(result, return_lse, lse):
    """A call's result: ``(out, lse)`` with ``return_lse``, else out (a sinks call computed lse for itself)."""
    if lse and not return_lse:
        return result[0]
    return result


def _plan_and_launch(kind, key, q, k, v, causal, scale, phase, allow_tf32, nonfinite, out, numba_stream,
                     launch_stream, params, variant=None, block_mask=None, lse=False, sinks=None):
    """A call without a cached plan: every check, the phase's choice and plan, the first launch;
    the plan is kept when the launch succeeds. ``lse``: ``(out, lse)`` (``sinks`` applied to out)."""
    stamp = plans.token()
    checked = arrays_for_checks(kind, q, k, v)
    problem, ph, resolved, why = _plan(*checked, causal, scale, phase, allow_tf32, params, variant, lse,
                                       measure=True)
    if why.startswith("measured on first use"):  # this plan wrote the tuning cache: it is not made stale by it
        stamp = plans.token()
    if out is not None:
        check_out(out, kind, q, k, v)
    if problem is None:
        o = out if out is not None else empty_output(q, tuple(q.shape))
        return (o, _empty_lse(kind, q)) if lse else o
    if kind == TORCH and not q.is_cuda:
        raise AttentionInputError(f"q is a tensor on {q.device}: numba-attn computes on CUDA tensors (or CPU "
                                  f"tensors, copied like NumPy arrays)")
    if nonfinite == "raise":
        for name, a in (("q", q), ("k", k), ("v", v)):
            check_finite_input(kind, name, a)
    if backend.IS_SIMULATOR:
        warn_if_slow(ph, problem)
    if kind == TORCH:
        for name, a in (("q", q), ("k", k), ("v", v)):
            if not a.is_contiguous():
                raise AttentionInputError(
                    f"{name} is a non-contiguous tensor (strides {tuple(a.stride())}); pass {name}.contiguous() "
                    f"(tensors are not copied implicitly)")
        device = q.get_device()
        current = cuda.get_current_device().id
        if device != current:
            raise AttentionInputError(f"q is on cuda:{device} but numba's current device is {current}: call "
                                      f"numba.cuda.select_device({device}) first (or move the tensors)")
    else:
        check_host_memory(problem, (q, k, v))
        if kind == DEVICE:
            for name, a in (("q", q), ("k", k), ("v", v)):
                contiguous(name, a)  # refuses a non-contiguous device array
    on_device = kind in (DEVICE, TORCH)
    from numba_attn.measure import limits

    free = limits.free_device_memory()
    need = problem.min_bytes() if not on_device else (0 if out is not None else
                                                       int(np.prod(problem.out_shape())) * problem.itemsize)
    if free is not None and need > free:
        raise AttentionInputError(f"{problem.label} needs {need / 2**30:.2f} GiB of device memory for its "
                                  f"inputs and output; {free / 2**30:.2f} GiB free")
    plan = plans.make(problem, ph, resolved, why, params, stamp, numba_stream, launch_stream)
    if variant is not None:
        if block_mask is not None:
            bm = block_mask
            if (bm.q_len, bm.kv_len) != (problem.q_len, problem.kv_len):
                raise AttentionInputError(f"block_mask was made for q_len={bm.q_len}, kv_len={bm.kv_len}; "
                                          f"this call has q_len={problem.q_len}, kv_len={problem.kv_len}")
        mods = _mods(plan, variant, block_mask)
        result = plans.run(plan, kind, q, k, v, out, mods=mods, lse=lse, sinks=sinks)
        if key is not None:
            plans.keep(key, plan)
        return result
    if lse:  # (no recorded replay: the log-sum-exp is another array per call)
        result = plans.run(plan, kind, q, k, v, out, lse=True, sinks=sinks)
        if key is not None:
            plans.keep(key, plan)
        return result
    return plans.first_run(plan, key, kind, q, k, v, out)


def _empty_lse(kind, q):
    """The (B, H, 0) or empty log-sum-exp of an empty problem, of q's kind."""
    shape = tuple(int(n) for n in q.shape[:3])
    if kind == TORCH:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=torch.float32, device=q.device)
    if kind == DEVICE:
        return cuda.device_array(shape, dtype=np.float32)
    return np.empty(shape, dtype=np.float32)


# -- decode over a paged KV cache ---------------------------------------------------------

_PAGED_PLANS: OrderedDict = OrderedDict()


def decode_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None, k_scale=None,
                 v_scale=None, phase=None, mask_mod=None, score_mod=None, aux=None, return_lse=False, sinks=None,
                 **params):
    """Decode attention over a paged KV cache, FlashAttention's ``flash_attn_with_kvcache`` layout:
    ``q`` (B, q_len, H, D) float16 or bfloat16; ``k_cache``, ``v_cache`` (num_blocks, page_size, Hkv, D) in q's
    dtype, ``float8_e4m3fn`` (ml_dtypes / torch) or ``int8``; ``block_table`` (B, max_blocks) int32;
    ``cache_seqlens`` (B,) int32. Returns (B, q_len, H, D) like ``q`` (NumPy arrays, numba device
    arrays or PyTorch tensors, as ``attention()``). (``attention()`` takes (B, H, N, D); this function
    takes flash-attn's order, the heads after the query positions. The kernels read one row per
    (sequence, head): a q with q_len > 1 and H > 1 is transposed to (B, H, q_len, D) on the device and
    the output back, one copy each; with q_len 1 or one head the two orders are the same memory.)

    8-bit caches need ``k_scale`` and ``v_scale``: a scalar or (Hkv,) per head (fp8, int8), or
    (num_blocks, page_size, Hkv) per token (int8), finite and > 0; the value is ``code · scale``. With ``causal`` the
    queries are the last q_len positions of each sequence. A sequence of length 0 gives zeros. The
    input checks (page indices, lengths against the table, page size 16..256, scales, dtypes, shapes)
    run before anything is launched; ``spec/paged.py`` states the layout and holds the reference.
    The split-K plan is made for the power-of-two bucket of the longest sequence and, when the lengths
    differ, for their mean rounded up to 1/16 of that bucket (``paged_mean_bucket``: the splits are
    sized from the batch's total keys, so that a long sequence gets proportionally more blocks); it is
    cached per (bucket, rounded mean): calls that fall in one reuse it, and another plan reuses the
    compiled kernels except for a new power-of-two split count. The lengths the plan reads are the
    host copy that the input checks make (device lengths are copied to the host for the checks on
    every call; the plan adds no transfer).
    ``phase``: ``paged_mma``, ``paged_mma8``, ``paged_split_k`` or ``paged_worklist`` (None: the first of them that
    supports the problem, in the order of :func:`paged_default`: the work list for a ragged batch of one query row per
    KV head on a 16-bit cache; it plans each call's list on the host from the lengths the checks copied).
    ``mask_mod``, ``score_mod``, ``aux``: a variant, as :func:`attention` takes it (docs/variants.md); in a paged
    cache ``kv_idx`` is a token's position in its sequence and the queries are its last ``q_len`` positions.
    ``return_lse``: return ``(out, lse)``, lse float32 (B, H, q_len) as ``flash_attn_with_kvcache``'s
    ``softmax_lse`` (heads before the query positions, unlike q and out): each row's natural-log log-sum-exp of
    its scaled scores, -inf for a row that sees no key (a length-0 sequence). ``sinks``: per-head sink logits
    (H,), as :func:`attention` takes them (:mod:`numba_attn.variants.sinks`).
    """
    from numba_attn.phases.decode.common import paged_scales
    from numba_attn.spec.paged import check_paged
    from numba_attn.spec.problem import PagedProblem

    kind = kind_of(q)
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
        if kind_of(a) != kind:
            raise AttentionInputError(f"{name} is {kind_of(a)} but q is {kind}: q and the caches must be of one kind")
    bt, sl = host_array(block_table), host_array(cache_seqlens)
    ks, vs = host_array(k_scale), host_array(v_scale)
    qdt = dtype_name("q", q)
    kv_dtype, skind = check_paged(tuple(q.shape), qdt, k_cache, v_cache, bt, sl, causal=causal, k_scale=ks,
                                  v_scale=vs)
    B, Nq, H, D = map(int, q.shape)
    NB, P, Hkv, _ = map(int, k_cache.shape)
    longest = int(sl.max()) if sl.size else 0
    bucket = 1 << max(0, longest - 1).bit_length()  # splits planned for the longest sequence's power-of-two bucket
    problem = PagedProblem(batch=B, heads=H, kv_heads=Hkv, q_len=Nq, kv_len=max(Nq, bucket),
                           head_dim=D, dtype=qdt, causal=bool(causal), scale=scale, page_size=P, kv_dtype=kv_dtype,
                           kv_scale=skind or "head", mean_len=paged_mean_bucket(sl, bucket))
    variant = None
    if mask_mod is not None or score_mod is not None:
        variant = variant_arg(mask_mod, score_mod, aux)
        probe_variant(variant, B, H, Nq, max(Nq, longest, 1))
        problem = problem.replace(variant=variant)
    return_lse = check_bool("return_lse", return_lse)
    sink_logits = None if sinks is None else sinks_arg(sinks, H)
    lse = return_lse or sink_logits is not None
    if lse:
        from numba_attn.variants.sinks import lse_problem

        problem = lse_problem(problem)
    names = paged_default(problem) if phase is None else (phase if isinstance(phase, str) else phase.name,)
    ph, launch = layout_plan(names, "paged", "does not read a paged KV cache", PAGED_DEFAULT, problem, params,
                             _PAGED_PLANS)
    swap = Nq > 1 and H > 1  # (B, q_len, H, D) and the kernels' (B, H, q_len, D) differ in memory
    qk = q
    if swap and kind in (TORCH, TORCH_CPU):
        qk = q.transpose(1, 2).contiguous()
    elif swap and kind == NUMPY:
        qk = np.ascontiguousarray(np.swapaxes(q, 1, 2))
    qd, kd, vd = (as_device_array(kind, a) for a in (qk, k_cache, v_cache))
    if swap and kind == DEVICE:
        qd = swap_axes_1_2(qd)
    layout = (cuda.to_device(np.ascontiguousarray(bt)), cuda.to_device(np.ascontiguousarray(sl))) + \
        paged_scales(problem, ks, vs)
    od = cuda.device_array((B, H, Nq, D), dtype=qd.dtype)
    extra = {"lens": sl} if launch.host_lengths else {}
    if launch.kernel_mods is not None:  # a variant: this call's arrays (the plan may be another call's)
        extra["mods"] = launch.kernel_mods(variant.aux, None, 0)
    lse_d = None
    if lse:
        extra["lse"] = lse_d = cuda.device_array((B * H, Nq), dtype=np.float32)
    launch.run(qd.reshape(B * H, Nq, D), kd, vd, od.reshape(B * H, Nq, D), 0, layout, **extra)
    if sink_logits is not None:
        from numba_attn.variants.sinks import apply_sinks

        apply_sinks(od.reshape(B * H, Nq, D), lse_d, sink_logits, H, 0, bf16=qdt == "bfloat16")
    out = _paged_out(kind, q, od, swap)
    if not return_lse:
        return out
    return out, _paged_lse(kind, q, lse_d.reshape(B, H, Nq))


def _paged_lse(kind, q, lse_d):
    """decode_paged's (B, H, q_len) log-sum-exp, of q's kind."""
    if kind == DEVICE:
        return lse_d
    if kind == TORCH:
        torch = sys.modules["torch"]
        t = torch.empty(tuple(lse_d.shape), dtype=torch.float32, device=q.device)
        cuda.as_cuda_array(t).copy_to_device(lse_d)
        return t
    host = lse_d.copy_to_host()
    return numpy_as_tensor(host) if kind == TORCH_CPU else host


def _paged_out(kind, q, od, swap):
    """decode_paged's output (B, q_len, H, D) of q's kind from the kernels' (B, H, q_len, D) ``od``."""
    B, H, Nq, D = od.shape
    if kind == DEVICE:
        return swap_axes_1_2(od) if swap else od.reshape(B, Nq, H, D)
    if kind == TORCH:
        torch = sys.modules["torch"]
        out = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
        cuda.as_cuda_array(out.view(torch.int16) if out.dtype == torch.bfloat16 else out).copy_to_device(od)
        return out.transpose(1, 2).contiguous() if swap else out.view(B, Nq, H, D)
    host = od.copy_to_host()
    host = host.view(np.asarray(q).dtype) if kind == NUMPY else host
    host = np.ascontiguousarray(np.swapaxes(host, 1, 2)) if swap else host.reshape(B, Nq, H, D)
    return numpy_as_tensor(host.view(numpy_dtype_of("q", q))) if kind == TORCH_CPU else host
