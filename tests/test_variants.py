"""Attention variants: the built-ins against masks written out in NumPy, the block mask on the device against
its host twin, user functions refused with their name, and every variant-capable phase against the float64
reference on odd shapes."""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import numba_attn as na
from numba_attn import variants as V
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.reference import check, reference


def _qkv(B=2, H=4, Hkv=2, Nq=37, Nk=37, D=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Nq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(np.float32)
    return q, k, v


def _dense(q, k, v, hidden=None, mod=None, scale=None):
    """Attention written out: ``hidden`` (B, H, Nq, Nk) True where masked; ``mod`` applied to scores;
    rows that see nothing are 0."""
    B, H, Nq, D = q.shape
    G = H // k.shape[1]
    kk, vv = np.repeat(k, G, 1).astype(np.float64), np.repeat(v, G, 1).astype(np.float64)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), kk) * (scale or 1 / np.sqrt(D))
    if mod is not None:
        s = mod(s)
    if hidden is not None:
        s = np.where(hidden, -np.inf, s)
    m = s.max(-1, keepdims=True)
    empty = np.isneginf(m)
    p = np.exp(s - np.where(empty, 0, m))
    o = np.einsum("bhij,bhjd->bhid", p, vv) / np.where(empty, 1, p.sum(-1, keepdims=True))
    return np.where(empty, 0, o)


def _pos(Nq, Nk):
    return (np.arange(Nq)[:, None] + Nk - Nq), np.arange(Nk)[None, :]


# -- the built-ins and the reference ----------------------------------------------------------


