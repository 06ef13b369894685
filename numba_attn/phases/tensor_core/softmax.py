"""The online softmax of the tensor-core phases, on the accumulator fragments of S.

The running max ``m`` and sum ``l`` of a lane's two rows (g and g+8) travel as one value,
``stats = (m_lo, m_hi, l_lo, l_hi)``; the max and the exponentials are
:func:`numba_attn.gpu.device_functions.fragment_softmax` (quad shuffles for the row max, scores in base 2),
O's rescale ``fragment_rescale``. P is rounded and packed in registers: the C fragments of two neighbouring
n-tiles of S are the A fragment of one k-step of P·V.
"""
from __future__ import annotations

import functools

from numba_attn.gpu.device_functions import (fragment_rescale, fragment_softmax, fragment_softmax_lazy,
                                             fragment_update)
from numba_attn.gpu.intrinsics import pack_bf16x2, pack_f16x2
from numba_attn.gpu.jit import device
from numba_attn.phases.tensor_core.mask import mask_fragments, variant_fragments
from numba_attn.variants.stages import LN2, PLAIN

__all__ = ["online_softmax", "online_softmax_lazy", "pack_p", "rescale_o", "masked_update"]


@functools.cache
def online_softmax(NT: int):
    """A device function ``update(s, stats, sl2) -> (stats, corr_lo, corr_hi)``: the ``NT`` n-tiles of
    scores at ``s`` become P (unnormalised, base 2: ``exp2((s - m)·sl2)``), the running max and sums in
    ``stats`` go on; O's rescale factors come back (the caller rescales O where its schedule wants it)."""
    softmax = fragment_softmax(NT)

    @device
    def update(s, stats, sl2):
        m_lo, m_hi, l_lo, l_hi = stats
        m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2)
        l_lo = l_lo * corr_lo + rs_lo
        l_hi = l_hi * corr_hi + rs_hi
        return (m_lo, m_hi, l_lo, l_hi), corr_lo, corr_hi

    return update


@functools.cache
def online_softmax_lazy(NT: int):
    """:func:`online_softmax` with FlashAttention-4's conditional rescale (:func:`.fragment_softmax_lazy`): a row's
    running max moves only when a tile's exceeds it by more than 2^8; ``update(s, stats, sl2) -> (stats, corr_lo,
    corr_hi, moved)``, ``moved``: whether either of this lane's rows moved (O needs its rescale only then)."""
    softmax = fragment_softmax_lazy(NT)

    @device
    def update(s, stats, sl2):
        m_lo, m_hi, l_lo, l_hi = stats
        m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi, moved = softmax(s, 0, m_lo, m_hi, sl2)
        l_lo = l_lo * corr_lo + rs_lo
        l_hi = l_hi * corr_hi + rs_hi
        return (m_lo, m_hi, l_lo, l_hi), corr_lo, corr_hi, moved

    return update


@functools.cache
def pack_p(KK: int, bf16: bool):
    """A device function ``pack(pf, s)``: P of ``s`` rounded to f16/bf16 and packed into the ``4·KK`` A fragment
    registers ``pf`` of P·V (k-step kk: the n-tiles 2kk and 2kk+1 of S)."""
    pack = pack_bf16x2 if bf16 else pack_f16x2

    @device
    def pack_fragments(pf, s):
        for kk in range(KK):
            i0 = 8 * kk
            pf[4 * kk + 0] = pack(s[i0], s[i0 + 1])
            pf[4 * kk + 1] = pack(s[i0 + 2], s[i0 + 3])
            pf[4 * kk + 2] = pack(s[i0 + 4], s[i0 + 5])
            pf[4 * kk + 3] = pack(s[i0 + 6], s[i0 + 7])

    return pack_fragments


def rescale_o(DT: int):
    """O's rescale on its ``DT`` n-tiles: ``rescale(acc, 0, corr_lo, corr_hi)``."""
    return fragment_rescale(DT)


@functools.cache
def masked_update(NT: int, Bc: int, causal: bool, DT: int, stage=PLAIN):
    """A device function ``update(s, acc, j0, row0, r_lo, t, Nq, Nk, off, m_lo, m_hi, l_lo, l_hi, sl2, at, mods) ->
    (m_lo, m_hi, l_lo, l_hi)`` of the mma.sync kernels: the ``NT`` n-tiles of scores through the variant ``stage``
    (:func:`.mask.variant_fragments`, ``at = (b, h, kind)``; nothing for plain attention) and masked
    (:func:`.mask.mask_fragments`), the online softmax, the ``DT`` n-tiles of O rescaled."""
    vary = variant_fragments(NT, stage)
    mask = mask_fragments(NT, Bc, causal)
    softmax = fragment_update(NT, DT)

    @device
    def update(s, acc, j0, row0, r_lo, t, Nq, Nk, off, m_lo, m_hi, l_lo, l_hi, sl2, at, mods):
        b, h, kind = at
        vary(s, 0, j0, r_lo, t, Nq, Nk, off, (b, h, kind, sl2 * LN2), mods)  # score_mod, mask_mod (natural units)
        mask(s, 0, j0, row0, r_lo, t, Nk, off)
        return softmax(s, acc, (m_lo, m_hi, l_lo, l_hi), sl2)  # the online softmax, O rescaled

    return update
