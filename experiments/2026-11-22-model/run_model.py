"""A Llama-architecture model on numba-attn kernels, beside SDPA, in one run.

    NUMBA_ATTN_BACKEND=cuda NUMBA_ATTN_COMMIT=$(git rev-parse HEAD) python3 \\
        experiments/2026-11-22-model/run_model.py --out experiments/2026-11-22-model/model-<gpu>.jsonl
    NUMBA_ATTN_BACKEND=simulator python3 experiments/2026-11-22-model/run_model.py --smoke --out /tmp/smoke.jsonl

For each model config (random weights from a fixed seed, fp16 on the GPU; nothing is downloaded) and each
attention implementation — "sdpa", "numba_attn" (numba_attn.integrations.transformers, sdpa's masks)
and "numba_attn_nomask" (the same attention function with no mask builder, so transformers builds no mask
at all, like a ten-line attention function registered by hand) — on one prompt of random tokens:

* correctness: the prompt's logits against sdpa's and against an fp32 sdpa run of the same weights
  (max abs / relative difference, argmax agreement; "within_tolerance": numba-attn's logits are no
  further from the fp32 ones than twice sdpa's, the fp16 rounding sdpa itself shows); greedy
  generation (do_sample=False, no EOS) of --new tokens, twice per implementation (determinism); where
  the tokens depart from sdpa's, the step and sdpa's margin there (top-1 minus top-2 score): a margin
  near 0 is a tie, a large one a bug;
* speed: prefill (a forward of the prompt with a fresh cache and logits_to_keep=1, as generate's
  first step; CUDA events; warmed up; median of --repeats), decode (a loop of single-token forwards
  over a DynamicCache with generate's all-ones mask: median CUDA-event time per step, and steps / wall
  time; for numba-attn also with its plan cache emptied first, "fresh_plans": each step's new kv_len
  then plans once, as in a generation longer than any before), generate (wall time of generate(--new) and of generate(1): decode tokens/s = (new - 1) /
  difference); the first (cold) generate of each implementation on its own;
* why: a torch.profiler summary of 3 decode steps (top kernels by CUDA time, CPU time, kernel
  launches, synchronizing runtime calls), the masks transformers built and passed, the cache class,
  the generation config, torch.compile graph counters; the numba-attn phases that ran (by kind and
  name, numba_attn.integrations.transformers.count_phases) and the plan cache hits/misses per section.

Writes JSON lines (an "env" record, then "model", "compare" and "profile" records) to --out and prints a
table. --smoke: a tiny config on the CPU in the simulator (named phases with small tiles), end to end.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

import numba_attn.integrations.transformers as na_hf  # noqa: E402
from numba_attn import api  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402

CONFIGS = {  # Llama-architecture, 32 query heads and 8 KV heads (GQA group 4)
    "d128": dict(hidden_size=4096, head_dim=128, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=11008, vocab_size=32000),
    "d64": dict(hidden_size=2048, head_dim=64, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=5632, vocab_size=32000),
    # --smoke: CPU, simulator
    "tiny": dict(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                 vocab_size=128, initializer_range=0.5),  # at hidden 64 the default 0.02 gives uniform attention
}
IMPLS = ("sdpa", "numba_attn", "numba_attn_nomask")
SMOKE_PHASES = dict(prefill_phase="causal_skip", prefill_params={"Br": 32, "Bc": 16, "TM": 4, "TN": 4},
                    decode_phase="decode_split_k_lean", decode_params={"warps": 2})
SYNC_CALLS = ("Synchronize", "Memcpy", "MemGetInfo", "Malloc", "MemAlloc", "Free", "HostAlloc")


def log(*a):
    print(*a, flush=True)


# -- timing ------------------------------------------------------------------------------------------------

class Clock:
    """Milliseconds of a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def events(self, fn):
        """Device time between two events around ``fn`` (host time where the host is the bottleneck)."""
        if not self.cuda:
            t = time.perf_counter()
            r = fn()
            return (time.perf_counter() - t) * 1e3, r
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        r = fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b), r

    def wall(self, fn):
        self.sync()
        t = time.perf_counter()
        r = fn()
        self.sync()
        return (time.perf_counter() - t) * 1e3, r


