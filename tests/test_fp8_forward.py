"""The FP8 (e4m3) forward phase ``fp8_wgmma`` and its building blocks.

* ``pack_e4m3x4`` (``cvt.rn.satfinite.e4m3x2.f32``): its exact fallback against ml_dtypes on every
  kind of value (ties, subnormals, saturation, NaN), and through a kernel (the PTX on a GPU);
* the order of P: the host models of the wgmma fragments (``_d_index``, ``_a_index``) show that the
  thread's own S values, packed as the kernel packs them, are its e4m3 A fragment once V's keys are
  stored in ``e4m3_p_keys`` order;
* the quantization kernels against a NumPy model (per-head amax/448 scales, V transposed and permuted);
* the phase against the float64 reference (the e4m3 tolerance) and against the float64 attention of
  its own dequantized inputs (its arithmetic alone: P in e4m3, the scales), causal with an odd KV
  length and GQA, bfloat16; P packed in the plain order must come out wrong; a NaN never passes;
* offline: the D=128 kernel assembles for sm_90a with the k32 e4m3 wgmma and no spills.

Shapes are a single 64-row warpgroup and one or two key tiles, so the simulator stays fast.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, float32, uint32

from numba_attn import Problem, get_phase
from numba_attn.gpu import device_functions as DF
from numba_attn.gpu import intrinsics as I
from numba_attn.gpu import wgmma as WG
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel
from numba_attn.measure.check import to_device
from numba_attn.phases.tensor_core import p38_fp8_wgmma as F
from numba_attn.spec.reference import check, reference, tolerance
from offline_compile import offline_json

ml_dtypes = pytest.importorskip("ml_dtypes")

PHASE = get_phase("fp8_wgmma")
SIM = PHASE.sim_params  # one warpgroup, Bc = 32
OWN_TOL = 3.5e-2  # the kernel's own error against the attention of its dequantized inputs (P in e4m3: ~2e-2)


# -- the packer ------------------------------------------------------------------------------

def _values(rng):
    x = np.concatenate([
        rng.standard_normal(3000) * 30, rng.standard_normal(3000) * 1e-2, rng.standard_normal(500) * 1e-3,
        np.linspace(-500, 500, 4001),
        # ties between neighbours (1 + 1/16: between 1 and 1.125), subnormal ties, the saturation edge
        [1.0625, 1.1875, -1.0625, 2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10, 2.0 ** -6 - 2.0 ** -10,
         432.0, 447.99, 448.0, 460.0, 464.0, 1e9, -1e9, 0.0, -0.0, np.inf, -np.inf]])
    return x.astype(np.float32)


def _want_codes(x):
    """ml_dtypes' round-to-nearest-even e4m3fn codes, saturated to ±448 (satfinite); NaN → 0x7F."""
    w = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).copy()
    w[np.isnan(x)] = 0x7F
    return w


def test_e4m3_bits_reference_matches_ml_dtypes():
    x = _values(np.random.default_rng(0))
    got = np.array([I.e4m3_bits_reference(v) for v in x], np.uint8)
    assert np.array_equal(got, _want_codes(x))
    assert I.e4m3_bits_reference(np.nan) == 0x7F
    assert I.e4m3_bits_reference(np.inf) == 0x7E and I.e4m3_bits_reference(-np.inf) == 0xFE


@functools.cache
def _pack_kernel():
    @kernel
    def k(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = I.pack_e4m3x4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3])

    return k


