"""Built-in attention variants: each a :class:`~numba_attn.variants.mods.Mod` (a Python function and the
arrays it reads), for ``attention(mask_mod=...)`` and ``attention(score_mod=...)``.

Positions follow :mod:`numba_attn.variants.mods`: ``q_idx`` and ``kv_idx`` are places in the key sequence
(queries aligned bottom-right). Constants a model fixes (a window, a cap) are compiled in, one compilation
per value; per-call data (lengths, document ids, slopes) are arrays, passed without a recompilation.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import float32

from numba_attn.variants.mods import Mod, VariantError, and_masks, or_masks  # noqa: F401 (re-exported)


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def causal() -> Mod:
    """Query ``q_idx`` sees keys up to its own position (the project's ``causal=True``, bottom-right)."""
    return Mod(_causal, "mask", (), "causal", depends="")


@functools.cache
def _window_fn(left: int, right: int):
    if left < 0 and right < 0:
        raise VariantError("sliding_window: left and right cannot both be unbounded")

    if right < 0:
        def window(b, h, q_idx, kv_idx):
            return kv_idx >= q_idx - left
    elif left < 0:
        def window(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + right
    else:
        def window(b, h, q_idx, kv_idx):
            return kv_idx >= q_idx - left and kv_idx <= q_idx + right
    return window


def sliding_window(left: int, right: int = 0) -> Mod:
    """Keys ``q_idx - left ≤ kv_idx ≤ q_idx + right`` (FlashAttention's ``window_size=(left, right)``; -1: no
    bound on that side). ``right=0`` is causal. A model's window of W tokens (Mistral's ``sliding_window``,
    the query included) is ``sliding_window(W - 1)``."""
    for name, x in (("left", left), ("right", right)):
        if not isinstance(x, (int, np.integer)) or x < -1:
            raise VariantError(f"sliding_window: {name} must be an integer >= -1 (-1: unbounded), got {x!r}")
    return Mod(_window_fn(int(left), int(right)), "mask", (), f"window{left}" + (f"r{right}" if right else ""),
               {"left": int(left), "right": int(right)}, depends="")


@functools.cache
def _softcap_fn(cap: float):
    c = float32(cap)
    inv = float32(1.0 / cap)

    def softcap(score, b, h, q_idx, kv_idx):
        return c * math.tanh(score * inv)
    return softcap


@functools.cache
def _softcap_grad_fn(cap: float):
    inv = float32(1.0 / cap)

    def softcap_grad(score, b, h, q_idx, kv_idx):  # d/ds cap · tanh(s / cap) = 1 − tanh²(s / cap)
        t = math.tanh(score * inv)
        return float32(1.0) - t * t
    return softcap_grad


def softcap(cap: float) -> Mod:
    """``score → cap · tanh(score / cap)`` (Gemma-2's logit soft-capping of attention scores)."""
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise VariantError(f"softcap: cap must be a finite number > 0, got {cap!r}")
    return Mod(_softcap_fn(float(cap)), "score", (), f"softcap{cap:g}", {"cap": float(cap)}, depends="",
               derivative=_softcap_grad_fn(float(cap)))


def _alibi(score, b, h, q_idx, kv_idx, slopes):
    return score + slopes[h] * float32(kv_idx - q_idx)


def _alibi_grad(score, b, h, q_idx, kv_idx, slopes):  # a shift: d/ds = 1
    return float32(1.0)


def alibi_slopes(heads: int) -> np.ndarray:
    """The slopes of the ALiBi paper (Press et al. 2022) for ``heads`` heads, float32."""
    def pow2(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(heads).is_integer():
        s = pow2(heads)
    else:
        p = 2 ** math.floor(math.log2(heads))
        s = pow2(p) + pow2(2 * p)[0::2][: heads - p]
    return np.asarray(s, np.float32)


def alibi(slopes) -> Mod:
    """``score + slopes[h] · (kv_idx - q_idx)``: a linear penalty on distance, one slope per query head
    (``slopes``: an array of H float32, e.g. :func:`alibi_slopes`)."""
    return Mod(_alibi, "score", (slopes,), "alibi", depends="h", derivative=_alibi_grad)


def _document(b, h, q_idx, kv_idx, doc):
    return doc[b, q_idx] == doc[b, kv_idx]


def document(doc_ids) -> Mod:
    """Packed sequences: a query sees only keys of its own document. ``doc_ids``: (batch, kv_len) integers,
    the document of each position. Combine with :func:`causal` for causal packed training."""
    return Mod(_document, "mask", (doc_ids,), "document", depends="b")


def _prefix_lm(b, h, q_idx, kv_idx, prefix):
    return kv_idx < prefix[b] or kv_idx <= q_idx


def prefix_lm(prefix_lengths) -> Mod:
    """Prefix-LM: every query sees the whole prefix of its sequence (``prefix_lengths``: (batch,) integers)
    and causally after it."""
    return Mod(_prefix_lm, "mask", (prefix_lengths,), "prefix_lm", depends="b")


def _keys_from(b, h, q_idx, kv_idx, start):
    return kv_idx >= start[b]


def _keys_below(b, h, q_idx, kv_idx, length):
    return kv_idx < length[b]


def key_padding(lengths, side: str = "right", kv_len: int | None = None) -> Mod:
    """Padded batches: sequence ``b`` holds ``lengths[b]`` real keys, the rest padding. ``side="right"``:
    keys ``[0, lengths[b])`` (padding after); ``side="left"``: the last ``lengths[b]`` of ``kv_len`` keys
    (batched generation pads prompts on the left)."""
    if side == "right":
        return Mod(_keys_below, "mask", (lengths,), "pad_right", depends="b")
    if side != "left":
        raise VariantError(f"key_padding: side must be 'left' or 'right', got {side!r}")
    if kv_len is None:
        raise VariantError("key_padding(side='left') needs kv_len (the padded key length)")
    if hasattr(lengths, "copy_to_host"):
        lengths = lengths.copy_to_host()
    return Mod(_keys_from, "mask", (kv_len - lengths,), "pad_left", depends="b")


@functools.cache
def _sink_fn(n: int):
    def sink_tokens(b, h, q_idx, kv_idx):
        return kv_idx < n and kv_idx <= q_idx
    return sink_tokens


def sink_tokens(n: int) -> Mod:
    """The first ``n`` keys, visible to every query at or after them (StreamingLLM's attention sinks);
    ``or_masks`` it with a window."""
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise VariantError(f"sink_tokens: n must be an integer >= 0, got {n!r}")
    return Mod(_sink_fn(int(n)), "mask", (), f"sinks{n}", {"n": int(n)}, depends="")


def streaming(window: int, sinks: int) -> Mod:
    """StreamingLLM: a causal window of ``window`` tokens and the first ``sinks`` keys."""
    return or_masks(sliding_window(window - 1), sink_tokens(sinks))


def _dense(b, h, q_idx, kv_idx, allowed):
    row = q_idx - (allowed.shape[3] - allowed.shape[2])
    return allowed[min(b, allowed.shape[0] - 1), min(h, allowed.shape[1] - 1), row, kv_idx] != 0


def dense_mask(allowed) -> Mod:
    """Any mask, given as an array ``allowed`` (batch or 1, heads or 1, q_len, kv_len), nonzero where a query
    sees a key (a model's 4-D boolean attention mask). Exact for every pattern; a kernel reads one byte per
    score of a partial tile, and its block mask skips the empty tiles."""
    if getattr(allowed, "ndim", 0) != 4:
        raise VariantError(f"dense_mask: allowed must be 4-D (batch, heads, q_len, kv_len), got shape "
                           f"{tuple(getattr(allowed, 'shape', ()))}")
    return Mod(_dense, "mask", (allowed,), "dense_mask", depends="bh")


def builtin(mod: Mod) -> tuple[str, dict, tuple] | None:
    """Which built-in ``mod`` is, for readers that express it in another library's terms (the FlexAttention and
    FlashAttention-4 peers, :mod:`numba_attn.variants.external`): ``(kind, numbers, arrays)`` with kind one of
    ``causal``, ``window`` (``left``, ``right``), ``softcap`` (``cap``), ``alibi``, ``document``, ``prefix_lm``,
    ``pad_right``, ``pad_left``, ``sinks`` (``n``), ``dense_mask``, ``and`` / ``or`` (``mods``: the parts, each
    with its share of ``mod.aux``); ``arrays``: ``mod.aux``. None for a function of the user's own."""
    from numba_attn.variants.mods import python_function

    fn, p = python_function(mod.fn), mod.params or {}
    plain = {_causal: "causal", _alibi: "alibi", _document: "document", _prefix_lm: "prefix_lm",
             _keys_below: "pad_right", _keys_from: "pad_left", _dense: "dense_mask"}
    if fn in plain:
        return plain[fn], {}, mod.aux
    try:
        if {"left", "right"} <= p.keys() and fn is _window_fn(p["left"], p["right"]):
            return "window", {"left": p["left"], "right": p["right"]}, ()
        if "cap" in p and fn is _softcap_fn(p["cap"]):
            return "softcap", {"cap": p["cap"]}, ()
        if "n" in p and fn is _sink_fn(p["n"]):
            return "sinks", {"n": p["n"]}, ()
    except (TypeError, VariantError):  # numbers of the user's own: not a built-in
        return None
    parts = p.get("mods")
    if p.get("op") in ("and", "or") and parts and getattr(fn, "_numba_attn_source", None):
        shares, k = [], 0
        for part in parts:  # the combination's arrays now (with_aux may have replaced them), split per part
            shares.append(part.with_aux(mod.aux[k:k + len(part.aux)]))
            k += len(part.aux)
        return p["op"], {"mods": tuple(shares)}, mod.aux
    return None
