"""Device functions shared by the phases: tile loads, masking bounds and the
online-softmax update. Each mirrors a few lines of NumPy (given in its
docstring) and is force-inlined, so calling it costs nothing.

Online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022)
keeps, per query row, the running maximum ``m``, the running sum
``l = Σ exp(s_j − m)`` and an unnormalized accumulator ``O = Σ exp(s_j − m) v_j``.
When a new score (or tile of scores) raises the maximum to ``m_new``, the old
``l`` and ``O`` are rescaled by ``corr = exp(m − m_new)``; at the end
``O / l`` is the softmax-weighted sum.
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32

from .jit import device

NEG_INF = np.float32(-np.inf)
LOG2E = np.float32(1.4426950408889634)


@device
def visible_keys(i, q_len, kv_len, causal):
    """Number of keys query ``i`` attends to: ``kv_len``, or with bottom-right
    causal alignment ``min(kv_len, i + kv_len - q_len + 1)``."""
    if causal:
        return min(kv_len, i + kv_len - q_len + 1)
    return kv_len


@device
def load_tile(tile, src, bh, row0, n_rows, tid, nthreads):
    """Cooperatively copy rows ``row0 .. row0+R`` of ``src[bh]`` (rows × D) into
    the shared tile (R × D) as float32, zero-filling rows past ``n_rows``::

        tile[:] = 0; tile[:n_rows-row0] = src[bh, row0:row0+R]

    Consecutive threads take consecutive elements, so global reads coalesce.
    """
    R = tile.shape[0]
    D = tile.shape[1]
    for e in range(tid, R * D, nthreads):
        r = e // D
        c = e - r * D
        if row0 + r < n_rows:
            tile[r, c] = float32(src[bh, row0 + r, c])
        else:
            tile[r, c] = float32(0.0)


@device
def online_softmax_step(m, l, s):
    """Fold one score ``s`` into the running ``(m, l)``::

        m_new = max(m, s); corr = exp(m - m_new); p = exp(s - m_new)
        l_new = l * corr + p

    Returns ``(m_new, l_new, corr, p)``; the caller rescales its accumulator
    by ``corr`` and adds ``p · v``.
    """
    m_new = max(m, s)
    corr = math.exp(m - m_new)
    p = math.exp(s - m_new)
    return m_new, l * corr + p, corr, p


@device
def online_softmax_rescale(m, l, tile_max):
    """Fold a tile whose largest score is ``tile_max`` into ``(m, l)``::

        m_new = max(m, tile_max); corr = exp(m - m_new); l_new = l * corr

    Returns ``(m_new, l_new, corr)``; the caller adds ``Σ exp(s_j - m_new)`` to
    ``l_new`` and rescales its accumulator by ``corr``. With ``m = -inf``
    (first tile) ``corr`` is 0, which zeroes the empty accumulator.
    """
    m_new = max(m, tile_max)
    corr = math.exp(m - m_new)
    return m_new, l * corr, corr
