"""Where a backward call's host time goes on a GPU, with torch tensors as the training run passes them
(B32 H8/2kv N256 D64 fp16 causal): wall time per call with the GPU idle (a sync after each call) and queued
(no sync), the same for the forward with its log-sum-exp and for a training step's attention through autograd
(beside SDPA's), the kernels' device time of both steps, and cProfile of the queued calls (top by own time).
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
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def step():  # a layer's attention in a training step: forward with lse, then the gradients through autograd
        torch_op.differentiable_attention(qg, kg, vg, causal=True).backward(do)

    def sdpa_step():
        torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True).backward(do)

    for _ in range(5):
        fwd(), bwd(), step(), sdpa_step()
    torch.cuda.synchronize()
    def grad_forward():  # the forward alone, its inputs needing gradients (the graph built, not run)
        torch_op.differentiable_attention(qg, kg, vg, causal=True)

    for name, fn in (("forward", fwd), ("backward", bwd), ("forward needing gradients", grad_forward),
                     ("autograd step", step), ("sdpa autograd step", sdpa_step)):
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
    from torch.profiler import ProfilerActivity, profile

    for name, fn in (("autograd step", step), ("sdpa autograd step", sdpa_step)):  # device time of the kernels
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        total = sum(e.device_time for e in kernels) / args.calls
        print(f"{name}: kernels {total:.1f} us a call, {len(kernels) / args.calls:.0f} kernels", flush=True)
        by = {}
        for e in kernels:
            by[e.name[:60]] = by.get(e.name[:60], 0) + e.device_time / args.calls
        for kname, us in sorted(by.items(), key=lambda x: -x[1])[:8]:
            print(f"    {us:8.1f} us  {kname}")
    for name, fn in (("backward", bwd), ("autograd step", step)):
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime" if name == "backward" else "cumtime").print_stats(45)
        print(f"## cProfile, {name}, {args.calls} queued calls\n" + s.getvalue(), flush=True)


if __name__ == "__main__":
    main()
