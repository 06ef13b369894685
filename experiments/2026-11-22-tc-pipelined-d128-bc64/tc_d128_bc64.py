"""tc_pipelined at D=128: 32-key tiles (static shared memory, the default) against
64-key tiles from dynamic shared memory (Bc=64, > 48 KiB with the opt-in), next
to PyTorch SDPA on the same problem, in one process.

    python3 experiments/2026-11-22-tc-pipelined-d128-bc64/tc_d128_bc64.py [--out DIR] [--deadline SECONDS] [--smoke]

Every row goes through ``numba_attn.measure.row.measure`` (checked against the
float64 reference before it is timed; a wrong result is FAIL, not a time) and
SDPA through ``numba_attn.measure.peers.measure_peer``. Rows are printed (status,
time, TFLOP/s, fraction of SDPA, registers, local memory) and appended to
``DIR/tc_d128.jsonl``. ``--smoke`` runs a tiny problem (simulator check of the
script itself).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from numba_attn.spec.problem import Problem  # noqa: E402

P128H = Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float16")
TINY = Problem(batch=1, heads=1, q_len=21, kv_len=150, head_dim=32, dtype="float16")

ROWS = [
    {},  # the default at D=128: Bc=32, W=8, static shared memory
    {"Bc": 64, "W": 8},
    {"Bc": 64, "W": 4},
    {"Bc": 64, "W": 4, "STAGES": 3},
    {"Bc": 64, "W": 8, "STAGES": 3},
    {"Bc": 32, "W": 8, "DYN": 1},  # control: the default tile from dynamic shared memory
]
CAUSAL_ROWS = [{}, {"Bc": 64, "W": 8}, {"Bc": 64, "W": 4}]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=170.0, help="seconds after start; later rows are skipped")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.time()

    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure
    from numba_attn.measure.timing import TimingConfig

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tc_d128.jsonl")
    cfg = RunConfig(seeds=(1,), timing=TimingConfig(warmup=2, min_reps=5, max_reps=50, budget_s=0.4, batch_ms=15.0))

    def write(row):
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    if args.smoke:
        plan = [(TINY, {"W": 2, "Bc": 16}), (TINY, {"W": 2, "Bc": 64, "DYN": 1}),
                (TINY.replace(causal=True), {"W": 2, "Bc": 64, "DYN": 1})]
    else:
        plan = [(P128H, p) for p in ROWS] + [(P128H.replace(causal=True), p) for p in CAUSAL_ROWS]

    sdpa = {}
    if not IS_SIMULATOR:
        from numba_attn.measure.env import environment
        from numba_attn.measure.peers import measure_peer

        write({"type": "env", **environment(" ".join(sys.argv))})
        for prob in sorted({p for p, _ in plan}, key=lambda p: p.label):
            r = measure_peer("torch_sdpa", prob, cfg)
            write(r)
            sdpa[prob] = r.get("time_ms")
            print(f"torch_sdpa {prob.label}: {r.get('status')} {r.get('time_ms')} ms "
                  f"{r.get('tflops') or 0:.1f} TFLOP/s {r.get('reason', '')[:80]}", flush=True)

    print(f"{'problem':34s} {'params':52s} {'status':6s} {'ms':>8s} {'TF/s':>6s} {'xSDPA':>6s} "
          f"{'regs':>4s} {'local':>5s}", flush=True)
    for prob, params in plan:
        if time.time() - t_start > args.deadline:
            print(f"deadline: skipped {prob.label} {params}", flush=True)
            continue
        t0 = time.time()
        row = measure("tc_pipelined", prob, cfg, **params)
        row["wall_s"] = time.time() - t0
        write(row)
        ms = row.get("time_ms")
        ref = sdpa.get(prob)
        print(f"{prob.label:34s} {json.dumps(row.get('params', params)):52s} {row['status']:6s} "
              f"{ms or 0:8.3f} {row.get('tflops') or 0:6.1f} {(ref / ms) if (ms and ref) else 0:6.3f} "
              f"{row.get('regs') or 0:4d} {row.get('local_bytes') or 0:5d} "
              f"{'' if row['status'] == 'OK' else row.get('reason', '')[:120]} ({row['wall_s']:.0f}s)", flush=True)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
