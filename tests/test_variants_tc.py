"""Attention variants on the mma.sync tensor-core phases (tc_mma, tc_pipelined, tc_tf32) against the reference;
the varlen phases run them per sequence. The quick tier runs one mask and score function on tc_mma; the full tier each
built-in (tests/test_variants.py's table) and the pipelined phases with several key tiles per block."""
from __future__ import annotations

import numpy as np
import pytest

import numba_attn as na
from numba_attn import variants as V
from numba_attn.spec.problem import VarlenProblem
from numba_attn.spec.reference import check, reference
from test_variants import PER_SEQUENCE, builtin_variants

MMA_PHASES = ("tc_mma", "tc_pipelined", "tc_tf32")


def _run_variant(phase, kw, causal, B=2, H=2, Hkv=1, Nq=37, Nk=45, D=16, **params):
    """``phase`` (its sim_params, then ``params``) with the variant ``kw`` against the float64 reference."""
    ph = na.get_phase(phase)
    rng = np.random.default_rng(hash((phase, causal)) % 1000)
    q, k, v = (rng.standard_normal((B, h, n, D)).astype(np.float32) for h, n in ((H, Nq), (Hkv, Nk), (Hkv, Nk)))
    dtype = "float32" if "float32" in ph.dtypes else ph.dtypes[0]
    if dtype != "float32":
        q, k, v = (x.astype(dtype) for x in (q, k, v))
    out = na.attention(q, k, v, causal=causal, phase=phase, **{**ph.sim_params, **params}, **kw)
    ref = reference(q, k, v, causal=causal, variant=V.make_variant(kw.get("mask_mod"), kw.get("score_mod")))
    c = check(out, ref, dtype=dtype, precision=ph.precision)
    assert c.ok, f"{phase} {kw} causal={causal}: {c.reason}"


def _batch(name):
    """Two sequences for a built-in whose arrays are per sequence, else one (tests/test_variants.py's PER_SEQUENCE)."""
    return 2 if name in PER_SEQUENCE else 1


def test_window_and_softcap_on_tc_mma():
    """Causal, an odd shape (37 queries over 45 keys: empty, partial and full tiles of 32 × 16)."""
    _run_variant("tc_mma", builtin_variants(2, 2, 45)["window+softcap"], causal=True, B=_batch("window+softcap"))


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(builtin_variants(2, 2, 45)))
def test_each_builtin_on_tc_mma(name):
    """pad_left: the first sequence's early rows see no key (their output is 0)."""
    _run_variant("tc_mma", builtin_variants(2, 2, 45)[name], causal=name in ("softcap", "alibi"), B=_batch(name))


@pytest.mark.full
@pytest.mark.parametrize("phase", MMA_PHASES[1:])
@pytest.mark.parametrize("name", ["pad_left", "window_lr", "document+alibi"])
def test_builtins_on_the_pipelined_phases(phase, name):
    """Every refill of the cp.async ring loads the block mask's next visited tile."""
    _run_variant(phase, builtin_variants(2, 2, 45)[name], causal=False, B=_batch(name))


@pytest.mark.full
def test_pipelined_with_two_m_tiles_and_three_stages():
    """Each warp's two m-tiles pass the variant; two refills in flight, of visited tiles only."""
    _run_variant("tc_pipelined", builtin_variants(2, 2, 45)["window+softcap"], causal=True, m_tiles=2, stages=3,
                 B=_batch("window+softcap"))


