"""Gradients of attention on PyTorch tensors (numba_attn.integrations.torch_op) in the simulator: the operators'
gradients against the float64 reference (spec/grad_reference.py) and torch autograd of SDPA in float64 on tiny
odd shapes (q_len != kv_len, GQA, causal bottom-right), the plain operator's gradient (lse recomputed), variants
differentiable and sinks refused for gradients, and forward + backward under torch.compile(fullgraph=True).

torch.autograd.gradcheck (finite differences, a forward per input element) is too slow in the simulator: the
gradients are compared with the float64 ones under the dtype's tolerance instead."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numba_attn.integrations.torch_op as na_op
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.grad_reference import grad_reference
from numba_attn.spec.reference import check

# a CUDA-core prefill phase that writes the log-sum-exp, with the simulator's small tiles
PHASE = ("causal_skip", {"Br": 32, "Bc": 16, "TM": 4, "TN": 4})
SHAPES = {  # (B, H, Hkv, Nq, Nk, D, causal, dtype)
    "B1H4/2-7x13-D16-causal": (1, 4, 2, 7, 13, 16, True, torch.float32),
    "B2H2/1-11x5-D32": (2, 2, 1, 11, 5, 32, False, torch.float32),
    "B1H2-9x9-D16-fp16-causal": (1, 2, 2, 9, 9, 16, True, torch.float16),
}


def inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g).to(dtype).requires_grad_()
               for shape in ((B, H, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D)))
    do = torch.randn(B, H, Nq, D, generator=g).to(dtype)
    return q, k, v, do


def float64_grads(q, k, v, do, causal, scale=None):
    return grad_reference(*(t.detach().double().numpy() for t in (q, k, v, do)), causal=causal, scale=scale)


def sdpa_grads(q, k, v, do, causal, scale=None):
    """torch autograd of SDPA in float64, the causal mask bottom-right aligned as numba-attn's."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    Nq, Nk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.arange(Nk)[None, :] <= torch.arange(Nq)[:, None] + (Nk - Nq)
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, scale=scale,
                                                           enable_gqa=k.shape[1] != q.shape[1])
    out.backward(do.double())
    return q64.grad, k64.grad, v64.grad


def assert_grads(got, want, dtype):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        w = np.asarray(w.detach() if isinstance(w, torch.Tensor) else w)
        assert tuple(g.shape) == w.shape, name
        c = check(g.detach().float().numpy(), w, dtype=str(dtype).removeprefix("torch."))
        assert c.ok, f"{name}: {c.reason}"


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_match_float64_and_sdpa(shape):
    B, H, Hkv, Nq, Nk, D, causal, dtype = SHAPES[shape]
    q, k, v, do = inputs(B, H, Hkv, Nq, Nk, D, dtype)
    out = na_op.differentiable_attention(q, k, v, causal=causal, phase=PHASE[0], **PHASE[1])
    assert out.dtype == dtype and out.requires_grad and out.grad_fn is not None
    out.backward(do)
    got = (q.grad, k.grad, v.grad)
    assert all(g.dtype == dtype for g in got) and k.grad.shape == k.shape and v.grad.shape == v.shape  # GQA
    assert_grads(got, float64_grads(q, k, v, do, causal), dtype)
    assert_grads(got, sdpa_grads(q, k, v, do, causal), dtype)


def test_scale_and_the_default_phases():
    """A scale of one's own; phase=None picks a forward phase that writes lse, the backward its default."""
    q, k, v, do = inputs(1, 2, 1, 6, 10, 8, torch.float32, seed=1)
    na_op.differentiable_attention(q, k, v, causal=True, scale=0.3).backward(do)
    assert_grads((q.grad, k.grad, v.grad), float64_grads(q, k, v, do, True, scale=0.3), torch.float32)


@pytest.mark.full
def test_plain_operator_is_differentiable_by_recomputing_lse():
    q, k, v, do = inputs(1, 2, 1, 7, 13, 16, torch.float32, seed=2)  # (GQA; the lse forward's blocks are costly)
    out = torch.ops.numba_attn.attention(q, k, v, True, None, PHASE[0])
    out.backward(do)
    assert_grads((q.grad, k.grad, v.grad), float64_grads(q, k, v, do, True), torch.float32)


