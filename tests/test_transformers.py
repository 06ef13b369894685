"""A transformers model on numba-attn phases (numba_attn.integrations.transformers).

A tiny Llama (2 layers, hidden 64, 2 query heads over 1 KV head, head_dim 16, fp32, random weights, fixed seed)
runs once with sdpa and once with numba-attn: the prompt's logits, greedy generation, a prompt appended
to a cache and a static cache agree; prompts run prefill phases and decode steps decode phases; masks
numba-attn cannot compute are refused; a training step (forward and backward) runs on the phases with
sdpa's loss and gradients. In the simulator the phases are named, with small tiles, so the
tests stay cheap and do not depend on the choice of phase=None (tested on its own without kernels).
"""
import copy
import subprocess
import sys

import pytest

import numba_attn.integrations.transformers as na_hf
from numba_attn.phases.registry import get_phase
from numba_attn.spec.errors import AttentionInputError

try:
    import torch
    import transformers
except ImportError as exc:  # the first two tests run without them
    torch = transformers = None
    MISSING = f"needs torch and transformers, the project's torch extra: pip install -e '.[torch]' ({exc})"
else:
    MISSING = ""
needs_torch = pytest.mark.skipif(torch is None, reason=MISSING)

# the same tiny tiles as the phases' sim_params: few simulated threads per block
PREFILL = ("causal_skip", {"Br": 32, "Bc": 16, "TM": 4, "TN": 4})
DECODE = ("decode_split_k_lean", {"warps": 2})
PROMPT, NEW = 9, 4


def test_importing_numba_attn_imports_neither_torch_nor_transformers():
    code = ("import sys, numba_attn, numba_attn.api, numba_attn.integrations.transformers; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_register_without_torch_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[torch\]"'):
        na_hf.register()


def tiny_config():
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        initializer_range=0.5)  # larger than the default 0.02: attention far from uniform


def tiny_model(impl):
    torch.manual_seed(0)
    # a config each: from_config writes the implementation into the config it is given
    return transformers.LlamaForCausalLM._from_config(copy.deepcopy(tiny_config()), attn_implementation=impl,
                                                      dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def models():
    na_hf.register(prefill_phase=PREFILL[0], prefill_params=PREFILL[1], decode_phase=DECODE[0],
                   decode_params=DECODE[1])
    na_hf.register("numba_attn_or_sdpa", prefill_phase=PREFILL[0], prefill_params=PREFILL[1],
                   decode_phase=DECODE[0], decode_params=DECODE[1], fallback="sdpa")
    ms = {impl: tiny_model(impl) for impl in ("sdpa", "numba_attn", "numba_attn_or_sdpa")}
    sd = ms["sdpa"].state_dict()
    assert all(torch.equal(sd[k], w) for k, w in ms["numba_attn"].state_dict().items())
    return ms


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 128, (1, PROMPT + 3), generator=torch.Generator().manual_seed(1))


@needs_torch
def test_prompt_logits_equal_sdpa_and_run_a_prefill_phase(models, prompt):
    ids = prompt[:, :PROMPT]
    with torch.no_grad(), na_hf.count_phases() as ran:
        ours = models["numba_attn"](ids).logits
    ref = models["sdpa"](ids).logits
    assert ran == {("prefill", PREFILL[0]): 2}  # one call per layer
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@needs_torch
def test_greedy_generation_equals_sdpa_with_decode_phases_for_the_steps(models, prompt):
    ids = prompt[:, :PROMPT]
    with na_hf.count_phases() as ran:
        ours = models["numba_attn"].generate(ids, max_new_tokens=NEW, do_sample=False)
    ref = models["sdpa"].generate(ids, max_new_tokens=NEW, do_sample=False)
    assert ours.tolist() == ref.tolist()
    assert ours.shape[1] == PROMPT + NEW
    # the prompt once per layer with a prefill phase, every later token once per layer with a decode phase
    assert ran == {("prefill", PREFILL[0]): 2, ("decode", DECODE[0]): 2 * (NEW - 1)}
    assert get_phase(PREFILL[0]).kind == "prefill" and get_phase(DECODE[0]).kind == "decode"


