"""The backward family in the simulator: every backward phase against the float64 reference gradients
(spec/grad_reference.py) on odd shapes (q_len != kv_len, GQA, causal and not, head_dim 16, 32, 40 and 48; the
shapes a phase refuses, dtype or head_dim, are skipped with its reason), a known-wrong backward rejected, and
attention_backward()'s arrays and input checks."""
import json

import numpy as np
import pytest
from numba import cuda

import numba_attn as na
from numba_attn.array_kinds import is_device_array
from numba_attn.backward import attention_backward, check_backward
from numba_attn.phases.registry import list_phases, register_phase, temporary_phases
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.grad_reference import grad_reference
from numba_attn.spec.reference import check

SHAPES = {
    "B1H2/1-19x37-D16-fp32-causal": na.Problem(batch=1, heads=2, kv_heads=1, q_len=19, kv_len=37, head_dim=16,
                                               causal=True),
    "B1H2-37x21-D40-fp16": na.Problem(batch=1, heads=2, q_len=37, kv_len=21, head_dim=40, dtype="float16"),
    "B2H4/2-29x45-D16-fp16-causal": na.Problem(batch=2, heads=4, kv_heads=2, q_len=29, kv_len=45, head_dim=16,
                                               dtype="float16", causal=True),
    "B1H3/1-23x23-D40-fp32-causal": na.Problem(batch=1, heads=3, kv_heads=1, q_len=23, head_dim=40, causal=True),
    "B1H2-17x30-D16-fp32": na.Problem(batch=1, heads=2, q_len=17, kv_len=30, head_dim=16),
    # the 16-bit shapes of the tensor-core phases (head_dim a multiple of 16)
    "B1H2/1-19x37-D16-fp16-causal": na.Problem(batch=1, heads=2, kv_heads=1, q_len=19, kv_len=37, head_dim=16,
                                               dtype="float16", causal=True),
    "B1H4/2-21x37-D32-fp16-causal": na.Problem(batch=1, heads=4, kv_heads=2, q_len=21, kv_len=37, head_dim=32,
                                               dtype="float16", causal=True),
    "B1H3/1-23x40-D48-bf16": na.Problem(batch=1, heads=3, kv_heads=1, q_len=23, kv_len=40, head_dim=48,
                                        dtype="bfloat16"),
    "B1H2-17x33-D16-bf16-causal": na.Problem(batch=1, heads=2, q_len=17, kv_len=33, head_dim=16, dtype="bfloat16",
                                             causal=True),
    "B1H2-37x21-D32-fp16": na.Problem(batch=1, heads=2, q_len=37, kv_len=21, head_dim=32, dtype="float16"),
    # the wgmma phase's head dims (64, 128): a partial 64-key block, more query rows than one block
    "B1H2/1-19x37-D64-fp16-causal": na.Problem(batch=1, heads=2, kv_heads=1, q_len=19, kv_len=37, head_dim=64,
                                               dtype="float16", causal=True),
    "B1H2-70x45-D128-bf16": na.Problem(batch=1, heads=2, q_len=70, kv_len=45, head_dim=128, dtype="bfloat16"),
}
QUICK = "B1H2/1-19x37-D16-fp32-causal"
QUICK_16BIT = "B1H2/1-19x37-D16-fp16-causal"  # the quick shape of a phase that refuses float32
PHASES = list_phases("backward")


QUICK_D64 = "B1H2/1-19x37-D64-fp16-causal"  # of a phase whose head dims start at 64


def _quick(phase) -> str:
    if phase.head_dims and 16 not in phase.head_dims:
        return QUICK_D64
    return QUICK if "float32" in phase.dtypes else QUICK_16BIT


# bwd_naive (five kernels, a thread per element: the slowest in the simulator) on three of the shapes
NAIVE_SHAPES = ("B1H2/1-19x37-D16-fp32-causal", "B1H2-37x21-D40-fp16", "B1H3/1-23x23-D40-fp32-causal")
WIDE_SHAPES = ("B1H2/1-19x37-D64-fp16-causal", "B1H2-70x45-D128-bf16")  # (the wgmma phases' own: D >= 64 is
# costly for the others in the simulator, whose smaller head dims cover the same code)
CASES = [pytest.param(p, s, id=f"{p.name}-{s}", marks=() if s == _quick(p) else pytest.mark.full)
         for p in PHASES for s in SHAPES if (p.name != "bwd_naive" or s in NAIVE_SHAPES)
         and (s not in WIDE_SHAPES or (p.head_dims and 16 not in p.head_dims))]


