"""Tune/measure the CUDA-core roadmap phases on the GPU in one call.

    python3 experiments/2026-11-22-roadmap-tuning/roadmap_tune.py PLAN [--out DIR] [--deadline SECONDS]

PLAN names a list in ``PLANS`` below: (phase, problem, params) rows measured
in order with ``numba_attn.measure.row.measure`` (check against the float64
reference, then events timing), after the FFMA ceiling and the SDPA peer of
the same run. A row that would start after the deadline is skipped, so the
call ends inside its time limit with what it measured so far. Each row is
printed as one line (time, TFLOP/s, fraction of SDPA, registers, local
memory) and appended to ``DIR/PLAN.jsonl``; ``--sass PHASE`` also writes the
SASS of that phase's first configuration to ``DIR/PHASE.sass``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from numba_attn.spec.problem import Problem  # noqa: E402

P64 = Problem(batch=1, heads=32, q_len=4096, head_dim=64)
P128 = Problem(batch=1, heads=32, q_len=4096, head_dim=128)
P64C = P64.replace(causal=True)
P64H = P64.replace(dtype="float16")
P128C = P128.replace(causal=True)
P128H = P128.replace(dtype="float16")


def rb(Br, Bc, TM=4, TN=4, maxreg=0):
    return {"Br": Br, "Bc": Bc, "TM": TM, "TN": TN, "maxreg": maxreg}


TINY = Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16)

PLANS = {
    # the script itself, in the simulator
    "smoke": [("register_blocked", TINY, {"Br": 32, "Bc": 16}), ("causal_skip", TINY.replace(causal=True),
                                                                  {"Br": 32, "Bc": 16})],
    # first call: every phase once, the register-blocked configurations, the SEG trade-off
    "tune1": (
        [("register_blocked", P64, rb(*c)) for c in [
            (64, 32), (128, 32), (64, 64), (128, 64), (128, 32, 4, 8), (128, 32, 8, 4), (64, 16),
            (64, 32, 4, 4, 128)]]
        + [("causal_skip", P64, {}), ("causal_skip", P64C, {}), ("causal_skip", P64C, {"heavy_first": 0}),
           ("register_blocked", P64C, {})]
        + [("q_smem", P64, {})]
        + [("segmented_out", P64, {"SEG": s}) for s in (64, 32, 16)]
        + [("one_barrier", P64, {}), ("warp_specialized", P64, {}), ("vectorized", P64, {}),
           ("double_buffer", P64, {})]
        + [("register_blocked", P128, rb(*c)) for c in [(128, 32), (64, 32), (64, 64)]]
        + [("smem_kv", P128, {}), ("q_smem", P128, {})]
        + [("segmented_out", P128, {"SEG": s}) for s in (64, 32)]
        + [("causal_skip", P64H, {})]
    ),
    # second call: the whole roadmap at D=64 and D=128 with its variants, in one run (the
    # defaults are then set to the best rows of this run)
    "final": (
        [("register_blocked", P64, rb(*c)) for c in [
            (128, 32, 4, 8), (128, 64, 4, 8), (64, 64, 4, 8), (128, 32, 4, 8, 168), (128, 32, 4, 4)]]
        + [("causal_skip", P64, {}), ("causal_skip", P64C, {}), ("register_blocked", P64C, {}),
           ("causal_skip", P64C, {"heavy_first": 0}), ("causal_skip", P64H, {})]
        + [("naive", P64, {}), ("fused_rowwise", P64, {}), ("smem_kv", P64, {})]
        + [("register_blocked", P128, rb(*c)) for c in [(128, 32, 4, 4), (128, 64, 4, 4), (64, 64, 4, 4)]]
        + [("causal_skip", P128, {}), ("causal_skip", P128C, {}), ("causal_skip", P128H, {})]
        + [("naive", P128, {}), ("fused_rowwise", P128, {}), ("smem_kv", P128, {})]
        + [("q_smem", P64, {"Br": b}) for b in (128, 64)]
        + [("segmented_out", P64, {"SEG": s}) for s in (64, 32)]
        + [(n, P64, {"SEG": s}) for n in ("one_barrier", "warp_specialized", "vectorized", "double_buffer")
           for s in (64, 32)]
        + [("warp_specialized", P64, {"SEG": 64, "LW": 2}), ("vectorized", P64, {"SEG": 64, "Br": 128}),
           ("double_buffer", P64, {"SEG": 64, "Br": 128})]
        + [("q_smem", P128, {"Br": b}) for b in (128, 64)]
        + [("segmented_out", P128, {"SEG": s}) for s in (128, 64)]
        + [(n, P128, {"SEG": s}) for n in ("one_barrier", "warp_specialized", "vectorized", "double_buffer")
           for s in (128, 64)]
    ),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan", choices=sorted(PLANS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=360.0, help="seconds after start; later rows are skipped")
    ap.add_argument("--sass", action="append", default=[], help="phase whose first row's SASS to write")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.time()

    from numba_attn.gpu.backend import IS_SIMULATOR
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure
    from numba_attn.measure.timing import TimingConfig

    if IS_SIMULATOR:
        print("simulator backend: timings are meaningless; running the checks only")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.plan}.jsonl")
    cfg = RunConfig(seeds=(1,), timing=TimingConfig(warmup=2, min_reps=5, max_reps=50, budget_s=0.4, batch_ms=15.0))

    def write(row):
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    sdpa = {}
    if not IS_SIMULATOR:
        from numba_attn.measure.ceilings import measure_ffma
        from numba_attn.measure.env import environment

        write({"type": "env", **environment(" ".join(sys.argv))})
        row = measure_ffma()
        write(row)
        print(f"FFMA ceiling: {row.get('tflops', 0):.1f} TFLOP/s ({row.get('status')})", flush=True)
        if not args.no_peer:
            from numba_attn.measure.peers import measure_peer

            for prob in sorted({p for _, p, _ in PLANS[args.plan]}, key=lambda p: p.label):
                if prob.dtype != "float32":
                    continue
                r = measure_peer("torch_sdpa", prob, cfg)
                write(r)
                sdpa[prob] = r.get("time_ms")
                print(f"torch_sdpa {prob.label}: {r.get('status')} {r.get('time_ms')} ms "
                      f"{r.get('tflops') or 0:.1f} TFLOP/s {r.get('reason', '')[:80]}", flush=True)

    sass_done = set()
    print(f"{'phase':18s} {'problem':28s} {'params':44s} {'status':6s} {'ms':>8s} {'TF/s':>6s} "
          f"{'xSDPA':>6s} {'regs':>4s} {'local':>5s}", flush=True)
    for name, prob, params in PLANS[args.plan]:
        if time.time() - t_start > args.deadline:
            print(f"deadline: skipped {name} {prob.label} {params}", flush=True)
            continue
        t0 = time.time()
        row = measure(name, prob, cfg, **params)
        row["wall_s"] = time.time() - t0
        write(row)
        ms = row.get("time_ms")
        ref = sdpa.get(prob)
        print(f"{name:18s} {prob.label:28s} {json.dumps(row.get('params', params)):44s} {row['status']:6s} "
              f"{ms or 0:8.3f} {row.get('tflops') or 0:6.2f} {(ref / ms) if (ms and ref) else 0:6.2f} "
              f"{row.get('regs') or 0:4d} {row.get('local_bytes') or 0:5d} "
              f"{'' if row['status'] == 'OK' else row.get('reason', '')[:100]} ({row['wall_s']:.0f}s)", flush=True)
        if name in args.sass and name not in sass_done and not IS_SIMULATOR and row["status"] == "OK":
            sass_done.add(name)
            try:
                from numba_attn.phases.registry import get_phase

                launch = get_phase(name).plan(prob, **params)
                kern = launch.kernels[0]
                sig = next(iter(kern.overloads))
                with open(os.path.join(args.out, f"{name}.sass"), "w") as f:
                    f.write(kern.inspect_sass(sig))
            except Exception as exc:  # noqa: BLE001 - a missing disassembler must not end the run
                print(f"SASS of {name}: {type(exc).__name__}: {exc}", flush=True)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