@contextlib.contextmanager
def plan_stats(into: dict, key: str):
    """numba-attn plan cache hits/misses during the block, as ``into[key]``."""
    info = getattr(api, "plan_cache_info", None)
    before = info() if info else None
    yield
    if before is not None:
        after = info()
        into[key] = {"hits": after["hits"] - before["hits"], "misses": after["misses"] - before["misses"]}


@contextlib.contextmanager
def mask_spy(impl: str, into: dict):
    """Count the mask builder's calls for ``impl`` and the masks it returned (None = no mask passed)."""
    mapping = AttentionMaskInterface._global_mapping
    real = mapping.get(impl)
    counts = {"mask_builder_calls": 0, "masks_returned": 0}
    if real is not None:
        def spy(*a, **k):
            m = real(*a, **k)
            counts["mask_builder_calls"] += 1
            counts["masks_returned"] += m is not None
            return m

        mapping[impl] = spy
    try:
        yield counts
    finally:
        if real is not None:
            mapping[impl] = real
        into.update(counts)


# -- the model ---------------------------------------------------------------------------------------------

def build(name, layers, device, dtype, seed):
    cfg = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=8192, **CONFIGS[name])
    torch.manual_seed(seed)
    model = LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", dtype=dtype)
    return model.to(device).eval(), cfg


def generate(model, ids, new, scores=False):
    """Greedy, exactly ``new`` tokens (no EOS), as a user calls it (generate builds the all-ones mask)."""
    cfg = GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                           pad_token_id=0, bos_token_id=None, return_dict_in_generate=True, output_scores=scores)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)


def prefill(model, ids):
    with torch.no_grad():
        return model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)


def decode_loop(model, ids, steps, clock, profile_steps=0):
    """Greedy single-token forwards over a DynamicCache after the prompt, with the all-ones attention
    mask generate passes: per-step event times and the wall time of the steps (one synchronization at
    the end); with ``profile_steps``, a profiler summary of that many steps instead."""
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        tok = out.logits[:, -1:].argmax(-1)
        seen = ids.shape[1]

        def step():
            nonlocal seen
            seen += 1
            return model(tok, attention_mask=torch.ones((1, seen), dtype=ids.dtype, device=ids.device),
                         past_key_values=cache, use_cache=True)

        clock.sync()
        if profile_steps:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if clock.cuda else [])
            with profile(activities=acts) as prof:
                t = time.perf_counter()
                for _ in range(profile_steps):
                    tok = step().logits[:, -1:].argmax(-1)
                clock.sync()
                wall = (time.perf_counter() - t) * 1e3
            return None, None, summarize_profile(prof, profile_steps, wall)
        times = []
        t = time.perf_counter()
        for _ in range(steps):
            ms, out = clock.events(step)
            times.append(ms)
            tok = out.logits[:, -1:].argmax(-1)
        clock.sync()
        return times, (time.perf_counter() - t) * 1e3, None


def summarize_profile(prof, steps, wall_ms):
    avgs = prof.key_averages()

    def dev_us(e):
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0

    def self_dev_us(e):
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0

    kernels = [e for e in avgs if getattr(e, "device_type", None) is not None
               and "CUDA" in str(e.device_type) and self_dev_us(e) > 0]
    kernels.sort(key=self_dev_us, reverse=True)
    cpu_ops = sorted(avgs, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "steps": steps, "wall_ms": round(wall_ms, 3),
        "cpu_self_total_ms": round(sum(e.self_cpu_time_total for e in avgs) / 1e3, 3),
        "cuda_kernel_total_ms": round(sum(self_dev_us(e) for e in kernels) / 1e3, 3),
        "kernel_launches": sum(e.count for e in kernels),
        "top_kernels": [{"name": e.key[:90], "count": e.count, "total_us": round(self_dev_us(e), 1)}
                        for e in kernels[:10]],
        "top_cpu_ops": [{"name": e.key[:90], "count": e.count, "self_cpu_us": round(e.self_cpu_time_total, 1),
                         "cuda_us": round(dev_us(e), 1)} for e in cpu_ops[:12]],
        "sync_like_calls": {e.key: e.count for e in avgs if any(s in e.key for s in SYNC_CALLS)},
    }


