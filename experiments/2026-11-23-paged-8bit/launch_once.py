"""Launch paged_split_k on the 8-bit target problems (B8 H32 D128 P64, KV 16k), twice per variant (a warm-up
launch, then the one to look at), for a profiler:

    ncu -k regex:paged --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        python3 experiments/2026-11-23-paged-8bit/launch_once.py

Variants: wide (the default there) and two codes per load. The two outputs of each problem are compared with
each other (two decoders of the same bytes) and must agree to fp16 rounding, so a profile is never of a launch
that computed something else; the runner rows of results/paged-8bit-wide-nvidia-h200.jsonl are the ones checked
against the float64 reference. Prints one line per problem.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import numpy as np  # noqa: E402

from numba_attn.measure.check import kernel_views, to_device  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402
from numba_attn.spec.problem import PagedProblem  # noqa: E402


def main():
    from numba import cuda

    phase = get_phase("paged_split_k")
    for kv_dtype, scale in (("float8_e4m3", "head"), ("int8", "token")):
        prob = PagedProblem(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64,
                            kv_dtype=kv_dtype, kv_scale=scale)
        q, k, v = prob.inputs(seed=1)
        qd, kd, vd = (to_device(x) for x in (q, k, v))
        outs = []
        for wide in (True, False):
            launch = phase.plan(prob, wide=wide)
            od = cuda.device_array(prob.out_shape(), dtype=qd.dtype)
            for _ in range(2):
                launch(*kernel_views(prob, qd, kd, vd, od), 0)
            cuda.synchronize()
            outs.append(od.copy_to_host().astype(np.float32))
        diff = float(np.abs(outs[0] - outs[1]).max())
        print(f"{prob.label}: wide against two codes per load, max abs difference {diff:.2e}", flush=True)
        if not diff < 1e-2:
            raise SystemExit(f"{prob.label}: the two decoders disagree ({diff})")


if __name__ == "__main__":
    main()
