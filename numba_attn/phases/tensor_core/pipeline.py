"""The K/V ring of the wgmma phases: its geometry, its state and its barriers.

* :class:`WgmmaTiles` — the compile-time shape of a kernel: warpgroups, tile sizes, fragment registers, ring bytes;
* the ring state of a tile is one value, ``ring = (stage, phase)``: :func:`ring_functions` gives ``advance``
  (the next tile's: no division in the loop) and ``ring_at`` (tile ``it``'s, divided out);
* the TMA ring's mbarriers: stage s has a "full" barrier (``s``: the tile's bytes landed) and an "empty"
  one (``STAGES + s``: every consumer warp is done with it); :func:`ring_barriers` initialises them and
  gives ``wait_full`` / ``release``; with ``split_kv`` K and V have a pair each (:func:`kv_barriers`); with
  ``q_tma`` Q has a pair after them (:func:`q_barriers`), one phase a work item;
* :func:`ring_padding`: the ring in dynamic shared memory starts at a 1024-byte boundary (the swizzle's period);
* :func:`cp_async_ring`: the cp.async ring of the kernels that copy their own tiles (``tc_pipelined``, ``tc_tf32``,
  ``fp8_wgmma``): the first tiles issued, then per tile a wait, a block barrier and the refill.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from numba import cuda

from numba_attn.gpu.intrinsics import cp_async_commit, cp_async_wait
from numba_attn.gpu.jit import device
from numba_attn.gpu.mbarrier import fence_proxy_async, mbarrier_arrive, mbarrier_init, mbarrier_wait
from numba_attn.gpu.tma import tensormap_fence_acquire
from numba_attn.gpu.warp import FULL_MASK, syncwarp
from numba_attn.gpu.wgmma import padded_columns, row_bytes, shared_address
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import PLAIN

__all__ = ["ALIGN_BYTES", "WgmmaTiles", "wgmma_tiles", "ring_functions", "ring_barriers", "kv_barriers", "q_barriers",
           "ring_padding", "wgmma_smem_bytes", "cp_async_ring"]

ALIGN_BYTES = 1024  # the 128-byte swizzle repeats every 1024 bytes: tiles start there


@dataclass(frozen=True)
class WgmmaTiles:
    """The compile-time shape of a wgmma kernel of ``warpgroups`` computing warpgroups (64 query rows each),
    head_dim ``D``, K/V tiles of ``Bc`` keys in a ring of ``stages``; ``lazy_rescale``: FlashAttention-4's
    conditional rescale of O (:func:`.consumer.scores_to_p`); ``split_kv``: K and V with full and empty barriers of
    their own, released apart (:func:`kv_barriers`); ``q_smem``: Q's 64-row tiles in shared memory after the ring
    (``q_base``), read by the wgmma of S = Q·Kᵀ instead of Q's registers; ``o_smem``: O's 64-row tiles in shared
    memory after those (``o_base``, rows of ``o_pitch`` bytes), where the epilogue stages O for bulk copies."""
    D: int
    warpgroups: int
    Bc: int
    stages: int
    lazy_rescale: bool = False
    split_kv: bool = False  # K and V of a stage on barriers of their own (:func:`kv_barriers`)
    q_smem: bool = False  # Q in shared memory after the ring, a 64-row tile a warpgroup (the A of S = Q·Kᵀ)
    o_smem: bool = False  # O staged in shared memory after the ring (and Q), a 64-row tile a warpgroup
    q_tma: bool = False  # (with q_smem) Q's tiles brought by the producer's TMA, on barriers of their own
    o_rows: bool = False  # the epilogue stores through its two rows' views (:func:`.epilogue.store_rows`)
    q_early: bool = False  # (with q_tma) a warp releases Q after its item's last S = Q·Kᵀ, inside the tile loop

    @property
    def warps(self):  # warpgroup i = warps 4i..4i+3
        return 4 * self.warpgroups

    @property
    def threads(self):
        return 32 * self.warps

    @property
    def Br(self):  # query rows of a block
        return 64 * self.warpgroups

    @property
    def padded_d(self):  # columns of the shared tiles (D, or D padded to a swizzle mode)
        return padded_columns(self.D)

    @property
    def qk_steps(self):  # k-steps of Q·Kᵀ (an odd multiple of 8: the last half zero)
        return (self.D + 15) // 16

    @property
    def s_tiles(self):  # n-tiles of S (8 keys each)
        return self.Bc // 8

    @property
    def pv_steps(self):  # k-steps of P·V
        return self.Bc // 16

    @property
    def o_tiles(self):  # n-tiles of O (8 columns each)
        return self.D // 8

    @property
    def q_regs(self):  # A fragments of Q
        return 4 * self.qk_steps

    @property
    def s_regs(self):  # score accumulators per thread (64 × Bc over 128 threads)
        return self.Bc // 2

    @property
    def o_regs(self):  # output accumulators per thread
        return self.D // 2

    @property
    def p_regs(self):  # A fragments of P·V
        return 4 * self.pv_steps

    @property
    def row_bytes(self):  # bytes of a swizzled row
        return row_bytes(self.padded_d)

    @property
    def tile_bytes(self):  # one K (or V) stage
        return self.Bc * self.padded_d * 2

    @property
    def q_tile_bytes(self):  # one warpgroup's Q tile (q_smem)
        return 64 * self.padded_d * 2

    @property
    def q_base(self):  # byte of the first Q tile (q_smem): after the K and V stages
        return 2 * self.stages * self.tile_bytes

    @property
    def o_pitch(self):  # bytes of a staged O row (o_smem): D halves and 16 bytes, so a quad's 8 rows hit 32 banks
        return 2 * self.D + 16

    @property
    def o_tile_bytes(self):  # one warpgroup's staged O tile (o_smem)
        return 64 * self.o_pitch

    @property
    def o_base(self):  # byte of the first O tile (o_smem): after the K and V stages and the Q tiles
        return self.q_base + (self.warpgroups * self.q_tile_bytes if self.q_smem else 0)

    @property
    def ring_rows(self):  # rows of 16 bytes in the ring (K and V; the Q tiles and O tiles after them)
        o = self.warpgroups * self.o_tile_bytes if self.o_smem else 0
        return (self.o_base + o) // 16

    @property
    def q_bar(self):  # (q_tma) Q's full barrier, its empty one after it: after the ring's
        return (4 if self.split_kv else 2) * self.stages

    @property
    def n_barriers(self):  # full and empty a stage; K's and V's apart with split_kv; Q's pair with q_tma
        return self.q_bar + (2 if self.q_tma else 0)


@functools.cache
def wgmma_tiles(D: int, warpgroups: int, Bc: int, stages: int, lazy_rescale: bool = False,
                split_kv: bool = False, q_smem: bool = False, o_smem: bool = False,
                q_tma: bool = False, o_rows: bool = False, q_early: bool = False) -> WgmmaTiles:
    if q_tma and not q_smem:
        raise ValueError("q_tma brings Q's tiles into shared memory: it needs q_smem")
    if q_early and not q_tma:
        raise ValueError("q_early releases the Q tiles that the producer brings: it needs q_tma")
    if o_rows and o_smem:
        raise ValueError("o_rows (stores through row views) and o_smem (O staged for bulk copies): one epilogue")
    return WgmmaTiles(D, warpgroups, Bc, stages, lazy_rescale, split_kv, q_smem, o_smem, q_tma, o_rows, q_early)


@functools.cache
def ring_functions(STAGES: int):
    """``(advance, ring_at)``: ``advance(ring)`` is the ring state of the tile after ``ring = (stage, phase)``,
    ``(stage + 1, phase)`` or past the last stage ``(0, phase ^ 1)`` (carried from tile to tile: no division
    in the loop); ``ring_at(it)`` is tile ``it``'s, ``(it mod STAGES, (it // STAGES) mod 2)``."""
    @device
    def advance(ring):
        stage, phase = ring
        stage += 1
        if stage == STAGES:
            return 0, phase ^ 1
        return stage, phase

    @device
    def ring_at(it):
        return it % STAGES, (it // STAGES) % 2

    return advance, ring_at


@functools.cache
def ring_barriers(STAGES: int, warps: int, split: bool = False):
    """``(init, wait_full, release)`` of the TMA ring's mbarriers in ``bars`` (uint64[2·STAGES]): ``init(bars, k,
    v, tid)`` (thread 0; the tensor maps acquired; then a block barrier), ``wait_full(bars, ring)`` (the tile of
    that stage and phase has landed), ``release(bars, stage, lane)`` (this warp is done with the stage: every
    lane past its wgmma wait, the lanes synced, then lane 0 arrives: one arrival per warp of ``warps``).
    ``split``: 4·STAGES barriers, the first 2·STAGES K's as above and V's full and empty ones after them
    (:func:`kv_barriers`)."""
    PAIRS = 2 if split else 1

    @device
    def init(bars, k, v, tid):
        if tid == 0:
            tensormap_fence_acquire(k)
            tensormap_fence_acquire(v)
            for pair in range(PAIRS):
                for stage in range(STAGES):
                    mbarrier_init(bars, 2 * STAGES * pair + stage, 1)  # full: thread 0's arrival and the bytes
                    mbarrier_init(bars, 2 * STAGES * pair + STAGES + stage, warps)  # empty: one arrival a warp
            fence_proxy_async()  # the initialised barriers visible to the async proxy (TMA's complete_tx)
        cuda.syncthreads()

    @device
    def wait_full(bars, ring):
        mbarrier_wait(bars, ring[0], ring[1])

    @device
    def release(bars, stage, lane):
        syncwarp(FULL_MASK)
        if lane == 0:
            mbarrier_arrive(bars, STAGES + stage)

    return init, wait_full, release


@functools.cache
def kv_barriers(STAGES: int, warps: int, split: bool):
    """``(wait_k, release_k, wait_v, release_v)`` of a consumer warp, each ``(bars, ring)`` or ``(bars, stage,
    lane)`` as in :func:`ring_barriers`. ``split``: K's full and empty barriers are the ring's (0 .. 2·STAGES-1), V's
    come after them, so K's stage is released once its product is done and V's once its own is. Otherwise one pair
    of barriers a stage: waiting for K waits for the whole tile, releasing V releases the stage, and the other
    two do nothing (the code is the same either way)."""
    wait_full, release = ring_barriers(STAGES, warps, split)[1:]
    VB = 2 * STAGES  # V's barriers, after K's

    @device
    def nothing_waited(bars, ring):
        pass

    @device
    def nothing_released(bars, stage, lane):
        pass

    @device
    def wait_v(bars, ring):
        mbarrier_wait(bars, VB + ring[0], ring[1])

    @device
    def release_v(bars, stage, lane):
        syncwarp(FULL_MASK)
        if lane == 0:
            mbarrier_arrive(bars, VB + STAGES + stage)

    if split:
        return wait_full, release, wait_v, release_v
    return wait_full, nothing_released, nothing_waited, release


@device
def ring_padding(base):
    """The float32 elements from the dynamic shared memory's ``base`` to its first 1024-byte boundary, where the
    ring starts (a device function returns no new array: the kernel takes the ring's view itself)."""
    return ((ALIGN_BYTES - (shared_address(base) & (ALIGN_BYTES - 1))) & (ALIGN_BYTES - 1)) // 4


def wgmma_smem_bytes(D, Bc, stages, q_rows=0, o_rows=0):
    """The K/V ring (rows of :func:`padded_columns` elements), ``q_rows`` rows of Q after it, ``o_rows`` staged O
    rows (:attr:`WgmmaTiles.o_pitch` bytes each), plus the 1024 bytes of alignment padding."""
    return (2 * stages * Bc + q_rows) * padded_columns(D) * 2 + o_rows * (2 * D + 16) + ALIGN_BYTES


@functools.cache
def q_barriers(tiles):
    """``(init, wait, release)`` of Q's pair of mbarriers (``tiles.q_tma``: the producer brings each work item's Q
    tiles by TMA): ``init(bars, qmap, tid)`` (thread 0, before the ring's: its fence and block barrier cover
    both), ``wait(bars, r)`` (the Q of the block's ``r``-th item has landed: phase r of the full barrier),
    ``release(bars, lane)`` (this warp's last S = Q·Kᵀ of the item is done: one arrival a warp on the empty
    barrier, which the producer waits for before the next item's Q)."""
    QF, QE, WARPS = tiles.q_bar, tiles.q_bar + 1, tiles.warps

    @device
    def init(bars, qmap, tid):
        if tid == 0:
            tensormap_fence_acquire(qmap)
            mbarrier_init(bars, QF, 1)  # the producer's arrival and Q's bytes
            mbarrier_init(bars, QE, WARPS)

    @device
    def wait(bars, r):
        mbarrier_wait(bars, QF, r & 1)

    @device
    def release(bars, lane):
        syncwarp(FULL_MASK)
        if lane == 0:
            mbarrier_arrive(bars, QE)

    return init, wait, release


@functools.cache
def cp_async_ring(STAGES: int, Bc: int, copy, stage=PLAIN):
    """``(fill, refill)`` of a ring of ``STAGES`` K/V stages that the block's threads fill with cp.async, one commit
    group a tile: ``fill(walk, n_tiles, to)`` issues tiles 0 .. STAGES-2; ``refill(walk, it, n_tiles, to)`` waits
    for tile ``it`` (this thread's copies, then a block barrier: every thread's, and every warp is done with tile
    it-1) and issues tile it+STAGES-1 into tile it-1's stage. ``copy(tile, sb, to)``: the kernel's copies of key
    tile ``tile`` (a variant: its visited tiles, :func:`.scheduler.key_tiles`) into stage ``sb``, ``to`` their
    arguments."""
    tile_at = key_tiles(Bc, stage)[1]
    WAIT = STAGES - 2  # copy groups that may stay in flight when tile it is needed (a compile-time constant)

    @device
    def fill(walk, n_tiles, to):
        for st in range(STAGES - 1):
            if st < n_tiles:
                copy(tile_at(walk, st), st, to)
            cp_async_commit()

    @device
    def refill(walk, it, n_tiles, to):
        cp_async_wait(WAIT)  # tile it has landed (this thread's copies) ...
        cuda.syncthreads()  # ... every thread's; and every warp is done with tile it-1
        nxt = it + STAGES - 1
        if nxt < n_tiles:  # into the stage of tile it-1
            copy(tile_at(walk, nxt), nxt % STAGES, to)
        cp_async_commit()

    return fill, refill
