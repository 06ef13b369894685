"""Hopper building blocks (numba_attn.gpu.mbarrier, .tma, .warpspec) against their
models, one tiny kernel per block.

The kernels run unchanged on both backends: in the simulator they exercise the
fallbacks (barrier state in the shared word, queued TMA copies, named-barrier
generations), on an sm_90 GPU the inline PTX (the ``gpu`` tests at the end
compare the hardware with the same NumPy models). The offline tests compile
the PTX for sm_90a with libNVVM and assemble it with ptxas (nvJitLink) in a
separate process, skipped when libNVVM is missing.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from offline_compile import offline_json
from numba import cuda, int32, uint8, uint32, uint64

from numba_attn.gpu import mbarrier as M
from numba_attn.gpu import tma as T
from numba_attn.gpu import warpspec as W
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel

TMA_ALIGN = None if IS_SIMULATOR else 1024  # a plain global: numba reads it as the literal alignment
sim_only = pytest.mark.skipif(not IS_SIMULATOR, reason="checks the simulator's model")


def _swizzle_model(nbytes, swizzle):
    """Independent NumPy model of the TMA/wgmma swizzle (CUTLASS ``Swizzle<B, 4, 3>``,
    B = log2(S/16)): the permutation ``p`` with ``smem[p[a]] = dense[a]``."""
    a = np.arange(nbytes)
    if swizzle is None:
        return a
    bits = {32: 1, 64: 2, 128: 3}[swizzle]
    yyy = (a >> 7) & ((1 << bits) - 1)  # the row within the 8·S-byte pattern
    return a ^ (yyy << 4)


# -- host-side models ----------------------------------------------------------


def test_barrier_word_model():
    w = M.pack_state(3, 5, -17, 1)
    assert M.unpack_state(w) == (3, 5, -17, 1)
    assert M.unpack_state(M.pack_state(M.MAX_COUNT, M.MAX_COUNT, M.MAX_COUNT, 0)) == (M.MAX_COUNT,) * 3 + (0,)


@pytest.mark.parametrize("swizzle", T.SWIZZLES)
def test_swizzle_is_the_wgmma_permutation(swizzle):
    from numba_attn.gpu import wgmma as WG

    a = np.arange(4096)
    got = T.swizzle_address(a, swizzle)
    assert np.array_equal(got, _swizzle_model(4096, swizzle))
    assert np.array_equal(np.sort(got), a)  # a permutation
    if swizzle:
        assert np.array_equal(got, WG._swizzle(a, swizzle))
        # chunk c of row r of a box S bytes wide lands at c ^ (r mod S/16), as wgmma.tile_offset reads it
        rows = 4096 // swizzle
        for r in range(rows):
            for c in range(swizzle // 16):
                assert got[r * swizzle + 16 * c] == WG.tile_offset(rows, r, c, swizzle)


def test_tensor_map_params():
    p = T.tensor_map_params((8, 300, 128), (300 * 256, 256, 2), np.float16, (1, 64, 64), 128)
    assert p == {"dtype": "FLOAT16", "rank": 3, "dims": (128, 300, 8), "strides": (256, 76800),
                 "box": (64, 64, 1), "swizzle": 128, "bytes": 8192}
    assert T.tensor_map_params((4, 16), (64, 4), np.float32, (4, 4))["bytes"] == 64
    bad = [((8, 64), (128, 2), np.float16, (8, 64), 64),   # 128-byte box row with a 64-byte swizzle
           ((8, 64), (128, 2), np.float16, (8, 4), None),   # 8-byte box row
           ((8, 60), (120, 2), np.float16, (8, 8), None),   # row pitch not a multiple of 16
           ((8, 64), (128, 2), np.float16, (300, 64), None),  # box over 256
           ((8, 64), (256, 4), np.float16, (8, 64), None),   # innermost not contiguous
           ((64,), (2,), np.float16, (64,), None)]           # 1-D
    for shape, strides, dt, box, sw in bad:
        with pytest.raises(ValueError):
            T.tensor_map_params(shape, strides, dt, box, sw)


def test_tma_box_reference_zero_fills():
    a = np.arange(1, 1 + 6 * 5, dtype=np.float32).reshape(6, 5)
    box = T.tma_box_reference(a, (3, 4), (-1, 3))
    assert box[0].tolist() == [0, 0, 0, 0] and box[1].tolist() == [4, 5, 0, 0] and box[2].tolist() == [9, 10, 0, 0]
    assert not T.tma_box_reference(a, (2, 2), (6, 0)).any()


def test_setmaxnreg_counts():
    for n in (24, 40, 232, 240, 256):
        assert W.check_maxnreg(n) == n
    for n in (16, 20, 100, 260):
        with pytest.raises(ValueError):
            W.check_maxnreg(n)


def test_register_split_fits_the_launch_pool():
    """The splits the warp-specialized phases use fit the registers a block starts with; 64 + 2·224 at 384
    threads (65536 > 168·384) does not: that split hung fp8_ws's consumers at setmaxnreg.inc on a GPU."""
    from numba_attn.phases.tensor_core.producer import ws_consumer_regs, ws_producer_regs
    for wg in (1, 2, 3):
        W.check_register_split(128 * (wg + 1), ws_producer_regs(wg), ws_consumer_regs(wg), wg)
    W.check_register_split(384, 56, 224, 2)
    with pytest.raises(ValueError, match="wait forever"):
        W.check_register_split(384, 64, 224, 2)


