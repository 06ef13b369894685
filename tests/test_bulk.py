"""Bulk reductions and copies shared → global (numba_attn.gpu.bulk) on both backends: blocks add their shared tiles
into one float32 array, or copy staged rows to their places; in the simulator, a source overwritten before the wait loses its sums as it may on the GPU, and a
misaligned reduction is refused."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, float32

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.bulk import bulk_commit, bulk_reduce_add_f32, bulk_store, bulk_wait, bulk_wait_read
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.mbarrier import fence_proxy_async

ALIGN = None if IS_SIMULATOR else 16
N = 64


@functools.cache
def _kernel(early_overwrite: bool):
    @kernel
    def add_tiles(dst, src):
        s = cuda.shared.array(N, float32, alignment=ALIGN) if ALIGN else cuda.shared.array(N, float32)
        tid = cuda.threadIdx.x
        s[tid] = src[cuda.blockIdx.x, tid]
        fence_proxy_async()
        cuda.syncthreads()
        if tid == 0:
            bulk_reduce_add_f32(dst, 0, s, 0, N)  # all of it into dst[0:64]
            bulk_reduce_add_f32(dst, N + 4 * (cuda.blockIdx.x % 2), s, 32, 32)  # its second half, shifted
            bulk_commit()
            if not early_overwrite:
                bulk_wait_read(0)
        cuda.syncthreads()
        s[tid] = float32(0.0)  # the source written again: only after the wait
        cuda.syncthreads()
        if tid == 0:
            bulk_wait(0)

    return add_tiles


def _expected(src):
    out = np.zeros(N + 36, np.float32)
    out[:N] = src.sum(0)
    for b in range(src.shape[0]):
        out[N + 4 * (b % 2): N + 4 * (b % 2) + 32] += src[b, 32:]
    return out


def test_blocks_add_their_tiles_into_one_array():
    rng = np.random.default_rng(1)
    src = rng.standard_normal((6, N)).astype(np.float32)
    dst = cuda.to_device(np.zeros(N + 36, np.float32))
    _kernel(False)[6, N](dst, cuda.to_device(src))
    np.testing.assert_allclose(dst.copy_to_host(), _expected(src), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not IS_SIMULATOR, reason="undefined on the GPU: the simulator's model of a missing wait")
def test_a_source_written_before_the_wait_loses_its_sums():
    src = np.ones((2, N), np.float32)
    dst = cuda.to_device(np.zeros(N + 36, np.float32))
    _kernel(True)[2, N](dst, cuda.to_device(src))
    assert not np.allclose(dst.copy_to_host(), _expected(src))


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's checks")
def test_misaligned_or_out_of_bounds_reductions_are_refused():
    s = np.zeros(16, np.float32)
    d = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="16 bytes"):
        bulk_reduce_add_f32(d, 1, s, 0, 4)
    with pytest.raises(ValueError, match="16 bytes"):
        bulk_reduce_add_f32(d, 0, s, 0, 6)
    with pytest.raises(IndexError):
        bulk_reduce_add_f32(d, 8, s, 0, 12)
    with pytest.raises(TypeError):
        bulk_reduce_add_f32(d.astype(np.float64), 0, s, 0, 4)


def test_vector_reductions_from_registers_add_up_and_refuse_misaligned():
    """red_add_f32x4: every thread of several blocks adds 4 values at a 16-byte aligned spot (shared by the
    blocks); the sums match, on the GPU too (atomic per element); an offset not a multiple of 4 is refused in
    the simulator (it would fault on the GPU)."""
    from numba_attn.gpu.bulk import red_add_f32x4

    @kernel
    def add4(dst, src, shift):
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        red_add_f32x4(dst, 4 * t + shift, src[b, 4 * t], src[b, 4 * t + 1], src[b, 4 * t + 2], src[b, 4 * t + 3])

    rng = np.random.default_rng(3)
    src = rng.standard_normal((5, 4 * 8)).astype(np.float32)
    dst = np.zeros(4 * 8 + 4, np.float32)
    d = cuda.to_device(dst)
    add4[5, 8](d, cuda.to_device(src), 4)
    want = np.zeros_like(dst)
    want[4:] = src.sum(axis=0)
    np.testing.assert_allclose(d.copy_to_host(), want, rtol=1e-5, atol=1e-6)
    if IS_SIMULATOR:
        with pytest.raises(Exception, match="multiple of 4"):
            add4[1, 8](cuda.to_device(dst), cuda.to_device(src), 2)


@functools.cache
def _copy_rows():
    """Each block stages rows of a (rows, 8) uint32 array in shared memory and copies them out, a bulk copy a row
    (issued by one thread a row), into row-strided places of a 3-D destination."""
    @kernel
    def copy_rows(dst, src):
        s = cuda.shared.array(64, float32, alignment=ALIGN) if ALIGN else cuda.shared.array(64, float32)
        b = cuda.blockIdx.x
        tid = cuda.threadIdx.x  # 64 threads: 8 rows of 8 words
        s[tid] = src[b, tid]
        fence_proxy_async()
        cuda.syncthreads()
        if tid < 8:
            bulk_store(dst, b * dst.strides[0] + tid * dst.strides[1], s, 32 * tid, 32)
            bulk_commit()
            bulk_wait_read(0)

    return copy_rows


def test_bulk_stores_copy_staged_rows_to_their_places():
    rng = np.random.default_rng(4)
    src = rng.standard_normal((3, 64)).astype(np.float32)
    dst = cuda.to_device(np.zeros((3, 8, 8), np.float32))
    _copy_rows()[3, 64](dst, cuda.to_device(src))
    np.testing.assert_array_equal(dst.copy_to_host(), src.reshape(3, 8, 8))


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's checks")
def test_misaligned_or_overlong_bulk_stores_are_refused():
    s = np.zeros(64, np.float32)
    d = np.zeros((2, 4, 8), np.float32)  # rows of 32 bytes
    with pytest.raises(ValueError, match="16 bytes"):
        bulk_store(d, 4, s, 0, 16)
    with pytest.raises(ValueError, match="16 bytes"):
        bulk_store(d, 0, s, 0, 24)
    with pytest.raises(IndexError, match="past the row"):
        bulk_store(d, 16, s, 0, 32)  # half a row in: the copy would run into the next row
    with pytest.raises(IndexError):
        bulk_store(d, 0, s, 240, 32)  # past the shared source
    with pytest.raises(IndexError):
        bulk_store(d, 2 * 128, s, 0, 16)  # past the destination
