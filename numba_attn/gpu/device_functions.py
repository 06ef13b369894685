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

import functools
import math

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (chooses CUDA or the simulator before numba is imported)
from numba import cuda, float32, uint32  # noqa: E402

from numba_attn.gpu.convert import add_rm_f32, f32_as_u32, u32_as_f32  # noqa: E402
from numba_attn.gpu.jit import device  # noqa: E402
from numba_attn.gpu.warp import quad_max  # noqa: E402

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
def same_score(s, b, h, q_idx, kv_idx, mods):
    return s


@functools.cache
def row_key_step(D: int, modified=same_score):
    """``key_step(Q_i, O_i, k, v, kvh, j, m, l, at, mods) -> (m, l)``: key ``j`` of a one-row
    online softmax over ``D`` elements (score ``s = Q_i · K_j``, rewritten by a variant's
    ``modified(s, b, h, q_idx, j, mods)`` with ``at = (b, h, q_idx)``, :func:`online_softmax_step`,
    ``O_i = O_i · corr + p · V_j``)."""
    @device
    def key_step(Q_i, O_i, k, v, kvh, j, m, l, at, mods):
        s = float32(0.0)
        for d in range(D):
            s += Q_i[d] * float32(k[kvh, j, d])
        s = modified(s, at[0], at[1], at[2], j, mods)
        m, l, corr, p = online_softmax_step(m, l, s)
        for d in range(D):
            O_i[d] = O_i[d] * corr + p * float32(v[kvh, j, d])
        return m, l

    return key_step


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


# -- partial softmax states: merging and the split-K combine --------------------
#
# A partial state over a subset of the keys is ``(m, l, O)``: its largest score,
# ``Σ exp(s_j − m)`` and the unnormalized ``Σ exp(s_j − m) v_j``. Two states over
# disjoint key sets merge exactly; a state that saw no key is ``(NEG_BIG, 0, 0)``.
# NEG_BIG is finite on purpose: kernels compile with fastmath (no-infs), so an
# empty state must not rely on arithmetic with infinities.

NEG_BIG = np.float32(-1e30)
EMPTY_LSE_BELOW = np.float32(-1e29)  # a stored log-sum-exp below this marks an empty split


@device
def merge_state(m_a, l_a, m_b, l_b):
    """Merge two partial states over disjoint key sets::

        m = max(m_a, m_b); ca = exp(m_a - m); cb = exp(m_b - m)
        l = l_a * ca + l_b * cb          # and the caller forms O = O_a ca + O_b cb

    Returns ``(m, l, ca, cb)``. An empty state (m = NEG_BIG, l = 0) gets the
    factor 0 next to any non-empty one.
    """
    m = max(m_a, m_b)
    ca = math.exp(m_a - m)
    cb = math.exp(m_b - m)
    return m, l_a * ca + l_b * cb, ca, cb


@device
def state_lse(m, l):
    """Log-sum-exp of a partial state, ``m + log(l)``, or NEG_BIG when it saw no key (``l`` 0; a NaN
    ``l``, from a NaN score, gives a NaN log-sum-exp, so the combine propagates it)."""
    if l != float32(0.0):
        return m + math.log(l)
    return NEG_BIG


COMBINE_UNROLL = 8  # splits whose loads are in flight at once in ``combine_splits``


@device
def _combine_term(l, acc, lse_s, o_s, m):
    """One split's term of :func:`combine_splits` (skipped when the split is empty)."""
    if lse_s > EMPTY_LSE_BELOW:
        w = math.exp(lse_s - m)
        return l + w, acc + w * o_s
    return l, acc


@device
def _lse8(part_lse, s0, row):
    """The log-sum-exps of splits s0 … s0+7 of ``row``: eight loads issued together."""
    return (part_lse[s0, row], part_lse[s0 + 1, row], part_lse[s0 + 2, row], part_lse[s0 + 3, row],
            part_lse[s0 + 4, row], part_lse[s0 + 5, row], part_lse[s0 + 6, row], part_lse[s0 + 7, row])


