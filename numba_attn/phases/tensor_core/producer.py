"""How K/V tiles reach the wgmma phases' ring: the load strategies, one per producer.

Each strategy is the same five device functions over ``loads = (KV, k, v, bars, kvh, Nk, walk)`` (the ring, K and V
or their tensor maps, the ring's mbarriers, the KV head or the packed copy's first row, the keys, the item's walk
over its key tiles: :func:`.scheduler.key_tiles`, through which a variant's block mask maps the ``it``-th tile):

* ``prologue(loads, n_tiles, tid)`` — the first tiles in flight before the loop;
* ``wait_first(loads, n_tiles)`` — tile 0 has landed (a schedule that issues S_0 before its loop);
* ``acquire(loads, it, n_tiles, ring, refill, tid) -> (ring, refill)`` — the tile read next (``it``, or ``it + 1``
  when the schedule runs a tile ahead: ``ring`` is then that tile's) has landed, the stage of tile ``it - 1``
  refilled; varlen recomputes both ring states from ``it``;
* ``release(loads, stage, lane)`` — this warp is done with ``stage``;
* ``finish()`` — nothing left in flight.

:func:`cp_async_loads`: every thread copies its share with ``cp.async`` (tc_wgmma); :func:`tma_loads`: thread
0 issues one TMA box per column block after ``expect_tx`` on the stage's full barrier (tma_wgmma), or, with
``producer``, a producer warpgroup does (:func:`ws_producer`, warp_specialized_tc) and the consumers only wait;
with ``q_tma`` it brings each item's Q tiles too (:func:`tma_q`).
Host side: the K/V (and Q) tensor maps (:func:`kv_tensor_map`, :func:`tma_box`, :func:`q_box`) and the producer's
register split.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from numba_attn.gpu import tma as _tma
from numba_attn.gpu.intrinsics import cp_async_commit, cp_async_wait
from numba_attn.gpu.jit import device
from numba_attn.gpu.mbarrier import mbarrier_arrive_expect_tx, mbarrier_wait
from numba_attn.gpu.ptx_loads import smem_reason
from numba_attn.gpu.tma import tma_load_3d
from numba_attn.gpu.wgmma import make_ring_copy, padded_columns, row_bytes
from numba_attn.phases.tensor_core.mask import key_ends
from numba_attn.phases.tensor_core.pipeline import ring_barriers, ring_functions, wgmma_smem_bytes
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import PLAIN

__all__ = ["load_functions", "cp_async_loads", "tma_loads", "tma_tile", "tma_q", "ws_producer", "ws_producer_regs",
           "ws_consumer_regs", "kv_tensor_map", "kv_tensor_map_at", "tensor_map_pointer", "tma_box", "q_box",
           "tma_smem_reason", "TMA_ALIGN_BYTES"]


@functools.cache
def cp_async_loads(tiles, varlen: bool, ahead: bool, stage=PLAIN):
    """The cp.async ring (``tc_wgmma``): the block's threads copy each tile (16 bytes a copy, one commit group
    a tile, a block barrier before it is read). ``ahead``: tile it+1 must have landed at tile it (one group
    fewer in flight). ``varlen``: K/V copied token-major from the sequence's first key, the ring state recomputed
    from the tile index (carried, the two stages pushed three warpgroups at D=128 causal to 24 bytes of spills)."""
    STAGES = tiles.stages
    # cp.async of one K/V tile into the swizzled ring
    copy_tile = make_ring_copy(tiles.D, tiles.Bc, STAGES, tiles.threads,
                               tiles.padded_d if tiles.padded_d != tiles.D else 0, varlen)
    in_flight_first = STAGES - 2  # copy groups that may stay in flight when tile j is needed
    in_flight = STAGES - 3 if ahead else in_flight_first  # ahead: when tile j+1 is needed
    ring_at = ring_functions(STAGES)[1]
    tile_at = key_tiles(tiles.Bc, stage)[1]

    @device
    def prologue(loads, n_tiles, tid):
        KV, k, v, bars, kvh, Nk, walk = loads
        for st in range(STAGES - 1):  # tiles 0 .. STAGES-2 in flight
            if st < n_tiles:
                copy_tile(KV, k, v, tile_at(walk, st), st, tid, kvh, Nk)
            cp_async_commit()

    @device
    def wait_first(loads, n_tiles):
        cp_async_wait(in_flight_first)  # tile 0 has landed ...
        cuda.syncthreads()  # ... for every thread's copies

    @device
    def acquire(loads, it, n_tiles, ring, refill, tid):
        KV, k, v, bars, kvh, Nk, walk = loads
        if varlen:  # tile it's stage and parity, and the refill's (tile it + STAGES - 1)
            ring = ring_at(it)
            refill = ring_at(it + STAGES - 1)
        cp_async_wait(in_flight)  # the tile needed next has landed (this thread's copies) ...
        cuda.syncthreads()  # ... every thread's; every warpgroup is done with tile it-1
        nxt = it + STAGES - 1
        if nxt < n_tiles:  # refill the buffer of tile it-1
            copy_tile(KV, k, v, tile_at(walk, nxt), refill[0], tid, kvh, Nk)
        cp_async_commit()
        return ring, refill

    @device
    def release(loads, stage, lane):
        pass

    @device
    def finish():
        cp_async_wait(0)

    return prologue, wait_first, acquire, release, finish


@functools.cache
def tma_column_block(tiles):
    """A device function ``box(KV, tmap, bars, bar, at, tile, cb, kvh)``: column block ``cb`` of K or V tile ``tile``
    (``tmap``'s rows from ``tile·Bc``) by one TMA box into the ring at byte ``at`` (a stage's K or V) of the block,
    completing on barrier ``bar``; ``boxes`` of them make a tile."""
    Bc = tiles.Bc
    box_bytes = Bc * tiles.row_bytes
    box_words = tiles.row_bytes // 4  # 32-bit words of a box row: the column step between boxes

    @device
    def box(KV, tmap, bars, bar, at, tile, cb, kvh):
        tma_load_3d(KV, at + cb * box_bytes, tmap, kvh, tile * Bc, box_words * cb, bars, bar)

    return box


def tma_boxes(tiles) -> int:
    """Column blocks of a K or V tile: one TMA box each."""
    return tiles.padded_d * 2 // tiles.row_bytes


@functools.cache
def tma_tile(tiles):
    """A device function ``load(KV, kmap, vmap, bars, tile, stage, kvh)``: K and V of tile ``tile`` into ring stage
    ``stage`` by TMA, one box per column block, after ``expect_tx`` of their bytes on the stage's full barrier."""
    STAGES, TILE = tiles.stages, tiles.tile_bytes
    boxes, box = tma_boxes(tiles), tma_column_block(tiles)

    @device
    def load(KV, kmap, vmap, bars, tile, stage, kvh):
        mbarrier_arrive_expect_tx(bars, stage, 2 * TILE)  # the K and V boxes of the tile, zero fill included
        for cb in range(boxes):
            box(KV, kmap, bars, stage, stage * TILE, tile, cb, kvh)
            box(KV, vmap, bars, stage, (STAGES + stage) * TILE, tile, cb, kvh)

    return load


