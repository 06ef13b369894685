"""The FP8 (e4m3) consumer's tile, written once for the FP8 phases (``fp8_wgmma``: a cp.async ring; ``fp8_ws``: a
TMA ring filled by a producer warpgroup).

A tile of Bc keys for a warpgroup's 64 query rows, everything in code units (Q, K, V as e4m3 codes of
``x · 448 / amax``, :mod:`.quantize`):

* S = Q·Kᵀ: ``D/32`` wgmma m64nBc k32 e4m3, Q's codes in registers, K's K-major in the ring (rows of
  :func:`qk_depth` bytes, swizzled by their width);
* the scores through the variant and the masks; the online softmax with ``sl2q = sl2 · q_scale · k_scale``, P
  and its row sums times ``P_SCALE = 2^8`` folded into the exponent (FlashAttention-3's ``max_offset``);
* P in [0, 256] to e4m3, packed so that the accumulator fragment is its own A fragment (:func:`pack_p8`: V's
  keys are stored permuted, :func:`.quantize.stored_position`);
* O += P·V: ``Bc/32`` wgmma m64nD k32 e4m3 with Vᵀ (rows of Bc bytes, in column blocks of :func:`vt_swizzle`
  bytes past 128 keys) as the K-major B.

The ring of a stage: the K tile (Bc × qk_depth(D) bytes), then, after every stage's K, the Vᵀ tile (D × Bc bytes).
The pieces: :func:`fp8_products` (the two products, waited for or only issued), :func:`fp8_softmax` (P in place
of the scores) and :func:`fp8_scores_to_p` (it, then P packed and O rescaled) between them, and :func:`fp8_tile`
composing them; a schedule (``fp8_pingpong``, ``fp8_overlap``) composes them its own way.
"""
from __future__ import annotations

import functools

import numpy as np

from numba_attn.gpu.device_functions import fragment_rescale, fragment_softmax, fragment_softmax_lazy
from numba_attn.gpu.intrinsics import pack_e4m3x4
from numba_attn.gpu.jit import device
from numba_attn.gpu.wgmma import kmajor_params, make_wgmma_rs
from numba_attn.phases.tensor_core.mask import mask_fragments, variant_fragments
from numba_attn.phases.tensor_core.quantize import P_SCALE
from numba_attn.variants.stages import LN2, PLAIN

__all__ = ["qk_depth", "vt_swizzle", "fp8_ring_bytes", "pack_p8", "fp8_products", "fp8_softmax", "fp8_scores_to_p",
           "fp8_tile", "P_LOG2", "FP8_LAZY_LOG2"]

P_LOG2 = float(np.log2(P_SCALE))  # 8: P's scale as the exponent offset of the softmax
# the lazy softmax's threshold (base 2): P = 2^8 · 2^(s - m) may grow to 2^(8 + 0.8) ≈ 446 against a maximum that did
# not move, under e4m3's largest finite value, 448
FP8_LAZY_LOG2 = 0.8


def qk_depth(D):
    """The bytes of a Q/K row of codes: D, at least 32 (the smallest swizzle; D=16 padded with zero codes)."""
    return max(D, 32)


def vt_swizzle(Bc):
    """The bytes of one swizzled column block of the Vᵀ tile (its rows are Bc bytes of codes): the whole row up to
    128 keys, else blocks of 128 (Bc a multiple of 128) or of 64 (Bc = 192), each ``D`` rows deep and swizzled
    by its width; a k32 step lies inside one block (:func:`numba_attn.gpu.wgmma.kmajor_params`)."""
    return Bc if Bc <= 128 else (128 if Bc % 128 == 0 else 64)


def fp8_ring_bytes(D, Bc, stages):
    """The ring: ``stages`` K tiles of Bc × qk_depth(D) bytes and as many Vᵀ tiles of D × Bc bytes."""
    return stages * Bc * (qk_depth(D) + D)


