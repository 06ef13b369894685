"""attention(sinks=): per-head sink logits (gpt-oss, transformers' s_aux) applied from the phase's
log-sum-exp, against the float64 reference (a virtual key of score sinks[h] and value 0) on odd shapes, GQA,
causal, with and without mask_mod/score_mod variants."""
from __future__ import annotations

import numpy as np
import pytest

import numba_attn as na
from numba_attn import variants as V
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.reference import reference


def _qkv(B=2, H=2, Hkv=1, Nq=19, Nk=29, D=16, seed=5):  # GQA: two query heads (two sinks) on one KV head
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((B, H, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D)))


SINKS = np.array([-1.0, 3.5], np.float32)  # a head's sink under its scores, the other's over them


def _written_out(q, k, v, sinks, causal):
    """The sink as one more key column of score sinks[h] and value 0, softmax written out."""
    B, H, Nq, D = q.shape
    G = H // k.shape[1]
    kk, vv = np.repeat(k, G, 1).astype(np.float64), np.repeat(v, G, 1).astype(np.float64)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), kk) / np.sqrt(D)
    if causal:
        Nk = k.shape[2]
        s = np.where(np.arange(Nk)[None, :] > np.arange(Nq)[:, None] + Nk - Nq, -np.inf, s)
    col = np.broadcast_to(sinks.astype(np.float64).reshape(1, H, 1, 1), (B, H, Nq, 1))
    s = np.concatenate([s, col], -1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p[..., :-1], vv)


def test_reference_sinks_is_a_virtual_key():
    q, k, v = _qkv()
    for causal in (False, True):
        np.testing.assert_allclose(reference(q, k, v, causal=causal, sinks=SINKS),
                                   _written_out(q, k, v, SINKS, causal), atol=1e-12)


@pytest.mark.parametrize("name,causal", [("register_blocked", True), ("smem_kv", False),
                                         pytest.param("naive", True, marks=pytest.mark.full),
                                         pytest.param("segmented_out", True, marks=pytest.mark.full),
                                         pytest.param("split_k_prefill", True, marks=pytest.mark.full)])
def test_sinks_on_cuda_core_phases(name, causal):
    q, k, v = _qkv(B=1) if name == "naive" else _qkv()  # (naive: S and P materialized, kernels a thread per score)
    ph = na.get_phase(name)
    out = na.attention(q, k, v, causal=causal, phase=name, sinks=SINKS, **ph.sim_params)
    np.testing.assert_allclose(out, reference(q, k, v, causal=causal, sinks=SINKS), atol=2e-5, rtol=1e-4)


def window_rows(b, h, q_idx, kv_idx):
    """Rows before 4 see no key (a sink gives them 0); the others a window of eight keys."""
    return q_idx >= 4 and kv_idx <= q_idx and kv_idx > q_idx - 8


@pytest.mark.parametrize("name", ["register_blocked", pytest.param("fused_rowwise", marks=pytest.mark.full)])
def test_sinks_with_a_variant(name):
    from numba_attn.variants.mods import make_variant

    q, k, v = _qkv(Nq=23, Nk=23)
    ph = na.get_phase(name)
    kw = {"mask_mod": window_rows, "score_mod": V.softcap(3.0)}
    out, lse = na.attention(q, k, v, phase=name, sinks=SINKS, return_lse=True, **kw, **ph.sim_params)
    variant = make_variant(window_rows, V.softcap(3.0), ())
    ref, ref_lse = reference(q, k, v, sinks=SINKS, variant=variant, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)
    assert (out[:, :, :4] == 0).all() and np.isneginf(lse[:, :, :4]).all()