def test_only_the_inputs_that_require_grad_get_one_and_lse_has_none():
    q, k, v, do = inputs(1, 2, 1, 5, 7, 16, torch.float32, seed=3)
    k, v = k.detach(), v.detach()
    out, lse = torch.ops.numba_attn.attention_lse(q, k, v, True, None, PHASE[0],
                                                  na_op.encode_params(PHASE[1]), False, "bwd_naive")
    assert not lse.requires_grad and lse.dtype == torch.float32 and lse.shape == (1, 2, 5)
    out.backward(do)
    assert k.grad is None and v.grad is None
    assert_grads((q.grad,), float64_grads(q, k, v, do, True), torch.float32)


def test_no_graph_without_gradients():
    q, k, v, _ = inputs(1, 2, 1, 5, 7, 16, torch.float32, seed=4)
    with torch.no_grad():
        out = na_op.differentiable_attention(q, k, v, phase=PHASE[0], **PHASE[1])
    assert out.grad_fn is None and not out.requires_grad


def test_underived_score_mods_are_refused_for_gradients_and_variants_run_forward_without(monkeypatch):
    from numba_attn import variants

    q, k, v, _ = inputs(1, 2, 1, 5, 7, 16, torch.float32, seed=5)
    window = variants.sliding_window(2)
    bm = variants.host_block_mask(window, None, None, 5, 7, Br=16, Bc=16)
    with pytest.raises(AttentionInputError, match="block_mask given without a mask_mod"):
        na_op.differentiable_attention(q, k, v, score_mod=variants.softcap(2.0), block_mask=bm)
    with pytest.raises(AttentionInputError, match="score_mod without its derivative"):
        na_op.differentiable_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 2.0)
    seen = []
    monkeypatch.setattr(na_op, "_attention", lambda *a, **kw: seen.append(kw) or torch.zeros_like(a[0]))
    with torch.no_grad():
        na_op.differentiable_attention(q, k, v, causal=True, mask_mod=window, Br=16)
    assert seen == [{"causal": True, "scale": None, "phase": None, "allow_tf32": False, "mask_mod": window,
                     "Br": 16}]


def test_mask_and_score_variants_are_differentiable():
    """A window, a document mask (ids through aux), softcap over a window, ALiBi (slopes through aux): the
    gradients of the float64 reference with the same functions."""
    from numba_attn import variants
    from numba_attn.variants.mods import make_variant

    q, k, v, do = inputs(1, 2, 1, 7, 13, 16, torch.float32, seed=8)  # (GQA; two heads: two ALiBi slopes)
    docs = torch.tensor([[0] * 5 + [1] * 8], dtype=torch.int32)
    slopes = torch.tensor(variants.alibi_slopes(2))
    for mask, score in ((variants.sliding_window(3), None), (variants.document(docs), None),
                        (variants.sliding_window(5), variants.softcap(1.5)), (None, variants.alibi(slopes))):
        for t in (q, k, v):
            t.grad = None
        out = na_op.differentiable_attention(q, k, v, causal=True, mask_mod=mask, score_mod=score, phase=PHASE[0],
                                             **PHASE[1])
        out.backward(do)
        host = [m.with_aux([a.numpy() for a in m.aux]) if m is not None else None for m in (mask, score)]
        want = grad_reference(*(t.detach().double().numpy() for t in (q, k, v, do)), causal=True,
                              variant=make_variant(*host))
        assert_grads((q.grad, k.grad, v.grad), want, torch.float32)


