"""``attention_fp8``: q, k, v given as e4m3 codes with per-head scales (spec/fp8_inputs.py), read by fp8_ws and
fp8_overlap without a quantization pass.

* V's codes rearranged (``make_codes_vt``) against the host model of the layout the kernel reads: column d's keys in
  the stored order of each 32-key block, keys past the end zero;
* the phases against the exact float64 attention of the decoded inputs (the kernel's own error: P in e4m3), GQA,
  causal with q_len != kv_len, several query blocks and a partial key tile; a scale given wrong must fail; a NaN
  code in V reaches the rows that see its key;
* NumPy, CPU tensors and numba device arrays in, each kind out; every bad input refused naming the argument.
"""
from __future__ import annotations

import numpy as np
import pytest

from numba_attn.gpu.backend import IS_SIMULATOR  # noqa: F401  (first: chooses the backend)

from numba import cuda  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn.phases.tensor_core.quantize import VTK, make_codes_vt, stored_key  # noqa: E402
from numba_attn.spec.errors import AttentionInputError  # noqa: E402
from numba_attn.spec.fp8_inputs import Fp8InputProblem, quantize_per_head, reference  # noqa: E402
from numba_attn.spec.reference import check  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")

OWN_TOL = 3.5e-2  # the kernel's own error against the exact attention of its inputs (P in e4m3: ~2e-2)
CASES = {  # (phase, problem) at the phases' simulator tiles (one consumer, 64-key tiles, two stages)
    "fp8_overlap-D32-70x100-bf16-gqa-causal": ("fp8_overlap", Fp8InputProblem(
        batch=1, heads=2, kv_heads=1, q_len=70, kv_len=100, head_dim=32, dtype="bfloat16", causal=True)),
    "fp8_ws-D64-130x90-fp16": ("fp8_ws", Fp8InputProblem(
        batch=2, heads=1, q_len=130, kv_len=90, head_dim=64, dtype="float16")),
    "fp8_exp_fma-D32-64x100-bf16-causal": ("fp8_exp_fma", Fp8InputProblem(
        batch=1, heads=1, q_len=64, kv_len=100, head_dim=32, dtype="bfloat16", causal=True)),
}
QUICK = "fp8_overlap-D32-70x100-bf16-gqa-causal"


def _sim(phase):
    return {} if not IS_SIMULATOR else na.get_phase(phase).sim_params


def _call(phase, problem, *arrays, **kw):
    q, k, v, sq, sk, sv = arrays
    return na.attention_fp8(q, k, v, sq, sk, sv, causal=problem.causal, out_dtype=problem.dtype, phase=phase,
                            **{**_sim(phase), **kw})


def test_v_codes_rearranged_as_the_kernel_reads_them():
    """vt[h, d, m] holds, byte i, column d of the key stored at position 4m + i of its 32-key block (the P order of
    :func:`numba_attn.gpu.wgmma.e4m3_p_keys`); keys past Nk are zero, up to whole tiles of VTK keys."""
    rng = np.random.default_rng(0)
    H, Nk, D = 2, 100, 32
    NkP = (Nk + VTK - 1) // VTK * VTK
    v = rng.integers(0, 256, (H, Nk, D), dtype=np.uint8)
    vt = cuda.to_device(np.full((H, D, NkP // 4), 0xDEADBEEF, np.uint32))
    make_codes_vt(D)[((NkP + VTK - 1) // VTK, H), 32 if IS_SIMULATOR else 128](cuda.to_device(v.view(np.uint32)),
                                                                               vt)
    got = vt.copy_to_host().view(np.uint8).reshape(H, D, NkP)
    want = np.zeros((H, D, NkP), np.uint8)
    for p in range(NkP):
        key = stored_key(p)
        if key < Nk:
            want[:, :, p] = v[:, key, :]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == QUICK else pytest.mark.full) for n in CASES])
def test_e4m3_inputs_match_the_exact_attention_of_their_codes(name):
    phase, problem = CASES[name]
    arrays = (*problem.inputs(seed=3), *problem.scales())
    out = _call(phase, problem, *arrays)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16 if problem.dtype == "bfloat16" else np.float16)
    c = check(out, reference(problem, *arrays[:3], arrays[3:]), dtype=problem.dtype, tol=OWN_TOL)
    assert c.ok, c


