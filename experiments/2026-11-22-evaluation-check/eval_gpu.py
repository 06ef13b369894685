"""GPU check of the evaluation side, in one call.

1. the ceilings (FFMA, numba mma.sync f16/tf32, copy, cuBLAS fp16);
2. both timing methods (events around back-to-back launches vs CUDA graph
   replay) on every prefill phase at one problem, and on a launch-bound one;
3. NaN/Inf inputs: does each phase's output have NaN/Inf exactly where the
   float64 reference does (fastmath kernels)?

Writes $OUT/dev.jsonl and prints a short table. Usage (device machine):
    python3 experiments/2026-11-22-evaluation-check/eval_gpu.py
"""
import json
import os
import sys
import time
import traceback

import numba_attn.gpu.backend  # noqa: F401  (chooses the backend first)

import numpy as np
from numba import cuda

from numba_attn.measure import ceilings
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, poison, reference
from numba_attn.phases.registry import list_phases
from numba_attn.measure.check import kernel_views
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure
from numba_attn.measure.timing import TimingConfig

OUT = os.environ.get("OUT", ".")
LOG = open(os.path.join(OUT, "dev.jsonl"), "a")


def log(rec):
    LOG.write(json.dumps(rec, default=str) + "\n")
    LOG.flush()


def main():
    t_start = time.time()
    print("== ceilings", flush=True)
    for r in ceilings.measure_all():
        log(r)
        v = r.get("value")
        print(f"  {r['name']:12s} {r['status']:5s} {v if v is None else round(v, 1)} {r.get('unit')} "
              f"spread={r.get('spread')} {r.get('reason', '')} | {r.get('source', '')}", flush=True)

    print("== timing methods", flush=True)
    timing = TimingConfig(warmup=2, min_reps=5, max_reps=50, budget_s=0.3)
    cases = []
    for ph in list_phases("prefill"):
        p = Problem(batch=1, heads=32, q_len=2048, head_dim=64,
                    dtype="float32" if "float32" in ph.dtypes else ph.dtypes[0])
        cases.append((ph, p))
    smem = [ph for ph in list_phases("prefill") if ph.name == "smem_kv"]
    if smem:
        cases.append((smem[0], Problem(batch=1, heads=1, q_len=64, head_dim=64)))
    for ph, p in cases:
        if time.time() - t_start > 150:
            print("  (time limit: remaining timing cases skipped)")
            break
        try:
            row = measure(ph, p, RunConfig(seeds=(1,), timing=timing, compare_timing=True))
        except Exception as exc:  # noqa: BLE001
            row = {"phase": ph.name, "status": "ERROR", "reason": repr(exc)}
        row["dev"] = "timing"
        log(row)
        tc = row.get("timing_check") or {}
        print(f"  {ph.name:20s} {p.label:28s} {row.get('status'):5s} ev={row.get('time_ms')} "
              f"2nd={tc.get('second_ms')} ({tc.get('second_method')}) diff={tc.get('rel_diff')} "
              f"tol={tc.get('tolerance')} launch_bound={row.get('launch_bound')} "
              f"{tc.get('graph_error', '')} {row.get('reason', '')[:150]}", flush=True)

    print("== NaN/Inf propagation", flush=True)
    for ph in list_phases():
        if time.time() - t_start > 220:
            print("  (time limit: remaining NaN cases skipped)")
            break
        dt = "float32" if "float32" in ph.dtypes else ph.dtypes[0]
        for causal in (False, True):
            p = Problem(batch=1, heads=2, q_len=100 if ph.kind == "prefill" else 1, kv_len=130, head_dim=64,
                        causal=causal, dtype=dt)
            if ph.supports(p):
                continue
            q, k, v = p.inputs(3)
            q[0, 0, min(3, p.q_len - 1), 5] = np.nan
            k[0, 1, 7, 1] = np.inf
            v[0, 0, 11, 2] = np.nan
            ref = reference(q, k, v, causal=causal, scale=p.sm_scale)
            try:
                launch = ph.plan(p)
                qd, kd, vd = (cuda.to_device(a) for a in (q, k, v))
                od = cuda.to_device(poison(np.empty(p.out_shape(), q.dtype), dt))
                launch(*kernel_views(p, qd, kd, vd, od), 0)
                cuda.synchronize()
                out = od.copy_to_host().astype(np.float64)
                c = check(out.astype(q.dtype), ref, dtype=dt, precision=ph.precision)
                rec = {"dev": "nan", "phase": ph.name, "causal": causal, "ok": c.ok, "reason": c.reason,
                       "nan_ref": int(np.isnan(ref).sum()), "nan_out": int(np.isnan(out).sum()),
                       "inf_ref": int(np.isinf(ref).sum()), "inf_out": int(np.isinf(out).sum()),
                       "pattern_equal": bool(np.array_equal(np.isnan(ref), np.isnan(out))
                                             and np.array_equal(np.isinf(ref), np.isinf(out)))}
            except Exception as exc:  # noqa: BLE001
                rec = {"dev": "nan", "phase": ph.name, "causal": causal, "error": repr(exc)[:300]}
            log(rec)
            print(f"  {rec}", flush=True)
    print(f"done in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