def compile_counters():
    try:
        from torch._dynamo.utils import counters

        return {"graph_breaks": sum(counters["graph_break"].values()),
                "unique_graphs": counters["stats"].get("unique_graphs", 0)}
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}


def logit_diff(a, b):
    a, b = a.float(), b.float()
    d = (a - b).abs()
    return {"max_abs": d.max().item(), "mean_abs": d.mean().item(),
            "rel_to_max": (d.max() / b.abs().max()).item(),
            "argmax_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item()}


def first_difference(tokens, ref_tokens, ref_scores, our_scores, prompt_len):
    """The first generated step where ``tokens`` depart from ``ref_tokens``, with the reference's
    margin there (top-1 minus top-2 score) and ours."""
    a, b = tokens[0, prompt_len:].tolist(), ref_tokens[0, prompt_len:].tolist()
    for step, (x, y) in enumerate(zip(a, b)):
        if x != y:
            top = torch.topk(ref_scores[step][0].float(), 2).values
            ours = torch.topk(our_scores[step][0].float(), 2).values
            return {"step": step, "ours": x, "sdpa": y, "sdpa_margin": (top[0] - top[1]).item(),
                    "our_margin": (ours[0] - ours[1]).item(),
                    "score_gap_at_step": (our_scores[step][0].float() - ref_scores[step][0].float()).abs().max().item()}
    return None


# -- one config --------------------------------------------------------------------------------------------

def run_config(name, args, device, dtype, clock, write):
    log(f"== {name}: building ({args.layers} layers, {dtype})")
    model, cfg = build(name, args.layers, device, dtype, args.seed)
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(args.seed + 1)).to(device)
    rows = {}
    # fp32 reference of the prompt's logits (same weights, sdpa)
    ref32 = None
    if not args.no_fp32:
        m32 = copy.deepcopy(model).float()
        with torch.no_grad():
            ref32 = m32(ids).logits.float().cpu()
        del m32
        if clock.cuda:
            torch.cuda.empty_cache()
    logits, gens = {}, {}
    for impl in args.impls:
        row = {"type": "model", "config": name, "impl": impl, "layers": args.layers, "prompt": args.prompt,
               "new_tokens": args.new, "dtype": str(dtype).replace("torch.", ""),
               "model": {k: getattr(cfg, k) for k in ("hidden_size", "head_dim", "num_attention_heads",
                                                       "num_key_value_heads", "intermediate_size", "vocab_size")}}
        model.set_attn_implementation(impl)
        log(f"-- {name} {impl}")
        # cold: the first generate of this implementation (numba-attn compiles and plans here)
        with plan_stats(row, "plans_cold"):
            row["cold_generate_ms"], _ = clock.wall(lambda: generate(model, ids, args.new))
        # correctness pass (untimed): phases, masks, cache class, scores
        with na_hf.count_phases() as ran, mask_spy(impl, row), plan_stats(row, "plans_counted"):
            g1 = generate(model, ids, args.new, scores=True)
        row["phases"] = {f"{kind}:{phase}": n for (kind, phase), n in sorted(ran.items())}
        row["cache_class"] = type(g1.past_key_values).__name__
        g2 = generate(model, ids, args.new, scores=True)
        row["deterministic_tokens"] = torch.equal(g1.sequences, g2.sequences)
        with torch.no_grad():
            la = model(ids).logits.float().cpu()
            lb = model(ids).logits.float().cpu()
        row["deterministic_logits_max_abs"] = (la - lb).abs().max().item()
        if ref32 is not None:
            row["logits_vs_fp32"] = logit_diff(la, ref32)
        logits[impl], gens[impl] = la, (g1, g2)
        # speed
        for _ in range(2):
            clock.events(lambda: prefill(model, ids))
        with plan_stats(row, "plans_prefill"):
            pre = [clock.events(lambda: prefill(model, ids))[0] for _ in range(args.repeats)]
        row["prefill_ms"] = statistics.median(pre)
        row["prefill_ms_all"] = [round(x, 4) for x in pre]
        steps = args.new - 1
        decode_loop(model, ids, steps, clock)  # warm-up (plans for these lengths)
        with plan_stats(row, "plans_decode"):
            times, wall, _ = decode_loop(model, ids, steps, clock)
        row["decode_step_ms"] = statistics.median(times)
        row["decode_tok_s_loop"] = steps / (wall / 1e3)
        if impl != "sdpa" and hasattr(api, "clear_plans"):
            # a generation past the lengths seen before: every step's kv_len is new to the plan cache (kernels
            # stay compiled), as in a real run; the loops above replayed lengths already planned
            api.clear_plans()
            with plan_stats(row, "plans_decode_fresh"):
                times, wall, _ = decode_loop(model, ids, steps, clock)
            row["decode_step_ms_fresh_plans"] = statistics.median(times)
            row["decode_tok_s_loop_fresh_plans"] = steps / (wall / 1e3)
        with plan_stats(row, "plans_generate"):
            g_all = [clock.wall(lambda: generate(model, ids, args.new))[0] for _ in range(args.repeats)]
            g_one = [clock.wall(lambda: generate(model, ids, 1))[0] for _ in range(args.repeats)]
        row["generate_ms"], row["generate1_ms"] = statistics.median(g_all), statistics.median(g_one)
        row["generate_tok_s"] = args.new / (row["generate_ms"] / 1e3)
        row["decode_tok_s_generate"] = steps / max(row["generate_ms"] - row["generate1_ms"], 1e-9) * 1e3
        row["generation_config"] = {k: v for k, v in model.generation_config.to_dict().items()
                                    if k in ("cache_implementation", "compile_config", "use_cache")}
        row["torch_compile"] = compile_counters()
        if args.profile_steps:
            _, _, prof = decode_loop(model, ids, 0, clock, profile_steps=args.profile_steps)
            write({"type": "profile", "config": name, "impl": impl, **prof})
            log(f"   profile: {prof['wall_ms']:.2f} ms wall for {args.profile_steps} steps, "
                f"{prof['cuda_kernel_total_ms']:.2f} ms of kernels, {prof['kernel_launches']} launches, "
                f"CPU self {prof['cpu_self_total_ms']:.2f} ms; sync-like {prof['sync_like_calls']}")
        rows[impl] = row
        write(row)
    # the same speed measurements again, the implementations alternating round by round, so that a
    # drift of the host (decode is host-bound here) lands on every implementation alike
    if args.interleave and len(args.impls) > 1:
        steps = args.new - 1
        inter = {impl: {"prefill": [], "step": []} for impl in args.impls}
        for _ in range(args.interleave):
            for impl in args.impls:
                model.set_attn_implementation(impl)
                inter[impl]["prefill"].append(clock.events(lambda: prefill(model, ids))[0])
                times, _wall, _ = decode_loop(model, ids, steps, clock)
                inter[impl]["step"].append(statistics.median(times))
        for impl, d in inter.items():
            step = statistics.median(d["step"])
            rec = {"type": "interleaved", "config": name, "impl": impl, "rounds": args.interleave,
                   "prefill_ms": statistics.median(d["prefill"]), "prefill_ms_all": [round(x, 4) for x in d["prefill"]],
                   "decode_step_ms": step, "decode_step_ms_all": [round(x, 4) for x in d["step"]],
                   "decode_tok_s": 1e3 / step}
            write(rec)
            log(f"   interleaved {name} {impl:18s} prefill {rec['prefill_ms']:.3f} ms {rec['prefill_ms_all']}, "
                f"decode step {step:.3f} ms ({rec['decode_tok_s']:.0f} tok/s) {rec['decode_step_ms_all']}")
    # comparisons against sdpa
    if "sdpa" in logits:
        ref_seq, ref_scores = gens["sdpa"][0].sequences, gens["sdpa"][0].scores
        for impl in args.impls:
            if impl == "sdpa":
                continue
            seq, scores = gens[impl][0].sequences, gens[impl][0].scores
            cmp = {"type": "compare", "config": name, "impl": impl, "against": "sdpa",
                   "logits": logit_diff(logits[impl], logits["sdpa"]),
                   "tokens_equal": torch.equal(seq, ref_seq),
                   "tokens_equal_second_run": torch.equal(gens[impl][1].sequences, gens["sdpa"][1].sequences),
                   "first_difference": first_difference(seq, ref_seq, ref_scores, scores, args.prompt)}
            if ref32 is not None:
                ours, theirs = rows[impl]["logits_vs_fp32"]["max_abs"], rows["sdpa"]["logits_vs_fp32"]["max_abs"]
                floor = 1e-4 * ref32.abs().max().item()  # where sdpa is the fp32 reference itself (--smoke)
                cmp["fp32_error_ours_over_sdpa"] = ours / max(theirs, floor)
                # no further from the fp32 logits than twice sdpa's own distance (its fp16 rounding)
                cmp["within_tolerance"] = ours <= 2 * theirs + floor
            write(cmp)
            rows[impl]["compare"] = cmp
    del model
    if clock.cuda:
        torch.cuda.empty_cache()
    return rows