def test_the_family_is_registered_apart_from_the_forward_phases():
    names = [p.name for p in PHASES]
    assert names[:3] == ["bwd_naive", "bwd_two_kernels", "bwd_mma"] and all(p.kind == "backward" for p in PHASES)
    assert not set(names) & {p.name for p in list_phases()}  # the forward consumers never see them
    assert set(names) <= {p.name for p in list_phases("all")} and na.get_phase("bwd_naive").parent is None


@pytest.mark.parametrize("phase,shape", CASES)
def test_backward_phase_matches_reference(phase, shape):
    reason = phase.supports(SHAPES[shape], **phase.resolve_params(phase.sim_params))
    if reason:
        assert shape != _quick(phase), f"{phase.name} refuses its quick shape: {reason}"
        pytest.skip(f"{phase.name}: {reason}")
    row = check_backward(phase.name, SHAPES[shape], **phase.sim_params)
    assert row["status"] == "OK", f"{phase.name} on {SHAPES[shape].label}: {row['status']}: {row['reason']}"


@pytest.mark.full
@pytest.mark.parametrize("shape", WIDE_SHAPES)
def test_bwd_wgmma_ss_adds_dq_by_bulk_reductions(shape):
    """bwd_wgmma_ss with dq="bulk" (the default adds dQ's partials from the registers): staged in shared memory,
    one bulk reduction a tile; GQA and causal at D64, bf16 at D128."""
    row = check_backward("bwd_wgmma_ss", SHAPES[shape], Bc=128, stages=3, dq="bulk")
    assert row["status"] == "OK", f"{SHAPES[shape].label}: {row['status']}: {row['reason']}"
    assert "dq=" in na.get_phase("bwd_wgmma_ss").supports(SHAPES[shape], Bc=128, stages=3, dq="atomic")


@pytest.mark.full
@pytest.mark.parametrize("name", ["B1H2/1-19x37-D64-fp16-causal", "B1H2-70x45-D128-bf16"])
def test_bwd_wgmma_ss_takes_dv_dk_operands_from_registers(name):
    """bwd_wgmma_ss with rs=True: dV's and dK's A from the packed P and dS registers (GQA, causal, D64; D128 bf16,
    several key blocks)."""
    shape = SHAPES[name]
    row = check_backward("bwd_wgmma_ss", shape, Bc=128, stages=3, rs=True)
    assert row["status"] == "OK", f"{shape.label}: {row['status']}: {row['reason']}"


@pytest.mark.full
def test_bwd_wgmma_kvreg_holds_k_and_v_in_registers():
    """bwd_wgmma_kvreg: Sᵀ's and dPᵀ's A (K_j, V_j) loaded once into registers; bf16, two key blocks (the second
    partial) and a partial last Q tile, non-causal; D128 refused by name (the fragments would not fit)."""
    shape = na.Problem(batch=1, heads=2, q_len=70, kv_len=140, head_dim=64, dtype="bfloat16")
    row = check_backward("bwd_wgmma_kvreg", shape, Bc=128, stages=3)
    assert row["status"] == "OK", f"{shape.label}: {row['status']}: {row['reason']}"
    reason = na.get_phase("bwd_wgmma_kvreg").supports(SHAPES["B1H2-70x45-D128-bf16"], Bc=128, stages=3)
    assert reason and "head_dim 128" in reason, reason


@pytest.mark.full
def test_default_tiles_run_in_simulator():
    """The default (GPU) tiles, not only the simulator's: several key tiles and a partial last one."""
    prob = na.Problem(batch=1, heads=2, kv_heads=1, q_len=35, kv_len=70, head_dim=8, causal=True)
    # the tensor-core phases' shape: one head (their GQA is the simulator tiles' shapes'), 64x64 tiles are costly
    prob16 = prob.replace(heads=1, q_len=70, kv_len=93, head_dim=16, dtype="float16")
    for phase in (p for p in PHASES if p.params):  # (bwd_naive has no tiles: its simulator run is its default)
        wide = phase.head_dims and 16 not in phase.head_dims  # (bwd_wgmma: D = 64, 128)
        p16 = prob16.replace(head_dim=min(phase.head_dims)) if wide else prob16
        row = check_backward(phase.name, prob if "float32" in phase.dtypes else p16)
        assert row["status"] == "OK", f"{phase.name}: {row['reason']}"


