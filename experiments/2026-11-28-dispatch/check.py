"""On a GPU: is phase=None within 3 % of the fastest registered phase on issue 42's nine problems?

For each problem, in one process and from a fresh state (an empty tuning cache of its own, no plan, nothing
measured before): what phase=None runs by the rule (``NUMBA_ATTN_AUTOTUNE=0``: the dispatch table, another Hopper
model's entry, the Hopper rule) and what it runs after its first call measured the candidates (``=1``, the
default on a GPU; that first call's wall time, compiles included, is recorded); then every registered tensor-core
prefill phase that supports the problem at its default parameters, the rule's configuration when it has
parameters of its own, and the phase=None call itself, timed in ``--rounds`` interleaved rounds (the order rotated
each round) by CUPTI kernel time (``numba_attn.measure.cupti``; CUDA events, ``numba_attn.measure.timing``, where
PyTorch's profiler cannot), ``--calls`` calls each after warm-ups, on PyTorch CUDA tensors with ``out=`` given (as a
model calls it, and as the issue measured); the median of the rounds. Prints the table and writes JSON (after each
problem, so a run cut short keeps what it measured): per problem each configuration's times, the fastest, and
``ratio_rule`` / ``ratio_measured`` (phase=None's time over the fastest; target <= 1.03).

    python experiments/2026-11-28-dispatch/check.py [--out FILE] [--rounds 2] [--calls 8] [--budget-s 450]
        [--phases all|quick|NAME,...] [--problems 0,1,...]

About 5-8 minutes on an H100 or H200 with the defaults (mostly compiles: ~6 kernel shapes x 9 phases);
``--phases quick`` times the Hopper rule's phases and ws_persistent only.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CACHE_DIR = tempfile.mkdtemp(prefix="dispatch-check-")
os.environ["NUMBA_ATTN_TUNING_CACHE"] = os.path.join(CACHE_DIR, "tuning-cache.json")  # phase=None starts fresh

from problems import NINE  # noqa: E402

from numba_attn.gpu import backend  # noqa: E402,F401  (first: chooses CUDA or the simulator before numba)

import numba_attn as na  # noqa: E402
from numba import cuda  # noqa: E402
from numba_attn.measure import autotune, policy  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time, cupti_status  # noqa: E402
from numba_attn.measure.env import gpu_info  # noqa: E402
from numba_attn.measure.samples import TimingConfig  # noqa: E402
from numba_attn.measure.timing import events_batched  # noqa: E402
from numba_attn.phases.registry import list_phases  # noqa: E402

TC_PHASES = ("tc_mma", "tc_pipelined", "tc_wgmma", "tc_wgmma_overlap", "tma_wgmma", "warp_specialized_tc", "ws_intra",
             "pingpong", "ws_overlap", "ws_persistent")
QUICK = policy.HOPPER_PREFILL + ("ws_persistent",)
TARGET = 1.03


def timer(method: str, calls: int):
    cfg = TimingConfig(warmup=3, min_reps=calls, max_reps=calls, budget_s=2.0, batch_ms=5.0, max_inner=200)

    def run(fn, stream):
        if method == "cupti":
            return cupti_kernel_time(fn, stream, cfg, calls=calls)["time_ms"]
        return events_batched(fn, stream, cfg)["time_ms"]

    return run


def arrays(p):
    """q, k, v and out of ``p``: PyTorch CUDA tensors, as a model passes them (standard normal, seeded); in the
    simulator (--smoke) NumPy arrays."""
    if backend.IS_SIMULATOR:
        q, k, v = autotune.inputs(p, seed=1)
        return q, k, v, np.empty_like(q)
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[p.dtype]
    shapes = [(p.batch, p.heads, p.q_len, p.head_dim)] + [(p.batch, p.kv_heads, p.kv_len, p.head_dim)] * 2
    q, k, v = (torch.randn(s, generator=g, device="cuda", dtype=dt) for s in shapes)
    torch.cuda.synchronize()
    return q, k, v, torch.empty_like(q)


def host_timer(fn, stream):
    """--smoke: one call on the host clock (the simulator has no device time)."""
    t0 = time.perf_counter()
    fn(0, stream)
    stream.synchronize()
    return (time.perf_counter() - t0) * 1e3


def smoke(problems):
    """--smoke: each problem's dtype, causality, head_dim and GQA group on one sequence of 48 tokens and one KV
    head, chosen for as on an H100 (the simulator counts as compute capability 9.0), measured on first use by
    :func:`host_timer`."""
    policy.device_name = lambda: "NVIDIA H100 80GB HBM3"
    autotune.time_calls = host_timer
    return [p.replace(batch=1, heads=p.group, kv_heads=1, q_len=48, kv_len=48) for p in problems]


def first_line(exc) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def choice(qd, kd, vd, causal, autotune_on: bool) -> dict:
    os.environ[autotune.AUTOTUNE_ENV] = "1" if autotune_on else "0"
    e = na.explain(qd, kd, vd, causal=causal)
    ph = e.phase
    own = {k: v for k, v in e.params.items() if v != ph.resolve(e.problem, {}).get(k)}  # beyond its defaults
    return {"phase": ph.name, "params": own, "why": e.why}


PEERS: tuple = ()


def peer_calls(p, q, k, v, peers) -> dict:
    """The peers of the same problem on the same inputs, as ``fn(i, stream)`` calls timed in the same rounds: SDPA
    with the cuDNN or flash backend (GQA by ``enable_gqa``), FlashAttention-4 (``flash_attn.cute.flash_attn_func`` on
    (B, N, H, D) copies; GQA by fewer K/V heads). A peer that cannot run here is left out with its reason."""
    if backend.IS_SIMULATOR or not peers:
        return {}
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    calls = {}
    gqa = p.kv_heads != p.heads
    for name in peers:
        try:
            if name in ("cudnn", "flash"):
                be = SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION

                def fn(i, s=None, be=be):
                    with sdpa_kernel([be]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=p.causal, enable_gqa=gqa)
            elif name == "fa4":  # called as the runner's fa4 peer calls it
                from numba_attn.measure.other_peers import fa4_function, fa4_kwargs

                fa4 = fa4_function()
                kw = fa4_kwargs(fa4, p)
                qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))

                def fn(i, s=None, qf=qf, kf=kf, vf=vf):
                    return fa4(qf, kf, vf, **kw)
            else:
                raise ValueError(f"unknown peer {name!r} (cudnn, flash, fa4)")
            fn(0)
            torch.cuda.synchronize()
            calls[f"peer {name}"] = fn
        except Exception as exc:  # noqa: BLE001 - reported, not timed
            print(f"  peer {name}: {first_line(exc)}", flush=True)
    return calls


def check_problem(p, names, time_fn, rounds: int) -> dict:
    os.environ["NUMBA_ATTN_TUNING_CACHE"] = tempfile.mkstemp(suffix=".json", dir=CACHE_DIR)[1]
    os.remove(os.environ["NUMBA_ATTN_TUNING_CACHE"])  # a cache of its own, empty: phase=None starts fresh
    na.clear_plans()
    autotune._CHOSEN.clear()
    autotune._FAILED.clear()
    stream = cuda.stream()
    qd, kd, vd, od = arrays(p)
    stream.synchronize()
    out = {"problem": p.label, "rule": choice(qd, kd, vd, p.causal, False)}
    os.environ[autotune.AUTOTUNE_ENV] = "1"
    t0 = time.perf_counter()
    na.attention(qd, kd, vd, causal=p.causal, out=od, stream=stream)  # the first call: measures, then runs
    stream.synchronize()
    out["first_call_s"] = round(time.perf_counter() - t0, 2)
    out["measured"] = choice(qd, kd, vd, p.causal, True)

    def call(**kw):
        def fn(i, s=stream):
            na.attention(qd, kd, vd, causal=p.causal, out=od, stream=s, **kw)
        return fn

    rule = out["rule"]
    names = list(names) + [n for n in (rule["phase"], out["measured"]["phase"]) if n not in names]
    configs = {name: call(phase=name) for name in names}
    if rule["params"]:
        configs[f"{rule['phase']}{json.dumps(rule['params'], sort_keys=True)}"] = call(phase=rule["phase"],
                                                                                        **rule["params"])
    configs["phase=None"] = call()  # after the first call: the measured choice, from the tuning cache
    configs.update(peer_calls(p, qd, kd, vd, PEERS))
    errors = {}
    for name, fn in list(configs.items()):  # compiles (and plans) outside the timing
        try:
            fn(0)
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - a phase that cannot run here is reported, not timed
            errors[name] = first_line(exc)
            del configs[name]
    times = {name: [] for name in configs}
    order = list(configs)
    for r in range(rounds):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            try:
                times[name].append(float(time_fn(configs[name], stream)))
            except Exception as exc:  # noqa: BLE001
                errors[name] = first_line(exc)
    med = {n: statistics.median(ts) for n, ts in times.items() if ts}
    phases_only = {n: t for n, t in med.items() if n != "phase=None" and not n.startswith("peer ")}
    best = min(phases_only, key=phases_only.get)
    rule_key = rule["phase"] + (json.dumps(rule["params"], sort_keys=True) if rule["params"] else "")
    out.update({"times_ms": times, "median_ms": med, "errors": errors, "fastest": best,
                "fastest_ms": phases_only[best],
                "ratio_rule": med.get(rule_key, float("nan")) / phases_only[best],
                "ratio_measured": med.get("phase=None", float("nan")) / phases_only[best]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON file (default: check-<gpu>.json beside this script)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=450.0, help="no problem is started after this many seconds")
    ap.add_argument("--phases", default="all", help="all (every tensor-core prefill phase), quick, or NAME,...")
    ap.add_argument("--problems", help="indexes into the nine problems, e.g. 0,2,5 (default: all)")
    ap.add_argument("--peers", default="", help="peers timed in the same rounds: cudnn,flash,fa4 (default: none)")
    ap.add_argument("--smoke", action="store_true", help="the script's logic in the simulator on small stand-ins "
                    "of the problems, as on an H100, with a host clock (no time means anything)")
    args = ap.parse_args()
    info = gpu_info()
    problems = NINE if not args.problems else [NINE[int(i)] for i in args.problems.split(",")]
    if args.smoke:
        problems, info = smoke(problems), {**info, "gpu": "NVIDIA H100 80GB HBM3 (simulator smoke)"}
    elif info["gpu"] == "simulator":
        raise SystemExit("check.py times kernels: run it on a GPU (the simulator times nothing; --smoke checks "
                         "the script there)")
    method = "smoke" if args.smoke else "cupti" if cupti_status() is None else "events"
    global PEERS
    PEERS = tuple(x for x in args.peers.split(",") if x)
    if method == "cupti":  # CUPTI's start-up (seconds, the GPU idle) before the first problem, not inside its rounds
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    wanted = {"all": TC_PHASES, "quick": QUICK}.get(args.phases) or tuple(args.phases.split(","))
    builtin = {p.name: p for p in list_phases() if p.is_builtin and p.kind == "prefill"}
    slug = info["gpu"].lower().replace("nvidia ", "").split()[0]
    path = args.out or os.path.join(HERE, f"check-{slug}.json")
    report = {"gpu": info, "method": method, "rounds": args.rounds, "calls": args.calls, "target": TARGET,
              "commit": (os.environ.get("NUMBA_ATTN_COMMIT", "")[:7]
                         or os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or None), "problems": []}
    t_start = time.perf_counter()
    for p in problems:
        if time.perf_counter() - t_start > args.budget_s:
            report["stopped"] = f"budget of {args.budget_s:g} s spent before {p.label}"
            break
        names = [n for n in wanted if n in builtin and builtin[n].supports(p) is None]
        t0 = time.perf_counter()
        row = check_problem(p, names, host_timer if args.smoke else timer(method, args.calls), args.rounds)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        report["problems"].append(row)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"{p.label:34s} fastest {row['fastest']} {row['fastest_ms']:.4g} ms | rule "
              f"{row['rule']['phase']}{json.dumps(row['rule']['params']) if row['rule']['params'] else ''} "
              f"{row['ratio_rule']:.3f}x | measured {row['measured']['phase']} {row['ratio_measured']:.3f}x "
              f"(first call {row['first_call_s']} s) | {row['seconds']} s", flush=True)
        for n, t in row["median_ms"].items():
            if n.startswith("peer "):
                print(f"    {n}: {t:.4g} ms; fastest phase / it {t / row['fastest_ms']:.3f}x, phase=None / it "
                      f"{t / row['median_ms'].get('phase=None', float('nan')):.3f}x", flush=True)
    rows = report["problems"]
    ok = [r for r in rows if max(r["ratio_rule"], r["ratio_measured"]) <= TARGET]
    print(f"{info['gpu']} ({method}): {len(ok)} of {len(rows)} problems within {TARGET:.2f}x by both choices; "
          f"{time.perf_counter() - t_start:.0f} s; {path}")


if __name__ == "__main__":
    main()
