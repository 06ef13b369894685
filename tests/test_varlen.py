"""Prefill over a packed ragged batch (issue 18, FlashAttention's varlen layout): ``attention_varlen``
and the varlen phases against the float64 varlen reference, in the simulator, on tiny shapes:
odd lengths, a sequence without queries (length 0: no output rows), GQA, causal bottom-right per
sequence, head_dim 16 and 32, device arrays, a runner row; and the layout's own checks."""
import numpy as np
import pytest

import numba_attn as na
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure
from numba_attn.phases.registry import get_phase
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.problem import Problem, VarlenProblem
from numba_attn.spec.reference import reference
from numba_attn.spec.varlen import cu_seqlens, varlen_reference
from numba import cuda  # noqa: E402  (after numba_attn: the backend is chosen first)

VARLEN = [p.name for p in na.list_phases() if p.layout == "varlen"]
SIM = {name: get_phase(name).sim_params for name in VARLEN}


def _packed(rng, lq, lk, H, Hkv, D, dtype=np.float16):
    q = rng.standard_normal((int(sum(lq)), H, D), dtype=np.float32).astype(dtype)
    k = rng.standard_normal((int(sum(lk)), Hkv, D), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((int(sum(lk)), Hkv, D), dtype=np.float32).astype(dtype)
    return q, k, v, cu_seqlens(lq), cu_seqlens(lk)


def _run(phase, q, k, v, cq, ck, causal=False, dtype="float16", **params):
    out = na.attention_varlen(q, k, v, cq, ck, causal=causal, phase=phase, params={**SIM[phase], **params})
    ref = varlen_reference(q, k, v, cq, ck, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    c = na.check(out, ref, dtype=dtype)
    assert c.ok, c.reason
    return out, ref


def test_reference_is_the_contiguous_reference_per_sequence():
    rng = np.random.default_rng(0)
    q, k, v, cq, ck = _packed(rng, [3, 0, 6], [5, 2, 6], 4, 2, 8, np.float32)
    out = varlen_reference(q, k, v, cq, ck, causal=True)
    for b, (q0, q1, k0, k1) in enumerate(zip(cq[:-1], cq[1:], ck[:-1], ck[1:])):
        if q1 > q0:
            one = reference(q[None, q0:q1].transpose(0, 2, 1, 3), k[None, k0:k1].transpose(0, 2, 1, 3),
                            v[None, k0:k1].transpose(0, 2, 1, 3), causal=True)
            np.testing.assert_allclose(out[q0:q1], one[0].transpose(1, 0, 2))


@pytest.mark.parametrize("phase", VARLEN)
@pytest.mark.parametrize("causal", [False, True])
def test_odd_lengths_an_empty_sequence_and_gqa(phase, causal):
    """Three sequences, 5, 0 and 17 queries over 9, 7 and 17 keys (the empty one's keys are not
    read), GQA (2 query heads over 1 KV head), head_dim 16."""
    rng = np.random.default_rng(1)
    q, k, v, cq, ck = _packed(rng, [5, 0, 17], [9, 7, 17], 2, 1, 16)
    _run(phase, q, k, v, cq, ck, causal=causal)


@pytest.mark.parametrize("phase", VARLEN)
def test_head_dim_32_causal_and_sequences_longer_than_a_block(phase):
    """head_dim 32, causal with more keys than queries (bottom-right), a sequence spanning two
    query blocks of the simulator tiles and a one-row sequence; empty sequences first and last."""
    rng = np.random.default_rng(2)
    Br = 16 * SIM[phase].get("warps", 4 * SIM[phase].get("warpgroups", 1))
    q, k, v, cq, ck = _packed(rng, [0, Br + 3, 1, 0], [4, Br + 11, 6, 0], 2, 2, 32)
    _run(phase, q, k, v, cq, ck, causal=True)


@pytest.mark.parametrize("phase", VARLEN)
def test_head_dim_an_odd_multiple_of_8(phase):
    """head_dim 40: Q·Kᵀ padded to whole k-steps, the wgmma tiles to 64 columns (zero-filled chunks)."""
    rng = np.random.default_rng(5)
    q, k, v, cq, ck = _packed(rng, [3, 10], [8, 10], 2, 1, 40)
    _run(phase, q, k, v, cq, ck)


def test_bf16_and_device_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    q, k, v, cq, ck = _packed(rng, [7, 2], [7, 11], 2, 1, 16, ml_dtypes.bfloat16)
    _run("tc_mma_varlen", q, k, v, cq, ck, dtype="bfloat16")
    q, k, v, cq, ck = _packed(rng, [6, 3], [6, 3], 2, 1, 16)
    dev = [cuda.to_device(a) for a in (q, k, v, cq, ck)]
    out = na.attention_varlen(*dev, causal=True, phase="tc_mma_varlen", params=SIM["tc_mma_varlen"])
    ref = varlen_reference(q, k, v, cq, ck, causal=True)
    assert na.check(out.copy_to_host(), ref, dtype="float16").ok


def test_cpu_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    q, k, v, cq, ck = _packed(rng, [4, 5], [5, 7], 2, 1, 16)
    out = na.attention_varlen(*(torch.from_numpy(a) for a in (q, k, v, cq, ck)), causal=True, phase="tc_mma_varlen",
                              params=SIM["tc_mma_varlen"])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    assert na.check(out.numpy(), varlen_reference(q, k, v, cq, ck, causal=True), dtype="float16").ok


def test_default_phase_out_and_no_queries_at_all():
    rng = np.random.default_rng(4)
    q, k, v, cq, ck = _packed(rng, [4, 9], [4, 9], 2, 2, 16)
    out = np.empty_like(q)
    res = na.attention_varlen(q, k, v, cq, ck, params={"warpgroups": 1, "Bc": 16}, out=out)  # tc_wgmma_varlen
    assert res is out
    assert na.check(out, varlen_reference(q, k, v, cq, ck), dtype="float16").ok
    q0 = np.zeros((0, 2, 16), np.float16)
    empty = na.attention_varlen(q0, k, v, np.zeros(3, np.int32), ck)  # every sequence without queries
    assert empty.shape == (0, 2, 16)


def test_problem_counts_only_the_real_pairs_and_its_padded_twin():
    p = VarlenProblem(batch=4, heads=2, q_len=64, head_dim=16, dtype="float16", causal=True)
    lq, lk = p.seqlens()
    assert (lq >= 16).all() and (lq <= 64).all() and (lk == lq).all()
    assert p.flops() == 4 * 2 * 16 * sum(n * (n + 1) // 2 for n in map(int, lq))
    assert p.padded() == Problem(batch=4, heads=2, q_len=64, head_dim=16, dtype="float16", causal=True)
    assert p.flops() < p.padded().flops()
    assert Problem.from_dict(p.to_dict()) == p
    assert p.out_shape() == (int(lq.sum()), 2, 16)
    assert get_phase("tc_mma").supports(p) and get_phase("tc_mma_varlen").supports(p.padded())


def test_a_runner_row_on_a_varlen_problem():
    p = VarlenProblem(batch=3, heads=2, kv_heads=1, q_len=21, kv_len=25, head_dim=16, dtype="float16", causal=True)
    row = measure("tc_mma_varlen", p, RunConfig(seeds=(7,)), **SIM["tc_mma_varlen"])
    assert row["status"] == "OK", row["reason"]
    assert row["flops"] == p.flops()
    assert measure("tc_mma", p, RunConfig(seeds=(7,)))["status"] == "SKIP"  # a contiguous phase: not this layout


def test_bad_cu_seqlens_on_the_device_are_read_back_and_refused():
    q = np.zeros((5, 2, 16), np.float16)
    k = np.zeros((5, 2, 16), np.float16)
    with pytest.raises(AttentionInputError, match="cu_seqlens_k must be non-decreasing"):
        na.attention_varlen(q, k, k, np.array([0, 2, 5], np.int32), cuda.to_device(np.array([0, 6, 5], np.int32)))
