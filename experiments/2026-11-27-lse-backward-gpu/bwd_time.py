"""The backward phases' first GPU times beside SDPA's backward (cuDNN and FlashAttention-2 backends), CUPTI kernel
time in one process, after a correctness check of every side against the float64-free torch float32 gradients.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-lse-backward-gpu/bwd_time.py --out bwd.json

Problems: fp16 B1 H32 D128 N in (1024, 4096), causal and not. Each side is timed on the backward alone:
numba-attn's ``attention_backward(q, k, v, o, lse, do)`` (o, lse from ``attention(return_lse=True)``), SDPA's
``torch.autograd.grad(out, (q, k, v), do, retain_graph=True)`` on an output computed once.
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
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--phases", default="bwd_naive,bwd_two_kernels,bwd_mma", help="backward phases to time")
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    for N in map(int, a.sizes.split(",")):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(N + causal)
            q, k, v, do = (torch.randn((1, 32, N, 128), generator=g, device="cuda", dtype=torch.float16)
                           for _ in range(4))
            o, lse = na.attention(q, k, v, causal=causal, return_lse=True)
            # float32 torch gradients: the yardstick of every side's error
            q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.MATH]):
                out32 = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
            ref = torch.autograd.grad(out32, (q32, k32, v32), do.float())
            del out32
            row = {"N": N, "causal": causal, "ms": {}, "err": {}}
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
                    row["err"][name] = [float((x.float() - r).abs().max()) for x, r in zip(got, ref)]
                except Exception as exc:  # noqa: BLE001
                    row["err"][name] = f"{type(exc).__name__}: {exc}"[:300]
                    sides.pop(name)
            per = {n: [] for n in sides}
            for _ in range(3):
                for name, fn in sides.items():
                    per[name].append(cupti_kernel_time((lambda fn: (lambda i: fn()))(fn), stream, TimingConfig(),
                                                       calls=5)["time_ms"])
            row["ms"] = {n: round(statistics.median(t), 4) for n, t in per.items()}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
