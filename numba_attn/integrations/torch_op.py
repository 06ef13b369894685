"""``torch.ops.numba_attn``: numba-attn's ``attention()`` as differentiable PyTorch operators.

Importing this module registers three ``torch.library.custom_op`` operators::

    import numba_attn.integrations.torch_op as na_op  # registers the operators (imports torch)
    out = torch.ops.numba_attn.attention(q, k, v, causal=True, scale=None, phase=None)
    out = na_op.differentiable_attention(q, k, v, causal=True)   # for training: lse kept for the backward
    out.sum().backward()                                          # q.grad, k.grad, v.grad

* ``numba_attn::attention(q, k, v, causal, scale, phase) -> out``: :func:`numba_attn.attention`. Its
  gradient recomputes the log-sum-exp (one more forward, ``phase=None``) and runs the backward.
* ``numba_attn::attention_lse(q, k, v, causal, scale, phase, params, allow_tf32, backward_phase) -> (out,
  lse)``: ``attention(..., return_lse=True)`` (a phase that writes the row log-sum-exp; ``params``: the
  phase's parameters as a JSON object). Its gradient runs the backward from the saved q, k, v, out, lse;
  lse itself is not differentiable. :func:`differentiable_attention` calls it.
* ``numba_attn::attention_backward(q, k, v, out, lse, grad_out, causal, scale, phase) -> (dq, dk, dv)``:
  :func:`numba_attn.attention_backward` (a backward phase; None: the default).

q (B, H, Nq, D) and k, v (B, Hkv, Nk, D) are tensors of one dtype: CUDA tensors are computed on PyTorch's
current stream without copies, CPU tensors in the simulator (or copied to the GPU and back). Grouped-query
attention: dk, dv have k's shape (summed over the query heads of a KV head). Fake implementations let
``torch.compile(fullgraph=True)`` trace forward and backward (opaque calls, run eagerly). Mask and score
functions, their block masks and sinks are differentiable (:class:`VariantAttention`, eager).
"""
# no ``from __future__ import annotations``: custom_op reads the schema from these annotations
import ast
from typing import Optional

import torch

from numba_attn.api import attention as _attention
from numba_attn.backward import attention_backward as _attention_backward
from numba_attn.spec.errors import AttentionInputError

OP_NAME = "numba_attn::attention"
LSE_OP_NAME = "numba_attn::attention_lse"
BACKWARD_OP_NAME = "numba_attn::attention_backward"
VARIANT_ARGS = ("mask_mod", "score_mod", "block_mask", "aux", "sinks")


@torch.library.custom_op(OP_NAME, mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None, phase: Optional[str] = None) -> torch.Tensor:
    """Softmax attention of q over k, v by a numba-attn phase (see :func:`numba_attn.attention`)."""
    return _attention(q, k, v, causal=causal, scale=scale, phase=phase)


@attention.register_fake
def _attention_fake(q, k, v, causal=False, scale=None, phase=None):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


@torch.library.custom_op(LSE_OP_NAME, mutates_args=())
def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  scale: Optional[float] = None, phase: Optional[str] = None, params: str = "",
                  allow_tf32: bool = False, backward_phase: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): ``numba_attn.attention(..., return_lse=True)``, lse (B, H, Nq) float32 (natural log).
    ``backward_phase`` is read by the gradient only."""
    out, lse = _attention(q, k, v, causal=causal, scale=scale, phase=phase, allow_tf32=allow_tf32,
                          return_lse=True, **decode_params(params))
    return out, lse


@attention_lse.register_fake
def _attention_lse_fake(q, k, v, causal=False, scale=None, phase=None, params="", allow_tf32=False,
                        backward_phase=None):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(q.shape[:3], dtype=torch.float32, device=q.device))


@torch.library.custom_op(BACKWARD_OP_NAME, mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       grad_out: torch.Tensor, causal: bool = False, scale: Optional[float] = None,
                       phase: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): :func:`numba_attn.attention_backward` (dk, dv of k's shape)."""
    arrays = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v, out, lse, grad_out))
    dq, dk, dv = _attention_backward(*arrays, causal=causal, scale=scale, phase=phase)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, out, lse, grad_out, causal=False, scale=None, phase=None):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


# -- the gradients -------------------------------------------------------------------------------------------


def _lse_setup(ctx, inputs, output):
    q, k, v, causal, scale, _phase, _params, _tf32, backward_phase = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.backward_phase = causal, scale, backward_phase
    ctx.mark_non_differentiable(lse)


def _lse_grad(ctx, grad_out, _grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.numba_attn.attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.scale,
                                                         ctx.backward_phase)
    return dq, dk, dv, None, None, None, None, None, None


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, scale, _phase = inputs
    ctx.save_for_backward(q, k, v)
    ctx.causal, ctx.scale = causal, scale


def _attention_grad(ctx, grad_out):
    """The plain operator's gradient: out and lse recomputed by a phase that writes lse (phase=None)."""
    q, k, v = ctx.saved_tensors
    out, lse = torch.ops.numba_attn.attention_lse(q, k, v, ctx.causal, ctx.scale)
    dq, dk, dv = torch.ops.numba_attn.attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None


attention_lse.register_autograd(_lse_grad, setup_context=_lse_setup)
attention.register_autograd(_attention_grad, setup_context=_attention_setup)