def test_a_wrong_scale_fails_the_check():
    """Known wrong: K's scale doubled (every score doubled) must not pass as the attention of the codes."""
    phase, problem = CASES[QUICK]
    q, k, v, sq, sk, sv = *problem.inputs(seed=4), *problem.scales()
    out = _call(phase, problem, q, k, v, sq, 2 * sk, sv)
    assert not check(out, reference(problem, q, k, v), dtype=problem.dtype, tol=OWN_TOL).ok


def test_a_nan_code_in_v_reaches_every_row_that_sees_its_key():
    """Key 20 (every causal row sees keys up to i + 30): column 7 NaN in every row, the other columns finite and
    right. (A NaN at a key that a row of the same tile does not see reaches that row too: its P is 0, and the tensor
    cores' 0 · NaN is NaN, as in the phases that quantize their inputs.)"""
    phase, problem = CASES[QUICK]
    q, k, v, sq, sk, sv = *problem.inputs(seed=5), *problem.scales()
    v = v.copy()
    v[0, 0, 20, 7] = np.nan
    out = _call(phase, problem, q, k, v, sq, sk, sv).astype(np.float64)
    ref = reference(problem, q, k, v)
    assert np.isnan(ref[..., 7]).all() and np.isfinite(ref[..., :7]).all()
    assert check(out, ref, dtype=problem.dtype, tol=OWN_TOL).ok


@pytest.mark.full
def test_cpu_tensors_and_device_arrays_give_the_numpy_result():
    torch = pytest.importorskip("torch")
    phase, problem = CASES[QUICK]
    q, k, v, sq, sk, sv = *problem.inputs(seed=6), *problem.scales()
    want = _call(phase, problem, q, k, v, sq, sk, sv)
    tensors = [torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn) for a in (q, k, v)]
    got = _call(phase, problem, *tensors, torch.from_numpy(sq), sk, float(sv.max()) if sv.size == 1 else sv)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == q.shape
    np.testing.assert_array_equal(got.view(torch.int16).numpy(), want.view(np.int16))
    dev = [cuda.to_device(np.ascontiguousarray(a).view(np.uint8)) for a in (q, k, v)]
    od = _call(phase, problem, *dev, sq, sk, sv)
    np.testing.assert_array_equal(od.copy_to_host(), want.view(np.uint16))


def test_bad_inputs_are_refused_naming_the_argument():
    phase, problem = CASES[QUICK]
    q, k, v, sq, sk, sv = *problem.inputs(seed=7), *problem.scales()
    f16 = q.astype(np.float32).astype(np.float16)
    for args, kw, words in [
        ((f16, k, v, sq, sk, sv), {}, "q has dtype float16"),
        ((q, k, v[:, :, :50], sq, sk, sv), {}, "k (1, 1, 100, 32) and v (1, 1, 50, 32)"),
        ((q, k, v, sq, sk[:, :0], sv), {}, "k_descale must be a scalar or of shape (B, Hkv) = (1, 1)"),
        ((q, k, v, sq, sk, -sv), {}, "v_descale[0, 0]"),
        ((q, k, v, None, sk, sv), {}, "q_descale is required"),
        ((q, k, v, np.ones((1, 3)), sk, sv), {}, "q_descale must be a scalar or of shape (B, H) = (1, 2)"),
        ((q, k, v, sq, sk, sv), {"phase": "ws_tma_q"}, "phase 'ws_tma_q' does not read e4m3 inputs"),
        ((q, k, v, sq, sk, sv), {"phase": "fp8_block"}, "phase 'fp8_block' does not read e4m3 inputs"),
        ((q, k, v, sq, sk, sv), {"out_dtype": "float32"}, "out_dtype must be"),
        ((q[..., :16], k[..., :16], v[..., :16], sq, sk, sv), {}, "head_dim 16 with e4m3 inputs"),
        ((q[:, :, :, :].copy(), k, v, sq, sk, sv), {"causal": "yes"}, "causal"),
    ]:
        with pytest.raises(AttentionInputError, match=None) as e:
            na.attention_fp8(*args, **{"phase": phase, **_sim(phase), **kw})
        assert words in str(e.value), (words, str(e.value))
    strided = cuda.to_device(np.ascontiguousarray(np.swapaxes(q.view(np.uint8), 1, 2)))  # (B, N, H, D) bytes
    with pytest.raises(AttentionInputError, match="q is a non-contiguous device array"):
        na.attention_fp8(strided.transpose((0, 2, 1, 3)),
                         *(cuda.to_device(np.ascontiguousarray(a).view(np.uint8)) for a in (k, v)), sq, sk, sv,
                         causal=True, phase=phase, **_sim(phase))
    z = ml_dtypes.float8_e4m3fn
    empty = na.attention_fp8(np.zeros((1, 2, 0, 32), z), k, v, 1.0, 1.0, 1.0)  # no query rows: nothing launched
    assert empty.shape == (1, 2, 0, 32) and empty.dtype == np.dtype(ml_dtypes.bfloat16)
    with pytest.raises(AttentionInputError, match="kv_len .* must be >= 1"):
        na.attention_fp8(q, np.zeros((1, 1, 0, 32), z), np.zeros((1, 1, 0, 32), z), 1.0, 1.0, 1.0)
    big = Fp8InputProblem(batch=1, heads=2, kv_heads=1, q_len=130, kv_len=100, head_dim=32, dtype="bfloat16")
    with pytest.raises(AttentionInputError, match="causal"):
        na.attention_fp8(*big.inputs(), 1.0, 1.0, 1.0, causal=True)  # q_len > kv_len: rows without keys