# -- mbarrier --------------------------------------------------------------------


@functools.cache
def _phase_kernel():
    """Barrier 0: 32 arrivals per phase, three phases, each thread testing the
    phase before its arrival and after the wait. Barrier 1 (one arrival):
    thread 0 completes phase 0 with ``arrive_expect_tx(0)``, then announces 64
    bytes that never come, so phase 1 stays open while phase 0 stays complete."""

    @kernel
    def k(out):
        bars = cuda.shared.array(2, uint64)
        t = cuda.threadIdx.x
        if t == 0:
            M.mbarrier_init(bars, 0, 32)
            M.mbarrier_init(bars, 1, 1)
        cuda.syncthreads()
        for ph in range(3):
            out[t, ph] = M.mbarrier_try_wait_parity(bars, 0, ph % 2)  # before: phase ph not complete
            M.mbarrier_arrive(bars, 0)
            M.mbarrier_wait(bars, 0, ph % 2)
            out[t, 3 + ph] = M.mbarrier_try_wait_parity(bars, 0, ph % 2)  # after: complete
            cuda.syncthreads()  # nobody arrives in phase ph+1 before everyone has tested phase ph
        if t == 0:
            M.mbarrier_arrive_expect_tx(bars, 1, 0)  # arrival and no bytes: the phase completes
            out[t, 6] = M.mbarrier_try_wait_parity(bars, 1, 0)
            M.mbarrier_expect_tx(bars, 1, 64)
            M.mbarrier_arrive(bars, 1)  # bytes pending: the phase stays open
            out[t, 7] = M.mbarrier_try_wait_parity(bars, 1, 1)
            out[t, 8] = M.mbarrier_try_wait_parity(bars, 1, 0)  # the previous phase stays complete

    return k


def test_mbarrier_phases_flip():
    out = np.full((32, 9), 7, np.int32)
    d = cuda.to_device(out)
    _phase_kernel()[1, 32](d)
    out = d.copy_to_host()
    assert (out[:, :3] == 0).all(), "a phase completed before its arrivals"
    assert (out[:, 3:6] == 1).all(), "a phase did not complete after all arrivals"
    assert out[0, 6] == 1 and out[0, 7] == 0 and out[0, 8] == 1


@sim_only
def test_mbarrier_tx_accounting():
    """The barrier word in shared memory follows the hardware's counts (simulator)."""

    @kernel
    def k(words):
        bars = cuda.shared.array(1, uint64)
        M.mbarrier_init(bars, 0, 2)
        words[0] = bars[0]
        M.mbarrier_arrive_expect_tx(bars, 0, 100)
        words[1] = bars[0]
        M.mbarrier_expect_tx(bars, 0, 28)
        words[2] = bars[0]
        M.mbarrier_arrive(bars, 0)
        words[3] = bars[0]
        M.complete_tx(bars, 0, 120)
        words[4] = bars[0]
        M.complete_tx(bars, 0, 8)  # the last bytes complete phase 0
        words[5] = bars[0]
        M.complete_tx(bars, 0, 16)  # bytes may land before they are announced
        words[6] = bars[0]

    w = np.zeros(7, np.uint64)
    d = cuda.to_device(w)
    k[1, 1](d)
    got = [M.unpack_state(x) for x in d.copy_to_host()]
    assert got == [(2, 2, 0, 0), (1, 2, 100, 0), (1, 2, 128, 0), (0, 2, 128, 0), (0, 2, 8, 0), (2, 2, 0, 1),
                   (2, 2, -16, 1)]