@pytest.mark.parametrize("phase", ["tc_mma_varlen", "tc_wgmma_varlen"])
def test_varlen_phases_run_a_variant_per_sequence(phase):
    """A packed ragged batch: the functions see each sequence as batch index b and its own positions; no block
    mask (every tile up to the causal bound is visited). A window, ALiBi slopes (an array) and a soft-cap."""
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure

    variant = V.make_variant(V.sliding_window(5), V.alibi(V.alibi_slopes(2)))
    p = VarlenProblem(batch=3, heads=2, kv_heads=1, q_len=21, kv_len=25, head_dim=16, dtype="float16", causal=True,
                      variant=variant)
    row = measure(phase, p, RunConfig(seeds=(5,)), **na.get_phase(phase).sim_params)
    assert row["status"] == "OK", row["reason"]
    capped = p.replace(variant=V.make_variant(None, V.softcap(2.0)), causal=False)
    row = measure(phase, capped, RunConfig(seeds=(6,)), **na.get_phase(phase).sim_params)
    assert row["status"] == "OK", row["reason"]


def test_warp_specialized_tile_width_follows_the_variant():
    """128-key tiles for plain attention and a mask-only variant at D=128; 64 with a score function (whose stage
    spills at 128, offline sm_90a) and for any variant at D=64."""
    from numba_attn.phases.tensor_core.p26_warp_specialized_tc import resolve_warp_specialized
    from numba_attn.spec.problem import Problem

    def bc(D, variant):
        p = Problem(batch=1, heads=4, kv_heads=4, q_len=4096, kv_len=4096, head_dim=D, dtype="float16",
                    causal=True, variant=variant)
        return resolve_warp_specialized(p, 0, 0, 2)["Bc"]

    window, cap = V.make_variant(V.sliding_window(9)), V.make_variant(None, V.softcap(5.0))
    assert (bc(128, None), bc(128, window), bc(128, cap)) == (128, 128, 64)
    assert (bc(64, None), bc(64, window)) == (128, 64)


def test_phase_none_runs_a_variant_on_the_variant_prefill_phase(monkeypatch):
    """With a variant, a 16-bit prefill on an sm_90a GPU runs VARIANT_PREFILL whatever the dispatch table says for
    the plain problem (its rows were measured without the variant stage)."""
    from numba_attn.measure import policy
    from numba_attn.phases import registry
    from numba_attn.spec.problem import Problem

    monkeypatch.setattr(registry, "device_cc", lambda: (9, 0))
    p = Problem(batch=1, heads=32, kv_heads=32, q_len=32768, kv_len=32768, head_dim=128, dtype="bfloat16",
                causal=True, variant=V.make_variant(V.sliding_window(1023)))
    phase, why, params = policy.choose_phase(p)
    assert phase.name == policy.VARIANT_PREFILL and params == {} and "variant" in why


def test_attention_varlen_takes_mask_and_score_functions_with_arrays():
    """attention_varlen(mask_mod=, score_mod=, aux=): per-sequence arrays (each sequence's own window width,
    indexed by b) reach the functions; the output against the varlen reference of the same variant."""
    from numba_attn.spec.varlen import cu_seqlens, varlen_reference

    def own_window(b, h, q_idx, kv_idx, widths):
        return kv_idx <= q_idx and q_idx - kv_idx <= widths[b]

    rng = np.random.default_rng(7)
    lq, lk = np.array([5, 19, 11]), np.array([9, 19, 14])
    q = rng.standard_normal((lq.sum(), 2, 16)).astype(np.float16)
    k, v = (rng.standard_normal((lk.sum(), 1, 16)).astype(np.float16) for _ in range(2))
    cq, ck = cu_seqlens(lq), cu_seqlens(lk)
    widths = np.array([1, 6, 3], np.int32)
    for phase in ("tc_mma_varlen", "tc_wgmma_varlen"):
        out = na.attention_varlen(q, k, v, cq, ck, phase=phase, params=na.get_phase(phase).sim_params,
                                  mask_mod=own_window, score_mod=V.softcap(3.0), aux=(widths,))
        variant = V.make_variant(V.Mod(own_window, "mask", (widths,), "own_window"), V.softcap(3.0))
        ref = varlen_reference(q, k, v, cq, ck, variant=variant)
        assert check(out, ref, dtype="float16").ok, phase
        plain = varlen_reference(q, k, v, cq, ck)
        assert not check(out, plain, dtype="float16").ok  # the variant changed the answer
