"""Attention variants (mask_mod/score_mod) on the decode phases, contiguous and paged, against the float64
reference in the simulator: a window (splits that see no key), softcap, left key padding (a sequence whose rows
see no key: 0, also through the split-K combine), ALiBi, and a window with softcap under causal q_len > 1."""
from __future__ import annotations

import numpy as np
import pytest

import numba_attn as na
from numba_attn import variants as V
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.phases.decode.paged import paged_scales
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.problem import PagedProblem
from numba_attn.spec.reference import check, reference
from numba import cuda  # noqa: E402  (after numba_attn: the backend is chosen first)

B, H, HKV = 2, 2, 1  # a GQA group of 2 on one KV head (a second KV head only changes the KV head index)


def _variants(Nk):
    lens = np.array([0, Nk - 9], np.int32)  # left padding: sequence 0 is all padding (its rows see no key)
    return {
        "window": (dict(mask_mod=V.sliding_window(6)), False),
        "softcap": (dict(score_mod=V.softcap(2.0)), True),
        "pad_left": (dict(mask_mod=V.key_padding(lens, "left", kv_len=Nk)), False),
        "alibi": (dict(score_mod=V.alibi(V.alibi_slopes(H))), False),
        "window+softcap": (dict(mask_mod=V.sliding_window(9), score_mod=V.softcap(3.0)), True),
    }


def _variant(kw):
    return V.make_variant(kw.get("mask_mod"), kw.get("score_mod"))


def _inputs(dtype, Nq, Nk, D=16, seed=0, batch=B):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, H, Nq, D)).astype(dtype)
    k = rng.standard_normal((batch, HKV, Nk, D)).astype(dtype)
    v = rng.standard_normal((batch, HKV, Nk, D)).astype(dtype)
    return q, k, v


def _contiguous(phase, name, Nq=3, Nk=45, **params):
    ph = na.get_phase(phase)
    kw, causal = _variants(Nk)[name]
    dtype = "float32" if "float32" in ph.dtypes else "float16"
    # one sequence where the variant reads no sequence index (pad_left's lengths are per sequence: two)
    q, k, v = _inputs(dtype, Nq, Nk, batch=B if name == "pad_left" else 1)
    out = na.attention(q, k, v, causal=causal, phase=phase, **{**ph.sim_params, **params}, **kw)
    c = check(out, reference(q, k, v, causal=causal, variant=_variant(kw)), dtype=dtype, precision=ph.precision)
    assert c.ok, f"{phase} {name}: {c.reason}"


