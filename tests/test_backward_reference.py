"""The float64 reference gradients (numba_attn.spec.grad_reference) against central finite differences of
Σ O ∘ dO on tiny shapes, and against torch autograd in float64 where torch is importable."""
import numpy as np
import pytest

from numba_attn.spec.grad_reference import attention_loss, grad_reference
from numba_attn.spec.reference import reference
from numba_attn.variants.library import sliding_window
from numba_attn.variants.mods import make_variant

CASES = {  # (B, H, Hkv, Nq, Nk, D, causal)
    "plain": (1, 2, 2, 3, 5, 4, False),
    "causal-gqa": (1, 4, 2, 4, 6, 3, True),
    "long-q": (2, 2, 1, 5, 5, 2, True),
}


def _inputs(B, H, Hkv, Nq, Nk, D, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, Nq, D)), rng.standard_normal((B, Hkv, Nk, D)),
            rng.standard_normal((B, Hkv, Nk, D)), rng.standard_normal((B, H, Nq, D)))


def _finite_diff(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f()
        x[idx] = old - eps
        down = f()
        x[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_finite_differences(case):
    B, H, Hkv, Nq, Nk, D, causal = CASES[case]
    q, k, v, do = _inputs(B, H, Hkv, Nq, Nk, D)
    dq, dk, dv = grad_reference(q, k, v, do, causal=causal, scale=0.7)
    for name, x, g in (("dq", q, dq), ("dk", k, dk), ("dv", v, dv)):
        fd = _finite_diff(lambda: attention_loss(q, k, v, do, causal=causal, scale=0.7), x)
        assert np.abs(g - fd).max() < 1e-6 * max(1.0, np.abs(fd).max()), name


def test_stats_are_the_forwards_and_delta_is_rowsum():
    q, k, v, do = _inputs(1, 2, 1, 4, 7, 8, seed=3)
    g = grad_reference(q, k, v, do, causal=True)
    o, lse = reference(q, k, v, causal=True, return_lse=True)
    assert np.array_equal(g.o, o) and np.array_equal(g.lse, lse)
    assert np.allclose(g.delta, (do * o).sum(-1))


def test_a_mask_variant_and_a_row_that_sees_no_key():
    """A mask_mod hides keys like causal does; a row that sees no key has zero gradients (and gives none)."""
    q, k, v, do = _inputs(1, 2, 2, 4, 6, 4, seed=5)
    window = make_variant(sliding_window(1), None)
    g = grad_reference(q, k, v, do, variant=window)
    for name, x, gr in (("dq", q, g.dq), ("dk", k, g.dk), ("dv", v, g.dv)):
        fd = _finite_diff(lambda: attention_loss(q, k, v, do, variant=window), x)
        assert np.abs(gr - fd).max() < 1e-6 * max(1.0, np.abs(fd).max()), name

    def first_keys_hidden(b, h, q_idx, kv_idx):
        return kv_idx > 2 and q_idx != 4  # row 2 (q_idx 4) sees no key
    empty = make_variant(first_keys_hidden, None)
    g = grad_reference(q, k, v, do, variant=empty)
    assert np.all(g.dq[:, :, 2] == 0) and np.all(np.isfinite(g.dk)) and np.all(g.dk[:, :, :3] == 0)


def test_score_functions_with_their_derivative_and_without():
    """A score function's gradients by the chain rule (a float64 soft-cap over a window, the built-in ALiBi)
    against finite differences; one without a derivative is refused."""
    import math

    from numba_attn.variants.library import alibi, alibi_slopes
    from numba_attn.variants.mods import Mod

    def cap(score, b, h, q_idx, kv_idx):
        return 2.0 * math.tanh(score / 2.0)

    def cap_grad(score, b, h, q_idx, kv_idx):
        return 1.0 - math.tanh(score / 2.0) ** 2

    q, k, v, do = _inputs(1, 2, 1, 4, 6, 4, seed=7)
    for variant in (make_variant(sliding_window(2), Mod(cap, "score", derivative=cap_grad)),
                    make_variant(None, alibi(alibi_slopes(2)))):
        g = grad_reference(q, k, v, do, causal=True, variant=variant)
        for name, x, gr in (("dq", q, g.dq), ("dk", k, g.dk), ("dv", v, g.dv)):
            fd = _finite_diff(lambda: attention_loss(q, k, v, do, causal=True, variant=variant), x)
            assert np.abs(gr - fd).max() < 1e-6 * max(1.0, np.abs(fd).max()), (variant.name, name)
    with pytest.raises(ValueError, match="score_mod needs its derivative"):
        grad_reference(q, k, v, do, variant=make_variant(None, cap))


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_torch_autograd(case):
    torch = pytest.importorskip("torch")
    B, H, Hkv, Nq, Nk, D, causal = CASES[case]
    q, k, v, do = _inputs(B, H, Hkv, Nq, Nk, D, seed=1)
    G = H // Hkv
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    s = tq @ tk.repeat_interleave(G, 1).transpose(-1, -2) * 0.5
    if causal:
        hidden = torch.ones(Nq, Nk, dtype=torch.bool).triu(Nk - Nq + 1)
        s = s.masked_fill(hidden, float("-inf"))
    o = torch.softmax(s, -1) @ tv.repeat_interleave(G, 1)
    o.backward(torch.tensor(do))
    dq, dk, dv = grad_reference(q, k, v, do, causal=causal, scale=0.5)
    for name, mine, theirs in (("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad)):
        assert np.allclose(mine, theirs.numpy(), rtol=1e-10, atol=1e-12), name


@pytest.mark.parametrize("nq,nk,causal", [(21, 13, False), (13, 21, True)])
def test_the_torch_float64_gradients_are_the_same_formulas(nq, nk, causal):
    """grad_reference_torch (large problems on a GPU; here torch on the CPU) gives grad_reference's o, lse,
    Delta and gradients to 1e-12 (GQA, q_len above and below kv_len, causal)."""
    pytest.importorskip("torch")
    from numba_attn.spec.grad_reference import grad_reference_torch

    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, nq, 16)).astype(np.float16)
    k, v = (rng.standard_normal((2, 2, nk, 16)).astype(np.float16) for _ in range(2))
    do = rng.standard_normal(q.shape).astype(np.float16)
    want, got = grad_reference(q, k, v, do, causal=causal), grad_reference_torch(q, k, v, do, causal=causal,
                                                                                 device="cpu")
    for name in ("dq", "dk", "dv", "o", "lse", "delta"):
        a, b = getattr(want, name), getattr(got, name)
        assert np.abs(a - b).max() < 1e-12, name


def test_sinks_gradients_match_finite_differences():
    """With sink logits (and a window hiding every key of one row, whose output is 0 and whose sink weighs 1):
    dq, dk, dv and dsinks against finite differences of Σ O ∘ dO."""
    q, k, v, do = _inputs(1, 4, 2, 4, 6, 3, seed=2)
    sinks = np.array([0.3, -1.2, 2.0, 0.0])

    def first_keys_hidden(b, h, q_idx, kv_idx):
        return kv_idx > 2 and q_idx != 4  # row 2 (q_idx 4) sees no key
    for variant in (None, make_variant(first_keys_hidden, None)):
        g = grad_reference(q, k, v, do, causal=True, variant=variant, sinks=sinks)
        for name, x, got in (("dq", q, g.dq), ("dk", k, g.dk), ("dv", v, g.dv), ("dsinks", sinks, g.dsinks)):
            fd = _finite_diff(lambda: attention_loss(q, k, v, do, causal=True, variant=variant, sinks=sinks), x)
            assert np.abs(got - fd).max() < 1e-6 * max(1.0, np.abs(fd).max()), (name, variant)
