"""The backward phases' times beside SDPA's backward (cuDNN and FlashAttention-2 backends), CUPTI kernel time in one
process, and every side's gradient error against float64 gradients of the same inputs.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-bwd-atomic-variants/bwd_time.py --out bwd.json

Problems: fp16 B1 H32 N4096, D 64 and 128, causal and not. Each side is timed on the backward alone: numba-attn's
``attention_backward(q, k, v, o, lse, do)`` (o, lse from ``attention(return_lse=True)``), SDPA's
``torch.autograd.grad(out, (q, k, v), do, retain_graph=True)`` on an output computed once. 3 rounds interleaved,
5 calls each, median. Errors: max |grad - float64 grad| for dq, dk, dv (float64 torch math SDPA on the fp16
inputs), and each phase's largest ratio to SDPA cuDNN's error on the same gradient.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--phases", default="bwd_two_kernels,bwd_atomic_dq,bwd_mma", help="backward phases to time")
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    N = a.N
    for D in map(int, a.dims.split(",")):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(N + D + causal)
            q, k, v, do = (torch.randn((1, 32, N, D), generator=g, device="cuda", dtype=torch.float16)
                           for _ in range(4))
            o, lse = na.attention(q, k, v, causal=causal, return_lse=True)
            q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.MATH]):
                out64 = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
            ref = torch.autograd.grad(out64, (q64, k64, v64), do.double())
            del out64, q64, k64, v64
            torch.cuda.empty_cache()
            row = {"D": D, "N": N, "causal": causal, "ms": {}, "err": {}, "err_over_cudnn": {}, "kernels": {}}
            sides = {}
            for ph in (p.name for p in na.list_phases("backward") if p.name in a.phases.split(",")):
                sides[ph] = (lambda ph=ph: na.attention_backward(q, k, v, o, lse, do, causal=causal, phase=ph))
            for name, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
                qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                with sdpa_kernel([backend]):
                    out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                sides[name] = (lambda out=out, qq=qq, kk=kk, vv=vv:
                               torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True))
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
            base = row["err"].get("SDPA cuDNN")
            for name, errs in row["err"].items():
                if isinstance(errs, list) and isinstance(base, list):
                    row["err_over_cudnn"][name] = round(max(e / b for e, b in zip(errs, base)), 3)
            per = {n: [] for n in sides}
            for _ in range(3):
                for name, fn in sides.items():
                    r = cupti_kernel_time((lambda fn: (lambda i: fn()))(fn), stream, TimingConfig(), calls=5)
                    per[name].append(r["time_ms"])
                    row["kernels"][name] = [(x["name"][:40], x.get("time_ms")) for x in r.get("kernels", [])]
            row["ms"] = {n: round(statistics.median(t), 4) for n, t in per.items()}
            res["rows"].append(row)
            print(json.dumps({k: row[k] for k in ("D", "causal", "ms", "err_over_cudnn")}), flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