def test_bwd_mma_tiles_follow_the_head_dim():
    """Br=Bc=0: 64x64 tiles up to D=64 (the faster ones measured there), 32x32 above; given tiles win."""
    ph = na.get_phase("bwd_mma")
    d64 = na.Problem(batch=1, heads=2, q_len=64, kv_len=64, head_dim=64, dtype="float16")
    assert ph.resolve(d64) == {"Br": 64, "Bc": 64}
    assert ph.resolve(d64.replace(head_dim=128)) == {"Br": 32, "Bc": 32}
    assert ph.resolve(d64, {"Br": 16}) == {"Br": 16, "Bc": 64}
    assert ph.supports(d64.replace(head_dim=128), Br=64, Bc=64) is not None  # over 48 KiB of static smem


def _no_delta(problem):
    """bwd_naive with dS = P ∘ dP: the Delta term left out (Delta never computed, read as zeros)."""
    from numba_attn.phases.backward.b00_bwd_naive import ROWS_PER_BLOCK, TILE_X, TILE_Y, grids, make_kernels
    from numba_attn.phases.backward.common import backward_launch

    B, H, Nq, Nk, G = problem.batch, problem.heads, problem.q_len, problem.kv_len, problem.group
    probs, _, scores_grad, grad_q, grad_kv = make_kernels(problem.head_dim, problem.causal)
    p, ds = (cuda.device_array((B * H, Nq, Nk), dtype="float32") for _ in range(2))
    dl = cuda.to_device(np.zeros((B * H, Nq), np.float32))
    g_s, g_q, g_kv, _ = grids(problem)
    scale = np.float32(problem.sm_scale)
    assert ROWS_PER_BLOCK

    def run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=()):
        probs[g_s, (TILE_X, TILE_Y), stream](q, k, v, do, lse, p, ds, p, scale, H, G, Nq, Nk, mods)
        scores_grad[g_s, (TILE_X, TILE_Y), stream](p, ds, p, dl, Nq, Nk)
        grad_q[g_q, (TILE_X, TILE_Y), stream](ds, k, dq, scale, H, G, Nq, Nk)
        grad_kv[g_kv, (TILE_X, TILE_Y), stream](p, ds, q, do, dk, dv, scale, H, G, Nq, Nk)

    return backward_launch("bwd_no_delta", run, [probs])


def test_atomic_dq_starts_every_call_from_zero():
    """bwd_atomic_dq's float32 dQ accumulator is zeroed after each call: a second call of the same plan gives
    the first call's dq, not twice it."""
    prob = SHAPES[QUICK]
    q, k, v = prob.inputs(3)
    do = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    ref = grad_reference(q, k, v, do, causal=True)
    o, lse = ref.o.astype(np.float32), ref.lse.astype(np.float32)
    first, second = (attention_backward(q, k, v, o, lse, do, causal=True, phase="bwd_atomic_dq", Br=16, Bc=16)[0]
                     for _ in range(2))
    np.testing.assert_allclose(second, first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first, ref.dq, rtol=1e-3, atol=1e-4)


def test_a_backward_without_delta_is_rejected():
    with temporary_phases():
        register_phase(name="bwd_no_delta", order=199, title="wrong: dS without Delta", parent="bwd_naive",
                       description="dS = P ∘ dP", lineage="a deliberate bug", planned_speedup=None,
                       kind="backward")(_no_delta)
        row = check_backward("bwd_no_delta", SHAPES[QUICK])
        assert row["status"] == "FAIL" and "dq" in row["reason"] and "dk" in row["reason"], row
        assert "dv" not in row["reason"]  # dV = Pᵀ dO needs no Delta
    assert "bwd_no_delta" not in {p.name for p in list_phases("all")}