@needs_torch
def test_a_prompt_appended_to_a_cache_is_causal_bottom_right(models, prompt, monkeypatch):
    """transformers builds a mask here (3 queries after 9 cached keys): it is numba-attn's causal
    alignment, checked once per forward for all layers."""
    checked = []
    real = na_hf._check_mask
    monkeypatch.setattr(na_hf, "_check_mask", lambda *a: checked.append(real(*a)) or checked[-1])
    out = {}
    with torch.no_grad():
        for impl in ("sdpa", "numba_attn"):
            cache = transformers.DynamicCache(config=models[impl].config)
            models[impl](prompt[:, :PROMPT], past_key_values=cache, use_cache=True)
            out[impl] = models[impl](prompt[:, PROMPT:], past_key_values=cache, use_cache=True).logits
    assert checked == [(PROMPT + 3, None)]  # one check for both layers; every key kept
    torch.testing.assert_close(out["numba_attn"], out["sdpa"], rtol=1e-4, atol=1e-4)


@needs_torch
def test_static_cache_generation_cuts_the_empty_slots(models, prompt):
    ids = prompt[:, :PROMPT]
    kw = dict(max_new_tokens=3, do_sample=False, cache_implementation="static")
    with na_hf.count_phases() as ran:
        ours = models["numba_attn"].generate(ids, **kw)
    assert ours.tolist() == models["sdpa"].generate(ids, **kw).tolist()
    assert ran == {("prefill", PREFILL[0]): 2, ("decode", DECODE[0]): 4}


def padded_batch():
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # the second prompt is two tokens shorter: left padding
    return ids, mask


@needs_torch
def test_a_padding_mask_runs_as_a_variant_in_prefill(models):
    """Left padding: the prompt's mask runs as a dense_mask variant on the prefill phase (no fallback)."""
    ids, mask = padded_batch()
    with torch.no_grad():
        with na_hf.count_phases() as ran:
            ours = models["numba_attn"](ids, attention_mask=mask).logits
        ref = models["sdpa"](ids, attention_mask=mask).logits
    assert ran == {("prefill", PREFILL[0]): 2}
    real = mask.bool()  # the padded positions' logits are not compared (sdpa and the phases agree on real ones)
    torch.testing.assert_close(ours[real], ref[real], rtol=1e-4, atol=1e-4)
    # an all-ones mask is no padding: no mask reaches the attention, plain causal attention runs
    with torch.no_grad(), na_hf.count_phases() as ran:
        models["numba_attn"](ids[:1], attention_mask=torch.ones_like(ids[:1]))
    assert ran == {("prefill", PREFILL[0]): 2}


@needs_torch
def test_padded_generation_falls_back_only_where_the_phase_refuses(models):
    """Batched greedy generation of prompts of different lengths: the prompts run on the prefill phase; the
    decode steps' padding masks run the decode phase where it takes variants, sdpa otherwise (fallback)."""
    ids, mask = padded_batch()
    with torch.no_grad(), na_hf.count_phases() as ran:
        ours = models["numba_attn_or_sdpa"].generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    ref = models["sdpa"].generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    assert ours.tolist() == ref.tolist()
    assert ran[("prefill", PREFILL[0])] == 2 and ("prefill", "sdpa (fallback)") not in ran
    decode_phase = get_phase(DECODE[0])
    assert ran[("decode", DECODE[0] if decode_phase.variants else "sdpa (fallback)")] == 2 * 2


@needs_torch
def test_variants_false_refuses_a_padding_mask(models):
    na_hf.register("numba_attn_plain", prefill_phase=PREFILL[0], prefill_params=PREFILL[1], variants=False)
    fn = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["numba_attn_plain"]
    causal = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
    padded = causal.clone()
    padded[..., 0] = False  # the first key is padding
    with torch.no_grad(), pytest.raises(AttentionInputError, match="padding.*fallback='sdpa'"):
        fn(_layer(), *qkv(), padded)


def _layer():
    class Layer(torch.nn.Module):
        is_causal = True

    return Layer()


def qkv(q_len=3, kv_len=3, requires_grad=False):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(1, 4, q_len, 16, generator=g, requires_grad=requires_grad),
            torch.randn(1, 2, kv_len, 16, generator=g), torch.randn(1, 2, kv_len, 16, generator=g))