@sim_only
def test_mbarrier_misuse_raises():
    @kernel
    def too_many(out):
        bars = cuda.shared.array(1, uint64)
        M.mbarrier_init(bars, 0, 1)
        M.mbarrier_expect_tx(bars, 0, 4)
        M.mbarrier_arrive(bars, 0)
        M.mbarrier_arrive(bars, 0)

    @kernel
    def uninitialised(out):
        bars = cuda.shared.array(1, uint64)
        M.mbarrier_arrive(bars, 0)

    for k, msg in ((too_many, "more arrivals"), (uninitialised, "before mbarrier_init")):
        with pytest.raises(RuntimeError, match=msg):
            k[1, 1](np.zeros(1))


# -- named barriers ---------------------------------------------------------------


@functools.cache
def _named_kernel():
    """Warp 0 writes a value, arrives at barrier 1 (64 threads) and leaves; warp 1
    syncs there and then reads it. Warps 2-3 meet at barrier 2 (64 threads)
    twice, checking each other's writes. Three rounds reuse the ids."""

    @kernel
    def k(out):
        buf = cuda.shared.array(128, int32)
        t = cuda.threadIdx.x
        w = t // 32
        for rnd in range(3):
            if w == 0:
                buf[t] = 100 * rnd + t
                W.named_barrier_arrive(1, 64)
            elif w == 1:
                W.named_barrier_sync(1, 64)
                out[rnd, t] = buf[t - 32]
            else:
                buf[t] = 1000 * rnd + t
                W.named_barrier_sync(2, 64)
                out[rnd, t] = buf[t ^ 32]
                W.named_barrier_sync(2, 64)  # nobody overwrites buf before the partner has read it
            cuda.syncthreads()  # warp 0 must not run ahead into the next round's writes

    return k


def test_named_barriers_order():
    out = np.full((3, 128), -1, np.int32)
    d = cuda.to_device(out)
    _named_kernel()[1, 128](d)
    out = d.copy_to_host()
    t = np.arange(128)
    for rnd in range(3):
        assert np.array_equal(out[rnd, 32:64], 100 * rnd + t[:32])
        assert np.array_equal(out[rnd, 64:], 1000 * rnd + (t[64:] ^ 32))


def _split_kernel(producer, consumer):
    @kernel
    def k(out):
        t = cuda.threadIdx.x
        if t < 128:
            W.setmaxnreg_dec(producer)
        else:
            W.setmaxnreg_inc(consumer)
        out[t] = t

    return k


@sim_only
def test_simulated_setmaxnreg_counts_the_block_pool(monkeypatch):
    """A split that fits the 168 · 384 registers of a 384-thread block runs; 64 + 2·224 (fp8_ws's first split,
    which hung on a GPU) raises in the simulator instead of waiting forever; so does an inc below the count."""
    out = np.zeros(384, np.int32)
    _split_kernel(56, 224)[1, 384](out)
    assert np.array_equal(out, np.arange(384))
    monkeypatch.setattr(W, "_POOL_TIMEOUT_S", 1.0)
    with pytest.raises(RuntimeError, match="waits forever"):
        _split_kernel(64, 224)[1, 384](np.zeros(384, np.int32))
    with pytest.raises(ValueError, match="only raise"):
        _split_kernel(40, 160)[1, 384](np.zeros(384, np.int32))


@sim_only
def test_named_barrier_checks():
    @kernel
    def bad(out):
        W.named_barrier_sync(0, 32)

    @kernel
    def odd(out):
        W.named_barrier_sync(3, 48)

    for k in (bad, odd):
        with pytest.raises(ValueError):
            k[1, 64](np.zeros(1))
    with pytest.raises(ValueError):
        W.setmaxnreg_inc(100)


# -- TMA ------------------------------------------------------------------------


