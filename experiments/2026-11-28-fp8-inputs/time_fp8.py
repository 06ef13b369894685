"""FP8 forward with e4m3 inputs (``attention_fp8``) beside the quantizing call and cuDNN fp16, in one process.

    python3 experiments/2026-11-28-fp8-inputs/time_fp8.py --out fp8.json [--rounds 3 --calls 8]
    python3 experiments/2026-11-28-fp8-inputs/time_fp8.py --smoke        (the logic, in the simulator)

For each problem: the e4m3 codes of Q, K and V and their per-head scales (spec/fp8_inputs.py: each head its own
magnitude, the codes over e4m3's range), and their decoded values as float16/bfloat16 tensors. Configurations,
timed in interleaved rounds (CUPTI: every kernel of a call, the median of the rounds):

* ``e4m3-in <phase>``: ``attention_fp8`` on the codes (V's rearrangement kernel and the attention kernel), for
  fp8_overlap, fp8_ws and fp8_exp_fma;
* ``fp16-in fp8_overlap``: ``attention(phase="fp8_overlap")`` on the decoded values (the quantization's four
  kernels, then the same attention kernel);
* ``fp16 ws_tma_q_early``: the fastest fp16 phase at D128 (``ws_tma_q_wide`` at D64);
* ``peer cudnn``: SDPA's cuDNN backend on the decoded values.

Before timing, every configuration's output is compared with SDPA in float32 on the decoded values (on the GPU; the
float64 reference of N8192 takes minutes on a host): relative error printed and kept.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from numba_attn.gpu import backend  # noqa: E402  (first: chooses CUDA or the simulator before numba)

import numba_attn as na  # noqa: E402
from numba import cuda  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time, cupti_status  # noqa: E402
from numba_attn.measure.env import gpu_info  # noqa: E402
from numba_attn.measure.samples import TimingConfig  # noqa: E402
from numba_attn.spec.fp8_inputs import Fp8InputProblem, decode, reference  # noqa: E402

PROBLEMS = [Fp8InputProblem(batch=1, heads=32, q_len=8192, head_dim=128, dtype="float16"),
            Fp8InputProblem(batch=1, heads=32, q_len=8192, head_dim=128, dtype="float16", causal=True),
            Fp8InputProblem(batch=1, heads=32, q_len=8192, head_dim=128, dtype="bfloat16"),
            Fp8InputProblem(batch=4, heads=32, q_len=2048, head_dim=64, dtype="float16")]


def configs(p, arrays, smoke):
    """name -> fn(i, stream), and the reference output (float64 on the host in --smoke, float32 SDPA on the GPU)."""
    q8, k8, v8, sq, sk, sv = arrays
    sim = {} if not smoke else na.get_phase("fp8_overlap").sim_params
    if smoke:
        dec = [decode(a, s).astype(np.float32).astype(np.dtype(p.dtype) if p.dtype == "float16" else np.float32)
               for a, s in ((q8, sq), (k8, sk), (v8, sv))]
        if p.dtype == "bfloat16":
            import ml_dtypes
            dec = [d.astype(ml_dtypes.bfloat16) for d in dec]
        calls = {
            "e4m3-in fp8_overlap": lambda i, s: na.attention_fp8(q8, k8, v8, sq, sk, sv, causal=p.causal,
                                                                 out_dtype=p.dtype, **sim),
            "fp16-in fp8_overlap": lambda i, s: na.attention(*dec, causal=p.causal, phase="fp8_overlap", **sim),
        }
        return calls, reference(p, q8, k8, v8)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = getattr(torch, p.dtype)
    codes = [torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(torch.float8_e4m3fn).cuda()
             for a in (q8, k8, v8)]
    scales = [torch.from_numpy(s).cuda() for s in (sq, sk, sv)]
    dec32 = [c.float() * s[:, :, None, None] for c, s in zip(codes, scales)]
    dec = [d.to(dt) for d in dec32]
    ref = F.scaled_dot_product_attention(*dec32, is_causal=p.causal)
    out = torch.empty_like(dec[0])
    best16 = "ws_tma_q_early" if p.head_dim > 64 else "ws_tma_q_wide"

    def cudnn(i, s):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(*dec, is_causal=p.causal)

    calls = {
        "e4m3-in fp8_overlap": lambda i, s: na.attention_fp8(*codes, *scales, causal=p.causal, out_dtype=p.dtype,
                                                             stream=s),
        "e4m3-in fp8_ws": lambda i, s: na.attention_fp8(*codes, *scales, causal=p.causal, out_dtype=p.dtype,
                                                        phase="fp8_ws", stream=s),
        "e4m3-in fp8_exp_fma": lambda i, s: na.attention_fp8(*codes, *scales, causal=p.causal, out_dtype=p.dtype,
                                                             phase="fp8_exp_fma", stream=s),
        "fp16-in fp8_overlap": lambda i, s: na.attention(*dec, causal=p.causal, phase="fp8_overlap", out=out,
                                                         stream=s),
        f"fp16 {best16}": lambda i, s: na.attention(*dec, causal=p.causal, phase=best16, out=out, stream=s),
        "peer cudnn": cudnn,
    }
    return calls, ref


def rel_error(out, ref) -> float:
    if isinstance(ref, np.ndarray):
        o = np.asarray(out).astype(np.float64)
        return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
    import torch

    o = (out if out is not None else torch.zeros(1)).float()
    return float(torch.linalg.norm(o - ref) / torch.linalg.norm(ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "fp8-inputs.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="small problems in the simulator, host clock")
    args = ap.parse_args()
    smoke = args.smoke or backend.IS_SIMULATOR
    problems = PROBLEMS if not smoke else [p.replace(heads=2, kv_heads=1, q_len=70, kv_len=100, head_dim=32)
                                           for p in PROBLEMS[:2]]
    info = gpu_info()
    method = "host" if smoke else "cupti" if cupti_status() is None else "events"
    cfg = TimingConfig(warmup=3, min_reps=args.calls, max_reps=args.calls, budget_s=2.0, batch_ms=5.0, max_inner=200)
    report = {"gpu": info, "method": method, "rounds": args.rounds, "calls": args.calls,
              "commit": os.environ.get("NUMBA_ATTN_COMMIT", "")[:7] or None, "problems": []}
    stream = cuda.stream()
    for p in problems:
        arrays = (*p.inputs(seed=1), *p.scales())
        calls, ref = configs(p, arrays, smoke)
        row = {"problem": p.label, "errors": {}, "rel_err": {}, "times_ms": {n: [] for n in calls}, "kernels": {}}
        for name, fn in list(calls.items()):  # compile, plan and check outside the timing
            try:
                out = fn(0, stream)
                stream.synchronize()
                row["rel_err"][name] = rel_error(out, ref)
            except Exception as exc:  # noqa: BLE001 - reported, not timed
                row["errors"][name] = str(exc).strip().splitlines()[0]
                del calls[name], row["times_ms"][name]
        order = list(calls)
        for r in range(args.rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                if smoke:
                    t0 = time.perf_counter()
                    calls[name](0, stream)
                    stream.synchronize()
                    row["times_ms"][name].append((time.perf_counter() - t0) * 1e3)
                else:
                    res = cupti_kernel_time(calls[name], stream, cfg, calls=args.calls)
                    row["times_ms"][name].append(res["time_ms"])
                    row["kernels"][name] = res.get("kernels")
        row["median_ms"] = {n: statistics.median(t) for n, t in row["times_ms"].items() if t}
        report["problems"].append(row)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
        base = row["median_ms"].get("peer cudnn")
        print(f"## {p.label}", flush=True)
        for n, t in row["median_ms"].items():
            speed = f"  {base / t:.3f}x cuDNN fp16" if base else ""
            print(f"  {n:24s} {t:.4g} ms{speed}  rel err {row['rel_err'].get(n, float('nan')):.2e}", flush=True)
        for n, e in row["errors"].items():
            print(f"  {n}: {e}", flush=True)
    print(f"{info['gpu']} ({method}): {args.out}")


if __name__ == "__main__":
    main()