@device
def combine_splits(part_o, part_lse, n_splits, row, d):
    """The combine step of split-K (flash-decoding): split ``s`` wrote its
    normalized output ``O_s = part_o[s, row, :]`` and ``lse_s = part_lse[s, row]``
    (NEG_BIG when it saw no key); the exact result is::

        m = max_s lse_s
        w_s = exp(lse_s − m)  (0 for an empty split: lse_s <= EMPTY_LSE_BELOW)
        O[row, d] = Σ_s w_s · O_s[row, d] / Σ_s w_s

    Two passes over the splits, each with ``COMBINE_UNROLL`` splits' loads
    issued before any arithmetic uses them: first the largest log-sum-exp,
    then the weighted sum. (A one-pass online merge makes every split wait for
    the previous split's loads and exponentials: S dependent L2 round trips.)
    A row that no split saw returns 0/0, as the one-pass merge did.
    Returns ``O[row, d]`` as float32.
    """
    n_full = n_splits - n_splits % COMBINE_UNROLL
    m = NEG_BIG
    for s0 in range(0, n_full, COMBINE_UNROLL):
        a0, a1, a2, a3, a4, a5, a6, a7 = _lse8(part_lse, s0, row)
        m = max(m, max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7))))
    for s in range(n_full, n_splits):
        m = max(m, part_lse[s, row])
    l = float32(0.0)
    acc = float32(0.0)
    for s0 in range(0, n_full, COMBINE_UNROLL):
        a0, a1, a2, a3, a4, a5, a6, a7 = _lse8(part_lse, s0, row)
        o0 = part_o[s0, row, d]
        o1 = part_o[s0 + 1, row, d]
        o2 = part_o[s0 + 2, row, d]
        o3 = part_o[s0 + 3, row, d]
        o4 = part_o[s0 + 4, row, d]
        o5 = part_o[s0 + 5, row, d]
        o6 = part_o[s0 + 6, row, d]
        o7 = part_o[s0 + 7, row, d]
        l, acc = _combine_term(l, acc, a0, o0, m)
        l, acc = _combine_term(l, acc, a1, o1, m)
        l, acc = _combine_term(l, acc, a2, o2, m)
        l, acc = _combine_term(l, acc, a3, o3, m)
        l, acc = _combine_term(l, acc, a4, o4, m)
        l, acc = _combine_term(l, acc, a5, o5, m)
        l, acc = _combine_term(l, acc, a6, o6, m)
        l, acc = _combine_term(l, acc, a7, o7, m)
    for s in range(n_full, n_splits):
        l, acc = _combine_term(l, acc, part_lse[s, row], part_o[s, row, d], m)
    return acc / l


@functools.cache
def combine_splits_fixed(NS: int):
    """:func:`combine_splits` for a split count ``NS`` known when compiling: every
    split's log-sum-exp and output element are loaded before any arithmetic (2·NS
    loads in flight, one L2 round trip instead of one per 8 splits and pass), the
    maximum and the weighted sum then come from registers. Same result, same
    empty-split rule, as ``combine_splits(part_o, part_lse, NS, row, d)``."""

    @device
    def combine(part_o, part_lse, row, d):
        lse = cuda.local.array(NS, float32)
        o = cuda.local.array(NS, float32)
        for s in range(NS):
            lse[s] = part_lse[s, row]
            o[s] = part_o[s, row, d]
        m = NEG_BIG
        for s in range(NS):
            m = max(m, lse[s])
        l = float32(0.0)
        acc = float32(0.0)
        for s in range(NS):
            l, acc = _combine_term(l, acc, lse[s], o[s], m)
        return acc / l

    return combine


# -- 16-byte loads ---------------------------------------------------------------
#
# ``ldg_f32x4(a, i, j, c)`` returns a[i, j, c:c+4] of a float32 array and
# ``ldg_f16x8(a, i, j, c)`` returns a[i, j, c:c+8] of a float16 array converted
# to float32, each with one ``ld.global.nc.v4`` (16 bytes per thread). They
# live with the other vector accesses in ``ptx_loads`` (inline PTX on the GPU,
# checked Python fallbacks in the simulator); the names are kept here for the
# decode phases.

from numba_attn.gpu.ptx_loads import ldg4 as ldg_f32x4  # noqa: E402,F401
from numba_attn.gpu.ptx_loads import ldg_f16x8  # noqa: E402,F401


@device
def online_softmax_rescale2(m, l, tile_max):
    """:func:`online_softmax_rescale` for scores in base-2 units (pre-multiplied
    by log2(e), e.g. through the Q scale)::

        m_new = max(m, tile_max); corr = exp2(m - m_new); l_new = l * corr

    The caller's probabilities are then ``exp2(s - m_new)``: one ``ex2.approx``
    each, where ``exp`` costs a multiply by log2(e) and an ``ex2.approx``.
    """
    m_new = max(m, tile_max)
    corr = math.exp2(m - m_new)
    return m_new, l * corr, corr


@device
def merge_state2(m_a, l_a, m_b, l_b):
    """:func:`merge_state` for states whose maxima are in base-2 units (scores
    pre-multiplied by log2(e)): the factors are ``exp2(m_a − m)`` and
    ``exp2(m_b − m)``. Returns ``(m, l, ca, cb)``."""
    m = max(m_a, m_b)
    ca = math.exp2(m_a - m)
    cb = math.exp2(m_b - m)
    return m, l_a * ca + l_b * cb, ca, cb


