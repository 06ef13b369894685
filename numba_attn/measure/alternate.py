"""An independent check of the runner's ratio: one phase and one SDPA backend timed alternately, by code that
shares nothing with the runner's timing but the method (kernel durations from CUPTI through ``torch.profiler``).

Round r: the two implementations in turn (the first one alternating per round), each ``warmup`` calls, then
``calls`` calls in a profiler session of its own, optionally after ``idle_s`` seconds of an idle GPU (a burst
after idle). A segment's time is the device kernels' durations summed over the session (``key_averages``), per
call. The result: each round's times and ratio (phase / peer), their median and range, and NVML's SM clock and
power before and after each side's segments (mean). The phase runs on the same inputs (torch's tensors; for
bf16 copies of their bits) on PyTorch's current stream, its output compared with SDPA's first.
``tests/test_regime.py`` holds the runner's ratio to it; ``experiments/2026-11-28-regime/compare.sh`` runs it
from the command line::

    python -m numba_attn.measure.alternate --phase warp_specialized_tc --backend cudnn -B 1 -H 32 -N 4096 -D 128
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

_NOT_KERNELS = ("memcpy",)  # copies left out; a memset is a call's work (the same rule as cupti.py, kept apart)


def _device_us(prof) -> float:
    """The device kernels' durations in a profile, summed (µs; copies left out, memsets kept as cupti.py keeps them)."""
    total = 0.0
    for a in prof.key_averages():
        if str(getattr(a, "device_type", "")).split(".")[-1] != "CUDA":
            continue
        if str(getattr(a, "key", "")).lower().startswith(_NOT_KERNELS):
            continue
        t = getattr(a, "self_device_time_total", None)
        total += float(t if t is not None else getattr(a, "self_cuda_time_total", 0.0) or 0.0)
    return total


def _segment(torch, call, warmup: int, calls: int, idle_s: float, mon) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    if idle_s:
        time.sleep(idle_s)
    start = mon.sample() if mon else None
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    end = mon.sample() if mon else None
    return {"time_ms": _device_us(prof) / calls / 1e3, "start": start, "end": end}


def _calls(torch, problem, phase: str, backend: str, params=None):
    """``(phase_call, peer_call, peer_context)`` on one set of inputs, the phase's output checked against SDPA's."""
    from numba import cuda
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numba_attn.phases.registry import get_phase

    p = problem
    tdt = getattr(torch, p.dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(p.batch, p.heads, p.q_len, p.head_dim, device="cuda", dtype=tdt, generator=gen)
    k, v = (torch.randn(p.batch, p.kv_heads, p.kv_len, p.head_dim, device="cuda", dtype=tdt, generator=gen)
            for _ in range(2))
    o = torch.empty_like(q)
    ph = get_phase(phase)
    launch = ph.plan(p, **ph.resolve_params(dict(params or {})))
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)

    def view(t, heads, n):
        t = t.reshape(p.batch * heads, n, p.head_dim)
        if p.dtype == "bfloat16":  # numba takes bfloat16 as its 16-bit pattern (uint16), as the runner passes it
            return cuda.to_device(t.view(torch.int16).cpu().numpy().view("uint16"))
        return cuda.as_cuda_array(t)

    args = (view(q, p.heads, p.q_len), view(k, p.kv_heads, p.kv_len), view(v, p.kv_heads, p.kv_len),
            view(o, p.heads, p.q_len))

    def output():
        if p.dtype != "bfloat16":
            return o
        bits = torch.from_numpy(args[3].copy_to_host().view("int16")).to("cuda")
        return bits.view(torch.bfloat16).reshape(o.shape)
    kw = {"scale": p.sm_scale, "is_causal": bool(p.causal)}
    if p.kv_heads != p.heads:
        kw["enable_gqa"] = True
    enum = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}[backend]

    def peer_context():
        return sdpa_kernel([getattr(SDPBackend, enum)])

    def phase_call():
        launch(*args, stream)

    def peer_call():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)

    with torch.no_grad(), peer_context():
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    phase_call()
    torch.cuda.synchronize()
    err = ((output().float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 3e-2:
        raise RuntimeError(f"{phase} and SDPA {backend} disagree: relative error {err:.2e}")
    return phase_call, peer_call, peer_context


def measure(problem, phase: str, backend: str = "cudnn", *, rounds: int = 5, warmup: int = 3, calls: int = 10,
            idle_s: float = 0.0, params=None) -> dict:
    """Time ``phase`` and SDPA ``backend`` on ``problem`` alternately (see the module docstring)."""
    import torch

    from numba_attn.measure import nvml

    mon = nvml.monitor()
    phase_call, peer_call, peer_context = _calls(torch, problem, phase, backend, params)
    sides = {"phase": (phase_call, None), "peer": (peer_call, peer_context)}
    segs: dict = {"phase": [], "peer": []}
    with torch.no_grad():
        for r in range(rounds):
            for side in (("phase", "peer") if r % 2 == 0 else ("peer", "phase")):
                call, ctx = sides[side]
                if ctx is None:
                    segs[side].append(_segment(torch, call, warmup, calls, idle_s, mon))
                else:
                    with ctx():
                        segs[side].append(_segment(torch, call, warmup, calls, idle_s, mon))
    times = {s: [x["time_ms"] for x in segs[s]] for s in segs}
    ratios = [a / b for a, b in zip(times["phase"], times["peer"])]
    out = {"phase": phase, "peer": f"torch_sdpa_{backend}", "problem": problem.to_dict(), "label": problem.label,
           "rounds": rounds, "warmup": warmup, "calls": calls, "idle_s": idle_s, "times_ms": times,
           "time_ms": {s: statistics.median(t) for s, t in times.items()}, "ratios": ratios,
           "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "nvml": {s: nvml.row_fields([(x["start"], x["end"]) for x in segs[s]], mon.note) for s in segs}}
    out["ratio_of_medians"] = out["time_ms"]["phase"] / out["time_ms"]["peer"]
    return out


def main(argv=None) -> int:
    from numba_attn.spec.problem import Problem

    ap = argparse.ArgumentParser(prog="python -m numba_attn.measure.alternate", description=__doc__.split("\n")[0])
    ap.add_argument("--phase", default="warp_specialized_tc")
    ap.add_argument("--backend", default="cudnn", choices=["cudnn", "flash", "efficient"])
    for flag, default in (("-B", 1), ("-H", 32), ("-N", 4096), ("-D", 128)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds of idle GPU before each segment")
    ap.add_argument("--out", default=None, help="JSON file (default: stdout)")
    a = ap.parse_args(argv)
    prob = Problem(batch=a.B, heads=a.H, q_len=a.N, head_dim=a.D, dtype=a.dtype, causal=a.causal)
    res = measure(prob, a.phase, a.backend, rounds=a.rounds, warmup=a.warmup, calls=a.calls, idle_s=a.idle)
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    print(f"{a.phase} / torch_sdpa_{a.backend} [{prob.label}]: {res['ratio']:.3f} (rounds {res['ratio_min']:.3f}"
          f"-{res['ratio_max']:.3f}); {res['time_ms']['phase']:.4f} ms / {res['time_ms']['peer']:.4f} ms",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
