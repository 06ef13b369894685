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

QUICK = ("register_blocked", "tc_wgmma", "decode_split_k")  # one phase of each family in the quick tier


def _qkv(B=1, H=2, Hkv=1, Nq=21, Nk=29, D=16, seed=3, dtype=np.float32):  # small: every phase in the full tier
    # (a GQA group of 2 on one KV head: a second KV head would only change the KV head index)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Nq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    return q, k, v


def lse_phases():
    return [p.name for p in na.list_phases() if p.is_builtin and p.lse is True and p.layout == "contiguous"]


def _marks(name):
    return () if name in QUICK else (pytest.mark.full,)


def _check(name, causal, variant_kw=None, Nq=21, Nk=29, **params):
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


def _shape(name):
    """The query and key lengths a phase's test runs: a decode phase's q_len is at most 16."""
    return {"Nq": 3, "Nk": 53} if na.get_phase(name).kind == "decode" else {}


# causal and not on the quick tier's phases; the others causal only: the log-sum-exp is written by the same code
# either way (the causal calls also run unmasked tiles), and each phase's non-causal call with a mask and a score
# function is test_lse_with_a_variant's
@pytest.mark.parametrize("name,causal", [pytest.param(n, c, marks=_marks(n)) for n in lse_phases()
                                         for c in ((False, True) if n in QUICK else (True,))])
def test_lse_matches_reference(name, causal):
    _check(name, causal, **_shape(name))


def late_rows(b, h, q_idx, kv_idx):
    """Rows before 5 see no key (their lse is -inf); the others a window of the keys up to q_idx + 1."""
    return q_idx >= 5 and kv_idx <= q_idx + 1 and kv_idx >= q_idx - 6


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in lse_phases()])
def test_lse_with_a_variant(name):
    # a window that leaves the first rows without keys (lse -inf) and a softcap score function (decode: the
    # queries are the last 3 of 6 positions, q_idx 3, 4, 5: two rows see no key)
    shape = {"Nq": 3, "Nk": 6} if na.get_phase(name).kind == "decode" else {"Nq": 21, "Nk": 21}
    _check(name, False, {"mask_mod": late_rows, "score_mod": V.softcap(2.0)}, **shape)


def test_split_k_prefill_combine_writes_lse():
    _check("split_k_prefill", True, splits=3)


@pytest.mark.parametrize("name,params", [
    ("decode_split_k", {"splits": 1}),  # one split writes the output and the log-sum-exp
    pytest.param("decode_split_k_lean", {"fuse_max": 0}, marks=pytest.mark.full),  # the combine kernel
    pytest.param("decode_mma", {"fuse_max": 64}, marks=pytest.mark.full),  # the last block's combine
    pytest.param("decode_mma", {"splits": 1}, marks=pytest.mark.full),
])
def test_decode_lse_every_combine(name, params):
    _check(name, True, Nq=3, Nk=53, **params)
    _check(name, False, {"mask_mod": late_rows}, Nq=3, Nk=6, **params)


def test_decode_phases_write_lse():
    assert {p.name for p in na.list_phases() if p.is_builtin and p.kind == "decode"} <= {
        p.name for p in na.list_phases() if p.lse is True}


def _paged(D=32, kv_dtype="", Nq=1, H=2, Hkv=1, seed=7):
    """A paged batch: pages out of order and repeated, a partly filled page, a length-0 sequence; a GQA group of 2
    on one KV head."""
    rng = np.random.default_rng(seed)
    B, P, NB = 3, 16, 5
    x = [rng.standard_normal((NB, P, Hkv, D)).astype(np.float32) for _ in range(2)]
    if kv_dtype == "int8":
        kc, vc = (np.clip(np.rint(a * 30), -127, 127).astype(np.int8) for a in x)
        ks, vs = np.full(Hkv, 0.03, np.float32), np.full(Hkv, 0.02, np.float32)
    else:
        (kc, vc), ks, vs = (a.astype(np.float16) for a in x), None, None
    table = np.array([[4, 1, 4], [2, 0, 3], [1, 1, 1]], np.int32)
    lens = np.array([45, 21, 0], np.int32)
    q = rng.standard_normal((B, Nq, H, D)).astype(np.float16)
    return q, kc, vc, ks, vs, table, lens


def paged_lse_reference(q, kc, vc, table, lens, causal=False, kv_dtype="", ks=None, vs=None, variant=None):
    """(B, H, q_len) float64 log-sum-exp of each sequence's keys, gathered from the pages and dequantized."""
    from numba_attn.spec.paged import dequantize

    B, Nq, H, D = q.shape
    P = kc.shape[1]
    out = np.full((B, H, Nq), -np.inf)
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        pages = table[b, : (n + P - 1) // P]
        k, v = (dequantize(c[pages], kv_dtype, s).reshape(-1, c.shape[2], D)[:n].transpose(1, 0, 2)[None]
                for c, s in ((kc, ks), (vc, vs)))
        qb = np.swapaxes(q[b:b + 1].astype(np.float64), 1, 2)
        out[b] = reference(qb, k, v, causal=causal, return_lse=True, variant=variant)[1][0]
    return out


@pytest.mark.parametrize("name,kv_dtype,Nq", [
    ("paged_split_k", "", 1),
    pytest.param("paged_split_k", "", 2, marks=pytest.mark.full),  # GQA group 2 × q_len 2, causal
    pytest.param("paged_worklist", "", 1, marks=pytest.mark.full),
    pytest.param("paged_mma", "", 2, marks=pytest.mark.full),
    pytest.param("paged_mma8", "int8", 1, marks=pytest.mark.full),
])
def test_decode_paged_lse(name, kv_dtype, Nq):
    from numba_attn.spec.paged import paged_reference

    q, kc, vc, ks, vs, table, lens = _paged(D=64 if kv_dtype else 32, kv_dtype=kv_dtype, Nq=Nq)
    causal = Nq > 1
    kw = dict(causal=causal, k_scale=ks, v_scale=vs, phase=name, **na.get_phase(name).sim_params)
    out, lse = na.decode_paged(q, kc, vc, table, lens, return_lse=True, **kw)
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == np.float32  # (B, H, q_len)
    ref = paged_reference(q, kc, vc, table, lens, causal=causal, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=4e-3, rtol=1e-2)
    ref_lse = paged_lse_reference(q, kc, vc, table, lens, causal, kv_dtype, ks, vs)
    assert np.isneginf(lse[2]).all() and (np.isfinite(lse) == np.isfinite(ref_lse)).all()
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=1e-3, rtol=1e-4)
    np.testing.assert_array_equal(na.decode_paged(q, kc, vc, table, lens, **kw), out)  # a plain call: same out


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
