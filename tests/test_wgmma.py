"""``wgmma.mma_async`` (numba_attn.gpu.wgmma) against NumPy, one warpgroup at a time.

The kernel below runs unchanged on both backends: in the simulator it
exercises the warpgroup fallback (registers gathered from 128 threads, B read
from shared memory through the descriptor arithmetic and the swizzle), on a
Hopper GPU the inline PTX. It stages a random B tile into shared memory in the
swizzled layout a phase uses, builds the A fragments from a uint32 view of a
random f16/bf16 matrix, and compares every thread's accumulator fragment with
a float64 product. A tile stored without the swizzle must come out wrong.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, float32, uint32

from numba_attn.gpu import wgmma as WG
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

ALIGN = None if IS_SIMULATOR else 1024  # the swizzle needs 8·rb-byte aligned tiles


@functools.cache
def _kernel(kind, N, KS, trans_b, zero, R, C, swizzle):
    """A: 64 × 16·KS; B tile: R rows × C columns (K-major: R = N, C = 16·KS;
    MN-major: R = 16·KS, C = N)."""
    rb = WG.row_bytes(C)
    per = rb // 16
    if trans_b:
        offs, lbo, sbo = WG.mnmajor_params(R, KS, rb)
    else:
        offs, lbo, sbo = WG.kmajor_params(R, KS, rb)
    op = WG.make_wgmma_rs(kind, N, trans_b, zero, offs, lbo, sbo, rb)
    NA = N // 2
    NW = R * C // 2  # words in the tile
    CH = C // 8  # 16-byte chunks per tile row
    NAR = 4 * KS  # A registers (array shapes must be compile-time literals)

    @kernel
    def k(aw, tile, cin, out):
        sm = cuda.shared.array(NW, uint32, alignment=ALIGN)
        T = cuda.threadIdx.x
        for idx in range(T, R * CH, 128):
            r = idx // CH
            c = idx % CH
            blk = c // per
            cc = c % per
            if swizzle:
                cc = cc ^ (((r * rb) >> 7) & (per - 1))
            w0 = (blk * R * rb + r * rb + 16 * cc) // 4
            for x in range(4):
                sm[w0 + x] = tile[r, 4 * c + x]
        cuda.syncthreads()
        w = T // 32
        lane = T % 32
        g = lane // 4
        t = lane % 4
        a = cuda.local.array(NAR, uint32)
        for s in range(KS):
            a[4 * s + 0] = aw[16 * w + g, 8 * s + t]
            a[4 * s + 1] = aw[16 * w + g + 8, 8 * s + t]
            a[4 * s + 2] = aw[16 * w + g, 8 * s + t + 4]
            a[4 * s + 3] = aw[16 * w + g + 8, 8 * s + t + 4]
        acc = cuda.local.array(NA, float32)
        for i in range(NA):
            acc[i] = cin[T, i]
        op(acc, a, 0, sm, 0)
        for i in range(NA):
            out[T, i] = acc[i]

    return k


def _run(kind, N, KS, trans_b, zero, seed=0, swizzle=True):
    dt = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((64, 16 * KS)).astype(dt)
    B = rng.standard_normal((16 * KS, N)).astype(dt)
    C = rng.standard_normal((128, N // 2)).astype(np.float32)
    tile = np.ascontiguousarray(B if trans_b else B.T)  # MN-major: rows = k; K-major: rows = n
    R, Ccols = tile.shape
    out = np.full((128, N // 2), np.nan, np.float32)
    d_out = cuda.to_device(out)
    k = _kernel(kind, N, KS, trans_b, zero, R, Ccols, swizzle)
    k[1, 128](cuda.to_device(A.view(np.uint32)), cuda.to_device(tile.view(np.uint32)), cuda.to_device(C), d_out)
    got = d_out.copy_to_host()
    D = A.astype(np.float64) @ B.astype(np.float64)
    drow, dcol = WG._d_index(N)
    want = D[drow, dcol] + (0.0 if zero else C.astype(np.float64))
    return got, want


def _err(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


SIM_CASES = [  # small: every case is a 128-thread block in the simulator
    ("f16", 16, 2, False, True),   # K-major B, 32-byte rows (K = 32 ... one column block of 16 elements each)
    ("f16", 32, 1, True, False),   # MN-major B (trans), 64-byte rows, accumulate into C
    ("bf16", 64, 4, False, False),  # K-major, 128-byte rows
    ("f16", 128, 1, True, True),   # MN-major, two 64-column blocks (LBO)
]
GPU_CASES = SIM_CASES + [
    ("f16", 64, 8, False, True),   # S = Q·Kᵀ at D=128, Bc=64
    ("f16", 128, 4, True, False),  # O += P·V at D=128, Bc=64
    ("bf16", 128, 4, True, False),
    ("f16", 64, 4, True, False),   # O += P·V at D=64
    ("f16", 128, 8, False, True),  # S at D=128, Bc=128
]


def _ids(cases):
    return [f"{k}-n{n}-ks{ks}-{'mn' if tb else 'k'}major-{'zero' if z else 'acc'}" for k, n, ks, tb, z in cases]


@pytest.mark.parametrize("kind,N,KS,trans_b,zero", SIM_CASES if IS_SIMULATOR else GPU_CASES,
                         ids=_ids(SIM_CASES if IS_SIMULATOR else GPU_CASES))
def test_wgmma_matches_numpy(kind, N, KS, trans_b, zero):
    if kind == "bf16" and ml_dtypes is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    got, want = _run(kind, N, KS, trans_b, zero)
    assert np.isfinite(got).all(), "unwritten or non-finite accumulator values"
    assert _err(got, want) < 1e-5


@pytest.mark.parametrize("trans_b", [False, True], ids=["kmajor", "mnmajor"])
def test_unswizzled_tile_is_wrong(trans_b):
    """The same data stored without the XOR swizzle must give a different
    product: the layout model (simulator) or the hardware (GPU) reads the
    swizzled addresses."""
    got, want = _run("f16", 64, 4, trans_b, True, swizzle=False)
    assert _err(got, want) > 1e-2


def test_layout_model():
    """Host model of the layouts: offsets of the descriptor parameters and the
    swizzle (chunk c of row r at c ^ (r mod 8) for 128-byte rows)."""
    assert WG.row_bytes(128) == 128 and WG.row_bytes(32) == 64 and WG.row_bytes(16) == 32
    with pytest.raises(ValueError):
        WG.row_bytes(48)
    assert WG.tile_offset(64, 9, 3, 128) == 9 * 128 + 16 * (3 ^ 1)
    assert WG.tile_offset(64, 9, 11, 128) == 64 * 128 + 9 * 128 + 16 * (3 ^ 1)
    assert WG.kmajor_params(64, 8, 128) == ((0, 32, 64, 96, 8192, 8224, 8256, 8288), 16, 1024)
    assert WG.mnmajor_params(64, 4, 128) == ((0, 2048, 4096, 6144), 8192, 1024)
    # every element of a K-major operand is read exactly once from a distinct address
    offs, lbo, sbo = WG.kmajor_params(64, 8, 128)
    addr = WG.b_addresses(0, 64, offs, lbo, sbo, False, 128)
    assert len(np.unique(addr)) == addr.size and addr.max() < 64 * 128 * 2
