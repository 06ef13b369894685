"""The tensor-core / async-copy intrinsics against NumPy, one warp at a time.

The kernels below run unchanged on both backends: in the simulator they
exercise the per-lane fallbacks of :mod:`numba_attn.gpu.intrinsics` (the index of
``mma_sync``, ``cp_async``, ``loads``, ``convert``, ``bits``), on a GPU the inline PTX.
Each test draws random matrices, builds the fragments the way a kernel does (32-bit
loads from ``uint32`` views of f16/bf16 arrays), and compares the result with a float64
product. One test per mma flavour feeds a deliberately wrong fragment mapping and must
see the product come out wrong.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu import intrinsics as I

from numba import cuda, float32, int64, uint32

from numba_attn.gpu.jit import kernel

gpu_only = pytest.mark.skipif(IS_SIMULATOR, reason="needs a CUDA GPU (inline PTX has no simulator path to inspect)")
ALIGN = I.SMEM_ALIGN  # a plain global: numba reads it as the literal alignment
sim_only = pytest.mark.skipif(not IS_SIMULATOR, reason="checks a simulator-only property of the fallbacks")

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


def _rng(seed):
    return np.random.default_rng(seed)


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


# -- mma m16n8k16 (f16 / bf16) -------------------------------------------------


@functools.cache
def _mma16_kernel(kind: str, wrong: bool):
    mma = I.mma_f16 if kind == "f16" else I.mma_bf16

    @kernel
    def k(aw, btw, c, d):
        lane = cuda.threadIdx.x
        g = lane // 4
        t = lane % 4
        a0 = aw[g, t]
        a1 = aw[g + 8, t]
        a2 = aw[g, t + 4]
        a3 = aw[g + 8, t + 4]
        if wrong:  # a1/a2 swapped: rows and k halves mixed up
            a1, a2 = a2, a1
        b0 = btw[g, t]
        b1 = btw[g, t + 4]
        r = mma(a0, a1, a2, a3, b0, b1, c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
        d[g, 2 * t] = r[0]
        d[g, 2 * t + 1] = r[1]
        d[g + 8, 2 * t] = r[2]
        d[g + 8, 2 * t + 1] = r[3]

    return k


def _run_mma16(kind, seed, wrong=False):
    dt = np.float16 if kind == "f16" else ml_dtypes.bfloat16
    rng = _rng(seed)
    A = rng.standard_normal((16, 16)).astype(dt)
    Bt = rng.standard_normal((8, 16)).astype(dt)  # B (16×8) stored as Bᵀ: row n holds k
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, np.float32)
    dD = _dev(D)
    _mma16_kernel(kind, wrong)[1, 32](_dev(A.view(np.uint32)), _dev(Bt.view(np.uint32)), _dev(C), dD)
    ref = A.astype(np.float64) @ Bt.astype(np.float64).T + C
    return dD.copy_to_host(), ref


def test_the_index_is_the_modules_names():
    """Every name of ``intrinsics.__all__`` is the very object of the module that defines it."""
    from numba_attn.gpu import bits, convert, cp_async, inline_ptx, loads, mma_sync

    for name in I.__all__:
        assert any(vars(m).get(name) is getattr(I, name)
                   for m in (bits, convert, cp_async, inline_ptx, loads, mma_sync)), name


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_m16n8k16(kind):
    if kind == "bf16" and ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    for seed in (1, 2):
        out, ref = _run_mma16(kind, seed)
        rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert np.isfinite(out).all()
        assert rel < 1e-5, rel


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_m16n8k16_wrong_fragment_fails(kind):
    if kind == "bf16" and ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    out, ref = _run_mma16(kind, 3, wrong=True)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) > 0.1


# -- mma m16n8k8 tf32 --------------------------------------------------------------


@functools.cache
def _mma_tf32_kernel(wrong: bool):
    @kernel
    def k(a, bt, d):
        lane = cuda.threadIdx.x
        g = lane // 4
        t = lane % 4
        a0 = I.to_tf32(a[g, t])
        a1 = I.to_tf32(a[g + 8, t])
        a2 = I.to_tf32(a[g, t + 4])
        a3 = I.to_tf32(a[g + 8, t + 4])
        b0 = I.to_tf32(bt[g, t])
        b1 = I.to_tf32(bt[g, t + 4])
        if wrong:  # the m16n8k16 B layout (k = 2t) applied to m16n8k8
            b0 = I.to_tf32(bt[g, (2 * t) % 8])
        z = float32(0.0)
        r = I.mma_tf32(a0, a1, a2, a3, b0, b1, z, z, z, z)
        d[g, 2 * t] = r[0]
        d[g, 2 * t + 1] = r[1]
        d[g + 8, 2 * t] = r[2]
        d[g + 8, 2 * t + 1] = r[3]

    return k


def _tf32_round(x):
    return np.array([np.uint32(I.tf32_bits(v)) for v in np.asarray(x, np.float32).ravel()],
                    np.uint32).view(np.float32).reshape(np.shape(x))


def _run_tf32(seed, wrong=False):
    rng = _rng(seed)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    Bt = rng.standard_normal((8, 8)).astype(np.float32)
    dD = _dev(np.full((16, 8), np.nan, np.float32))
    _mma_tf32_kernel(wrong)[1, 32](_dev(A), _dev(Bt), dD)
    ref = _tf32_round(A).astype(np.float64) @ _tf32_round(Bt).astype(np.float64).T
    return dD.copy_to_host(), ref, A.astype(np.float64) @ Bt.astype(np.float64).T


def test_mma_tf32():
    out, ref, exact = _run_tf32(4)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    # tf32 inputs: the product is off the float32 one by about 2^-11 relative
    assert np.linalg.norm(out - exact) / np.linalg.norm(exact) < 2e-3


def test_mma_tf32_wrong_fragment_fails():
    out, ref, _ = _run_tf32(5, wrong=True)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) > 0.05


# -- ldmatrix -------------------------------------------------------------------------


@functools.cache
def _ldmatrix_kernel(trans: bool):
    @kernel
    def k(src, regs):
        # src: (16, 8) uint32 = a 16×16 b16 matrix; the four 8×8 quadrants in
        # the order (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
        sm = cuda.shared.array((16, 8), uint32, alignment=ALIGN)
        lane = cuda.threadIdx.x
        for w in range(4):
            sm[lane // 2, (lane % 2) * 4 + w] = src[lane // 2, (lane % 2) * 4 + w]
        cuda.syncthreads()
        m = lane // 8
        row = (m % 2) * 8 + lane % 8
        col = (m // 2) * 4
        if trans:
            r = I.ldmatrix_x4_trans(sm, row, col)
        else:
            r = I.ldmatrix_x4(sm, row, col)
        for i in range(4):
            regs[lane, i] = r[i]

    return k


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4(trans):
    rng = _rng(6)
    M = rng.integers(0, 2**16, (16, 16), dtype=np.uint16)
    dregs = _dev(np.zeros((32, 4), np.uint32))
    _ldmatrix_kernel(trans)[1, 32](_dev(M.view(np.uint32)), dregs)
    got = dregs.copy_to_host()
    quads = [M[0:8, 0:8], M[8:16, 0:8], M[0:8, 8:16], M[8:16, 8:16]]
    for lane in range(32):
        g, t = divmod(lane, 4)
        for m, Q in enumerate(quads):
            X = Q.T if trans else Q
            want = int(X[g, 2 * t]) | (int(X[g, 2 * t + 1]) << 16)
            assert int(got[lane, m]) == want, (lane, m)


@functools.cache
def _ldmatrix_mma_kernel():
    @kernel
    def k(aw, vw, d):
        # A fragment through ldmatrix (non-trans) and the B operand of a
        # row-major (k × n) matrix V through ldmatrix.trans, as P·V does.
        sa = cuda.shared.array((16, 8), uint32, alignment=ALIGN)
        sv = cuda.shared.array((16, 8), uint32, alignment=ALIGN)
        lane = cuda.threadIdx.x
        for w in range(4):
            sa[lane // 2, (lane % 2) * 4 + w] = aw[lane // 2, (lane % 2) * 4 + w]
            sv[lane // 2, (lane % 2) * 4 + w] = vw[lane // 2, (lane % 2) * 4 + w]
        cuda.syncthreads()
        m = lane // 8
        a = I.ldmatrix_x4(sa, (m % 2) * 8 + lane % 8, (m // 2) * 4)
        # V is 16 (k) × 16 (n): matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
        # (k 0-7, n 8-15), (k 8-15, n 8-15) → b0, b1 of n-tile 0, then of n-tile 1
        b = I.ldmatrix_x4_trans(sv, (m % 2) * 8 + lane % 8, (m // 2) * 4)
        g = lane // 4
        t = lane % 4
        z = float32(0.0)
        r = I.mma_f16(a[0], a[1], a[2], a[3], b[0], b[1], z, z, z, z)
        s = I.mma_f16(a[0], a[1], a[2], a[3], b[2], b[3], z, z, z, z)
        d[g, 2 * t] = r[0]
        d[g, 2 * t + 1] = r[1]
        d[g + 8, 2 * t] = r[2]
        d[g + 8, 2 * t + 1] = r[3]
        d[g, 8 + 2 * t] = s[0]
        d[g, 8 + 2 * t + 1] = s[1]
        d[g + 8, 8 + 2 * t] = s[2]
        d[g + 8, 8 + 2 * t + 1] = s[3]

    return k


def test_ldmatrix_feeds_mma():
    rng = _rng(7)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    V = rng.standard_normal((16, 16)).astype(np.float16)
    dD = _dev(np.full((16, 16), np.nan, np.float32))
    _ldmatrix_mma_kernel()[1, 32](_dev(A.view(np.uint32)), _dev(V.view(np.uint32)), dD)
    ref = A.astype(np.float64) @ V.astype(np.float64)
    out = dD.copy_to_host()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


# -- cp.async, 128-bit loads/stores ------------------------------------------------


@functools.cache
def _copy_kernel(use_cp_async: bool, read_early: bool):
    @kernel
    def k(src, out, early, nvalid):
        # src: (1, 8, 8) uint32; rows >= nvalid are zero-filled
        sm = cuda.shared.array((8, 8), uint32, alignment=ALIGN)
        tid = cuda.threadIdx.x
        for w in range(4):
            sm[tid // 2, (tid % 2) * 4 + w] = uint32(0xDEADBEEF)
        cuda.syncthreads()
        if tid < 16:
            r = tid // 2
            c = (tid % 2) * 4
            if use_cp_async:
                I.cp_async16(sm, r, c, src, 0, min(r, nvalid - 1), c, r < nvalid)
                I.cp_async_commit()
                if read_early:
                    early[r, c] = sm[r, c]
                I.cp_async_wait(0)
            else:
                x = I.ld_global_v4(src, 0, r, c)
                if r < nvalid:
                    I.st_shared_v4(sm, r, c, x[0], x[1], x[2], x[3])
                else:
                    I.st_shared_v4(sm, r, c, uint32(0), uint32(0), uint32(0), uint32(0))
        cuda.syncthreads()
        for w in range(4):
            out[tid // 2, (tid % 2) * 4 + w] = sm[tid // 2, (tid % 2) * 4 + w]

    return k


@pytest.mark.parametrize("use_cp_async", [True, False], ids=["cp_async16", "ld_global_v4"])
def test_16_byte_copies(use_cp_async):
    rng = _rng(8)
    src = rng.integers(0, 2**32, (1, 8, 8), dtype=np.uint32)
    dout = _dev(np.zeros((8, 8), np.uint32))
    _copy_kernel(use_cp_async, False)[1, 16](_dev(src), dout, _dev(np.zeros((8, 8), np.uint32)), 6)
    out = dout.copy_to_host()
    np.testing.assert_array_equal(out[:6], src[0, :6])
    np.testing.assert_array_equal(out[6:], 0)


@sim_only
def test_cp_async_lands_only_at_wait():
    """The fallback defers the copy to ``cp_async_wait``: a kernel that reads the
    tile before waiting sees the old contents, as it may on the GPU."""
    src = np.arange(64, dtype=np.uint32).reshape(1, 8, 8) + 1
    dout = _dev(np.zeros((8, 8), np.uint32))
    dearly = _dev(np.zeros((8, 8), np.uint32))
    _copy_kernel(True, True)[1, 16](_dev(src), dout, dearly, 8)
    early = dearly.copy_to_host()
    assert (early[:, [0, 4]] == 0xDEADBEEF).all()
    np.testing.assert_array_equal(dout.copy_to_host(), src[0])


# -- packing -----------------------------------------------------------------------------


@functools.cache
def _pack_kernel():
    @kernel
    def k(x, h, bf, tf, b16, out):
        i = cuda.threadIdx.x
        h[i] = I.pack_f16x2(x[2 * i], x[2 * i + 1])
        bf[i] = I.pack_bf16x2(x[2 * i], x[2 * i + 1])
        tf[i] = I.to_tf32(x[i])
        out[i] = I.pack_b16x2(b16[2 * i], b16[2 * i + 1])

    return k


def test_packing_helpers():
    rng = _rng(9)
    x = (rng.standard_normal(64) * 3).astype(np.float32)
    # ties for the tf32 rounding (ties away from zero) and for f16 (to even)
    x[0] = np.uint32(0x3F801000).view(np.float32)  # 1 + 2^-11: tie -> away
    x[1] = np.uint32(0xBF803000).view(np.float32)  # negative tie
    x[2] = np.float32(1.0) + np.float32(2.0 ** -11)  # f16 tie (to even: 1.0)
    b16 = rng.integers(0, 2**16, 64, dtype=np.uint16)
    outs = [_dev(np.zeros(32, np.uint32)) for _ in range(4)]
    _pack_kernel()[1, 32](_dev(x), *outs[:3], _dev(b16), outs[3])
    h, bf, tf, p = (o.copy_to_host() for o in outs)
    want_h = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(h, want_h[0::2] | (want_h[1::2] << 16))
    if ml_dtypes is not None:
        want_bf = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
        np.testing.assert_array_equal(bf, want_bf[0::2] | (want_bf[1::2] << 16))
    np.testing.assert_array_equal(p, b16[0::2].astype(np.uint32) | (b16[1::2].astype(np.uint32) << 16))
    bits = x[:32].view(np.uint32)
    assert tf[0] == 0x3F802000 and tf[1] == 0xBF804000
    assert (tf & 0x1FFF == 0).all()
    assert (np.abs(tf.view(np.float32) - x[:32]) <= np.abs(x[:32]) * 2.0 ** -11).all()
    np.testing.assert_array_equal(tf, [I.tf32_bits(v) for v in x[:32]])
    assert bits.dtype == np.uint32


def test_bit_helpers_match_numpy():
    """The host models the fallbacks use: bf16 and f16 rounding as NumPy/ml_dtypes."""
    rng = _rng(10)
    x = (rng.standard_normal(500) * 100).astype(np.float32)
    assert [I.f16_bits(v) for v in x] == list(x.astype(np.float16).view(np.uint16))
    if ml_dtypes is not None:
        assert [I.bf16_bits(v) for v in x] == list(x.astype(ml_dtypes.bfloat16).view(np.uint16))


@functools.cache
def _bits_kernel():
    @kernel
    def k(a, b, sel, words, perm, f16, f32, v2):
        i = cuda.threadIdx.x
        perm[i] = I.byte_perm(a[i], b[i], sel[i])
        f16[2 * i], f16[2 * i + 1] = I.unpack_f16x2(a[i])
        f32[i] = I.u32_as_f32(b[i])
        v2[i, 0], v2[i, 1] = I.ld_global_v2(words, i // 8, i % 8, 2 * (i % 4))

    return k


def test_byte_perm_unpack_f16x2_and_v2_loads():
    """``prmt.b32`` (every selector nibble, sign-replicate mode included), both f16 halves of a
    register to float32, a word read as float32 and 8-byte loads, against the host models."""
    rng = _rng(11)
    n = 64
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    sel = rng.integers(0, 2**16, n, dtype=np.uint64).astype(np.uint32)
    sel[:4] = [0x1404, 0x3424, 0x7650, 0x3210]  # the selectors the 8-bit caches use, and identity
    words = rng.integers(0, 2**32, (8, 8, 8), dtype=np.uint64).astype(np.uint32)
    perm, f32 = _dev(np.zeros(n, np.uint32)), _dev(np.zeros(n, np.float32))
    f16, v2 = _dev(np.zeros(2 * n, np.float32)), _dev(np.zeros((n, 2), np.uint32))
    _bits_kernel()[1, n](_dev(a), _dev(b), _dev(sel), _dev(words), perm, f16, f32, v2)
    np.testing.assert_array_equal(perm.copy_to_host(), [I.byte_perm_reference(x, y, z) for x, y, z in zip(a, b, sel)])
    assert I.byte_perm_reference(0x44332211, 0x88776655, 0x3210) == 0x44332211
    assert I.byte_perm_reference(0x000000F0, 0, 0x8888) == 0xFFFFFFFF  # sign replicated
    want16, got16 = a.view(np.float16).astype(np.float32), f16.copy_to_host()
    nan = np.isnan(want16)  # (a NaN's payload is not compared: the GPU gives the canonical NaN)
    assert np.array_equal(np.isnan(got16), nan)
    np.testing.assert_array_equal(got16[~nan].view(np.uint32), want16[~nan].view(np.uint32))
    np.testing.assert_array_equal(f32.copy_to_host().view(np.uint32), b)
    i = np.arange(n)
    want = np.stack([words[i // 8, i % 8, 2 * (i % 4)], words[i // 8, i % 8, 2 * (i % 4) + 1]], 1)
    np.testing.assert_array_equal(v2.copy_to_host(), want)


@functools.cache
def _flat_kernel():
    @kernel
    def k(words, scales, rows, out4, out2, outs, wrap):
        i = cuda.threadIdx.x
        r = I.mad_u32(rows[i], 3, i % 3)  # (row, head) of a (rows, 3 heads, 8 words) array
        out4[i, 0], out4[i, 1], out4[i, 2], out4[i, 3] = I.ld_global_v4_at(words, r, 8, 4 * (i % 2), 0)
        out2[i, 0], out2[i, 1] = I.ld_global_v2_at(words, r, 8, 2 * (i % 2), 4)
        outs[i] = I.ld_at(scales, I.add_u32(r, 0))
        wrap[i] = I.add_u32(I.mad_u32(rows[i], 0x10000, 0xFFFF0000), i)  # modulo 2**32

    return k


def test_flat_loads_and_u32_arithmetic():
    """``mad_u32``/``add_u32`` wrap modulo 2**32; ``ld_global_v4_at``/``ld_global_v2_at`` read the words at
    flat word row·n + col + off, ``ld_at`` the flat element of a 32-bit row index, as NumPy indexing."""
    rng = _rng(14)
    n = 32
    words = rng.integers(0, 2**32, (10, 3, 8), dtype=np.uint64).astype(np.uint32)
    scales = rng.standard_normal((10, 3)).astype(np.float32)
    rows = rng.integers(0, 10, n).astype(np.int32)
    out4, out2 = _dev(np.zeros((n, 4), np.uint32)), _dev(np.zeros((n, 2), np.uint32))
    outs, wrap = _dev(np.zeros(n, np.float32)), _dev(np.zeros(n, np.uint32))
    _flat_kernel()[1, n](_dev(words), _dev(scales), _dev(rows), out4, out2, outs, wrap)
    i = np.arange(n)
    flat = words.reshape(-1, 8)[rows * 3 + i % 3]
    np.testing.assert_array_equal(out4.copy_to_host(), [f[4 * (j % 2):4 * (j % 2) + 4] for j, f in zip(i, flat)])
    np.testing.assert_array_equal(out2.copy_to_host(), [f[2 * (j % 2) + 4:2 * (j % 2) + 6] for j, f in zip(i, flat)])
    np.testing.assert_array_equal(outs.copy_to_host(), scales[rows, i % 3])
    np.testing.assert_array_equal(wrap.copy_to_host(), ((rows.astype(np.int64) * 0x10000 + 0xFFFF0000 + i)
                                                        % 2**32).astype(np.uint32))


@functools.cache
def _fp8_cvt_kernel():
    @kernel
    def k(words, out, a, b, diff):
        i = cuda.threadIdx.x
        if i < words.size:
            out[2 * i], out[2 * i + 1] = I.cvt_e4m3x4_f16x2(words[i])
        if i < a.size:
            diff[i] = I.sub_f16x2(a[i], b[i])

    return k


def test_cvt_e4m3x4_f16x2_and_sub_f16x2():
    """``cvt.rn.f16x2.e4m3x2`` of both halves of a word: every e4m3fn code in every byte position gives
    the f16 of its value (exact, ml_dtypes), a NaN code an f16 NaN; ``sub.rn.f16x2`` as NumPy's float16
    difference (the int8 decoder's exact subtraction of 1152 included)."""
    if ml_dtypes is None:
        pytest.skip("ml_dtypes not installed")
    rng = _rng(13)
    codes = np.concatenate([np.arange(256, dtype=np.uint8)] + [rng.permutation(256).astype(np.uint8)
                                                               for _ in range(3)])  # each code at each position
    words = codes.view(np.uint32)
    a = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    a[:2] = 0x64806400 | 0x00FF, 0x64006480  # 1024 + (255 | 128 ...) - 1152: the int8 decoder's halves
    b[:2] = 0x64806480
    out, diff = _dev(np.zeros(words.size * 2, np.uint32)), _dev(np.zeros(64, np.uint32))
    _fp8_cvt_kernel()[1, 256](_dev(words), out, _dev(a), _dev(b), diff)
    got = out.copy_to_host().view(np.float16).astype(np.float32)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    nan = np.isnan(want)
    assert nan.sum() == 8 and np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 included
    assert [I.e4m3_f16_bits_reference(c) for c in (0x00, 0x80, 0x01, 0x7E, 0xFE)] == [0, 0x8000, 0x1800, 0x5F00,
                                                                                       0xDF00]
    d = diff.copy_to_host().view(np.float16)
    with np.errstate(invalid="ignore", over="ignore"):
        w = (a.view(np.float16).astype(np.float64) - b.view(np.float16).astype(np.float64)).astype(np.float16)
    both = ~(np.isnan(w) & np.isnan(d))
    assert np.array_equal(d.view(np.uint16)[both], w.view(np.uint16)[both])
    assert list(d[:4].astype(np.float32)) == [127.0, 0.0, 0.0, -128.0]


# -- GPU only: the instructions are really there --------------------------------


@gpu_only
def test_sass_has_tensor_core_and_async_instructions():
    k = _ldmatrix_mma_kernel()
    k.compile((uint32[:, ::1], uint32[:, ::1], float32[:, ::1]))
    sass = k.inspect_sass(next(iter(k.overloads)))
    assert "HMMA" in sass and "LDSM" in sass
    c = _copy_kernel(True, False)
    c.compile((uint32[:, :, ::1], uint32[:, ::1], uint32[:, ::1], int64))
    sass = c.inspect_sass(next(iter(c.overloads)))
    assert "LDGSTS" in sass
