"""A phase and PyTorch SDPA timed by the three methods (events, graph replay, CUPTI kernel time) on
the problems of issue 16 where the runner's SDPA time disagreed with CUPTI.

    python3 experiments/2026-11-22-cupti/check.py [--out FILE.jsonl] [--phase tc_wgmma] [--smoke]

Per problem (B2 H16 N8192 D128 causal fp16, B1 H32 N4096 D128 fp16) and per method, the phase's row
(``numba_attn.measure.row.measure``) and SDPA's (``numba_attn.measure.peers.measure_peer``, PyTorch
choosing the backend, then cuDNN explicitly), each checked against the float64 reference before it is
timed. Then a cold burst of SDPA: 3 s idle, then 5 profiled calls (CUPTI), the way a short profiling
script measures; set beside the runner's sustained CUPTI time it tells whether clocks under sustained
load explain a difference. Prints a table (time, events time, CUPTI time, backend that ran, kernels per
call) and appends every row as a JSON line to ``--out``. ``--smoke``: a tiny problem in the simulator
(checks the script; nothing is timed there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from numba_attn.spec.problem import Problem  # noqa: E402

PROBLEMS = [Problem(batch=2, heads=16, q_len=8192, head_dim=128, dtype="float16", causal=True),
            Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float16")]
METHODS = ("events", "graph", "cupti")
PEERS = ("torch_sdpa", "torch_sdpa_cudnn")


def _fmt(ms):
    return "—" if ms is None else f"{ms:.3f}"


def cold_burst(prob: Problem) -> dict:
    """SDPA after 3 s idle: 5 calls profiled by CUPTI (one warm call before, outside)."""
    import numpy as np
    import torch
    from numba import cuda

    from numba_attn.measure.peers import _sdpa_kwargs, sdpa_backend_from_kernels
    from numba_attn.measure.timing import TimingConfig, cupti_kernel_time

    q, k, v = (torch.from_numpy(np.asarray(a, dtype=np.float32)).to("cuda", torch.float16)
               for a in prob.inputs(1))
    kw = _sdpa_kwargs(torch, prob)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    with torch.no_grad():
        sdpa(q, k, v, **kw)
        torch.cuda.synchronize()
        time.sleep(3.0)
        c = cupti_kernel_time(lambda i: sdpa(q, k, v, **kw), stream, TimingConfig(warmup=1), calls=5)
    return {"type": "cold_burst", "label": prob.label, "problem": prob.to_dict(), "time_cupti_ms": c["time_ms"],
            "time_min_ms": c["time_min_ms"], "time_max_ms": c["time_max_ms"], "cupti_kernels": c["kernels"],
            "sdpa_backend_ran": sdpa_backend_from_kernels([x["name"] for x in c["kernels"]])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="cupti_check.jsonl", help="JSON-lines file to append to")
    ap.add_argument("--phase", default="tc_wgmma", help="the phase to time beside SDPA (default tc_wgmma)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per row")
    ap.add_argument("--smoke", action="store_true", help="a tiny problem in the simulator")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["NUMBA_ATTN_BACKEND"] = "simulator"
    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.env import environment
    from numba_attn.measure.peers import measure_peer
    from numba_attn.measure.row import measure
    from numba_attn.measure.timing import TimingConfig

    problems = [Problem(batch=1, heads=2, q_len=64, head_dim=64, dtype="float16", causal=True)] if args.smoke \
        else PROBLEMS
    phase = "tc_mma" if args.smoke else args.phase
    out = open(args.out, "a")
    out.write(json.dumps({"type": "env", **environment(" ".join(sys.argv))}, default=str) + "\n")
    print(f"{'row':28s} {'problem':34s} {'method':7s} {'time':>8s} {'events':>8s} {'cupti':>8s} "
          f"{'backend':9s} {'k/call':>6s}  check")
    for prob in problems:
        for method in METHODS:
            cfg = RunConfig(seeds=(1,), timing=TimingConfig(method=method, budget_s=args.budget))
            rows = [measure(phase, prob, cfg)]
            if not IS_SIMULATOR:
                rows += [measure_peer(p, prob, cfg) for p in PEERS]
            for r in rows:
                r["check_method"] = method
                out.write(json.dumps(r, default=str) + "\n")
                out.flush()
                tc = r.get("timing_check") or {}
                note = r.get("reason", "") if r.get("status") != "OK" else (
                    tc.get("warning") or r.get("timing_fallback") or r.get("graph_error") or "")
                print(f"{r['phase']:28s} {prob.label:34s} {method:7s} {_fmt(r.get('time_ms')):>8s} "
                      f"{_fmt(r.get('events_ms', r.get('time_ms') if method == 'events' else None)):>8s} "
                      f"{_fmt(r.get('time_cupti_ms')):>8s} {str(r.get('sdpa_backend_ran', '')):9s} "
                      f"{str(r.get('cupti_kernels_per_call', '')):>6s}  {r.get('status')} {note}"[:300],
                      flush=True)
        if not IS_SIMULATOR:
            b = cold_burst(prob)
            out.write(json.dumps(b, default=str) + "\n")
            print(f"{'torch_sdpa cold burst':28s} {prob.label:34s} {'cupti':7s} {_fmt(b['time_cupti_ms']):>8s} "
                  f"{'':>8s} {_fmt(b['time_cupti_ms']):>8s} {str(b['sdpa_backend_ran']):9s}", flush=True)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
