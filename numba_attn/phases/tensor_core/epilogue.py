"""The epilogue of the tensor-core phases: O divided by the row sums and stored from the accumulator fragments,
straight to global memory or (``o_smem``) staged in shared memory and copied out a row a bulk copy."""
from __future__ import annotations

import functools

from numba import float32, uint32

from numba_attn.gpu.bulk import bulk_commit, bulk_store, bulk_wait_read
from numba_attn.gpu.intrinsics import pack_bf16x2, pack_f16x2
from numba_attn.gpu.jit import device
from numba_attn.gpu.loads import st_shared_b32
from numba_attn.gpu.mbarrier import fence_proxy_async
from numba_attn.gpu.warp import quad_sum
from numba_attn.gpu.warpspec import named_barrier_sync
from numba_attn.variants.sinks import lse_parts

__all__ = ["row_inverses", "store_fragments", "store_rows", "lse_fragments", "o_store", "O_BARRIER"]

O_BARRIER = 8  # named barriers 8, 9, 10: warpgroup w's staged O tile (q_smem's are 1-3, pingpong's 1-2)

UNSEEN = float32(-1e30)  # below the stage's "saw no key" bound: the store writes -inf


@device
def row_inverses(l_lo, l_hi):
    """``(1/l_lo, 1/l_hi)`` of the lane's two rows, their sums reduced over the quad first; 0 for a row that saw no
    key (rows past Nq)."""
    l_lo = quad_sum(l_lo)
    l_hi = quad_sum(l_hi)
    inv_lo = float32(1.0) / l_lo if l_lo > float32(0.0) else float32(0.0)
    inv_hi = float32(1.0) / l_hi if l_hi > float32(0.0) else float32(0.0)
    return inv_lo, inv_hi


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
        inv_lo, inv_hi = row_inverses(l_lo, l_hi)
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
def store_rows(DT: int, kind: str):
    """:func:`store_fragments` (16-bit ``kind``) with the two rows' views made once: a store is then its row's
    address and a constant offset (759 → 244 instructions at D128, instead of strides reloaded, 64-bit index products
    and a wraparound check a store), for kernels with the registers to hold the two views."""
    pack = pack_bf16x2 if kind == "bf16" else pack_f16x2

    @device
    def store(o, bh, r_lo, acc, base, l_lo, l_hi, Nq, t):
        r_hi = r_lo + 8
        inv_lo, inv_hi = row_inverses(l_lo, l_hi)
        last = Nq - 1  # (a row past Nq stores nothing: its view is any row's)
        o_lo = o[bh, r_lo if r_lo < Nq else last]
        o_hi = o[bh, r_hi if r_hi < Nq else last]
        t = uint32(t)  # (an unsigned column index: no wraparound check a store)
        for dt in range(DT):
            i0 = base + 4 * dt
            if r_lo < Nq:
                o_lo[uint32(4 * dt) + t] = pack(acc[i0] * inv_lo, acc[i0 + 1] * inv_lo)
            if r_hi < Nq:
                o_hi[uint32(4 * dt) + t] = pack(acc[i0 + 2] * inv_hi, acc[i0 + 3] * inv_hi)

    return store


@functools.cache
def o_store(tiles, bf16: bool):
    """A device function ``store_o(o, KV, item, acc, l_lo, l_hi, Nq, lane_ids)``: a consumer warpgroup's
    epilogue of work item ``item = (blk0, wg0, row0, bh, r)``. O in registers divided by the row sums and

    * stored from the fragments (:func:`store_fragments`; ``tiles.o_rows``: through the rows' views,
      :func:`store_rows`), or
    * ``tiles.o_smem`` (FlashAttention-3's epilogue through shared memory): written into the warpgroup's staged
      tile at byte ``tiles.o_base`` of the ring's view ``KV`` (rows of ``o_pitch`` bytes: a quad's eight rows on
      32 banks), made visible to the copy engine (``fence.proxy.async``, the warpgroup's named barrier), then the
      warpgroup's first warp copies it out, a lane a row (``cp.async.bulk``, rows below ``Nq``), and waits until
      the copies have read it. A barrier before the writes keeps them behind the last item's copies (persistent
      blocks)."""
    kind = "bf16" if bf16 else "f16"
    if not tiles.o_smem:
        store = (store_rows if tiles.o_rows else store_fragments)(tiles.o_tiles, kind)

        @device
        def store_registers(o, KV, item, acc, l_lo, l_hi, Nq, lane_ids):
            store(o, item[3], item[2] + lane_ids[2], acc, 0, l_lo, l_hi, Nq, lane_ids[3])

        return store_registers

    pack = pack_bf16x2 if bf16 else pack_f16x2
    DT, PITCH, O_BASE, O_TILE, ROW = tiles.o_tiles, tiles.o_pitch, tiles.o_base, tiles.o_tile_bytes, 2 * tiles.D

    @device
    def store_staged(o, KV, item, acc, l_lo, l_hi, Nq, lane_ids):
        blk0, wg0, row0, bh = item[:4]
        lane, g, t = lane_ids[1], lane_ids[2], lane_ids[3]
        w = (wg0 - blk0) // 64
        o_off = O_BASE + w * O_TILE  # this warpgroup's staged tile
        r = row0 - wg0 + g  # the lane's first row in it
        inv_lo, inv_hi = row_inverses(l_lo, l_hi)
        named_barrier_sync(O_BARRIER + w, 128)  # the last item's copies have read the tile
        for dt in range(DT):
            i0 = 4 * dt
            st_shared_b32(KV, o_off + r * PITCH + 16 * dt + 4 * t, pack(acc[i0] * inv_lo, acc[i0 + 1] * inv_lo))
            st_shared_b32(KV, o_off + (r + 8) * PITCH + 16 * dt + 4 * t,
                          pack(acc[i0 + 2] * inv_hi, acc[i0 + 3] * inv_hi))
        fence_proxy_async()  # the generic proxy's stores visible to the copy engine
        named_barrier_sync(O_BARRIER + w, 128)
        if row0 == wg0:  # the warpgroup's first warp: rows lane and lane + 32
            for half in range(2):
                rr = lane + 32 * half
                if wg0 + rr < Nq:
                    bulk_store(o, bh * o.strides[0] + (wg0 + rr) * o.strides[1], KV, o_off + rr * PITCH, ROW)
            bulk_commit()
            bulk_wait_read(0)  # the tile read: it may be written again, and the block may exit

    return store_staged


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
