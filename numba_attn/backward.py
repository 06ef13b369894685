"""``attention_backward()``: the gradients of attention, run by a phase of the backward family.

Given the forward's inputs q, k, v, its output o and log-sum-exp lse (natural log, float32, (B, H, Nq)), and
the gradient ``do`` of a loss with respect to o, returns (dq, dk, dv) in the inputs' dtype. The arrays are of
one kind, as :func:`numba_attn.attention` takes them (NumPy arrays, numba device arrays, PyTorch tensors), and
every input is checked before anything is compiled or launched, refused with an
:class:`~numba_attn.spec.errors.AttentionInputError` naming the argument. The math: docs/backward.md.
"""
from __future__ import annotations

import functools
import sys
from collections import OrderedDict

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.api import problem_from_arrays  # noqa: E402
from numba_attn.api_checks import probe_variant, sinks_arg, variant_arg  # noqa: E402
from numba_attn.array_kinds import (DEVICE, NUMPY, TORCH, TORCH_CPU, arrays_for_checks, as_device_array,  # noqa: E402
                                    contiguous, described, kind_of, numpy_as_tensor, one_kind, stream_of,
                                    tensor_as_numpy)
from numba_attn.phases.backward.common import run_backward_launch  # noqa: E402
from numba_attn.phases.registry import (BACKWARD, Phase, get_phase, list_phases, registered,  # noqa: E402
                                        registered_count)
from numba_attn.spec.errors import AttentionInputError, check_arrays, check_bool  # noqa: E402
from numba_attn.spec.grad_reference import backward_case  # noqa: E402,F401 (check_backward's; re-exported)

# phase=None: the first of these that supports the problem (bwd_wgmma_kvreg: head_dim 64; bwd_wgmma_ss,
# bwd_wgmma_fused, bwd_wgmma_overlap: sm_90a, float16/bfloat16, head_dim 64 or 128; bwd_mma: float16/bfloat16,
# head_dim a multiple of 16). bwd_wgmma_ss: 1.10-1.30x bwd_wgmma_fused on the backward bench's eight (H200,
# bf03580); bwd_wgmma_kvreg before it at D64: 1.05-1.08x bwd_wgmma_ss (H200, experiments/2026-11-29-bwd-kvreg)
BACKWARD_DEFAULT = ("bwd_wgmma_kvreg", "bwd_wgmma_ss", "bwd_wgmma_fused", "bwd_wgmma_overlap", "bwd_mma",
                    "bwd_two_kernels", "bwd_naive")
# phases whose dQ is summed by atomics or reductions in no fixed order: not bitwise reproducible from call to call
# (deterministic=True, or torch.use_deterministic_algorithms(True), leaves them out of phase=None and refuses them)
NONDETERMINISTIC = frozenset({"bwd_wgmma_fused", "bwd_wgmma_ss", "bwd_wgmma_kvreg", "bwd_atomic_dq"})
_PLANS: OrderedDict = OrderedDict()  # (phase, problem, params) -> Launch, at most 16
_CHOSEN: OrderedDict = OrderedDict()  # (problem, phase, params, deterministic, ...) -> choose_backward's answer
# (id of a Launch, stream handle) -> (the Launch, gpu.replay.Replay of its first tensor call's launches or False:
# refused); dropped with the Launch, so a replay never outlives the scratch buffers its launches point into
_REPLAYS: dict = {}
# callables told the name of each backward phase attention_backward ran, after its launch (the transformers
# integration's count_phases(backward=True) adds one while such a block is open); empty: nothing is called
RAN_HOOKS: list = []