@needs_torch
def test_what_numba_attn_cannot_compute_is_refused_before_any_launch(monkeypatch):
    from numba_attn import api

    monkeypatch.setattr(api, "attention", lambda *a, **k: pytest.fail("launched"))
    na_hf.register("numba_attn_refusing")
    fn = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["numba_attn_refusing"]
    layer = _layer()
    with pytest.raises(AttentionInputError, match="dropout"):
        fn(layer, *qkv(), None, dropout=0.1)
    q, k, v = (t[..., :8].bfloat16() for t in qkv(requires_grad=True))  # bf16 at head_dim 8: no backward phase
    with pytest.raises(AttentionInputError, match="gradients the phases cannot compute"):
        fn(layer, q, k, v, None)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
    additive = torch.zeros(1, 1, 3, 3).masked_fill(~causal, float("-inf")) + 0.5  # a bias
    with torch.no_grad(), pytest.raises(AttentionInputError, match="additive bias"):
        fn(layer, *qkv(), additive)


def training_step(model, ids, labels=None, **kw):
    """Forward and ``loss.backward()`` of a language-model loss; (loss, {parameter name: its gradient})."""
    model.train()
    model.zero_grad()
    loss = model(ids, labels=ids if labels is None else labels, **kw).loss
    loss.backward()
    model.eval()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@needs_torch
def test_a_training_step_runs_on_the_phases_with_sdpas_gradients(models, prompt):
    """Forward and backward of a tiny Llama: every attention call on the prefill phase (it writes the
    log-sum-exp), none falls back; the loss and every parameter's gradient are sdpa's."""
    with na_hf.count_phases() as ran:
        loss, grads = training_step(models["numba_attn_or_sdpa"], prompt)
    want_loss, want = training_step(models["sdpa"], prompt)
    assert ran == {("prefill", PREFILL[0]): 2}  # one call per layer, no fallback
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == want.keys() and len(grads) == len(dict(models["sdpa"].named_parameters()))
    rel = {name: float((g - want[name]).norm() / want[name].norm()) for name, g in grads.items()}
    assert max(rel.values()) < 1e-4, rel  # float32 rounding: about 1e-5 at most
    assert any(float(g.abs().max()) > 0 for n, g in grads.items() if "q_proj" in n)  # attention got a gradient


@needs_torch
def test_count_phases_counts_the_backward_phases_when_asked(models, prompt):
    """count_phases(backward=True) counts the backward phase each attention call's gradient ran (one a layer);
    a block without it, open at the same time, counts the forward calls only; no hook stays after the blocks."""
    from numba_attn import backward as bwd
    from numba_attn.spec.problem import Problem

    with na_hf.count_phases() as plain, na_hf.count_phases(backward=True) as ran:
        training_step(models["numba_attn_or_sdpa"], prompt)
    cfg = models["sdpa"].config
    problem = Problem(batch=1, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                      q_len=prompt.shape[1], head_dim=cfg.head_dim, causal=True, dtype="float32")
    chosen = bwd.choose_backward(problem)[0].name
    assert ran == {("prefill", PREFILL[0]): 2, ("backward", chosen): 2}, ran
    assert get_phase(chosen).kind == "backward"
    assert plain == {("prefill", PREFILL[0]): 2}
    assert bwd.RAN_HOOKS == [] and na_hf._COUNTERS == []


@needs_torch
def test_a_mixed_precision_training_step_under_autocast(models, prompt):
    """Under fp16 autocast (fp32 weights) q, k arrive in float32 and v in float16: cast to fp16 as sdpa casts
    them, the forward and backward run on the phases in float16."""
    with torch.autocast("cpu", dtype=torch.float16), na_hf.count_phases() as ran:
        loss, grads = training_step(models["numba_attn_or_sdpa"], prompt)
    with torch.autocast("cpu", dtype=torch.float16):
        want_loss, want = training_step(models["sdpa"], prompt)
    assert ran == {("prefill", PREFILL[0]): 2}
    torch.testing.assert_close(loss, want_loss, rtol=2e-3, atol=2e-3)
    rel = {name: float((g - want[name]).norm() / want[name].norm()) for name, g in grads.items()}
    assert max(rel.values()) < 2e-2, rel


@needs_torch
def test_a_training_step_with_a_padding_mask_runs_on_the_phases(models):
    """A padded batch trains on the phases (the mask a variant in the forward and the backward, no fallback):
    sdpa's loss and gradients, the padded positions left out of the loss."""
    ids, mask = padded_batch()
    labels = ids.masked_fill(mask == 0, -100)
    with na_hf.count_phases() as ran:
        loss, grads = training_step(models["numba_attn_or_sdpa"], ids, attention_mask=mask, labels=labels)
    want_loss, want = training_step(models["sdpa"], ids, attention_mask=mask, labels=labels)
    assert ran == {("prefill", PREFILL[0]): 2}
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    rel = {name: float((g - want[name]).norm() / want[name].norm()) for name, g in grads.items()}
    assert grads.keys() == want.keys() and max(rel.values()) < 1e-4, rel


