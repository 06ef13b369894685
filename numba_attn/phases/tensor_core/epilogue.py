"""The epilogue of the tensor-core phases: O divided by the row sums and stored from the accumulator fragments."""
from __future__ import annotations

import functools

from numba import float32

from numba_attn.gpu.intrinsics import pack_bf16x2, pack_f16x2
from numba_attn.gpu.jit import device
from numba_attn.gpu.warp import quad_sum
from numba_attn.variants.sinks import lse_parts

__all__ = ["store_fragments", "lse_fragments"]

UNSEEN = float32(-1e30)  # below the stage's "saw no key" bound: the store writes -inf


@functools.cache
def store_fragments(DT: int, kind: str):
    """A device function ``store(o, bh, r_lo, acc, base, l_lo, l_hi, Nq, t)``: the epilogue.
    The lane's row sums are reduced over the quad, the ``DT`` output n-tiles at
    ``acc[base]`` divided by them (0 for rows that saw no key) and written to rows
    ``r_lo``, ``r_lo + 8`` of ``o`` (below ``Nq``): for ``kind`` "f16"/"bf16" as packed
    pairs into the uint32 view, for "f32" as two floats."""
    f32 = kind == "f32"  # two floats per pair, else a packed pair
    pack = pack_bf16x2 if kind == "bf16" else pack_f16x2

    @device
    def store(o, bh, r_lo, acc, base, l_lo, l_hi, Nq, t):
        r_hi = r_lo + 8
        l_lo = quad_sum(l_lo)
        l_hi = quad_sum(l_hi)
        inv_lo = float32(1.0) / l_lo if l_lo > float32(0.0) else float32(0.0)  # 0: rows past Nq
        inv_hi = float32(1.0) / l_hi if l_hi > float32(0.0) else float32(0.0)
        for dt in range(DT):
            i0 = base + 4 * dt
            if f32:
                c = 8 * dt + 2 * t
                if r_lo < Nq:
                    o[bh, r_lo, c] = acc[i0] * inv_lo
                    o[bh, r_lo, c + 1] = acc[i0 + 1] * inv_lo
                if r_hi < Nq:
                    o[bh, r_hi, c] = acc[i0 + 2] * inv_hi
                    o[bh, r_hi, c + 1] = acc[i0 + 3] * inv_hi
            else:
                if r_lo < Nq:
                    o[bh, r_lo, 4 * dt + t] = pack(acc[i0] * inv_lo, acc[i0 + 1] * inv_lo)
                if r_hi < Nq:
                    o[bh, r_hi, 4 * dt + t] = pack(acc[i0 + 2] * inv_hi, acc[i0 + 3] * inv_hi)

    return store


@functools.cache
def lse_fragments(stage):
    """A device function ``store_lse(mods, bh, r_lo, stats, sl2, Nq, t)``: with a stage that writes the
    log-sum-exp (:func:`~numba_attn.variants.sinks.lse_parts`), rows ``r_lo`` and ``r_lo + 8`` (below ``Nq``) get
    ``lse = m·sl2·ln 2 + ln l`` from the running max (raw scores) and the quad's summed row sums in ``stats``;
    -inf for a row that saw no key. Any other stage: nothing (a plain kernel compiles as before)."""
    LSE, _, store2 = lse_parts(stage)
    if not LSE:
        @device
        def nothing(mods, bh, r_lo, stats, sl2, Nq, t):
            pass

        return nothing

    @device
    def store_lse(mods, bh, r_lo, stats, sl2, Nq, t):
        m_lo, m_hi, l_lo, l_hi = stats
        l_lo = quad_sum(l_lo)  # (every lane takes part in the shuffles)
        l_hi = quad_sum(l_hi)
        if t == 0:  # the max is the quad's already; one lane per row stores
            if r_lo < Nq:
                store2(mods, bh, r_lo, m_lo * sl2 if m_lo > float32(-1e29) else UNSEEN, l_lo)
            if r_lo + 8 < Nq:
                store2(mods, bh, r_lo + 8, m_hi * sl2 if m_hi > float32(-1e29) else UNSEEN, l_hi)

    return store_lse