@functools.cache
def _tma_kernel(nbytes, rank):
    """One thread loads one box at the given coordinates into a 1024-aligned shared
    buffer; every thread waits on the barrier and copies the raw bytes out."""

    @kernel
    def k(tmap, coords, out):
        sm = cuda.shared.array(nbytes, uint8, alignment=TMA_ALIGN)
        bars = cuda.shared.array(1, uint64)
        t = cuda.threadIdx.x
        if t == 0:
            T.tensormap_fence_acquire(tmap)
            M.mbarrier_init(bars, 0, 1)
        cuda.syncthreads()
        if t == 0:
            M.mbarrier_arrive_expect_tx(bars, 0, nbytes)
            if rank == 2:
                T.tma_load_2d(sm, 0, tmap, coords[0], coords[1], bars, 0)
            else:
                T.tma_load_3d(sm, 0, tmap, coords[0], coords[1], coords[2], bars, 0)
        M.mbarrier_wait(bars, 0, 0)
        for i in range(t, nbytes, 32):
            out[i] = sm[i]

    return k


def _tma_expected(a, box, coords, swizzle):
    dense = np.ascontiguousarray(T.tma_box_reference(a, box, coords)).reshape(-1).view(np.uint8)
    want = np.zeros_like(dense)
    want[_swizzle_model(dense.size, swizzle)] = dense
    return want


def _tma_case(shape, dtype, box, coords, swizzle, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 1 << 15, size=shape).astype(np.uint16).view(np.float16) if dtype == np.float16 else \
        rng.integers(1, 1 << 30, size=shape).astype(np.uint32)
    d_a = cuda.to_device(a)
    tmap = T.tensor_map(d_a, box, swizzle)
    nbytes = T.box_bytes(box, a.dtype)
    out = cuda.to_device(np.zeros(nbytes, np.uint8))
    _tma_kernel(nbytes, len(shape))[1, 32](tmap, cuda.to_device(np.array(coords, np.int32)), out)
    return out.copy_to_host(), _tma_expected(a, box, coords, swizzle)


TMA_CASES = [  # shape, dtype, box, coords (axis order), swizzle
    ((20, 40), np.uint32, (8, 8), (15, 36), None),      # 5 rows and 4 columns past the end: zeros
    ((16, 16), np.float16, (8, 16), (-3, 0), 32),       # rows before the start, 32-byte rows
    ((24, 32), np.float16, (16, 32), (4, 0), 64),       # 64-byte rows
    ((40, 64), np.float16, (16, 64), (30, 0), 128),     # 128-byte rows (the wgmma K/V column block), OOB rows
    ((3, 20, 64), np.float16, (1, 8, 64), (2, 16, 0), 128),  # 3-D: (head, row, col)
]


@pytest.mark.parametrize("shape,dtype,box,coords,swizzle", TMA_CASES,
                         ids=["plain-oob", "sw32", "sw64", "sw128", "3d-sw128"])
def test_tma_load_matches_model(shape, dtype, box, coords, swizzle):
    got, want = _tma_case(shape, dtype, box, coords, swizzle)
    assert np.array_equal(got, want)


@sim_only
def test_tma_data_lands_only_at_wait():
    """Before the barrier's phase completes the destination still holds the old bytes."""

    @kernel
    def k(tmap, out):
        sm = cuda.shared.array(64, uint8)
        bars = cuda.shared.array(1, uint64)
        for i in range(64):
            sm[i] = 0
        M.mbarrier_init(bars, 0, 1)
        M.mbarrier_arrive_expect_tx(bars, 0, 64)
        T.tma_load_2d(sm, 0, tmap, 0, 0, bars, 0)
        out[0] = sm[0]
        M.mbarrier_wait(bars, 0, 0)
        out[1] = sm[0]

    a = np.full((4, 16), 0x01010101, np.uint32)
    out = cuda.to_device(np.zeros(2, np.uint8))
    k[1, 1](T.tensor_map(a, (4, 4)), out)
    assert out.copy_to_host().tolist() == [0, 1]


# -- producer / consumer ------------------------------------------------------------

STAGES, TILE_R, TILE_C, NTILES = 2, 8, 64, 5  # ring of 2 buffers, 5 tiles of 8 rows × 64 fp16 (128-byte rows)
TILE_BYTES = TILE_R * TILE_C * 2
RING_WORDS = STAGES * TILE_BYTES // 4
RING_BARS = 2 * STAGES


