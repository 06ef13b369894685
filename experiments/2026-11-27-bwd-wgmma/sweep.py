"""bwd_wgmma's and bwd_wgmma_overlap's tiles (Br/Bc/stages) beside SDPA cuDNN's backward: CUPTI kernel time per kernel, one process.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-bwd-wgmma/sweep.py --out sweep.json

fp16 B1 H32 N4096, D 64 and 128, causal and not. Each configuration's gradients are first checked against float64
torch gradients of the same inputs (max error < 0.05, finite); 3 rounds interleaved, 5 calls each, median; the
per-kernel times of the last round are kept (row statistics, grad_kv, grad_q).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn.measure.config import TimingConfig  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402

CONFIGS = {"bwd_wgmma 64/64/2": dict(Br=64, Bc=64, stages=2), "bwd_wgmma 32/64/2": dict(Br=32, Bc=64, stages=2),
           "bwd_wgmma_overlap 64/64/2": dict(Br=64, Bc=64, stages=2),
           "bwd_wgmma_overlap 32/64/2": dict(Br=32, Bc=64, stages=2),
           "bwd_wgmma_overlap 32/128/2": dict(Br=32, Bc=128, stages=2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--configs", default=None,
                    help='JSON {"phase label": {params}} in place of the built-in list (the label\'s first word: the phase)')
    a = ap.parse_args()
    configs = json.loads(a.configs) if a.configs else CONFIGS
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = getattr(torch, a.dtype)
    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    N = a.N
    for D in map(int, a.dims.split(",")):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(N + D + causal)
            q, k, v, do = (torch.randn((1, 32, N, D), generator=g, device="cuda", dtype=dt) for _ in range(4))
            o, lse = na.attention(q, k, v, causal=causal, return_lse=True)
            q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.MATH]):
                out64 = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
            ref = torch.autograd.grad(out64, (q64, k64, v64), do.double())
            del out64, q64, k64, v64
            torch.cuda.empty_cache()
            row = {"D": D, "N": N, "causal": causal, "dtype": a.dtype, "ms": {}, "err": {}, "kernels": {}}
            sides = {}
            for name, params in configs.items():
                phase = name.split()[0]
                reason = na.get_phase(phase).supports(
                    na.Problem(batch=1, heads=32, q_len=N, head_dim=D, dtype=a.dtype, causal=causal), **params)
                if reason:
                    row["err"][name] = reason
                    continue
                sides[name] = (lambda params=params, phase=phase: na.attention_backward(
                    q, k, v, o, lse, do, causal=causal, phase=phase, **params))
            qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            sides["SDPA cuDNN"] = lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
            for name, fn in list(sides.items()):
                try:
                    got = fn()
                    torch.cuda.synchronize()
                    errs = [float((x.double() - r).abs().max()) for x, r in zip(got, ref)]
                    if not all(e == e and e < 0.05 for e in errs):
                        raise ValueError(f"gradient error {errs}")
                    row["err"][name] = errs
                except Exception as exc:  # noqa: BLE001
                    row["err"][name] = f"{type(exc).__name__}: {exc}"[:300]
                    sides.pop(name)
            per = {n: [] for n in sides}
            for _ in range(3):
                for name, fn in sides.items():
                    r = cupti_kernel_time((lambda fn: (lambda i: fn()))(fn), stream, TimingConfig(), calls=5)
                    per[name].append(r["time_ms"])
                    row["kernels"][name] = [(x["name"][-30:], x.get("time_ms")) for x in r.get("kernels", [])]
            row["ms"] = {n: round(statistics.median(t), 4) for n, t in per.items()}
            res["rows"].append(row)
            print(json.dumps({kk_: row[kk_] for kk_ in ("D", "causal", "ms")}), flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