def _inputs(problem, seed=3):
    q, k, v = problem.inputs(seed)
    do = np.random.default_rng(seed).standard_normal(q.shape).astype(q.dtype)
    ref = grad_reference(q, k, v, do, causal=problem.causal)
    return q, k, v, ref.o.astype(q.dtype), ref.lse.astype(np.float32), do, ref


SMALL = na.Problem(batch=1, heads=2, kv_heads=1, q_len=9, kv_len=13, head_dim=8, causal=True)


def test_numpy_device_and_torch_arrays_give_one_answer():
    q, k, v, o, lse, do, ref = _inputs(SMALL)
    host = attention_backward(q, k, v, o, lse, do, causal=True, phase="bwd_naive")
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float32 for g in host)
    for g, want in zip(host, ref):
        assert na.check(g, want).ok
    dev = attention_backward(*(cuda.to_device(a) for a in (q, k, v, o, lse, do)), causal=True)  # phase=None
    assert all(is_device_array(g) for g in dev)
    for g, h in zip(dev, host):
        assert np.allclose(g.copy_to_host(), h, atol=1e-5)
    torch = pytest.importorskip("torch")
    tens = attention_backward(*(torch.from_numpy(a) for a in (q, k, v, o, lse, do)), causal=True,
                              phase="bwd_two_kernels", Br=16, Bc=16)
    assert all(isinstance(g, torch.Tensor) for g in tens) and tuple(tens[1].shape) == k.shape
    for g, h in zip(tens, host):
        assert np.allclose(g.numpy(), h, atol=1e-5)


def test_bad_inputs_are_refused_naming_the_argument():
    q, k, v, o, lse, do, _ = _inputs(SMALL)
    cases = [
        ((q, k, v, o, lse[:, :, :-1], do), {}, "lse has shape"),
        ((q, k, v, o, lse.astype(np.float64), do), {}, "lse has dtype float64"),
        ((q, k, v, o.astype(np.float16), lse, do), {}, "o has dtype float16"),
        ((q, k, v, o, lse, do[:, :1]), {}, "do has shape"),
        ((q, k[:, :, :, :4], v, o, lse, do), {}, "k and v must have the same shape"),
        ((q, k, v, o, cuda.to_device(lse), do), {}, "lse is a numba device array but q is a NumPy array"),
        ((q, k, v, o, lse, do), {"phase": "smem_kv"}, "forward"),
        ((q, k, v, o, lse, do), {"phase": "bwd_naive", "Br": 16}, "no parameter 'Br'"),
        ((q, k, v, o, lse, do), {"causal": "yes"}, "causal"),
    ]
    for args, kw, match in cases:
        kw = {"causal": True, **kw}
        with pytest.raises(AttentionInputError, match=match):
            attention_backward(*args, **kw)


def _mask_variants():
    """Mask variants that hide keys inside the causal bound (a window, documents with ids through aux) and score
    variants with their derivatives (softcap over a window, ALiBi with slopes through aux)."""
    from numba_attn.variants.library import alibi, alibi_slopes, document, sliding_window, softcap
    from numba_attn.variants.mods import make_variant

    docs = np.repeat(np.arange(8, dtype=np.int32), 6)[None, :45]  # (batch, kv_len): 6-token docs
    return {"window5": make_variant(sliding_window(5), None), "document": make_variant(document(docs), None),
            "window9+softcap": make_variant(sliding_window(9), softcap(1.5)),
            "alibi": make_variant(None, alibi(alibi_slopes(4)))}


MASKED = "B2H4/2-29x45-D16-fp16-causal"
VARIANT_PROBLEM = SHAPES[MASKED].replace(batch=1)  # (the batch index is the plain shapes' to check)
QUICK_VARIANT = ("bwd_mma", "window9+softcap")  # the quick tier's: a mask and a score function


@pytest.mark.parametrize("phase,variant", [
    pytest.param(p, v, id=f"{p.name}-{v}", marks=() if (p.name, v) == QUICK_VARIANT else pytest.mark.full)
    for p in PHASES for v in ("window5", "document", "window9+softcap", "alibi")
    if p.variants is True and not (p.head_dims and 16 not in p.head_dims)  # (the wgmma steps': below)
    and (p.name in ("bwd_two_kernels", "bwd_mma") or v == "window9+softcap")])
