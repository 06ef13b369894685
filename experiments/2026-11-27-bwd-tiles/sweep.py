"""bwd_mma's tiles (Br query rows, Bc keys per block) against its default (32, 32) and SDPA's cuDNN backward, CUPTI
kernel time in one process, each configuration checked against torch's float32 gradients first.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-bwd-tiles/sweep.py --out sweep.json

Problems: fp16 B1 H32 N4096, D 64 and 128, causal and not. Records per configuration the time of each kernel
(delta, grad_kv, grad_q), registers and local memory per thread of grad_kv and grad_q, and the max gradient error.
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

TILES = [(16, 16), (32, 32), (64, 32), (32, 64), (64, 64), (128, 64), (64, 128), (128, 128)]


def regs(D, Br, Bc, causal):
    from numba_attn.phases.backward.b02_bwd_mma import make_kernels

    out = {}
    for name, kern in zip(("delta", "grad_kv", "grad_q"), make_kernels(D, Br, Bc, causal, False)):
        try:
            r, lm = kern.get_regs_per_thread(), kern.get_local_mem_per_thread()  # dicts by signature
            out[name] = (max(r.values()) if isinstance(r, dict) else r, max(lm.values()) if isinstance(lm, dict) else lm)
        except Exception as exc:  # noqa: BLE001
            out[name] = str(exc)[:80]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--dims", default="128,64")
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    N = a.N
    for D in map(int, a.dims.split(",")):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(D + causal)
            q, k, v, do = (torch.randn((1, 32, N, D), generator=g, device="cuda", dtype=torch.float16)
                           for _ in range(4))
            o, lse = na.attention(q, k, v, causal=causal, return_lse=True)
            q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.MATH]):
                out32 = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
            ref = torch.autograd.grad(out32, (q32, k32, v32), do.float())
            del out32
            sides = {}
            for Br, Bc in TILES:
                sides[f"bwd_mma {Br}x{Bc}"] = (lambda Br=Br, Bc=Bc: na.attention_backward(
                    q, k, v, o, lse, do, causal=causal, phase="bwd_mma", Br=Br, Bc=Bc))
            qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            sides["SDPA cuDNN"] = lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
            row = {"D": D, "N": N, "causal": causal, "ms": {}, "err": {}, "kernels": {}, "regs": {}}
            for name, fn in list(sides.items()):
                try:
                    got = fn()
                    torch.cuda.synchronize()
                    row["err"][name] = [float((x.float() - r).abs().max()) for x, r in zip(got, ref)]
                    if not all(e < 0.05 for e in row["err"][name]):
                        raise ValueError(f"gradient error {row['err'][name]}")
                except Exception as exc:  # noqa: BLE001
                    row["err"][name] = f"{type(exc).__name__}: {exc}"[:300]
                    sides.pop(name)
            for name in sides:
                if name.startswith("bwd_mma"):
                    Br, Bc = map(int, name.split()[1].split("x"))
                    row["regs"][name] = regs(D, Br, Bc, causal)
            per = {n: [] for n in sides}
            for _ in range(3):
                for name, fn in sides.items():
                    r = cupti_kernel_time((lambda fn: (lambda i: fn()))(fn), stream, TimingConfig(), calls=5)
                    per[name].append(r["time_ms"])
                    row["kernels"][name] = [(kk_["name"][:40], kk_.get("time_ms", kk_.get("ms"))) for kk_ in r.get("kernels", [])]
            row["ms"] = {n: round(statistics.median(t), 4) for n, t in per.items()}
            res["rows"].append(row)
            print(json.dumps({"D": D, "causal": causal, "ms": row["ms"], "regs": row["regs"]}), flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
