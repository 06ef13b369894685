"""A warp's 16 query rows in the mma fragment layout (lane = 4g + t; a lane holds rows g and g+8 of its tile).

* :func:`warp_rows` — the block's and the warp's query rows and the KV head of an mma.sync kernel;
* :func:`q_fragments` — the A fragments of Q, loaded once from global memory into registers.
"""
from __future__ import annotations

import functools

from numba import cuda, uint32

from numba_attn.gpu.intrinsics import to_tf32
from numba_attn.gpu.jit import device

__all__ = ["q_fragments", "warp_rows"]


@device
def _word(x):
    return x


@functools.cache
def q_fragments(KS: int, tf32: bool = False, DW: int = 0):
    """A device function ``load(qf, base, q, bh, r_lo, Nq, t)`` filling ``qf[base:base + 4·KS]``
    with the A fragments of rows ``r_lo`` and ``r_lo + 8`` (zero past ``Nq``): per k-step
    ks the words at columns 8ks+t and 8ks+t+4 of each row. For f16/bf16 ``q`` is the
    uint32 view (two elements per word, m16n8k16); with ``tf32`` it is the float32
    array, each element rounded to tf32 (m16n8k8). ``DW``: the words of a row when the
    k-steps reach past it (head_dim an odd multiple of 8): the words at and past ``DW``
    are zero (the head dimension padded to whole k-steps)."""
    cvt = to_tf32 if tf32 else _word
    if DW and 8 * KS > DW:  # the last k-step's upper half (words 8ks+t+4) lies past the row
        @device
        def load_padded(qf, base, q, bh, r_lo, Nq, t):
            r_hi = r_lo + 8
            for ks in range(KS):
                c = 8 * ks + t
                qf[base + 4 * ks + 0] = cvt(q[bh, r_lo, c]) if r_lo < Nq else uint32(0)
                qf[base + 4 * ks + 1] = cvt(q[bh, r_hi, c]) if r_hi < Nq else uint32(0)
                qf[base + 4 * ks + 2] = cvt(q[bh, r_lo, c + 4]) if r_lo < Nq and c + 4 < DW else uint32(0)
                qf[base + 4 * ks + 3] = cvt(q[bh, r_hi, c + 4]) if r_hi < Nq and c + 4 < DW else uint32(0)

        return load_padded

    @device
    def load(qf, base, q, bh, r_lo, Nq, t):
        r_hi = r_lo + 8
        for ks in range(KS):
            c = 8 * ks + t
            qf[base + 4 * ks + 0] = cvt(q[bh, r_lo, c]) if r_lo < Nq else uint32(0)
            qf[base + 4 * ks + 1] = cvt(q[bh, r_hi, c]) if r_hi < Nq else uint32(0)
            qf[base + 4 * ks + 2] = cvt(q[bh, r_lo, c + 4]) if r_lo < Nq else uint32(0)
            qf[base + 4 * ks + 3] = cvt(q[bh, r_hi, c + 4]) if r_hi < Nq else uint32(0)

    return load


@functools.cache
def warp_rows(Br: int, WR: int):
    """A device function ``lanes(H, G) -> (tid, warp, lane, g, t, bh, kvh, blk0, row0)``:
    the block of ``Br`` query rows of head ``bh`` (grid: query blocks, heads), its KV
    head ``kvh`` (``G`` query heads per KV head), and this warp's ``WR`` rows from
    ``row0``; the lane is 4g + t."""
    @device
    def lanes(H, G):
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        bh = cuda.blockIdx.y
        kvh = (bh // H) * (H // G) + (bh % H) // G
        blk0 = cuda.blockIdx.x * Br
        row0 = blk0 + WR * warp
        return tid, warp, lane, g, t, bh, kvh, blk0, row0

    return lanes