def test_variants_match_the_reference(phase, variant):
    """A variant in the backward: the reference's gradients (its forward's lse and P with the same functions,
    a score function's derivative in dS)."""
    prob = VARIANT_PROBLEM.replace(variant=_mask_variants()[variant])
    row = check_backward(phase.name, prob, **phase.sim_params)
    assert row["status"] == "OK", f"{phase.name} {variant}: {row['status']}: {row['reason']}"


WGMMA_VARIANT_PROBLEM = na.Problem(batch=1, heads=4, kv_heads=2, q_len=40, kv_len=45, head_dim=64, dtype="float16",
                                   causal=True)  # (the documents' ids: one batch of 45 keys)


@pytest.mark.parametrize("phase,variant", [
    pytest.param(p, v, id=f"{p.name}-{v}", marks=pytest.mark.full)  # (~30 s each; the quick tier runs bwd_mma's)
    for p in PHASES if p.head_dims and 16 not in p.head_dims for v in ("window5", "document", "window9+softcap",
                                                                         "alibi")
    if p.name == "bwd_wgmma" or v == "window9+softcap"])  # (the overlap phase: the same stages, another schedule)
def test_wgmma_backward_runs_variants(phase, variant):
    """The wgmma steps with a variant: a mask function's EMPTY tiles skipped in both walks (dK/dV over Q tiles by
    the block mask's column lists, dQ over key tiles), the function on PARTIAL ones; a score function and its
    derivative on every score; GQA, causal, 16-row tiles over 40 x 45."""
    prob = WGMMA_VARIANT_PROBLEM.replace(variant=_mask_variants()[variant])
    row = check_backward(phase.name, prob, **phase.sim_params)
    assert row["status"] == "OK", f"{phase.name} {variant}: {row['status']}: {row['reason']}"