def backward_phase(phase) -> Phase:
    """``phase`` (a name or a registered Phase) as a backward phase; a forward one is refused."""
    if not isinstance(phase, (str, Phase)):
        raise AttentionInputError(f"phase must be the name of a backward phase (numba_attn.list_phases('backward')) "
                                  f"or None; got {type(phase).__name__} {phase!r}")
    ph = get_phase(phase if isinstance(phase, str) else phase.name)
    if ph.kind != BACKWARD:
        names = ", ".join(p.name for p in list_phases(BACKWARD))
        raise AttentionInputError(f"phase {ph.name!r} is a forward ({ph.kind}) phase; attention_backward runs the "
                                  f"backward ones: {names}")
    return ph


def _check_grads_inputs(q, o, lse, do):
    """o and do: q's shape and dtype; lse: (B, H, Nq) float32. (Arrays as the checks read them.)"""
    for name, a in (("o", o), ("do", do)):
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            raise AttentionInputError(f"{name} must be an array of q's kind; got {type(a).__name__}")
        if tuple(a.shape) != tuple(q.shape):
            raise AttentionInputError(f"{name} has shape {tuple(a.shape)}; it must have q's shape {tuple(q.shape)}")
        if np.dtype(a.dtype) != np.dtype(q.dtype):
            raise AttentionInputError(f"{name} has dtype {np.dtype(a.dtype).name}; it must have q's dtype "
                                      f"{np.dtype(q.dtype).name}")
    if not (hasattr(lse, "shape") and hasattr(lse, "dtype")):
        raise AttentionInputError(f"lse must be an array of q's kind; got {type(lse).__name__}")
    want = tuple(q.shape[:3])
    if tuple(lse.shape) != want:
        raise AttentionInputError(f"lse has shape {tuple(lse.shape)}; it must be (batch, heads, q_len) = {want}, "
                                  f"the forward's log-sum-exp per query row (natural log)")
    if np.dtype(lse.dtype).name != "float32":
        raise AttentionInputError(f"lse has dtype {np.dtype(lse.dtype).name}; it must be float32")


def _one_kind(arrays):
    """The kind of q; every other array of the call of the same kind (tensors on q's device)."""
    kind = one_kind(arrays["q"], arrays["k"], arrays["v"], None)
    for name in ("o", "lse", "do"):
        ka = kind_of(arrays[name])
        if ka and kind and ka != kind:
            raise AttentionInputError(f"{name} is {ka} but q is {kind}: q, k, v, o, lse and do must be of one kind")
        if kind == TORCH and arrays[name].device != arrays["q"].device:
            raise AttentionInputError(f"{name} is on {arrays[name].device} but q is on {arrays['q'].device}")
    return kind


def _checked(kind, arrays):
    """The arrays as the checks read them (tensors described by shape and NumPy dtype)."""
    q, k, v = arrays_for_checks(kind, arrays["q"], arrays["k"], arrays["v"])
    rest = [arrays[n] for n in ("o", "lse", "do")]
    if kind == TORCH:
        rest = [described(n, a) for n, a in zip(("o", "lse", "do"), rest)]
    elif kind == TORCH_CPU:
        rest = [tensor_as_numpy(n, a) for n, a in zip(("o", "lse", "do"), rest)]
    return q, k, v, *rest


def _plan(ph, problem, params):
    variant = getattr(problem, "variant", None)
    if variant is not None:  # a new Variant each call: the plan is keyed by what its kernels and block masks depend
        # on (the functions, their array counts, a score function's derivative), as attention()'s plans are; the
        # call's own arrays reach the plan's KernelMods, which recompute the block mask when they change
        from numba_attn.variants.mods import python_function

        score = variant.score
        what = (problem.replace(variant=None), variant.signature(),
                None if score is None or score.derivative is None else python_function(score.derivative))
    else:
        what = problem
    key = (ph.name, what, tuple(sorted(params.items())))
    launch = _PLANS.get(key)
    if launch is None:
        launch = _PLANS[key] = ph.plan(problem, **params)
        while len(_PLANS) > 16:
            _, old = _PLANS.popitem(last=False)
            for rkey in [r for r in _REPLAYS if r[0] == id(old)]:
                del _REPLAYS[rkey]
    return launch


