"""The wgmma backward's kernels by role, shared by ``bwd_wgmma`` and ``bwd_wgmma_overlap`` (which differ only in
their tile steps, the schedule each passes in) and, for its row statistics, products, element-wise stages and
walk, by ``bwd_wgmma_fused``:

* :func:`make_row_stats` — lse and Delta = rowsum(dO∘O) per query row, padded to whole Q tiles (the ring copies them);
* :func:`make_products` — X·Yᵀ from shared memory (``make_wgmma_ss``), acc += (register A)·(a ring tile, transposed),
  the waits, the accumulator → A-fragment packing;
* :func:`kv_elementwise`, :func:`q_elementwise` — P and dS of a tile in each kernel's accumulator layout, with a
  variant's mask and score functions;
* :func:`kv_walk`, :func:`make_q_ring` — a key block's walk over the Q tiles of its KV head's query heads (a
  mask's column lists) and the cp.async ring that brings them; :func:`make_kv_store` — dK_j, dV_j written out;
* :func:`make_grad_kv`, :func:`make_grad_q` — the kernels: a warpgroup of 64 keys walking Q tiles (the block mask's
  column lists with a mask function), a warpgroup of 64 query rows walking key tiles (its row lists), tiles through
  a cp.async ring; a tile step ``schedule(D, N, STAGES, causal, bf16, stage, dmod)`` computes each tile;
* :func:`launch_backward`, :func:`wgmma_registration` — the launch and the registration keywords.

and the roles the one-kernel phases (``bwd_wgmma_fused`` and its child ``bwd_wgmma_ss``) share:

* :func:`make_scores_issue` — a warpgroup's Sᵀ and dPᵀ issued; :func:`make_dq_staging` — a dQ half staged, the
  warpgroup's partial added to the float32 accumulator by a bulk reduction; :func:`make_dq_finish` — dQ written
  from the accumulator;
* :func:`resolve_bc`, :func:`fused_reason`, :func:`launch_fused` — the block size, the supports check and the
  launch (the row statistics, the phase's kernel, the finish).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.bulk import bulk_commit, bulk_reduce_add_f32
from numba_attn.gpu.cp_async import cp_async16_flat
from numba_attn.gpu.intrinsics import (cp_async_commit, cp_async_wait, pack_bf16x2, pack_f16x2, unpack_bf16x2,
                                       unpack_f16x2)
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.loads import ld_f32x4, lds2, st_f32x4, st_shared_f32x4
from numba_attn.gpu.mbarrier import fence_proxy_async
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, smem_reason
from numba_attn.gpu.warp import group_sum
from numba_attn.gpu.warpspec import named_barrier_sync
from numba_attn.gpu.wgmma import (kmajor_params, make_ring_copy, make_wgmma_rs, make_wgmma_ss, make_wgmma_wait,
                                  mnmajor_params, row_bytes)
from numba_attn.phases.backward.b02_bwd_mma import visible
from numba_attn.phases.backward.common import (backward_launch, first_q_head, first_q_tile, keys_of_row, kv_head,
                                               one, score_grad_stage, tiled_mask_stage, variant_reason)
from numba_attn.phases.tensor_core.pipeline import ALIGN_BYTES, cp_async_ring, ring_padding
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.stages import FULL, PLAIN
LOG2E = float32(1.4426950408889634)
M = 64  # rows of a wgmma (keys of a dK/dV block, query rows of a dQ block): one warpgroup
THREADS = 128


def tile_bytes(rows: int, D: int) -> int:
    """A swizzled tile of ``rows`` rows of D 16-bit elements."""
    return rows * D * 2


def smem_bytes(D: int, N: int, stages: int) -> int:
    """A block's dynamic shared memory: its own two 64-row tiles (K_j, V_j or Q_i, dO_i), the ring of ``stages``
    pairs of N-row tiles and (dK/dV) their rows' lse and Delta, the 1024 bytes of alignment padding."""
    return 2 * tile_bytes(M, D) + 2 * stages * tile_bytes(N, D) + stages * 2 * N * 4 + ALIGN_BYTES


def padded_rows(Nq: int, Br: int) -> int:
    """The rows of the row statistics: Nq rounded up to whole Q tiles (the ring copies whole 16-byte chunks)."""
    return (Nq + Br - 1) // Br * Br