def _paged_reference(q, kc, vc, table, lens, causal, variant):
    D = q.shape[-1]
    """Each sequence b against its own keys (kv_idx 0 .. len-1, Nk = len): the contiguous reference of a batch
    whose entry b is that sequence (the variant reads b)."""
    P = kc.shape[1]
    out = np.zeros(q.shape, np.float64)
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        rows = (table[b, np.arange(n) // P] * P + np.arange(n) % P)
        kb = kc.reshape(-1, HKV, D)[rows].transpose(1, 0, 2)[None]
        vb = vc.reshape(-1, HKV, D)[rows].transpose(1, 0, 2)[None]
        reps = b + 1
        ref = reference(np.repeat(q[b:b + 1], reps, 0), np.repeat(kb, reps, 0), np.repeat(vb, reps, 0),
                        causal=causal, variant=variant)
        out[b] = ref[b]
    return out


def _paged(phase, name, Nq=2, P=16, lens=(40, 29), dtype="float16", D=16, kv_dtype="", **params):
    ph = na.get_phase(phase)
    lens = np.asarray(lens, np.int32)
    Nk = int(lens.max())
    kw, causal = _variants(Nk)[name]
    if name == "pad_left":  # the padding of each sequence's own keys: the second sequence keeps its last 11
        kw = dict(mask_mod=V.key_padding(np.array([0, 11], np.int32), "left", kv_len=lens))
    variant = _variant(kw)
    rng = np.random.default_rng(1)
    pages = -(-lens // P)
    table = np.full((B, int(pages.max())), 0, np.int32)
    order = rng.permutation(int(pages.sum())).astype(np.int32)
    table[0, :pages[0]] = order[:pages[0]]
    table[1, :pages[1]] = order[pages[0]:]
    kc, vc = (rng.standard_normal((int(pages.sum()), P, HKV, D)) for _ in range(2))
    ks = vs = None
    if kv_dtype:  # int8 codes, a scale per KV head; the reference reads the dequantized cache
        kc, vc = (np.clip(np.rint(a * 30), -127, 127).astype(np.int8) for a in (kc, vc))
        ks, vs = (rng.uniform(0.02, 0.04, HKV).astype(np.float32) for _ in range(2))
    else:
        kc, vc = kc.astype(dtype), vc.astype(dtype)
    q = rng.standard_normal((B, H, Nq, D)).astype(dtype)
    problem = PagedProblem(batch=B, heads=H, kv_heads=HKV, q_len=Nq, kv_len=Nk, head_dim=D, dtype=dtype,
                           causal=causal, page_size=P, kv_dtype=kv_dtype, variant=variant)
    launch = ph.plan(problem, **{**ph.sim_params, **params})
    layout = (cuda.to_device(table), cuda.to_device(lens)) + paged_scales(problem, ks, vs)
    od = cuda.device_array((B * H, Nq, D), dtype=dtype)
    extra = {"lens": lens} if launch.host_lengths else {}
    launch.run(cuda.to_device(q.reshape(B * H, Nq, D)), cuda.to_device(kc), cuda.to_device(vc), od, 0, layout,
               **extra)
    out = od.copy_to_host().reshape(B, H, Nq, D)
    if kv_dtype:
        kc, vc = kc.astype(np.float64) * ks[:, None], vc.astype(np.float64) * vs[:, None]
    ref = _paged_reference(q, kc, vc, table, lens, causal, variant)
    c = check(out, ref, dtype=dtype, precision=ph.precision)
    assert c.ok, f"{phase} {name}: {c.reason}"


QUICK_NAMES = ("window", "softcap", "pad_left", "alibi")
CONTIGUOUS = ["decode_chunked", "decode_split_k", "decode_split_k_fused", "decode_split_k_lean", "decode_mma"]
PAGED = ["paged_split_k", "paged_mma", "paged_worklist"]


def test_every_decode_phase_runs_variants():
    assert all(na.get_phase(p).variants for p in CONTIGUOUS + PAGED + ["paged_mma8"])


# the quick tier: each variant on one contiguous phase and one paged phase
@pytest.mark.parametrize("name", QUICK_NAMES)
def test_contiguous_decode_variant(name):
    _contiguous("decode_mma", name, Nk=30)


@pytest.mark.parametrize("name", QUICK_NAMES)
def test_paged_decode_variant(name):
    _paged("paged_split_k", name, lens=(30, 21))


# decode_split_k (the family's first split kernel) with every variant; the other phases with a mask and score
# function together and an aux array (their variant stage is the family's one, scores.py)
EVERY = [(p, n) for p in CONTIGUOUS if p != "decode_mma"
         for n in (QUICK_NAMES + ("window+softcap",) if p == "decode_split_k" else ("window+softcap", "pad_left"))]


@pytest.mark.full
@pytest.mark.parametrize("phase,name", EVERY)
def test_every_contiguous_decode_phase(phase, name):
    _contiguous(phase, name, Nk=30)


@pytest.mark.full
@pytest.mark.parametrize("name", QUICK_NAMES + ("window+softcap",))
@pytest.mark.parametrize("phase", [p for p in PAGED if p != "paged_split_k"] + ["paged_mma8"])
def test_every_paged_decode_phase(phase, name):
    if phase == "paged_mma8":  # 8-bit caches, head_dim a multiple of 64
        _paged(phase, name, lens=(30, 21), D=64, kv_dtype="int8")
    else:
        _paged(phase, name, lens=(30, 21))


@pytest.mark.full
@pytest.mark.parametrize("phase", ["decode_split_k", "decode_mma"])
def test_one_split_writes_zero_rows(phase):
    """One split: the kernel writes the output itself (no partials), 0 for the rows that see no key."""
    _contiguous(phase, "pad_left", Nk=30, splits=1)


def test_decode_paged_takes_a_variant_and_new_arrays_per_call():
    """``decode_paged(mask_mod=..., aux=...)``: positions within each sequence; a second call with other arrays
    reads its own arrays; a mask function whose array is missing is refused by name."""
    P, lens = 16, np.array([40, 29], np.int32)
    rng = np.random.default_rng(5)
    pages = -(-lens // P)
    table = np.zeros((B, int(pages.max())), np.int32)
    order = rng.permutation(int(pages.sum())).astype(np.int32)
    table[0, :pages[0]], table[1, :pages[1]] = order[:pages[0]], order[pages[0]:]
    kc, vc = (rng.standard_normal((int(pages.sum()), P, HKV, 16)).astype("float16") for _ in range(2))
    q = rng.standard_normal((B, 1, H, 16)).astype("float16")

    def keep_last(b, h, q_idx, kv_idx, keep):
        return q_idx - kv_idx < keep[b]

    for keep in (np.array([5, 12], np.int32), np.array([30, 1], np.int32)):
        out = na.decode_paged(q, kc, vc, table, lens, phase="paged_split_k", mask_mod=keep_last, aux=(keep,),
                              **{**na.get_phase("paged_split_k").sim_params, "splits": 2})
        ref = _paged_reference(q.transpose(0, 2, 1, 3), kc, vc, table, lens, False,
                               V.make_variant(keep_last, aux=(keep,)))
        c = check(out.transpose(0, 2, 1, 3), ref, dtype="float16")
        assert c.ok, c.reason
    with pytest.raises(AttentionInputError, match="keep_last"):
        na.decode_paged(q, kc, vc, table, lens, phase="paged_split_k", mask_mod=keep_last)  # its array missing


@pytest.mark.skipif(not IS_SIMULATOR, reason="counts the simulator's global loads")
@pytest.mark.parametrize("phase", ["decode_split_k", pytest.param("decode_mma", marks=pytest.mark.full),
                                   pytest.param("decode_split_k_lean", marks=pytest.mark.full)])
def test_a_window_reads_only_the_keys_it_sees(phase, monkeypatch):
    """With a mask function the split-K decode divides only the keys the step's query heads see (the span of the
    block mask): a window of 40 over 517 keys reads under half the global bytes of the plain step, and gives the
    reference's output."""
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure

    ph = na.get_phase(phase)
    p = na.Problem(batch=1, heads=2, kv_heads=1, q_len=1, kv_len=517, head_dim=16, dtype="float16")
    read = {}
    monkeypatch.setenv("NUMBA_ATTN_SIM_COUNTS", "1")
    for name, prob in (("plain", p), ("window", p.replace(variant=V.make_variant(V.sliding_window(40), None)))):
        row = measure(phase, prob, RunConfig(seeds=(1,)), **ph.sim_params)  # one launch each, counted and checked
        assert row["status"] == "OK", row["reason"]
        read[name] = row["sim_gmem_read_bytes"]
    assert read["window"] < 0.5 * read["plain"], read


@pytest.mark.full
def test_span_kernels_compile_for_the_gpu_with_arrays_of_several_types():
    """The span reader indexes ``mods`` by a constant: with a mask's 1-D lengths beside the 2-D spans (and ALiBi's
    slopes) the split-K decode kernels still type and compile for sm_90a (a runtime index does not)."""
    from offline_compile import offline_json

    res = offline_json("""
import json, numpy as np
import numba_attn.measure.offline as off
from numba_attn import Problem
from numba_attn import variants as V
res = {}
# each kernel once, with 1-D arrays beside the 2-D spans: key padding's lengths, or ALiBi's slopes
for name, mask, score, phases in (("pad_left", V.key_padding(np.array([0, 30], np.int32), "left", kv_len=45), None,
                                   ("decode_split_k", "decode_mma")),
                                  ("window+alibi", V.sliding_window(6), V.alibi(V.alibi_slopes(4)),
                                   ("decode_split_k_lean",))):
    for ph in phases:
        p = Problem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=45, head_dim=64, dtype="float16",
                    variant=V.make_variant(mask, score))
        res[ph + "-" + name] = [r.get("regs") for r in off.compile_phase(ph, p)]
print("JSON" + json.dumps(res))
""")
    assert len(res) == 3 and all(regs and all(r for r in regs) for regs in res.values()), res