@pytest.mark.full
def test_a_mask_reused_across_calls_keeps_its_plan_and_block_mask(monkeypatch):
    """attention_backward makes a new variant at every call: its plan is kept by the functions, not rebuilt per
    call, and with it the block mask, for a mask with arrays while their content stays the same; another mask
    function, or other arrays, get their own."""
    from collections import OrderedDict

    import numba_attn.backward as backward_module
    from numba_attn.variants import launching
    from numba_attn.variants.library import sliding_window

    monkeypatch.setattr(backward_module, "_PLANS", OrderedDict())  # (no plan of an earlier test in this process)
    made = []
    original = launching.KernelMods.block_mask
    monkeypatch.setattr(launching.KernelMods, "block_mask", lambda self, *a, **k: made.append(1) or original(self, *a, **k))
    prob = VARIANT_PROBLEM
    q, k, v = prob.inputs(1)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
    window = sliding_window(5)
    ref = grad_reference(q, k, v, do, causal=True, variant=_mask_variants()["window5"])
    grads = [attention_backward(q, k, v, ref.o.astype(np.float16), ref.lse.astype(np.float32), do, causal=True,
                                phase="bwd_mma", mask_mod=window, Br=16, Bc=16) for _ in range(2)]
    assert len(made) == 1, made
    np.testing.assert_array_equal(grads[1][0], grads[0][0])
    attention_backward(q, k, v, ref.o.astype(np.float16), ref.lse.astype(np.float32), do, causal=True,
                       phase="bwd_mma", mask_mod=sliding_window(9), Br=16, Bc=16)
    assert len(made) == 2, made
    # a mask with arrays: its block mask kept while the arrays' content is the same, made again when it changes
    from numba_attn.variants.library import document

    docs = np.repeat(np.arange(8, dtype=np.int32), 6)[None, :45]
    for ids in (docs, docs.copy(), docs // 2):
        attention_backward(q, k, v, ref.o.astype(np.float16), ref.lse.astype(np.float32), do, causal=True,
                           phase="bwd_mma", mask_mod=document(ids), Br=16, Bc=16)
    assert len(made) == 4, made


def test_the_wgmma_steps_refuse_a_score_function_without_its_derivative():
    from numba_attn.variants.mods import make_variant

    def double(score, b, h, q_idx, kv_idx):
        return score * 2.0

    prob = SHAPES[QUICK_D64].replace(variant=make_variant(None, double))
    for name in ("bwd_wgmma", "bwd_wgmma_overlap", "bwd_wgmma_fused", "bwd_wgmma_ss", "bwd_wgmma_kvreg"):
        phase = na.get_phase(name)
        reason = phase.supports(prob, **phase.resolve_params(phase.sim_params))
        assert reason and "score_mod without its derivative" in reason, reason


def _masked_case(name):
    """(q, k, v, o, lse, do, reference gradients, variant) of variant ``name`` on the variants' shape."""
    prob = VARIANT_PROBLEM.replace(variant=_mask_variants()[name])
    q, k, v = prob.inputs(1)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
    ref = grad_reference(q, k, v, do, causal=True, variant=prob.variant)
    return q, k, v, ref.o.astype(np.float16), ref.lse.astype(np.float32), do, ref, prob.variant


@pytest.mark.full
def test_a_backward_that_ignores_the_mask_is_rejected():
    """Gradients of the unmasked problem given the masked forward's o and lse: far off the masked reference."""
    q, k, v, o, lse, do, ref, _ = _masked_case("window5")
    dq = attention_backward(q, k, v, o, lse, do, causal=True, phase="bwd_mma", Br=16, Bc=16)[0]
    assert np.abs(dq - ref.dq).max() > 0.1


@pytest.mark.full
def test_a_backward_without_the_score_derivative_is_rejected():
    """softcap's gradients with its derivative replaced by 1 (dS without the chain rule): off the reference."""
    q, k, v, o, lse, do, ref, variant = _masked_case("window9+softcap")
    dq = attention_backward(q, k, v, o, lse, do, causal=True, phase="bwd_mma", Br=16, Bc=16, mask_mod=variant.mask,
                            score_mod=variant.score, score_mod_grad=lambda s, b, h, qi, ki: 1.0)[0]
    assert np.abs(dq - ref.dq).max() > 0.1


def test_score_mods_without_a_derivative_are_refused_with_the_reason():
    from numba_attn.variants.mods import make_variant

    def double(score, b, h, q_idx, kv_idx):
        return score * 2.0

    prob = SMALL.replace(variant=make_variant(None, double))
    for phase in (p for p in PHASES if p.variants is True and not (p.head_dims and 16 not in p.head_dims)):
        if "float32" not in phase.dtypes:  # a 16-bit phase: the variant, not the dtype, is what it refuses
            prob = prob.replace(dtype="float16", head_dim=16)
        reason = phase.supports(prob, **phase.sim_params)
        assert reason and "score_mod without its derivative" in reason
    q = np.zeros((1, 2, 5, 8), np.float32)
    lse = np.zeros((1, 2, 5), np.float32)
    with pytest.raises(AttentionInputError, match="score_mod without its derivative"):
        attention_backward(q, q, q, q, lse, q, score_mod=double)
    with pytest.raises(AttentionInputError, match="score_mod_grad given without a score_mod"):
        attention_backward(q, q, q, q, lse, q, score_mod_grad=double)


def test_forward_calls_of_a_backward_launch_are_refused():
    launch = na.get_phase("bwd_naive").plan(SMALL)
    q = np.zeros(1)
    with pytest.raises(AttentionInputError, match="attention_backward"):
        launch(q, q, q, q, 0)


def test_an_empty_batch_gives_zero_gradients():
    q = np.zeros((0, 2, 5, 8), np.float32)
    k = np.zeros((0, 2, 7, 8), np.float32)
    dq, dk, dv = attention_backward(q, k, k, q, np.zeros((0, 2, 5), np.float32), q)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape


def test_a_backward_row_with_an_unwritten_gradient_fails(monkeypatch):
    """The runner's backward row poisons dq, dk, dv: a launch that leaves dq unwritten (it writes into a scratch
    buffer instead) is FAIL, naming dq, and never timed."""
    import numba_attn.phases.backward.common as B
    from numba_attn.measure.row import measure

    real = B.run_backward_launch

    def loses_dq(launch, inputs, grads, stream=0, mods=()):
        real(launch, inputs, [cuda.device_array_like(grads[0]), grads[1], grads[2]], stream, mods)

    monkeypatch.setattr(B, "run_backward_launch", loses_dq)
    row = measure("bwd_two_kernels", SHAPES["B1H2-17x30-D16-fp32"])
    assert row["status"] == "FAIL" and "dq" in row["reason"] and "dk" not in row["reason"], row["reason"]
    assert "time_ms" not in row


def test_the_backward_peer_row():
    """SDPA's backward as a peer of the backward rows: on a GPU checked against the float64 gradients and timed;
    where torch has no GPU a SKIP row saying so."""
    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.peer_rows import measure_peer

    row = measure_peer("torch_sdpa_backward", SHAPES["B1H2-37x21-D40-fp16"], RunConfig())
    assert row["phase_kind"] == "backward" and row["flops"] == 2.5 * SHAPES["B1H2-37x21-D40-fp16"].flops()
    if IS_SIMULATOR:
        assert row["status"] == "SKIP" and ("torch" in row["reason"] or "CUDA" in row["reason"]), row
    else:
        assert row["status"] == "OK" and row["time_ms"] > 0 and set(row["rel_err"]) == {"dq", "dk", "dv"}, row


def test_the_commands_list_run_and_refuse_backward_phases(tmp_path, capsys):
    """``list`` shows them, ``run --phases`` checks them (not mixed with forward phases), ``new`` and ``tune``
    refuse them with the reason."""
    from numba_attn import cli
    from numba_attn.measure.tune import tune
    from numba_attn.userphases import NewPhaseError, new_phase

    assert cli.main(["list"]) == 0 and "bwd_two_kernels" in capsys.readouterr().out
    res = tmp_path / "bwd.jsonl"
    assert cli.main(["run", "--phases", "bwd_naive", "-N", "9", "--kv-len", "13", "-D", "8", "--causal",
                     "--results", str(res), "--workers", "1", "--timeout", "0"]) == 0
    out = capsys.readouterr().out
    assert "bwd_naive" in out and "float64 gradients" in out
    row = [r for r in map(json.loads, res.read_text().splitlines()) if r["type"] == "result"][0]
    assert row["status"] == "OK" and row["phase_kind"] == "backward" and set(row["rel_err"]) == {"dq", "dk", "dv"}
    assert row["flops"] == 2.5 * na.Problem.from_dict(row["problem"]).flops()
    assert cli.main(["run", "--phases", "bwd_naive,smem_kv", "-N", "9", "-D", "8"]) == 2
    with pytest.raises(NewPhaseError, match="backward phase"):
        new_phase("my_bwd", from_="bwd_naive", dir=str(tmp_path))
    with pytest.raises(ValueError, match="not tuned yet"):
        tune(["bwd_naive"], [SMALL])


@pytest.mark.full
def test_bwd_mma_skips_the_tiles_a_mask_leaves_empty():
    """bwd_mma reads the block mask at its (Br, Bc) tiles: with a window of 8 over 96 keys (16 × 16 tiles) both
    kernels skip the empty tiles (11 of the causal problem's 21 tile pairs visited; without skipping both read
    the same), so they read under 3/4 of its global bytes (the Delta kernel and each block's own tiles are
    read either way), and the gradients are the reference's."""
    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.simcount import counting
    from numba_attn.variants.library import sliding_window
    from numba_attn.variants.mods import make_variant

    if not IS_SIMULATOR:
        pytest.skip("counts the simulator's global loads")
    base = na.Problem(batch=1, heads=1, q_len=96, kv_len=96, head_dim=16, dtype="float16", causal=True)
    read = {}
    for name, prob in (("causal", base), ("window", base.replace(variant=make_variant(sliding_window(8), None)))):
        with counting() as counts:
            row = check_backward("bwd_mma", prob, Br=16, Bc=16)
        assert row["status"] == "OK", row["reason"]
        read[name] = counts["sim_gmem_read_bytes"]
    assert read["window"] < 0.75 * read["causal"], read


@pytest.mark.full
def test_bwd_mma_with_a_block_mask_compiles_for_the_gpu_without_spills():
    """bwd_mma's kernels with a document mask (int32 ids beside the block mask's int8 kinds and int32 lists in
    ``mods``) and with a window and ALiBi type, compile for sm_90a and assemble without spills."""
    from offline_compile import offline_json

    res = offline_json("""
import json, numpy as np
import numba_attn.measure.offline as off
from numba_attn import Problem
from numba_attn import variants as V
docs = np.repeat(np.arange(20, dtype=np.int32), 64)[None, :1024]
res = {}
for name, mask, score in (("document", V.document(docs), None),
                          ("window+alibi", V.sliding_window(100), V.alibi(V.alibi_slopes(4)))):
    p = Problem(batch=1, heads=4, kv_heads=2, q_len=1024, kv_len=1024, head_dim=64, dtype="float16", causal=True,
                variant=V.make_variant(mask, score))
    res[name] = [(r.get("kernel"), r.get("regs"), r.get("spill_stores", 0)) for r in off.compile_phase("bwd_mma", p)]
print("JSON" + json.dumps(res))
""")
    for name, recs in res.items():
        kernels = {k: (regs, spills) for k, regs, spills in recs}
        assert {"grad_kv", "grad_q"} <= set(kernels), (name, recs)
        assert all(regs and not spills for regs, spills in kernels.values()), (name, recs)


@pytest.mark.parametrize("phase", ["bwd_mma", pytest.param("bwd_two_kernels", marks=pytest.mark.full)])
def test_sinks_gradients(phase):
    """attention_backward(..., sinks=) on the forward's output with sinks and its keys' lse: dq, dk, dv and the
    sinks' gradient (fourth) against the float64 reference, on NumPy arrays and on CPU tensors."""
    prob = SHAPES["B2H4/2-29x45-D16-fp16-causal"].replace(heads=2, kv_heads=1)  # two batches and GQA, run twice
    q, k, v = prob.inputs(1)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
    sinks = np.array([0.5, -1.0], np.float32)
    ref = grad_reference(q, k, v, do, causal=True, sinks=sinks)
    o, lse = ref.o.astype(np.float16), ref.lse.astype(np.float32)
    params = na.get_phase(phase).sim_params
    got = attention_backward(q, k, v, o, lse, do, causal=True, phase=phase, sinks=sinks, **params)
    assert len(got) == 4
    for name, x, want in zip(("dq", "dk", "dv"), got, ref):
        assert check(x, want, dtype="float16").ok, name
    assert np.allclose(got[3], ref.dsinks, rtol=1e-3, atol=1e-3), (got[3], ref.dsinks)
    torch = pytest.importorskip("torch")
    t = [torch.from_numpy(a) for a in (q, k, v, o, lse, do)]
    tgot = attention_backward(*t, causal=True, phase=phase, sinks=torch.from_numpy(sinks), **params)
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(tgot, got))
    with pytest.raises(AttentionInputError, match="sinks"):
        attention_backward(*(cuda.to_device(a) for a in (q, k, v, o, lse, do)), causal=True, phase=phase,
                           sinks=sinks, **params)