@needs_torch
def test_masks_numba_attn_computes(monkeypatch):
    """Causal (bottom-right) masks of the first L keys, boolean or additive, pass; L cuts the keys."""
    from numba_attn import api

    calls = []

    def fake(q, k, v, **kw):
        calls.append((tuple(k.shape), kw["causal"], k.is_contiguous()))
        return torch.zeros_like(q)

    monkeypatch.setattr(api, "attention", fake)
    na_hf.register("numba_attn_masks")
    fn = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["numba_attn_masks"]
    i, j = torch.arange(3)[:, None], torch.arange(8)[None, :]
    chunk = (j <= i + 2)[None, None]  # 3 queries after 2 cached keys, 3 empty slots after them
    chunk = chunk & (j < 5)
    with torch.no_grad():
        out, weights = fn(_layer(), *qkv(3, 8), chunk)
        fn(_layer(), *qkv(3, 8), torch.zeros(1, 1, 3, 8).masked_fill(~chunk, float("-inf")))
        fn(_layer(), *qkv(3, 8), None)  # a prompt in an empty static cache: cut to the prompt's keys
        fn(_layer(), *qkv(1, 8), None)  # a decode step: every key, not causal
    assert out.shape == (1, 3, 4, 16) and out.is_contiguous() and weights is None
    assert calls == [((1, 2, 5, 16), True, True), ((1, 2, 5, 16), True, True), ((1, 2, 3, 16), True, True),
                     ((1, 2, 8, 16), False, True)]


@needs_torch
def test_windows_padding_and_softcap_become_variants(monkeypatch):
    """A sliding-window mask runs dense_mask, a layer's window without a mask sliding_window, softcap the
    softcap score function; the phase is asked first (explain) and then runs them."""
    from numba_attn import api

    calls = []

    def fake(q, k, v, **kw):
        calls.append({key: kw.get(key) for key in ("causal", "mask_mod", "score_mod")})
        return torch.zeros_like(q)

    monkeypatch.setattr(api, "attention", fake)
    na_hf.register("numba_attn_variants", prefill_phase=PREFILL[0], prefill_params=PREFILL[1])
    fn = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["numba_attn_variants"]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    window = causal & torch.ones(5, 5, dtype=torch.bool).triu(-1)[None, None]  # a sliding window of 2
    layer = _layer()
    with torch.no_grad():
        fn(layer, *qkv(5, 5), window)
        fn(layer, *qkv(5, 5), None, softcap=30.0)
        layer.sliding_window = 3
        fn(layer, *qkv(5, 5), None)
    assert calls[0]["mask_mod"].name == "dense_mask" and calls[0]["score_mod"] is None
    assert calls[1]["mask_mod"] is None and calls[1]["score_mod"].params == {"cap": 30.0}
    assert calls[2]["mask_mod"].params == {"left": 2, "right": 0} and calls[2]["causal"]


@needs_torch
def test_phase_none_lets_numba_attn_choose_per_call(monkeypatch):
    from numba_attn import api

    seen = []

    def fake(q, k, v, **kw):
        seen.append(kw["phase"])
        return torch.zeros_like(q)

    monkeypatch.setattr(api, "attention", fake)
    na_hf.register("numba_attn_chosen")
    fn = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["numba_attn_chosen"]
    with torch.no_grad(), na_hf.count_phases() as ran:
        fn(_layer(), *qkv(12, 12), None)  # numba-attn runs decode phases up to 8 queries
        fn(_layer(), *qkv(1, 6), None)
    assert seen == [None, None]
    (prefill, p_name), (decode, d_name) = sorted(ran)[::-1]
    assert (prefill, decode) == ("prefill", "decode")
    assert get_phase(p_name).kind == "prefill" and get_phase(d_name).kind == "decode"


