"""FlashAttention-4 and FlexAttention as peers, measured as SDPA's are (:mod:`numba_attn.measure.peers`): the same
inputs and float64 reference (the backward's: the same gradients), one first call outside the timing (it
compiles) whose output is checked, rotated input sets, the run's timing method, the same row fields.

* ``fa4``, ``fa4_backward`` — ``flash_attn.cute.flash_attn_func`` (``pip install -e ".[fa4]"``, the package
  ``flash-attn-4``) on (batch, seqlen, heads, head_dim) copies of the inputs made before the timing, its output
  (the first of a tuple ``(out, lse)``) transposed back for the check. It runs fp16 and bf16, head_dim in
  :data:`FA4_HEAD_DIMS`, on compute capability 9.x-11.x (Hopper, Blackwell); causal, sliding windows and
  soft-capping are its arguments (:func:`numba_attn.variants.external.fa4_arguments`); other problems are
  ``SKIP`` with the reason, and so is a call FlashAttention-4 refuses with an assertion (its way of saying
  "not supported", e.g. a window in its Hopper backward).
* ``torch_flex``, ``torch_flex_backward`` — ``torch.compile(flex_attention)`` with a block mask from
  ``create_block_mask`` (built before the timing) for the causal mask and the variant's mask, and the variant's
  score function as ``score_mod`` (:func:`numba_attn.variants.external.flex_functions`; a function of the user's
  own has no twin: ``SKIP`` naming it). Compiled with ``fullgraph=True`` (a graph break is an error, never a
  silent unfused call) and from a fresh compile cache each row (``torch._dynamo.reset()``: a long run never
  reaches the recompile limit); the names of the kernels that ran are in ``peer_kernels``.

The backward peers time ``torch.autograd.grad`` of an output computed once (``retain_graph``), as SDPA's.
Neither peer is in a default set: name them (``numba-attn run --peers fa4,torch_flex``, ``numba-attn bench
backward --peers fa4_backward,torch_flex_backward``, ``peer_list=`` in Python).
"""
from __future__ import annotations

import inspect
import warnings

from numba_attn.measure.peers import (backward_inputs, check_grads, check_output, first_call, input_sets,
                                      kernel_names, layout_skip_reason, peer_row, time_torch_calls, torch_inputs,
                                      torch_status)
from numba_attn.measure.row_figures import timed_row
from numba_attn.measure.status import ERROR, SKIP, summarize_exception
from numba_attn.spec.problem import Problem
from numba_attn.variants.external import NoMapping, fa4_arguments, flex_functions

FA4_HEAD_DIMS = (64, 96, 128)  # the head dims flash_attn/cute/interface.py lists for Hopper and Blackwell
FA4_MAJORS = (9, 10, 11)  # compute capabilities it compiles for (9.x Hopper, 10.x and 11.x Blackwell)
FLEX = "torch.nn.attention.flex_attention"


class Unavailable(RuntimeError):
    """A peer that cannot run here or on this problem; the message is the row's reason."""


# ---------------------------------------------------------------- FlashAttention-4

def fa4_problem_reason(problem: Problem) -> str | None:
    """Why FlashAttention-4 cannot run ``problem`` whatever the GPU (its dtype, head_dim, variant), or None."""
    if problem.dtype not in ("float16", "bfloat16"):
        return f"FlashAttention-4 takes float16 and bfloat16 only, not {problem.dtype}"
    if problem.head_dim not in FA4_HEAD_DIMS:
        return (f"FlashAttention-4 runs head_dim {', '.join(map(str, FA4_HEAD_DIMS))} (FA4_HEAD_DIMS), "
                f"not {problem.head_dim}")
    try:
        fa4_arguments(problem)
    except NoMapping as exc:
        return str(exc)
    return None


