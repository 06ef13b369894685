"""Five model rows of the variants issue on a GPU: how many attention calls run on numba-attn phases, and
whether greedy tokens equal the reference implementation's.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-variants-peers/models.py --out models.json
    NUMBA_ATTN_BACKEND=simulator python3 experiments/2026-11-27-variants-peers/models.py --smoke --out /tmp/m.json

Random-init models (fixed seed, fp16 on the GPU; nothing is downloaded), 4 layers, 16 query / 4 KV heads of
head_dim 128, vocabulary 32000; numba-attn registered with ``fallback="sdpa"`` (phases chosen per call), so
that a call it cannot run is counted as a fallback instead of failing:

* ``llama``: one prompt of 700 random tokens, 32 greedy tokens (sdpa is the reference);
* ``llama_padded``: a batch of 3 prompts of 700, 480 and 250 tokens, left-padded, 32 greedy tokens each;
* ``mistral``: sliding window 256, one prompt of 700 tokens (sdpa);
* ``gemma2``: logit soft-capping 50 and a sliding window of 256 on every other layer, one prompt of 700
  tokens (eager attention is the reference: transformers' sdpa path ignores soft-capping);
* ``train``: one training step (forward + backward) of the Llama model: the phases are forward-only, so
  every call is expected to fall back.

Per row: the calls by (prefill/decode, phase or "sdpa (fallback)"), the tokens' equality with the reference and,
where they depart, the first departing step with the reference's top-1 minus top-2 margin there (a margin near
0 is a tie of fp16 rounding, a large one a bug), and the largest logit difference on the prompt.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import transformers  # noqa: E402

import numba_attn.integrations.transformers as na_hf  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402

SIZES = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
             num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096)
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def build(kind, impl, smoke, device, dtype):
    sizes = dict(TINY if smoke else SIZES)
    window = 8 if smoke else 256
    if kind in ("llama", "llama_padded", "train"):
        cfg, cls = transformers.LlamaConfig(**sizes), transformers.LlamaForCausalLM
    elif kind == "mistral":
        cfg, cls = transformers.MistralConfig(sliding_window=window, **sizes), transformers.MistralForCausalLM
    else:
        cfg = transformers.Gemma2Config(sliding_window=window, attn_logit_softcapping=50.0,
                                        final_logit_softcapping=None, query_pre_attn_scalar=sizes["head_dim"],
                                        **sizes)
        cls = transformers.Gemma2ForCausalLM
    torch.manual_seed(0)
    return cls._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype).to(device)


def prompts(kind, smoke, device):
    g = torch.Generator().manual_seed(1)
    vocab = 128 if smoke else 32000
    lengths = ((20, 13, 7) if smoke else (700, 480, 250)) if kind == "llama_padded" else ((20,) if smoke else (700,))
    n = max(lengths)
    ids = torch.zeros((len(lengths), n), dtype=torch.long)
    mask = torch.zeros((len(lengths), n), dtype=torch.long)
    for i, L in enumerate(lengths):  # left padding, as batched generation pads
        ids[i, n - L:] = torch.randint(1, vocab, (L,), generator=g)
        mask[i, n - L:] = 1
    return ids.to(device), mask.to(device)


def greedy(model, ids, mask, new):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    return out.sequences[:, ids.shape[1]:], out.scores


def departure(ours, ref, ref_scores):
    """First step where the tokens depart, and the reference's top-1 minus top-2 margin there."""
    diff = (ours != ref).any(0).nonzero()
    if not len(diff):
        return None
    step = int(diff[0])
    row = int((ours[:, step] != ref[:, step]).nonzero()[0])
    top = ref_scores[step][row].float().topk(2).values
    return {"step": step, "row": row, "margin": float(top[0] - top[1])}


def run_row(kind, smoke, device, dtype, new):
    ref_impl = "eager" if kind == "gemma2" else "sdpa"
    ids, mask = prompts(kind, smoke, device)
    row = {"row": kind, "reference": ref_impl, "prompt_lengths": mask.sum(1).tolist(), "new_tokens": new}
    ours = build(kind, "numba_attn_models", smoke, device, dtype)
    ref = build(kind, ref_impl, smoke, device, dtype)
    t0 = time.perf_counter()
    if kind == "train":
        ours.train()
        labels = ids.clone()
        with na_hf.count_phases() as ran:
            loss = ours(ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        row["loss"] = float(loss)
    else:
        ours.eval(), ref.eval()
        with torch.no_grad():
            lo, lr = ours(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
        keep = mask.bool()
        row["prompt_logits_max_abs_diff"] = float((lo - lr).abs()[keep].max())
        with na_hf.count_phases() as ran:
            got, _ = greedy(ours, ids, mask, new)
        want, scores = greedy(ref, ids, mask, new)
        row["tokens_equal"] = bool(torch.equal(got, want))
        row["departure"] = departure(got, want, scores)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row["calls"] = {f"{k}: {p}": n for (k, p), n in sorted(ran.items())}
    row["fallbacks"] = sum(n for (k, p), n in ran.items() if p == "sdpa (fallback)")
    row["on_phases"] = sum(n for (k, p), n in ran.items() if p != "sdpa (fallback)")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rows", default="llama,llama_padded,mistral,gemma2,train")
    ap.add_argument("--new", type=int, default=32)
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    dtype = torch.float32 if a.smoke else torch.float16
    na_hf.register("numba_attn_models", fallback="sdpa")
    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "transformers":
           transformers.__version__, "torch": torch.__version__, "dtype": str(dtype), "rows": []}
    for kind in a.rows.split(","):
        try:
            res["rows"].append(run_row(kind, a.smoke, device, dtype, 3 if a.smoke else a.new))
        except Exception as exc:  # noqa: BLE001 - the row says what failed, the others still run
            res["rows"].append({"row": kind, "error": f"{type(exc).__name__}: {exc}"[:600]})
        print(json.dumps(res["rows"][-1]), flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