def test_a_block_mask_with_gradients():
    """A window's block mask (made from the mask function at the forward's tiles; several key tiles empty): the
    forward skips its empty tiles, the backward the empty ones of its own tiles from the mask function; the
    gradients are the float64 reference's with the window, and the same as without the block mask."""
    from numba_attn import variants
    from numba_attn.variants.mods import make_variant

    q, k, v, do = inputs(1, 2, 1, 40, 70, 16, torch.float32, seed=9)
    window = variants.sliding_window(6)
    bm = variants.host_block_mask(window, None, None, 40, 70, Br=PHASE[1]["Br"], Bc=PHASE[1]["Bc"], causal=True)
    got = []
    for block_mask in (bm, None):
        for t in (q, k, v):
            t.grad = None
        out = na_op.differentiable_attention(q, k, v, causal=True, mask_mod=window, block_mask=block_mask,
                                             phase=PHASE[0], **PHASE[1])
        out.backward(do)
        got.append((q.grad.clone(), k.grad.clone(), v.grad.clone()))
    want = grad_reference(*(t.detach().double().numpy() for t in (q, k, v, do)), causal=True,
                          variant=make_variant(window, None))
    assert_grads(got[0], want, torch.float32)
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bfloat16_gradients_are_refused_with_the_reason(monkeypatch):
    """bfloat16 gradients run on the tensor-core backward phases only (head dims from 16; the CUDA-core ones take
    float32 and float16): at D8 none takes it, and the refusal names the dtype."""
    q, k, v, do = inputs(1, 2, 1, 4, 4, 8, torch.bfloat16, seed=6)
    out = torch.zeros_like(q, requires_grad=False)
    monkeypatch.setattr(na_op, "_attention", lambda *a, **kw: (out, torch.zeros(1, 2, 4)))  # no forward needed
    y = na_op.differentiable_attention(q, k, v)
    with pytest.raises(AttentionInputError, match="bfloat16 not supported"):
        y.backward(do)


def test_params_travel_as_a_string():
    assert na_op.encode_params({}) == ""
    text = na_op.encode_params({"TN": 4, "Br": 32, "flag": True})
    assert text == "Br=32,TN=4,flag=True" and na_op.decode_params(text) == {"Br": 32, "TN": 4, "flag": True}
    with pytest.raises(AttentionInputError, match="Br=\\[16\\]"):
        na_op.encode_params({"Br": [16]})


def _compiles():
    try:
        torch.compile(lambda x: x + 1, fullgraph=True, backend="aot_eager")(torch.ones(2))
    except Exception as e:  # noqa: BLE001  (any failure: torch.compile is unavailable here)
        return str(e)
    return ""


@pytest.mark.full
@pytest.mark.skipif(bool(_compiles()), reason=f"torch.compile unavailable: {_compiles()}")
def test_forward_and_backward_under_torch_compile():
    """fullgraph=True: the operators are opaque nodes of the forward and backward graphs (aot_eager: AOTAutograd
    traces the backward through the fake implementations)."""
    def loss(q, k, v, do):
        return (na_op.differentiable_attention(q, k, v, causal=True, phase=PHASE[0], **PHASE[1]) * do).sum() * 2.0

    eager = inputs(1, 2, 1, 7, 13, 16, torch.float32, seed=7)  # (GQA)
    compiled = inputs(1, 2, 1, 7, 13, 16, torch.float32, seed=7)
    loss(*eager).backward()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*compiled).backward()
    for a, b in zip(eager[:3], compiled[:3]):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.full
def test_opcheck_of_the_gradient_operators():
    q, k, v, do = inputs(1, 2, 1, 5, 7, 16, torch.float32, seed=8)
    params = na_op.encode_params(PHASE[1])
    torch.library.opcheck(torch.ops.numba_attn.attention_lse.default, (q, k, v, True, None, PHASE[0], params),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    out, lse = torch.ops.numba_attn.attention_lse(q.detach(), k.detach(), v.detach(), True, None, PHASE[0], params)
    torch.library.opcheck(torch.ops.numba_attn.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), out, lse, do, True, None, "bwd_naive"),
                          test_utils=("test_schema", "test_faketensor"))


