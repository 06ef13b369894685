"""A random-init Llama trained on a generated language task, once with sdpa and once on numba-attn's phases.

The task: sequence reversal. Each sequence is ``BOS a_1 .. a_n SEP a_n .. a_1`` (symbols drawn from a seeded
generator); the loss is taken on the reversed half only, so a model that learned the task drives it toward 0.
Both runs start from the same seed (same weights, same batches): with the phases (``attn_implementation=
"numba_attn"``, ``register(fallback="sdpa")``, forward and backward on numba-attn) the loss curve should lie
within noise of sdpa's. Mixed precision: fp32 master weights, ``torch.autocast`` (fp16 by default, with a
GradScaler; bf16 runs on the tensor-core backward phases, head dims multiples of 16 up to 128; where none takes it,
the call falls back to sdpa and is counted), AdamW.

    python experiments/2026-11-27-train/train.py --out experiments/2026-11-27-train/train.json \\
        --plot experiments/2026-11-27-train/loss.png              # a GPU: 300 steps, 4 layers, GQA 8/2, D64
    python experiments/2026-11-27-train/train.py --smoke          # 3 steps of a tiny model, CPU, simulator

The two runs' steps are interleaved (sdpa's step, then numba-attn's, the order swapped every step), so both are timed
under the same host and GPU conditions: a training step of this size is mostly host time, which drifts by tens of
percent over a minute. Records per run: the loss of every step, each step's time, tokens/s (steps after the
warm-up, which compiles the kernels) and the median step, and the attention calls by (kind, phase) with the fallbacks to sdpa: "prefill/<phase>" the forward
calls, "backward/<phase>" the backward phases their gradients ran.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

SPECIALS = 3  # 0 unused, 1 BOS, 2 SEP
BOS, SEP = 1, 2


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--smoke", action="store_true", help="3 steps of a tiny model on the CPU in the simulator")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64, choices=(16, 32, 64, 128))
    p.add_argument("--symbols", type=int, default=61, help="distinct symbols of the task (vocabulary: +3)")
    p.add_argument("--n", type=int, default=127, help="symbols per sequence (length 2n + 2)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=30, help="learning-rate warm-up steps")
    p.add_argument("--dtype", default=None, choices=("fp16", "bf16", "fp32"),
                   help="the autocast dtype (default fp16; --smoke: fp32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--impl", default="both", choices=("both", "sdpa", "numba_attn"))
    p.add_argument("--prefill-phase", default=None, help="a phase that writes the log-sum-exp (None: chosen)")
    p.add_argument("--timing-from", type=int, default=10, help="tokens/s over the steps from this one on")
    p.add_argument("--out", default=None, help="JSON results (default: train.json here; smoke: smoke.json)")
    p.add_argument("--plot", default=None, help="a PNG of both loss curves")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after the run, STEPS more steps under torch.profiler: each run's operators by their own CPU "
                        "time and by their device time (where a step's time goes; the attention calls are the "
                        "numba_attn:: operators and sdpa's aten:: ones)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.layers, args.heads, args.kv_heads, args.head_dim = 3, 2, 4, 2, 16
        args.symbols, args.n, args.batch, args.warmup, args.timing_from = 13, 5, 2, 1, 1
        args.dtype = args.dtype or "fp32"
        args.prefill_phase = args.prefill_phase or "causal_skip"
    args.dtype = args.dtype or "fp16"
    here = os.path.dirname(os.path.abspath(__file__))
    args.out = args.out or os.path.join(here, "smoke.json" if args.smoke else "train.json")
    return args


def batches(torch, args, device):
    """An endless stream of (ids, labels) of the reversal task, the same for every run of one seed."""
    g = torch.Generator().manual_seed(args.seed + 1)
    while True:
        a = torch.randint(SPECIALS, SPECIALS + args.symbols, (args.batch, args.n), generator=g)
        col = torch.full((args.batch, 1), BOS), torch.full((args.batch, 1), SEP)
        ids = torch.cat([col[0], a, col[1], a.flip(1)], dim=1)
        labels = ids.clone()
        labels[:, :args.n + 2] = -100  # the loss on the reversed half (predicted from SEP on)
        yield ids.to(device), labels.to(device)


def make_model(torch, transformers, args, impl, device):
    torch.manual_seed(args.seed)
    h = args.heads * args.head_dim
    config = transformers.LlamaConfig(
        vocab_size=SPECIALS + args.symbols, hidden_size=h, intermediate_size=int(h * 8 / 3) // 64 * 64 or 4 * h,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, max_position_embeddings=2 * args.n + 2, attention_dropout=0.0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=impl,
                                                      dtype=torch.float32).to(device).train()


class Run:
    """One model, its optimizer and its data stream: :meth:`step` runs and times a training step (loss and time
    kept, the attention calls counted by (kind, phase)); :meth:`result` is the run's record."""

    def __init__(self, torch, transformers, na_hf, args, impl, device):
        self.torch, self.na_hf, self.args, self.impl, self.device = torch, na_hf, args, impl, device
        self.model = make_model(torch, transformers, args, impl, device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}[args.dtype]
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        self.data = batches(torch, args, device)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.losses, self.step_s, self.ran = [], [], collections.Counter()

    def one_step(self):
        torch, model, opt, scaler = self.torch, self.model, self.opt, self.scaler
        ids, labels = next(self.data)
        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            loss = model(ids, labels=labels).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        self.sched.step()
        return loss

    def step(self):
        step = len(self.losses)
        with self.na_hf.count_phases(backward=True) as ran:
            self.sync()
            t0 = time.perf_counter()
            loss = self.one_step()
            self.sync()
            self.step_s.append(time.perf_counter() - t0)
        self.ran.update(ran)
        self.losses.append(float(loss.detach()))
        if step % 25 == 0 or step == self.args.steps - 1:
            print(f"{self.impl:>10} step {step:4d} loss {self.losses[-1]:.4f} {self.step_s[-1] * 1e3:8.1f} ms",
                  flush=True)

    def result(self):
        args, step_s = self.args, self.step_s
        timed = step_s[args.timing_from:] or step_s
        tokens = args.batch * (2 * args.n + 2)
        calls = {f"{kind}/{phase}": n for (kind, phase), n in sorted(self.ran.items())}
        profiled = (profile_steps(self.torch, self.one_step, args.profile, self.device, self.sync)
                    if args.profile else None)
        return {"profile": profiled, "loss": self.losses, "step_s": step_s, "tokens_per_step": tokens,
                "tokens_per_s": tokens * len(timed) / sum(timed), "timed_steps": len(timed),
                "median_step_ms": statistics.median(timed) * 1e3, "attention_calls": calls,
                "fallbacks": sum(n for (_, phase), n in self.ran.items() if phase == "sdpa (fallback)")}


