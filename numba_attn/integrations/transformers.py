"""Hugging Face transformers models on numba-attn phases: ``attn_implementation="numba_attn"``.

::

    import numba_attn.integrations.transformers as na_hf
    na_hf.register()                      # once per process
    model = AutoModelForCausalLM.from_config(config, attn_implementation="numba_attn")
    model.generate(input_ids, max_new_tokens=64, do_sample=False)

:func:`register` adds an attention function to transformers' attention registry and sdpa's mask builder under the
same name; every attention call then runs one phase through :func:`numba_attn.attention` on the tensors themselves
(grouped-query heads not repeated; masks that are plain causal run plain attention, padding and windows run as
variants, softcap and sinks as theirs; a training step runs the backward phases; what cannot run is refused, or
with ``register(fallback="sdpa")`` runs sdpa, and :func:`count_phases` counts both). Each rule (shapes, causal
alignment, masks, gradients, autocast, copies): docs/transformers.md.

torch and transformers are optional (``pip install -e ".[torch]"``); this module imports them when
:func:`register` is called, and importing ``numba_attn`` imports neither.
"""
from __future__ import annotations

import collections
import contextlib
import warnings
import weakref

from numba_attn.spec.errors import AttentionInputError, check_bool

INSTALL_HINT = 'pip install -e ".[torch]"'

# transformers' own attention implementations: register() never replaces them.
_RESERVED = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4",
             "paged|eager")

_COUNTERS: list = []  # the Counters of the active count_phases() blocks
_BACKWARD_COUNTERS: list = []  # those of them that count backward phases too (count_phases(backward=True))


