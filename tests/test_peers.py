"""The peers of other libraries, FlashAttention-4 (``fa4``, ``fa4_backward``) and FlexAttention (``torch_flex``,
``torch_flex_backward``), without a GPU: their names, their skip reasons (a missing package, torch without CUDA,
a problem they cannot run), and the translation of the project's causal mask and built-in variants into their
terms, checked against the float64 reference (FlexAttention runs eagerly on CPU tensors) and on index grids
(FlashAttention-4's window arguments). Timing them needs a GPU: ``numba-attn run --peers fa4,torch_flex ...``."""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from numba_attn import variants as V
from numba_attn.measure import other_peers as O
from numba_attn.measure import peer_rows as R
from numba_attn.measure import peers as P
from numba_attn.measure.config import RunConfig
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import reference
from numba_attn.variants.external import NoMapping, fa4_arguments, flex_functions
from numba_attn.variants.grid import HostVariant

FP16 = Problem(batch=1, heads=2, q_len=40, kv_len=56, head_dim=64, dtype="float16", causal=True)
NEW = ("fa4", "torch_flex", "fa4_backward", "torch_flex_backward")


def _user_mask(b, h, q_idx, kv_idx):
    return kv_idx % 2 == 0


def test_the_new_peers_are_known_and_named_only_on_request():
    assert set(NEW) <= set(P.known_peer_names())
    assert not set(NEW) & set(P.peer_names() + P.backward_peer_names())  # the default sets stay SDPA's
    from numba_attn.cli_args import build_parser, peers_of

    assert peers_of("fa4, torch_flex,torch_sdpa_cudnn") == ("fa4", "torch_flex", "torch_sdpa_cudnn")
    assert peers_of("fa4_backward,torch_flex_backward") == ("fa4_backward", "torch_flex_backward")
    with pytest.raises(SystemExit, match="fa4"):
        peers_of("fa5")
    args = build_parser().parse_args(["bench", "backward", "--peers", "fa4_backward,torch_sdpa_cudnn_backward"])
    assert args.peers == "fa4_backward,torch_sdpa_cudnn_backward"


@pytest.mark.parametrize("name", NEW)
def test_a_missing_package_is_a_skip_with_the_reason(name, monkeypatch):
    """No flash_attn.cute, no FlexAttention in torch, no torch: a SKIP row saying so, never an error."""
    gone = ["flash_attn", "flash_attn.cute"] if name.startswith("fa4") else ["torch.nn.attention.flex_attention"]
    for mod in gone:
        monkeypatch.setitem(sys.modules, mod, None)  # an import of it fails
    row = R.measure_peer(name, FP16, RunConfig())
    assert row["status"] == "SKIP" and row["kind"] == "peer" and row["phase"] == name, row
    assert ("flash_attn.cute" in row["reason"] and "[fa4]" in row["reason"] if name.startswith("fa4")
            else "no FlexAttention" in row["reason"]), row["reason"]
    assert row.get("phase_kind") == ("backward" if name.endswith("_backward") else None)
    assert row["flops"] == (2.5 if name.endswith("_backward") else 1) * FP16.flops()
    monkeypatch.setitem(sys.modules, "torch", None)
    row = R.measure_peer(name, FP16, RunConfig())
    assert row["status"] == "SKIP" and "torch not importable" in row["reason"], row


def test_torch_without_cuda_is_a_skip():
    if P.torch_status() is None:
        pytest.skip("torch has a GPU here: the peers run")
    pytest.importorskip("torch.nn.attention.flex_attention")
    for name in ("torch_flex", "torch_flex_backward"):
        row = R.measure_peer(name, FP16, RunConfig())
        assert row["status"] == "SKIP" and row["reason"] == P.torch_status(), row


def test_problems_flashattention4_cannot_run_are_skips():
    assert "float16 and bfloat16" in O.fa4_problem_reason(FP16.replace(dtype="float32"))
    assert "head_dim" in O.fa4_problem_reason(FP16.replace(head_dim=40))
    doc = V.make_variant(V.document(np.zeros((1, 56), np.int32)))
    assert "'document'" in O.fa4_problem_reason(FP16.replace(variant=doc))
    assert O.fa4_problem_reason(FP16) is None
    for name in ("fa4", "fa4_backward"):  # before any import
        assert "head_dim" in R.measure_peer(name, FP16.replace(head_dim=40), RunConfig())["reason"]

    class Torch:  # the GPU's compute capability
        class cuda:
            cap = (8, 0)

            @classmethod
            def get_device_capability(cls):
                return cls.cap

    assert "9.x-11.x" in O.fa4_capability_reason(Torch) and "8.0" in O.fa4_capability_reason(Torch)
    Torch.cuda.cap = (9, 0)
    assert O.fa4_capability_reason(Torch) is None
    assert "local not supported" in O.fa4_refusal(AssertionError("local not supported yet on 9.x"))
    assert O.fa4_refusal(RuntimeError("CUDA error: an illegal memory access")) is None
    assert "NYI" in O.flex_refusal(RuntimeError("NYI: head_dim 40")) and O.flex_refusal(KeyError("x")) is None


def test_flashattention4_arguments_are_read_against_its_signature():
    def old(q, k, v, softmax_scale=None, causal=False):
        pass

    def new(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0, **kw):
        pass

    window = FP16.replace(variant=V.make_variant(V.sliding_window(7)))
    assert O.fa4_kwargs(old, FP16) == {"softmax_scale": FP16.sm_scale, "causal": True}
    with pytest.raises(O.Unavailable, match="window_size"):
        O.fa4_kwargs(old, window)
    assert O.fa4_kwargs(new, window) == {"softmax_scale": FP16.sm_scale, "window_size": (7, 0)}


