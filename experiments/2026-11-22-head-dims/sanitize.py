"""Launch every phase once per (head_dim, causal, dtype, GQA) it accepts, on small odd
shapes with random inputs, so that compute-sanitizer can watch every access:

    compute-sanitizer --tool memcheck  python3 sanitize.py [--phases a,b] [--head-dims 40,80]
    compute-sanitizer --tool racecheck python3 sanitize.py --phases tc_pipelined --head-dims 80

Prints one line per launch and a count; the sanitizer prints its own ERROR SUMMARY.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import numpy as np  # noqa: E402

from numba_attn import Problem, list_phases  # noqa: E402
from numba_attn.measure.check import kernel_views, to_device  # noqa: E402

HEAD_DIMS = (32, 40, 64, 80, 96, 112, 128, 160, 192, 256)


def problems(phase, D):
    for causal in (False, True):
        for dtype in phase.dtypes:
            for gqa in (False, True):
                heads = 4 if gqa else 2
                kv_heads = 2 if gqa else 2
                if phase.kind == "decode":
                    yield Problem(batch=2, heads=heads, kv_heads=kv_heads, q_len=3 if causal else 1, kv_len=301,
                                  head_dim=D, causal=causal, dtype=dtype)
                else:
                    yield Problem(batch=1, heads=heads, kv_heads=kv_heads, q_len=77, kv_len=131 if causal else 129,
                                  head_dim=D, causal=causal, dtype=dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="")
    ap.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    a = ap.parse_args()
    names = [x for x in a.phases.split(",") if x]
    dims = [int(x) for x in a.head_dims.split(",")]
    from numba import cuda
    n = failed = 0
    for phase in list_phases():
        if names and phase.name not in names:
            continue
        for D in dims:
            for prob in problems(phase, D):
                if phase.supports(prob) is not None:
                    continue
                q, k, v = prob.inputs(seed=n)
                try:
                    launch = phase.plan(prob)
                    qd, kd, vd = (to_device(x) for x in (q, k, v))
                    od = cuda.device_array(prob.out_shape(), dtype=qd.dtype)
                    launch(*kernel_views(prob, qd, kd, vd, od))
                    cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - a refused launch is reported, the sweep goes on
                    failed += 1
                    print(f"FAILED {phase.name} {prob.label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    if "ILLEGAL" in str(exc) or "LAUNCH_FAILED" in str(exc):
                        raise  # the context is gone: nothing after this would run
                    continue
                n += 1
                print(f"ok {phase.name} {prob.label}", flush=True)
    print(f"{n} launches, {failed} failed")


if __name__ == "__main__":
    main()
