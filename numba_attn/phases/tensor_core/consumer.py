"""The consumer warpgroups of the wgmma phases: one work item's Q, its loop over the K/V tiles, its O.

* :func:`wgmma_products` — S = Q·Kᵀ (``D/16`` wgmma m64nBc k16, K from the swizzled ring) and O += P·V
  (``Bc/16`` wgmma m64nD k16, V as the transposed operand), waited for at once or only issued;
* :func:`scores_to_p` — a tile's scores masked (:mod:`.mask`), the online softmax (:mod:`.softmax`), P packed,
  O rescaled;
* :func:`plain_mainloop` — the tile loop where each product is waited for at once (``tc_wgmma``); the other
  schedules are their phases' own: ``tc_wgmma_overlap.overlap_mainloop``, ``pingpong.pingpong_mainloop``.
  A mainloop factory ``(tiles, causal, bf16, loads, varlen)`` gives the device function
  ``mainloop(n_tiles, ring, stats, regs, loads, rows, lane_ids) -> (stats, ring)`` with
  ``regs = (qf, s, sn, pf, acc)``, ``rows = (row0, wg_end, Nk, off, sl2)``, ``lane_ids = (tid, lane, g, t,
  first)``;
* :func:`consumer` — one work item: Q into registers, the loads' prologue, the mainloop, the epilogue.
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.intrinsics import rows_head_major
from numba_attn.gpu.jit import device
from numba_attn.gpu.loads import st_shared_b32
from numba_attn.gpu.mbarrier import fence_proxy_async
from numba_attn.gpu.warpspec import named_barrier_sync
from numba_attn.gpu.wgmma import kmajor_params, make_wgmma_rs, make_wgmma_ss, make_wgmma_wait, mnmajor_params
from numba_attn.phases.tensor_core.epilogue import lse_fragments, o_store
from numba_attn.phases.tensor_core.fragments import o_start, q_start
from numba_attn.phases.tensor_core.mask import key_ends, mask_fragments, variant_fragments
from numba_attn.phases.tensor_core.pipeline import q_barriers, ring_functions
from numba_attn.phases.tensor_core.producer import load_functions
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.gpu.warp import FULL_MASK, ballot_sync
from numba_attn.phases.tensor_core.softmax import online_softmax, online_softmax_lazy, pack_p, rescale_o
from numba_attn.phases.tensor_core.timeline import first_tile_stamp, stamps
from numba_attn.variants.stages import LN2, PLAIN

__all__ = ["wgmma_products", "q_operand", "masked_scores", "scores_softmax", "scores_to_p", "ring_steps",
           "plain_mainloop", "consumer"]


@functools.cache
def wgmma_products(tiles, bf16: bool, pv_waited: bool):
    """``(qk, qk_next, pv, wait_all, wait_o)``: S = Q·Kᵀ waited for, the same only issued, O += P·V (waited for
    when ``pv_waited``), the wait for both products (S and O pass through it), the wait for O alone."""
    kind = "bf16" if bf16 else "f16"
    rb = tiles.row_bytes
    qk_off, qk_lbo, qk_sbo = kmajor_params(tiles.Bc, tiles.qk_steps, rb)
    pv_off, pv_lbo, pv_sbo = mnmajor_params(tiles.Bc, tiles.pv_steps, rb)
    qk = make_wgmma_rs(kind, tiles.Bc, False, True, qk_off, qk_lbo, qk_sbo, rb)  # S = Q Kᵀ (fresh), waited
    qk_next = make_wgmma_rs(kind, tiles.Bc, False, True, qk_off, qk_lbo, qk_sbo, rb, False)  # issued, not waited
    pv = make_wgmma_rs(kind, tiles.D, True, False, pv_off, pv_lbo, pv_sbo, rb, pv_waited)
    wait_all = make_wgmma_wait(0, tiles.s_regs, tiles.o_regs)  # both products done
    wait_o = make_wgmma_wait(0, tiles.o_regs)  # O done
    return qk, qk_next, pv, wait_all, wait_o


@functools.cache
def q_operand(tiles, bf16: bool):
    """``(store_q, issue_s)`` of S = Q·Kᵀ issued and not waited for. Q in registers: ``store_q`` does nothing and
    ``issue_s(s, qf, q_off, KV, b_off)`` reads Q's A fragments ``qf``. ``tiles.q_smem``: ``store_q(KV, q_off, qf,
    wrow, g, t)`` writes this lane's fragments of the warp's 16 rows (from row ``wrow`` of its warpgroup's tile at byte
    ``q_off`` of the ring's view: K-major, swizzled like a K tile of 64 rows), then makes them visible to the
    tensor cores (``fence.proxy.async``, the warpgroup's named barrier ``1 + q_off``'s tile index); ``issue_s``
    reads Q from there, and the fragments' registers are free for the rest of the item."""
    kind = "bf16" if bf16 else "f16"
    rb, KS, BASE, QT = tiles.row_bytes, tiles.qk_steps, tiles.q_base, tiles.q_tile_bytes
    SWM = rb // 16 - 1
    offs, lbo, sbo = kmajor_params(tiles.Bc, KS, rb)
    qk_rs = make_wgmma_rs(kind, tiles.Bc, False, True, offs, lbo, sbo, rb, False)

    if not tiles.q_smem:
        @device
        def store_nothing(KV, q_off, qf, wrow, g, t):
            pass

        @device
        def issue_rs(s, qf, q_off, KV, b_off):
            qk_rs(s, qf, 0, KV, b_off)

        return store_nothing, issue_rs

    qk_ss = make_wgmma_ss(kind, tiles.Bc, False, True, offs, lbo, sbo, rb, False)

    @device
    def store_q(KV, q_off, qf, wrow, g, t):
        for ks in range(KS):
            for half in range(2):  # words 8ks+t (fragments 0, 1) and 8ks+t+4 (2, 3) of rows g and g+8
                byte = 4 * (8 * ks + t + 4 * half)
                cb = byte // rb  # (rb a power of two: shifts)
                inrow = byte % rb
                for hi in range(2):
                    r = wrow + g + 8 * hi
                    at = q_off + cb * 64 * rb + r * rb + 16 * ((inrow // 16) ^ (((r * rb) >> 7) & SWM)) + inrow % 16
                    st_shared_b32(KV, at, qf[4 * ks + 2 * half + hi])
        fence_proxy_async()  # the generic proxy's stores visible to the tensor cores' reads
        named_barrier_sync(1 + (q_off - BASE) // QT, 128)  # the warpgroup's four warps have stored

    @device
    def issue_ss(s, qf, q_off, KV, b_off):
        qk_ss(s, KV, q_off, KV, b_off)

    return store_q, issue_ss


@functools.cache
def masked_scores(tiles, causal: bool, stage=PLAIN):
    """A device function ``apply(s, j0, kind, loads, rows, lane_ids)``: the scores ``s`` of the tile of keys from
    ``j0`` (rows g and g+8 of the warp from ``row0``) through the variant ``stage`` (``kind``: the tile's) and
    masked (keys past the end and, causal, above the diagonal), in place."""
    vary = variant_fragments(tiles.s_tiles, stage)
    mask = mask_fragments(tiles.s_tiles, tiles.Bc, causal)

    @device
    def apply(s, j0, kind, loads, rows, lane_ids):
        row0, _, Nk, off, sl2 = rows
        g, t = lane_ids[2], lane_ids[3]
        mods, b, h, qt, Nq = loads[6]
        vary(s, 0, j0, row0 + g, t, Nq, Nk, off, (b, h, kind, sl2 * LN2), mods)  # score_mod, mask_mod
        mask(s, 0, j0, row0, row0 + g, t, Nk, off)  # keys past the end and (causal) above the diagonal

    return apply


@functools.cache
def scores_softmax(tiles, causal: bool, stage=PLAIN):
    """A device function ``update(s, stats, j0, kind, loads, rows, lane_ids) -> (stats, corr_lo, corr_hi)``: the
    scores ``s`` through :func:`masked_scores`, then the online softmax in place (P unnormalised, not yet packed);
    O's rescale factors come back for the caller's schedule."""
    masked = masked_scores(tiles, causal, stage)
    softmax = online_softmax(tiles.s_tiles)

    @device
    def update(s, stats, j0, kind, loads, rows, lane_ids):
        masked(s, j0, kind, loads, rows, lane_ids)
        return softmax(s, stats, rows[4])

    return update


@functools.cache
def scores_to_p(tiles, causal: bool, bf16: bool, stage=PLAIN):
    """A device function ``to_p(s, pf, acc, stats, j0, kind, loads, rows, lane_ids) -> stats`` (the mainloop's
    tuples): the scores ``s`` of the tile of keys from ``j0`` (rows g and g+8 of the warp from ``row0``) through
    the variant ``stage`` (``kind``: the tile's; ``loads[6]``: the item's :func:`.scheduler.key_tiles` walk) and
    masked, the online softmax, P packed into ``pf``, O (``acc``) rescaled. ``tiles.lazy_rescale``: the running
    max moves only by more than 2^8 (:func:`.softmax.online_softmax_lazy`), and a warp rescales O only when one of
    its rows' max moved."""
    masked = masked_scores(tiles, causal, stage)
    softmax = scores_softmax(tiles, causal, stage)
    softmax_lazy = online_softmax_lazy(tiles.s_tiles)
    LAZY = tiles.lazy_rescale
    pack = pack_p(tiles.pv_steps, bf16)
    rescale = rescale_o(tiles.o_tiles)

    @device
    def to_p(s, pf, acc, stats, j0, kind, loads, rows, lane_ids):
        if LAZY:
            masked(s, j0, kind, loads, rows, lane_ids)
            stats, corr_lo, corr_hi, moved = softmax_lazy(s, stats, rows[4])
            pack(pf, s)
            if ballot_sync(FULL_MASK, moved) != 0:  # (warp-uniform: O's 64 multiplies skipped together)
                rescale(acc, 0, corr_lo, corr_hi)
        else:
            stats, corr_lo, corr_hi = softmax(s, stats, j0, kind, loads, rows, lane_ids)
            pack(pf, s)
            rescale(acc, 0, corr_lo, corr_hi)
        return stats

    return to_p


@functools.cache
def ring_steps(STAGES: int):
    """``next_tile(ring, refill) -> (stage, phase, refill_stage, refill_phase)``: the ring states of the tile read
    and of the refill (tile it + STAGES - 1) one tile on, as a mainloop's step carries them."""
    advance = ring_functions(STAGES)[0]

    @device
    def next_tile(ring, refill):
        """The read's and the refill's ring states of the next tile."""
        stage, phase = advance(ring)
        refill_stage, refill_phase = advance(refill)
        return stage, phase, refill_stage, refill_phase

    return next_tile


@functools.cache
def plain_mainloop(tiles, causal: bool, bf16: bool, loads: str, varlen: bool, stage=PLAIN):
    """The tile loop of ``tc_wgmma``: per tile, acquire it, S = Q·Kᵀ waited for, scores to P, O += P·V waited
    for, release it. The ring state of the tile read and of the refill (tile it + STAGES - 1) are carried."""
    STAGES, Bc, TILE = tiles.stages, tiles.Bc, tiles.tile_bytes
    acquire, release = load_functions(tiles, loads, varlen, False, stage)[2:4]
    qk, _, pv, _, _ = wgmma_products(tiles, bf16, True)
    to_p = scores_to_p(tiles, causal, bf16, stage)
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    next_tile = ring_steps(STAGES)

    @device
    def step(it, n_tiles, ring, refill, stats, regs, loads, rows, lane_ids):
        qf, s, sn, pf, acc = regs
        KV = loads[0]
        kt = tile_at(loads[6], it)  # (a variant: the block mask's it-th visited tile, read before the
        kind = kind_at(loads[6], kt)  # wait below, which hides the two reads' latency)
        ring, refill = acquire(loads, it, n_tiles, ring, refill, lane_ids[0])
        j0 = kt * Bc
        if j0 < rows[1]:  # this warpgroup's rows see keys of the tile
            qk(s, qf, 0, KV, ring[0] * TILE)  # S = Q Kᵀ: KS wgmma m64nBc k16, K read from shared memory
            stats = to_p(s, pf, acc, stats, j0, kind, loads, rows, lane_ids)
            pv(acc, pf, 0, KV, (STAGES + ring[0]) * TILE)  # O += P V: KK wgmma m64nD k16, V transposed
        release(loads, ring[0], lane_ids[1])
        stage, phase, refill_stage, refill_phase = next_tile(ring, refill)
        return stats, stage, phase, refill_stage, refill_phase

    @device
    def mainloop(n_tiles, ring, stats, regs, loads, rows, lane_ids):
        stage, phase = ring  # carried as scalars: a tuple carried by the loop keeps dead fields alive
        refill_stage = STAGES - 1  # the refill's (tile it + STAGES - 1): the stage of tile it-1
        refill_phase = 0
        for it in range(n_tiles):
            stats, stage, phase, refill_stage, refill_phase = step(
                it, n_tiles, (stage, phase), (refill_stage, refill_phase), stats, regs, loads, rows, lane_ids)
        return stats, (stage, phase)

    return mainloop


@functools.cache
def consumer(tiles, causal: bool, bf16: bool, loads: str, varlen: bool, mainloop_factory, stage=PLAIN,
             trace: bool = False):
    """A device function ``consume(q, o, loads, item, ring, lane_ids, Nq, off, sl2, q0) -> ring``: one work item
    of a consumer warp, ``item = (blk0, wg0, row0, bh, r)`` (the first query rows of the block, this warpgroup and
    this warp; the head-batch; the block's r-th item): Q to registers (``tiles.q_tma``: Q's tiles awaited, brought
    by the producer, released after the loop or, ``tiles.q_early``, in it), the tile loop of ``mainloop_factory``,
    O stored. ``ring``: the
    ring state at its first tile in, after its last out (a persistent block's next item goes on from there).
    ``stage``: the variant's (``loads[6]``: the item's walk over its key tiles, :func:`.scheduler.key_tiles`).
    ``trace``: the item's steps stamped (:func:`.timeline.stamps`; the array last in ``loads[6][0]``)."""
    ends = key_ends(tiles.Br, 64, causal)  # (the block's keys, a warpgroup's keys) from its first row
    start = q_start(tiles.qk_steps, tiles.o_regs, False, tiles.D // 2)
    zero = o_start(tiles.o_regs)
    Q_TMA, Q_LATE = tiles.q_tma, tiles.q_tma and not tiles.q_early  # (q_early: the mainloop releases Q)
    wait_q, release_q = q_barriers(tiles)[1:]
    store_o = o_store(tiles, bf16)  # (o_smem: staged in shared memory, copied out by bulk copies)
    store_lse = lse_fragments(stage)
    prologue = load_functions(tiles, loads, varlen, getattr(mainloop_factory, "ahead", False), stage)[0]
    finish = load_functions(tiles, loads, varlen, False, stage)[4]
    mainloop = mainloop_factory(tiles, causal, bf16, loads, varlen, stage)
    count = key_tiles(tiles.Bc, stage)[0]
    Bc, q_regs, s_regs, o_regs, p_regs = tiles.Bc, tiles.q_regs, tiles.s_regs, tiles.o_regs, tiles.p_regs
    store_q = q_operand(tiles, bf16)[0]
    Q_BASE, Q_TILE = tiles.q_base, tiles.q_tile_bytes
    stamp, stamp_after = stamps(trace, tiles.warpgroups, tiles.Br)[3:]
    first_tile = first_tile_stamp(trace, tiles)

    @device
    def consume(q, o, loads, item, ring, lane_ids, Nq, off, sl2, q0):
        blk0, wg0, row0, bh, r = item
        tid, lane, g, t, first = lane_ids
        Nk = loads[5]
        stamp(loads[6][0], bh, blk0, wg0, row0, lane, Nq, 0)  # (trace: the item's start)
        qf = cuda.local.array(q_regs, uint32)
        r_lo = row0 + g
        acc = cuda.local.array(o_regs, float32)
        if Q_TMA:  # Q's tiles brought by the producer: O = 0, the running max and sums; Q's tiles landed
            stats = zero(acc)
            wait_q(loads[3], r)
            stamp(loads[6][0], bh, blk0, wg0, row0, lane, Nq, 1)  # (trace: Q in shared memory)
        else:
            stats = start(qf, acc, q, bh, r_lo, Nq, t)  # Q's A fragments, O = 0; running max and sums (lane's columns)
            stamp_after(loads[6][0], bh, blk0, wg0, row0, lane, Nq, 1, qf[q_regs - 1])  # (trace: Q in registers)
            store_q(loads[0], Q_BASE + ((wg0 - blk0) // 64) * Q_TILE, qf, row0 - wg0, g, t)  # (q_smem: Q's tile)
        s = cuda.local.array(s_regs, float32)
        sn = cuda.local.array(s_regs, float32)  # overlap: S of the next tile, in flight during this tile's softmax
        pf = cuda.local.array(p_regs, uint32)

        # the keys the block loads, and those this warpgroup needs (warpgroup-uniform: wgmma is collective)
        kv_end, wg_end = ends(blk0, wg0, Nq, Nk, off)
        n_tiles = count(loads[6], (kv_end + Bc - 1) // Bc)  # (a variant: the block mask's visited tiles)
        prologue(loads, n_tiles, tid)
        first_tile(loads[6][0], bh, blk0, wg0, row0, lane, Nq, loads[3], ring, n_tiles)  # (trace: K_0 landed)
        stats, ring = mainloop(n_tiles, ring, stats, (qf, s, sn, pf, acc), loads, (row0, wg_end, Nk, off, sl2),
                               lane_ids)
        finish()
        if Q_LATE:
            release_q(loads[3], lane)  # every S = Q·Kᵀ of the item done: the producer may bring the next Q
        stamp(loads[6][0], bh, blk0, wg0, row0, lane, Nq, 3)  # (trace: the tile loop done)
        if varlen:  # the view made here, not kept live through the loop (q0: one register)
            o = rows_head_major(o, q0, Nq)
        store_o(o, loads[0], item, acc, stats[2], stats[3], Nq, lane_ids)
        store_lse(loads[6][0], bh, r_lo, stats, sl2, Nq, t)  # (only when asked: return_lse=True)
        stamp(loads[6][0], bh, blk0, wg0, row0, lane, Nq, 4)  # (trace: O's stores issued)
        return ring

    return consume
