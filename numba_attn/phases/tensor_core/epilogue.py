"""The epilogue of the tensor-core phases: O divided by the row sums and stored from the accumulator fragments."""
from __future__ import annotations

import functools

from numba import float32

from numba_attn.gpu.intrinsics import pack_bf16x2, pack_f16x2
from numba_attn.gpu.jit import device
from numba_attn.gpu.warp import quad_sum

__all__ = ["store_fragments"]


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
