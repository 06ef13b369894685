"""What lies between back-to-back calls on the GPU: every kernel and memory operation of 30 calls at B1 H32 N4096
D128 fp16 (phase=None with and without ``out=``, a named phase, SDPA), from one torch.profiler trace each, and the
idle time between the end of one call's last operation and the start of the next call's first.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-22-host-cost/gaps.py [--out gaps.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import numba_attn as na  # noqa: E402


def device_events(fn, calls):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            out.append((e.time_range.start, e.time_range.end, e.name))
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--shape", default="1,32,4096,128")
    a = ap.parse_args()
    B, H, N, D = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((B, H, N, D), generator=g, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    modes = {
        "phase=None": lambda: na.attention(q, k, v),
        "phase=None, out=": lambda: na.attention(q, k, v, out=o),
        "warp_specialized_tc, out=": lambda: na.attention(q, k, v, phase="warp_specialized_tc", out=o),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    rows = []
    for name, fn in modes.items():
        ev = device_events(fn, a.calls)
        names = sorted({e[2][:60] for e in ev})
        busy = sum(e[1] - e[0] for e in ev)
        span = ev[-1][1] - ev[0][0]
        gaps = [ev[i + 1][0] - ev[i][1] for i in range(len(ev) - 1)]
        row = dict(mode=name, ops=len(ev), ops_per_call=len(ev) / a.calls, names=names, busy_us=busy / a.calls,
                   span_us=span / a.calls, span_ratio=span / busy, gap_median_us=statistics.median(gaps) if gaps else 0,
                   gap_max_us=max(gaps) if gaps else 0, gaps_us=[round(x, 2) for x in gaps[:40]])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "gaps_us"}), flush=True)
        print("   gaps", row["gaps_us"][:20], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(rows=rows, shape=a.shape, torch=torch.__version__,
                           gpu=torch.cuda.get_device_name(), commit=os.environ.get("NUMBA_ATTN_COMMIT")), f, indent=1)


if __name__ == "__main__":
    main()