@functools.cache
def pack_p8(KK: int, permute: bool = True):
    """A device function ``pack(pf, s)``: the ``KK`` k32 steps of P (``s``, in [0, P_SCALE]) as e4m3, four codes
    a register. k-step kk takes n-tiles 4kk..4kk+3; with ``permute`` the bytes are (n-tile 4kk, e 0/1;
    n-tile 4kk+1, e 0/1), the stored keys 4t..4t+3 of the permuted V, so no shuffle is needed. ``permute=False``:
    the accumulator's own order (wrong against the permuted V: the tests' negative case)."""

    @device
    def pack(pf, s):
        for kk in range(KK):
            i0 = 16 * kk
            if permute:
                pf[4 * kk + 0] = pack_e4m3x4(s[i0], s[i0 + 1], s[i0 + 4], s[i0 + 5])
                pf[4 * kk + 1] = pack_e4m3x4(s[i0 + 2], s[i0 + 3], s[i0 + 6], s[i0 + 7])
                pf[4 * kk + 2] = pack_e4m3x4(s[i0 + 8], s[i0 + 9], s[i0 + 12], s[i0 + 13])
                pf[4 * kk + 3] = pack_e4m3x4(s[i0 + 10], s[i0 + 11], s[i0 + 14], s[i0 + 15])
            else:
                pf[4 * kk + 0] = pack_e4m3x4(s[i0], s[i0 + 1], s[i0 + 2], s[i0 + 3])
                pf[4 * kk + 1] = pack_e4m3x4(s[i0 + 4], s[i0 + 5], s[i0 + 6], s[i0 + 7])
                pf[4 * kk + 2] = pack_e4m3x4(s[i0 + 8], s[i0 + 9], s[i0 + 10], s[i0 + 11])
                pf[4 * kk + 3] = pack_e4m3x4(s[i0 + 12], s[i0 + 13], s[i0 + 14], s[i0 + 15])

    return pack


