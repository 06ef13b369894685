"""A warp's 16 query rows in the mma fragment layout (lane = 4g + t; a lane holds rows g and g+8 of its tile).

* :func:`warp_rows` — the block's and the warp's query rows and the KV head of an mma.sync kernel;
* :func:`q_fragments` — the A fragments of Q, loaded once from global memory into registers;
* :func:`q_start` — a warp's start: Q's fragments, O zero, the online softmax's state of rows that saw no key
  (:func:`o_start`: the same without Q);
* :func:`qk_fragments` — S = Q·Kᵀ with mma.sync, the B fragments read from a K tile in shared memory.
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.intrinsics import lds, to_tf32
from numba_attn.gpu.jit import device

__all__ = ["q_fragments", "q_start", "o_start", "qk_fragments", "warp_rows"]


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
    padded = bool(DW and 8 * KS > DW)  # the last k-step's upper half (words 8ks+t+4) lies past the row

    @device
    def load(qf, base, q, bh, r_lo, Nq, t):
        r_hi = r_lo + 8
        for ks in range(KS):
            c = 8 * ks + t
            qf[base + 4 * ks + 0] = cvt(q[bh, r_lo, c]) if r_lo < Nq else uint32(0)
            qf[base + 4 * ks + 1] = cvt(q[bh, r_hi, c]) if r_hi < Nq else uint32(0)
            qf[base + 4 * ks + 2] = cvt(q[bh, r_lo, c + 4]) if r_lo < Nq and (not padded or c + 4 < DW) else uint32(0)
            qf[base + 4 * ks + 3] = cvt(q[bh, r_hi, c + 4]) if r_hi < Nq and (not padded or c + 4 < DW) else uint32(0)

    return load


@functools.cache
def q_start(KS: int, NO: int, tf32: bool = False, DW: int = 0):
    """A device function ``start(qf, acc, q, bh, r_lo, Nq, t) -> (m_lo, m_hi, l_lo, l_hi)``: Q's A fragments into
    ``qf`` (:func:`q_fragments` with ``KS``, ``tf32``, ``DW``), the ``NO`` output accumulators ``acc`` zeroed,
    and the running max and sums of rows g and g+8 before any key (m = NEG_BIG, l = 0)."""
    load_q = q_fragments(KS, tf32, DW)
    zero = o_start(NO)

    @device
    def start(qf, acc, q, bh, r_lo, Nq, t):
        load_q(qf, 0, q, bh, r_lo, Nq, t)
        return zero(acc)

    return start


@functools.cache
def o_start(NO: int):
    """A device function ``start(acc) -> (m_lo, m_hi, l_lo, l_hi)``: the ``NO`` output accumulators zeroed and the
    online softmax's state before any key (m = NEG_BIG, l = 0); :func:`q_start` without Q (a kernel whose Q
    reaches shared memory another way)."""

    @device
    def start(acc):
        for i in range(NO):
            acc[i] = float32(0.0)
        return NEG_BIG, NEG_BIG, float32(0.0), float32(0.0)

    return start


@functools.cache
def qk_fragments(NT: int, KS: int, mma, tf32: bool = False):
    """A device function ``qk(s, qf, Ks, kb, g, t)``: the ``NT`` n-tiles of S = Q·Kᵀ into ``s`` (fresh), ``KS``
    k-steps of ``mma`` on the A fragments ``qf`` and B fragments read from the K tile at row ``kb`` of ``Ks``
    (key 8nt+g, words 8ks+t and 8ks+t+4; with ``tf32`` fp32 elements rounded to tf32)."""
    cvt = to_tf32 if tf32 else _word

    @device
    def qk(s, qf, Ks, kb, g, t):
        for nt in range(NT):
            s0 = float32(0.0)
            s1 = float32(0.0)
            s2 = float32(0.0)
            s3 = float32(0.0)
            kr = kb + 8 * nt + g
            for ks in range(KS):
                b0 = cvt(lds(Ks, kr, 8 * ks + t))
                b1 = cvt(lds(Ks, kr, 8 * ks + t + 4))
                s0, s1, s2, s3 = mma(qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b0, b1, s0, s1, s2, s3)
            s[4 * nt] = s0
            s[4 * nt + 1] = s1
            s[4 * nt + 2] = s2
            s[4 * nt + 3] = s3

    return qk


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
