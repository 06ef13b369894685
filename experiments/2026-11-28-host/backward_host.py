"""Where a backward call's host time goes on a GPU, with torch tensors as the training run passes them
(B32 H8/2kv N256 D64 fp16 causal): wall time per call with the GPU idle (a sync after each call) and queued
(no sync), the same for the forward with its log-sum-exp, and cProfile of the queued calls (top by own time).
    python experiments/2026-11-28-host/backward_host.py [--calls 50]"""
import argparse
import cProfile
import io
import pstats
import time

import torch

import numba_attn  # noqa: F401  (registers the torch operators)
from numba_attn.integrations import torch_op  # noqa: F401


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--shape", default="32,8,2,256,64")
    args = p.parse_args()
    B, H, Hkv, N, D = map(int, args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.float16, generator=g)
    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g)
    ops = torch.ops.numba_attn
    out, lse = ops.attention_lse(q, k, v, True, None)
    fwd = lambda: ops.attention_lse(q, k, v, True, None)  # noqa: E731
    bwd = lambda: ops.attention_backward(q, k, v, out, lse, do, True, None)  # noqa: E731
    for _ in range(5):
        fwd(), bwd()
    torch.cuda.synchronize()
    for name, fn in (("forward", fwd), ("backward", bwd)):
        t = []
        for _ in range(args.calls):  # the GPU idle at each call
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):  # queued
            fn()
        queued = (time.perf_counter() - t0) / args.calls
        torch.cuda.synchronize()
        gpu = (time.perf_counter() - t0) / args.calls
        t.sort()
        print(f"{name}: host {t[len(t) // 2] * 1e6:.1f} us a call with the GPU idle (median), "
              f"{queued * 1e6:.1f} us queued, {gpu * 1e6:.1f} us a call to the GPU's end", flush=True)
    for name, fn in (("backward", bwd), ("forward", fwd)):
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        print(f"## cProfile, {name}, {args.calls} queued calls\n" + s.getvalue(), flush=True)


if __name__ == "__main__":
    main()
