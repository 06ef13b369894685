"""A backward phase (``--phase``, default bwd_mma) with a sliding window against plain causal: does the backward's time follow the tiles it visits?

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-bwd-window/bwd_window.py --out window.json

fp16 B1 H32, D 64 and 128, causal; window 1024 (``sliding_window(1023)``: the row and 1023 keys before it)
and plain causal, N 4096 and 16384. CUPTI kernel time of ``attention_backward`` (o, lse from the forward),
3 rounds interleaved, 5 calls each, median. At N=4096 each side's gradients are checked against float64
torch gradients of the same inputs (the window as a dense boolean mask); larger N only timed after the same
phase passed at N=4096. The visited share of tiles is the block mask's density at bwd_mma's tiles.
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
from numba_attn import variants as V  # noqa: E402
from numba_attn.measure.config import TimingConfig  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="4096,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--phase", default="bwd_mma", help="the backward phase timed")
    a = ap.parse_args()
    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    W = a.window
    for D in map(int, a.dims.split(",")):
        for N in map(int, a.sizes.split(",")):
            g = torch.Generator(device="cuda").manual_seed(N + D)
            q, k, v, do = (torch.randn((1, 32, N, D), generator=g, device="cuda", dtype=torch.float16)
                           for _ in range(4))
            row = {"D": D, "N": N, "window": W, "phase": a.phase, "ms": {}, "err": {}}
            sides = {}
            for name, mask in (("causal", None), (f"causal+window{W}", V.sliding_window(W - 1))):
                o, lse = na.attention(q, k, v, causal=True, mask_mod=mask, return_lse=True)
                sides[name] = (lambda o=o, lse=lse, mask=mask: na.attention_backward(
                    q, k, v, o, lse, do, causal=True, phase=a.phase, mask_mod=mask))
                if N <= 4096:
                    i = torch.arange(N, device="cuda")
                    keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - (W if mask else N + 1))
                    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
                    out64 = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=keep)
                    ref = torch.autograd.grad(out64, (q64, k64, v64), do.double())
                    got = sides[name]()
                    torch.cuda.synchronize()
                    errs = [float((x.double() - r).abs().max()) for x, r in zip(got, ref)]
                    row["err"][name] = errs
                    del out64, q64, k64, v64, ref
                    torch.cuda.empty_cache()
                    if not all(e == e and e < 0.05 for e in errs):
                        sides.pop(name)
            per = {n: [] for n in sides}
            for _ in range(3):
                for name, fn in sides.items():
                    r = cupti_kernel_time((lambda fn: (lambda i: fn()))(fn), stream, TimingConfig(), calls=5)
                    per[name].append(r["time_ms"])
            row["ms"] = {n: round(statistics.median(t), 4) for n, t in per.items()}
            bm = V.create_block_mask(V.sliding_window(W - 1), None, None, N, N, Br=64 if D <= 64 else 32,
                                     Bc=64 if D <= 64 else 32, causal=True)
            row["window_tiles_over_causal"] = round(bm.density() * 2 / (1 + 1 / (N / (64 if D <= 64 else 32))), 4)
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
