"""The work items' timeline of the warp-specialized wgmma kernel: clock stamps of its roles' steps, compiled in
only when asked (:func:`tracing`), written to an array passed last in the kernel's ``mods``.

Row ``item`` of the array (uint64; ``item = bh · query blocks + query block``, every item written once a call):

====================  ============================================================================================
slot 0                ``sm << 32 | block``: the SM (``%smid``) and the block's linear index
slot 1                global nanoseconds when the producer starts the item (places SMs against each other)
slot 2                cycles at the block's start (the SM's counter; the same for every item of a persistent block)
slots 3, 4            cycles when the producer starts the item (before its first load), and when it has issued
                      its last load
slots 5 + 5w ...      consumer warpgroup ``w``: the item's start, Q in registers (the stamp waits for Q's last
                      register), its first K tile landed (the traced build waits for it once more before the tile
                      loop, which waits for it first), the tile loop done (the last P·V complete), O's stores
                      issued
last slot             global nanoseconds when consumer warpgroup 0 has issued O's stores
====================  ============================================================================================

Off (the default), every stamp is a device function that does nothing and the kernel compiles as before.
:mod:`numba_attn.measure.timeline` runs a phase traced and reads the array.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

from numba import cuda, uint32, uint64

from numba_attn.gpu.clocks import clock64, clock64_after, global_ns, sm_id
from numba_attn.gpu.jit import device

__all__ = ["tracing", "traced", "trace_width", "stamps", "first_tile_stamp", "PRODUCER_SLOTS", "CONSUMER_STEPS"]

_TRACE = contextvars.ContextVar("numba_attn_trace", default=False)
PRODUCER_SLOTS = 5  # sm|block, global ns, block start, producer's item start, its last load
CONSUMER_STEPS = ("start", "q", "k0", "loop", "stored")  # a consumer warpgroup's stamps of an item


@contextlib.contextmanager
def tracing():
    """Within it, the wgmma phases build traced kernels (:func:`traced`), each launch holding its array."""
    token = _TRACE.set(True)
    try:
        yield
    finally:
        _TRACE.reset(token)


def traced() -> bool:
    """Whether a kernel built now is traced (inside :func:`tracing`)."""
    return _TRACE.get()


def trace_width(warpgroups: int) -> int:
    """Slots of an item's row: the producer's, five a consumer warpgroup, the closing global time."""
    return PRODUCER_SLOTS + len(CONSUMER_STEPS) * warpgroups + 1


@functools.cache
def stamps(on: bool, warpgroups: int, Br: int):
    """``(block_start, producer_item, producer_done, consumer_stamp, consumer_after)``, device functions:

    * ``block_start() -> cycles`` (0 when off);
    * ``producer_item(mods, bh, qt, Nq, t_block)``, ``producer_done(mods, bh, qt, Nq)`` (the producer's thread);
    * ``consumer_stamp(mods, bh, blk0, wg0, row0, lane, Nq, step)`` (a warpgroup's first lane stamps step
      ``step``; the last step also writes the closing global time for warpgroup 0);
    * ``consumer_after(mods, bh, blk0, wg0, row0, lane, Nq, step, x)``: the stamp read once ``x`` holds its value.

    ``on`` False: all do nothing."""
    LAST = trace_width(warpgroups) - 1
    STEPS = len(CONSUMER_STEPS)
    if not on:
        @device
        def block_start():
            return uint64(0)

        @device
        def producer_item(mods, bh, qt, Nq, t_block):
            pass

        @device
        def producer_done(mods, bh, qt, Nq):
            pass

        @device
        def consumer_stamp(mods, bh, blk0, wg0, row0, lane, Nq, step):
            pass

        @device
        def consumer_after(mods, bh, blk0, wg0, row0, lane, Nq, step, x):
            pass

        return block_start, producer_item, producer_done, consumer_stamp, consumer_after

    @device
    def item_of(bh, qt, Nq):
        return bh * ((Nq + Br - 1) // Br) + qt  # Br: compile-time

    @device
    def block_start():
        return clock64()

    @device
    def producer_item(mods, bh, qt, Nq, t_block):
        buf = mods[-1]
        i = item_of(bh, qt, Nq)
        block = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
        buf[i, 0] = (uint64(sm_id()) << uint64(32)) | uint64(block)
        buf[i, 1] = global_ns()
        buf[i, 2] = t_block
        buf[i, 3] = clock64()

    @device
    def producer_done(mods, bh, qt, Nq):
        mods[-1][item_of(bh, qt, Nq), 4] = clock64()

    @device
    def consumer_stamp(mods, bh, blk0, wg0, row0, lane, Nq, step):
        if row0 == wg0 and lane == 0:  # the warpgroup's first lane
            buf = mods[-1]
            i = item_of(bh, blk0 // Br, Nq)
            w = (wg0 - blk0) // 64
            buf[i, PRODUCER_SLOTS + STEPS * w + step] = clock64()
            if step == STEPS - 1 and w == 0:
                buf[i, LAST] = global_ns()

    @device
    def consumer_after(mods, bh, blk0, wg0, row0, lane, Nq, step, x):
        if row0 == wg0 and lane == 0:
            i = item_of(bh, blk0 // Br, Nq)
            mods[-1][i, PRODUCER_SLOTS + STEPS * ((wg0 - blk0) // 64) + step] = clock64_after(uint32(x))

    return block_start, producer_item, producer_done, consumer_stamp, consumer_after


@functools.cache
def first_tile_stamp(on: bool, tiles):
    """A device function ``first_tile(mods, bh, blk0, wg0, row0, lane, Nq, bars, ring, n_tiles)``: traced, the
    warpgroup waits for its first tile's K (``ring``: its stage and phase; the tile loop waits for the same phase
    next, which has then completed) and stamps step "k0"; an item without tiles stamps at once. Off: nothing."""
    stamp = stamps(on, tiles.warpgroups, tiles.Br)[3]
    K0 = CONSUMER_STEPS.index("k0")
    if not on:
        @device
        def nothing(mods, bh, blk0, wg0, row0, lane, Nq, bars, ring, n_tiles):
            pass

        return nothing

    from numba_attn.phases.tensor_core.pipeline import kv_barriers

    wait_k = kv_barriers(tiles.stages, tiles.warps, tiles.split_kv)[0]

    @device
    def first_tile(mods, bh, blk0, wg0, row0, lane, Nq, bars, ring, n_tiles):
        if n_tiles > 0:
            wait_k(bars, ring)
        stamp(mods, bh, blk0, wg0, row0, lane, Nq, K0)

    return first_tile