@functools.cache
def make_row_stats(D: int, bf16: bool):
    """``row_stats(o, do, lse, st, Nq)``: st[bh, 0, i] = lse_i·log2(e) (the element-wise stages work in base 2:
    P = exp2(S·scale·log2(e) − lse_i·log2(e)), one FFMA and one ex2 a score) and st[bh, 1, i] = Delta_i =
    Σ_d dO_id·O_id, zeros
    from Nq to the padded end. D/8 lanes share a row (each reads every (D/8)-th word: the group's reads are
    contiguous), summed by a butterfly over the group; grid (padded rows / (1024/D), B·H) of 128 threads."""
    LANES = D // 8
    ROWS = THREADS // LANES
    DW = D // 2
    unpack = unpack_bf16x2 if bf16 else unpack_f16x2

    @kernel
    def row_stats(o, do, lse, st, Nq):
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x * ROWS + tid // LANES
        lane = tid % LANES
        bh = cuda.blockIdx.y
        acc = float32(0.0)
        if i < Nq:
            for m in range(DW // LANES):
                o0, o1 = unpack(o[bh, i, lane + LANES * m])
                d0, d1 = unpack(do[bh, i, lane + LANES * m])
                acc += o0 * d0 + o1 * d1
        acc = group_sum(acc, LANES)  # (every lane: the butterfly is warp-wide)
        if lane == 0 and i < st.shape[2]:
            st[bh, 0, i] = lse[bh, i] * LOG2E if i < Nq else float32(0.0)
            st[bh, 1, i] = acc

    return row_stats, ROWS


@functools.cache
def make_products(bf16: bool, N: int, D: int, STAGES: int):
    """What both kernels' tile steps use, ``(issue_scores, wait_two, pack, accumulate)``: X·Yᵀ issued from shared
    memory (a block's own 64-row tile at byte ``a_off`` as A, the ring's stage as K-major B of N rows; fresh, not
    waited for), the wait for two such products, 2·(N/8) accumulators packed into N/4 A registers, and
    acc += (A registers)·(an N-row ring tile, transposed: MN-major B), issued (not waited for)."""
    kind = "bf16" if bf16 else "f16"
    rb = row_bytes(D)
    offs, lbo, sbo = kmajor_params(N, D // 16, rb)
    issue_scores = make_wgmma_ss(kind, N, False, True, offs, lbo, sbo, rb, False)
    wait_two = make_wgmma_wait(0, N // 2, N // 2)
    pack2 = pack_bf16x2 if bf16 else pack_f16x2
    acc_offs, acc_lbo, acc_sbo = mnmajor_params(N, N // 16, rb)
    accumulate = make_wgmma_rs(kind, D, True, False, acc_offs, acc_lbo, acc_sbo, rb, False)

    @device
    def pack(af, acc):
        """af[4s + r] = acc[8s + 2r], acc[8s + 2r + 1] as one register: the accumulator layout of k-step s
        (columns 16s ..) is the A fragment's (PTX ISA, wgmma register fragments)."""
        for i in range(N // 4):
            af[i] = pack2(acc[2 * i], acc[2 * i + 1])

    return issue_scores, wait_two, pack, accumulate


@functools.cache
def kv_elementwise(Br: int, causal: bool, stage=PLAIN, dmod=one):
    """``(probabilities, score_grads)`` of a dK/dV tile in the transposed accumulator layout (rows = keys j_lo,
    j_lo + 8 of this lane, columns = the tile's query rows i0 + 8nt + 2t + c, their lse and Delta in ``rows``):
    Pᵀ = exp(Sᵀ·scale − lse_i) in place, computed in base 2 (``rows`` hold lse_i·log2(e))
    (0 where row i does not see key j, by the causal bound or the variant
    ``stage``'s mask function on a PARTIAL tile: ``var = (b, h, kind, mods)``), then dSᵀ = Pᵀ∘(dPᵀ − Delta_i). A score
    function: Pᵀ = exp(score_mod(Sᵀ·scale) − lse_i), its derivative ``dmod`` at Sᵀ·scale kept in ``Gt`` for
    dSᵀ = Pᵀ∘(dPᵀ − Delta_i)∘score_mod'."""
    SCORED = stage.scored

    @device
    def probabilities(St, Gt, rows, sb, i0, j_lo, t, Nq, Nk, scale, var):
        b, h, kind, mods = var
        scale2 = scale * LOG2E
        # every score of this lane visible (the tile's rows and the lane's keys in range, below the causal
        # diagonal, no mask function on the tile): no test per score
        inside = (i0 + Br <= Nq and j_lo + 8 < Nk and (not causal or j_lo + 8 <= i0 + Nk - Nq)
                  and kind == FULL and not SCORED)
        if inside:
            for nt in range(Br // 8):
                lse_pair = lds2(rows, 2 * sb, 8 * nt + 2 * t)  # rows 8nt + 2t and + 1: one 8-byte load
                for c in range(2):
                    for hi in range(2):
                        x = 4 * nt + 2 * hi + c
                        St[x] = math.exp2(St[x] * scale2 - lse_pair[c])
            return
        for nt in range(Br // 8):
            lse_pair = lds2(rows, 2 * sb, 8 * nt + 2 * t)
            for c in range(2):
                r = 8 * nt + 2 * t + c
                lse_i = lse_pair[c]
                for hi in range(2):
                    x = 4 * nt + 2 * hi + c
                    j = j_lo + 8 * hi
                    p = float32(0.0)
                    grad = float32(0.0)
                    if visible(i0 + r, j, Nq, Nk, causal) and (kind == FULL or
                                                               stage.visible(b, h, i0 + r + Nk - Nq, j, mods)):
                        if SCORED:
                            sc = St[x] * scale
                            p = math.exp2(stage.modified(sc, b, h, i0 + r + Nk - Nq, j, mods) * LOG2E - lse_i)
                            grad = dmod(sc, b, h, i0 + r + Nk - Nq, j, mods)
                        else:
                            p = math.exp2(St[x] * scale2 - lse_i)
                    St[x] = p
                    if SCORED:
                        Gt[x] = grad

    @device
    def score_grads(Pt, dPt, Gt, rows, sb, t):
        for nt in range(Br // 8):
            delta_pair = lds2(rows, 2 * sb + 1, 8 * nt + 2 * t)
            for c in range(2):
                delta_i = delta_pair[c]
                for hi in range(2):
                    x = 4 * nt + 2 * hi + c
                    ds = Pt[x] * (dPt[x] - delta_i)
                    dPt[x] = ds * Gt[x] if SCORED else ds

    return probabilities, score_grads


@functools.cache
def q_elementwise(Bc: int, causal: bool, stage=PLAIN, dmod=one):
    """``(probabilities, score_grads)`` of a dQ tile (rows r_lo, r_lo + 8 of this lane with their lse and Delta,
    keys j0 + 8nt + 2t + c): P = exp(S·scale − lse) in place (0 where masked, ``var`` as for the dK/dV tile), then
    dS = P∘(dP − Delta) in place (a score function: as for the dK/dV tile, its derivative in ``G``)."""
    SCORED = stage.scored

    @device
    def probabilities(S, G, j0, r_lo, lse_lo, lse_hi, t, Nq, Nk, scale, var):
        b, h, kind, mods = var
        scale2 = scale * LOG2E  # (lse_lo, lse_hi: lse·log2(e))
        # every score of this lane visible (its rows and the tile's keys in range, below the causal diagonal, no
        # mask function on the tile): no test per score
        inside = (r_lo + 8 < Nq and j0 + Bc <= Nk and (not causal or j0 + Bc - 1 <= r_lo + Nk - Nq)
                  and kind == FULL and not SCORED)
        if inside:
            for nt in range(Bc // 8):
                for x4 in range(4):
                    x = 4 * nt + x4
                    S[x] = math.exp2(S[x] * scale2 - (lse_hi if x4 // 2 else lse_lo))
            return
        for nt in range(Bc // 8):
            for x4 in range(4):
                hi, c = x4 // 2, x4 % 2
                x = 4 * nt + x4
                i, j = r_lo + 8 * hi, j0 + 8 * nt + 2 * t + c
                p = float32(0.0)
                grad = float32(0.0)
                if visible(i, j, Nq, Nk, causal) and (kind == FULL or stage.visible(b, h, i + Nk - Nq, j, mods)):
                    if SCORED:
                        sc = S[x] * scale
                        p = math.exp2(stage.modified(sc, b, h, i + Nk - Nq, j, mods) * LOG2E
                                      - (lse_hi if hi else lse_lo))
                        grad = dmod(sc, b, h, i + Nk - Nq, j, mods)
                    else:
                        p = math.exp2(S[x] * scale2 - (lse_hi if hi else lse_lo))
                S[x] = p
                if SCORED:
                    G[x] = grad

    @device
    def score_grads(P, dP, G, dl_lo, dl_hi):
        for nt in range(Bc // 8):
            for x4 in range(4):
                x = 4 * nt + x4
                ds = P[x] * (dP[x] - (dl_hi if x4 // 2 else dl_lo))
                dP[x] = ds * G[x] if SCORED else ds

    return probabilities, score_grads


@functools.cache
def kv_walk(Br: int, stage=PLAIN):
    """``(first, following, q_tile_of)``: the walk of a key block over the Q tiles of Br rows of its KV head's
    query heads, head after head. ``walk = (G, t0, n_plain, b, h0, kb, mods)``: G query heads from head h0 of
    batch b, Q tiles from t0 (the causal start), n_plain of them without a mask function; with one, the tiles its
    block mask's column lists give for key block kb. A position is ``(hq, idx, n)``: the idx-th of the n tiles
    query head hq visits; ``hq == G`` when the walk is done."""

    @device
    def head_tiles(hq, walk):
        """How many Q tiles query head ``hq`` of the KV head visits for this key block (0 past the last head)."""
        G, t0, n_plain, b, h0, kb, mods = walk
        if hq >= G:
            return 0
        return stage.loop_keys(mods, b, h0 + hq, kb, n_plain * Br, Br) // Br

    @device
    def visited(pos, walk):
        """The walk's first visited tile from ``pos = (hq, idx, n)`` on: the next head's first where hq's are
        done, ``hq == G`` when none is left."""
        hq, idx, n = pos
        while hq < walk[0] and idx >= n:
            hq += 1
            idx = 0
            n = head_tiles(hq, walk)
        return hq, idx, n

    @device
    def first(walk):
        """The walk's first visited tile."""
        return visited((0, 0, head_tiles(0, walk)), walk)

    @device
    def following(pos, walk):
        """The visited tile after ``pos``."""
        return visited((pos[0], pos[1] + 1, pos[2]), walk)

    @device
    def q_tile_of(pos, walk):
        """The Q tile (its index) at ``pos``: t0 + idx, or the idx-th of the column's list."""
        G, t0, n_plain, b, h0, kb, mods = walk
        return stage.tile_start(mods, b, h0 + pos[0], kb, (t0 + pos[1]) * Br, Br) // Br

    return first, following, q_tile_of


@functools.cache
def make_q_ring(D: int, Br: int, STAGES: int, NTH: int, causal: bool, stage=PLAIN):
    """``(walk_of, fill, advance, following, q_tile_of, ready, refill)``: the ring of Q tiles a key block walks
    (:func:`kv_walk`), copied by ``NTH`` threads (cp.async): Q_i, dO_i into ring stage sb and the rows' lse and
    Delta into ``rows[2·sb]``, ``rows[2·sb + 1]`` (2·Br/4 threads, a 16-byte chunk each).
    ``to = (ring, rows, q, do, st, tid, Nq)``.

    * ``walk_of(jb, kb, kvh, H, G, Nq, Nk, mods) -> (walk, bh0, b)``: the walk of key block kb (first key jb) of
      KV head kvh: Q tiles from the first that sees a key of the block (causal; a mask function's lists hold
      that bound), over its G query heads from head bh0 of batch b (divisions once, none in the loop);
    * ``fill(walk, bh0, to) -> (cur, nxt, sb_next)``: the first STAGES − 1 visited tiles issued, a commit group
      each (the block's own tiles, issued before, join the first);
    * ``advance(nxt, sb_next, walk, bh0, to) -> (nxt, sb_next)``: the tile computed next has landed for every
      thread (its wait, a block barrier: every warp is done with the tile before, whose stage is refilled), then
      the next visited tile issued: ``ready()`` then ``refill(nxt, sb_next, walk, bh0, to)``, which a kernel may
      also call apart (the copies issued under the tile's first products)."""
    first, following, q_tile_of = kv_walk(Br, stage)
    copy_ring = make_ring_copy(D, Br, STAGES, NTH)  # Q_i then dO_i buffers
    CHUNKS = Br // 4  # 16-byte chunks of a tile's lse (and of its Delta)
    WAIT = STAGES - 2  # copy groups that may stay in flight when tile it is needed (a compile-time constant)

    @device
    def copy_q_tile(bh, tile, sb, to):
        ring, rows, q, do, st, tid, Nq = to
        copy_ring(ring, q, do, tile, sb, tid, bh, Nq)
        if tid < 2 * CHUNKS:
            which, c = tid // CHUNKS, tid % CHUNKS
            cp_async16_flat(rows, (2 * sb + which) * Br + 4 * c, st,
                            (bh * 2 + which) * st.shape[2] + tile * Br + 4 * c, True)

    LISTED = stage.active

    @device
    def walk_of(jb, kb, kvh, H, G, Nq, Nk, mods):
        t0 = 0 if LISTED else first_q_tile(jb, Nq, Nk, causal, Br) // Br
        bh0 = first_q_head(kvh, H, G)
        b = bh0 // H
        return (G, t0, (Nq + Br - 1) // Br - t0, b, bh0 - b * H, kb, mods), bh0, b

    @device
    def fill(walk, bh0, to):
        cur = first(walk)  # the tile computed next
        nxt = cur  # the tile issued next (STAGES - 1 ahead)
        sb_next = 0
        for _ in range(STAGES - 1):
            if nxt[0] < walk[0]:
                copy_q_tile(bh0 + nxt[0], q_tile_of(nxt, walk), sb_next, to)
                nxt = following(nxt, walk)
            cp_async_commit()
            sb_next = sb_next + 1 if sb_next + 1 < STAGES else 0
        return cur, nxt, sb_next

    @device
    def ready():
        cp_async_wait(WAIT)  # the tile computed next has landed (this thread's copies) ...
        cuda.syncthreads()  # ... every thread's

    @device
    def refill(nxt, sb_next, walk, bh0, to):
        if nxt[0] < walk[0]:
            copy_q_tile(bh0 + nxt[0], q_tile_of(nxt, walk), sb_next, to)
            nxt = following(nxt, walk)
        cp_async_commit()
        return nxt, (sb_next + 1 if sb_next + 1 < STAGES else 0)

    @device
    def advance(nxt, sb_next, walk, bh0, to):
        ready()
        return refill(nxt, sb_next, walk, bh0, to)

    return walk_of, fill, advance, following, q_tile_of, ready, refill


@functools.cache
def make_kv_store(D: int, bf16: bool):
    """``store_kv(dk, dv, dK, dV, kvh, j_lo, t, Nk, scale)``: a warpgroup's dK_j (× scale: S was Q Kᵀ · scale) and
    dV_j accumulators (rows j_lo, j_lo + 8 of this lane) into dk, dv in the inputs' dtype, two columns a word."""
    store2 = pack_bf16x2 if bf16 else pack_f16x2

    @device
    def store_kv(dk, dv, dK, dV, kvh, j_lo, t, Nk, scale):
        for dt in range(D // 8):
            c = 4 * dt + t
            for hi in range(2):
                j = j_lo + 8 * hi
                if j < Nk:
                    dk[kvh, j, c] = store2(dK[4 * dt + 2 * hi] * scale, dK[4 * dt + 2 * hi + 1] * scale)
                    dv[kvh, j, c] = store2(dV[4 * dt + 2 * hi], dV[4 * dt + 2 * hi + 1])

    return store_kv


@functools.cache
def make_grad_kv(D: int, Br: int, STAGES: int, causal: bool, bf16: bool, schedule, stage=PLAIN,
                 dmod=one):
    """grad_kv: a warpgroup owns 64 keys of one KV head; Q_i/dO_i tiles of Br rows come through the ring, each
    one computed by ``schedule(D, Br, STAGES, causal, bf16, stage)``'s tile step. The walk goes over the Q tiles of
    each query head of the KV head in turn; with a mask function, the Q tiles its block mask at (Br, 64) lists for
    the key block (column lists: EMPTY tiles neither loaded nor computed nor read)."""
    kv_tile = schedule(D, Br, STAGES, causal, bf16, stage, dmod)
    copy_own = make_ring_copy(D, M, 1, THREADS)  # K_j, V_j: one "stage" of 64 rows
    walk_of, fill, advance, following, q_tile_of = make_q_ring(D, Br, STAGES, THREADS, causal, stage)[:5]
    store_kv = make_kv_store(D, bf16)
    OWN_WORDS = 2 * tile_bytes(M, D) // 4
    OWN_ROWS, RING_ROWS = 2 * tile_bytes(M, D) // 16, 2 * STAGES * tile_bytes(Br, D) // 16
    RING_WORDS = 2 * STAGES * tile_bytes(Br, D) // 4
    STAT_ROWS = 2 * STAGES  # (compile-time: a view's shape)
    NS, NA, NP = Br // 2, D // 2, Br // 4  # accumulators of Sᵀ, of dK (dV), A registers of Pᵀ (dSᵀ)
    NG = NS if stage.scored else 1  # a score function's derivatives at Sᵀ

    @kernel
    def grad_kv(q, k, v, do, st, dk, dv, scale, H, G, Nq, Nk, mods):
        """dK_j, dV_j of 64 keys of one KV head over the Q tiles of its G query heads that see them."""
        pad = ring_padding(dynamic_tile(0, 1, 4))
        own = dynamic_tile(pad, OWN_ROWS, 4)  # K_j (bytes 0 ..), V_j (64·D·2 ..)
        ring = dynamic_tile(pad + OWN_WORDS, RING_ROWS, 4)  # Q_i stages, then dO_i stages
        rows = dynamic_tile(pad + OWN_WORDS + RING_WORDS, STAT_ROWS, Br)  # per stage: the rows' lse, Delta
        tid = cuda.threadIdx.x
        w, lane = tid // 32, cuda.laneid
        g, t = lane // 4, lane % 4
        kvh = cuda.blockIdx.y
        jb = cuda.blockIdx.x * M
        copy_own(own, k, v, cuda.blockIdx.x, 0, tid, kvh, Nk)
        walk, bh0, b = walk_of(jb, cuda.blockIdx.x, kvh, H, G, Nq, Nk, mods)
        to = (ring, rows, q, do, st, tid, Nq)
        cur, nxt, sb_next = fill(walk, bh0, to)  # (K_j, V_j in the first group)
        St = cuda.local.array(NS, float32)
        dPt = cuda.local.array(NS, float32)
        pf = cuda.local.array(NP, uint32)
        dsf = cuda.local.array(NP, uint32)
        Gt = cuda.local.array(NG, float32)
        dK = cuda.local.array(NA, float32)
        dV = cuda.local.array(NA, float32)
        for e in range(NA):
            dK[e] = float32(0.0)
            dV[e] = float32(0.0)
        j_lo = jb + 16 * w + g  # this lane's keys: j_lo and j_lo + 8 (accumulator rows)
        sb = 0
        while cur[0] < G:
            nxt, sb_next = advance(nxt, sb_next, walk, bh0, to)
            h = walk[4] + cur[0]
            qt = q_tile_of(cur, walk)
            var = (b, h, stage.tile_kind(mods, b, h, qt, cuda.blockIdx.x), mods)
            kv_tile((St, dPt, pf, dsf, dK, dV, Gt), own, ring, rows, sb, qt * Br, j_lo, t, Nq, Nk, scale, var)
            sb = sb + 1 if sb + 1 < STAGES else 0
            cur = following(cur, walk)
        store_kv(dk, dv, dK, dV, kvh, j_lo, t, Nk, scale)

    return grad_kv


@functools.cache
def make_grad_q(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, schedule, stage=PLAIN,
                dmod=one):
    """grad_q: a warpgroup owns 64 query rows of one head; K_j/V_j tiles of Bc keys come through the ring, each
    one computed by ``schedule(D, Bc, STAGES, causal, bf16, stage)``'s tile step; with a mask, the visited key tiles
    of its block mask at (64, Bc) in order (EMPTY ones never loaded), as the forward's ring walks them."""
    q_tile = schedule(D, Bc, STAGES, causal, bf16, stage, dmod)
    copy_own = make_ring_copy(D, M, 1, THREADS)  # Q_i, dO_i
    copy_ring = make_ring_copy(D, Bc, STAGES, THREADS)  # K_j then V_j buffers
    store2 = pack_bf16x2 if bf16 else pack_f16x2
    OWN_WORDS = 2 * tile_bytes(M, D) // 4
    OWN_ROWS, RING_ROWS = 2 * tile_bytes(M, D) // 16, 2 * STAGES * tile_bytes(Bc, D) // 16
    NS, NA, NP = Bc // 2, D // 2, Bc // 4
    NG = NS if stage.scored else 1
    count, tile_at, kind_at = key_tiles(Bc, stage)

    @device
    def copy_kv_tile(kt, sb, to):
        ring, k, v, tid, kvh, Nk = to
        copy_ring(ring, k, v, kt, sb, tid, kvh, Nk)

    fill, refill = cp_async_ring(STAGES, Bc, copy_kv_tile, stage)

    @kernel
    def grad_q(q, k, v, do, st, dq, scale, H, G, Nq, Nk, mods):
        """dQ_i of 64 query rows of one head over the K/V tiles of Bc keys its rows see."""
        pad = ring_padding(dynamic_tile(0, 1, 4))
        own = dynamic_tile(pad, OWN_ROWS, 4)  # Q_i, dO_i
        ring = dynamic_tile(pad + OWN_WORDS, RING_ROWS, 4)  # K_j stages, then V_j stages
        tid = cuda.threadIdx.x
        w, lane = tid // 32, cuda.laneid
        g, t = lane // 4, lane % 4
        bh = cuda.blockIdx.y
        b, h = bh // H, bh % H
        kvh = kv_head(bh, H, G)
        ib = cuda.blockIdx.x * M
        copy_own(own, q, do, cuda.blockIdx.x, 0, tid, bh, Nq)
        walk = (mods, b, h, cuda.blockIdx.x, Nq)  # (a mask: the block mask's visited tiles)
        n_tiles = count(walk, (keys_of_row(min(ib + M, Nq) - 1, Nq, Nk, causal) + Bc - 1) // Bc)
        to = (ring, k, v, tid, kvh, Nk)
        fill(walk, n_tiles, to)
        r_lo = ib + 16 * w + g  # this lane's rows: r_lo, r_lo + 8
        lse_lo = st[bh, 0, r_lo] if r_lo < Nq else float32(0.0)
        lse_hi = st[bh, 0, r_lo + 8] if r_lo + 8 < Nq else float32(0.0)
        dl_lo = st[bh, 1, r_lo] if r_lo < Nq else float32(0.0)
        dl_hi = st[bh, 1, r_lo + 8] if r_lo + 8 < Nq else float32(0.0)
        S = cuda.local.array(NS, float32)
        dS = cuda.local.array(NS, float32)
        dsf = cuda.local.array(NP, uint32)
        G_ = cuda.local.array(NG, float32)
        dQ = cuda.local.array(NA, float32)
        for e in range(NA):
            dQ[e] = float32(0.0)
        sb = 0
        for it in range(n_tiles):
            kt = tile_at(walk, it)  # (read before the wait: its latency hidden)
            kind = kind_at(walk, kt)
            refill(walk, it, n_tiles, to)
            q_tile((S, dS, dsf, dQ, G_), own, ring, sb, kt * Bc, r_lo, (lse_lo, lse_hi, dl_lo, dl_hi), t, Nq, Nk,
                   scale, (b, h, kind, mods))
            sb = sb + 1 if sb + 1 < STAGES else 0
        for dt in range(D // 8):  # dQ_i × scale, two columns per word
            c = 4 * dt + t
            for hi in range(2):
                i = r_lo + 8 * hi
                if i < Nq:
                    dq[bh, i, c] = store2(dQ[4 * dt + 2 * hi] * scale, dQ[4 * dt + 2 * hi + 1] * scale)

    return grad_q


def _supports(problem, Br, Bc, stages):
    D = problem.head_dim
    if D not in (64, 128):
        return (f"head_dim {D}: the swizzled 128-byte rows and the 64 × D dK, dV accumulators of a warpgroup take "
                "D = 64 or 128 (bwd_mma runs multiples of 16 up to 128)")
    reason = variant_reason(problem)  # a score function without its derivative
    if reason:
        return reason
    for name, n in (("Br", Br), ("Bc", Bc)):
        if n % 16 or not 16 <= n <= 128:
            return f"{name}={n} must be a multiple of 16 from 16 to 128 (the N of a wgmma, the k-steps of the next)"
    if stages < 2:
        return f"stages={stages}: the ring needs 2 at least (tile it+1 loading while tile it is read)"
    return smem_reason(max(smem_bytes(D, Br, stages), smem_bytes(D, Bc, stages)))


def wgmma_registration(**more):
    """The ``register_phase`` keywords the wgmma backward phases share (sm_90a, fp16/bf16, D = 64 or 128, plain and
    causal attention, one warpgroup per block, 16-row/key tiles in the simulator)."""
    return dict(dtypes=("float16", "bfloat16"), requires_cc="sm_90a", head_dims=(64, 128),
                space={"Br": [32, 64, 128], "Bc": [32, 64, 128], "stages": [2, 3]},
                sim_params={"Br": 16, "Bc": 16, "stages": 2}, supports=_supports, variants=True, **more)


def launch_backward(name, problem, Br, Bc, stages, kv_schedule, q_schedule):
    """The Launch of a wgmma backward phase: the row statistics, then grad_kv and grad_q with the phase's tile
    steps (``kv_schedule``, ``q_schedule``)."""
    B, H, Hkv, Nq, Nk, G = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len, problem.group
    D, bf16 = problem.head_dim, problem.dtype == "bfloat16"
    row_stats, stat_rows = make_row_stats(D, bf16)
    stage = tiled_mask_stage(problem)  # (PLAIN without a mask function)
    dmod = score_grad_stage(problem)  # (a score function's derivative; `one` without)
    grad_kv = make_grad_kv(D, Br, stages, problem.causal, bf16, kv_schedule, stage, dmod)
    grad_q = make_grad_q(D, Bc, stages, problem.causal, bf16, q_schedule, stage, dmod)
    # the block mask at each kernel's tiles; the dK/dV kernel's lists per column of key tiles
    kv_mods, q_mods = KernelMods(problem, Br, M, columns=True), KernelMods(problem, M, Bc)
    scale = float32(problem.sm_scale)
    NQP = padded_rows(Nq, Br)
    st = cuda.device_array((B * H, 2, NQP), dtype="float32")  # lse, Delta
    grid_kv = ((Nk + M - 1) // M, B * Hkv)
    grid_q = ((Nq + M - 1) // M, B * H)
    kv_bytes, q_bytes = smem_bytes(D, Br, stages), smem_bytes(D, Bc, stages)

    def run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=()):
        q, k, v, o, do, dq, dk, dv = (view_as(a, np.uint32) for a in (q, k, v, o, do, dq, dk, dv))
        if kv_mods.variant is not None:  # the mask's arrays (the call's, or the problem's own), then its block mask
            kvm, qm = kv_mods(aux=mods or None, stream=stream), q_mods(aux=mods or None, stream=stream)
        else:
            kvm = qm = mods
        row_stats[((NQP + stat_rows - 1) // stat_rows, B * H), THREADS, stream](o, do, lse, st, Nq)
        launch_dynamic(grad_kv, grid_kv, THREADS, stream, kv_bytes, q, k, v, do, st, dk, dv, scale, H, G, Nq, Nk, kvm)
        launch_dynamic(grad_q, grid_q, THREADS, stream, q_bytes, q, k, v, do, st, dq, scale, H, G, Nq, Nk, qm)

    return backward_launch(name, run, [row_stats, grad_kv, grad_q], st.nbytes, host_aux=True)


# The one-kernel backward (bwd_wgmma_fused, bwd_wgmma_ss): Q tiles of M rows, dQ added into a float32 accumulator

FINISH_THREADS = 256


@functools.cache
def make_scores_issue(bf16: bool, D: int, Bc: int, STAGES: int):
    """``issue(St, dPt, sm, sb, own_b, ring_b, w)``: warpgroup w's Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ of ring stage
    ``sb`` (K_j's and V_j's 64-key tiles from byte ``own_b``, the ring from ``ring_b``), issued, not waited for."""
    issue_scores = make_products(bf16, M, D, STAGES)[0]
    WGS = Bc // M
    TILE = tile_bytes(M, D)  # a warpgroup's K_j or V_j tile, a stage's Q_i or dO_i

    @device
    def issue(St, dPt, sm, sb, own_b, ring_b, w):
        issue_scores(St, sm, own_b + w * TILE, sm, ring_b + sb * TILE)  # Sᵀ = K_j Q_iᵀ
        issue_scores(dPt, sm, own_b + (WGS + w) * TILE, sm, ring_b + (STAGES + sb) * TILE)  # dPᵀ = V_j dO_iᵀ

    return issue


@functools.cache
def make_dq_staging(D: int, Bc: int):
    """``(stage_dq, add_dq)``: ``stage_dq(staging, hh, tw, dQ)`` stores a dQ half done (the warpgroup's hh-th) into
    its staging tile in thread order, 16 bytes a store (conflict-free); ``add_dq(staging, dqa, doff, w, lead)``
    adds warpgroup w's staged halves to ``dqa`` by one bulk reduction once all its threads have staged theirs."""
    NH = 2 // (Bc // M)  # dQ halves per warpgroup
    NQ = D // 4  # accumulators of a half
    HALF = M * D // 2

    @device
    def stage_dq(staging, hh, tw, dQ):
        for m in range(NQ // 4):
            st_shared_f32x4(staging, hh * HALF + 512 * m + 4 * tw, dQ[4 * m], dQ[4 * m + 1], dQ[4 * m + 2],
                            dQ[4 * m + 3])

    @device
    def add_dq(staging, dqa, doff, w, lead):
        fence_proxy_async()
        named_barrier_sync(1 + w, 128)  # the warpgroup's partial is staged
        if lead:
            bulk_reduce_add_f32(dqa, doff + w * NH * HALF, staging, 0, NH * HALF)
            bulk_commit()

    return stage_dq, add_dq


@functools.cache
def make_dq_finish(D: int, bf16: bool):
    """``dq_finish(dqa, dq, scale, Nq)``: dq = scale · dQacc in the inputs' dtype, the accumulator zeroed for the
    next call. dQacc holds each 64-row tile as two warpgroup halves of D/2 columns in the staging's thread order,
    four values a thread at a time: values 4m .. 4m + 3 of thread T at 512·m + 4·T — columns 8m + 2·(T mod 4) and
    + 1 of rows 16·(T // 32) + (T mod 32) // 4 and + 8 of the half. One thread a group of four (16 contiguous
    bytes, one 16-byte load and one 16-byte store of zeros: the warp's are one contiguous 512-byte run), two words
    of dq."""
    store2 = pack_bf16x2 if bf16 else pack_f16x2
    HC = D // 2  # columns of a half
    TILE, HALF = M * D, M * D // 2

    @kernel
    def dq_finish(dqa, dq, scale, Nq):
        bh = cuda.blockIdx.y
        at = 4 * (cuda.blockIdx.x * FINISH_THREADS + cuda.threadIdx.x)
        if at < dqa.shape[1]:
            qt, x = at // TILE, at % TILE
            w, x = x // HALF, x % HALF
            m, T = x // 512, (x % 512) // 4
            r = qt * M + 16 * (T // 32) + (T % 32) // 4
            cw = w * (HC // 2) + 4 * m + T % 4
            a0, a1, a2, a3 = ld_f32x4(dqa, bh, at)
            if r < Nq:
                dq[bh, r, cw] = store2(a0 * scale, a1 * scale)
            if r + 8 < Nq:
                dq[bh, r + 8, cw] = store2(a2 * scale, a3 * scale)
            zero = float32(0.0)
            st_f32x4(dqa, bh, at, zero, zero, zero, zero)

    return dq_finish


def resolve_bc(problem, Bc, **params):
    """Bc=0: 64 keys a block (one warpgroup) up to D64, where two blocks share an SM (1-4% faster, H200), 128
    (two warpgroups) above, where one warpgroup's block keeps the SM's shared memory to itself (1.6× slower)."""
    return {"Bc": Bc or (64 if problem.head_dim <= 64 else 128)}


def fused_reason(problem, Bc, stages, least, why, smem_of):
    """Why a one-kernel wgmma backward cannot run ``problem`` with blocks of ``Bc`` keys and a ring of ``stages``
    (``least`` at least: ``why``) in ``smem_of(D, Bc, stages)`` bytes of shared memory, or None."""
    D = problem.head_dim
    if D not in (64, 128):
        return (f"head_dim {D}: the swizzled 128-byte rows and the 64 × D dK, dV accumulators of a warpgroup take "
                "D = 64 or 128 (bwd_mma runs multiples of 16 up to 128)")
    reason = variant_reason(problem)
    if reason:
        return reason
    if Bc not in (0, 64, 128):
        return f"Bc={Bc}: a block's keys are one or two warpgroups' 64 (64 or 128; 0: by the head dim)"
    if stages < least:
        return f"stages={stages}: the ring needs {least} at least ({why})"
    return smem_reason(smem_of(D, resolve_bc(problem, Bc)["Bc"], stages))


def launch_fused(name, problem, Bc, stages, make_grad, smem_of, *more):
    """The Launch of a one-kernel wgmma backward: the row statistics; the kernel ``make_grad(D, Bc, stages, causal,
    bf16, stage, dmod, *more)`` over blocks of Bc keys (a warpgroup each 64) with ``smem_of(D, Bc, stages)``
    bytes of shared memory, adding its dQ partials into a float32 accumulator; the finish (dQ in the inputs'
    dtype, the accumulator zeroed)."""
    B, H, Hkv, Nq, Nk, G = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len, problem.group
    D, bf16 = problem.head_dim, problem.dtype == "bfloat16"
    row_stats, stat_rows = make_row_stats(D, bf16)
    stage = tiled_mask_stage(problem)
    dmod = score_grad_stage(problem)
    grad = make_grad(D, Bc, stages, problem.causal, bf16, stage, dmod, *more)
    finish = make_dq_finish(D, bf16)
    mods_of = KernelMods(problem, M, Bc, columns=True)
    scale = float32(problem.sm_scale)
    NQP = padded_rows(Nq, M)
    st = cuda.device_array((B * H, 2, NQP), dtype="float32")
    dqa = cuda.to_device(np.zeros((B * H, NQP * D), np.float32))  # zeroed again by every call's finish
    grid = ((Nk + Bc - 1) // Bc, B * Hkv)
    nbytes = smem_of(D, Bc, stages)

    def run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=()):
        q, k, v, o, do, dq, dk, dv = (view_as(a, np.uint32) for a in (q, k, v, o, do, dq, dk, dv))
        m = mods_of(aux=mods or None, stream=stream) if mods_of.variant is not None else mods
        row_stats[((NQP + stat_rows - 1) // stat_rows, B * H), 128, stream](o, do, lse, st, Nq)
        launch_dynamic(grad, grid, 2 * Bc, stream, nbytes, q, k, v, do, st, dk, dv, dqa, scale, H, G, Nq, Nk, m)
        finish[((NQP * D // 4 + FINISH_THREADS - 1) // FINISH_THREADS, B * H), FINISH_THREADS, stream](
            dqa, dq, scale, Nq)

    return backward_launch(name, run, [row_stats, grad, finish], st.nbytes + dqa.nbytes, host_aux=True)
