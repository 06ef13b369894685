"""Where the decode kernels mask their scores: the one place of the family (causal with q_len > 1, the keys of a
split or a sequence, padding rows, and a variant's mask and score functions).

A query row sees the keys ``j < key_limit(...)``: the end of the block's keys (a split's, or a ragged sequence's
own length), and with ``causal`` at most ``i + Nk - Nq + 1`` for query position ``i`` of ``Nq`` over ``Nk`` keys
(bottom-right aligned, as FlashAttention aligns a decode step's queries with the end of the cache). A kernel
tests each key with ``visible(j, lim)``: a key that fails is skipped, or its score set to ``NEG_BIG``.

A variant (``mask_mod``/``score_mod``, :func:`variant_keys`) then rewrites the scores of the keys a row sees: its
score function in natural units, a key its mask hides set to the kernel's masked value; a row (or a split's
part of it) that sees no key is 0 in the output and writes the log-sum-exp ``SEEN_NOTHING_LSE`` as a partial,
which the split-K combine weighs 0 next to any split that saw a key and 1 where none did (a zero output, not
0/0). Without a variant none of this is compiled.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import float32

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.jit import device
from numba_attn.variants.stages import LN2, LOG2E, PLAIN, SEEN_NOTHING

# the log-sum-exp of a partial that saw no key: above the combine's empty-split bound (-1e29), so weighed, and
# so far below any real log-sum-exp that exp(it - lse) is 0 next to a split that saw a key
SEEN_NOTHING_LSE = np.float32(-1e28)


@functools.cache
def key_mask(causal: bool, Nq: int):
    """``(key_limit, visible)`` of a kernel compiled for ``causal`` and ``Nq`` query positions per sequence."""

    @device
    def key_limit(i, hi, Nk):
        """The end of the keys query position ``i`` sees among keys < ``hi`` of a sequence of ``Nk`` keys."""
        return min(hi, i + Nk - Nq + 1) if causal else hi

    @device
    def visible(j, lim):
        """Whether key ``j`` counts for a row whose keys end at ``lim``."""
        return j < lim

    return key_limit, visible


class VariantKeys(NamedTuple):
    position: object
    score: object
    partial_lse: object
    normalized: object
    active: bool


@functools.cache
def variant_keys(stage=PLAIN, BASE2: bool = False, MASKED: float = float("-inf")):
    """A variant ``stage`` (``numba_attn.variants.stages.stages_of``) in the decode kernels' terms:

    * ``position(kvh, row, Hkv, G, Nq, Nk)`` -> ``(b, h, q_idx)`` of query row ``row`` (= g·Nq + i) of KV head
      ``kvh`` (b·Hkv + KV head), ``h`` the query head, ``q_idx = i + Nk - Nq`` (bottom-right aligned);
    * ``score(s, b, h, q_idx, kv_idx, mods)`` -> the score ``s`` (natural units; with ``BASE2`` times log2 e)
      rewritten by the score function, or ``MASKED`` where the mask hides the key;
    * ``partial_lse(m, l, lse)`` -> ``lse``, or ``SEEN_NOTHING_LSE`` for a state that saw no key;
    * ``normalized(o, m, l)`` -> ``o / l``, or 0 for a row that saw no key.

    Call ``score`` only on keys a row sees (``visible``): a mask or score function reads its arrays at
    ``kv_idx``. ``active`` is False for plain attention: kernels compile the variant's code under it."""
    to_nat = LN2 if BASE2 else np.float32(1.0)
    from_nat = LOG2E if BASE2 else np.float32(1.0)
    masked = np.float32(MASKED)

    @device
    def position(kvh, row, Hkv, G, Nq, Nk):
        b = kvh // Hkv
        g = row // Nq
        return b, (kvh - b * Hkv) * G + g, row - g * Nq + Nk - Nq

    @device
    def score(s, b, h, q_idx, kv_idx, mods):
        if not stage.visible(b, h, q_idx, kv_idx, mods):
            return masked
        return stage.modified(s * to_nat, b, h, q_idx, kv_idx, mods) * from_nat

    @device
    def partial_lse(m, l, lse):
        return lse if m > SEEN_NOTHING and l > float32(0.0) else SEEN_NOTHING_LSE

    @device
    def normalized(o, m, l):
        return o * stage.inverse_l(m, l)

    return VariantKeys(position, score, partial_lse, normalized, stage.active)


@functools.cache
def step_rescore(stage, ROWS: int, KEYS: int, GROUPS: int, Nq: int, G: int, causal: bool, BASE2: bool):
    """``rescore(sc, lim, j0, at, mods)`` of the warp-step kernels (``steps.py``, ``decode_split_k_lean``): the
    variant on a step's scores ``sc[r, t]`` (row ``row0 + r``, key ``j0 + t·GROUPS``) of the keys each row sees
    (``visible``); ``at`` = (kvh, row0, Hkv, Nk). A hidden key's score becomes -inf (probability 0)."""
    visible = key_mask(causal, Nq)[1]
    vk = variant_keys(stage, BASE2)

    @device
    def rescore(sc, lim, j0, at, mods):
        kvh, row0, Hkv, Nk = at
        for r in range(ROWS):
            b, h, q_idx = vk.position(kvh, row0 + r, Hkv, G, Nq, Nk)
            for t in range(KEYS):
                j = j0 + t * GROUPS
                if visible(j, lim[r]):
                    sc[r, t] = vk.score(sc[r, t], b, h, q_idx, j, mods)

    return rescore


@functools.cache
def fragment_rescore(stage, S_NTILES: int):
    """``rescore(s, j0, t, lim_lo, lim_hi, at_lo, at_hi, scale, mods)`` of the mma.sync kernels (``decode_mma``,
    ``paged_mma``): the variant on the S fragments of a tile of keys from ``j0`` (raw scores, ``scale`` times them
    in natural units; element ``4·nt + e`` is key ``j0 + 8·nt + 2t + e % 2`` of the lane's row lo for e < 2, hi
    otherwise), on the keys a row sees (``j < lim``; 0 for a padding row); ``at_lo``/``at_hi``: the rows'
    ``(b, h, q_idx)``. A hidden key's score becomes ``NEG_BIG``, the kernels' masked value."""

    @device
    def rescore(s, j0, t, lim_lo, lim_hi, at_lo, at_hi, scale, mods):
        for nt in range(S_NTILES):
            for e in range(4):
                col = j0 + nt * 8 + 2 * t + (e % 2)
                lim = lim_lo if e < 2 else lim_hi
                b, h, q_idx = at_lo if e < 2 else at_hi
                if col < lim:
                    if stage.visible(b, h, q_idx, col, mods):
                        s[4 * nt + e] = stage.modified(s[4 * nt + e] * scale, b, h, q_idx, col, mods) / scale
                    else:
                        s[4 * nt + e] = NEG_BIG

    return rescore