@functools.cache
def _ring_kernel():
    """Warp 0 (one thread) produces: for each tile it waits until the consumers have
    freed the buffer (``empty`` barrier, 32 arrivals), announces the bytes and
    issues a TMA load (``full`` barrier). Warp 1 consumes: waits on ``full``,
    sums each row's 16-byte chunks with the 128-byte swizzle undone, and
    releases the buffer. Phase bits flip once per trip round the ring."""

    @kernel
    def k(tmap, out):
        ring = cuda.shared.array(RING_WORDS, int32, alignment=TMA_ALIGN)
        bars = cuda.shared.array(RING_BARS, uint64)  # full[s] = s, empty[s] = STAGES + s
        t = cuda.threadIdx.x
        if t == 0:
            for s in range(STAGES):
                M.mbarrier_init(bars, s, 1)
                M.mbarrier_init(bars, STAGES + s, 32)
        cuda.syncthreads()
        if t < 32:
            if t == 0:
                for j in range(NTILES):
                    s = j % STAGES
                    if j >= STAGES:
                        M.mbarrier_wait(bars, STAGES + s, (j // STAGES - 1) % 2)
                    M.mbarrier_arrive_expect_tx(bars, s, TILE_BYTES)
                    T.tma_load_2d(ring, s * TILE_BYTES, tmap, j * TILE_R, 0, bars, s)
        else:
            lane = t - 32
            for j in range(NTILES):
                s = j % STAGES
                M.mbarrier_wait(bars, s, (j // STAGES) % 2)
                if lane < TILE_R:  # row `lane` of tile j: sum of its 64 halves as raw 16-bit patterns
                    acc = 0
                    for c in range(TILE_C // 8):
                        cs = c ^ (lane % 8)
                        for e in range(4):
                            wd = ring[(s * TILE_BYTES + lane * 128 + 16 * cs) // 4 + e]
                            acc += (wd & 0xFFFF) + ((wd >> 16) & 0xFFFF)
                    out[j * TILE_R + lane] = acc
                M.mbarrier_arrive(bars, STAGES + s)

    return k


def test_producer_consumer_ring():
    rng = np.random.default_rng(1)
    rows = NTILES * TILE_R - 3  # the last tile runs 3 rows past the tensor: zero-filled
    bits = rng.integers(0, 1 << 12, size=(rows, TILE_C)).astype(np.uint16)
    d = cuda.to_device(bits.view(np.float16))
    tmap = T.tensor_map(d, (TILE_R, TILE_C), 128)
    out = cuda.to_device(np.full(NTILES * TILE_R, -1, np.int32))
    _ring_kernel()[1, 64](tmap, out)
    want = np.zeros(NTILES * TILE_R, np.int64)
    want[:rows] = bits.astype(np.int64).sum(axis=1)
    assert np.array_equal(out.copy_to_host(), want)


# -- TMA boxes are the wgmma ring's column blocks ----------------------------------------


@functools.cache
def _ring_layout_kernel(D, Bc):
    """One K tile of ``Bc`` keys of head ``kvh`` brought twice into 1024-aligned shared memory:
    by the cp.async ring copy of the wgmma phases (``wgmma.make_ring_copy``, 32 threads) and by
    TMA (thread 0: one ``tma_load_3d`` of a (1, Bc, rb/4)-word box per column block of the
    tile, as ``tma_wgmma`` issues them); both tiles' words are written out."""
    from numba_attn.gpu.intrinsics import cp_async_commit, cp_async_wait
    from numba_attn.gpu.wgmma import make_ring_copy, padded_columns, row_bytes

    dp = padded_columns(D)
    rb = row_bytes(dp)
    words = Bc * dp // 2  # one tile of 16-bit elements, in 32-bit words
    ncb, box_bytes = dp * 2 // rb, Bc * rb
    ring_words = 2 * words  # a closure constant: shared.array(..., alignment=) on a GPU needs a literal shape
    copy = make_ring_copy(D, Bc, 1, 32, dp) if dp != D else make_ring_copy(D, Bc, 1, 32)

    @kernel
    def k(tmap, k32, kvh, tile, nk, out):
        ring = cuda.shared.array(ring_words, uint32, alignment=TMA_ALIGN)  # K then V (the same tensor here)
        box = cuda.shared.array(words, uint32, alignment=TMA_ALIGN)
        bars = cuda.shared.array(1, uint64)
        t = cuda.threadIdx.x
        copy(ring, k32, k32, tile, 0, t, kvh, nk)
        cp_async_commit()
        if t == 0:
            T.tensormap_fence_acquire(tmap)
            M.mbarrier_init(bars, 0, 1)
        cp_async_wait(0)
        cuda.syncthreads()
        if t == 0:
            M.mbarrier_arrive_expect_tx(bars, 0, ncb * box_bytes)
            for cb in range(ncb):
                T.tma_load_3d(box, cb * box_bytes, tmap, kvh, tile * Bc, cb * (rb // 4), bars, 0)
        M.mbarrier_wait(bars, 0, 0)
        for i in range(t, words, 32):
            out[0, i] = ring[i]
            out[1, i] = box[i]

    return k


@pytest.mark.parametrize("D", [16, 32, 40, 64, 128])
def test_tma_box_is_the_wgmma_tile_layout(D):
    """A (1, Bc, rb/4)-word box of the (heads, N, D/2) uint32 view with the rb-byte swizzle
    (CU_TENSOR_MAP_SWIZZLE_128B at D >= 64, 64/32-byte at D = 32/16) lands exactly where the
    cp.async ring copy puts the tile and where ``wgmma.tile_offset`` (the descriptors' layout)
    says chunk c of row r lives; keys past the head's end are zeros, not the next head's rows.
    D = 40: one 64-column box, the columns past D zero (the ring copy zero-fills the chunk
    completing the last k-step and leaves the rest unwritten, so only those chunks compare)."""
    from numba_attn.gpu.wgmma import padded_columns, row_bytes, tile_offset
    from numba_attn.phases.tensor_core.producer import tma_box

    Bc, nk, heads, kvh, tile = 16, 37, 3, 1, 2  # tile 2 = keys 32..47: 5 rows, then past the head's end
    dp = padded_columns(D)
    rb = row_bytes(dp)
    rng = np.random.default_rng(D)
    bits = rng.integers(1, 1 << 15, size=(heads, nk, D)).astype(np.uint16)
    k32 = cuda.to_device(bits.view(np.uint32))
    box, swizzle = tma_box(D, Bc)
    assert box == (1, Bc, rb // 4) and swizzle == rb
    tmap = T.tensor_map(k32, box, swizzle)
    words = Bc * dp // 2
    out = cuda.to_device(np.full((2, words), 0xDEADBEEF, np.uint32))
    _ring_layout_kernel(D, Bc)[1, 32](tmap, k32, kvh, tile, nk, out)
    got = out.copy_to_host()
    ring, tma = got[0].view(np.uint8), got[1].view(np.uint8)
    want = np.zeros(words * 4, np.uint8)  # the host model: tile_offset of every 16-byte chunk
    written = np.zeros(words * 4, bool)  # chunks the ring copy writes (all of them unless D is padded)
    per = dp // 8
    for r in range(Bc):
        key = tile * Bc + r
        for c in range(per):
            at = tile_offset(Bc, r, c, rb)
            if key < nk and c < D // 8:
                want[at:at + 16] = bits[kvh, key, 8 * c:8 * c + 8].view(np.uint8)
            written[at:at + 16] = c < (D + 15) // 16 * 2
    assert np.array_equal(tma, want)
    assert np.array_equal(ring[written], want[written])


# -- offline compile (sm_90a PTX through ptxas, no GPU needed) ------------------------

_OFFLINE = r"""
import json, sys
import numba_attn.measure.offline as off
from numba import cuda, types, uint8, uint32, uint64, int32
import numba.cuda.dispatcher as disp

class _Dev:
    compute_capability = (9, 0, "a")

disp.get_current_device = lambda: _Dev()  # device functions (mbarrier_wait) ask for the device
sys.path.insert(0, "tests")
import test_hopper as th

a8, a32, i32 = types.Array(uint8, 1, "C"), types.Array(int32, 2, "C"), types.Array(int32, 1, "C")
m = types.Array(uint64, 1, "C")
cases = {
    "mbarrier": (th._phase_kernel(), (a32,), None),
    "named_barriers": (th._named_kernel(), (a32,), None),
    "tma_2d": (th._tma_kernel(1024, 2), (m, i32, a8), None),
    "tma_3d": (th._tma_kernel(1024, 3), (m, i32, a8), None),
    "ring": (th._ring_kernel(), (m, i32), None),
    "setmaxnreg": (th._setmaxnreg_kernel(), (i32,), (384, 1)),
}
res = {}
for name, (k, sig, lb) in cases.items():
    ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0, "a"), fastmath=True, launch_bounds=lb)
    log = off._link_info(ptx, "sm_90a")
    info = off.parse_ptxas(log)
    info["ptx_ops"] = sorted({ln.split()[0] for ln in ptx.splitlines()
                              if ln.strip().startswith(("mbarrier.", "cp.async.bulk", "bar.", "setmaxnreg",
                                                        "fence.", "barrier."))})
    info["log"] = log
    res[name] = info
print("JSON" + json.dumps(res))
"""


@functools.cache
def _setmaxnreg_kernel():
    @kernel
    def k(out):
        t = cuda.threadIdx.x
        if t < 128:
            W.setmaxnreg_dec(40)
        else:
            W.setmaxnreg_inc(232)
        out[t] = t

    return k


@functools.cache
def _offline_results():
    return offline_json(_OFFLINE, timeout=600)


OFFLINE_OPS = {
    "mbarrier": {"mbarrier.init.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                 "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.expect_tx.relaxed.cta.shared::cta.b64",
                 "mbarrier.try_wait.parity.shared::cta.b64"},
    "named_barriers": {"bar.arrive", "bar.sync"},
    "tma_2d": {"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
               "fence.proxy.tensormap::generic.acquire.gpu"},
    "tma_3d": {"cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"},
    "ring": {"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"},
    "setmaxnreg": {"setmaxnreg.inc.sync.aligned.u32", "setmaxnreg.dec.sync.aligned.u32"},
}


@pytest.mark.parametrize("name", sorted(OFFLINE_OPS))
def test_offline_ptx_assembles_for_sm90a(name):
    """The kernels above compile to sm_90a PTX that ptxas accepts, with the intended
    instructions, no spills."""
    info = _offline_results()[name]
    log = info["log"].splitlines()
    assert info["regs"] is not None, "\n".join([ln for ln in log if "sed " in ln or "rror" in ln] + log[-12:])
    assert info.get("spill_stores", 0) == 0
    missing = OFFLINE_OPS[name] - set(info["ptx_ops"])
    assert not missing, f"{name}: {missing} not in the PTX ({info['ptx_ops']})"


# -- on an sm_90 GPU --------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_tensor_map_is_128_bytes():
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("TMA needs sm_90")
    d = cuda.to_device(np.zeros((64, 64), np.float16))
    tm = T.tensor_map(d, (8, 64), 128)
    assert tm.shape == (16,) and tm.dtype == np.uint64 and tm.device_ctypes_pointer.value % 64 == 0


@pytest.mark.gpu
def test_gpu_setmaxnreg_kernel_runs():
    """The warpgroup register hand-over runs (a kernel of 3 warpgroups); the
    compiled kernel's register count is recorded for the notes."""
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("setmaxnreg needs sm_90a")
    k = kernel(launch_bounds=(384, 1))(_setmaxnreg_kernel().py_func)
    out = cuda.to_device(np.zeros(384, np.int32))
    k[1, 384](out)
    assert np.array_equal(out.copy_to_host(), np.arange(384))
    ovl = next(iter(k.overloads.values()))
    print("setmaxnreg kernel registers at entry:", ovl.regs_per_thread)


def test_ptxas_log_formats():
    """Both info-log formats: ``Used N registers`` with a spill line, and the newer ``used N
    registers, ..., N stack, ..., N bytes lmem`` (local memory stands for the spills it does not name)."""
    from numba_attn.measure import offline as off

    old = ("ptxas info    : Used 162 registers, used 1 barriers, 1056 bytes smem\n"
           "ptxas info    : 8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads")
    new = "info    : used 40 registers, used 1 barriers, 0 stack, 3104 bytes smem, 640 bytes cmem[0], 96 bytes lmem"
    assert off.parse_ptxas(old) == {"regs": 162, "stack_bytes": 8, "spill_stores": 4, "spill_loads": 4,
                                    "smem_bytes": 1056}
    assert off.parse_ptxas(new) == {"regs": 40, "stack_bytes": 0, "lmem_bytes": 96, "spill_stores": 96,
                                    "spill_loads": 96, "smem_bytes": 3104}