def test_quantize_per_head_scales_each_head_to_its_maximum():
    x = np.random.default_rng(8).standard_normal((2, 3, 5, 8)) * np.arange(1, 7).reshape(2, 3, 1, 1)
    codes, scale = quantize_per_head(x)
    assert scale.shape == (2, 3) and scale.dtype == np.float32
    np.testing.assert_allclose(scale, np.abs(x).max(axis=(2, 3)) / 448, rtol=1e-6)
    assert np.abs(codes.astype(np.float64)).max(axis=(2, 3)).min() == 448  # each head's largest value saturates


GPU_CASES = {
    "D128-300x500-bf16-gqa-causal": Fp8InputProblem(batch=2, heads=4, kv_heads=2, q_len=300, kv_len=500, head_dim=128,
                                                    dtype="bfloat16", causal=True),
    "D64-333x200-fp16": Fp8InputProblem(batch=1, heads=3, q_len=333, kv_len=200, head_dim=64, dtype="float16"),
    "D32-200x333-fp16-causal": Fp8InputProblem(batch=1, heads=2, q_len=200, kv_len=333, head_dim=32, dtype="float16",
                                               causal=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
@pytest.mark.parametrize("phase", ["fp8_overlap", "fp8_ws", "fp8_exp_fma"])
def test_e4m3_inputs_on_the_gpu(phase, name):
    """The defaults on a GPU (two consumers of 192-key tiles at D128, three of 128 up to D64): K's tensor map over the
    caller's codes, rows past the end zero-filled by TMA."""
    problem = GPU_CASES[name]
    arrays = (*problem.inputs(seed=9), *problem.scales())
    out = _call(phase, problem, *arrays)
    c = check(out, reference(problem, *arrays[:3], arrays[3:]), dtype=problem.dtype, tol=OWN_TOL)
    assert c.ok, c


@pytest.mark.full
def test_device_scales_are_taken_as_they_are():
    """Scales already on the device (a numba array here; CUDA tensors alike) are passed without a copy: the same
    result as host scales; a wrong shape or dtype is refused naming the argument."""
    phase, problem = CASES[QUICK]
    q, k, v, sq, sk, sv = *problem.inputs(seed=10), *problem.scales()
    want = _call(phase, problem, q, k, v, sq, sk, sv)
    got = _call(phase, problem, q, k, v, cuda.to_device(sq), cuda.to_device(sk), cuda.to_device(sv))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    with pytest.raises(AttentionInputError, match=r"k_descale on the device must be float32 of shape \(1, 1\)"):
        _call(phase, problem, q, k, v, sq, cuda.to_device(sk.astype(np.float64)), sv)


@pytest.mark.gpu
def test_cuda_tensors_in_and_out():
    """CUDA tensors (codes and scales on the device, computed on PyTorch's stream): the NumPy call's result."""
    torch = pytest.importorskip("torch")
    problem = GPU_CASES["D128-300x500-bf16-gqa-causal"]
    q, k, v, sq, sk, sv = arrays = (*problem.inputs(seed=11), *problem.scales())
    want = _call("fp8_overlap", problem, *arrays)
    codes = [torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(torch.float8_e4m3fn).cuda()
             for a in (q, k, v)]
    got = _call("fp8_overlap", problem, *codes, *(torch.from_numpy(s).cuda() for s in (sq, sk, sv)))
    assert got.is_cuda and got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.view(torch.int16).cpu().numpy(), want.view(np.int16))


@pytest.mark.full
def test_the_runner_checks_e4m3_rows_and_refuses_them_elsewhere(tmp_path):
    """``run`` on an e4m3-input problem (``numba-attn run --e4m3-inputs``): fp8_overlap's row checked against the exact
    reference of its codes (poisoned output, the seeds' fresh codes), a phase reading float16 refused with the
    reason; the row's problem reads back as an e4m3-input problem."""
    from numba_attn.measure.results import load_results
    from numba_attn.spec.problem import Problem

    _, problem = CASES[QUICK]
    rows = na.run(["fp8_overlap", "tc_mma"], [problem], results=str(tmp_path / "r.jsonl"), timeout_s=None,
                  params={"fp8_overlap": na.get_phase("fp8_overlap").sim_params}, seeds=(1, 2))
    by = {r["phase"]: r for r in rows}
    assert by["fp8_overlap"]["status"] == "OK" and by["fp8_overlap"]["check"]["rel_err"] < OWN_TOL
    assert by["tc_mma"]["status"] == "SKIP" and "e4m3 inputs" in by["tc_mma"]["reason"]
    (back,) = {Problem.from_dict(r["problem"]) for r in load_results(str(tmp_path / "r.jsonl"))
               if r.get("type") == "result"}
    assert back == problem and type(back) is type(problem)
    twin = Problem(batch=1, heads=2, kv_heads=1, q_len=70, kv_len=100, head_dim=32, dtype="bfloat16", causal=True)
    assert back.min_bytes() == twin.min_bytes() - (70 * 2 + 2 * 100) * 32  # the inputs' bytes halved


def test_values_quantized_by_the_caller_stay_within_the_e4m3_tolerance():
    """The caller's own per-head quantization of float values (``quantize_per_head``), then attention_fp8: within the
    e4m3 tolerance of the float64 attention of the values themselves."""
    phase, problem = CASES[QUICK]
    rng = np.random.default_rng(12)
    x = [rng.standard_normal((1, h, n, 32)) for h, n in ((2, 70), (1, 100), (1, 100))]
    (q, sq), (k, sk), (v, sv) = (quantize_per_head(a) for a in x)
    out = _call(phase, problem, q, k, v, sq, sk, sv)
    c = check(out, na.reference(*x, causal=True), dtype=problem.dtype, precision="e4m3")
    assert c.ok, c


def test_cli_e4m3_inputs_refusals():
    """``--e4m3-inputs`` makes e4m3-input problems for ``run`` only, and needs a float16/bfloat16 output."""
    from numba_attn.cli_args import build_parser, problems_of

    args = build_parser().parse_args(["run", "--e4m3-inputs", "-N", "64", "-D", "32"])
    (p,), _ = problems_of(args)
    assert isinstance(p, Fp8InputProblem) and p.dtype == "bfloat16" and p.label.endswith("e4m3-in")
    for argv, words in [(["run", "--e4m3-inputs", "--dtype", "fp32"], "the output's dtype must be float16"),
                        (["tune", "fp8_overlap", "--e4m3-inputs"], "tune does not yet")]:
        with pytest.raises(SystemExit, match=words):
            problems_of(build_parser().parse_args(argv))