def table(all_rows):
    head = (f"{'config':6} {'impl':18} {'prefill ms':>10} {'step ms':>8} {'tok/s loop':>10} {'fresh':>6} {'tok/s gen':>9} "
            f"{'cold gen ms':>11} {'logit maxabs':>12} {'tokens=sdpa':>11} {'determ.':>7}  phases")
    lines = [head, "-" * len(head)]
    for rows in all_rows:
        for impl, r in rows.items():
            c = r.get("compare", {})
            eq = "-" if not c else ("yes" if c["tokens_equal"] else f"no@{c['first_difference']['step']}")
            lines.append(
                f"{r['config']:6} {impl:18} {r['prefill_ms']:10.3f} {r['decode_step_ms']:8.3f} "
                f"{r['decode_tok_s_loop']:10.1f} {r.get('decode_tok_s_loop_fresh_plans', float('nan')):6.1f} "
                f"{r['decode_tok_s_generate']:9.1f} {r['cold_generate_ms']:11.1f} "
                f"{c['logits']['max_abs'] if c else 0:12.3g} {eq:>11} "
                f"{'yes' if r['deterministic_tokens'] else 'NO':>7}  "
                f"{', '.join(f'{k} x{n}' for k, n in r['phases'].items())}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON-lines file (appended)")
    ap.add_argument("--configs", default="d128,d64")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--interleave", type=int, default=5,
                    help="rounds of prefill and decode timing with the implementations alternating (0: none)")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill-phase", default=None, help="default: numba-attn's choice per call")
    ap.add_argument("--decode-phase", default=None, help="default: numba-attn's choice per call")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 reference logits")
    ap.add_argument("--smoke", action="store_true", help="tiny config on the CPU in the simulator")
    args = ap.parse_args(argv)
    args.impls = [s for s in args.impls.split(",") if s]
    phases = dict(prefill_phase=args.prefill_phase, decode_phase=args.decode_phase)
    if args.smoke:
        from numba_attn.gpu import backend

        if not backend.IS_SIMULATOR:
            ap.error("--smoke runs in the simulator: set NUMBA_ATTN_BACKEND=simulator")
        args.configs, args.layers, args.prompt, args.new, args.repeats = "tiny", 2, 9, 3, 1
        args.interleave = min(args.interleave, 1)
        args.profile_steps = min(args.profile_steps, 1)
        phases = SMOKE_PHASES
        device, dtype = torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            ap.error("needs a CUDA GPU (or --smoke for the simulator)")
        device, dtype = torch.device("cuda"), torch.float16
    na_hf.register("numba_attn", **phases)
    # the same attention function with no mask builder: transformers then builds no mask at all
    transformers.AttentionInterface.register("numba_attn_nomask",
                                             transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["numba_attn"])
    clock = Clock(device)
    out = open(args.out, "a")

    def write(rec):
        out.write(json.dumps(rec, default=str) + "\n")
        out.flush()

    env = environment(" ".join(sys.argv))
    env.update(type="env", transformers=transformers.__version__, experiment="2026-11-22-model",
               phases={k: v for k, v in phases.items() if v is not None} or "numba-attn's choice per call")
    write(env)
    log(f"{env.get('gpu')} commit {env.get('commit')} torch {torch.__version__} transformers "
        f"{transformers.__version__}")
    all_rows = [run_config(name, args, device, dtype, clock, write) for name in args.configs.split(",")]
    out.close()
    log(table(all_rows))
    bad = [(r["config"], i) for rows in all_rows for i, r in rows.items()
           if r.get("compare") and not (r["compare"]["tokens_equal"] and r["deterministic_tokens"])]
    log("tokens equal to sdpa's and deterministic everywhere" if not bad else f"check: {bad}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
