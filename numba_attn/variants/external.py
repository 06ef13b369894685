"""A problem's causal mask and variant in other libraries' terms, for the peers that run them
(:mod:`numba_attn.measure.other_peers`): FlexAttention's ``mask_mod`` / ``score_mod`` (torch functions of
index tensors) and FlashAttention-4's ``causal`` / ``window_size`` / ``softcap`` arguments.

Each built-in variant (:func:`numba_attn.variants.library.builtin`) has its Flex twin; a function of the user's
own has none, and the peer is skipped with a reason naming it (:class:`NoMapping`). Positions: the project's
``q_idx`` is a query's place in the key sequence (``i + Nk - Nq``, :mod:`numba_attn.variants.mods`), Flex's is
the row ``i``: every Flex function here adds the offset ``Nk - Nq`` first, so causal is bottom-right aligned as
the project's (query ``i`` sees key ``j`` when ``j <= i + Nk - Nq``). FlashAttention aligns its causal mask and
window bottom-right too.

torch is imported inside the functions: the module imports without it.
"""
from __future__ import annotations

from numba_attn.variants.library import builtin
from numba_attn.variants.mods import host_arrays


class NoMapping(ValueError):
    """The problem has a mask or score function the peer cannot express; the message names it."""


# ---------------------------------------------------------------- FlexAttention

def _tensor(torch, a, device):
    return torch.as_tensor(host_arrays((a,))[0]).to(device)


def _flex_mask(torch, mod, off: int, device):
    """``mask(b, h, i, kv)`` of the mask ``mod`` (Flex's row ``i``; the project's position ``i + off``)."""
    got = builtin(mod)
    if got is None:
        raise NoMapping(f"FlexAttention has no twin of the mask function {mod.name!r} (only the built-in "
                        f"variants of numba_attn.variants map to one)")
    kind, num, aux = got
    if kind == "causal":
        return lambda b, h, i, kv: kv <= i + off
    if kind == "window":
        left, right = num["left"], num["right"]
        if left < 0:
            return lambda b, h, i, kv: kv <= i + off + right
        if right < 0:
            return lambda b, h, i, kv: kv >= i + off - left
        return lambda b, h, i, kv: (kv >= i + off - left) & (kv <= i + off + right)
    if kind == "sinks":
        n = num["n"]
        return lambda b, h, i, kv: (kv < n) & (kv <= i + off)
    if kind in ("and", "or"):
        parts = [_flex_mask(torch, m, off, device) for m in num["mods"]]

        def combined(b, h, i, kv):
            out = parts[0](b, h, i, kv)
            for p in parts[1:]:
                out = (out & p(b, h, i, kv)) if kind == "and" else (out | p(b, h, i, kv))
            return out
        return combined
    a = _tensor(torch, aux[0], device)
    if kind == "document":
        return lambda b, h, i, kv: a[b, i + off] == a[b, kv]
    if kind == "prefix_lm":
        return lambda b, h, i, kv: (kv < a[b]) | (kv <= i + off)
    if kind == "pad_right":
        return lambda b, h, i, kv: kv < a[b]
    if kind == "pad_left":
        return lambda b, h, i, kv: kv >= a[b]
    if kind == "dense_mask":
        shift = off - (a.shape[3] - a.shape[2])  # the array's row of Flex's row i
        return lambda b, h, i, kv: a[b.clamp(max=a.shape[0] - 1), h.clamp(max=a.shape[1] - 1), i + shift, kv] != 0
    raise NoMapping(f"FlexAttention has no twin of the mask function {mod.name!r}")


def _flex_score(torch, mod, off: int, device):
    got = builtin(mod)
    kind = got[0] if got else None
    if kind == "softcap":
        cap = float(got[1]["cap"])
        return lambda s, b, h, i, kv: cap * torch.tanh(s / cap)
    if kind == "alibi":
        slopes = _tensor(torch, got[2][0], device).float()
        return lambda s, b, h, i, kv: s + slopes[h] * (kv - (i + off))
    raise NoMapping(f"FlexAttention has no twin of the score function {mod.name!r} (only the built-in "
                    f"variants of numba_attn.variants map to one)")


def flex_functions(problem, device="cuda"):
    """``(mask_mod, score_mod, B, H)`` of ``problem`` for ``flex_attention`` and ``create_block_mask(mask_mod, B,
    H, q_len, kv_len)``: the causal mask and the variant's mask together (None when neither), the variant's score
    function (None without one); ``B`` / ``H`` None where the mask reads no batch / head index. Arrays (document
    ids, lengths, slopes) are copied to ``device`` once, here. Raises :class:`NoMapping` for a function with no
    Flex twin."""
    import torch

    off = problem.kv_len - problem.q_len
    variant = getattr(problem, "variant", None)
    masks, depends = [], ""
    if problem.causal:
        masks.append(lambda b, h, i, kv: kv <= i + off)
    if variant is not None and variant.mask is not None:
        masks.append(_flex_mask(torch, variant.mask, off, device))
        depends = variant.mask.depends
    score = None
    if variant is not None and variant.score is not None:
        score = _flex_score(torch, variant.score, off, device)
    mask = None
    if len(masks) == 1:
        mask = masks[0]
    elif masks:
        first, second = masks

        def mask(b, h, i, kv):
            return first(b, h, i, kv) & second(b, h, i, kv)
    B = problem.batch if "b" in depends else None
    H = problem.heads if "h" in depends else None
    return mask, score, B, H


# ---------------------------------------------------------------- FlashAttention-4

def _window_of(mod) -> tuple[int, int]:
    """(left, right) of a mask that is a window, causal, or their intersection (-1: unbounded)."""
    got = builtin(mod)
    kind = got[0] if got else None
    if kind == "causal":
        return -1, 0
    if kind == "window":
        return got[1]["left"], got[1]["right"]
    if kind == "and":
        windows = [_window_of(m) for m in got[1]["mods"]]
        return tuple(_tighter(*(w[k] for w in windows)) for k in (0, 1))
    raise NoMapping(f"FlashAttention-4 has no twin of the mask function {mod.name!r} (flash_attn_func takes "
                    f"causal, window_size and softcap only)")


def _tighter(*bounds: int) -> int:
    finite = [x for x in bounds if x >= 0]
    return min(finite) if finite else -1


def fa4_arguments(problem) -> dict:
    """The keyword arguments of FlashAttention-4's ``flash_attn_func`` for ``problem``'s mask and variant:
    ``causal``, ``window_size`` (``(left, right)``, None for an unbounded side), ``softcap``; only those a
    problem needs. Raises :class:`NoMapping` for a variant FlashAttention-4 cannot run."""
    variant = getattr(problem, "variant", None)
    kw = {}
    window = (-1, 0) if problem.causal else (-1, -1)
    if variant is not None and variant.mask is not None:
        w = _window_of(variant.mask)
        window = (_tighter(window[0], w[0]), _tighter(window[1], w[1]))
    if window == (-1, 0):
        kw["causal"] = True
    elif window != (-1, -1):
        kw["window_size"] = tuple(None if x < 0 else int(x) for x in window)
    if variant is not None and variant.score is not None:
        got = builtin(variant.score)
        if not got or got[0] != "softcap":
            raise NoMapping(f"FlashAttention-4 has no twin of the score function {variant.score.name!r} "
                            f"(flash_attn_func takes softcap only)")
        kw["softcap"] = float(got[1]["cap"])
    return kw