# -- online softmax on mma accumulator fragments ------------------------------------
#
# An m16n8 accumulator tile gives lane (g, t) the scores of rows g and g+8 at
# columns 2t, 2t+1 of each 8-column n-tile: values 4·nt + 0, 1 (row g) and
# 4·nt + 2, 3 (row g+8). The four lanes of a quad hold one row between them,
# so the row maximum is a quad reduction. Used by every tensor-core phase (the
# mma.sync ones and the wgmma one, whose accumulator layout per warp is the
# same) and by the tensor-core decode phase.


@functools.cache
def fragment_tile_max(NT: int):
    """A device function ``(s, base) → (mx_lo, mx_hi)``: the maxima of rows g and g+8 over the ``NT`` n-tiles of
    scores at ``s[base]``, reduced over the quad (NEG_BIG where every score is)."""

    @device
    def tile_max(s, base):
        mx_lo = NEG_BIG
        mx_hi = NEG_BIG
        for nt in range(NT):
            i0 = base + 4 * nt
            mx_lo = max(mx_lo, max(s[i0], s[i0 + 1]))
            mx_hi = max(mx_hi, max(s[i0 + 2], s[i0 + 3]))
        return quad_max(mx_lo), quad_max(mx_hi)

    return tile_max


# 2^f on [0, 1) as 1 + f(c1 + f(c2 + f·c3)): p(0) = 1 and c1 + c2 + c3 = 1 (p(1) = 2, so the steps between
# powers of two meet), the largest relative error 1.03e-4 (fitted to the maximum on 20001 points)
EXP2_C1, EXP2_C2, EXP2_C3 = float32(0.6954243), float32(0.22630768), float32(0.07826797)
FLOOR_MAGIC = float32(12582912.0)  # 1.5·2^23: y + it, rounded down, holds floor(y) in its low mantissa bits
FLOOR_MAGIC_BITS = 0x4B400000  # its bits (floor(y) = the sum's bits less these, for |y| < 2^22)


@device
def exp2_fma(x):
    """2^x without the MUFU unit (FlashAttention-4's software exp2), on the FP32 and integer pipes only: y = x
    clamped at -127; floor(y) = j by one add rounded down (``add.rm.f32`` of 1.5·2^23: no conversion, which would
    run at the MUFU's rate), f = y − j; 2^f by a cubic (three FMA, relative error 1.03e-4); times 2^j made from j's
    bits (the sum's bits less the constant's, plus 127, shifted into the exponent). At and below -127 (and -inf)
    it is 0 (2^-127's bits are 0); NaN stays NaN (tested on its bits: the kernels' fastmath may fold a float
    comparison with NaN); valid up to 127."""
    nan = (f32_as_u32(x) & uint32(0x7FFFFFFF)) > uint32(0x7F800000)
    y = x if x > float32(-127.0) else float32(-127.0)
    t = add_rm_f32(y, FLOOR_MAGIC)
    j = t - FLOOR_MAGIC  # floor(y), exact
    f = y - j
    p = cuda.fma(cuda.fma(cuda.fma(EXP2_C3, f, EXP2_C2), f, EXP2_C1), f, float32(1.0))
    e = (f32_as_u32(t) - uint32(FLOOR_MAGIC_BITS - 127)) << uint32(23)  # (j + 127) << 23: 2^j's bits
    r = p * u32_as_f32(e)
    return x if nan else r


@functools.cache
def exp_ntile(exp):
    """A device function ``(s, i0, ms_lo, ms_hi, sl2) → (r_lo, r_hi)``: the n-tile at ``s[i0]`` (rows g: i0, i0 + 1;
    g + 8: i0 + 2, i0 + 3) overwritten by ``exp(s·sl2 − ms)`` (``exp``: ``math.exp2`` or :func:`exp2_fma`), and its
    two rows' sums."""

    @device
    def ntile(s, i0, ms_lo, ms_hi, sl2):
        p0 = exp(s[i0] * sl2 - ms_lo)
        p1 = exp(s[i0 + 1] * sl2 - ms_lo)
        p2 = exp(s[i0 + 2] * sl2 - ms_hi)
        p3 = exp(s[i0 + 3] * sl2 - ms_hi)
        s[i0] = p0
        s[i0 + 1] = p1
        s[i0 + 2] = p2
        s[i0 + 3] = p3
        return p0 + p1, p2 + p3

    return ntile