def test_pack_e4m3x4_kernel():
    """Four floats → one register, the first in the low byte (the fallback in the simulator, the
    two ``cvt.rn.satfinite.e4m3x2.f32`` on a GPU)."""
    x = _values(np.random.default_rng(1))[::8] if IS_SIMULATOR else _values(np.random.default_rng(1))
    x = np.concatenate([x, [np.nan, -np.nan]]).astype(np.float32)
    x = np.concatenate([x, np.zeros((-len(x)) % 4, np.float32)])
    out = cuda.to_device(np.zeros(len(x) // 4, np.uint32))
    _pack_kernel()[(len(x) // 4 + 63) // 64, 64](cuda.to_device(x), out)
    got = out.copy_to_host().view(np.uint8)
    want = _want_codes(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all((got[nan] & 0x7F) == 0x7F)  # a NaN code (the sign of a NaN is not specified)


# -- the order of P ----------------------------------------------------------------------------

@pytest.mark.parametrize("ksteps", [1, 4])
def test_p_registers_are_the_a_fragment_in_permuted_key_order(ksteps):
    """Value j of a thread's S fragment (row, key from ``_d_index``), packed into A register i byte b
    (``e4m3_p_registers``), sits at the A fragment's (row, stored position) of ``_a_index``; that
    position holds exactly that key when V's keys are stored in ``e4m3_p_keys`` order."""
    N = 32 * ksteps
    drow, dcol = WG._d_index(N)
    arow, acol = WG._a_index(ksteps, 1)
    regs = WG.e4m3_p_registers(ksteps)
    keys = WG.e4m3_p_keys()
    assert sorted(keys) == list(range(32))
    assert sorted(regs.reshape(-1)) == list(range(N // 2))  # every accumulator value packed once
    for i in range(4 * ksteps):
        for b in range(4):
            j = regs[i, b]
            pos = acol[:, i] + b
            assert np.array_equal(drow[:, j], arow[:, i])
            assert np.array_equal(dcol[:, j], 32 * (pos // 32) + keys[pos % 32])
    # the plain order (the keys not permuted) puts other keys there
    plain = np.arange(32)
    pos = acol[:, 0]
    assert not np.array_equal(dcol[:, regs[0, 2]], 32 * ((pos + 2) // 32) + plain[(pos + 2) % 32])


def test_quant_vt_order_is_the_model():
    """The V transpose kernel's key arithmetic is ``e4m3_p_keys``."""
    assert F.make_quant_vt(32).keys == tuple(int(x) for x in WG.e4m3_p_keys())


# -- quantization model ------------------------------------------------------------------------

def _quantize(x):
    """Per (batch, head) e4m3 codes of ``x`` (B, H, N, D) as the kernels make them: x·(448/amax) in
    float32, rounded to nearest even, saturated; and the scales amax/448."""
    x32 = x.astype(np.float32)
    amax = np.abs(x32).max(axis=(-2, -1), keepdims=True)
    amax = np.where(amax > 0, amax, np.float32(448.0))
    inv = (np.float32(448.0) / amax).astype(np.float32)
    codes = _want_codes((x32 * inv).astype(np.float32))
    return codes, (amax / np.float32(448.0)).astype(np.float32)


def _dequantized(x):
    codes, sc = _quantize(x)
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * sc.astype(np.float64)


def _model(x, keys):
    """The kernels' results for one tensor (heads, N, D) as NumPy makes them: the largest finite |x| of
    each head, whether it holds an infinity, its scale amax/448 (1 when amax is 0) and codes of
    x·(448/amax) in float32; an infinity becomes NaN (its code 0x7F), except in a key row of ``keys``:
    there the infinite columns keep their sign (±448) and the others are 0, and kmul is inf (1 for the
    other rows of a head with an infinity, 0, untouched, elsewhere)."""
    x32 = x.astype(np.float32)
    inf = np.isinf(x32)
    amax = np.where(np.isfinite(x32), np.abs(x32), np.float32(0)).max(axis=(1, 2))
    bad = inf.any(axis=(1, 2))
    one = np.float32(1.0)
    inv = np.where(amax > 0, np.float32(448.0) / np.where(amax > 0, amax, one), one).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(448.0), one).astype(np.float32)
    y = x32 * inv[:, None, None]
    kmul = np.zeros(x.shape[:2], np.float32)
    if keys:
        rowinf = inf.any(axis=2) & bad[:, None]
        kmul = np.where(bad[:, None], np.where(rowinf, np.float32(np.inf), np.float32(1)), 0).astype(np.float32)
        y = np.where(rowinf[:, :, None] & ~inf, np.float32(0), y)
    else:
        y = np.where(inf, np.float32(np.nan), y)
    return amax, bad, scale, _want_codes(y.astype(np.float32)), kmul


def _same_codes(got, want):
    """Codes equal; a NaN code compared without its sign (not specified by the conversion)."""
    nan = (want & 0x7F) == 0x7F
    return np.array_equal(got[~nan], want[~nan]) and np.all((got[nan] & 0x7F) == 0x7F)


def _poke_infinities(q, k, v):
    k[1, 3, 2] = np.inf  # a key row with two infinities, a NaN and finite values
    k[1, 3, 7] = -np.inf
    k[1, 3, 9] = np.nan
    k[0, 5, 1] = np.nan  # a NaN in a head without infinities
    q[0, 2, 4] = -np.inf  # Q and V: an infinity becomes the NaN code
    q[0, 6, 0] = np.nan
    v[0, 7, 3] = np.inf
    v[0, 9, 15] = np.nan
    v[1] = 0  # a zero head: amax 0, scale 1


QUANT_CASES = {  # (D, dtype, Q heads, KV heads, Nq, Nk, NkP, poke)
    "D32-fp16-two-tiles": (32, np.float16, 2, 1, 40, 70, 96, None),  # NkP not a multiple of VTK (64 / 128)
    "D16-bf16-inf-nan": (16, "bfloat16", 1, 2, 33, 50, 64, _poke_infinities),
    "D128-fp16": (128, np.float16, 1, 1, 17, 64, 64, None),
}


@pytest.mark.parametrize("name", list(QUANT_CASES))
def test_quantization_kernels_match_numpy(name):
    """amax (one launch for Q, K and V), the codes of rows (Q, K) and the transposed permuted codes of V
    against the model: amax exact, the infinity flags, the scales, codes exact, kmul; keys past the end
    of V are zero codes; the padding of D=16 rows (columns 16..31) is not written."""
    _check_quantization(name)


@pytest.fixture
def gpu_block_constants(monkeypatch):
    """The quantization kernels made with the GPU's blocks (128-key V^T tiles, 128 threads: several warps) in
    the simulator; 8 row blocks per head instead of the GPU's 64 (the same strided loop over a head's chunks; 64
    doubled the test's time), and 33 partial maxima per head instead of 64: over a warp's 32 lanes, so that lane 0
    reduces two of them and the others one (the GPU's 64: two per lane, the same loop; the chunks of these small
    heads are all in the first block, the amax kernel's other blocks write empty partial maxima, and 64 of them
    nearly doubled the test's time again)."""
    from numba_attn.phases.tensor_core import quantize as Q

    factories = (F.make_amax, F.make_quant_rows, F.make_quant_vt, Q.make_vt_codes)

    for name, value in (("NCH", 33), ("RCH", 8), ("VTK", 128), ("QTH", 128)):
        monkeypatch.setattr(F, name, value)  # the launch's grid
        monkeypatch.setattr(Q, name, value)  # the kernels
    for f in factories:
        f.cache_clear()
    yield
    for f in factories:
        f.cache_clear()


@pytest.mark.skipif(not IS_SIMULATOR, reason="the GPU runs these constants in every test")
@pytest.mark.parametrize("name", ["D16-bf16-inf-nan", "D128-fp16"])
def test_quantization_kernels_with_gpu_blocks(name, gpu_block_constants):
    """The same checks with the GPU's block constants (the code paths of several warps per block)."""
    _check_quantization(name)


def _check_quantization(name):
    D, dt, HQ, HK, NQ, NK, NKP, poke = QUANT_CASES[name]
    bf16 = dt == "bfloat16"
    rng = np.random.default_rng(3)
    x = [rng.standard_normal((h, n, D)) * np.array([1.0, 30.0])[:h, None, None] for h, n in
         ((HQ, NQ), (HK, NK), (HK, NK))]
    x = [a.astype(ml_dtypes.bfloat16 if bf16 else dt) for a in x]
    if poke is not None:
        poke(*x)
    q, k, v = x
    qw, kw, vw = (cuda.to_device(np.ascontiguousarray(a).view(np.uint32)) for a in x)
    NH = HQ + 2 * HK
    part = cuda.to_device(np.full((NH, F.NCH), -1, np.float32))
    bad = cuda.to_device(np.full((NH, F.NCH), -1, np.float32))
    F.make_amax(D // 2)[(F.NCH, NH), F.QTH](qw, kw, vw, part, bad, bf16)
    mq, mk, mv = _model(q, False), _model(k, True), _model(v, False)
    p, b = part.copy_to_host(), bad.copy_to_host()
    assert np.array_equal(p.max(axis=1), np.concatenate([mq[0], mk[0], mv[0]]))
    assert (p >= 0).all() and set(np.unique(b)) <= {0.0, 1.0}  # every block wrote its result
    assert np.array_equal(b.max(axis=1) > 0, np.concatenate([mq[1], mk[1], mv[1]]))
    cuts = ((0, HQ), (HQ, HQ + HK), (HQ + HK, NH))
    parts = [cuda.to_device(p[i:j]) for i, j in cuts]
    bads = [cuda.to_device(b[i:j]) for i, j in cuts]
    DQ = F.qk_depth(D)
    for (t, tw, n, model, keys, i) in ((q, qw, NQ, mq, False, 0), (k, kw, NK, mk, True, 1)):
        heads = t.shape[0]
        rows = cuda.to_device(np.full((heads, n, DQ // 4), 0xFFFFFFFF, np.uint32))
        sc = cuda.to_device(np.zeros(heads, np.float32))
        flag = cuda.to_device(np.full(heads, -1, np.float32))
        kmul = cuda.to_device(np.zeros((heads, n), np.float32))
        F.make_quant_rows(D // 2, keys)[(F.RCH, heads), F.QTH](tw, rows, parts[i], bads[i], sc, flag, kmul, bf16)
        got = rows.copy_to_host().view(np.uint8).reshape(heads, n, DQ)
        assert _same_codes(got[:, :, :D], model[3]), (keys, np.argwhere(got[:, :, :D] != model[3])[:5])
        assert (got[:, :, D:] == 0xFF).all()  # D=16: columns 16..31 (the launch's zero padding) not written
        assert np.array_equal(flag.copy_to_host(), model[1].astype(np.float32))
        assert np.array_equal(kmul.copy_to_host(), model[4])  # kmul only written for a flagged head's keys
        # fastmath: amax/448 is computed as amax·(1/448), one or two ulps from NumPy's division (the codes,
        # from 448/amax, are exact)
        assert np.allclose(sc.copy_to_host(), model[2], rtol=2.5e-7, atol=0)
    vt = cuda.to_device(np.full((HK, D, NKP // 4), 0xFFFFFFFF, np.uint32))
    sc = cuda.to_device(np.zeros(HK, np.float32))
    F.make_quant_vt(D)[((NKP + F.VTK - 1) // F.VTK, HK), F.QTH](vw, vt, parts[2], sc, bf16)
    assert np.allclose(sc.copy_to_host(), mv[2], rtol=2.5e-7, atol=0)
    got = vt.copy_to_host().view(np.uint8).reshape(HK, D, NKP)
    keys = (32 * (np.arange(NKP) // 32) + WG.e4m3_p_keys()[np.arange(NKP) % 32])
    padded = np.zeros((HK, NKP, D), np.uint8)
    padded[:, :NK] = mv[3]
    assert _same_codes(got, padded[:, keys, :].transpose(0, 2, 1))


def test_quantization_model_is_the_phase_model():
    """The model above, on finite inputs, is ``_quantize`` (the phase tests' dequantization)."""
    x = (np.random.default_rng(4).standard_normal((2, 40, 32)) * np.array([1.0, 30.0])[:, None, None])
    x = x.astype(np.float16)
    codes, scales = _quantize(x[None])
    m = _model(x, True)
    assert np.array_equal(m[3], codes[0]) and np.array_equal(m[2], scales.reshape(-1))


# -- the phase ---------------------------------------------------------------------------------

def _run(problem, params=None, seed=1, permute=True, poke=None, phase=PHASE):
    q, k, v = problem.inputs(seed)
    if poke is not None:
        poke(q, k, v)
    B, H, Hkv, Nq, Nk, D = (problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.kv_len,
                            problem.head_dim)
    params = phase.resolve(problem, params if params is not None else phase.sim_params)
    if permute:
        launch = phase.plan(problem, **params)
    else:
        launch = F.build_fp8(problem, params["warpgroups"], params["Bc"], params["stages"], permute=False)
    o = to_device(np.full((B * H, Nq, D), np.nan, q.dtype))
    launch(to_device(np.ascontiguousarray(q.reshape(B * H, Nq, D))),
           to_device(np.ascontiguousarray(k.reshape(B * Hkv, Nk, D))),
           to_device(np.ascontiguousarray(v.reshape(B * Hkv, Nk, D))), o)
    return q, k, v, o.copy_to_host().view(q.dtype).reshape(q.shape)


def _own_error(problem, q, k, v, out):
    """‖out − ref‖/‖ref‖ against the float64 attention of the dequantized inputs."""
    ref = reference(_dequantized(q), _dequantized(k), _dequantized(v), causal=problem.causal, scale=problem.sm_scale)
    err = float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))
    print(f"{problem.label}: own error {err:.3g}")
    return err


CASES = {  # one 64-row warpgroup; one or two key tiles of 32 (simulator parameters)
    "D64-64x64-fp16": Problem(batch=1, heads=1, q_len=64, kv_len=64, head_dim=64, dtype="float16"),
    "D32-29x45-bf16-causal": Problem(batch=1, heads=2, kv_heads=1, q_len=29, kv_len=45, head_dim=32,
                                     dtype="bfloat16", causal=True),
}
GPU_CASES = {
    "D128-1000x1000-fp16": Problem(batch=1, heads=4, kv_heads=2, q_len=1000, kv_len=1000, head_dim=128,
                                   dtype="float16"),
    "D128-777x1031-bf16-causal": Problem(batch=2, heads=2, q_len=777, kv_len=1031, head_dim=128, dtype="bfloat16",
                                         causal=True),
    "D64-512-fp16-causal": Problem(batch=1, heads=4, q_len=512, kv_len=512, head_dim=64, dtype="float16",
                                   causal=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp8_matches_float64(name):
    """Against the float64 reference of the stored inputs: within the e4m3 tolerance; against the
    float64 attention of the dequantized inputs (the phase's own arithmetic): within OWN_TOL."""
    problem = CASES[name]
    assert PHASE.supports(problem, **SIM) is None
    q, k, v, out = _run(problem)
    c = check(out, reference(q, k, v, causal=problem.causal), dtype=problem.dtype, precision=PHASE.precision)
    assert c.ok, c
    assert c.tol == tolerance(problem.dtype, "e4m3") == 0.1
    assert _own_error(problem, q, k, v, out) < OWN_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
@pytest.mark.parametrize("params", [None, {"warpgroups": 2, "Bc": 128, "stages": 3}], ids=["default", "wg2-bc128"])
def test_fp8_matches_float64_gpu(name, params):
    """Larger shapes on a GPU with the default parameters and with Bc=128 (several tiles, partial
    last tiles, several query blocks)."""
    problem = GPU_CASES[name]
    params = params or {}
    q, k, v, out = _run(problem, params)
    c = check(out, reference(q, k, v, causal=problem.causal), dtype=problem.dtype, precision=PHASE.precision)
    assert c.ok, c
    assert _own_error(problem, q, k, v, out) < OWN_TOL


def test_unpermuted_p_is_wrong():
    """P packed in the accumulators' own order against V stored in the permuted order: far off."""
    problem = Problem(batch=1, heads=1, q_len=64, kv_len=32, head_dim=32, dtype="float16")
    q, k, v, out = _run(problem, permute=False)
    assert _own_error(problem, q, k, v, out) > 0.2


def test_nan_never_passes():
    """A NaN in K is not quantized away: it reaches every output row (the NaN code 0x7F through both
    products), where the reference is NaN too; the gate fails a NaN where the reference is finite. Head
    dim 16: Q and K rows padded with zero codes to the 32 bytes of one k32 step."""
    problem = Problem(batch=1, heads=1, q_len=64, kv_len=32, head_dim=16, dtype="float16")

    def poke(q, k, v):
        k[0, 0, 5, 3] = np.nan

    q, k, v, out = _run(problem, poke=poke)
    assert np.isnan(out).all()
    ref = reference(q, k, v)
    assert np.isnan(ref).all()
    finite = reference(q, np.nan_to_num(k.astype(np.float64)), v)
    assert not check(out, finite, dtype=problem.dtype, precision=PHASE.precision).ok


def test_zero_and_large_heads_stay_finite():
    """Q all zero (amax 0: scale 1, every score 0) and V near the float16 maximum (scale 146): the
    output is the mean of V's rows, finite and within the tolerance."""
    problem = Problem(batch=1, heads=1, q_len=64, kv_len=32, head_dim=32, dtype="float16")

    def poke(q, k, v):
        q[...] = 0
        v *= np.float16(60000.0) / np.abs(v).max()

    q, k, v, out = _run(problem, poke=poke)
    assert np.isfinite(out).all()
    c = check(out, reference(q, k, v), dtype=problem.dtype, precision=PHASE.precision)
    assert c.ok, c


def test_supports_refuses_with_reasons():
    ok = Problem(batch=1, heads=2, q_len=64, head_dim=128, dtype="float16")
    assert PHASE.supports(ok) is None
    assert PHASE.resolve(ok) == {"warpgroups": 3, "Bc": 64, "stages": 2}
    for bad, params, words in [
        (Problem(batch=1, heads=2, q_len=64, head_dim=96, dtype="float16"), {}, "head_dim"),
        (Problem(batch=1, heads=2, q_len=64, head_dim=64, dtype="float32"), {}, "dtype"),
        (ok, {"Bc": 48}, "Bc=48"),
        (ok, {"warpgroups": 3, "Bc": 128}, "spills"),
        (ok, {"warpgroups": 4}, "at most 3"),
    ]:
        reason = PHASE.supports(bad, **params)
        assert reason and words in reason, (bad.label, params, reason)


# -- the exponential on the FMA pipe (fp8_exp_fma) -----------------------------------------------------

@kernel
def _exp2_fma_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = DF.exp2_fma(x[i])


def test_exp2_fma_within_its_error_bound_and_its_edges():
    """exp2_fma (a cubic on [0, 1), the exponent from its bits) within 1.1e-4 of 2^x over the softmax's range, exact at
    the integers, 0 at and below -127 and at -inf, NaN kept; on a GPU through its PTX (fastmath)."""
    x = np.concatenate([np.linspace(-40.0, 8.0, 4001), [-126.0, -3.0, 0.0, 1.0, 8.0],
                        [-127.0, -200.0, -np.inf, np.nan]]).astype(np.float32)
    out = cuda.to_device(np.zeros_like(x))
    _exp2_fma_kernel[(x.size + 127) // 128, 128](cuda.to_device(x), out)
    got = out.copy_to_host()
    want = np.exp2(x[:-4].astype(np.float64))
    assert np.max(np.abs(got[:-4] / want - 1)) < 1.1e-4
    assert np.array_equal(got[4001:4006], np.float32([2.0 ** -126, 0.125, 1.0, 2.0, 256.0]))
    assert np.array_equal(got[-4:-1], np.zeros(3, np.float32)) and np.isnan(got[-1])


# -- fp8_ws: the same tile on the warp-specialized TMA ring ---------------------------------------

WS = get_phase("fp8_ws")
PP = get_phase("fp8_pingpong")
OV = get_phase("fp8_overlap")
BL = get_phase("fp8_block")
EF = get_phase("fp8_exp_fma")
LZ = get_phase("fp8_lazy")
WS_CASES = {  # the simulator's parameters: one consumer warpgroup, 64-key tiles, two stages
    "D64-130x200-fp16-gqa": Problem(batch=1, heads=2, kv_heads=1, q_len=130, kv_len=200, head_dim=64,
                                    dtype="float16"),
    "D128-100x150-bf16-causal": Problem(batch=1, heads=1, q_len=100, kv_len=150, head_dim=128, dtype="bfloat16",
                                        causal=True),
}


@pytest.mark.parametrize("name", list(WS_CASES))
@pytest.mark.parametrize("phase", [WS, PP, OV, EF, pytest.param(LZ, marks=pytest.mark.full)],
                         ids=["fp8_ws", "fp8_pingpong", "fp8_overlap", "fp8_exp_fma", "fp8_lazy"])
def test_warp_specialized_fp8_matches_float64(phase, name):
    """fp8_ws, fp8_pingpong (its consumers taking turns) and fp8_overlap (each softmax under its own P·V): several
    query blocks and key tiles, a partial last tile, GQA, causal with q_len != kv_len (consumer 0 skips the last
    tile, so fp8_pingpong's turns pass without products and fp8_overlap's last P·V runs after a skipped tile):
    within the e4m3 tolerance of float64 and within OWN_TOL of the dequantized inputs' attention."""
    problem = WS_CASES[name]
    assert phase.supports(problem, **phase.resolve(problem, phase.sim_params)) is None
    q, k, v, out = _run(problem, phase=phase)
    c = check(out, reference(q, k, v, causal=problem.causal), dtype=problem.dtype, precision=phase.precision)
    assert c.ok, c
    assert _own_error(problem, q, k, v, out) < OWN_TOL


@pytest.mark.parametrize("causal", [False, pytest.param(True, marks=pytest.mark.full)], ids=["plain", "causal"])
def test_fp8_lazy_rescales_where_a_row_moved_and_not_where_none_did(causal):
    """fp8_lazy (the running maximum moves only by more than 0.8 in base 2, a warp rescales O only where one of its
    rows moved): 64-key tiles whose keys climb far (tile 2: the maximum moves, O must be rescaled), a little (tile 1:
    ~0.5 above the maximum, which stays, P up to ~2^8.5 in e4m3) and fall back (tile 3): within the e4m3 tolerance
    of float64 and of the dequantized inputs' attention; random inputs too. Skipping the rescale where a row moved,
    or a threshold past e4m3's range, fails it."""
    problem = Problem(batch=1, heads=1, q_len=70, kv_len=256, head_dim=64, dtype="float16", causal=causal)
    level = np.array([0.0, 0.045, 1.5, 0.0])[np.arange(256) // 64]  # q·k ≈ 64·level; s·sl2 = q·k · log2(e) / 8

    def poke(q, k, v):
        rng = np.random.default_rng(3)
        q[:] = (1 + 0.05 * rng.standard_normal(q.shape)).astype(q.dtype)
        k[:] = (level[None, None, :, None] + 0.05 * rng.standard_normal(k.shape)).astype(k.dtype)

    for pk in (poke, None):
        q, k, v, out = _run(problem, poke=pk, phase=LZ)
        c = check(out, reference(q, k, v, causal=causal), dtype=problem.dtype, precision=LZ.precision)
        assert c.ok, c
        assert _own_error(problem, q, k, v, out) < OWN_TOL


@pytest.mark.parametrize("phase", [OV, pytest.param(BL, marks=pytest.mark.full)], ids=["fp8_overlap", "fp8_block"])
def test_fp8_overlap_flushes_its_held_tile_before_unseen_tiles(phase):
    """Three consumers, 64-key tiles, two stages, causal: the first consumer's rows see two tiles fewer than the
    block loads, as many as the ring has stages, so the stage of its last visible tile (held until its P·V) is
    the one the second unseen tile waits for. Without the held P·V run at the first unseen tile, every consumer
    waits on a barrier only its own release completes (the simulator reports the hang)."""
    problem = Problem(batch=1, heads=1, q_len=200, kv_len=200, head_dim=64, dtype="float16", causal=True)
    params = {"warpgroups": 3, "Bc": 64, "stages": 2}
    assert phase.supports(problem, **phase.resolve(problem, params)) is None
    q, k, v, out = _run(problem, params, phase=phase)
    c = check(out, reference(q, k, v, causal=True), dtype=problem.dtype, precision=phase.precision)
    assert c.ok, c


WS_GPU_CASES = {**GPU_CASES,  # and K rows of 32 bytes (the 32-byte swizzle; D16 padded with zero codes)
                "D32-300x500-fp16-gqa-causal": Problem(batch=1, heads=4, kv_heads=2, q_len=300, kv_len=500,
                                                       head_dim=32, dtype="float16", causal=True),
                "D16-200x333-bf16": Problem(batch=2, heads=2, q_len=200, kv_len=333, head_dim=16, dtype="bfloat16")}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(WS_GPU_CASES))
@pytest.mark.parametrize("phase,params", [(WS, None), (WS, {"Bc": 64, "stages": 4}),
                                          (WS, {"Bc": 192, "warpgroups": 2}),
                                          (WS, {"Bc": 256, "stages": 2, "warpgroups": 2}), (PP, None),
                                          (PP, {"Bc": 64, "stages": 2}), (OV, None),
                                          (OV, {"Bc": 128, "warpgroups": 2}), (BL, None), (EF, None),
                                          (EF, {"fma_share": 2}), (LZ, None)],
                         ids=["fp8_ws-default", "fp8_ws-bc64-s4", "fp8_ws-bc192", "fp8_ws-bc256-s2",
                              "fp8_pingpong-default", "fp8_pingpong-bc64-s2", "fp8_overlap-default",
                              "fp8_overlap-bc128-wg2", "fp8_block-default", "fp8_exp_fma-default",
                              "fp8_exp_fma-half", "fp8_lazy-default"])
def test_warp_specialized_fp8_matches_float64_gpu(phase, params, name):
    """On a GPU, where the products are asynchronous (a missing wait or, in fp8_pingpong, a turn out of order shows
    here): the defaults (128-key tiles; three consumers up to D64 in fp8_ws), 64-key tiles and the wide tiles
    whose Vᵀ comes in several swizzled boxes (192 keys: three of 64 bytes; 256: two of 128)."""
    problem = WS_GPU_CASES[name]
    q, k, v, out = _run(problem, phase.resolve(problem, params or {}), phase=phase)
    c = check(out, reference(q, k, v, causal=problem.causal), dtype=problem.dtype, precision=phase.precision)
    assert c.ok, c
    if phase is not BL:  # (fp8_block's codes are not the per-head model's)
        assert _own_error(problem, q, k, v, out) < OWN_TOL


@pytest.mark.parametrize("gpu", [pytest.param(False), pytest.param(True, marks=pytest.mark.gpu)], ids=["sim", "gpu"])
def test_fp8_ws_per_lane_warp_index_matches_float64(gpu):
    """``uniform=False`` (each lane's own warp index, 56 producer registers) computes what the default does: GQA,
    a partial tile, causal."""
    problem = Problem(batch=1, heads=2, kv_heads=1, q_len=150 if gpu else 70, kv_len=333 if gpu else 100,
                      head_dim=64, dtype="float16", causal=True)
    params = WS.resolve(problem, {"uniform": False} if gpu else {**WS.sim_params, "uniform": False})
    q, k, v, out = _run(problem, params, phase=WS)
    c = check(out, reference(q, k, v, causal=problem.causal), dtype=problem.dtype, precision=WS.precision)
    assert c.ok, c


@pytest.mark.parametrize("Bc", [192, 256])
def test_fp8_ws_wide_tiles_match_float64(Bc):
    """Tiles of 192 and 256 keys: Vᵀ's rows are wider than one swizzle, so each stage takes several TMA boxes
    (three of 64 bytes, two of 128) and the k32 steps of O += P·V walk across them; a partial last tile, GQA."""
    problem = Problem(batch=1, heads=2, kv_heads=1, q_len=64, kv_len=Bc + 70, head_dim=32, dtype="float16")
    params = WS.resolve(problem, {**WS.sim_params, "Bc": Bc})
    assert WS.supports(problem, **params) is None
    q, k, v, out = _run(problem, params, phase=WS)
    c = check(out, reference(q, k, v), dtype=problem.dtype, precision=WS.precision)
    assert c.ok, c
    assert _own_error(problem, q, k, v, out) < OWN_TOL


def _error(out, ref):
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("name", list(WS_CASES))
def test_fp8_block_matches_float64(name):
    """fp8_block (a scale a tile, one pass): within the e4m3 tolerance of float64 on fp8_ws's cases (GQA, causal
    with a skipped last tile, several key tiles), and no less accurate than fp8_ws's per-head scales on them."""
    problem = WS_CASES[name]
    q, k, v, out = _run(problem, phase=BL)
    ref = reference(q, k, v, causal=problem.causal)
    c = check(out, ref, dtype=problem.dtype, precision=BL.precision)
    assert c.ok, c
    head = _run(problem, phase=WS)[3]
    assert _error(out, ref) <= 1.05 * _error(head, ref), (_error(out, ref), _error(head, ref))


def _tiles_of_scales(n):
    """The first n-key tile scored far below the rest (P ≈ e^-30 there) with values 30x the normal; the other
    tiles' values 1e-3: the output is theirs, 1e5 below the head's largest value (e4m3 codes of a head scale:
    subnormal)."""

    def poke(q, k, v):
        q[:] = np.abs(q)
        k[..., :n, :] = -10 * np.abs(k[..., :n, :])
        v[..., :n, :] *= 30
        v[..., n:, :] *= 1e-3

    return poke


def test_fp8_block_warpgroup_past_the_last_row():
    """Two consumers and 60 query rows: the second warpgroup has no rows and no Q block of its own; it must not read
    past the Q scales (the simulator raises on an index out of bounds; the GPU's memcheck found it first)."""
    problem = Problem(batch=1, heads=2, q_len=60, kv_len=100, head_dim=32, dtype="float16")
    q, k, v, out = _run(problem, {**BL.sim_params, "warpgroups": 2}, phase=BL)
    assert check(out, reference(q, k, v), dtype=problem.dtype, precision=BL.precision).ok


@pytest.mark.parametrize("gpu", [pytest.param(False), pytest.param(True, marks=pytest.mark.gpu)], ids=["sim", "gpu"])
def test_fp8_block_scales_follow_each_tile(gpu):
    """Where V's magnitude changes by 1e5 from one tile to the next, a scale a tile keeps the small tiles' precision
    that one scale a head loses: fp8_block's error against float64 is well under fp8_ws's (the simulator's 64-key
    tiles; on a GPU the defaults' 128 at D32)."""
    n = 128 if gpu else 64
    problem = Problem(batch=1, heads=1, q_len=64, kv_len=3 * n, head_dim=32, dtype="float16")
    params = {} if gpu else None
    q, k, v, out = _run(problem, params, poke=_tiles_of_scales(n), phase=BL)
    head = _run(problem, params, poke=_tiles_of_scales(n), phase=WS)[3]
    ref = reference(q, k, v)
    print("errors: a scale a tile", _error(out, ref), "a scale a head", _error(head, ref))
    assert check(out, ref, dtype=problem.dtype, precision=BL.precision).ok
    assert _error(out, ref) < 0.5 * _error(head, ref), (_error(out, ref), _error(head, ref))


@pytest.mark.parametrize("gpu", [pytest.param(False), pytest.param(True, marks=pytest.mark.gpu)], ids=["sim", "gpu"])
def test_fp8_block_nan_and_infinite_keys(gpu):
    """A NaN in V reaches its rows; an infinite K value in one tile makes its key's scores ±inf there only (the
    tile's flag), as in the per-head phases: the output matches fp8_ws's where both are finite, NaN where its is."""
    problem = Problem(batch=1, heads=1, q_len=64, kv_len=150, head_dim=32, dtype="float16")
    params = {} if gpu else None

    def poke(q, k, v):
        v[0, 0, 70, 3] = np.nan
        k[0, 0, 130, 5] = np.inf

    out = _run(problem, params, poke=poke, phase=BL)[3]
    head = _run(problem, params, poke=poke, phase=WS)[3]
    assert np.isnan(out).any()
    assert np.array_equal(np.isnan(out), np.isnan(head))
    fin = ~np.isnan(head)
    assert np.allclose(out[fin], head[fin], atol=0.1)


def test_fp8_pingpong_refuses_other_warpgroup_counts():
    ok = Problem(batch=1, heads=2, q_len=64, head_dim=64, dtype="float16")
    assert PP.supports(ok) is None and PP.resolve(ok)["warpgroups"] == 2
    assert "exactly 2" in PP.supports(ok, warpgroups=3)


def test_fp8_ws_nan_never_passes():
    """A NaN in V reaches the output rows through the TMA ring as through the parent's copies."""
    problem = Problem(batch=1, heads=1, q_len=64, kv_len=100, head_dim=64, dtype="float16")

    def poke(q, k, v):
        v[0, 0, 70, 3] = np.nan

    q, k, v, out = _run(problem, poke=poke, phase=WS)
    assert np.isnan(out).any()
    assert not check(out, reference(q, k, np.nan_to_num(v.astype(np.float64))), dtype=problem.dtype,
                     precision=WS.precision).ok


def test_fp8_ws_supports_refuses_with_reasons():
    ok = Problem(batch=1, heads=2, q_len=64, head_dim=128, dtype="float16")
    assert WS.supports(ok) is None
    assert WS.resolve(ok) == {"warpgroups": 2, "Bc": 192, "stages": 3, "uniform": True}
    assert WS.resolve(Problem(batch=1, heads=2, q_len=64, head_dim=64, dtype="float16"))["Bc"] == 128
    for bad, params, words in [
        (Problem(batch=1, heads=2, q_len=64, head_dim=96, dtype="float16"), {}, "head_dim"),
        (ok, {"Bc": 32}, "Bc=32"),
        (ok, {"warpgroups": 3}, "at most 2"),
        (Problem(batch=1, heads=2, q_len=64, head_dim=64, dtype="float16"), {"warpgroups": 3, "Bc": 256},
         "3 consumer warpgroups"),
        (ok, {"stages": 1}, "stages"),
        (ok, {"stages": 8}, "shared memory"),
    ]:
        reason = WS.supports(bad, **params)
        assert reason and words in reason, (bad.label, params, reason)


# -- offline compile (sm_90a, no GPU needed) -----------------------------------------------------

_OFFLINE = r"""
import json
import numba_attn.measure.offline as off
from numba_attn import Problem
res = {}
for causal in (False, True):
    rec = off.compile_phase("fp8_wgmma", Problem(batch=1, heads=32, q_len=8192, head_dim=128, dtype="float16",
                                                 causal=causal))
    for r in rec:
        r["mma"] = sorted({ln.split()[0] for ln in r.pop("ptx").splitlines() if "wgmma.mma_async" in ln})
    res["causal" if causal else "plain"] = rec
print("JSON" + json.dumps(res))
"""


@functools.cache
def _offline():
    return offline_json(_OFFLINE, timeout=600)


@pytest.mark.parametrize("mode", ["plain", "causal"])
def test_offline_fp8_d128_assembles_without_spills(mode):
    """The default D=128 configuration (3 warpgroups, Bc=64): the attention kernel uses the k32 e4m3
    wgmma for both products, fits the 168 registers of 384 threads without spills and wgmma is not
    serialized; the quantization kernels spill nothing either."""
    rec = _offline()[mode]
    att = [r for r in rec if r["kernel"] == "fp8_wgmma"]
    assert len(att) == 1 and len(rec) == 5  # amax (Q, K and V), 3 quantize, the attention kernel
    a = att[0]
    assert a["mma"] == ["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3",
                        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"], a["mma"]
    assert a["regs"] is not None and a["regs"] <= 168, a["regs"]
    assert not a.get("notes"), a["notes"]
    for r in rec:
        assert r.get("spill_stores", 0) == 0 and r.get("spill_loads", 0) == 0, (r["kernel"], r)
