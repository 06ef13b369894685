"""Launch the paged phases once per cache format, scale, page size, GQA and ragged layout they accept, with
their default parameters and with ``wide`` forced both ways (``mma`` off) and ``mma`` forced on, on small odd shapes with random inputs (pages
out of order, a partly filled last page), so that compute-sanitizer can watch every access:

    compute-sanitizer --tool memcheck python3 experiments/2026-11-23-paged-8bit/sanitize.py [--phases a,b]
        [--prefetch]

``--prefetch``: instead, only paged_split_k's ``mma`` path with ``prefetch`` 1 and 2 (one and two splits, so that
the warps have steps ahead to prefetch), on ragged fp8/head and int8/token caches at D 128 (fewer kernels to
compile under the sanitizer; at D 64 and for the other scales the prefetched elements are checked in the
simulator, tests/test_paged_bandwidth.py).

Prints one line per launch and a count; the sanitizer prints its own ERROR SUMMARY.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from numba_attn.measure.check import kernel_views, to_device  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402
from numba_attn.spec.problem import PagedProblem  # noqa: E402

CACHES = (("", "head"), ("float8_e4m3", "tensor"), ("float8_e4m3", "head"), ("int8", "head"), ("int8", "token"))


def problems(caches=CACHES, dims=(64, 128), raggeds=(False, True)):
    for kv_dtype, scale in caches:
        for page in (16, 64):
            for heads, kv_heads in ((4, 4), (8, 2)):
                for ragged in raggeds:
                    for D in dims:
                        yield PagedProblem(batch=3, heads=heads, kv_heads=kv_heads, q_len=1, kv_len=301, head_dim=D,
                                           dtype="float16", page_size=page, kv_dtype=kv_dtype, kv_scale=scale,
                                           ragged=ragged)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="paged_split_k,paged_mma")
    ap.add_argument("--prefetch", action="store_true")
    a = ap.parse_args()
    from numba import cuda

    n = failed = 0
    for name in a.phases.split(","):
        phase = get_phase(name)
        variants = [{}] + ([{"wide": True, "mma": False}, {"wide": False, "mma": False}, {"mma": True}]
                           if "wide" in phase.params else [])
        probs = problems()
        if a.prefetch:
            if "prefetch" not in phase.params:
                continue
            variants = [{"mma": True, "prefetch": 1, "splits": 1}, {"mma": True, "prefetch": 2, "splits": 2}]
            probs = problems((("float8_e4m3", "head"), ("int8", "token")), (128,), (True,))
        for prob in probs:
            for params in variants:
                if phase.supports(prob, **phase.resolve_params(params)) is not None:
                    continue
                q, k, v = prob.inputs(seed=n)
                try:
                    launch = phase.plan(prob, **params)
                    qd, kd, vd = (to_device(x) for x in (q, k, v))
                    od = cuda.device_array(prob.out_shape(), dtype=qd.dtype)
                    launch(*kernel_views(prob, qd, kd, vd, od), 0)
                    cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - a refused launch is reported, the sweep goes on
                    failed += 1
                    print(f"FAILED {name} {params} {prob.label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    if "ILLEGAL" in str(exc) or "LAUNCH_FAILED" in str(exc):
                        raise
                    continue
                n += 1
                print(f"ok {name} {launch.params} {prob.label}", flush=True)
    print(f"{n} launches, {failed} failed")


if __name__ == "__main__":
    main()
