"""Where the decode kernels mask their scores: the one place of the family (causal with q_len > 1, the keys of a
split or a sequence, padding rows), so that a user's mask or score modification is threaded through here.

A query row sees the keys ``j < key_limit(...)``: the end of the block's keys (a split's, or a ragged sequence's
own length), and with ``causal`` at most ``i + Nk - Nq + 1`` for query position ``i`` of ``Nq`` over ``Nk`` keys
(bottom-right aligned, as FlashAttention aligns a decode step's queries with the end of the cache). A kernel
tests each key with ``visible(j, lim)``: a key that fails is skipped, or its score set to ``NEG_BIG``.
"""
from __future__ import annotations

import functools

from numba_attn.gpu.jit import device


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