@functools.lru_cache(maxsize=16)
def _binders(B, H, Hkv, Nq, Nk, D, dtype):
    """Device arrays of the kernels' row shapes at any address (:class:`~numba_attn.gpu.arrays.BoundArrays`): q, k,
    v, o, do, dq, dk, dv in ``dtype`` (16-bit floats as int16, as :func:`as_device_array` gives them); lse as the
    forward binds it (:func:`numba_attn.plans.lse_rows`). Typed once per shape, not per call: a tensor's CUDA array
    interface and a reshape cost more than the kernels of a small problem."""
    from numba_attn.gpu.arrays import BoundArrays
    from numba_attn.plans import lse_rows

    rows_q, rows_kv = (B * H, Nq, D), (B * Hkv, Nk, D)
    return BoundArrays([rows_q, rows_kv], dtype), lse_rows(B * H, Nq)


def _bound(problem, tensors):
    """(q, k, v, o, lse, do, dq, dk, dv) contiguous tensors as the kernels' (B·H, Nq, D), (B·Hkv, Nk, D) and
    (B·H, Nq) device arrays."""
    dtype = {"float16": np.float16, "bfloat16": np.int16}.get(problem.dtype, np.float32)
    data, lse = _binders(problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len,
                         problem.head_dim, dtype)
    which = (0, 1, 1, 0, None, 0, 0, 1, 1)  # q's rows, k's rows, or lse
    return [lse(0, t.data_ptr()) if i is None else data(i, t.data_ptr()) for i, t in zip(which, tensors)]


def _run_tensors(launch, problem, tensors, mods):
    """The launch on (q, k, v, o, lse, do, dq, dk, dv) contiguous CUDA tensors on torch's current stream. Without a
    variant's arrays, the first call records its launches and later calls replay them at their nine addresses
    (:mod:`numba_attn.gpu.replay`: numba's launch path costs more host time than a small problem's kernels)."""
    from numba_attn.plans import REPLAY

    handle, numba_stream, _ = stream_of(TORCH, tensors[0], None)
    addresses = tuple(t.data_ptr() for t in tensors)
    rkey = (id(launch), handle)
    kept = _REPLAYS.get(rkey)
    replay = (kept[1] if kept is not None and kept[0] is launch else None) if not mods and REPLAY else False
    if replay:
        replay(addresses)
        return
    if replay is None:  # the first call: recorded
        from numba_attn.gpu.replay import Replay, recording

        with recording() as rec:
            launch.run(*_bound(problem, tensors), stream=numba_stream, mods=mods)
        _REPLAYS[rkey] = (launch, Replay.make(rec, addresses, [t.numel() * t.element_size() for t in tensors])
                          or False)
        return
    launch.run(*_bound(problem, tensors), stream=numba_stream, mods=mods)


def deterministic_arg(deterministic) -> bool:
    """``deterministic`` as a bool: None follows ``torch.are_deterministic_algorithms_enabled()`` where torch is
    imported (False otherwise)."""
    if deterministic is None:
        torch = sys.modules.get("torch")
        return bool(torch is not None and torch.are_deterministic_algorithms_enabled())
    return check_bool("deterministic", deterministic)


def choose_backward(problem, phase=None, params=None, deterministic: bool = False) -> tuple[Phase, dict]:
    """(phase, resolved parameters) that runs ``problem``: ``phase`` (refused with the reason when it cannot),
    else the first of :data:`BACKWARD_DEFAULT` that supports it; ``deterministic``: only phases whose gradients are
    bitwise reproducible (not :data:`NONDETERMINISTIC`)."""
    params = dict(params or {})
    names = BACKWARD_DEFAULT if phase is None else (backward_phase(phase).name,)
    if deterministic:
        if phase is not None and names[0] in NONDETERMINISTIC:
            raise AttentionInputError(f"phase {names[0]!r} sums dQ in no fixed order (atomics or bulk reductions) and "
                                      "deterministic=True (or torch.use_deterministic_algorithms(True)) asks for "
                                      "reproducible gradients: choose another phase or phase=None")
        names = tuple(n for n in names if n not in NONDETERMINISTIC)
    reasons = []
    for name in names:
        ph = get_phase(name)
        resolved = ph.resolve_params(params)  # AttentionInputError naming the parameter
        reason = ph.supports(problem, **resolved)
        if reason is None:
            return ph, ph.resolve(problem, resolved)
        reasons.append(f"{name}: {reason}")
    raise AttentionInputError(f"no backward phase runs {problem.label}: " + "; ".join(reasons))