@functools.cache
def fragment_exp(NT: int, log2_scale: float = 0.0, fma_share: int = 0):
    """A device function ``(s, base, m_lo, m_hi, sl2) → (rs_lo, rs_hi)``: the ``NT`` n-tiles at ``s[base]``
    overwritten by ``p = exp2(s·sl2 − m·sl2)`` against the rows' reference maxima ``m`` (p = 0 for a row whose
    max is still NEG_BIG, not exp(0)), and this lane's row sums of ``p``. ``log2_scale``: p times
    ``2^log2_scale``, folded into the subtracted maximum (FlashAttention-3's ``max_offset``: P in [0, 256] for
    e4m3 at 8, at no cost a value). ``fma_share``: of every four n-tiles, that many take :func:`exp2_fma` (the FMA
    pipe) instead of ``exp2`` (the MUFU unit), so that both pipes share a tile's exponentials (0: none)."""
    OFF = float32(log2_scale)

    @device
    def exp_rows(s, base, m_lo, m_hi, sl2):
        ms_lo = m_lo * sl2 if m_lo != NEG_BIG else float32(0.0)
        ms_hi = m_hi * sl2 if m_hi != NEG_BIG else float32(0.0)
        if log2_scale != 0.0:  # (compile-time: the plain softmax keeps its code)
            ms_lo -= OFF
            ms_hi -= OFF
        rs_lo = float32(0.0)
        rs_hi = float32(0.0)
        for nt in range(NT):
            i0 = base + 4 * nt
            p0 = math.exp2(s[i0] * sl2 - ms_lo)
            p1 = math.exp2(s[i0 + 1] * sl2 - ms_lo)
            p2 = math.exp2(s[i0 + 2] * sl2 - ms_hi)
            p3 = math.exp2(s[i0 + 3] * sl2 - ms_hi)
            rs_lo += p0 + p1
            rs_hi += p2 + p3
            s[i0] = p0
            s[i0 + 1] = p1
            s[i0 + 2] = p2
            s[i0 + 3] = p3
        return rs_lo, rs_hi

    fma_tile, mufu_tile = exp_ntile(exp2_fma), exp_ntile(math.exp2)

    @device
    def exp_rows_shared(s, base, m_lo, m_hi, sl2):
        """(``fma_share`` > 0) :func:`exp_rows` with n-tiles 4g .. 4g + fma_share − 1 of each four on the FMA pipe:
        two loops of constant trip counts a group, so that they unroll and ``s`` stays in registers."""
        ms_lo = (m_lo * sl2 if m_lo != NEG_BIG else float32(0.0)) - OFF
        ms_hi = (m_hi * sl2 if m_hi != NEG_BIG else float32(0.0)) - OFF
        rs_lo = float32(0.0)
        rs_hi = float32(0.0)
        for g in range(NT // 4):
            for u in range(fma_share):
                r_lo, r_hi = fma_tile(s, base + 16 * g + 4 * u, ms_lo, ms_hi, sl2)
                rs_lo += r_lo
                rs_hi += r_hi
            for u in range(fma_share, 4):
                r_lo, r_hi = mufu_tile(s, base + 16 * g + 4 * u, ms_lo, ms_hi, sl2)
                rs_lo += r_lo
                rs_hi += r_hi
        return rs_lo, rs_hi

    if fma_share:
        assert NT % 4 == 0, f"fma_share: {NT} n-tiles, not whole groups of four"
        return exp_rows_shared
    return exp_rows


@functools.cache
def fragment_softmax(NT: int, log2_scale: float = 0.0, fma_share: int = 0):
    """A device function ``(s, base, m_lo, m_hi, sl2) → (m_lo', m_hi', corr_lo,
    corr_hi, rs_lo, rs_hi)`` for ``NT`` n-tiles starting at ``s[base]``:

    * the new running maxima (raw scores) of rows g and g+8 — the old ones and
      this tile's, reduced over the quad (:func:`fragment_tile_max`);
    * ``corr = exp2((m_old − m_new)·sl2)``, the factor for ``l`` and ``O``;
    * ``s`` overwritten in place by ``p = exp2(s·sl2 − m_new·sl2)`` (``sl2`` =
      softmax scale × log2 e), and this lane's row sums of ``p`` (:func:`fragment_exp`).

    A row that has seen no key yet (max still NEG_BIG) gets p = 0, not exp(0).
    NT is a compile-time constant (the factory is cached per NT) so that the
    loops unroll and ``s`` stays in registers. ``log2_scale``: p and its sums times
    ``2^log2_scale``; ``fma_share``: exponentials on the FMA pipe (:func:`fragment_exp`).
    """
    tile_max = fragment_tile_max(NT)
    exp_rows = fragment_exp(NT, log2_scale, fma_share)

    @device
    def softmax(s, base, m_lo, m_hi, sl2):
        mt_lo, mt_hi = tile_max(s, base)
        mn_lo = max(m_lo, mt_lo)
        mn_hi = max(m_hi, mt_hi)
        corr_lo = math.exp2((m_lo - mn_lo) * sl2)
        corr_hi = math.exp2((m_hi - mn_hi) * sl2)
        rs_lo, rs_hi = exp_rows(s, base, mn_lo, mn_hi, sl2)
        return mn_lo, mn_hi, corr_lo, corr_hi, rs_lo, rs_hi

    return softmax


LAZY_RESCALE_LOG2 = np.float32(8.0)  # FlashAttention-4's threshold: P may reach 2^8 before the max moves


@functools.cache
def fragment_softmax_lazy(NT: int, threshold: float = float(LAZY_RESCALE_LOG2), log2_scale: float = 0.0):
    """:func:`fragment_softmax` with the running maximum moved only where this tile's exceeds it by more than
    ``threshold`` in base-2 units (FlashAttention-4's conditional rescale; a row's first visible keys always
    move it). Where it stays, ``p = exp2(s·sl2 − m·sl2)`` against the old maximum (at most 2^threshold, 2^8 by
    default: no overflow in f16, bf16 or the float32 sums) and ``corr = 1``, so O needs no rescale. O / l does not
    depend on the reference maximum; the results differ from :func:`fragment_softmax`'s by rounding only. Also
    returns whether either row's maximum moved (this lane's). ``log2_scale``: p and its sums times
    ``2^log2_scale`` (:func:`fragment_exp`), so p stays under ``2^(log2_scale + threshold)``."""
    tile_max = fragment_tile_max(NT)
    exp_rows = fragment_exp(NT, log2_scale)
    LAZY = float32(threshold)

    @device
    def softmax(s, base, m_lo, m_hi, sl2):
        mt_lo, mt_hi = tile_max(s, base)
        mn_lo = m_lo
        mn_hi = m_hi
        if m_lo == NEG_BIG or (mt_lo - m_lo) * sl2 > LAZY:
            mn_lo = max(m_lo, mt_lo)
        if m_hi == NEG_BIG or (mt_hi - m_hi) * sl2 > LAZY:
            mn_hi = max(m_hi, mt_hi)
        moved = mn_lo != m_lo or mn_hi != m_hi
        corr_lo = math.exp2((m_lo - mn_lo) * sl2) if mn_lo != m_lo else float32(1.0)
        corr_hi = math.exp2((m_hi - mn_hi) * sl2) if mn_hi != m_hi else float32(1.0)
        rs_lo, rs_hi = exp_rows(s, base, mn_lo, mn_hi, sl2)
        return mn_lo, mn_hi, corr_lo, corr_hi, rs_lo, rs_hi, moved

    return softmax


@functools.cache
def fragment_rescale(DT: int):
    """A device function ``(acc, base, corr_lo, corr_hi)`` multiplying the ``DT``
    output n-tiles at ``acc[base]`` by the rows' correction factors (values
    4·dt + 0, 1 belong to row g, 4·dt + 2, 3 to row g+8)."""

    @device
    def rescale(acc, base, corr_lo, corr_hi):
        for dt in range(DT):
            i0 = base + 4 * dt
            acc[i0] *= corr_lo
            acc[i0 + 1] *= corr_lo
            acc[i0 + 2] *= corr_hi
            acc[i0 + 3] *= corr_hi

    return rescale


@functools.cache
def fragment_update(NT: int, DT: int):
    """A device function ``update(s, acc, stats, sl2) -> stats``: the online softmax of the ``NT`` n-tiles of S
    fragments at ``s`` (:func:`fragment_softmax`, P in place), the rows' ``stats`` = (m_lo, m_hi, l_lo, l_hi)
    carried on, the ``DT`` output n-tiles at ``acc`` rescaled (:func:`fragment_rescale`)."""
    softmax = fragment_softmax(NT)
    rescale = fragment_rescale(DT)

    @device
    def update(s, acc, stats, sl2):
        """One tile's scores into P, the rows' running max and sum, O rescaled."""
        m_lo, m_hi, l_lo, l_hi = stats
        m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2)
        l_lo = l_lo * corr_lo + rs_lo
        l_hi = l_hi * corr_hi + rs_hi
        rescale(acc, 0, corr_lo, corr_hi)
        return m_lo, m_hi, l_lo, l_hi

    return update