@needs_torch
def test_register_checks_its_arguments():
    with pytest.raises(AttentionInputError, match="transformers' own"):
        na_hf.register("sdpa")
    with pytest.raises(KeyError, match="causal_skip"):
        na_hf.register(prefill_phase="causal_skp")
    with pytest.raises(AttentionInputError, match="no parameter 'Brr'"):
        na_hf.register(prefill_phase="causal_skip", prefill_params={"Brr": 16})
    with pytest.raises(AttentionInputError, match="need a named decode_phase"):
        na_hf.register(decode_params={"warps": 2})
    with pytest.raises(AttentionInputError, match="fallback"):
        na_hf.register(fallback="eager")
    with pytest.raises(AttentionInputError, match="allow_tf32"):
        na_hf.register(allow_tf32="yes")


@needs_torch
@pytest.mark.gpu
def test_tiny_model_on_the_gpu_with_chosen_phases():
    """CUDA tensors, phases chosen per call. fp32, so that equal tokens are not left to fp16 ties (the
    fp16 models, with the margins where tokens depart: experiments/2026-11-22-model/)."""
    na_hf.register("numba_attn_gpu")
    ms = {}
    for impl in ("sdpa", "numba_attn_gpu"):
        torch.manual_seed(0)
        ms[impl] = transformers.LlamaForCausalLM._from_config(
            copy.deepcopy(tiny_config()), attn_implementation=impl, dtype=torch.float32).cuda().eval()
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        torch.testing.assert_close(ms["numba_attn_gpu"](ids).logits, ms["sdpa"](ids).logits, rtol=1e-3, atol=1e-3)
    with na_hf.count_phases() as ran:
        ours = ms["numba_attn_gpu"].generate(ids, max_new_tokens=8, do_sample=False)
    assert ours.tolist() == ms["sdpa"].generate(ids, max_new_tokens=8, do_sample=False).tolist()
    assert {kind for kind, _ in ran} == {"prefill", "decode"}
    assert all(get_phase(name).kind == kind for kind, name in ran)


def _tiny(kind, impl):
    """A tiny Mistral (a sliding window of 4 tokens) or Gemma-2 (soft-capping at 5, every other layer a window
    of 4) of the Llama test model's sizes."""
    sizes = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, max_position_embeddings=64, initializer_range=0.5)
    if kind == "mistral":
        config, cls = transformers.MistralConfig(sliding_window=4, **sizes), transformers.MistralForCausalLM
    else:
        config = transformers.Gemma2Config(sliding_window=4, attn_logit_softcapping=5.0, final_logit_softcapping=None,
                                           query_pre_attn_scalar=16, **sizes)
        cls = transformers.Gemma2ForCausalLM
    torch.manual_seed(0)
    return cls._from_config(config, attn_implementation=impl, dtype=torch.float32).eval()


@needs_torch
@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_windows_and_softcap_models_generate_without_fallbacks(kind, prompt):
    """Mistral's sliding window and Gemma-2's soft-capping (and its windowed layers) run as variants on the
    phases in prefill and decode: no call falls back, and greedy generation gives eager attention's tokens."""
    na_hf.register("numba_attn_variants_fallback", prefill_phase=PREFILL[0], prefill_params=PREFILL[1],
                   decode_phase=DECODE[0], decode_params=DECODE[1], fallback="sdpa")
    ours, ref = _tiny(kind, "numba_attn_variants_fallback"), _tiny(kind, "eager")
    with torch.no_grad(), na_hf.count_phases() as ran:
        got = ours.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    want = ref.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert got.tolist() == want.tolist()
    assert ("prefill", "sdpa (fallback)") not in ran and ("decode", "sdpa (fallback)") not in ran, ran
    assert ran[("prefill", PREFILL[0])] == 2 and ran[("decode", DECODE[0])] == 2 * 2, ran


@needs_torch
def test_a_gemma2_training_step_with_softcap_and_windows_runs_on_the_phases(prompt):
    """Gemma-2's soft-capping (its derivative in the backward) and windowed layers train on the phases: no call
    falls back; eager attention's loss and gradients."""
    na_hf.register("numba_attn_variants_fallback", prefill_phase=PREFILL[0], prefill_params=PREFILL[1],
                   decode_phase=DECODE[0], decode_params=DECODE[1], fallback="sdpa")
    ours, ref = _tiny("gemma2", "numba_attn_variants_fallback"), _tiny("gemma2", "eager")
    with na_hf.count_phases() as ran:
        loss, grads = training_step(ours, prompt)
    want_loss, want = training_step(ref, prompt)
    assert ran == {("prefill", PREFILL[0]): 2}, ran
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    rel = {name: float((g - want[name]).norm() / want[name].norm()) for name, g in grads.items()}
    assert grads.keys() == want.keys() and max(rel.values()) < 1e-4, rel