@functools.cache
def fp8_products(D: int, Bc: int, wait: bool = True):
    """``(qk, pv)``: S = Q·Kᵀ (``D/32`` wgmma m64nBc k32 e4m3, fresh) and O += P·V (``Bc/32`` m64nD k32, Vᵀ as the
    K-major B), each ``(acc, a, a_off, smem, byte_off)``; waited for, or with ``wait=False`` only issued and
    committed (a later :func:`numba_attn.gpu.wgmma.make_wgmma_wait` passes the accumulators through)."""
    DQ = qk_depth(D)
    qk_off, qk_lbo, qk_sbo = kmajor_params(Bc, DQ // 32, DQ)
    VW = vt_swizzle(Bc)
    pv_off, pv_lbo, pv_sbo = kmajor_params(D, Bc // 32, VW)
    qk = make_wgmma_rs("e4m3", Bc, False, True, qk_off, qk_lbo, qk_sbo, DQ, wait)
    pv = make_wgmma_rs("e4m3", D, False, False, pv_off, pv_lbo, pv_sbo, VW, wait)
    return qk, pv


@functools.cache
def fp8_softmax(D: int, Bc: int, causal: bool, stage=PLAIN, fma_share: int = 0, lazy: bool = False):
    """A device function ``softmax(s, stats, j0, kind, kinf, kmul, kvh, pos, mods) -> (stats, corr_lo, corr_hi)``:
    a tile's scores ``s`` (keys from ``j0``) through the infinite-K factors, the variant and the masks, then the
    online softmax in place (P and its sums in [0, P_SCALE]); ``corr``: the factors O still needs. ``stats =
    (m_lo, m_hi, l_lo, l_hi)``: the maxima in code units, the sums in P's; ``kinf``: the KV head has an infinite K
    value (its keys' scores multiplied by ``kmul[kvh, key]``: ±inf); ``pos = (row0, g, t, Nq, Nk, off, sl2q, b,
    h)``; ``kind``, ``mods``: a variant's (``stage``); ``fma_share``: of every four n-tiles, those whose
    exponentials run on the FMA pipe (:func:`numba_attn.gpu.device_functions.exp2_fma`). ``lazy``: a row's maximum
    moves only by more than ``FP8_LAZY_LOG2`` (:func:`numba_attn.gpu.device_functions.fragment_softmax_lazy`, P up to
    2^8.8) and the function also returns whether this lane's rows moved: ``(stats, corr_lo, corr_hi, moved)``."""
    NT = Bc // 8
    mask = mask_fragments(NT, Bc, causal)  # keys past Nk and (causal) above the diagonal
    vary = variant_fragments(NT, stage)  # a variant's score and mask functions
    softmax_rows = fragment_softmax(NT, P_LOG2, fma_share)  # p and the row sums in [0, P_SCALE]: P's code units
    softmax_lazy = fragment_softmax_lazy(NT, FP8_LAZY_LOG2, P_LOG2)

    @device
    def softmax(s, stats, j0, kind, kinf, kmul, kvh, pos, mods):
        row0, g, t, Nq, Nk, off, sl2q, b, h = pos
        m_lo, m_hi, l_lo, l_hi = stats
        if kinf:  # keys with infinite values: ±inf scores (kmul inf; 1 elsewhere)
            for nt in range(NT):
                for e in range(2):
                    f = kmul[kvh, j0 + nt * 8 + 2 * t + e]  # (rows g and g+8: the same key)
                    s[4 * nt + e] *= f
                    s[4 * nt + 2 + e] *= f
        vary(s, 0, j0, row0 + g, t, Nq, Nk, off, (b, h, kind, sl2q * LN2), mods)
        mask(s, 0, j0, row0, row0 + g, t, Nk, off)
        if lazy:  # (compile-time)
            m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi, moved = softmax_lazy(s, 0, m_lo, m_hi, sl2q)
            return (m_lo, m_hi, l_lo * corr_lo + rs_lo, l_hi * corr_hi + rs_hi), corr_lo, corr_hi, moved
        m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax_rows(s, 0, m_lo, m_hi, sl2q)
        return (m_lo, m_hi, l_lo * corr_lo + rs_lo, l_hi * corr_hi + rs_hi), corr_lo, corr_hi

    return softmax


@functools.cache
def fp8_scores_to_p(D: int, Bc: int, causal: bool, permute: bool = True, stage=PLAIN):
    """A device function ``to_p(s, pf, acc, stats, j0, kind, kinf, kmul, kvh, pos, mods) -> stats``:
    :func:`fp8_softmax`, then P packed into ``pf`` as e4m3 and O (``acc``) rescaled."""
    softmax = fp8_softmax(D, Bc, causal, stage)
    rescale = fragment_rescale(D // 8)
    pack = pack_p8(Bc // 32, permute)

    @device
    def to_p(s, pf, acc, stats, j0, kind, kinf, kmul, kvh, pos, mods):
        stats, corr_lo, corr_hi = softmax(s, stats, j0, kind, kinf, kmul, kvh, pos, mods)
        pack(pf, s)
        rescale(acc, 0, corr_lo, corr_hi)
        return stats

    return to_p


@functools.cache
def fp8_tile(D: int, Bc: int, causal: bool, permute: bool = True, stage=PLAIN):
    """A device function ``tile(s, qf, pf, acc, stats, KV, k_at, v_at, j0, kind, kinf, kmul, kvh, pos, mods) ->
    stats``: the tile of keys from ``j0`` (its K codes at byte ``k_at`` of the ring ``KV``, its Vᵀ codes at
    ``v_at``) for rows g and g+8 of the warp, each product waited for: S = Q·Kᵀ, :func:`fp8_scores_to_p`,
    O += P·V."""
    qk, pv = fp8_products(D, Bc)
    to_p = fp8_scores_to_p(D, Bc, causal, permute, stage)

    @device
    def tile(s, qf, pf, acc, stats, KV, k_at, v_at, j0, kind, kinf, kmul, kvh, pos, mods):
        qk(s, qf, 0, KV, k_at)
        stats = to_p(s, pf, acc, stats, j0, kind, kinf, kmul, kvh, pos, mods)
        pv(acc, pf, 0, KV, v_at)
        return stats

    return tile