def test_sinks_are_differentiable():
    """Sink logits (a tensor (H,) with requires_grad) through a window: the gradients of q, k, v and the sinks
    are float64 autograd's of the same attention written out (the sink one more column of the softmax)."""
    from numba_attn import variants

    q, k, v, do = inputs(1, 2, 1, 7, 13, 16, torch.float32, seed=9)  # (GQA; the default forward's blocks are costly)
    sinks = torch.tensor([0.5, -1.0], requires_grad=True)
    out = na_op.differentiable_attention(q, k, v, causal=True, mask_mod=variants.sliding_window(4), sinks=sinks)
    out.backward(do)
    q64, k64, v64, s64 = (t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    kk, vv = k64.repeat_interleave(2, dim=1), v64.repeat_interleave(2, dim=1)
    sc = (q64 @ kk.transpose(-1, -2)) / 4.0
    i, j = torch.arange(7)[:, None] + 6, torch.arange(13)[None, :]
    sc = sc.masked_fill((j > i) | (j < i - 4), float("-inf"))
    full = torch.cat([sc, s64.view(1, 2, 1, 1).expand(1, 2, 7, 1)], dim=-1).softmax(-1)
    ref = full[..., :13] @ vv
    ref.backward(do.double())
    for t, r in ((q, q64), (k, k64), (v, v64), (sinks, s64)):
        assert torch.allclose(t.grad.double(), r.grad, rtol=1e-4, atol=1e-4), (t.grad, r.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("side_stream", [False, True], ids=["current-stream", "side-stream"])
def test_cuda_tensors_on_the_current_stream(dtype, side_stream):
    """CUDA tensors, as a model passes them: the gradients of the default phases match float64's, also when the
    inputs are made on a side stream and the call runs there (the kernels follow torch's current stream), and a
    second call on other tensors of the same shapes (bound again to their addresses) is right too."""
    dt = getattr(torch, dtype)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    for seed in (10, 11):
        with torch.cuda.stream(stream):
            q, k, v, do = (t.detach().cuda() for t in inputs(2, 4, 2, 200, 333, 64, dt, seed=seed))
            torch.cuda._sleep(20_000_000)  # the stream busy: a kernel on another stream would read too early
            q, k, v = (t * 1 for t in (q, k, v))  # (written on the busy stream)
            for t in (q, k, v):
                t.requires_grad_()
            na_op.differentiable_attention(q, k, v, causal=True).backward(do)
            got = (q.grad, k.grad, v.grad)
        stream.synchronize()
        want = float64_grads(*(t.cpu() for t in (q, k, v, do)), True)
        assert_grads(tuple(g.cpu() for g in got), want, dt)


@pytest.mark.gpu
def test_replays_on_another_thread_than_the_recording():
    """A plan's launches are recorded on the first call's thread and replayed at later calls (gpu/replay.py); autograd
    runs a backward on a thread of its own, where no CUDA context may be current. The forward with lse and the
    backward are recorded here by direct calls, then replayed through autograd (its thread) and from a new thread:
    the gradients and the output match float64's."""
    import threading

    import numba_attn
    from numba_attn.spec.reference import reference

    dt = torch.float16
    q, k, v, do = (t.detach().cuda() for t in inputs(1, 4, 2, 200, 333, 64, dt, seed=20))
    out, lse = numba_attn.attention(q, k, v, causal=True, return_lse=True)  # recorded on this thread
    numba_attn.attention_backward(q, k, v, out, lse, do, causal=True)
    for t in (q, k, v):
        t.requires_grad_()
    na_op.differentiable_attention(q, k, v, causal=True).backward(do)  # replayed on autograd's thread
    want = float64_grads(*(t.cpu() for t in (q, k, v, do)), True)
    assert_grads(tuple(t.grad.cpu() for t in (q, k, v)), want, dt)

    got = {}

    def other_thread():
        try:
            got["out"] = numba_attn.attention(q.detach(), k.detach(), v.detach(), causal=True, return_lse=True)[0]
            torch.cuda.synchronize()
        except Exception as e:  # reported below, in the test's thread
            got["error"] = e

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert "error" not in got, got.get("error")
    ref = reference(*(t.detach().double().cpu().numpy() for t in (q, k, v)), causal=True)
    c = check(got["out"].float().cpu().numpy(), ref, dtype="float16")
    assert c.ok, c.reason