@pytest.mark.parametrize("Nq,Nk", [(37, 37), (5, 40)])
def test_builtins_match_masks_written_in_numpy(Nq, Nk):
    q, k, v = _qkv(Nq=Nq, Nk=Nk)
    B, H = q.shape[:2]
    qi, kj = _pos(Nq, Nk)
    doc = (np.arange(Nk)[None, :] // 9 + np.arange(B)[:, None]).astype(np.int32)
    lengths = np.array([Nk - 7, Nk], np.int32)
    prefix = np.array([3, 11], np.int32)
    slopes = V.alibi_slopes(H)
    cases = {
        "causal": (V.causal(), None, np.broadcast_to(kj > qi, (B, H, Nq, Nk))),
        "window": (V.sliding_window(6), None, np.broadcast_to((kj > qi) | (kj < qi - 6), (B, H, Nq, Nk))),
        "window_lr": (V.sliding_window(3, 2), None, np.broadcast_to((kj > qi + 2) | (kj < qi - 3), (B, H, Nq, Nk))),
        "document": (V.document(doc), None, doc[:, None, qi[:, 0], None] != doc[:, None, None, :]),
        "prefix_lm": (V.prefix_lm(prefix), None, ~((kj[None] < prefix[:, None, None]) | (kj <= qi)[None])[:, None]),
        "pad_right": (V.key_padding(lengths), None, np.broadcast_to(
            (kj[None] >= lengths[:, None, None])[:, None], (B, H, Nq, Nk))),
        "pad_left": (V.key_padding(lengths, "left", kv_len=Nk), None, np.broadcast_to(
            (kj[None] < (Nk - lengths)[:, None, None])[:, None], (B, H, Nq, Nk))),
        "streaming": (V.streaming(5, 2), None, np.broadcast_to(
            ~(((kj <= qi) & (kj > qi - 5)) | ((kj < 2) & (kj <= qi))), (B, H, Nq, Nk))),
    }
    for name, (mask, _, hidden) in cases.items():
        got = reference(q, k, v, variant=V.make_variant(mask))
        np.testing.assert_allclose(got, _dense(q, k, v, hidden), atol=1e-12, err_msg=name)
    got = reference(q, k, v, variant=V.make_variant(score_mod=V.softcap(1.5)))
    np.testing.assert_allclose(got, _dense(q, k, v, mod=lambda s: 1.5 * np.tanh(s / 1.5)), atol=1e-6)
    got = reference(q, k, v, variant=V.make_variant(score_mod=V.alibi(slopes)))
    bias = slopes[None, :, None, None].astype(np.float64) * (kj - qi)[None, None]
    np.testing.assert_allclose(got, _dense(q, k, v, mod=lambda s: s + bias), atol=1e-6)


def test_reference_of_the_causal_builtin_is_the_causal_reference():
    q, k, v = _qkv(Nq=20, Nk=33)
    np.testing.assert_array_equal(reference(q, k, v, variant=V.make_variant(V.causal())),
                                  reference(q, k, v, causal=True))


def test_and_or_masks_combine_their_arrays():
    doc = np.repeat(np.arange(4), 10)[None].astype(np.int32)
    lengths = np.array([31], np.int32)
    both = V.and_masks(V.causal(), V.document(doc), V.key_padding(lengths))
    assert len(both.aux) == 2 and both.depends == "b"
    q, k, v = _qkv(B=1, Nq=40, Nk=40)
    qi, kj = _pos(40, 40)
    hidden = (kj > qi) | (doc[0][qi[:, 0]][:, None] != doc[0][None, :]) | (kj >= 31)
    np.testing.assert_allclose(reference(q, k, v, variant=V.make_variant(both)), _dense(q, k, v, hidden), atol=1e-12)
    either = V.or_masks(V.sliding_window(2), V.sink_tokens(3))
    hidden = ~(((kj <= qi) & (kj >= qi - 2)) | ((kj < 3) & (kj <= qi)))
    np.testing.assert_allclose(reference(q, k, v, variant=V.make_variant(either)), _dense(q, k, v, hidden),
                               atol=1e-12)


# -- block masks -------------------------------------------------------------------------------


@pytest.mark.parametrize("Br,Bc", [(8, 8)])
def test_block_mask_on_the_device_is_its_host_twin(Br, Bc):
    doc = (np.arange(35)[None, :] // 18 + np.arange(2)[:, None]).astype(np.int32)
    mask = V.and_masks(V.causal(), V.document(doc))
    dev = V.create_block_mask(mask, 2, None, 35, 35, Br=Br, Bc=Bc)
    host = V.host_block_mask(mask, 2, None, 35, 35, Br=Br, Bc=Bc)
    np.testing.assert_array_equal(dev.host(), host.host())
    np.testing.assert_array_equal(dev.counts.copy_to_host(), host.counts)
    np.testing.assert_array_equal(dev.indices.copy_to_host(), host.indices)
    c = host.tally()
    assert c["partial"] and c["empty"] and (c["full"] or Br > 8), c


def test_column_lists_walk_the_key_tiles():
    """The lists per column of key tiles (a backward dK/dV kernel's walk over query tiles): on the device as on the
    host, each the row lists of the transposed map, visited query tiles first and in order."""
    from numba_attn.variants.blockmask import column_lists, device_column_lists, tile_lists

    doc = (np.arange(35)[None, :] // 18 + np.arange(2)[:, None]).astype(np.int32)
    host = V.host_block_mask(V.and_masks(V.causal(), V.document(doc)), 2, None, 35, 35, Br=8, Bc=16)
    kinds = host.host()
    counts, indices = column_lists(kinds)
    assert counts.shape == (2, 1, 3) and indices.shape == (2, 1, 3, 5)
    want_counts, want_indices = tile_lists(np.ascontiguousarray(kinds.transpose(0, 1, 3, 2)))
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_array_equal(indices, want_indices)
    for b in range(2):
        for kt in range(3):
            seen = [qt for qt in range(5) if kinds[b, 0, qt, kt] != V.EMPTY]
            assert list(indices[b, 0, kt, :counts[b, 0, kt]]) == seen
    dev_counts, dev_indices = device_column_lists(cuda.to_device(kinds))
    np.testing.assert_array_equal(dev_counts.copy_to_host(), counts)
    np.testing.assert_array_equal(dev_indices.copy_to_host(), indices)


def test_block_mask_regrids_to_a_kernels_tiles():
    mask = V.sliding_window(9)
    fine = V.host_block_mask(mask, None, None, 70, 70, Br=8, Bc=8)
    for Br, Bc in ((16, 16), (32, 8), (4, 4)):
        direct = V.host_block_mask(mask, None, None, 70, 70, Br=Br, Bc=Bc)
        if Br >= 8 and Bc >= 8:  # coarser: exact
            np.testing.assert_array_equal(fine.at(Br, Bc).host(), direct.host())
        else:  # finer: never claims more than the truth (a partial tile may be empty or full in fact)
            got = fine.at(Br, Bc).host()
            assert ((got == V.PARTIAL) | (got == direct.host())).all()
    with pytest.raises(ValueError, match="divide"):
        fine.at(12, 8)


def test_draw_block_mask(tmp_path):
    bm = V.host_block_mask(V.sliding_window(20), None, None, 100, 100, Br=16, Bc=16)
    ax = V.draw_block_mask(bm, path=tmp_path / "bm.png")
    assert (tmp_path / "bm.png").stat().st_size > 1000
    assert "full" in ax.get_title() and "empty" in ax.get_title()


# -- what is refused -------------------------------------------------------------------------


def test_bad_user_functions_are_refused_by_name():
    q, k, v = _qkv()

    def distance(b, h, q_idx, kv_idx):
        return q_idx - kv_idx

    def three(b, h, q_idx):
        return True

    def boom(b, h, q_idx, kv_idx):
        raise RuntimeError("no")

    for fn, words in ((distance, "distance returned int"), (three, "three takes 3 arguments"),
                      (boom, "boom raised RuntimeError")):
        with pytest.raises(AttentionInputError, match=words):
            na.attention(q, k, v, mask_mod=fn, phase="smem_kv", Br=16, Bc=16)
    with pytest.raises(AttentionInputError, match="aux= given without"):
        na.attention(q, k, v, aux=(np.zeros(3),))
    with pytest.raises(AttentionInputError, match="block_mask given without"):
        na.attention(q, k, v, score_mod=V.softcap(5.0), block_mask=V.host_block_mask(V.causal(), None, None, 37,
                                                                                      37))
    with pytest.raises(V.VariantError, match="cap must be"):
        V.softcap(-1)


def test_phases_without_a_variant_stage_say_so():
    import dataclasses

    from numba_attn.spec.problem import Problem

    refusing = {p.name: p.variants for p in na.list_phases() if p.is_builtin and p.variants is not True}
    assert not refusing, refusing  # every built-in phase runs variants
    # a phase registered with a reason, or without variants: supports() says so, attention() refuses with it
    problem = Problem(heads=2, q_len=37, kv_len=37, head_dim=64, variant=V.make_variant(V.sliding_window(4)))
    smem_kv = na.get_phase("smem_kv")
    assert smem_kv.supports(problem) is None
    why = dataclasses.replace(smem_kv, variants="a reason given at registration").supports(problem)
    assert why == "mask_mod/score_mod variants: a reason given at registration"
    assert "registered without variants=True" in dataclasses.replace(smem_kv, variants=False).supports(problem)


# -- every phase that runs variants, against the reference -----------------------------------------


# the built-ins whose arrays are per sequence (read at the batch index b): run on two sequences; the others read no
# sequence index (positions, per-head slopes), and one sequence runs the same code (half the simulated blocks)
PER_SEQUENCE = ("document", "prefix_lm", "pad_right", "pad_left", "document+alibi")


def builtin_variants(B, H, Nk):
    """Each built-in as attention() keywords (tests/test_variants_tc.py runs them too)."""
    doc = (np.arange(Nk)[None, :] // 11 + np.arange(B)[:, None]).astype(np.int32)
    lengths = np.array([Nk - 19, Nk][:B], np.int32)  # the first sequence's early queries see no key (left)
    return {
        "causal": dict(mask_mod=V.causal()),
        "window": dict(mask_mod=V.sliding_window(7)),
        "window_lr": dict(mask_mod=V.sliding_window(5, 3)),
        "softcap": dict(score_mod=V.softcap(2.0)),
        "alibi": dict(score_mod=V.alibi(V.alibi_slopes(H))),
        "document": dict(mask_mod=V.and_masks(V.causal(), V.document(doc))),
        "prefix_lm": dict(mask_mod=V.prefix_lm(np.array([5, 30][:B], np.int32))),
        "pad_right": dict(mask_mod=V.key_padding(lengths)),
        "pad_left": dict(mask_mod=V.key_padding(lengths, "left", kv_len=Nk)),
        "streaming": dict(mask_mod=V.streaming(6, 2)),
        "window+softcap": dict(mask_mod=V.sliding_window(9), score_mod=V.softcap(3.0)),
        "document+alibi": dict(mask_mod=V.document(doc), score_mod=V.alibi(V.alibi_slopes(H))),
    }


def _run_variant(phase, kw, causal, B=2, H=2, Hkv=1, Nq=37, Nk=45, D=16):
    ph = na.get_phase(phase)
    q, k, v = _qkv(B, H, Hkv, Nq, Nk, D, seed=hash((phase, causal)) % 1000)
    dtype = "float32" if "float32" in ph.dtypes else ph.dtypes[0]
    if dtype != "float32":
        q, k, v = (x.astype(dtype) for x in (q, k, v))
    out = na.attention(q, k, v, causal=causal, phase=phase, **ph.sim_params, **kw)
    ref = reference(q, k, v, causal=causal, variant=V.make_variant(kw.get("mask_mod"), kw.get("score_mod")))
    c = check(out, ref, dtype=dtype, precision=ph.precision)
    assert c.ok, f"{phase} {kw} causal={causal}: {c.reason}"


# the fast tier: each built-in on one phase of each family that runs variants
FAMILY_REPRESENTATIVE = {"cuda_core": "smem_kv", "wgmma": "tc_wgmma"}


@pytest.mark.parametrize("family", sorted(FAMILY_REPRESENTATIVE))
@pytest.mark.parametrize("name", sorted(builtin_variants(2, 2, 45)))
def test_each_builtin_on_a_phase_of_each_family(family, name):
    # (a tensor-core phase: one sequence, its simulator cost; two heads keep ALiBi's per-head slopes)
    _run_variant(FAMILY_REPRESENTATIVE[family], builtin_variants(2, 2, 45)[name],
                 causal=name in ("softcap", "alibi"), B=2 if family == "cuda_core" else 1)


# the prefill phases that run variants (decode phases: tests/test_decode_variants.py)
VARIANT_PHASES = sorted(p.name for p in na.list_phases()
                        if p.variants is True and p.is_builtin and p.kind == "prefill" and p.layout == "contiguous")


@pytest.mark.full
@pytest.mark.parametrize("phase", VARIANT_PHASES)
def test_every_variant_phase_runs_masks_and_score_functions(phase):
    """A window (empty, partial and full tiles, a score function) and documents (rows of tiles, a score
    function reading an array); rows that see no key: the quick tier's pad_left on smem_kv."""
    table = builtin_variants(2, 2, 29)  # 21 queries over 29 keys: two tiles of 16 each way, one of them empty
    for name, causal in (("window+softcap", True), ("document+alibi", False)):
        _run_variant(phase, table[name], causal, B=2 if name in PER_SEQUENCE else 1, Nq=21, Nk=29)


def test_a_user_function_with_its_own_arrays_changes_without_a_recompile():
    q, k, v = _qkv(B=2, Nq=20, Nk=20)

    def keep_below(b, h, q_idx, kv_idx, lengths):
        return kv_idx < lengths[b]

    info = []
    for lens in (np.array([7, 20], np.int32), np.array([13, 3], np.int32)):
        out = na.attention(q, k, v, mask_mod=keep_below, aux=(lens,), phase="smem_kv", Br=16, Bc=16)
        ref = reference(q, k, v, variant=V.make_variant(keep_below, aux=(lens,)))
        assert check(out, ref).ok
        info.append(na.api.plan_cache_info())
    # the second call's arrays reach the kernel of the first call's plan (no new plan, no new compilation)
    assert info[1]["misses"] == info[0]["misses"] and info[1]["hits"] == info[0]["hits"] + 1


def test_a_given_block_mask_is_used():
    q, k, v = _qkv(B=1, Nq=64, Nk=64)
    window = V.sliding_window(10)
    bm = V.create_block_mask(window, None, None, 64, 64, Br=16, Bc=16)
    out = na.attention(q, k, v, mask_mod=window, block_mask=bm, phase="smem_kv", Br=16, Bc=16)
    assert check(out, reference(q, k, v, variant=V.make_variant(window))).ok
    # a block mask that claims every tile is full: the mask is not applied, the answer is plain attention
    lie = V.BlockMask(np.full(bm.shape, V.FULL, np.int8), 16, 16, 64, 64)
    out = na.attention(q, k, v, mask_mod=window, block_mask=lie, phase="smem_kv", Br=16, Bc=16)
    np.testing.assert_allclose(out, reference(q, k, v), atol=1e-5)
    with pytest.raises(AttentionInputError, match="block_mask was made for"):
        na.attention(q[:, :, :32], k, v, mask_mod=window, block_mask=bm, phase="smem_kv", Br=16, Bc=16)