def test_deterministic_leaves_out_the_phases_that_sum_dq_in_no_fixed_order():
    """phase=None picks bwd_wgmma_kvreg at D64 and the one-kernel bwd_wgmma_ss (its parent) at D128, both summing dQ
    by reductions, where they run; deterministic=True
    (or torch's deterministic mode) picks the reproducible split instead and refuses a non-deterministic phase by
    name; a non-bool is refused naming the argument."""
    from numba_attn.backward import NONDETERMINISTIC, choose_backward, deterministic_arg

    prob = SHAPES[QUICK_D64]
    assert choose_backward(prob)[0].name == "bwd_wgmma_kvreg"
    assert choose_backward(prob.replace(head_dim=128))[0].name == "bwd_wgmma_ss"
    assert choose_backward(prob, deterministic=True)[0].name == "bwd_wgmma_overlap"
    for name in NONDETERMINISTIC:
        with pytest.raises(AttentionInputError, match="deterministic"):
            choose_backward(prob, name, deterministic=True)
    q, k, v = prob.inputs(1)
    with pytest.raises(AttentionInputError, match="deterministic"):
        attention_backward(q, k, v, q, np.zeros(q.shape[:3], np.float32), q, causal=True, deterministic="yes")
    torch = pytest.importorskip("torch")
    assert deterministic_arg(None) is False
    torch.use_deterministic_algorithms(True)
    try:
        assert deterministic_arg(None) is True
    finally:
        torch.use_deterministic_algorithms(False)
