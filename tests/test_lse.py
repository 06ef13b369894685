"""attention(return_lse=True): each phase that writes the log-sum-exp against the float64 reference's, on odd
shapes (GQA, causal, q_len != kv_len), with and without a variant; a phase without it refuses, phase=None
skips it; a plain call compiles the same kernels as before (no log-sum-exp store)."""
from __future__ import annotations

import numpy as np
import pytest

import numba_attn as na
from numba_attn import variants as V
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.reference import reference

QUICK = ("register_blocked", "tc_wgmma")  # one phase of the CUDA-core and one of the wgmma family in the quick tier


def _qkv(B=2, H=4, Hkv=2, Nq=37, Nk=53, D=16, seed=3, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Nq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    return q, k, v


def lse_phases():
    return [p.name for p in na.list_phases() if p.is_builtin and p.lse is True and p.layout == "contiguous"]


def _marks(name):
    return () if name in QUICK else (pytest.mark.full,)


def _check(name, causal, variant_kw=None, Nq=37, Nk=53, **params):
    ph = na.get_phase(name)
    dtype = np.float32 if "float32" in ph.dtypes else np.float16  # (the tensor-core phases take 16-bit inputs)
    q, k, v = _qkv(Nq=Nq, Nk=Nk, dtype=dtype)
    kw = dict(variant_kw or {})
    out, lse = na.attention(q, k, v, causal=causal, phase=name, return_lse=True, **{**ph.sim_params, **params},
                            **kw)
    variant = None
    if kw:
        from numba_attn.variants.mods import make_variant

        variant = make_variant(kw.get("mask_mod"), kw.get("score_mod"), kw.get("aux") or ())
    ref_o, ref_lse = reference(q, k, v, causal=causal, return_lse=True, variant=variant)
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    wide = dtype == np.float32  # 16-bit: P is rounded to 16 bits before P·V; the row sums stay float32
    np.testing.assert_allclose(out.astype(np.float64), ref_o, atol=2e-5 if wide else 2e-3, rtol=1e-4 if wide else 1e-2)
    finite = np.isfinite(ref_lse)
    assert (np.isfinite(lse) == finite).all()
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=2e-5 if wide else 1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in lse_phases()])
@pytest.mark.parametrize("causal", [False, True])
def test_lse_matches_reference(name, causal):
    _check(name, causal)


def late_rows(b, h, q_idx, kv_idx):
    """Rows before 5 see no key (their lse is -inf); the others a window of the keys up to q_idx + 1."""
    return q_idx >= 5 and kv_idx <= q_idx + 1 and kv_idx >= q_idx - 6


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in lse_phases()])
def test_lse_with_a_variant(name):
    # a window that leaves the first rows without keys (lse -inf) and a softcap score function
    _check(name, False, {"mask_mod": late_rows, "score_mod": V.softcap(2.0)}, Nq=21, Nk=21)


def test_split_k_prefill_combine_writes_lse():
    _check("split_k_prefill", True, splits=3)


def test_cuda_core_phases_write_lse():
    names = set(lse_phases())
    assert {"naive", "fused_rowwise", "smem_kv", "register_blocked", "causal_skip", "split_k_prefill"} <= names


def test_phase_without_lse_refuses_and_phase_none_picks_one():
    q, k, v = _qkv()
    no_lse = [p for p in na.list_phases() if p.is_builtin and p.lse is not True and p.layout == "contiguous"
              and p.kind == "prefill"]
    if no_lse:
        ph = no_lse[0]
        problem = na.api.problem_from_arrays(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
        from numba_attn.variants.sinks import lse_problem

        assert ph.supports(problem) is None
        assert "no log-sum-exp output yet" in ph.supports(lse_problem(problem))
        with pytest.raises(AttentionInputError, match="no log-sum-exp output yet"):
            na.attention(*(a.astype(np.float16) for a in (q, k, v)), phase=ph.name, return_lse=True)
    chosen = na.explain(q, k, v, return_lse=True)
    assert chosen.phase.lse is True
    out, lse = na.attention(q, k, v, return_lse=True, phase=chosen.name, **chosen.phase.sim_params)
    np.testing.assert_allclose(lse, reference(q, k, v, return_lse=True)[1], atol=2e-5, rtol=1e-5)


def test_plain_call_returns_only_out():
    q, k, v = _qkv()
    ph = na.get_phase("smem_kv")
    out = na.attention(q, k, v, phase="smem_kv", **ph.sim_params)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    with pytest.raises(AttentionInputError):
        na.attention(q, k, v, phase="smem_kv", return_lse="yes")


def test_lse_on_device_arrays_and_cpu_tensors():
    from numba import cuda

    q, k, v = _qkv()
    ph = na.get_phase("smem_kv")
    ref = reference(q, k, v, return_lse=True)[1]
    o, lse = na.attention(*(cuda.to_device(a) for a in (q, k, v)), phase="smem_kv", return_lse=True, **ph.sim_params)
    assert hasattr(lse, "copy_to_host")
    np.testing.assert_allclose(lse.copy_to_host(), ref, atol=2e-5, rtol=1e-5)
    torch = pytest.importorskip("torch")
    o, lse = na.attention(*(torch.from_numpy(a) for a in (q, k, v)), phase="smem_kv", return_lse=True,
                          **ph.sim_params)
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    np.testing.assert_allclose(lse.numpy(), ref, atol=2e-5, rtol=1e-5)