def _chosen(problem, phase, params, deterministic):
    """:func:`choose_backward`'s answer, kept per (problem, phase, parameters, determinism) while the registry and
    :data:`BACKWARD_DEFAULT` are the same (``supports`` of every candidate costs tens of microseconds a call);
    problems with a variant are chosen each time (their functions are new objects a call)."""
    if getattr(problem, "variant", None) is not None:
        return choose_backward(problem, phase, params, deterministic)
    try:
        key = (problem, phase if phase is None or isinstance(phase, str) else ("object", id(phase)),
               tuple(sorted(params.items())), deterministic, BACKWARD_DEFAULT, registered_count())
        hit = _CHOSEN.get(key)
    except TypeError:  # an unhashable parameter: refused or run by choose_backward's own checks
        return choose_backward(problem, phase, params, deterministic)
    if hit is None or hit[0] is not registered(hit[0].name):
        hit = _CHOSEN[key] = choose_backward(problem, phase, params, deterministic)
        while len(_CHOSEN) > 64:
            _CHOSEN.popitem(last=False)
    return hit[0], dict(hit[1])


def _zeros(kind, like, shape):
    if kind == TORCH:
        return sys.modules["torch"].zeros(shape, dtype=like.dtype, device=like.device)
    if kind == DEVICE:
        return cuda.to_device(np.zeros(shape, dtype=like.dtype))
    return np.zeros(shape, dtype=like.dtype)


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, phase=None, mask_mod=None, score_mod=None,
                       score_mod_grad=None, aux=None, sinks=None, deterministic=None, **params):
    """dq, dk, dv of softmax attention: q (B, H, Nq, D), k, v (B, Hkv, Nk, D), the forward's output o and its
    log-sum-exp lse (B, H, Nq) float32 (natural log), the output's gradient do (q's shape and dtype).

    ``causal`` (bottom-right aligned) and ``scale`` as the forward took them; ``phase``: a backward phase
    (``numba_attn.list_phases("backward")``; None: the first of :data:`BACKWARD_DEFAULT` that supports the
    problem); ``params``: its tunable parameters. Grouped-query attention: dk, dv are summed over the query
    heads of a KV head. ``mask_mod``, ``score_mod``, ``aux``: the forward's variant (:func:`numba_attn.attention`'s;
    the forward's lse already has it), applied to every recomputed score; a score function needs its derivative
    ``score_mod_grad(score, b, h, q_idx, kv_idx, *aux)`` (d score_mod / d score; the built-ins carry theirs).
    ``sinks`` (H,): the forward's sink logits (o its output with them, lse the keys' own as it returns it): the
    phase runs on L = logaddexp(lse, sink), and the sinks' gradient −Σ_{b,i} exp(sink − L_i)·rowsum(dO∘O)_i
    is returned fourth, float32 (NumPy arrays and tensors). ``deterministic``: True keeps to phases whose gradients
    are bitwise reproducible (phase=None skips :data:`NONDETERMINISTIC`, whose dQ sums come in no fixed order);
    None follows ``torch.are_deterministic_algorithms_enabled()``. Returns arrays of q's kind and dtype (dk, dv of
    k's shape)."""
    arrays = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}
    causal = check_bool("causal", causal)
    deterministic = deterministic_arg(deterministic)
    kind = _one_kind(arrays)
    if kind == TORCH_CPU:  # the NumPy path on views of the tensors' memory
        grads = attention_backward(*_checked(kind, arrays), causal=causal, scale=scale, phase=phase,
                                   mask_mod=mask_mod, score_mod=score_mod, score_mod_grad=score_mod_grad, aux=aux,
                                   sinks=sinks, deterministic=deterministic, **params)
        return tuple(numpy_as_tensor(g) for g in grads)
    if kind == TORCH and backend.IS_SIMULATOR:
        raise AttentionInputError(f"q is a tensor on {q.device} but numba-attn runs in the CUDA simulator "
                                  f"(NUMBA_ATTN_BACKEND=simulator): pass CPU tensors")
    cq, ck, cv, co, clse, cdo = _checked(kind, arrays)
    check_arrays(cq, ck, cv)
    _check_grads_inputs(cq, co, clse, cdo)
    if phase is not None:
        backward_phase(phase)
    B, H, Nq, D = map(int, q.shape)
    Hkv, Nk = int(k.shape[1]), int(k.shape[2])
    sink = None
    if sinks is not None:
        if kind == DEVICE:
            raise AttentionInputError("sinks= takes NumPy arrays or torch tensors for q, k, v, o, lse, do (the sinks' "
                                      "gradient is computed beside the kernels), not numba device arrays")
        sink = sinks_arg(sinks, H)
    if B * H * Nq == 0:  # nothing to compute: zero gradients
        zeros = tuple(_zeros(kind, q, tuple(a.shape)) for a in (q, k, v))
        return zeros if sink is None else zeros + (np.zeros(H, np.float32),)
    problem = problem_from_arrays(cq, ck, cv, causal=causal, scale=scale, checked=True)
    variant = with_derivative(variant_arg(mask_mod, score_mod, aux), score_mod_grad)
    if variant is not None:
        probe_variant(variant, B, H, Nq, Nk)
        problem = problem.replace(variant=variant)
    ph, resolved = _chosen(problem, phase, params, deterministic)
    launch = _plan(ph, problem, resolved)
    if kind == TORCH:
        for name, a in arrays.items():
            if not a.is_contiguous():
                raise AttentionInputError(f"{name} is a non-contiguous tensor (strides {tuple(a.stride())}); pass "
                                          f"{name}.contiguous() (tensors are not copied implicitly)")
    elif kind == DEVICE:
        for name, a in arrays.items():
            contiguous(name, a)  # refuses a non-contiguous device array
    if sink is not None:  # P over the keys and the sink: normalized by L = logaddexp(lse, sink)
        arrays["lse"] = sink_lse(kind, arrays["lse"], sink)
    mods = () if variant is None else variant.aux  # (as given: the launch moves them)
    if kind == TORCH:  # bound to the kernels' row shapes at the tensors' addresses, on torch's current stream
        torch = sys.modules["torch"]
        outs = [torch.empty(tuple(a.shape), dtype=a.dtype, device=a.device) for a in (q, k, v)]
        _run_tensors(launch, problem, [arrays[n] for n in ("q", "k", "v", "o", "lse", "do")] + outs, mods)
    else:
        dev = {name: as_device_array(kind, a) for name, a in arrays.items()}
        outs = [cuda.device_array(tuple(a.shape), dtype=dev[n].dtype) for n, a in (("q", q), ("k", k), ("v", v))]
        run_backward_launch(launch, [dev[n] for n in ("q", "k", "v", "o", "lse", "do")], outs, mods=mods)
    for hook in RAN_HOOKS:
        hook(ph.name)
    grads = tuple(outs) if kind in (TORCH, DEVICE) else tuple(d.copy_to_host().view(np.asarray(a).dtype)
                                                             for d, a in zip(outs, (q, k, v)))
    return grads if sink is None else grads + (sink_grad(kind, o, do, arrays["lse"], sink),)