def _require():
    """``(torch, transformers)``, or an ImportError that says what to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(f"numba_attn.integrations.transformers needs torch and transformers ({exc}); "
                          f"install them with: {INSTALL_HINT}") from exc
    if not hasattr(transformers, "AttentionInterface"):
        raise ImportError(f"transformers {transformers.__version__} has no AttentionInterface (needs "
                          f"transformers >= 4.53); upgrade it with: {INSTALL_HINT}")
    return torch, transformers


def register(name: str = "numba_attn", prefill_phase: str | None = None, decode_phase: str | None = None,
             allow_tf32: bool = False, *, prefill_params: dict | None = None, decode_params: dict | None = None,
             fallback: str | None = None, variants: bool = True) -> str:
    """Register numba-attn as transformers attention implementation ``name`` and return ``name``.

    ``prefill_phase`` runs prompts (q_len > 1), ``decode_phase`` decode steps (q_len == 1); None: chosen
    per call by ``numba_attn.attention(phase=None)``. ``prefill_params`` / ``decode_params``: tunable
    parameters of the named phases. ``allow_tf32``: float32 models may run on tf32 tensor cores (only
    where numba-attn chooses the phase). ``fallback="sdpa"``: calls numba-attn cannot compute (a padding
    mask, dropout, ...; see the module docstring) run transformers' sdpa instead of raising. Registering
    the same name again replaces the previous settings; transformers' own names are refused. ``variants``:
    masks that are not plain causal (padding, sliding windows) and soft-capping run as attention variants
    (:mod:`numba_attn.variants`) on phases that run them; False refuses them (or falls back).
    """
    torch, transformers = _require()
    from numba_attn.phases.registry import get_phase

    if not isinstance(name, str) or not name:
        raise AttentionInputError(f"name must be a non-empty string; got {name!r}")
    if name in _RESERVED:
        raise AttentionInputError(f"name {name!r} is one of transformers' own attention implementations; "
                                  f"register numba-attn under another name (default 'numba_attn')")
    allow_tf32 = check_bool("allow_tf32", allow_tf32)
    if fallback not in (None, "sdpa"):
        raise AttentionInputError(f"fallback must be None (refuse) or 'sdpa'; got {fallback!r}")
    phases = {}
    for arg, phase, params in (("prefill", prefill_phase, prefill_params), ("decode", decode_phase, decode_params)):
        if params is not None and not isinstance(params, dict):
            raise AttentionInputError(f"{arg}_params must be a dict of the phase's parameters; got {params!r}")
        if phase is None:
            if params:
                raise AttentionInputError(f"{arg}_params {params} need a named {arg}_phase (phase=None chooses "
                                          f"its own parameters)")
        elif not isinstance(phase, str):
            raise AttentionInputError(f"{arg}_phase must be a phase name or None; got {phase!r}")
        else:
            get_phase(phase).resolve_params(params)  # unknown phase / parameter: the registry's error
        phases[arg] = (phase, dict(params or {}))
    fn = NumbaAttention(name, phases["prefill"], phases["decode"], allow_tf32, fallback,
                        check_bool("variants", variants))
    transformers.AttentionInterface.register(name, fn)
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    # sdpa's masks: None where is_causal (or nothing) says it all, so the common calls carry no mask to check
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


@contextlib.contextmanager
def count_phases(backward: bool = False):
    """Count, inside the block, the calls of registered numba-attn attention functions by
    ``(kind, phase name)``: kind "prefill" (q_len > 1) or "decode" (q_len == 1); the phase that ran
    (when chosen by ``phase=None``, as :func:`numba_attn.explain` names it, asked once per problem), or
    "sdpa (fallback)". A call with gradients counts once, by its forward phase. ``backward=True``: the
    backward phases that ran inside the block too, as ``("backward", phase name)`` (every
    :func:`numba_attn.attention_backward` call, e.g. one per such call at ``loss.backward()``). Yields a
    ``collections.Counter``. Costs nothing outside such a block."""
    counter = collections.Counter()
    _COUNTERS.append(counter)
    if backward:
        from numba_attn import backward as bwd

        _BACKWARD_COUNTERS.append(counter)
        if _count_backward not in bwd.RAN_HOOKS:
            bwd.RAN_HOOKS.append(_count_backward)
    try:
        yield counter
    finally:  # by identity: two blocks' Counters may be equal
        _COUNTERS[:] = [c for c in _COUNTERS if c is not counter]
        if backward:
            _BACKWARD_COUNTERS[:] = [c for c in _BACKWARD_COUNTERS if c is not counter]
            if not _BACKWARD_COUNTERS and _count_backward in bwd.RAN_HOOKS:
                bwd.RAN_HOOKS.remove(_count_backward)


def _count_backward(phase):
    for c in _BACKWARD_COUNTERS:
        c[("backward", phase)] += 1


class NumbaAttention:
    """The attention function :func:`register` puts in transformers' registry (see the module docstring)."""

    def __init__(self, name, prefill, decode, allow_tf32, fallback, variants=True):
        from numba_attn import api

        self._api = api  # attention() looked up at each call
        self.name = name
        self.prefill_phase, self.prefill_params = prefill
        self.decode_phase, self.decode_params = decode
        self.allow_tf32 = allow_tf32
        self.fallback = fallback
        self._mask_seen = None  # (weakref to the mask, its version, the call's key, keys to keep or why not)
        self._dense_seen = None  # (weakref to the mask, its version, (mask_mod, why))
        self._variant_ok = {}  # (kind, phase, shapes, dtype, variant kinds) -> None or why the phase refuses
        self._grad_ok = {}  # (phase, shapes, dtype, device, causal, scale) -> None or why gradients are refused
        self.variants = variants
        self._chosen = {}  # problem key -> the phase phase=None runs (count_phases only)
        self._warned = False

    def __repr__(self):
        return (f"NumbaAttention({self.name!r}, prefill={self.prefill_phase or 'chosen'}, "
                f"decode={self.decode_phase or 'chosen'}, fallback={self.fallback})")

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=None,
                 **kwargs):
        import torch

        layer_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        q_len, kv_len = query.shape[2], key.shape[2]
        grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        why = self._unsupported(torch, query, key, value, dropout, kwargs)
        keep = kv_len
        variant = {}
        if why is None:
            if attention_mask is None:
                if layer_causal and 1 < q_len < kv_len:
                    keep = q_len  # a prompt in an empty static cache: the keys past it are empty slots (as sdpa)
                window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
                if window and kv_len > window:  # no mask built, a window that cuts keys: the window as a variant
                    variant["mask_mod"] = _variants().sliding_window(int(window) - 1)
            else:
                keep, why = self._mask_keys(torch, attention_mask, q_len, kv_len, bool(layer_causal))
                if why is not None and self.variants:  # padding, a window, any pattern: the mask as a variant
                    variant["mask_mod"], why = self._dense_mask(torch, attention_mask)
                    keep = kv_len
            if kwargs.get("softcap") is not None:
                variant["score_mod"] = _variants().softcap(float(kwargs["softcap"]))
            if kwargs.get("s_aux") is not None:  # gpt-oss's per-head sink logits
                variant["sinks"] = kwargs["s_aux"]
        if why is None and variant and not self.variants:
            why = _variant_words(variant, "a sliding window")
        if why is None and variant:
            why = self._variant_refused(query, key, value, bool(layer_causal), scaling, variant)
        if why is not None:
            return self._refuse(why, module, query, key, value, attention_mask, scaling, dropout, is_causal,
                                kwargs)
        if kwargs.get("output_attentions") and not self._warned:
            self._warned = True
            warnings.warn("numba-attn attention returns no attention weights (output_attentions=True is "
                          "ignored, as with sdpa)", stacklevel=2)
        if keep < kv_len:
            key, value = key[:, :, :keep], value[:, :, :keep]
        causal = bool(layer_causal) and q_len > 1  # a single query sees the whole cache
        if q_len == 1:
            phase, params = self.decode_phase, self.decode_params
        else:
            phase, params = self.prefill_phase, self.prefill_params
        if torch.is_autocast_enabled(query.device.type):  # as sdpa under autocast: q, k, v in its dtype
            dt = torch.get_autocast_dtype(query.device.type)
            query, key, value = (t.to(dt) if t.is_floating_point() else t for t in (query, key, value))
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (query, key, value))
        if grad:  # a training step: the forward keeps lse, the backward runs numba_attn.attention_backward
            why = self._grad_refused(q, k, v, causal, scaling, phase, params)
            if why is not None:
                return self._refuse(why, module, query, key, value, attention_mask, scaling, dropout, is_causal,
                                    kwargs)
            from numba_attn.integrations.torch_op import differentiable_attention

            out = differentiable_attention(q, k, v, causal=causal, scale=scaling, phase=phase,
                                           allow_tf32=self.allow_tf32, **variant, **params)
        else:
            out = self._api.attention(q, k, v, causal=causal, scale=scaling, phase=phase, allow_tf32=self.allow_tf32,
                                      **variant, **params)
        if _COUNTERS:
            self._count("decode" if q_len == 1 else "prefill",
                        phase or self._chosen_phase(q, k, v, causal, scaling, lse=grad, variant=variant))
        return out.transpose(1, 2).contiguous(), None

    # -- what numba-attn cannot compute ------------------------------------------------------------------

    @staticmethod
    def _unsupported(torch, query, key, value, dropout, kwargs) -> str | None:
        if dropout:
            return f"dropout {dropout} (training): the phases compute attention without dropout"
        if kwargs.get("position_bias") is not None:
            return "an additive position bias"
        if type(kwargs.get("cache")).__name__ == "PagedAttentionCache":
            return "a paged KV cache (continuous batching)"
        if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
            return (f"head_dim of query {query.shape[-1]}, key {key.shape[-1]}, value {value.shape[-1]}: the phases "
                    f"need one head_dim")
        return None

    def _mask_keys(self, torch, mask, q_len, kv_len, causal):
        """``(L, None)`` when ``mask`` lets every query see exactly the causal (or, for a non-causal layer,
        every) key among the first L keys, L the same for the whole batch; ``(None, why)`` otherwise.
        Checked once per mask tensor and version (every layer of a forward gets the same mask)."""
        call = (tuple(mask.shape) if isinstance(mask, torch.Tensor) else None, q_len, kv_len, causal)
        seen = self._mask_seen
        if seen is not None and seen[0]() is mask and seen[1] == mask._version and seen[2] == call:
            return seen[3]
        answer = _check_mask(torch, mask, q_len, kv_len, causal)
        if isinstance(mask, torch.Tensor):
            self._mask_seen = (weakref.ref(mask), mask._version, call, answer)
        return answer

    def _dense_mask(self, torch, mask):
        """``(mask_mod, None)``: a 4-D boolean mask (or an additive one of 0 / -inf) as a dense-mask variant;
        ``(None, why)`` for an additive bias. Kept per mask tensor and version, like the check."""
        seen = self._dense_seen
        if seen is not None and seen[0]() is mask and seen[1] == mask._version:
            return seen[2]
        if mask.dtype == torch.bool:
            answer = (_variants().dense_mask(mask if mask.is_contiguous() else mask.contiguous()), None)
        else:
            allowed = mask == 0
            if not bool((allowed | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
                answer = (None, "an additive bias in the attention mask")
            else:
                answer = (_variants().dense_mask(allowed.contiguous()), None)
        self._dense_seen = (weakref.ref(mask), mask._version, answer)
        return answer

    def _grad_refused(self, q, k, v, causal, scale, phase, params) -> str | None:
        """Why a call with gradients cannot run on the phases (None: it can): the forward phase must write the
        log-sum-exp, a backward phase must take the problem (float32 and float16). Kept per problem."""
        key = (phase, tuple(q.shape), tuple(k.shape), str(q.dtype), q.device.type, causal, scale)
        if key not in self._grad_ok:
            from dataclasses import fields

            from numba_attn.backward import choose_backward
            from numba_attn.spec.problem import Problem

            try:
                problem = self._api.explain(q, k, v, causal=causal, scale=scale, phase=phase, return_lse=True,
                                            allow_tf32=self.allow_tf32, **params).problem
                if problem is not None:  # the same problem without the forward's log-sum-exp output
                    choose_backward(Problem(**{f.name: getattr(problem, f.name) for f in fields(problem) if f.init}))
                self._grad_ok[key] = None
            except AttentionInputError as e:
                self._grad_ok[key] = f"gradients the phases cannot compute ({e})"
        return self._grad_ok[key]

    def _variant_refused(self, q, k, v, causal, scale, variant) -> str | None:
        """Why the phase this call would run cannot run the variant (None: it can)."""
        kind = "decode" if q.shape[2] == 1 else "prefill"
        phase = self.decode_phase if kind == "decode" else self.prefill_phase
        key = (kind, phase, tuple(q.shape), tuple(k.shape), str(q.dtype), tuple(sorted(variant)))
        if key not in self._variant_ok:
            try:
                self._api.explain(q, k, v, causal=causal and q.shape[2] > 1, scale=scale, phase=phase,
                                  allow_tf32=self.allow_tf32,
                                  **(self.decode_params if kind == "decode" else self.prefill_params), **variant)
                self._variant_ok[key] = None
            except AttentionInputError as e:
                self._variant_ok[key] = f"a mask or score variant the {kind} phase cannot run ({e})"
        return self._variant_ok[key]

    def _refuse(self, why, module, query, key, value, attention_mask, scaling, dropout, is_causal, kwargs):
        if self.fallback != "sdpa":
            raise AttentionInputError(
                f"numba-attn attention ({self.name!r}) cannot run this call of "
                f"{type(module).__name__}: {why}. Register with fallback='sdpa' to run such calls with sdpa, "
                f"or use attn_implementation='sdpa'")
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if _COUNTERS:
            self._count("decode" if query.shape[2] == 1 else "prefill", "sdpa (fallback)")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)

    # -- counting -----------------------------------------------------------------------------------------

    @staticmethod
    def _count(kind, phase):
        for c in _COUNTERS:
            c[(kind, phase)] += 1

    def _chosen_phase(self, q, k, v, causal, scale, lse=False, variant=None) -> str:
        """The phase ``phase=None`` ran, as :func:`numba_attn.explain` names it, asked once per problem (a variant
        by its kinds: the choice depends on whether there is one, not on its arrays)."""
        variant = variant or {}
        key = (tuple(q.shape), tuple(k.shape), str(q.dtype), q.device.type, causal, scale, self.allow_tf32, lse,
               tuple(sorted(variant)))
        if key not in self._chosen:
            self._chosen[key] = self._api.explain(q, k, v, causal=causal, scale=scale, return_lse=lse,
                                                  allow_tf32=self.allow_tf32, **variant).name
        return self._chosen[key]


def _variant_words(variant, mask_words) -> str:
    return (mask_words if "mask_mod" in variant else
            "logit soft-capping (softcap)" if "score_mod" in variant else "attention sinks (s_aux)")


def _variants():
    from numba_attn import variants

    return variants


def _check_mask(torch, mask, q_len, kv_len, causal):
    """See :meth:`NumbaAttention._mask_keys`: a few elementwise kernels and one device-to-host copy."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return None, f"an attention mask of type {type(mask).__name__} (numba-attn takes a 4-D tensor mask)"
    if tuple(mask.shape[-2:]) != (q_len, kv_len):
        return None, f"an attention mask of shape {tuple(mask.shape)} for {q_len} queries and {kv_len} keys"
    if mask.dtype == torch.bool:
        allowed, plain = mask, None
    else:  # additive: 0 where a query sees a key, -inf (or the dtype's minimum) where not
        allowed = mask == 0
        plain = (allowed | (mask <= torch.finfo(mask.dtype).min / 2)).all()
    seen = allowed[..., -1, :].sum(-1)  # keys the last query sees, per batch (and head)
    lim = seen[..., None, None]
    j = torch.arange(kv_len, device=mask.device)
    expect = j < lim
    if causal:
        i = torch.arange(q_len, device=mask.device)[:, None]
        expect = expect & (j <= i + (lim - q_len))
    ok = (allowed == expect).all()
    if plain is not None:
        ok = ok & plain
    ok, lo, hi = torch.stack([ok.to(seen.dtype), seen.min(), seen.max()]).tolist()
    if not ok or lo != hi:
        what = "an additive bias or " if plain is not None else ""
        return None, (f"an attention mask with {what}keys masked that causality does not explain (padding, "
                      f"e.g. left padding in a batch of prompts of different lengths, a sliding window or a "
                      f"custom mask); numba-attn computes plain {'causal' if causal else 'full'} attention over "
                      f"the same keys for every sequence of the batch")
    if hi == 0 or (causal and hi < q_len):
        return None, "an attention mask under which some query sees no key"
    return hi, None
