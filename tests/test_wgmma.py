"""``wgmma.mma_async`` (numba_attn.gpu.wgmma) against NumPy, one warpgroup at a time.

The kernel below runs unchanged on both backends: in the simulator it
exercises the warpgroup fallback (registers gathered from 128 threads, B read
from shared memory through the descriptor arithmetic and the swizzle), on a
Hopper GPU the inline PTX. It stages a random B tile into shared memory in the
swizzled layout a phase uses, builds the A fragments from a uint32 view of a
random f16/bf16 matrix, and compares every thread's accumulator fragment with
a float64 product. A tile stored without the swizzle must come out wrong.
The FP8 kind (``e4m3``, k32 steps, K-major B only) runs through the same
kernel with byte-wide columns; its PTX is assembled offline for sm_90a.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, float32, uint32

from numba_attn.gpu import wgmma as WG
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel
from offline_compile import offline_json

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

ALIGN = None if IS_SIMULATOR else 1024  # the swizzle needs 8·rb-byte aligned tiles


@functools.cache
def _kernel(kind, N, KS, trans_b, zero, R, C, swizzle):
    """A: 64 × 16·KS (e4m3: 64 × 32·KS); B tile: R rows × C columns (K-major: R = N,
    C = 16·KS, e4m3 32·KS; MN-major: R = 16·KS, C = N)."""
    CB = C * WG.ELEMENT_BYTES[kind]  # bytes per tile row
    C = CB // 2  # the row in 16-bit columns: the layout is the same in bytes
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


@functools.cache
def _kernel_ss(kind, N, KS, trans_b, zero, R, C, trans_a=False):
    """A from shared memory: a 64 × 16·KS K-major tile stored after the B tile (R × C), both swizzled;
    ``trans_a``: A stored transposed (16·KS rows of 64 columns), read as an MN-major operand."""
    rb = WG.row_bytes(C)
    rba = WG.row_bytes(64 if trans_a else 16 * KS)
    assert rb == rba, "the test keeps one row width for both operands"
    offs, lbo, sbo = (WG.mnmajor_params if trans_b else WG.kmajor_params)(R, KS, rb)
    a_layout = WG.mnmajor_params(16 * KS, KS, rb) if trans_a else None
    op = WG.make_wgmma_ss(kind, N, trans_b, zero, offs, lbo, sbo, rb, True, a_layout)
    NA = N // 2
    NW = R * C // 2
    AW = 64 * 8 * KS  # words of A
    A_OFF = (NW * 4 + 1023) // 1024 * 1024  # A's byte offset: 1024-aligned after B
    WORDS = A_OFF // 4 + AW  # (a compile-time constant: the shared array's size)
    per = rb // 16

    @kernel
    def k(aw, tile, cin, out):
        sm = cuda.shared.array(WORDS, uint32, alignment=ALIGN)
        T = cuda.threadIdx.x
        for which in range(2):  # B tile (R × C), then A (64 × 16·KS) at A_OFF
            src = tile if which == 0 else aw
            rows = R if which == 0 else (16 * KS if trans_a else 64)
            ch = (C if which == 0 else (64 if trans_a else 16 * KS)) // 8
            base = 0 if which == 0 else A_OFF
            for idx in range(T, rows * ch, 128):
                r = idx // ch
                c = idx % ch
                cc = (c % per) ^ (((r * rb) >> 7) & (per - 1))
                w0 = (base + (c // per) * rows * rb + r * rb + 16 * cc) // 4
                for x in range(4):
                    sm[w0 + x] = src[r, 4 * c + x]
        cuda.syncthreads()
        acc = cuda.local.array(NA, float32)
        for i in range(NA):
            acc[i] = cin[T, i]
        op(acc, sm, A_OFF, sm, 0)
        for i in range(NA):
            out[T, i] = acc[i]

    return k


SS_CASES = [  # (kind, N, KS, trans_b, zero): A from shared memory, rows of 128 bytes (KS = 4) or 64 (KS = 2)
    ("f16", 16, 4, False, True),   # Sᵀ = K·Qᵀ shape (B K-major)
    ("bf16", 32, 2, True, False),  # B MN-major, accumulate (rows of 64 bytes: 32 columns)
]


def _check_ss(kind, N, KS, trans_b, zero, seed, trans_a=False):
    """``make_wgmma_ss`` on random A (64 × 16·KS; ``trans_a``: stored transposed, an MN-major tile) and B
    (16·KS × N) from swizzled shared memory, against a float64 product."""
    if kind == "bf16" and ml_dtypes is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    rng = np.random.default_rng(seed)
    dt = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    A = rng.standard_normal((64, 16 * KS)).astype(dt)
    B = rng.standard_normal((16 * KS, N)).astype(dt)
    C = rng.standard_normal((128, N // 2)).astype(np.float32)
    tile = np.ascontiguousarray(B if trans_b else B.T)
    d_out = cuda.to_device(np.full((128, N // 2), np.nan, np.float32))
    _kernel_ss(kind, N, KS, trans_b, zero, *tile.shape, trans_a)[1, 128](
        cuda.to_device(np.ascontiguousarray(A.T if trans_a else A).view(np.uint32)),
        cuda.to_device(tile.view(np.uint32)), cuda.to_device(C), d_out)
    got = d_out.copy_to_host()
    assert np.isfinite(got).all(), "unwritten or non-finite accumulator values"
    assert _err(got, _want(A, B, C, N, zero)) < 1e-5


@pytest.mark.parametrize("kind,N,KS,trans_b,zero", SS_CASES + ([] if IS_SIMULATOR else [("f16", 64, 8, False, True)]),
                         ids=lambda v: str(v))
def test_wgmma_ss_matches_numpy(kind, N, KS, trans_b, zero):
    """A and B both from swizzled shared memory (``make_wgmma_ss``) against a float64 product."""
    _check_ss(kind, N, KS, trans_b, zero, N + KS)


@pytest.mark.parametrize("kind,N,KS,trans_b,zero", [("f16", 64, 4, True, False), ("bf16", 16, 4, False, True)],
                         ids=lambda v: str(v))
def test_wgmma_ss_transposed_a_matches_numpy(kind, N, KS, trans_b, zero):
    """A read transposed (``a_layout``: an MN-major tile of 16·KS rows by the product's 64 rows, as dSᵀ is read
    from a dS tile for dK += dSᵀ·Q) against a float64 product."""
    _check_ss(kind, N, KS, trans_b, zero, 3 * N + KS, trans_a=True)


def _e4m3_codes(rng, shape):
    """Random float8 e4m3fn codes, the NaN codes (0x7F, 0xFF) excluded: every finite value, both signs."""
    return (rng.integers(0, 0x7F, shape) | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)


def _run(kind, N, KS, trans_b, zero, seed=0, swizzle=True):
    rng = np.random.default_rng(seed)
    if kind == "e4m3":  # ml_dtypes decodes the reference's operands
        A = _e4m3_codes(rng, (64, 32 * KS)).view(ml_dtypes.float8_e4m3fn)
        B = _e4m3_codes(rng, (32 * KS, N)).view(ml_dtypes.float8_e4m3fn)
    else:
        dt = np.float16 if kind == "f16" else ml_dtypes.bfloat16
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
    return got, _want(A, B, C, N, zero)


def _want(A, B, C, N, zero):
    D = A.astype(np.float64) @ B.astype(np.float64)
    drow, dcol = WG._d_index(N)
    return D[drow, dcol] + (0.0 if zero else C.astype(np.float64))


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


E4M3_CASES = [  # (N, k-steps of 32, zero): K-major B only
    (8, 1, True),    # 32-byte rows
    (8, 2, False),   # 64-byte rows, accumulate into C
    (64, 4, False),  # 128-byte rows (S = Q·Kᵀ at D=128 in fp8)
    (64, 1, True),
]


@pytest.mark.parametrize("N,KS,zero", E4M3_CASES,
                         ids=[f"n{n}-ks{ks}-{'zero' if z else 'acc'}" for n, ks, z in E4M3_CASES])
def test_wgmma_e4m3_matches_numpy(N, KS, zero):
    """FP8 e4m3 inputs (k32 steps, four codes per A register), f32 accumulators: every
    finite code, against a float64 product of the ml_dtypes-decoded operands.

    The simulator's fallback is exact. Hopper's FP8 wgmma adds its products with fewer
    bits than fp32 (measured on an H200: 1.1e-4 to 4.0e-4 of the largest value, one to
    four k-steps), so on a GPU the bound is 1e-3; a misread tile errs by more than 1e-2
    (``test_unswizzled_e4m3_tile_is_wrong``)."""
    if ml_dtypes is None:
        pytest.skip("the e4m3 reference needs ml_dtypes")
    got, want = _run("e4m3", N, KS, False, zero, seed=N + KS)
    assert np.isfinite(got).all(), "unwritten or non-finite accumulator values"
    assert _err(got, want) < (1e-6 if IS_SIMULATOR else 1e-3)


def test_wgmma_e4m3_refuses_trans_b():
    """8-bit wgmma reads only a K-major B: the transposed operand is refused at build time."""
    offs, lbo, sbo = WG.mnmajor_params(64, 2, 128)
    with pytest.raises(ValueError, match="K-major"):
        WG.make_wgmma_rs("e4m3", 64, True, True, offs, lbo, sbo, 128)
    with pytest.raises(ValueError, match="wgmma kind"):
        WG.make_wgmma_rs("e5m2", 64, False, True, offs, lbo, sbo, 128)


def test_e4m3_fragment_model():
    """Host model of the FP8 operands: A register i of a k32 step holds 4 consecutive columns at the
    byte positions of the 16-bit k16 fragment; K-major B reads 32 distinct bytes per row and step."""
    rows, cols = WG._a_index(2, 1)
    assert rows[5, 0] == 1 and cols[5, 0] == 4 and cols[5, 2] == 20 and cols[5, 4] == 36  # lane 5: g=1, t=1
    rows16, cols16 = WG._a_index(2)
    assert np.array_equal(rows, rows16) and np.array_equal(cols, 2 * cols16)
    offs, lbo, sbo = WG.kmajor_params(64, 4, 128)
    addr = WG.b_addresses(0, 64, offs, lbo, sbo, False, 128, esize=1)
    assert addr.shape == (128, 64) and len(np.unique(addr)) == addr.size and addr.max() < 64 * 128
    # the even k of a k32 step are the bytes where the 16-bit k16 step's elements start
    assert np.array_equal(addr[::2], WG.b_addresses(0, 64, offs, lbo, sbo, False, 128))
    tab = WG._e4m3_table()
    assert tab[0x38] == 1.0 and tab[0x7E] == 448.0 and tab[0x01] == 2.0 ** -9 and tab[0x80] == 0.0
    assert np.isnan(tab[0x7F]) and np.isnan(tab[0xFF]) and np.isfinite(np.delete(tab, [0x7F, 0xFF])).all()
    if ml_dtypes is not None:
        ok = np.delete(np.arange(256, dtype=np.uint8), [0x7F, 0xFF])
        assert np.array_equal(tab[ok], ok.view(ml_dtypes.float8_e4m3fn).astype(np.float64))


@pytest.mark.parametrize("trans_b", [False, True], ids=["kmajor", "mnmajor"])
def test_unswizzled_tile_is_wrong(trans_b):
    """The same data stored without the XOR swizzle must give a different
    product: the layout model (simulator) or the hardware (GPU) reads the
    swizzled addresses."""
    got, want = _run("f16", 64, 4, trans_b, True, swizzle=False)
    assert _err(got, want) > 1e-2


def test_unswizzled_e4m3_tile_is_wrong():
    """The FP8 kind reads the swizzled addresses too: the same codes stored without the XOR
    swizzle give a product off by far more than the GPU tolerance above."""
    if ml_dtypes is None:
        pytest.skip("the e4m3 reference needs ml_dtypes")
    got, want = _run("e4m3", 64, 4, False, True, swizzle=False)
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


# -- offline compile (sm_90a PTX through ptxas, no GPU needed) ------------------------

_OFFLINE = r"""
import json, sys
import numba_attn.measure.offline as off
from numba import cuda, types, uint32, float32
import numba.cuda.dispatcher as disp