@functools.cache
def tma_half(tiles, half: int):
    """With ``split_kv``: a device function ``load(KV, map, bars, tile, stage, kvh)`` bringing only K (``half`` 0)
    or only V (1) of tile ``tile`` into ring stage ``stage``, on that half's full barrier
    (:func:`.pipeline.kv_barriers`: K's at ``stage``, V's at ``2·STAGES + stage``)."""
    STAGES, TILE = tiles.stages, tiles.tile_bytes
    boxes, box = tma_boxes(tiles), tma_column_block(tiles)
    BASE, BAR = half * STAGES * TILE, half * 2 * STAGES

    @device
    def load(KV, tmap, bars, tile, stage, kvh):
        mbarrier_arrive_expect_tx(bars, BAR + stage, TILE)
        for cb in range(boxes):
            box(KV, tmap, bars, BAR + stage, BASE + stage * TILE, tile, cb, kvh)

    return load


@functools.cache
def tma_q(tiles):
    """With ``q_tma``: a device function ``load(KV, qmap, bars, bh, blk0, r)`` bringing the Q tiles of the block's
    ``r``-th work item (query rows ``blk0 ..`` of head-batch ``bh``; rows past the end zero-filled) into their
    64-row tiles after the ring, one box a column block and warpgroup, on Q's full barrier; from the second item
    on, once every consumer warp has released the last item's Q (:func:`.pipeline.q_barriers`)."""
    WG, BASE, QT, QF = tiles.warpgroups, tiles.q_base, tiles.q_tile_bytes, tiles.q_bar
    boxes, rb = tma_boxes(tiles), tiles.row_bytes
    BOX, WORDS = 64 * rb, rb // 4

    @device
    def load(KV, qmap, bars, bh, blk0, r):
        if r > 0:
            mbarrier_wait(bars, QF + 1, (r - 1) & 1)  # the consumers are done with item r-1's Q
        mbarrier_arrive_expect_tx(bars, QF, WG * QT)
        for w in range(WG):
            for cb in range(boxes):
                tma_load_3d(KV, BASE + w * QT + cb * BOX, qmap, bh, blk0 + 64 * w, WORDS * cb, bars, QF)

    return load


