"""Launch phases on one problem, twice each (a warm-up launch, then the one to look at), for a profiler:

    ncu --launch-skip 1 --launch-count 1 -k regex:warp_specialized_tc --section WarpStateStats \\
        python3 experiments/2026-11-23-hopper-tma/launch_once.py warp_specialized_tc
    python3 experiments/2026-11-23-hopper-tma/launch_once.py warp_specialized_tc ws_overlap -B 1 -H 32 -N 4096 -D 128

Random inputs; each output is checked against SDPA in float32 on the GPU (torch), so a profile is never of a
launch that computed the wrong thing. Prints one line per phase.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import numpy as np  # noqa: E402

from numba_attn.measure.check import kernel_views, to_device  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("phases", nargs="+")
    ap.add_argument("-B", type=int, default=1)
    ap.add_argument("-H", type=int, default=32)
    ap.add_argument("-N", type=int, default=4096)
    ap.add_argument("-D", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--setup", action="append", default=[], help="a module registering variants (on PYTHONPATH)")
    a = ap.parse_args()
    import importlib
    for mod in a.setup:
        importlib.import_module(mod)
    import torch
    from numba import cuda

    prob = Problem(batch=a.B, heads=a.H, q_len=a.N, head_dim=a.D, causal=a.causal, dtype=a.dtype)
    q, k, v = prob.inputs(seed=1)
    qd, kd, vd = (to_device(x) for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(np.asarray(x, np.float32)).cuda() for x in (q, k, v)), is_causal=a.causal)
    for name in a.phases:
        launch = get_phase(name).plan(prob)
        od = cuda.device_array(prob.out_shape(), dtype=qd.dtype)
        for _ in range(2):
            launch(*kernel_views(prob, qd, kd, vd, od), 0)
        cuda.synchronize()
        out = torch.from_numpy(np.asarray(od.copy_to_host(), np.float32)).cuda()
        err = float((out - ref).abs().max())
        print(f"{name} {launch.params} {prob.label}: max abs error against SDPA fp32 {err:.2e}", flush=True)
        if not err < 2e-2:
            raise SystemExit(f"{name}: wrong result ({err})")


if __name__ == "__main__":
    main()
