"""What the tensor-core prefill phases share.

All of them keep the FlashAttention-2 split: a warp owns 16 query rows (an
``m16`` tile) and everything about them lives in registers, in the mma
fragment layout (lane = 4g + t; a lane holds rows g and g+8 of its tile):

* :func:`warp_rows` / :func:`key_ends` — the block's and the warp's query rows, the
  KV head, and the keys the block loads and the warp sees;
* :func:`q_fragments` — the A fragments of Q, loaded once from global memory;
* :func:`mask_fragments` — scores of keys past the end and (causal) above the
  diagonal set to NEG_BIG on the accumulator fragments of S;
* the online softmax and rescale on the fragments
  (:func:`numba_attn.gpu.device_functions.fragment_softmax` / ``fragment_rescale``);
* :func:`store_fragments` — the epilogue: row sums reduced over the quad, O / l
  written (packed f16/bf16 pairs, or fp32);
* host side: :func:`supports_tc`, :func:`u32_views`, :func:`launch_mma` (grid,
  softmax scale and launch of the mma.sync phases).

The wgmma phases (``tc_wgmma``, ``tc_wgmma_overlap``, ``tma_wgmma`` and
``warp_specialized_tc``) are one kernel, :func:`make_wgmma_kernel`, whose compile-time
``overlap`` option issues the next tile's Q·Kᵀ before this tile's softmax, whose ``tma``
option brings the K/V tiles by TMA into an mbarrier ring instead of cp.async, and whose
``ws`` option (with ``tma``) hands the loads to a producer warpgroup that gives its
registers to the consumers, and whose ``pingpong`` option (with ``ws``, two consumers: phase
``pingpong``) makes the two consumer warpgroups take turns at the tensor cores through two named
barriers; :func:`build_wgmma` is their host side (:func:`kv_tensor_map`:
the cached tensor maps of K and V).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import LOG2E, NEG_BIG, fragment_rescale, fragment_softmax
from numba_attn.gpu.intrinsics import (SMEM_ALIGN, cp_async_commit, cp_async_wait, ld_global_v4, lds, mma_bf16, mma_f16,
                                       pack_b16x2, pack_bf16x2, pack_f16x2, rows_head_major, st_shared_v4, to_tf32)
from numba_attn.gpu import tma as _tma
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.mbarrier import (fence_proxy_async, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init,
                                     mbarrier_wait)
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT, dynamic_tile, launch_dynamic, smem_reason
from numba_attn.gpu.split_k import sm_count
from numba_attn.gpu.tma import tensormap_fence_acquire, tma_load_3d
from numba_attn.gpu.warp import FULL_MASK, quad_sum, shfl_sync, syncwarp
from numba_attn.gpu.warpspec import named_barrier_arrive, named_barrier_sync, setmaxnreg_dec, setmaxnreg_inc
from numba_attn.gpu.wgmma import (kmajor_params, make_ring_copy, make_wgmma_rs, make_wgmma_wait, mnmajor_params,
                                  padded_columns, row_bytes, shared_address)
from numba_attn.phases.registry import Launch

__all__ = ["LOG2E", "NEG_BIG", "q_fragments", "mask_fragments", "store_fragments", "supports_tc", "u32_views",
           "launch_mma", "warp_rows", "key_ends", "ALIGN_BYTES", "make_wgmma_kernel", "wgmma_smem_bytes", "resolve_wgmma",
           "supports_wgmma", "build_wgmma", "make_mma_kernel", "mma_smem_bytes", "resolve_mma", "supports_mma", "varlen_spans", "varlen_views", "VarlenLayout",
           "launch_mma_varlen", "kv_tensor_map", "tma_box", "tma_smem_reason"]


# -- device side: the fragments of one warp's 16 rows ------------------------------------------


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
def store_fragments(DT: int, kind: str):
    """A device function ``store(o, bh, r_lo, acc, base, l_lo, l_hi, Nq, t)``: the epilogue.
    The lane's row sums are reduced over the quad, the ``DT`` output n-tiles at
    ``acc[base]`` divided by them (0 for rows that saw no key) and written to rows
    ``r_lo``, ``r_lo + 8`` of ``o`` (below ``Nq``): for ``kind`` "f16"/"bf16" as packed
    pairs into the uint32 view, for "f32" as two floats."""
    if kind == "f32":
        @device
        def store(o, bh, r_lo, acc, base, l_lo, l_hi, Nq, t):
            r_hi = r_lo + 8
            l_lo = quad_sum(l_lo)
            l_hi = quad_sum(l_hi)
            inv_lo = float32(1.0) / l_lo if l_lo > float32(0.0) else float32(0.0)  # 0: rows past Nq
            inv_hi = float32(1.0) / l_hi if l_hi > float32(0.0) else float32(0.0)
            for dt in range(DT):
                i0 = base + 4 * dt
                c = 8 * dt + 2 * t
                if r_lo < Nq:
                    o[bh, r_lo, c] = acc[i0] * inv_lo
                    o[bh, r_lo, c + 1] = acc[i0 + 1] * inv_lo
                if r_hi < Nq:
                    o[bh, r_hi, c] = acc[i0 + 2] * inv_hi
                    o[bh, r_hi, c + 1] = acc[i0 + 3] * inv_hi

        return store

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
            if r_lo < Nq:
                o[bh, r_lo, 4 * dt + t] = pack(acc[i0] * inv_lo, acc[i0 + 1] * inv_lo)
            if r_hi < Nq:
                o[bh, r_hi, 4 * dt + t] = pack(acc[i0 + 2] * inv_hi, acc[i0 + 3] * inv_hi)

    return store


@device
def varlen_spans(cu_q, cu_k):
    """``(q0, Nq, k0, Nk)``: the first query row and the queries, the first key row and the keys of
    sequence ``blockIdx.z`` from its cu_seqlens (the varlen layout)."""
    b = cuda.blockIdx.z
    q0 = cu_q[b]
    k0 = cu_k[b]
    return q0, cu_q[b + 1] - q0, k0, cu_k[b + 1] - k0


@device
def varlen_views(q, k, v, o, cu_q, cu_k):
    """``(q, k, v, o, Nq, Nk)`` of sequence ``blockIdx.z`` in the varlen layout: q, o (total_q, H, W)
    and k, v (total_k, Hkv, W) → its rows as head-major views (H, Nq, W) and (Hkv, Nk, W), what the
    kernels index as (b·h, row, word), and its lengths."""
    q0, nq, k0, nk = varlen_spans(cu_q, cu_k)
    return (rows_head_major(q, q0, nq), rows_head_major(k, k0, nk), rows_head_major(v, k0, nk),
            rows_head_major(o, q0, nq), nq, nk)


# -- host side ----------------------------------------------------------------------------------


def supports_tc(problem, Bc, max_d=128, **_):
    """Shared checks of the f16/bf16 tensor-core phases: head_dim a multiple of 16 up to
    ``max_d`` (``max_d`` None: a multiple of 8 up to 256, padded to whole k-steps)."""
    D = problem.head_dim
    if max_d is None:
        if D % 8 or D > 256:
            return f"head_dim {D} must be a multiple of 8 and at most 256 (16-byte rows; fragments live in registers)"
    elif D % 16 or D > max_d:
        return f"head_dim {D} must be a multiple of 16 and at most {max_d} (fragments live in registers)"
    if Bc % 16:
        return f"Bc={Bc} must be a multiple of 16 (k-steps of P·V)"
    return None


def u32_views(q, k, v, o):
    """Device (BH, N, D) f16/bf16 arrays → (BH, N, D/2) uint32 views."""
    return tuple(view_as(a, np.uint32) for a in (q, k, v, o))


def launch_mma(problem, kern, Br, warps, views=True, dyn_bytes=0):
    """The :class:`Launch` of an mma.sync kernel ``kern(q, k, v, o, sl2, H, G, Nq, Nk)``:
    one block of ``warps`` warps per ``Br`` query rows and (batch, head); q/k/v/o passed
    as uint32 views when ``views`` (f16/bf16), as they are otherwise (fp32); with
    ``dyn_bytes`` the launch takes that much dynamic shared memory (opting in above 48 KiB)."""
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    sl2 = float32(problem.sm_scale * LOG2E)  # scores in base 2: exp2((s - m)·sl2)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)
    block = 32 * warps
    tail = (sl2, H, problem.group, Nq, Nk)

    def run(q, k, v, o, stream=0):
        args = u32_views(q, k, v, o) if views else (q, k, v, o)
        if dyn_bytes:
            launch_dynamic(kern, grid, block, stream, dyn_bytes, *args, *tail)
        else:
            kern[grid, block, stream](*args, *tail)

    return Launch(run, kernels=[kern])


# -- the mma.sync kernel (tc_mma; tc_mma_varlen with varlen=True) ---------------------------------

@functools.cache
def make_mma_kernel(D: int, W: int, Bc: int, causal: bool, bf16: bool, varlen: bool = False):
    """The mma.sync kernel of ``tc_mma`` ``(q, k, v, o, sl2, H, G, Nq, Nk)`` (its docstring has the
    lesson): ``W`` warps of 16 query rows, K/V tiles of ``Bc`` keys staged in padded shared memory.
    ``varlen`` (``tc_mma_varlen``): q, o are (total_q, H, D/2) and k, v (total_k, Hkv, D/2) uint32
    views of packed sequences, ``Nq``/``Nk`` their cu_seqlens, the grid (query blocks of the longest
    sequence, heads, sequences); a block takes its sequence's rows (:func:`varlen_views`) and exits
    when they end before its first row."""
    mma = mma_bf16 if bf16 else mma_f16
    pack = pack_bf16x2 if bf16 else pack_f16x2
    Br = 16 * W  # query rows per block (16 per warp)
    NTH = 32 * W
    DK = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps of Q·Kᵀ (D itself when a multiple of 16)
    KS = DK // 16  # k-steps of Q·Kᵀ
    NT = Bc // 8  # n-tiles of S (8 keys each)
    KK = Bc // 16  # k-steps of P·V
    DT = D // 8  # n-tiles of O (8 columns each)
    VEC = D // 8  # 16-byte chunks per row of K or V
    KROW = DK // 2 + 4  # K tile row in words (padded: conflict-free fragment reads)
    VROW = D + 8  # V tile row in halves (padded)
    NQ = 4 * KS  # Q fragment registers
    NS = 4 * NT  # score accumulators
    NO = 4 * DT  # output accumulators
    softmax = fragment_softmax(NT)  # online softmax on the S fragments (device_functions)
    rescale = fragment_rescale(DT)
    load_q = q_fragments(KS, False, D // 2)
    mask = mask_fragments(NT, Bc, causal)
    lanes = warp_rows(Br, 16)
    ends = key_ends(Br, 16, causal)
    store = store_fragments(DT, "bf16" if bf16 else "f16")

    def tc_mma(q, k, v, o, sl2, H, G, Nq, Nk):
        # q, k, v, o: uint32 views (two f16/bf16 per word) of (BH, N, D)
        Ks = cuda.shared.array((Bc, KROW), uint32, alignment=SMEM_ALIGN)
        Vs = cuda.shared.array((Bc, VROW), uint16, alignment=SMEM_ALIGN)
        if varlen:  # this block's sequence (blockIdx.z) as head-major views; Nq, Nk its lengths
            q, k, v, o, Nq, Nk = varlen_views(q, k, v, o, Nq, Nk)
            if cuda.blockIdx.x * Br >= Nq:
                return
        tid, warp, lane, g, t, bh, kvh, blk0, row0 = lanes(H, G)
        r_lo = row0 + g  # this lane's rows: r_lo and r_lo + 8
        off = Nk - Nq  # causal: row i sees keys j <= i + off

        qf = cuda.local.array(NQ, uint32)
        load_q(qf, 0, q, bh, r_lo, Nq, t)
        acc = cuda.local.array(NO, float32)
        for i in range(NO):
            acc[i] = float32(0.0)
        s = cuda.local.array(NS, float32)
        m_lo = NEG_BIG
        m_hi = NEG_BIG
        l_lo = float32(0.0)
        l_hi = float32(0.0)

        kv_end, warp_end = ends(blk0, row0, Nq, Nk, off)

        for j0 in range(0, kv_end, Bc):
            # -- stage the K and V tiles: 16 bytes per thread and access
            for e in range(tid, Bc * VEC, NTH):
                r = e // VEC
                c = e - r * VEC
                if j0 + r < Nk:
                    x = ld_global_v4(k, kvh, j0 + r, 4 * c)
                    st_shared_v4(Ks, r, 4 * c, x[0], x[1], x[2], x[3])
                    y = ld_global_v4(v, kvh, j0 + r, 4 * c)
                    st_shared_v4(Vs, r, 8 * c, y[0], y[1], y[2], y[3])
                else:
                    z = uint32(0)
                    st_shared_v4(Ks, r, 4 * c, z, z, z, z)
                    st_shared_v4(Vs, r, 8 * c, z, z, z, z)
            if DK > D:  # the K columns that complete the last k-step are zero
                for r in range(tid, Bc, NTH):
                    z = uint32(0)
                    st_shared_v4(Ks, r, 4 * VEC, z, z, z, z)
            cuda.syncthreads()
            if j0 < warp_end:  # warp-uniform: the warp's rows see some key of this tile
                # -- S = Q Kᵀ on the tensor cores
                for nt in range(NT):
                    s0 = float32(0.0)
                    s1 = float32(0.0)
                    s2 = float32(0.0)
                    s3 = float32(0.0)
                    kr = nt * 8 + g
                    for ks in range(KS):
                        b0 = lds(Ks, kr, 8 * ks + t)
                        b1 = lds(Ks, kr, 8 * ks + 4 + t)
                        s0, s1, s2, s3 = mma(qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3],
                                             b0, b1, s0, s1, s2, s3)
                    s[4 * nt] = s0
                    s[4 * nt + 1] = s1
                    s[4 * nt + 2] = s2
                    s[4 * nt + 3] = s3
                # -- mask keys past the end and (causal) above the diagonal
                mask(s, 0, j0, row0, r_lo, t, Nk, off)
                # -- online softmax on the fragments
                m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2)
                l_lo = l_lo * corr_lo + rs_lo
                l_hi = l_hi * corr_hi + rs_hi
                rescale(acc, 0, corr_lo, corr_hi)
                # -- O += P V: two S n-tiles = one A fragment of P
                for kk in range(KK):
                    a0 = pack(s[8 * kk], s[8 * kk + 1])
                    a1 = pack(s[8 * kk + 2], s[8 * kk + 3])
                    a2 = pack(s[8 * kk + 4], s[8 * kk + 5])
                    a3 = pack(s[8 * kk + 6], s[8 * kk + 7])
                    kr = 16 * kk + 2 * t
                    for dt in range(DT):
                        cc = 8 * dt + g
                        b0 = pack_b16x2(lds(Vs, kr, cc), lds(Vs, kr + 1, cc))
                        b1 = pack_b16x2(lds(Vs, kr + 8, cc), lds(Vs, kr + 9, cc))
                        (acc[4 * dt], acc[4 * dt + 1], acc[4 * dt + 2], acc[4 * dt + 3]) = mma(
                            a0, a1, a2, a3, b0, b1, acc[4 * dt], acc[4 * dt + 1], acc[4 * dt + 2],
                            acc[4 * dt + 3])
            cuda.syncthreads()

        store(o, bh, r_lo, acc, 0, l_lo, l_hi, Nq, t)

    tc_mma.__name__ = tc_mma.__qualname__ = "tc_mma_varlen" if varlen else "tc_mma"
    return kernel(tc_mma)




def mma_smem_bytes(D, Bc):
    """Static shared memory of the tc_mma kernel: the padded K and V tiles."""
    return Bc * ((D + 15) // 16 * 8 + 4) * 4 + Bc * (D + 8) * 2


def resolve_mma(problem, warps, Bc):
    """The mma.sync kernel's automatic parameters (tc_mma, tc_mma_varlen): Bc=0 is 64 keys, 32 where the two
    64-key tiles exceed the 48 KiB of static shared memory (head_dim above 184)."""
    return {"warps": warps, "Bc": Bc or (64 if mma_smem_bytes(problem.head_dim, 64) <= STATIC_SMEM_LIMIT else 32)}


def supports_mma(problem, warps, Bc):
    """What the mma.sync kernel runs (tc_mma, tc_mma_varlen): supports_tc's head dims and tiles, K/V tiles
    within the static shared memory."""
    reason = supports_tc(problem, Bc, max_d=None)
    if reason:
        return reason
    if mma_smem_bytes(problem.head_dim, Bc) > STATIC_SMEM_LIMIT:
        return f"K/V tiles need {mma_smem_bytes(problem.head_dim, Bc)} B of static shared memory (> 48 KiB)"
    return None


# -- the wgmma kernel (tc_wgmma; tc_wgmma_overlap with overlap=True; tma_wgmma with tma=True) ------

ALIGN_BYTES = 1024  # the 128-byte swizzle repeats every 1024 bytes: tiles start there
PP_BAR = 1  # pingpong: consumer c's turn is named barrier PP_BAR + c (0 is syncthreads)
PP_THREADS = 256  # pingpong: threads counted at either barrier, the two consumer warpgroups


@device
def turn_wait(first):
    """pingpong: wait for this consumer's turn, ``bar.sync`` on its own barrier (``first``: consumer 0).
    The ids are constants in each branch: no register holds them through the loop."""
    if first:
        named_barrier_sync(PP_BAR, PP_THREADS)
    else:
        named_barrier_sync(PP_BAR + 1, PP_THREADS)


@device
def turn_pass(first):
    """pingpong: give the turn to the other consumer, ``bar.arrive`` on its barrier."""
    if first:
        named_barrier_arrive(PP_BAR + 1, PP_THREADS)
    else:
        named_barrier_arrive(PP_BAR, PP_THREADS)


@functools.cache
def make_wgmma_kernel(D: int, WG: int, Bc: int, STAGES: int, G: int, causal: bool, bf16: bool, overlap: bool,
                      varlen: bool = False, tma: bool = False, ws: bool = False, pingpong: bool = False,
                      uniform: bool = False, persistent: bool = False):
    """The wgmma attention kernel ``(q, k, v, o, sl2, H, Nq, Nk)`` of ``WG`` warpgroups (64 query
    rows each). Per K/V tile: S = Q·Kᵀ (``D/16`` wgmma m64nBc k16, K from the swizzled ring),
    mask, online softmax, P packed in registers, O += P·V (``Bc/16`` wgmma m64nD k16, V as the
    transposed operand). Without ``overlap`` each product is waited for at once; with it, the
    next tile's S is issued (not waited) before this tile's softmax, one ``wait_group`` retires
    both products, and the ring must hold tile j+1 while tile j is read (STAGES ≥ 3); the loop is then
    unrolled by two, the two score sets trading roles (``tile_step`` called with them swapped). With ``varlen``
    (``tc_wgmma_varlen``) q, o are (total_q, H, D/2) and k, v (total_k, Hkv, D/2) uint32 views of packed
    sequences and ``Nq``/``Nk`` their cu_seqlens: a block takes sequence ``blockIdx.z``'s rows
    (:func:`varlen_spans`; Q and O through head-major views, K/V copied token-major from the sequence's
    first key, k and v themselves never sliced: kernel arguments cost no registers) and exits when
    they end before its first row; its ring stage is recomputed from the tile index (``CARRY`` off).

    ``tma``: ``k`` and ``v`` are tensor maps (:func:`kv_tensor_map`, boxes :func:`tma_box`) and
    thread 0 brings each tile with ``tma_load_3d`` of its column blocks after
    ``mbarrier_arrive_expect_tx`` on the stage's "full" barrier; every warp waits on that
    barrier (phase parity: tile j is phase j // STAGES of its stage; stage and parity are carried from
    tile to tile (``advance``), not divided out) and, done with the tile,
    arrives (lanes synced, then lane 0) on the stage's "empty" barrier (one arrival per warp), on
    which thread 0 waits before refilling the stage. No cp.async, no block barrier in the loop.

    ``ws`` (with ``tma``): warp specialisation. The block has one more warpgroup, the
    producer (warps 0-3, before the ``WG`` consumer warpgroups): it gives registers back
    (``setmaxnreg.dec`` to :func:`ws_producer_regs`) and its thread 0 issues every tile of
    the block, waiting only on the empty barriers; the consumers take the registers
    (``setmaxnreg.inc``, :func:`ws_consumer_regs`) and only wait on the full barriers and
    arrive on the empty ones. The kernel is compiled with ``launch_bounds`` of its
    ``128·(WG + 1)`` threads (ptxas needs the entry budget to honour setmaxnreg).

    ``pingpong`` (with ``ws`` and two consumers, not ``overlap``): the consumers take turns at the
    tensor cores (FlashAttention-3's inter-warpgroup ping-pong). Consumer c's turn is named
    barrier ``PP_BAR + c`` with :data:`PP_THREADS` (both consumers' threads): a consumer waits
    (``bar.sync``) on its own barrier before it issues P·V of tile j-1 (and waits for tile j and
    issues S_j = Q·K_jᵀ), and arrives (``bar.arrive``) on the other's right after that issue: a turn
    only issues, the tensor cores run the products in issue order. Then it waits for both products
    (``wgmma.wait_group 0``), releases tile j-1's stage and does its softmax while the other one's
    products run. Consumer 0 arrives
    once on its own barrier before the loop (its first turn), and after the loop each consumer
    arrives once more on the other's barrier (the other's last P·V). Every consumer syncs and
    arrives once per tile of the block, also for tiles it skips (causal, rows past Nq), so
    the two barriers stay balanced whatever a consumer computes.

    ``uniform`` (off by default until timed on a GPU): the warp index is broadcast from lane 0
    (``shfl.sync``), which every lane has anyway, so that ptxas knows it is warp-uniform: the values
    derived from it (the warpgroup's rows and key bound, the loop's trip count, the ring stage and
    parity) and so the wgmma descriptors are then computed in the uniform datapath, one
    ``UIADD3.64`` per wgmma instead of a 64-bit add in vector registers, two copies and two ``R2UR``
    (docs/tensor-core-notes.md, "Uniform warp index").

    ``persistent`` (with ``ws``; phase ``ws_persistent``): a block per SM (grid ``(blocks, 1, 1)``), each
    running work items (a query block of one head and batch) one after another: item ``blockIdx.x``,
    then every ``gridDim.x``-th, query blocks counted from the last (the causal diagonal's longest
    first), found by subtraction (:func:`first_item`, :func:`next_item`, no division). The producer walks the
    same items and carries its ring stage and parity from one item to the next, so the next item's first
    tiles load while the consumers finish the last ones and store O; the barriers are initialised once
    per block, not once per item."""
    if ws and not tma:
        raise ValueError("warp specialisation (ws) needs the TMA ring (tma=True)")
    if pingpong and not (ws and WG == 2 and not overlap):
        raise ValueError("pingpong alternates two consumer warpgroups: it needs ws=True, two warpgroups "
                         "and overlap=False")
    if varlen and tma:
        raise ValueError("the varlen layout has no TMA ring (tma=False)")
    if persistent and not (ws and not overlap and not pingpong):
        raise ValueError("persistent blocks carry the producer's ring across work items: they need ws=True, "
                         "overlap=False and pingpong=False")
    kind = "bf16" if bf16 else "f16"
    pack = pack_bf16x2 if bf16 else pack_f16x2
    W = 4 * WG  # warps per block; warpgroup i = warps 4i..4i+3, 64 query rows
    NTH = 32 * W
    Br = 64 * WG
    DPAD = padded_columns(D)  # columns of the shared tiles (D, or D padded to a swizzle mode)
    KS = (D + 15) // 16  # k-steps of Q·Kᵀ (an odd multiple of 8: the last half zero)
    NT = Bc // 8  # n-tiles of S (8 columns each)
    KK = Bc // 16  # k-steps of P·V
    DT = D // 8  # n-tiles of O
    NQ = 4 * KS  # Q registers (A fragments)
    NS = Bc // 2  # score accumulators per thread (64 × Bc over 128 threads)
    NO = D // 2  # output accumulators per thread
    softmax = fragment_softmax(NT)  # online softmax on the S fragments (device_functions)
    rescale = fragment_rescale(DT)
    ends = key_ends(Br, 64, causal)  # (the block's keys, a warpgroup's keys) from its first row
    load_q = q_fragments(KS, False, D // 2)
    store = store_fragments(DT, kind)
    # cp.async of one K/V tile into the swizzled ring
    copy_tile = make_ring_copy(D, Bc, STAGES, NTH, DPAD, varlen) if DPAD != D else make_ring_copy(
        D, Bc, STAGES, NTH, 0, varlen)
    NP = 4 * KK  # P registers (A fragments of P·V)
    RB = row_bytes(DPAD)  # bytes per swizzled row
    TILE = Bc * DPAD * 2  # bytes of one K (or V) stage
    KVR = 2 * STAGES * TILE // 16  # rows of 16 bytes in the ring
    WAIT = STAGES - 2  # copy groups that may stay in flight when tile j is needed
    WAIT_LOOP = STAGES - 3 if overlap else WAIT  # overlap: when tile j+1 is needed
    qk_off, qk_lbo, qk_sbo = kmajor_params(Bc, KS, RB)
    pv_off, pv_lbo, pv_sbo = mnmajor_params(Bc, KK, RB)
    qk = make_wgmma_rs(kind, Bc, False, True, qk_off, qk_lbo, qk_sbo, RB)  # S = Q Kᵀ (fresh), waited
    qk_next = make_wgmma_rs(kind, Bc, False, True, qk_off, qk_lbo, qk_sbo, RB, False)  # issued, not waited
    # O += P V: waited at once, except with overlap (one wait retires both products) and pingpong (issued
    # in the turn, waited after the turn is passed on, with the next tile's S)
    pv = make_wgmma_rs(kind, D, True, False, pv_off, pv_lbo, pv_sbo, RB, not (overlap or pingpong))
    wait_all = make_wgmma_wait(0, NS, NO)  # both products done; S_next and O pass through the wait
    wait_o = make_wgmma_wait(0, NO)  # pingpong: O done (a skipped tile, the end of the loop)
    # tma: the ring's barriers (full[s] = s, empty[s] = STAGES + s) and one tile's loads
    NCB = DPAD * 2 // RB  # column blocks of a tile: one TMA box each, K and V
    CB = Bc * RB  # bytes of one column block (one box)
    CW = RB // 4  # 32-bit words of a box row: the column step between boxes
    NBARS = 2 * STAGES
    REGS = ws and WG >= 2  # move registers from the producer to the consumers (one consumer: no need)
    P_REGS = ws_producer_regs(WG)
    C_REGS = ws_consumer_regs(WG)
    # The ring stage and the phase parity of a tile: carried from tile to tile (``advance``), except in the
    # varlen kernel, which recomputes them from the tile index (j mod STAGES, (j // STAGES) mod 2). There the
    # two carried stages (64-bit loop variables) pushed the 168 registers of three warpgroups at D=128 causal
    # over: 24 bytes of spills (the rows of the Q load kept for the store), none when recomputed.
    CARRY = not varlen

    @device
    def advance(st, ph):
        """The ring stage after ``st`` and the phase parity of its next tile: ``(st + 1, ph)``, or past
        the last stage ``(0, ph ^ 1)``. Stage and parity are carried from tile to tile as loop variables
        (tile j: stage j mod STAGES, parity (j // STAGES) mod 2): no division in the loop."""
        st += 1
        if st == STAGES:
            return 0, ph ^ 1
        return st, ph

    @device
    def release_stage(bars, st, lane):
        """This warp is done with ring stage ``st`` (every lane past its wgmma wait: the warp's arrival
        stands for all 32 lanes): lanes synced, then lane 0 arrives on the stage's empty barrier."""
        syncwarp(FULL_MASK)
        if lane == 0:
            mbarrier_arrive(bars, STAGES + st)

    @device
    def tma_tile(KV, kmap, vmap, bars, tile, buf, kvh):
        mbarrier_arrive_expect_tx(bars, buf, 2 * TILE)  # the K and V boxes of the tile, zero fill included
        row = tile * Bc
        for cb in range(NCB):
            tma_load_3d(KV, buf * TILE + cb * CB, kmap, kvh, row, CW * cb, bars, buf)
            tma_load_3d(KV, (STAGES + buf) * TILE + cb * CB, vmap, kvh, row, CW * cb, bars, buf)

    @device
    def tile_step(it, n_tiles, s, sn, st, ph, pst, rst, rph, m_lo, m_hi, l_lo, l_hi, KV, k, v, bars, kvh, qf, pf,
                  acc, tid, lane, g, t, row0, wg_end, Nk, off, sl2, first):
        """Tile ``it`` of the loop: its scores ``s`` (with ``overlap``: issued the tile before, and tile
        it+1's issued into ``sn``), mask, softmax, P·V; the ring's stage and parity (``st``, ``ph``;
        ``pst`` tile it-1's stage, ``rst``/``rph`` the refill's) advanced. Returns the running max and
        sums and the ring state. With ``overlap`` the loop calls it twice per iteration, the second time
        with ``s`` and ``sn`` swapped: the score sets change roles at compile time, nothing is copied.
        Without ``CARRY`` (varlen) the ring state is recomputed from ``it`` here; the one passed in is unused."""
        if CARRY:
            if overlap:
                st1, ph1 = advance(st, ph)  # tile it+1
        else:  # from it: tile it's stage and parity, tile it+1's, and the refill's (tile it + STAGES - 1)
            st = it % STAGES
            ph = (it // STAGES) % 2
            st1 = (it + 1) % STAGES
            ph1 = ((it + 1) // STAGES) % 2
            rst = (it + STAGES - 1) % STAGES
            rph = ((it + STAGES - 1) // STAGES) % 2
        if tma:
            if not ws:
                nxt = it + STAGES - 1
                if tid == 0 and nxt < n_tiles:  # refill the stage of tile it-1 ...
                    if nxt >= STAGES:  # ... once every warp is done with it (the phase before)
                        mbarrier_wait(bars, STAGES + rst, rph ^ 1)
                    tma_tile(KV, k, v, bars, nxt, rst, kvh)
            # every warp waits for the tile it reads next, also a warpgroup that skips it: its
            # arrival below must not count towards a later phase of the empty barrier
            if overlap:
                if it + 1 < n_tiles:
                    mbarrier_wait(bars, st1, ph1)
            else:
                mbarrier_wait(bars, st, ph)
        else:
            cp_async_wait(WAIT_LOOP)  # the tile needed next has landed (this thread's copies) ...
            cuda.syncthreads()  # ... every thread's; every warpgroup is done with tile it-1
            nxt = it + STAGES - 1
            if nxt < n_tiles:  # refill the buffer of tile it-1
                copy_tile(KV, k, v, nxt, rst, tid, kvh, Nk)
            cp_async_commit()

        j0 = it * Bc
        if overlap:
            # -- issue S_{it+1} = Q K_{it+1}ᵀ: the tensor cores work on it during the softmax below. Issued
            # for every tile, also past the last one or past this warpgroup's keys (its scores then unused):
            # a branch around it leaves sn's old values on one path, and ptxas serializes every wgmma of
            # the loop unrolled by two (C7515). Past the last tile the stage holds tile it+1-STAGES (or
            # nothing yet), which no load rewrites: nothing is read that is being written.
            qk_next(sn, qf, 0, KV, st1 * TILE)
        if j0 < wg_end:
            if pingpong:  # -- S = Q Kᵀ issued in this consumer's turn, then the other consumer's turn
                qk_next(s, qf, 0, KV, st * TILE)
                turn_pass(first)
                wait_all(s, acc)  # S and the last tile's O complete: the softmax below overlaps the other's products
                if it > 0:  # tile it-1's P·V retired: its stage may be refilled (before this consumer's
                    release_stage(bars, pst, lane)  # next turn: two stages suffice)
            elif not overlap:
                # -- S = Q Kᵀ: KS wgmma m64nBc k16, K read from shared memory
                qk(s, qf, 0, KV, st * TILE)
            # -- mask keys past the end and (causal) above the diagonal
            if j0 + Bc > Nk or (causal and j0 + Bc - 1 > row0 + off):
                for nt in range(NT):
                    for e in range(4):
                        col = j0 + nt * 8 + 2 * t + (e % 2)
                        row = row0 + g + 8 * (e // 2)
                        if col >= Nk or (causal and col > row + off):
                            s[4 * nt + e] = NEG_BIG
            # -- online softmax on the fragments (rows g and g+8 of the warp)
            m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2)
            l_lo = l_lo * corr_lo + rs_lo
            l_hi = l_hi * corr_hi + rs_hi
            for kk in range(KK):  # P, rounded and packed: the A fragments of k-step kk
                i0 = 8 * kk
                pf[4 * kk + 0] = pack(s[i0], s[i0 + 1])
                pf[4 * kk + 1] = pack(s[i0 + 2], s[i0 + 3])
                pf[4 * kk + 2] = pack(s[i0 + 4], s[i0 + 5])
                pf[4 * kk + 3] = pack(s[i0 + 6], s[i0 + 7])
            rescale(acc, 0, corr_lo, corr_hi)
            if pingpong:  # this consumer's next turn: O += P V, then (next tile) S above
                turn_wait(first)
            # -- O += P V: KK wgmma m64nD k16, V (transposed) read from shared memory
            pv(acc, pf, 0, KV, (STAGES + st) * TILE)
        elif pingpong:  # a tile this consumer skips: its turns all the same (the barriers stay balanced)
            turn_pass(first)
            wait_o(acc, acc)  # the last P·V complete: tile it-1's stage may be refilled
            if it > 0:
                release_stage(bars, pst, lane)
            turn_wait(first)
        if overlap:
            wait_all(sn, acc)  # both products complete (warpgroup-uniform); S_{it+1} is in sn
        if tma and not pingpong:
            # this warp's products are complete (every lane past its wait: the warp's arrival
            # stands for all 32 lanes): tile it's stage may be refilled
            release_stage(bars, st, lane)
        pst = st
        st, ph = advance(st, ph)
        if not ws:
            rst, rph = advance(rst, rph)

        return m_lo, m_hi, l_lo, l_hi, st, ph, pst, rst, rph

    @device
    def consume(q, o, KV, k, v, bars, blk0, wg0, row0, bh, kvh, st0, ph0, tid, lane, g, t, Nq, Nk, off, sl2, first,
                q0):
        """One work item of a consumer warp: query rows ``blk0 .. blk0+Br`` of head-batch ``bh`` (KV head
        ``kvh``; ``wg0``, ``row0``: the first rows of this warpgroup and warp): Q to registers, the loop
        over the K/V tiles, O stored. The ring's stage and parity ``st0``/``ph0`` at its first tile in,
        after its last tile out (a persistent block's next item goes on from there)."""
        qf = cuda.local.array(NQ, uint32)
        r_lo = row0 + g
        load_q(qf, 0, q, bh, r_lo, Nq, t)
        acc = cuda.local.array(NO, float32)
        for i in range(NO):
            acc[i] = float32(0.0)
        s = cuda.local.array(NS, float32)
        sn = cuda.local.array(NS, float32)  # overlap: S of the next tile, in flight during this tile's softmax
        pf = cuda.local.array(NP, uint32)
        m_lo = NEG_BIG  # running max (raw scores) of rows g and g+8 of this warp
        m_hi = NEG_BIG
        l_lo = float32(0.0)  # running sums, this lane's columns only
        l_hi = float32(0.0)

        # the keys the block loads, and those this warpgroup needs (warpgroup-uniform: wgmma is collective)
        kv_end, wg_end = ends(blk0, wg0, Nq, Nk, off)
        n_tiles = (kv_end + Bc - 1) // Bc

        if tma:
            if not ws:
                if tid == 0:
                    for st in range(STAGES - 1):  # tiles 0 .. STAGES-2 in flight
                        if st < n_tiles:
                            tma_tile(KV, k, v, bars, st, st, kvh)
            if overlap:
                if n_tiles > 0:
                    mbarrier_wait(bars, 0, 0)  # tile 0 has landed
                if n_tiles > 0 and wg_end > 0:
                    qk(s, qf, 0, KV, 0)  # S of tile 0
        else:
            for st in range(STAGES - 1):  # tiles 0 .. STAGES-2 in flight
                if st < n_tiles:
                    copy_tile(KV, k, v, st, st, tid, kvh, Nk)
                cp_async_commit()

            if overlap:
                cp_async_wait(WAIT)  # tile 0 has landed ...
                cuda.syncthreads()  # ... for every thread's copies
                if n_tiles > 0 and wg_end > 0:
                    qk(s, qf, 0, KV, 0)  # S of tile 0

        if pingpong:
            if first:  # consumer 0 takes the first turn ...
                named_barrier_arrive(PP_BAR, PP_THREADS)
            turn_wait(first)  # ... consumer 1 waits for consumer 0's first arrival

        st = st0  # tile it's ring stage and the phase parity of its full barrier, carried (advance; CARRY)
        ph = ph0
        pst = STAGES - 1  # pingpong: tile it-1's stage
        rst = STAGES - 1  # the refill (tile it + STAGES - 1, not ws): the stage of tile it-1, and its parity
        rph = 0
        if overlap:  # unrolled by two: S_it in s for even it, in sn for odd it
            for it in range(0, n_tiles, 2):
                m_lo, m_hi, l_lo, l_hi, st, ph, pst, rst, rph = tile_step(
                    it, n_tiles, s, sn, st, ph, pst, rst, rph, m_lo, m_hi, l_lo, l_hi, KV, k, v, bars, kvh, qf,
                    pf, acc, tid, lane, g, t, row0, wg_end, Nk, off, sl2, first)
                if it + 1 < n_tiles:
                    m_lo, m_hi, l_lo, l_hi, st, ph, pst, rst, rph = tile_step(
                        it + 1, n_tiles, sn, s, st, ph, pst, rst, rph, m_lo, m_hi, l_lo, l_hi, KV, k, v, bars,
                        kvh, qf, pf, acc, tid, lane, g, t, row0, wg_end, Nk, off, sl2, first)
        else:
            for it in range(n_tiles):
                m_lo, m_hi, l_lo, l_hi, st, ph, pst, rst, rph = tile_step(
                    it, n_tiles, s, sn, st, ph, pst, rst, rph, m_lo, m_hi, l_lo, l_hi, KV, k, v, bars, kvh, qf,
                    pf, acc, tid, lane, g, t, row0, wg_end, Nk, off, sl2, first)

        if pingpong:  # the other consumer's last turn (its last P·V); this consumer's last P·V retired
            turn_pass(first)
            wait_o(acc, acc)
        if not tma:
            cp_async_wait(0)
        if varlen:  # the view made here, not kept live through the loop (q0: one register)
            o = rows_head_major(o, q0, Nq)
        store(o, bh, r_lo, acc, 0, l_lo, l_hi, Nq, t)
        return st, ph

    @device
    def produce(KV, k, v, bars, blk0, kvh, buf, ph, loaded, Nq, Nk, off):
        """ws: the producer's thread 0 brings every K/V tile of one work item (query rows ``blk0 ..``,
        KV head ``kvh``) into the ring, waiting only on the empty barriers. ``buf``/``ph``: the next
        tile's stage and phase parity; ``loaded``: tiles this block brought before (a stage is free at
        once only while fewer than ``STAGES`` were). Returns the three after the item's last tile."""
        n = (ends(blk0, blk0, Nq, Nk, off)[0] + Bc - 1) // Bc
        for it in range(n):
            if loaded + it >= STAGES:  # the stage's previous tile (the phase before) is released
                mbarrier_wait(bars, STAGES + buf, ph ^ 1)
            tma_tile(KV, k, v, bars, it, buf, kvh)
            buf, ph = advance(buf, ph)
        return buf, ph, loaded + n

    @device
    def first_item(NQB):
        """persistent: this block's first work item (query block ``qb`` counted from the last, head-batch
        ``bh``): item ``blockIdx.x`` of the (B·H, NQB) items, qb fastest; no division."""
        qb = cuda.blockIdx.x
        bh = 0
        while qb >= NQB:
            qb -= NQB
            bh += 1
        return qb, bh

    @device
    def next_item(qb, bh, NQB):
        """persistent: the work item ``gridDim.x`` items after (qb, bh)."""
        qb += cuda.gridDim.x
        while qb >= NQB:
            qb -= NQB
            bh += 1
        return qb, bh

    def body(q, k, v, o, sl2, H, Nq, Nk):
        # the K/V ring: dynamic shared memory padded up to a 1024-byte boundary
        base = dynamic_tile(0, 1, 4)
        pad = ((ALIGN_BYTES - (shared_address(base) & (ALIGN_BYTES - 1))) & (ALIGN_BYTES - 1)) // 4
        KV = dynamic_tile(pad, KVR, 4)  # float32 view, used only through addresses
        tid = cuda.threadIdx.x
        warp = tid // 32
        if uniform:  # lane 0's warp index, the same as every lane's: known warp-uniform to ptxas
            warp = shfl_sync(FULL_MASK, warp, 0)
        lane = cuda.laneid  # 32-bit (tid % 32 is 64-bit: three consumers at D=64 spilled its high word)
        g = lane // 4
        t = lane % 4
        # grid (query blocks, heads, batch): no run-time integer division (a 64-bit
        # division is a subroutine call, and any call makes ptxas serialize wgmma)
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        bh = b * H + h
        kvh = b * (H // G) + h // G  # G: compile-time
        if varlen:  # sequence b: its lengths, its Q rows as a head-major view (H, Nq, ·)
            q0, Nq, k0, Nk = varlen_spans(Nq, Nk)
            if cuda.blockIdx.x * Br >= Nq:
                return
            q = rows_head_major(q, q0, Nq)
            bh = h
            kvh = k0 * (H // G) + h // G  # the packed ring copy's first row: key k0 of head h // G
        else:
            q0 = 0  # (the store's view of the packed rows: varlen only)
        blk0 = cuda.blockIdx.x * Br
        wg0 = blk0 + 64 * (warp // 4)  # first query row of this warpgroup
        row0 = blk0 + 16 * warp  # first query row of this warp
        off = Nk - Nq
        if tma:
            bars = cuda.shared.array(NBARS, uint64)
            if tid == 0:
                tensormap_fence_acquire(k)
                tensormap_fence_acquire(v)
                for st in range(STAGES):
                    mbarrier_init(bars, st, 1)  # full: thread 0's arrival and the tile's bytes
                    mbarrier_init(bars, STAGES + st, W)  # empty: one arrival per warp
                fence_proxy_async()  # the initialised barriers visible to the async proxy (TMA's complete_tx)
            cuda.syncthreads()
        else:
            bars = KV  # no barriers without the TMA ring (tile_step's argument, never used)
        first = False  # pingpong: consumer 0
        if ws:
            if warp < 4:  # the producer warpgroup: few registers; thread 0 loads every tile of the block
                if REGS:
                    setmaxnreg_dec(P_REGS)
                if tid == 0:
                    buf = 0  # the next tile's stage and phase parity, carried (across work items: persistent)
                    ph = 0
                    if persistent:
                        loaded = 0  # tiles this block has loaded: the ring's stages are in use from the first
                        NQB = (Nq + Br - 1) // Br  # Br: compile-time, no division call
                        qb, bh = first_item(NQB)
                        while bh < q.shape[0]:  # (B·H, Nq, D/2): every work item of this block
                            buf, ph, loaded = produce(KV, k, v, bars, (NQB - 1 - qb) * Br, bh // G, buf, ph,
                                                      loaded, Nq, Nk, off)
                            qb, bh = next_item(qb, bh, NQB)
                    else:
                        produce(KV, k, v, bars, blk0, kvh, buf, ph, 0, Nq, Nk, off)
                return
            if REGS:
                setmaxnreg_inc(C_REGS)
            warp = warp - 4  # consumer warps 0 .. W-1
            wg0 = blk0 + 64 * (warp // 4)
            row0 = blk0 + 16 * warp
            first = warp < 4  # pingpong: consumer 0 (consumer c's turn: named barrier PP_BAR + c)

        st = 0  # tile it's ring stage and the phase parity of its full barrier, carried (advance; CARRY)
        ph = 0
        if persistent:  # the block's work items one after another, the ring state carried from one to the next
            NQB = (Nq + Br - 1) // Br
            qb, bh = first_item(NQB)
            while bh < q.shape[0]:
                blk0 = (NQB - 1 - qb) * Br
                st, ph = consume(q, o, KV, k, v, bars, blk0, blk0 + 64 * (warp // 4), blk0 + 16 * warp, bh, bh // G,
                                 st, ph, tid, lane, g, t, Nq, Nk, off, sl2, first, q0)
                qb, bh = next_item(qb, bh, NQB)
        else:
            consume(q, o, KV, k, v, bars, blk0, wg0, row0, bh, kvh, st, ph, tid, lane, g, t, Nq, Nk, off, sl2, first,
                    q0)

    name = "pingpong" if pingpong else ("warp_specialized_tc" if ws else ("tma_wgmma" if tma else "tc_wgmma"))
    name = name + "_overlap" if overlap else name
    name = name + "_persistent" if persistent else name
    body.__name__ = body.__qualname__ = name + ("_varlen" if varlen else "")
    if ws:
        return kernel(body, launch_bounds=(128 * (WG + 1), 1))
    # Above 256 threads (3 warpgroups: 65536 / 384 = 170 registers a thread) the block size goes to ptxas
    # as launch bounds, so that it keeps within the registers the block may have: without them, 3 warpgroups
    # at D=128 causal with Bc=64 and 3-4 stages (190 registers) or Bc=128 (233) did not launch on an H200
    # (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, tuning run of results/archive/2026-11-22-tune-scale) although
    # supports() accepted them; varlen at D=128 causal: 195 → 168, no spills. At 256 threads and below a
    # bound only costs registers (D=64: 125 → 144, one block per SM instead of two), so there is none.
    return kernel(body, launch_bounds=(NTH,)) if NTH > 256 else kernel(body)


WS_PRODUCER_REGS = 40  # registers per thread the producer warpgroup keeps (it only issues TMA loads)
WS_PRODUCER_REGS_3 = 32  # the same beside three consumer warpgroups (FlashAttention-3's 32/160 split)


def ws_producer_regs(WG: int) -> int:
    """Registers per thread the producer keeps beside ``WG`` consumer warpgroups: 40, or 32 beside three, whose
    128-key tiles at D=64 need 160 each (152 spilled 8-16 bytes)."""
    return WS_PRODUCER_REGS_3 if WG >= 3 else WS_PRODUCER_REGS


def ws_consumer_regs(WG: int) -> int:
    """Registers per thread of the ``WG`` consumer warpgroups after the producer gave its own back:
    the 64K registers of an SM over 128-thread warpgroups, ``ws_producer_regs(WG) + WG·N <= 512``,
    N a multiple of 8, at most 240 (FlashAttention-3's split for two consumers: 240/24; here 232/40)."""
    return min(240, (512 - ws_producer_regs(WG)) // max(WG, 1) // 8 * 8)


def wgmma_smem_bytes(D, Bc, stages):
    """The K/V ring (rows of :func:`padded_columns` elements) plus the 1024 bytes of alignment padding."""
    return 2 * stages * Bc * padded_columns(D) * 2 + ALIGN_BYTES


def resolve_wgmma(problem, warpgroups, Bc, stages):
    """warpgroups=0 picks the warpgroups per block: 3 at D=128 (168 registers: one
    384-thread block per SM), 2 otherwise (126 registers at D=64: two 256-thread blocks
    per SM; above D=128 a thread needs more than the 170 registers three warpgroups
    may have); see docs/tensor-core-notes.md for the runs behind the choice."""
    if warpgroups < 0:
        raise ValueError("warpgroups (per block) must be at least 1 (0: by head_dim)")
    return {"warpgroups": warpgroups or (3 if problem.head_dim == 128 else 2), "Bc": Bc, "stages": stages}


def supports_wgmma(problem, warpgroups, Bc, stages, min_stages):
    D = problem.head_dim
    reason = supports_tc(problem, Bc, max_d=None)
    if reason:
        return reason
    if Bc > 256 or Bc % 16:
        return f"Bc={Bc}: wgmma N must be a multiple of 16 up to 256"
    if warpgroups > 2 and D > 128:
        return (f"warpgroups={warpgroups} at head_dim {D}: above D=128 a thread needs more registers than "
                f"{warpgroups}·128 threads may have (65536 per SM); use warpgroups ≤ 2")
    if stages < min_stages:
        return f"stages must be at least {min_stages}" + (
            " (tile j+1 resident while tile j is read)" if min_stages > 2 else "")
    return smem_reason(wgmma_smem_bytes(D, Bc, stages))


TWO_CONSUMERS = 2  # pingpong, ws_overlap: two consumer warpgroups and the producer (384 threads)


def resolve_two_consumers(problem, warpgroups, Bc, stages, **_):
    """``resolve`` of the phases built on exactly two consumer warpgroups (warpgroups=0: two)."""
    if warpgroups < 0:
        raise ValueError("warpgroups (consumer warpgroups per block) must be 2 (0: automatic)")
    return {"warpgroups": warpgroups or TWO_CONSUMERS, "Bc": Bc, "stages": stages}


def two_consumers_reason(problem, warpgroups, Bc, stages, why, min_stages):
    """Why a phase of exactly two consumer warpgroups (``why``: what needs the two) cannot run
    ``problem`` (None when it can): head_dim up to 128, then the wgmma and TMA ring rules."""
    if warpgroups != TWO_CONSUMERS:
        return f"warpgroups={warpgroups}: {why} exactly {TWO_CONSUMERS} consumer warpgroups"
    if problem.head_dim > 128:
        return (f"head_dim {problem.head_dim}: two consumer warpgroups (384 threads: 168 registers at entry, 232 "
                "after setmaxnreg) are checked free of spills up to D=128 only; use warp_specialized_tc")
    return (supports_wgmma(problem, warpgroups, Bc, stages, min_stages=min_stages)
            or tma_smem_reason(problem, Bc, stages))


TMA_ALIGN_BYTES = 16  # TMA: global address and every stride but the innermost a multiple of 16 bytes


def tma_smem_reason(problem, Bc, stages):
    """Why the ``tma`` kernel cannot run ``problem`` (None when it can): K/V rows of a multiple
    of 16 bytes (TMA strides), the ring plus its 2·stages mbarriers (8 bytes each) within the
    shared memory of a block."""
    row = problem.head_dim * 2
    if row % TMA_ALIGN_BYTES:
        return f"TMA needs K/V rows of a multiple of {TMA_ALIGN_BYTES} bytes, head_dim {problem.head_dim} has {row}"
    return smem_reason(wgmma_smem_bytes(problem.head_dim, Bc, stages) + 16 * stages)
_TMAPS: dict = {}  # (address, shape, strides, box, swizzle) -> tensor map
_MAX_TMAPS = 64


def tma_box(D: int, Bc: int):
    """(box, swizzle) of the K/V tensor maps of the ``tma`` wgmma kernel: one column block of a
    swizzled ring tile (:func:`numba_attn.gpu.wgmma.row_bytes` of the padded width) as 32-bit
    words of the (B·Hkv, N, D/2) uint32 view: ``(1, Bc, rb/4)`` with the ``rb``-byte swizzle
    (128 for D ≥ 64, 64/32 for D = 32/16). Columns past D (padded head dims) are zero-filled."""
    rb = row_bytes(padded_columns(D))
    return (1, Bc, rb // 4), rb


def _address(a) -> int:
    """The device address of a device array (numba), or of the host memory behind a simulator or
    NumPy array (the offline compile's stand-ins)."""
    if hasattr(a, "device_ctypes_pointer"):
        return int(a.device_ctypes_pointer.value or 0)
    return int(np.asarray(getattr(a, "_ary", a)).__array_interface__["data"][0])


def kv_tensor_map(a, box, swizzle):
    """The tensor map (:func:`numba_attn.gpu.tma.tensor_map`) of the device array ``a``, cached by
    (address, shape, strides, box, swizzle) in a small bounded dict: a repeated call with the same
    memory encodes and allocates nothing. Raises ValueError when the address is not 16-byte aligned."""
    addr = _address(a)
    key = (addr, tuple(a.shape), tuple(a.strides), box, swizzle)
    m = _TMAPS.get(key)
    if m is None:
        if addr % TMA_ALIGN_BYTES:
            raise ValueError(f"TMA needs K/V at a {TMA_ALIGN_BYTES}-byte aligned address, got {addr:#x} "
                             f"(misaligned by {addr % TMA_ALIGN_BYTES} bytes)")
        if len(_TMAPS) >= _MAX_TMAPS:
            _TMAPS.clear()
        m = _TMAPS[key] = _tma.tensor_map(a, box, swizzle)
    return m


def build_wgmma(problem, warpgroups, Bc, stages, overlap, varlen=False, tma=False, ws=False, pingpong=False,
                uniform=False, blocks=None):
    """The :class:`Launch` of the wgmma kernel: grid (query blocks, heads, batch), the ring in
    dynamic shared memory (opt-in made at the first launch), and the uint32 views of the last
    few input sets cached (making views costs host time at every launch). ``varlen``: the packed
    layout; ``run(q, k, v, o, stream, layout=None)`` takes the call's (cu_seqlens_q, cu_seqlens_k)
    device arrays as ``layout`` (else the problem's own, :class:`VarlenLayout`) in place of the
    lengths, and the grid covers the longest sequence (``q_len``). ``tma``: K and V are passed as
    tensor maps of their uint32 views (:func:`kv_tensor_map`, cached with the views). ``ws``:
    ``warpgroups`` consumer warpgroups plus the producer warpgroup per block; ``pingpong``: the two
    consumers take turns at the tensor cores; ``uniform``: the warp index known warp-uniform
    (:func:`make_wgmma_kernel`), off by default; ``blocks`` (with ``ws``; None: not persistent): persistent
    blocks, a grid of ``blocks`` (0: one per SM) each running every ``blocks``-th work item, never more blocks
    than items."""
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    D = problem.head_dim
    kern = make_wgmma_kernel(D, warpgroups, Bc, stages, problem.group, problem.causal,
                             problem.dtype == "bfloat16", overlap, varlen, tma, ws, pingpong,
                             uniform=uniform, persistent=blocks is not None)
    box, swizzle = tma_box(D, Bc)
    sl2 = float32(problem.sm_scale * LOG2E)
    Br = 64 * warpgroups
    grid = ((Nq + Br - 1) // Br, H, problem.batch)
    if blocks is not None:  # persistent: at most one block per work item
        if blocks < 0:
            raise ValueError(f"blocks (persistent blocks) must be at least 1, or 0 for one per SM; got {blocks}")
        grid = (min(blocks or sm_count(), grid[0] * H * problem.batch), 1, 1)
    nbytes = wgmma_smem_bytes(D, Bc, stages)
    own = VarlenLayout(problem) if varlen else None
    nthreads = 128 * (warpgroups + 1 if ws else warpgroups)  # ws: the producer warpgroup too

    views = {}  # uint32 views of the last few input sets: making views costs host time at every launch
    opted = []  # the >48 KiB opt-in is made once, at the first launch

    def run(q, k, v, o, stream=0, layout=None):
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            if len(views) >= 8:
                views.clear()
            args = u32_views(q, k, v, o)
            if tma:
                args = (args[0], kv_tensor_map(args[1], box, swizzle), kv_tensor_map(args[2], box, swizzle), args[3])
            hit = views[key] = ((q, k, v, o), args)
        lengths = (layout or own.own()) if varlen else (Nq, Nk)
        if opted:
            kern[grid, nthreads, stream, nbytes](*hit[1], sl2, H, *lengths)
        else:
            launch_dynamic(kern, grid, nthreads, stream, nbytes, *hit[1], sl2, H, *lengths)
            opted.append(True)

    # tma: the kernel reaches K/V through tensor maps (their addresses inside): a launch recorded at
    # one call cannot be replayed at another call's addresses
    return Launch(run, kernels=[kern], replayable=not tma)


class VarlenLayout:
    """The cu_seqlens a varlen launch reads: a call's own (``attention_varlen``) or, when a call
    gives none (the runner), the problem's :meth:`VarlenProblem.layout`, uploaded once."""

    def __init__(self, problem):
        self.problem = problem
        self._own = None

    def own(self):
        if self._own is None:
            self._own = tuple(cuda.to_device(a) for a in self.problem.layout())
        return self._own


def launch_mma_varlen(problem, kern, Br, warps):
    """The :class:`Launch` of the varlen mma.sync kernel: grid (query blocks of the longest
    sequence, heads, sequences); ``run(q, k, v, o, stream, layout=None)`` with q, o (total_q, H, D),
    k, v (total_k, Hkv, D) and ``layout`` the (cu_seqlens_q, cu_seqlens_k) device arrays (else the
    problem's own)."""
    H = problem.heads
    sl2 = float32(problem.sm_scale * LOG2E)
    grid = ((problem.q_len + Br - 1) // Br, H, problem.batch)
    own = VarlenLayout(problem)

    def run(q, k, v, o, stream=0, layout=None):
        cu_q, cu_k = layout or own.own()
        kern[grid, 32 * warps, stream](*u32_views(q, k, v, o), sl2, H, problem.group, cu_q, cu_k)

    return Launch(run, kernels=[kern])