def q_box(D: int):
    """(box, swizzle) of Q's tensor map (``q_tma``): one column block of a warpgroup's 64-row Q tile, as
    :func:`tma_box` gives a K/V tile's."""
    return tma_box(D, 64)


@functools.cache
def tma_loads(tiles, ahead: bool, producer: bool, stage=PLAIN):
    """The TMA ring: every warp waits on the stage's full barrier (also a warpgroup that skips the tile: its
    release must not count towards a later phase of the empty barrier) and releases it on the empty one.
    Without ``producer`` (``tma_wgmma``) thread 0 issues the first ``STAGES - 1`` tiles and, at tile it, refills
    the stage of tile it-1 once every warp has released it; with ``producer`` the consumers issue nothing."""
    STAGES = tiles.stages
    load_tile = tma_tile(tiles)
    wait_full, release_stage = ring_barriers(STAGES, tiles.warps)[1:]
    tile_at = key_tiles(tiles.Bc, stage)[1]

    @device
    def prologue(loads, n_tiles, tid):
        KV, k, v, bars, kvh, Nk, walk = loads
        if not producer:
            if tid == 0:
                for st in range(STAGES - 1):  # tiles 0 .. STAGES-2 in flight
                    if st < n_tiles:
                        load_tile(KV, k, v, bars, tile_at(walk, st), st, kvh)

    @device
    def wait_first(loads, n_tiles):
        if n_tiles > 0:
            mbarrier_wait(loads[3], 0, 0)  # tile 0 has landed

    @device
    def acquire(loads, it, n_tiles, ring, refill, tid):
        KV, k, v, bars, kvh, Nk, walk = loads
        if not producer:
            nxt = it + STAGES - 1
            if tid == 0 and nxt < n_tiles:  # refill the stage of tile it-1 ...
                if nxt >= STAGES:  # ... once every warp is done with it (the phase before)
                    mbarrier_wait(bars, STAGES + refill[0], refill[1] ^ 1)
                load_tile(KV, k, v, bars, tile_at(walk, nxt), refill[0], kvh)
        if ahead:
            if it + 1 < n_tiles:
                wait_full(bars, ring)
        else:
            wait_full(bars, ring)
        return ring, refill

    @device
    def release(loads, stage, lane):
        release_stage(loads[3], stage, lane)

    @device
    def finish():
        pass

    return prologue, wait_first, acquire, release, finish