def test_sinks_phase_none_and_torch():
    q, k, v = _qkv(B=1)  # (the default phase's GPU tiles: one sequence, its simulator cost; sinks are per head)
    out = na.attention(q, k, v, causal=True, sinks=SINKS)
    np.testing.assert_allclose(out, reference(q, k, v, causal=True, sinks=SINKS), atol=2e-5, rtol=1e-4)
    torch = pytest.importorskip("torch")
    t = na.attention(*(torch.from_numpy(a) for a in (q, k, v)), causal=True, sinks=torch.from_numpy(SINKS))
    np.testing.assert_allclose(t.numpy(), out, atol=1e-6)


def test_bad_sinks_refused():
    q, k, v = _qkv()
    with pytest.raises(AttentionInputError, match="sinks must have shape"):
        na.attention(q, k, v, sinks=np.zeros(3, np.float32))
    with pytest.raises(AttentionInputError, match="finite"):
        na.attention(q, k, v, sinks=np.full(2, np.nan, np.float32))


@pytest.mark.full  # (the quick tier checks decode sinks through decode_paged)
@pytest.mark.parametrize("name", ["decode_split_k", "decode_mma"])
def test_sinks_on_a_decode_phase(name):
    # GQA, causal q_len 3 (bottom-right); a window mask that leaves the first query row without keys: 0
    ph = na.get_phase(name)
    dtype = np.float32 if "float32" in ph.dtypes else np.float16
    q, k, v = (a.astype(dtype) for a in _qkv(B=1, Nq=3, Nk=29))  # (two launches: one sequence each)
    out = na.attention(q, k, v, causal=True, phase=name, sinks=SINKS, **ph.sim_params)
    tol = {"atol": 2e-5, "rtol": 1e-4} if dtype == np.float32 else {"atol": 3e-3, "rtol": 1e-2}
    np.testing.assert_allclose(out.astype(np.float64), reference(q, k, v, causal=True, sinks=SINKS), **tol)

    from numba_attn.variants.mods import make_variant

    def late(b, h, q_idx, kv_idx):
        return q_idx >= 27 and kv_idx > q_idx - 8

    out = na.attention(q, k, v, phase=name, sinks=SINKS, mask_mod=late, **ph.sim_params)
    ref = reference(q, k, v, sinks=SINKS, variant=make_variant(late, None, ()))
    np.testing.assert_allclose(out.astype(np.float64), ref, **tol)
    assert (out[:, :, 0] == 0).all()


def test_sinks_on_decode_paged():
    # ragged sequences over pages (one of length 0: zeros), GQA, causal q_len 2

    rng = np.random.default_rng(9)
    B, Nq, H, Hkv, D, P = 3, 2, 2, 1, 16, 16
    kc, vc = (rng.standard_normal((5, P, Hkv, D)).astype(np.float16) for _ in range(2))
    table = np.array([[4, 1, 4], [2, 0, 3], [1, 1, 1]], np.int32)
    lens = np.array([45, 21, 0], np.int32)
    q = rng.standard_normal((B, Nq, H, D)).astype(np.float16)
    ph = na.get_phase("paged_split_k")
    out, lse = na.decode_paged(q, kc, vc, table, lens, causal=True, phase=ph.name, sinks=SINKS, return_lse=True,
                               **ph.sim_params)
    assert lse.shape == (B, H, Nq)
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            assert not out[b].astype(np.float32).any() and np.isneginf(lse[b]).all()
            continue
        k, v = (c[table[b, : (n + P - 1) // P]].reshape(-1, Hkv, D)[:n].transpose(1, 0, 2)[None] for c in (kc, vc))
        qb = np.swapaxes(q[b:b + 1], 1, 2)
        ref = reference(qb, k, v, causal=True, sinks=SINKS)
        np.testing.assert_allclose(np.swapaxes(out[b:b + 1], 1, 2).astype(np.float64), ref, atol=3e-3, rtol=1e-2)
    with pytest.raises(AttentionInputError, match="sinks must have shape"):
        na.decode_paged(q, kc, vc, table, lens, phase=ph.name, sinks=np.zeros(3, np.float32), **ph.sim_params)