class VariantAttention(torch.autograd.Function):
    """Attention with a variant (or none: the eager path of :func:`differentiable_attention`), ``functions`` =
    (mask_mod, score_mod, score_mod_grad, aux, block_mask): forward
    ``attention(..., return_lse=True)`` (the block mask skipping the tiles it leaves empty), backward
    ``attention_backward`` from the saved q, k, v, out, lse (its phase's own block mask of the mask function, at its
    own tiles: the one given was made from the same mask_mod, at the forward's)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, functions, causal, scale, phase, backward_phase, allow_tf32, params):
        mask_mod, score_mod, score_mod_grad, aux, block_mask = functions
        from numba_attn.api_checks import variant_arg
        from numba_attn.backward import with_derivative
        from numba_attn.phases.backward.common import SCORE_MOD_REFUSED

        variant = with_derivative(variant_arg(mask_mod, score_mod, aux), score_mod_grad)
        if variant is not None and variant.score is not None and variant.score.derivative is None:
            raise AttentionInputError(f"gradients of {variant.name}: {SCORE_MOD_REFUSED}")  # before the forward
        out, lse = _attention(q, k, v, causal=causal, scale=scale, phase=phase, allow_tf32=allow_tf32,
                              mask_mod=mask_mod, score_mod=score_mod, aux=aux, return_lse=True, sinks=sinks,
                              **({} if block_mask is None else {"block_mask": block_mask}), **params)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.args = (functions, causal, scale, backward_phase)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        (mask_mod, score_mod, score_mod_grad, aux, _block_mask), causal, scale, backward_phase = ctx.args
        grads = _attention_backward(q, k, v, out, lse, grad_out.contiguous(), causal=causal, scale=scale,
                                    phase=backward_phase, mask_mod=mask_mod, score_mod=score_mod,
                                    score_mod_grad=score_mod_grad, aux=aux, sinks=sinks)
        dsinks = None if sinks is None else torch.as_tensor(grads[3]).to(sinks.device, sinks.dtype)
        return grads[0], grads[1], grads[2], dsinks, None, None, None, None, None, None, None


# -- the Python entry point ----------------------------------------------------------------------------------


def encode_params(params: dict) -> str:
    """A phase's parameters as the operators take them: ``"Br=32,Bc=16"`` ('' for none; plain string code, so
    that torch.compile traces it)."""
    for name, value in params.items():
        if not isinstance(value, (bool, int, float, str)) or isinstance(value, str) and ("," in value or "=" in value):
            raise AttentionInputError(f"phase parameter {name}={value!r}: the operators take numbers, booleans and "
                                      f"strings without ',' or '='")
    return ",".join(name + "=" + repr(params[name]) for name in sorted(params))


def decode_params(text: str) -> dict:
    """:func:`encode_params` undone."""
    return {name: ast.literal_eval(value) for name, value in (item.split("=", 1) for item in text.split(",") if item)}


def needs_grad(*tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def differentiable_attention(q, k, v, *, causal=False, scale=None, phase=None, backward_phase=None,
                             allow_tf32=False, **params):
    """Softmax attention whose gradient runs numba-attn's backward: :func:`numba_attn.attention` with
    ``return_lse=True`` (``phase`` must write the log-sum-exp; None picks one), the output returned, q, k, v,
    out and lse saved; ``out.backward()`` runs :func:`numba_attn.attention_backward` (``backward_phase``; None:
    the default). ``params``: the forward phase's parameters. Traces under ``torch.compile(fullgraph=True)``.
    A variant (``mask_mod``, ``score_mod`` with its derivative, their ``aux``) is differentiable through
    :class:`VariantAttention` (the functions applied in the backward too; eager autograd, functions are no
    operator arguments; ``score_mod_grad``: a user score function's derivative, the built-ins carry theirs). A
    ``block_mask`` (made from the mask_mod) skips the tiles it leaves empty in the forward; the backward skips those
    of its own tiles from the mask_mod. ``sinks`` (a tensor (H,)) get their gradient."""
    variant = {name: params.pop(name) for name in VARIANT_ARGS if params.get(name) is not None}
    for name in VARIANT_ARGS:
        params.pop(name, None)
    score_mod_grad = params.pop("score_mod_grad", None)
    if variant:
        if not needs_grad(q, k, v):
            return _attention(q, k, v, causal=causal, scale=scale, phase=phase, allow_tf32=allow_tf32, **variant,
                              **params)
        if variant.get("block_mask") is not None and variant.get("mask_mod") is None:
            raise AttentionInputError("block_mask given without a mask_mod it was made from")
        if not set(variant) & {"mask_mod", "score_mod", "sinks"}:
            raise AttentionInputError(
                f"gradients of attention variants ({', '.join(sorted(variant))}) are not computed: the backward "
                f"family takes mask_mod (and its block_mask) and score_mod (with its derivative), their aux and "
                f"sinks; run the variant under torch.no_grad()")
        functions = (variant.get("mask_mod"), variant.get("score_mod"), score_mod_grad, variant.get("aux"),
                     variant.get("block_mask"))
        sinks = variant.get("sinks")
        if sinks is not None and not isinstance(sinks, torch.Tensor):
            sinks = torch.as_tensor(sinks, dtype=torch.float32)
        return VariantAttention.apply(q, k, v, sinks, functions, causal, scale, phase, backward_phase, allow_tf32,
                                      params)
    if not torch.compiler.is_compiling():  # eager: no operator dispatch (it costs more host time than the kernels
        # of a small problem: 0.22 against 0.06 ms a forward on an H200); torch.compile traces the operator below
        if not needs_grad(q, k, v):
            return _attention(q, k, v, causal=causal, scale=scale, phase=phase, allow_tf32=allow_tf32, **params)
        return VariantAttention.apply(q, k, v, None, (None,) * 5, causal, scale, phase, backward_phase, allow_tf32,
                                      params)
    out, _lse = torch.ops.numba_attn.attention_lse(q, k, v, bool(causal), scale, phase, encode_params(params),
                                                   bool(allow_tf32), backward_phase)
    return out