@functools.cache
def ws_producer(tiles, causal: bool, stage=PLAIN):
    """A device function ``produce(loads, blk0, ring, loaded, Nq, Nk, off, q_item) -> (ring, loaded)``: the producer
    warpgroup's thread 0 brings every K/V tile of one work item (query rows ``blk0 ..``) into the ring, waiting
    only on the empty barriers. ``ring``: the next tile's stage and phase; ``loaded``: tiles this block brought
    before (a stage is free at once only while fewer than ``STAGES`` were); both come back after the item.
    ``tiles.q_tma``: the item's Q too (:func:`tma_q`; ``q_item = (qmap, bh, r)``, the block's ``r``-th item),
    first for the block's first item and after its first K/V tile for the others, so that the next item's first
    tile is not held behind this item's last S = Q·Kᵀ; ``tiles.q_early`` (Q released at that last S): always first,
    as the first K/V tile waits for the stage of the last item's tile before its last, released after that S."""
    STAGES, Bc = tiles.stages, tiles.Bc
    SPLIT, Q_TMA, Q_FIRST = tiles.split_kv, tiles.q_tma, tiles.q_early
    load_q = tma_q(tiles)
    load_tile = tma_tile(tiles)
    load_k, load_v = tma_half(tiles, 0), tma_half(tiles, 1)
    VB = 2 * STAGES  # (split_kv) V's barriers
    advance = ring_functions(STAGES)[0]
    ends = key_ends(tiles.Br, 64, causal)
    count, tile_at = key_tiles(Bc, stage)[:2]

    @device
    def produce(loads, blk0, ring, loaded, Nq, Nk, off, q_item):
        KV, k, v, bars, kvh, _, walk = loads
        n = count(walk, (ends(blk0, blk0, Nq, Nk, off)[0] + Bc - 1) // Bc)  # (a variant: its visited tiles)
        q_at = 0 if Q_FIRST or q_item[2] == 0 else min(1, n)  # (q_tma) Q before the first tile, or after it
        for it in range(n):
            if Q_TMA and it == q_at:
                load_q(KV, q_item[0], bars, q_item[1], blk0, q_item[2])
            reuse = loaded + it >= STAGES  # the stage's previous tile (the phase before) must be released first
            if SPLIT:  # K as soon as the consumers are done with the stage's K, then V likewise
                if reuse:
                    mbarrier_wait(bars, STAGES + ring[0], ring[1] ^ 1)
                load_k(KV, k, bars, tile_at(walk, it), ring[0], kvh)
                if reuse:
                    mbarrier_wait(bars, VB + STAGES + ring[0], ring[1] ^ 1)
                load_v(KV, v, bars, tile_at(walk, it), ring[0], kvh)
            else:
                if reuse:
                    mbarrier_wait(bars, STAGES + ring[0], ring[1] ^ 1)
                load_tile(KV, k, v, bars, tile_at(walk, it), ring[0], kvh)
            ring = advance(ring)
        if Q_TMA and q_at >= n:  # (an item of at most one tile)
            load_q(KV, q_item[0], bars, q_item[1], blk0, q_item[2])
        return ring, loaded + n

    return produce


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
    return kv_tensor_map_at(_address(a), tuple(a.shape), tuple(a.strides), box, swizzle, a)


class _RawArray:
    """A uint32 array known only by its device address, shape and strides (bytes): what
    :func:`numba_attn.gpu.tma.tensor_map` reads of an array (``__cuda_array_interface__``)."""

    dtype = np.dtype(np.uint32)

    def __init__(self, addr, shape, strides):
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "<u4",
                                         "data": (addr, False), "version": 3}


def kv_tensor_map_at(addr, shape, strides, box, swizzle, a=None):
    """:func:`kv_tensor_map` of the uint32 array at device address ``addr`` of that shape and strides
    (``a``: the array itself where the caller has one). A launch replayed at new addresses
    (:mod:`numba_attn.gpu.replay`) finds its K/V tensor maps here: a dict lookup once they are made. A map made
    while a launch is recorded is set-up work, not part of the launch (:func:`numba_attn.gpu.replay.setup`)."""
    key = (addr, shape, strides, box, swizzle)
    m = _TMAPS.get(key)
    if m is None:
        if addr % TMA_ALIGN_BYTES:
            raise ValueError(f"TMA needs K/V at a {TMA_ALIGN_BYTES}-byte aligned address, got {addr:#x} "
                             f"(misaligned by {addr % TMA_ALIGN_BYTES} bytes)")
        if len(_TMAPS) >= _MAX_TMAPS:
            _TMAPS.clear()
        from numba_attn.gpu.replay import setup

        with setup():
            m = _TMAPS[key] = _tma.tensor_map(_RawArray(addr, shape, strides) if a is None else a, box, swizzle)
    return m


def tensor_map_pointer(m) -> int:
    """The device address of a tensor map made by :func:`kv_tensor_map` (the kernel parameter a replay
    substitutes)."""
    return int(m.device_ctypes_pointer.value)


def clear_tensor_maps():
    """Forget the cached tensor maps (tests)."""
    _TMAPS.clear()


def cached_tensor_maps() -> int:
    """How many tensor maps are cached (tests)."""
    return len(_TMAPS)


def load_functions(tiles, loads: str, varlen: bool, ahead: bool, stage=PLAIN):
    """The five load functions of strategy ``loads``: "cp_async" (:func:`cp_async_loads`), "tma" (thread 0 of the
    consumers issues, :func:`tma_loads`) or "ws" (a producer warpgroup issues); ``stage``: a variant's."""
    if loads == "cp_async":
        return cp_async_loads(tiles, varlen, ahead, stage)
    if loads in ("tma", "ws"):
        return tma_loads(tiles, ahead, loads == "ws", stage)
    raise ValueError(f"loads={loads!r}: one of 'cp_async', 'tma', 'ws'")