def fa4_function():
    """``flash_attn.cute.flash_attn_func``; :class:`Unavailable` saying why when it cannot be imported."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:  # noqa: BLE001 - missing, or broken without its CUDA libraries
        raise Unavailable(f"FlashAttention-4 not importable (flash_attn.cute: {type(exc).__name__}: {exc}); "
                          f"pip install -e \".[fa4]\" on a Hopper or Blackwell GPU") from None
    return flash_attn_func


def fa4_capability_reason(torch) -> str | None:
    major, minor = torch.cuda.get_device_capability()
    if major not in FA4_MAJORS:
        return (f"FlashAttention-4 runs on compute capability 9.x-11.x (Hopper, Blackwell); this GPU is "
                f"{major}.{minor}")
    return None


def fa4_kwargs(fn, problem: Problem) -> dict:
    """The keyword arguments of ``fn`` (``flash_attn_func``) for ``problem``, read against its signature: one it
    does not take raises :class:`Unavailable` naming it (the scale is left out when it is the default)."""
    kw = {"softmax_scale": problem.sm_scale, **fa4_arguments(problem)}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read: the documented arguments
        return kw
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kw
    if "softmax_scale" not in params and problem.scale is None:
        kw.pop("softmax_scale")
    missing = [k for k in kw if k not in params]
    if missing:
        raise Unavailable(f"this flash_attn.cute.flash_attn_func takes no {', '.join(missing)}")
    return kw


def fa4_refusal(exc: BaseException) -> str | None:
    """FlashAttention-4's refusal of a problem (an assertion, NotImplementedError, "not supported") as a skip
    reason; None for other errors."""
    msg = str(exc).strip()
    if isinstance(exc, (AssertionError, NotImplementedError)) or "not supported" in msg.lower():
        first = msg.splitlines()[0] if msg else type(exc).__name__
        return f"FlashAttention-4 cannot run this problem: {first[:200]}"
    return None


def _fa4_case(torch, problem: Problem):
    fn = fa4_function()
    why = torch_status() or fa4_capability_reason(torch)
    if why:
        raise Unavailable(why)
    kw = fa4_kwargs(fn, problem)

    def call(q, k, v):
        out = fn(q, k, v, **kw)
        return out[0] if isinstance(out, (tuple, list)) else out

    def to_bnhd(t):  # a leaf of its own (the backward's gradients are taken with respect to it)
        x = t.detach().transpose(1, 2).contiguous()
        return x.requires_grad_() if t.requires_grad else x

    params = {"dtype": problem.dtype, "library": "flash_attn.cute"}
    params.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items() if k != "softmax_scale"})
    return call, to_bnhd, lambda t: t.transpose(1, 2), fa4_refusal, params


# ---------------------------------------------------------------- FlexAttention

def flex_module():
    """``torch.nn.attention.flex_attention`` (the module); :class:`Unavailable` saying why it cannot be had."""
    try:
        import torch  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"torch not importable ({type(exc).__name__}: {exc})") from None
    try:
        import torch.nn.attention.flex_attention as flex
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"this torch has no FlexAttention ({FLEX}: {type(exc).__name__}: {exc})") from None
    return flex


def flex_refusal(exc: BaseException) -> str | None:
    """FlexAttention's refusal of a problem (NYI, not supported) as a skip reason; None for other errors (a graph
    break, which ``fullgraph=True`` turns into an error rather than a silent unfused call, among them)."""
    msg = str(exc).strip()
    keys = ("nyi", "not supported", "does not support", "notimplementederror")  # the last: raised under dynamo
    if not isinstance(exc, NotImplementedError) and not any(k in msg.lower() for k in keys):
        return None
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    said = next((ln for ln in lines if any(k in ln.lower() for k in keys)), lines[0] if lines else type(exc).__name__)
    return f"FlexAttention cannot run this problem: {said[:200]}"


def _flex_case(torch, problem: Problem):
    flex = flex_module()
    why = torch_status()
    if why:
        raise Unavailable(why)
    try:
        mask, score, B, H = flex_functions(problem, device="cuda")
    except NoMapping as exc:
        raise Unavailable(str(exc)) from None
    takes = inspect.signature(flex.flex_attention).parameters
    kw = {"score_mod": score, "scale": problem.sm_scale}
    if problem.kv_heads != problem.heads:
        if "enable_gqa" not in takes:
            raise Unavailable("this torch's flex_attention has no enable_gqa (grouped-query attention)")
        kw["enable_gqa"] = True
    torch._dynamo.reset()  # a fresh compile cache per row: no recompile limit reached over a long run
    block_mask = None
    if mask is not None:  # built once, outside the timing
        extra = {}
        elements = (B or 1) * (H or 1) * problem.q_len * problem.kv_len
        if elements > 2**26 and "_compile" in inspect.signature(flex.create_block_mask).parameters:
            extra["_compile"] = True  # a large mask is not materialized whole
        block_mask = flex.create_block_mask(mask, B, H, problem.q_len, problem.kv_len, device="cuda", **extra)
    kw["block_mask"] = block_mask
    compiled = torch.compile(flex.flex_attention, dynamic=False, fullgraph=True)

    def call(q, k, v):
        return compiled(q, k, v, **kw)

    params = {"dtype": problem.dtype, "library": FLEX, "compiled": True, "block_mask": mask is not None,
              "score_mod": problem.variant.score.name if score is not None else None}
    return call, (lambda t: t), (lambda t: t), flex_refusal, params


# ---------------------------------------------------------------- the rows

def other_peer_library(name: str) -> str:
    return "fa4" if name.startswith("fa4") else "flex"


def static_skip_reason(name: str, problem: Problem) -> str | None:
    """Why ``name`` has no row on ``problem`` before anything is imported (its layout; FlashAttention-4: dtype,
    head_dim, variant), or None."""
    why = layout_skip_reason(problem)
    if why:
        return why.replace("SDPA", "FlashAttention-4" if other_peer_library(name) == "fa4" else "FlexAttention")
    return fa4_problem_reason(problem) if other_peer_library(name) == "fa4" else None


def measure_other_peer(name: str, problem: Problem, cfg) -> dict:
    """The row of ``fa4``, ``fa4_backward``, ``torch_flex`` or ``torch_flex_backward`` on ``problem``: ``SKIP``
    with the reason when the package, torch's CUDA, the GPU or the problem does not allow it."""
    backward = name.endswith("_backward")
    row = peer_row(name, problem, {"dtype": problem.dtype}, backward=backward)
    why = static_skip_reason(name, problem)
    if why:
        row.update(status=SKIP, reason=why)
        return row
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        row.update(status=SKIP, reason=f"torch not importable ({type(exc).__name__}: {exc})")
        return row
    try:
        make = _fa4_case if other_peer_library(name) == "fa4" else _flex_case
        call, convert, restore, refusal, params = make(torch, problem)
    except Unavailable as exc:
        row.update(status=SKIP, reason=str(exc))
        return row
    except Exception as exc:  # noqa: BLE001
        row.update(status=ERROR, reason=summarize_exception(exc))
        return row
    row["params"] = params
    row["torch"] = torch.__version__
    try:
        if backward:
            _measure_backward(torch, row, problem, cfg, call, convert, restore, refusal)
        else:
            _measure_forward(torch, row, problem, cfg, call, convert, restore, refusal)
    except Exception as exc:  # noqa: BLE001
        row.update(status=ERROR, reason=summarize_exception(exc))
    return row


