"""Tensor-core phases on the GPU: correctness, time, resources, SASS, and the
mma.sync throughput ceiling, side by side with PyTorch SDPA, in one process.

    python3 experiments/2026-11-22-tensor-core-mma/tc_bench.py --phases tc_mma,tc_pipelined --out $OUT/tc.jsonl \
        --problems "1,32,4096,64,float16;1,32,4096,128,float16" [--causal-too] [--param tc_mma.W=4]

Each problem: B,H,N,D,dtype[,c] (c = causal). Correctness: every phase's
output is compared with a float64 NumPy reference on two heads (first and
last) and with PyTorch SDPA (fp32 math on the same rounded inputs) on all
heads; a wrong result is never timed. Timing: CUDA events around batches of
back-to-back launches (≥ 20 ms per batch), median of the batches, after
warm-up. SDPA is timed the same way on the same inputs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
sys.path.insert(0, os.getcwd())

import numba_attn.gpu.backend  # noqa: E402,F401  (selects the backend before numba is imported)
import numpy as np  # noqa: E402
from numba import cuda, float32, uint32  # noqa: E402

from numba_attn.spec.problem import Problem  # noqa: E402
from numba_attn.spec.reference import check, poison, reference, tolerance  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402


def log(*a):
    print(*a, flush=True)


def time_events(fn, min_batch_ms=20.0, batches=7):
    for _ in range(3):
        fn()
    cuda.synchronize()
    e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    one = max(cuda.event_elapsed_time(e0, e1), 1e-3)
    n = int(max(1, min(200, min_batch_ms / one)))
    samples = []
    for _ in range(batches):
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        e1.synchronize()
        samples.append(cuda.event_elapsed_time(e0, e1) / n)
    return statistics.median(samples), min(samples), max(samples), n


def resources(kern):
    out = []
    for sig, ov in kern.overloads.items():
        r = {}
        for key, attr in (("regs", "regs_per_thread"), ("smem", "shared_mem_per_block"),
                          ("local", "local_mem_per_thread")):
            try:
                r[key] = int(getattr(ov, attr))
            except Exception as exc:  # noqa: BLE001
                r[key] = f"? {type(exc).__name__}"
        try:
            sass = kern.inspect_sass(sig)
            for op in ("HMMA", "LDSM", "LDGSTS", "LDS", "STS", "LDG", "MUFU.EX2", "SHFL", "LDL", "STL", "BAR"):
                r["n_" + op] = sum(1 for line in sass.splitlines() if f" {op}" in line or f"\t{op}" in line)
        except Exception as exc:  # noqa: BLE001
            r["sass"] = f"unavailable: {type(exc).__name__}: {str(exc)[:100]}"
        out.append(r)
    return out


# -- mma throughput ceiling ---------------------------------------------------------


def mma_ceiling(kind):
    from numba_attn.gpu import intrinsics as I

    mma = {"f16": I.mma_f16, "bf16": I.mma_bf16, "tf32": I.mma_tf32}[kind]
    CH = 8
    NACC = 4 * CH

    @cuda.jit(fastmath=True)
    def k(out, iters):
        x = uint32(cuda.threadIdx.x * 2654435761 + 0x3C003C00) & uint32(0x3BFF3BFF)
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = float32(0.0)
        for _ in range(iters):
            for c in range(CH):
                acc[4 * c], acc[4 * c + 1], acc[4 * c + 2], acc[4 * c + 3] = mma(
                    x, x ^ uint32(c), x, x, x, x ^ uint32(1), acc[4 * c], acc[4 * c + 1], acc[4 * c + 2],
                    acc[4 * c + 3])
        s = float32(0.0)
        for i in range(NACC):
            s += acc[i]
        out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = s

    blocks, threads, iters = 132 * 8, 128, 2048
    out = cuda.device_array(blocks * threads, np.float32)
    t, tmin, tmax, n = time_events(lambda: k[blocks, threads](out, iters))
    kflop = 2 * 16 * 8 * (8 if kind == "tf32" else 16)
    flops = blocks * (threads // 32) * iters * CH * kflop
    return {"kind": kind, "tflops": flops / (t * 1e-3) / 1e12, "time_ms": t}


# -- SDPA -----------------------------------------------------------------------------


def sdpa(problem, q, k, v):
    import torch
    import torch.nn.functional as F

    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[problem.dtype]
    tq, tk, tv = (torch.from_numpy(np.asarray(a, np.float32)).to("cuda").to(tdt) for a in (q, k, v))
    kw = {"scale": problem.sm_scale}
    if problem.causal:
        assert problem.q_len == problem.kv_len
        kw["is_causal"] = True
    with torch.no_grad():
        out = F.scaled_dot_product_attention(tq, tk, tv, **kw)
        ref32 = F.scaled_dot_product_attention(tq.float(), tk.float(), tv.float(), **kw)
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    _ = stream

    def fn():
        F.scaled_dot_product_attention(tq, tk, tv, **kw)

    t = time_events(fn)
    return out.float().cpu().numpy(), ref32.cpu().numpy(), t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="tc_mma")
    ap.add_argument("--problems", default="1,32,4096,64,float16")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--variants", default="", help="phase:k=v,k=v;phase:k=v extra configurations")
    ap.add_argument("--ceiling", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = cuda.get_current_device()
    log(f"device: {dev.name.decode() if isinstance(dev.name, bytes) else dev.name} cc={dev.compute_capability}")
    rows = []
    outf = open(args.out, "a") if args.out else None

    def emit(row):
        rows.append(row)
        if outf:
            outf.write(json.dumps(row, default=str) + "\n")
            outf.flush()

    if args.ceiling:
        for kind in ("f16", "bf16", "tf32"):
            r = mma_ceiling(kind)
            log(f"mma ceiling {kind}: {r['tflops']:.1f} TFLOP/s")
            emit({"type": "ceiling", **r})
    overrides = {}
    for p in args.param:
        name, kv = p.split(".", 1)
        key, val = kv.split("=")
        overrides.setdefault(name, {})[key] = int(val)
    configs = [(name, overrides.get(name, {}), None) for name in args.phases.split(",") if name]
    for spec in filter(None, args.variants.split(";")):
        name, kvs = spec.split(":")
        only_d = None
        if "@" in name:  # phase@D: only for head_dim D
            name, d = name.split("@")
            only_d = int(d)
        configs.append((name, {kv.split("=")[0]: int(kv.split("=")[1]) for kv in kvs.split(",")}, only_d))

    for spec in args.problems.split(";"):
        f = spec.split(",")
        prob = Problem(batch=int(f[0]), heads=int(f[1]), q_len=int(f[2]), head_dim=int(f[3]), dtype=f[4],
                       causal=len(f) > 5 and f[5] == "c")
        q, k, v = prob.inputs(1)
        heads = sorted({0, prob.heads - 1})
        ref = reference(q[:, heads], k[:, heads], v[:, heads], causal=prob.causal, scale=prob.sm_scale)
        sd_out = sd32 = None
        if not args.no_sdpa:
            try:
                sd_out, sd32, (t, tmin, tmax, n) = sdpa(prob, q, k, v)
                c = check(sd_out[:, heads].astype(np.float32), ref, dtype="float32", tol=tolerance(prob.dtype))
                emit({"type": "sdpa", "label": prob.label, "time_ms": t, "tmin": tmin, "tmax": tmax,
                      "tflops": prob.flops() / (t * 1e-3) / 1e12, "rel_err": c.rel_err, "ok": c.ok})
                log(f"{'sdpa':14s} {prob.label:28s} {t:8.3f} ms {prob.flops() / (t * 1e-3) / 1e12:7.1f} TFLOP/s "
                    f"err {c.rel_err:.1e}")
            except Exception as exc:  # noqa: BLE001
                log(f"sdpa failed: {type(exc).__name__}: {exc}")
        B, H, D, N = prob.batch, prob.heads, prob.head_dim, prob.q_len
        # bf16 (ml_dtypes) arrays cannot cross numba's buffer protocol: move bit patterns
        bits = np.uint16 if q.dtype.itemsize == 2 else np.float32
        dq, dk, dv = (cuda.to_device(a.reshape(B * H, N, D).view(bits)) for a in (q, k, v))
        for name, params, only_d in configs:
            if only_d is not None and only_d != D:
                continue
            phase = get_phase(name)
            reason = phase.supports(prob, **{**phase.params, **params})
            row = {"type": "phase", "phase": name, "params": params, "label": prob.label}
            if reason:
                log(f"{name:14s} {prob.label:28s} SKIP {reason}")
                continue
            try:
                t0 = time.perf_counter()
                launch = phase.plan(prob, **params)
                do = cuda.to_device(poison(np.empty((B * H, N, D), q.dtype), prob.dtype).view(bits))
                launch(dq, dk, dv, do, 0)
                cuda.synchronize()
                row["first_s"] = time.perf_counter() - t0
                out = do.copy_to_host().view(q.dtype).reshape(B, H, N, D)
                c = check(out[:, heads], ref, dtype=prob.dtype, precision=phase.precision)
                row.update(rel_err=c.rel_err, ok=c.ok, reason=c.reason)
                if sd32 is not None:
                    d = out.astype(np.float32) - sd32
                    row["rel_vs_sdpa32"] = float(np.linalg.norm(d) / np.linalg.norm(sd32))
                    row["nonfinite"] = int((~np.isfinite(out.astype(np.float32))).sum())
                row["resources"] = resources(launch.kernels[0])
                if not c.ok or row.get("rel_vs_sdpa32", 0) > 2 * tolerance(prob.dtype, phase.precision) \
                        or row.get("nonfinite"):
                    row["status"] = "FAIL"
                    log(f"{name:14s} {prob.label:28s} FAIL {c.reason} vs_sdpa={row.get('rel_vs_sdpa32')}")
                    emit(row)
                    continue
                t, tmin, tmax, n = time_events(lambda: launch(dq, dk, dv, do, 0))
                # the timed launches still compute the right thing
                out2 = do.copy_to_host().view(q.dtype).reshape(B, H, N, D)
                c2 = check(out2[:, heads], ref, dtype=prob.dtype, precision=phase.precision)
                row.update(status="OK" if c2.ok else "FAIL", time_ms=t, tmin=tmin, tmax=tmax, inner=n,
                           tflops=prob.flops() / (t * 1e-3) / 1e12)
                res = row["resources"][0]
                log(f"{name:14s} {prob.label:28s} {t:8.3f} ms {row['tflops']:7.1f} TFLOP/s err {c.rel_err:.1e} "
                    f"regs={res.get('regs')} smem={res.get('smem')} local={res.get('local')} "
                    f"HMMA={res.get('n_HMMA')} LDSM={res.get('n_LDSM')} LDGSTS={res.get('n_LDGSTS')} "
                    f"LDL={res.get('n_LDL')} {params}")
            except Exception as exc:  # noqa: BLE001
                import traceback

                row.update(status="ERROR", reason=f"{type(exc).__name__}: {str(exc)[:400]}")
                log(f"{name:14s} {prob.label:28s} ERROR {row['reason']}")
                traceback.print_exc(limit=3)
            emit(row)
    log("\nsummary (TFLOP/s; x = fraction of SDPA in the same run)")
    sd = {r["label"]: r["tflops"] for r in rows if r["type"] == "sdpa"}
    for r in rows:
        if r["type"] == "phase" and r.get("tflops"):
            frac = r["tflops"] / sd[r["label"]] if r["label"] in sd else float("nan")
            log(f"  {r['phase']:14s} {r['label']:28s} {r['tflops']:7.1f}  {frac:5.2f}x SDPA  {r['params']}")


if __name__ == "__main__":
    main()
