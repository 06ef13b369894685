"""tc_wgmma (Hopper wgmma) against tc_pipelined (mma.sync) and PyTorch SDPA on the
issue's prefill shapes, in one process; tile/warpgroup variants of tc_wgmma.

    python3 experiments/2026-11-22-tc-wgmma/tc_wgmma_bench.py [--out DIR] [--deadline SECONDS] [--smoke]

Every row goes through ``numba_attn.measure.row.measure`` (checked against the
float64 reference on two seeds before it is timed; a wrong result is FAIL, not
a time) and SDPA through ``numba_attn.measure.peers.measure_peer``. Rows are printed
(status, time, TFLOP/s, fraction of SDPA, registers, local memory) and
appended to ``DIR/tc_wgmma.jsonl``. ``--smoke`` runs tiny problems (simulator
check of the script itself).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from numba_attn.spec.problem import Problem  # noqa: E402

P = dict(batch=1, heads=32, q_len=4096)
D128 = Problem(**P, head_dim=128, dtype="float16")
D64 = Problem(**P, head_dim=64, dtype="float16")
OVERLAP = [
    (D128, "tc_wgmma", {}),
    (D128, "tc_wgmma_overlap", {}),
    (D128, "tc_wgmma_overlap", {"STAGES": 4}),
    (D128, "tc_wgmma_overlap", {"Bc": 32}),
    (D64, "tc_wgmma", {}),
    (D64, "tc_wgmma_overlap", {}),
    (D64, "tc_wgmma_overlap", {"WG": 1}),
    (D64, "tc_wgmma_overlap", {"Bc": 128}),
    (D128.replace(causal=True), "tc_wgmma", {}),
    (D128.replace(causal=True), "tc_wgmma_overlap", {}),
    (D128.replace(dtype="bfloat16"), "tc_wgmma_overlap", {}),
]
PLAN = [
    (D128, "tc_wgmma", {}),
    (D128, "tc_wgmma", {"Bc": 128}),
    (D128, "tc_wgmma", {"WG": 3}),
    (D128, "tc_wgmma", {"STAGES": 3}),
    (D128, "tc_pipelined", {}),
    (D64, "tc_wgmma", {}),
    (D64, "tc_wgmma", {"Bc": 128}),
    (D64, "tc_wgmma", {"WG": 3}),
    (D64, "tc_pipelined", {}),
    (D128.replace(dtype="bfloat16"), "tc_wgmma", {}),
    (D64.replace(dtype="bfloat16"), "tc_wgmma", {}),
    (D128.replace(causal=True), "tc_wgmma", {}),
    (D64.replace(causal=True), "tc_wgmma", {}),
    (Problem(batch=16, heads=16, q_len=512, head_dim=64, dtype="float16"), "tc_wgmma", {}),
    (Problem(batch=2, heads=8, kv_heads=2, q_len=1000, kv_len=3001, head_dim=128, dtype="float16",
             causal=True), "tc_wgmma", {}),
]
TINY = Problem(batch=1, heads=1, q_len=70, kv_len=150, head_dim=64, dtype="float16")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=200.0, help="seconds after start; later rows are skipped")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--plan", default="wgmma", help="wgmma (variants, first run) | overlap (tc_wgmma_overlap)")
    args = ap.parse_args(argv)
    t_start = time.time()

    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure
    from numba_attn.measure.timing import TimingConfig

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tc_wgmma.jsonl")
    cfg = RunConfig(seeds=(1, 2), timing=TimingConfig(warmup=2, min_reps=5, max_reps=50, budget_s=0.4,
                                                      batch_ms=15.0))

    def write(row):
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    if args.smoke:
        plan = [(TINY, "tc_wgmma", {"WG": 1, "Bc": 16}), (TINY.replace(causal=True), "tc_wgmma", {"WG": 1, "Bc": 32})]
    else:
        plan = OVERLAP if args.plan == "overlap" else PLAN

    sdpa = {}
    if not IS_SIMULATOR:
        from numba_attn.measure.env import environment
        from numba_attn.measure.peers import measure_peer

        write({"type": "env", **environment(" ".join(sys.argv))})
        for prob in sorted({p for p, _, _ in plan}, key=lambda p: p.label):
            r = measure_peer("torch_sdpa", prob, cfg)
            write(r)
            sdpa[prob] = r.get("time_ms")
            print(f"torch_sdpa {prob.label}: {r.get('status')} {r.get('time_ms')} ms "
                  f"{r.get('tflops') or 0:.1f} TFLOP/s {r.get('reason', '')[:80]}", flush=True)

    print(f"{'problem':40s} {'phase':13s} {'params':24s} {'status':6s} {'ms':>8s} {'TF/s':>6s} {'xSDPA':>6s} "
          f"{'regs':>4s} {'local':>5s}", flush=True)
    for prob, name, params in plan:
        if time.time() - t_start > args.deadline:
            print(f"deadline: skipped {prob.label} {name} {params}", flush=True)
            continue
        t0 = time.time()
        row = measure(name, prob, cfg, **params)
        row["wall_s"] = time.time() - t0
        write(row)
        ms = row.get("time_ms")
        ref = sdpa.get(prob)
        print(f"{prob.label:40s} {name:13s} {json.dumps(params):24s} {row['status']:6s} "
              f"{ms or 0:8.3f} {row.get('tflops') or 0:6.1f} {(ref / ms) if (ms and ref) else 0:6.3f} "
              f"{row.get('regs') or 0:4d} {row.get('local_bytes') or 0:5d} "
              f"{'' if row['status'] == 'OK' else row.get('reason', '')[:160]} ({row['wall_s']:.0f}s)", flush=True)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