def profile_steps(torch, one_step, steps, device, sync, top=25):
    """``steps`` steps under torch.profiler: the operators by their own CPU time and by their device time (µs a
    step, calls a step), and the steps' wall time; the tables printed."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            one_step()
        sync()
    wall = (time.perf_counter() - t0) / steps
    avg = prof.key_averages()

    def rows(key):
        out = [(e.key, getattr(e, key) / steps, e.count / steps) for e in avg if getattr(e, key, 0) > 0]
        return sorted(out, key=lambda r: -r[1])[:top]

    device_key = "self_device_time_total" if hasattr(avg[0], "self_device_time_total") else "self_cuda_time_total"
    result = {"steps": steps, "wall_ms_per_step": wall * 1e3, "by_self_cpu_us": rows("self_cpu_time_total"),
              "by_self_device_us": rows(device_key) if device.type == "cuda" else []}
    print(f"profiled {steps} steps: {wall * 1e3:.2f} ms a step (under the profiler)")
    for title, key in (("own CPU time", "by_self_cpu_us"), ("device time", "by_self_device_us")):
        for name, us, n in result[key][:12]:
            print(f"  {title:12s} {us:9.1f} us/step  {n:6.1f} calls/step  {name[:80]}")
    return result


def environment(torch, transformers):
    try:
        commit = os.environ.get("NUMBA_ATTN_COMMIT") or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU, CUDA simulator)"
    return {"torch": torch.__version__, "transformers": transformers.__version__, "gpu": gpu, "commit": commit,
            "command": " ".join([sys.executable] + sys.argv)}


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for impl, run in result["runs"].items():
        label = f"{impl} ({run['tokens_per_s']:.0f} tokens/s, {run['fallbacks']} fallbacks)"
        ax.plot(range(len(run["loss"])), run["loss"], label=label, lw=1.2)
    c = result["config"]
    ax.set(xlabel="step", ylabel="loss (reversed half)", yscale="log",
           title=f"Llama {c['layers']}L H{c['heads']}/{c['kv_heads']} D{c['head_dim']} {c['dtype']}, "
                 f"reversal n={c['n']}, seed {c['seed']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print("wrote", path)


def main(argv=None):
    args = parse(argv)
    if args.smoke:
        os.environ.setdefault("NUMBA_ATTN_BACKEND", "simulator")
    import torch
    import transformers

    import numba_attn.integrations.transformers as na_hf

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    params = {"Br": 32, "Bc": 16, "TM": 4, "TN": 4} if args.smoke and args.prefill_phase == "causal_skip" else None
    na_hf.register("numba_attn", prefill_phase=args.prefill_phase, prefill_params=params, fallback="sdpa")
    impls = ["sdpa", "numba_attn"] if args.impl == "both" else [args.impl]
    result = {"config": vars(args), "env": environment(torch, transformers), "runs": {}}
    runs = [Run(torch, transformers, na_hf, args, impl, device) for impl in impls]
    for step in range(args.steps):  # the runs' steps interleaved, in turns: both see the host and GPU alike
        for run in (runs if step % 2 == 0 else runs[::-1]):
            run.step()
    for run in runs:
        result["runs"][run.impl] = run.result()
    if len(impls) == 2:
        a, b = (result["runs"][i]["loss"] for i in impls)
        tail = max(1, len(a) // 10)
        result["comparison"] = {
            "max_abs_loss_diff": max(abs(x - y) for x, y in zip(a, b)),
            "final_loss_mean_last_10pct": {i: sum(result["runs"][i]["loss"][-tail:]) / tail for i in impls},
            "tokens_per_s_ratio": result["runs"]["numba_attn"]["tokens_per_s"] / result["runs"]["sdpa"]["tokens_per_s"],
            "median_step_ratio": result["runs"]["sdpa"]["median_step_ms"] / result["runs"]["numba_attn"]["median_step_ms"],
        }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", args.out)
    for impl, run in result["runs"].items():
        print(f"{impl:>10}: final loss {run['loss'][-1]:.4f}, {run['tokens_per_s']:.0f} tokens/s, "
              f"{run['fallbacks']} fallbacks, calls {run['attention_calls']}")
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