def _visible(problem, kw) -> np.ndarray:
    """FlashAttention's (Nq, Nk) visibility under ``kw`` (causal, window_size), aligned bottom-right."""
    nq, nk = problem.q_len, problem.kv_len
    i = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)[None, :]
    left, right = kw.get("window_size", (None, 0 if kw.get("causal") else None))
    seen = np.ones((nq, nk), bool)
    if left is not None:
        seen &= j >= i - left
    if right is not None:
        seen &= j <= i + right
    return seen


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", ["none", "window5", "window-1r3", "window4r2", "and_causal_window9"])
def test_flashattention4_windows_are_the_projects_masks(mask, causal):
    mods = {"none": None, "window5": V.sliding_window(5), "window-1r3": V.sliding_window(-1, 3),
            "window4r2": V.sliding_window(4, 2), "and_causal_window9": V.and_masks(V.causal(), V.sliding_window(9))}
    variant = V.make_variant(mods[mask], V.softcap(20.0)) if mask != "none" or causal else None
    problem = FP16.replace(causal=causal, variant=variant)
    kw = fa4_arguments(problem)
    assert kw.get("softcap") == (20.0 if variant is not None else None)
    want = np.ones((problem.q_len, problem.kv_len), bool)
    if causal:
        want &= np.arange(problem.kv_len)[None, :] <= np.arange(problem.q_len)[:, None] + 16
    if mods[mask] is not None:
        want &= HostVariant(variant).visible(0, 0, problem.q_len, problem.kv_len)
    assert (_visible(problem, kw) == want).all(), kw


B, H, HKV, NQ, NK, D = 2, 4, 2, 13, 29, 8
DOC = (np.arange(NK)[None, :] // 7 + np.array([[0], [1]])).astype(np.int32)
ALLOWED = np.random.default_rng(0).random((B, 1, NQ, NK)) < 0.6
ALLOWED[..., -1] = True
BUILTINS = {  # name: (mask_mod, score_mod, causal)
    "plain": (None, None, False),
    "causal": (None, None, True),
    "causal_builtin": (V.causal(), None, False),
    "window": (V.sliding_window(5), None, True),
    "window_both_sides": (V.sliding_window(4, 2), None, False),
    "window_right_only": (V.sliding_window(-1, 3), None, False),
    "softcap": (None, V.softcap(2.0), True),
    "alibi": (None, V.alibi(V.alibi_slopes(H)), False),
    "document": (V.document(DOC), None, False),
    "document_causal_softcap": (V.and_masks(V.causal(), V.document(DOC)), V.softcap(3.0), False),
    "prefix_lm": (V.prefix_lm(np.array([5, 20], np.int32)), None, False),
    "pad_right_empty_rows": (V.key_padding(np.array([0, 29], np.int32)), None, False),
    "pad_left": (V.key_padding(np.array([10, 29], np.int32), "left", kv_len=NK), None, True),
    "streaming": (V.streaming(6, 2), None, False),
    "dense_mask": (V.dense_mask(ALLOWED), None, False),
}


@pytest.mark.parametrize("name", list(BUILTINS))
def test_flexattention_twins_of_the_builtins_give_the_reference(name):
    """Each built-in variant's Flex mask_mod/score_mod (with the bottom-right causal mask, GQA, Nq < Nk) run by
    flex_attention eagerly on float64 CPU tensors equals the project's float64 reference, empty rows (0)
    included."""
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    mask_mod, score_mod, causal = BUILTINS[name]
    variant = V.make_variant(mask_mod, score_mod)
    p = Problem(batch=B, heads=H, kv_heads=HKV, q_len=NQ, kv_len=NK, head_dim=D, causal=causal, variant=variant)
    q, k, v = p.inputs(3)
    ref = reference(q, k, v, causal=causal, scale=p.sm_scale, variant=variant)
    mask, score, bm_b, bm_h = flex_functions(p, device="cpu")
    assert (mask is None) == (mask_mod is None and not causal) and (score is None) == (score_mod is None)
    block_mask = flex.create_block_mask(mask, bm_b, bm_h, NQ, NK, device="cpu") if mask is not None else None
    tq, tk, tv = (torch.from_numpy(np.asarray(a, np.float64)) for a in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention without torch.compile warns that it is unfused
        out = flex.flex_attention(tq, tk, tv, score_mod=score, block_mask=block_mask, scale=p.sm_scale,
                                  enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-6)


def test_a_function_of_the_users_own_has_no_twin(monkeypatch):
    p = FP16.replace(variant=V.make_variant(_user_mask))
    with pytest.raises(NoMapping, match="_user_mask"):
        flex_functions(p, device="cpu")
    with pytest.raises(NoMapping, match="_user_mask"):
        fa4_arguments(p)
    pytest.importorskip("torch.nn.attention.flex_attention")
    monkeypatch.setattr(O, "torch_status", lambda: None)  # as on a GPU: the mapping decides
    for name in ("torch_flex", "torch_flex_backward"):
        row = R.measure_peer(name, p, RunConfig())
        assert row["status"] == "SKIP" and "_user_mask" in row["reason"], row


def test_sdpa_skips_a_variant_and_names_the_peers_that_run_it():
    p = FP16.replace(variant=V.make_variant(V.sliding_window(5)))
    assert "torch_flex" in P.skip_reason(p) and "fa4_backward" in P.skip_reason(p, backward=True)
    assert R.measure_peer("torch_sdpa", p, RunConfig())["status"] == "SKIP"
