"""Decode with a sliding window: the split-K phases divide only the keys the window leaves (variants/spans.py),
against the same phase without a mask and SDPA with the window as a dense boolean mask. CUPTI kernel time of
all kernels of a call, one process, each output checked against SDPA's float32 math on the same mask first.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-decode-window/window.py --out window.json
    NUMBA_ATTN_BACKEND=cuda compute-sanitizer --tool memcheck python3 .../window.py --small --out s.json

fp16 B1 H32/8kv D128, one query, KV 8k and 32k, window 1024 (the query sees its last 1024 keys).
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
    ap.add_argument("--small", action="store_true", help="a small problem for compute-sanitizer")
    a = ap.parse_args()
    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    W = 64 if a.small else 1024
    for N in ((777,) if a.small else (8192, 32768)):
        g = torch.Generator(device="cuda").manual_seed(N)
        q = torch.randn((1, 32, 1, 128), generator=g, device="cuda", dtype=torch.float16)
        k, v = (torch.randn((1, 8, N, 128), generator=g, device="cuda", dtype=torch.float16) for _ in range(2))
        dense = torch.arange(N, device="cuda")[None, :] > (N - 1) - W  # row 0 = q_idx N-1 sees keys > N-1-W
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense,
                                                                enable_gqa=True)
        window = V.sliding_window(W - 1)  # W keys: the query's own and the W - 1 before it (the dense mask's)
        sides = {}
        for ph in ("decode_split_k", "decode_split_k_fused", "decode_mma"):
            o = torch.empty_like(q)
            sides[f"{ph} window"] = (lambda ph=ph, o=o: na.attention(q, k, v, phase=ph, mask_mod=window, out=o))
            sides[f"{ph} plain"] = (lambda ph=ph, o=o: na.attention(q, k, v, phase=ph, out=o))
        sides["SDPA dense mask"] = lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=dense, enable_gqa=True)
        row = {"N": N, "window": W, "ms": {}, "err": {}}
        for name, fn in list(sides.items()):
            out = fn()
            torch.cuda.synchronize()
            if "plain" not in name:
                err = float((out.float() - want).abs().max())
                row["err"][name] = err
                if not err < 2e-2:
                    print(f"FAIL {name} N={N}: max error {err}", flush=True)
                    sides.pop(name)
        if not a.small:
            per = {n: [] for n in sides}
            for _ in range(3):
                for name, fn in sides.items():
                    per[name].append(cupti_kernel_time((lambda fn: (lambda i: fn()))(fn), stream, TimingConfig(),
                                                       calls=10)["time_ms"])
            row["ms"] = {n: round(statistics.median(t), 4) for n, t in per.items()}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    bad = [n for r in res["rows"] for n, e in r["err"].items() if not e < 2e-2]
    print("ALL OK" if not bad else f"FAILED: {bad}")


if __name__ == "__main__":
    main()
