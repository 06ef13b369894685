"""Where the tensor-core phases mask scores: the one place.

* :func:`key_ends` — which keys a block loads and a warp (or warpgroup) sees: causal bounds the tile loop;
* :func:`mask_fragments` — the scores of keys past the end (``Nk``: the padded batch's key length, or a varlen
  sequence's) and, causal, above the diagonal set to NEG_BIG on the accumulator fragments of S.

Every kernel of the family (mma.sync and wgmma) calls :func:`mask_fragments` on its S fragments before the
online softmax; a score modification or a user mask belongs there.
"""
from __future__ import annotations

import functools

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.jit import device

__all__ = ["key_ends", "mask_fragments"]


@functools.cache
def key_ends(Br: int, WR: int, causal: bool):
    """A device function ``ends(blk0, row0, Nq, Nk, off) -> (kv_end, warp_end)``: the keys
    the block loads, and the keys the warp's ``WR`` rows from ``row0`` see (0 for a warp
    past ``Nq``); causal: row i sees keys j <= i + off."""
    @device
    def ends(blk0, row0, Nq, Nk, off):
        kv_end = Nk
        warp_end = Nk
        if causal:
            kv_end = min(Nk, min(blk0 + Br, Nq) + off)
            warp_end = min(Nk, min(row0 + WR, Nq) + off)
        if row0 >= Nq:
            warp_end = 0
        return kv_end, warp_end

    return ends


@functools.cache
def mask_fragments(NT: int, Bc: int, causal: bool):
    """A device function ``mask(s, base, j0, row0, r_lo, t, Nk, off)``: in the ``NT``
    n-tiles of scores at ``s[base]`` (keys ``j0 …``, rows ``r_lo`` and ``r_lo + 8``)
    the keys past ``Nk`` and, when ``causal``, the keys above the diagonal
    (key > row + off) become NEG_BIG. Skipped unless the tile reaches past ``Nk`` or
    (causal) past the diagonal of the warp's first row ``row0``."""

    @device
    def mask(s, base, j0, row0, r_lo, t, Nk, off):
        r_hi = r_lo + 8
        if j0 + Bc > Nk or (causal and j0 + Bc - 1 > row0 + off):
            for nt in range(NT):
                for e in range(4):
                    col = j0 + nt * 8 + 2 * t + (e % 2)
                    row = r_lo if e < 2 else r_hi
                    if col >= Nk or (causal and col > row + off):
                        s[base + 4 * nt + e] = NEG_BIG

    return mask
