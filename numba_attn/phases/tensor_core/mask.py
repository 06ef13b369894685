"""Where the tensor-core phases mask scores: the one place.

* :func:`key_ends` — which keys a block loads and a warp (or warpgroup) sees: causal bounds the tile loop;
* :func:`mask_fragments` — the scores of keys past the end (``Nk``: the padded batch's key length, or a varlen
  sequence's) and, causal, above the diagonal set to NEG_BIG on the accumulator fragments of S.

* :func:`variant_fragments` — a variant's score function and mask function (:mod:`numba_attn.variants`) on the
  same fragments, before :func:`mask_fragments`: nothing for plain attention.

Every kernel of the family (mma.sync and wgmma) calls :func:`variant_fragments` then :func:`mask_fragments` on its
S fragments before the online softmax.
"""
from __future__ import annotations

import functools

from numba import float32

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.jit import device
from numba_attn.variants.stages import PARTIAL, PLAIN

__all__ = ["key_ends", "mask_fragments", "variant_fragments"]


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


@functools.cache
def variant_fragments(NT: int, stage=PLAIN):
    """A device function ``vary(s, base, j0, r_lo, t, Nq, Nk, off, at, mods)`` applying the variant ``stage``
    (:func:`numba_attn.variants.stages.stages_of`) to the ``NT`` n-tiles of raw scores ``q·k`` at ``s[base]``
    (keys ``j0 …``, rows ``r_lo`` and ``r_lo + 8``), ``at = (b, h, kind, scale)``: each score in range becomes
    ``score_mod(scale·s, b, h, q_idx, kv_idx) / scale`` and, in a PARTIAL tile of the block mask, NEG_BIG where
    ``mask_mod`` hides it; ``q_idx = row + off`` (queries aligned bottom-right). Plain attention: nothing."""
    if not stage.active:
        @device
        def plain(s, base, j0, r_lo, t, Nq, Nk, off, at, mods):
            pass

        return plain

    SCORED = stage.scored

    @device
    def vary(s, base, j0, r_lo, t, Nq, Nk, off, at, mods):
        b, h, kind, scale = at
        if SCORED or kind == PARTIAL:  # (a mask-only variant's FULL tile: nothing to do)
            inv_scale = float32(1.0) / scale
            for nt in range(NT):
                for e in range(4):
                    col = j0 + nt * 8 + 2 * t + (e % 2)
                    row = r_lo if e < 2 else r_lo + 8
                    if row < Nq and col < Nk:  # (the functions see positions in range only)
                        i = base + 4 * nt + e
                        if SCORED:
                            s[i] = stage.modified(s[i] * scale, b, h, row + off, col, mods) * inv_scale
                        if kind == PARTIAL and not stage.visible(b, h, row + off, col, mods):
                            s[i] = NEG_BIG

    return vary