def sink_lse(kind, lse, sink):
    """L = logaddexp(lse, sink[h]) (B, H, Nq) float32, of ``lse``'s kind (NumPy or a tensor)."""
    if kind == TORCH:
        torch = sys.modules["torch"]
        s = torch.as_tensor(sink, device=lse.device).view(1, -1, 1)
        return torch.logaddexp(lse.float(), s).contiguous()
    return np.logaddexp(np.asarray(lse, np.float32), sink.reshape(1, -1, 1)).astype(np.float32)


def sink_grad(kind, o, do, norm, sink):
    """d sink_h = −Σ_{b,i} exp(sink_h − L_i)·Delta_i, Delta = rowsum(dO ∘ O) in float32 (``norm``: L)."""
    if kind == TORCH:
        torch = sys.modules["torch"]
        delta = (do.float() * o.float()).sum(-1)
        s = torch.as_tensor(sink, device=o.device).view(1, -1, 1)
        return -(torch.exp(s - norm) * delta).sum(dim=(0, 2))
    delta = (np.asarray(do, np.float32) * np.asarray(o, np.float32)).sum(-1)
    return -(np.exp(sink.reshape(1, -1, 1) - norm) * delta).sum(axis=(0, 2)).astype(np.float32)


def with_derivative(variant, score_mod_grad):
    """``variant`` whose score function has the derivative ``score_mod_grad`` (None: its own, if any)."""
    if score_mod_grad is None:
        return variant
    if variant is None or variant.score is None:
        raise AttentionInputError("score_mod_grad given without a score_mod: it is the derivative of one")
    if not callable(score_mod_grad):
        raise AttentionInputError(f"score_mod_grad must be a function (score, b, h, q_idx, kv_idx, *aux) -> d "
                                  f"score_mod / d score; got {type(score_mod_grad).__name__}")
    from dataclasses import replace

    from numba_attn.variants.mods import Variant

    return Variant(variant.mask, replace(variant.score, derivative=score_mod_grad))