def _measure_forward(torch, row, problem, cfg, call, convert, restore, refusal):
    tq, tk, tv, ref = torch_inputs(torch, problem, cfg, problem.dtype)
    args = tuple(convert(t) for t in (tq, tk, tv))  # the peer's layout, made before the timing
    with torch.no_grad():  # the first call and the timed ones alike (a compiled call guards on grad mode)
        out = first_call(torch, None, row, lambda: call(*args), refusal)
        if out is None or not check_output(row, restore(out), ref, problem.dtype):
            return
        sets = input_sets(problem, args)

        def fn(i):
            call(*sets[i % len(sets)])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time_torch_calls(torch, fn, cfg)
            names = kernel_names(torch, fn, t, row, "peer_kernels_reason")
    if names is not None:
        row["peer_kernels"] = names
    t["input_sets"] = len(sets)
    timed_row(row, problem, t)


def _measure_backward(torch, row, problem, cfg, call, convert, restore, refusal):
    from numba_attn.measure.backward_row import BackwardWork

    tq, tk, tv, tdo, ref = backward_inputs(torch, problem, cfg)
    q, k, v, do = (convert(t) for t in (tq, tk, tv, tdo))

    def forward_backward():
        out = call(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    first = first_call(torch, None, row, forward_backward, refusal)
    if first is None:
        return
    out, grads = first
    if not check_grads(row, [restore(g) for g in grads], ref, problem):
        return

    def fn(i):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time_torch_calls(torch, fn, cfg)
    if t.get("cupti_kernels"):
        row["peer_kernels"] = [kk["name"] for kk in t["cupti_kernels"]]
    timed_row(row, BackwardWork(problem), t)