class _Dev:
    compute_capability = (9, 0, "a")

disp.get_current_device = lambda: _Dev()
sys.path.insert(0, "tests")
import test_wgmma as tw

u2, f2 = types.Array(uint32, 2, "C"), types.Array(float32, 2, "C")
res = {}
for name, (N, KS, zero) in {"n64_ks4_zero": (64, 4, True), "n8_ks2_acc": (8, 2, False)}.items():
    R, C = N, 32 * KS  # K-major e4m3 tile: N rows of 32·KS codes
    k = tw._kernel("e4m3", N, KS, False, zero, R, C, True)
    ptx, _ = cuda.compile_ptx(k.py_func, (u2, u2, f2, f2), cc=(9, 0, "a"), fastmath=True)
    log = off._link_info(ptx, "sm_90a")
    info = off.parse_ptxas(log)
    info["mma"] = sorted({ln.split()[0] for ln in ptx.splitlines() if "wgmma.mma_async" in ln})
    info["log"] = log
    res[name] = info
print("JSON" + json.dumps(res))
"""


@functools.cache
def _offline_results():
    return offline_json(_OFFLINE, timeout=600)


@pytest.mark.parametrize("name,N", [("n64_ks4_zero", 64), ("n8_ks2_acc", 8)])
def test_offline_e4m3_wgmma_assembles_for_sm90a(name, N):
    """A kernel calling the e4m3 wgmma compiles to sm_90a PTX that ptxas accepts (nvJitLink), with
    the k32 FP8 instruction and no spills."""
    info = _offline_results()[name]
    log = info["log"].splitlines()
    assert info["regs"] is not None, "\n".join([ln for ln in log if "rror" in ln] + log[-12:])
    assert info.get("spill_stores", 0) == 0
    assert info["mma"] == [f"wgmma.mma_async.sync.aligned.m64n{N}k32.f32.e4m3.e4m3"], info["mma"]
    assert not [ln for ln in log if "serialized" in ln], log