def check_backward(phase, problem, seed=1, **params) -> dict:
    """One backward phase on ``problem`` against :func:`numba_attn.spec.grad_reference.grad_reference`: seeded
    inputs in the problem's dtype, o and lse from the float64 forward (o in the dtype, lse float32), a random
    dO (the problem's variant applied to both); each of dq, dk, dv checked by
    :func:`numba_attn.spec.reference.check` (the dtype's tolerance). A row:
    ``{"phase", "problem", "status" (OK, FAIL, SKIP), "reason", "rel_err": {"dq": ...}, "params"}``."""
    from numba_attn.spec.problem import numpy_dtype
    from numba_attn.spec.reference import check

    ph = backward_phase(phase)
    row = {"phase": ph.name, "problem": problem.label, "status": "SKIP", "reason": "", "rel_err": {},
           "params": {}}
    reason = ph.supports(problem, **ph.resolve_params(params))
    if reason:
        row["reason"] = reason
        return row
    q, k, v, do, ref = backward_case(problem, seed)
    dt = numpy_dtype(problem.dtype)
    variant = getattr(problem, "variant", None)
    o, lse = ref.o.astype(dt), ref.lse.astype(np.float32)
    row["params"] = ph.resolve(problem, ph.resolve_params(params))
    grads = attention_backward(q, k, v, o, lse, do, causal=problem.causal, scale=problem.scale, phase=ph.name,
                               mask_mod=variant.mask if variant is not None else None,
                               score_mod=variant.score if variant is not None else None, **params)
    bad = []
    for name, out, want in zip(("dq", "dk", "dv"), grads, ref):
        c = check(out, want, dtype=problem.dtype, precision=ph.precision)
        row["rel_err"][name] = c.rel_err
        if not c.ok:
            bad.append(f"{name}: {c.reason}")
    row["status"] = "FAIL" if bad else "OK"
    row["reason"] = "; ".join(bad)
    return row
