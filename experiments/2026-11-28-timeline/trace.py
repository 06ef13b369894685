"""Traced calls of the Hopper phases on the two 2048-item problems of ../2026-11-28-ws-intra (B8 H32/8kv N1024 and
B2 H32/8kv N4096, D128 bf16; N1024 causal too): where a work item's 5-9 µs beside its tiles go. Each phase's traced
and untraced kernels are also timed with CUDA events (median of 30 calls, alternated) to show what tracing costs.
    python experiments/2026-11-28-timeline/trace.py OUT_DIR [PHASE,PHASE ...]   (about a minute)
"""
import glob
import json
import os
import sys
import tarfile
import time

import numpy as np
from numba import cuda

from numba_attn.measure.autotune import inputs
from numba_attn.measure.check import kernel_views, to_device
from numba_attn.measure.timeline import trace_phase
from numba_attn.phases.registry import get_phase
from numba_attn.phases.tensor_core.timeline import tracing
from numba_attn.spec.problem import Problem

out = sys.argv[1]
phases = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ws_intra_kv", "ws_intra_persistent", "ws_persistent"]
problems = [Problem(batch=8, heads=32, kv_heads=8, q_len=1024, kv_len=1024, head_dim=128, dtype="bfloat16"),
            Problem(batch=2, heads=32, kv_heads=8, q_len=4096, kv_len=4096, head_dim=128, dtype="bfloat16"),
            Problem(batch=8, heads=32, kv_heads=8, q_len=1024, kv_len=1024, head_dim=128, dtype="bfloat16",
                    causal=True)]


def event_ms(launches, views, n=30):
    """Median ms of each launch, alternated call by call."""
    ts = {k: [] for k in launches}
    for _ in range(n):
        for k, fn in launches.items():
            a, b = cuda.event(), cuda.event()
            a.record()
            fn(*views, 0)
            b.record()
            b.synchronize()
            ts[k].append(cuda.event_elapsed_time(a, b))
    return {k: float(np.median(v)) for k, v in ts.items()}


summaries = []
for p in problems:
    host = inputs(p, 1)
    qd, kd, vd = (to_device(a) for a in host)
    od = cuda.device_array(p.out_shape(), np.uint16)
    views = kernel_views(p, qd, kd, vd, od)
    for name in phases:
        t0 = time.perf_counter()
        try:
            tl = trace_phase(name, p, seed=2)
        except Exception as exc:  # noqa: BLE001
            print(f"{name} {p.label}: {type(exc).__name__}: {exc}", flush=True)
            continue
        ph = get_phase(name)
        plain = ph.plan(p)
        with tracing():
            traced = ph.plan(p)
        ms = event_ms({"plain": plain, "traced": traced}, views)
        s = {**tl.summary(), "event_ms_plain": ms["plain"], "event_ms_traced": ms["traced"]}
        summaries.append(s)
        stem = f"{out}/{name}-{p.label.replace(' ', '_').replace('/', '-')}"
        np.savez_compressed(stem + ".npz", raw=tl.raw, tiles=tl.tiles)
        tl.plot(stem + ".png")
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()}),
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
json.dump(summaries, open(f"{out}/summaries.json", "w"), indent=1)
# (a run returns a few files: the stamps and pictures travel as one archive)
with tarfile.open(f"{out}/traces.tar.gz", "w:gz") as tar:
    for f in sorted(glob.glob(f"{out}/*.npz") + glob.glob(f"{out}/*.png")):
        tar.add(f, arcname=os.path.basename(f))
        os.remove(f)