def _gpt_oss_config():
    """A two-layer gpt-oss (sinks in every layer, a window of 4 in alternate layers) small enough for the simulator."""
    return transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=2,
                                     num_experts_per_tok=1, sliding_window=4, max_position_embeddings=64,
                                     initializer_range=0.5)


@needs_torch
@pytest.mark.skipif(torch is None or not hasattr(transformers, "GptOssConfig"), reason="transformers without gpt-oss")
def test_gpt_oss_sinks_s_aux_generate_without_fallbacks(prompt):
    """gpt-oss's per-head sink logits (``s_aux``) run as ``attention(sinks=)`` on phases that write the
    log-sum-exp (CUDA-core ones, named here: the tensor-core and decode phases write none yet), its windowed
    layers as a variant: no call falls back, and greedy generation gives eager attention's tokens."""
    prefill = ("register_blocked", {"Br": 32, "Bc": 16, "TM": 4, "TN": 4})
    decode = ("smem_kv", {"Br": 16, "Bc": 16})
    na_hf.register("numba_attn_sinks", prefill_phase=prefill[0], prefill_params=prefill[1], decode_phase=decode[0],
                   decode_params=decode[1], fallback="sdpa")
    config = _gpt_oss_config()

    def model(impl):
        torch.manual_seed(0)
        m = transformers.GptOssForCausalLM._from_config(config, attn_implementation=impl, dtype=torch.float32).eval()
        with torch.no_grad():
            for layer in m.model.layers:  # sinks that matter (random init leaves them near 0)
                layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, config.num_attention_heads))
        return m

    ours, ref = model("numba_attn_sinks"), model("eager")
    with torch.no_grad(), na_hf.count_phases() as ran:
        got = ours.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        want = ref.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        logits_ours = ours(prompt).logits
        logits_ref = ref(prompt).logits
    assert got.tolist() == want.tolist()
    torch.testing.assert_close(logits_ours, logits_ref, atol=2e-4, rtol=2e-4)
    assert ("prefill", "sdpa (fallback)") not in ran and ("decode", "sdpa (fallback)") not in ran, ran


@needs_torch
@pytest.mark.full
@pytest.mark.skipif(torch is None or not hasattr(transformers, "GptOssConfig"), reason="transformers without gpt-oss")
def test_gpt_oss_trains_with_sinks_without_fallbacks(prompt):
    """A training step of gpt-oss (sinks in every layer, windowed layers): the loss and the gradients of the sink
    logits and of the attention weights are eager attention's; no call falls back."""
    na_hf.register("numba_attn_sinks_train", prefill_phase="register_blocked",
                   prefill_params={"Br": 32, "Bc": 16, "TM": 4, "TN": 4}, fallback="sdpa")
    config = _gpt_oss_config()

    def step(impl):
        torch.manual_seed(0)
        m = transformers.GptOssForCausalLM._from_config(config, attn_implementation=impl, dtype=torch.float32)
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, config.num_attention_heads))
        m.train()
        loss = m(prompt, labels=prompt).loss
        loss.backward()
        attn = m.model.layers[0].self_attn
        return loss.detach(), attn.sinks.grad.clone(), attn.q_proj.weight.grad.clone()

    with na_hf.count_phases() as ran:
        ours = step("numba_attn_sinks_train")
    ref = step("eager")
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert ran.get(("prefill", "register_blocked")) and ("prefill", "sdpa (fallback)") not in ran, ran


@needs_torch
def test_count_phases_names_the_phase_a_variant_call_ran():
    """phase=None picks another prefill phase for a variant (measure/policy.py VARIANT_PREFILL): the count names
    that phase, not the plain problem's."""
    from numba_attn.measure.policy import VARIANT_PREFILL
    from numba_attn.variants import sliding_window

    fn = na_hf.NumbaAttention("count_variant", (None, {}), (None, {}), False, None)
    q = torch.zeros((1, 4, 64, 16), dtype=torch.float16)
    k = torch.zeros((1, 2, 64, 16), dtype=torch.float16)
    plain = fn._chosen_phase(q, k, k, True, None)
    windowed = fn._chosen_phase(q, k, k, True, None, variant={"mask_mod": sliding_window(7)})
    assert windowed == VARIANT_PREFILL and plain != windowed
