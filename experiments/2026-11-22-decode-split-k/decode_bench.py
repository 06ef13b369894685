"""Decode and long-context measurements on the GPU, side by side with PyTorch
SDPA and the device's copy bandwidth, in one process.

    python3 experiments/2026-11-22-decode-split-k/decode_bench.py --out $OUT/decode.jsonl --decode tune|small|full \
        [--variants default|tune] [--long-context fp32,fp16 --prefill-phases smem_kv,...] \
        [--append] [--graph-check] [--profile]

Inputs are drawn on the GPU (torch, standard normal, seeded) in the storage
dtype. Correctness, before any timing and again after it: the output buffer
is poisoned, the phase runs, and every output element is compared with a
float64 reference computed on the GPU (torch float64, the formula of
``numba_attn.spec.reference``: scores, bottom-right causal mask, softmax, P·V),
chunked over batch entries and query rows so that its memory stays small.
The gate is the project's: relative error ‖out − ref‖/‖ref‖ under the
dtype's tolerance, no element left unwritten, no NaN/Inf. A wrong result is
never timed.

Timing (``gpu_time``): a spin kernel (``torch.cuda._sleep``) is enqueued first,
long enough for the host to enqueue a whole batch of launches behind it; then
events around the batch time the launches back to back, so neither numba's
~25 µs Python launch cost nor SDPA's dispatch reaches the number (the spin's
measured length is checked against the host's enqueue time; a batch where the
host was slower is flagged). Median of several batches. Small problems rotate
over several copies of K/V so that they are not timed from the L2 cache.

Copy bandwidth: ``torch`` ``copy_`` of a 4 GiB buffer, bytes read + written,
timed the same way.

``--profile``: per row, 40 calls queued behind a spin kernel are traced with
``torch.profiler`` (CUPTI): the mean device time of each kernel of a call
(split kernel, combine; SDPA's own kernels) and the span per call.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
sys.path.insert(0, os.getcwd())

import numba_attn.gpu.backend  # noqa: E402,F401  (selects the backend before numba is imported)
import torch  # noqa: E402
from numba import cuda  # noqa: E402

from numba_attn.spec.problem import PRESETS, Problem  # noqa: E402
from numba_attn.spec.reference import POISON_BITS, tolerance  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402
from numba_attn.measure.row import kernel_resources  # noqa: E402

TDT = {"float32": torch.float32, "float16": torch.float16}
L2_BYTES = 60 * 2**20
OUT = None


def log(*a):
    print(*a, flush=True)


def emit(rec):
    if OUT:
        with open(OUT, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")


# -- timing ------------------------------------------------------------------------


class Timer:
    def __init__(self):
        self.cycles_per_ms = float(cuda.get_current_device().CLOCK_RATE)  # kHz = cycles per ms

    def __call__(self, enqueue, reps=5, target_ms=8.0, max_inner=200):
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        enqueue(0)
        torch.cuda.synchronize()
        e0, e1 = ev(), ev()
        e0.record()
        enqueue(1)
        e1.record()
        e1.synchronize()
        one = max(e0.elapsed_time(e1), 1e-3)
        inner = int(max(1, min(max_inner, math.ceil(target_ms / one))))
        h0 = time.perf_counter()
        for i in range(inner):
            enqueue(i)
        host_ms = (time.perf_counter() - h0) * 1e3
        torch.cuda.synchronize()
        sleep_ms = 1.5 * host_ms + 1.0
        samples, host_bound = [], 0
        for r in range(reps + 4):
            es, e0, e1 = ev(), ev(), ev()
            es.record()
            torch.cuda._sleep(int(sleep_ms * self.cycles_per_ms))
            e0.record()
            h0 = time.perf_counter()
            for i in range(inner):
                enqueue(i)
            host_ms = (time.perf_counter() - h0) * 1e3
            e1.record()
            e1.synchronize()
            slept = es.elapsed_time(e0)
            if slept < host_ms:  # the GPU may have waited for the host: redo with a longer spin
                host_bound += 1
                sleep_ms = 2.0 * host_ms + 1.0
                continue
            samples.append(e0.elapsed_time(e1) / inner)
            if len(samples) >= reps:
                break
        if not samples:
            return {"time_ms": None, "host_bound_batches": host_bound}
        med = statistics.median(samples)
        return {"time_ms": med, "time_min_ms": min(samples), "time_max_ms": max(samples),
                "spread": (max(samples) - min(samples)) / med, "reps": len(samples), "inner": inner,
                "host_enqueue_us": host_ms / inner * 1e3, "host_bound_batches": host_bound}


def copy_bandwidth(timer, nbytes=4 * 2**30):
    n = nbytes // 4
    src = torch.randn(n, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    t = timer(lambda i: dst.copy_(src), reps=7)
    ok = bool(torch.equal(dst[-4096:], src[-4096:]))
    gbps = 2 * nbytes / (t["time_ms"] * 1e-3) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return {"type": "ceiling", "name": "copy_torch", "gbps": gbps, "bytes": 2 * nbytes, "ok": ok, **t}


def kernel_profile(enqueue, timer, n=40):
    """Per-kernel device time of ``n`` back-to-back calls (torch.profiler / CUPTI), the
    calls queued behind a spin kernel so that the host does not pace them: the mean
    time of each kernel per call, and the span per call from the first kernel's start
    to the last one's end (busy time + the gaps between kernels)."""
    from torch.profiler import ProfilerActivity, profile

    enqueue(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        h0 = time.perf_counter()
        torch.cuda._sleep(int(3.0 * timer.cycles_per_ms))
        for i in range(n):
            enqueue(i)
        host_ms = (time.perf_counter() - h0) * 1e3
        torch.cuda.synchronize()
    spans, per = [], {}
    for e in prof.events():
        low = e.name.lower()
        if str(getattr(e, "device_type", "")).endswith("CUDA") and "spin_kernel" not in low \
                and "sleep" not in low and "memcpy" not in low and "memset" not in low:
            spans.append((e.time_range.start, e.time_range.end))
            d = per.setdefault(e.name.replace("numba_attn::phases::", "")[:48], [0, 0.0])
            d[0] += 1
            d[1] += e.time_range.end - e.time_range.start
    if not spans:
        return {"kernels": {}, "host_ms": host_ms}
    t0 = min(a for a, _ in spans)
    t1 = max(b for _, b in spans)
    busy = sum(b - a for a, b in spans)
    return {"span_us_per_call": (t1 - t0) / n, "busy_us_per_call": busy / n, "host_ms": host_ms,
            "kernels": {k: {"count": c, "mean_us": tot / c} for k, (c, tot) in per.items()}}


# -- inputs, reference, check ----------------------------------------------------------


def inputs(p: Problem, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = TDT[p.dtype]
    q = torch.randn(p.batch, p.heads, p.q_len, p.head_dim, device="cuda", generator=g).to(dt)
    k = torch.empty(p.batch, p.kv_heads, p.kv_len, p.head_dim, device="cuda", dtype=dt)
    v = torch.empty_like(k)
    for b in range(p.batch):  # in slices: no float32 temporary of the whole cache
        k[b] = torch.randn(p.kv_heads, p.kv_len, p.head_dim, device="cuda", generator=g).to(dt)
        v[b] = torch.randn(p.kv_heads, p.kv_len, p.head_dim, device="cuda", generator=g).to(dt)
    return q, k, v


def reference64(p: Problem, q, k, v, budget_bytes=2 * 2**30):
    """float64 attention on the GPU, (B, H, Nq, D); bottom-right causal alignment."""
    B, H, Hkv, Nq, Nk, D, G = p.batch, p.heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, p.group
    out = torch.empty(B, H, Nq, D, device="cuda", dtype=torch.float64)
    # rows of a block: (kv head, group member, query) flattened to (Hkv, G*nq)
    # KV heads per step: their float64 K and V within the budget (a 128k fp32 cache leaves little room)
    hc = max(1, min(Hkv, budget_bytes // max(1, Nk * D * 8 * 2)))
    nq = max(1, min(Nq, budget_bytes // max(1, hc * G * Nk * 8 * 2)))
    jj = torch.arange(Nk, device="cuda")
    for b in range(B):
        for h0 in range(0, Hkv, hc):
            h1 = min(Hkv, h0 + hc)
            kb = k[b, h0:h1].double()
            vb = v[b, h0:h1].double()
            for i0 in range(0, Nq, nq):
                i1 = min(Nq, i0 + nq)
                qb = q[b, h0 * G:h1 * G, i0:i1].double().reshape(h1 - h0, G * (i1 - i0), D)
                s = torch.matmul(qb, kb.transpose(1, 2)) * p.sm_scale
                if p.causal:
                    ii = torch.arange(i0, i1, device="cuda").repeat(G)  # query index of each row
                    s.masked_fill_(jj[None, None, :] > (ii[:, None] + (Nk - Nq))[None], float("-inf"))
                o = torch.matmul(torch.softmax(s, dim=-1), vb)
                out[b, h0 * G:h1 * G, i0:i1] = o.reshape((h1 - h0) * G, i1 - i0, D)
                del s, o
            del kb, vb
    return out


def poison_(o, dtype):
    _, bits = POISON_BITS[dtype]
    (o.view(torch.int32) if dtype == "float32" else o.view(torch.int16)).fill_(bits)


def check(o, ref, dtype, precision=None):
    _, bits = POISON_BITS[dtype]
    raw = o.view(torch.int32) if dtype == "float32" else o.view(torch.int16)
    unwritten = int((raw == bits).sum())
    o64 = o.double()
    nonfinite = int((~torch.isfinite(o64)).sum()) - unwritten
    diff = torch.where(torch.isfinite(o64), o64 - ref, torch.full_like(ref, float("inf")))
    rel = float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref))
    tol = tolerance(dtype, precision)  # the project's gate: tf32 phases are held to the tf32 tolerance
    ok = unwritten == 0 and nonfinite <= 0 and rel <= tol
    reason = "" if ok else f"unwritten={unwritten} nonfinite={nonfinite} rel={rel:.3g} tol={tol:g}"
    return {"ok": ok, "rel_err": rel, "tol": tol, "unwritten": unwritten, "reason": reason}


def sdpa(p: Problem, q, k, v):
    F = torch.nn.functional
    kw = {"scale": p.sm_scale}
    if p.kv_heads != p.heads:
        kw["enable_gqa"] = True
    if p.causal:
        if p.q_len == p.kv_len:
            kw["is_causal"] = True
        elif p.q_len > 1:
            from torch.nn.attention.bias import causal_lower_right

            kw["attn_mask"] = causal_lower_right(p.q_len, p.kv_len)
    return F.scaled_dot_product_attention(q, k, v, **kw)


# -- one problem ----------------------------------------------------------------------


def run_problem(p: Problem, variants, timer, copy_gbps, seed=1, graph_check=False, reps=5, profile=False):
    t0 = time.perf_counter()
    kv_bytes = 2 * p.batch * p.kv_heads * p.kv_len * p.head_dim * p.itemsize
    free, _ = torch.cuda.mem_get_info()
    if kv_bytes + 4 * 2**30 > free:
        rec = {"type": "result", "label": p.label, "problem": p.to_dict(), "status": "SKIP",
               "reason": f"K/V need {kv_bytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free"}
        emit(rec)
        log(f"{p.label:38s} SKIP {rec['reason']}")
        return []
    q, k, v = inputs(p, seed)
    ref = reference64(p, q, k, v)
    n_sets = int(min(4, max(1, math.ceil(3 * L2_BYTES / max(kv_bytes, 1)))))
    sets = [(q, k, v)] + [(q.clone(), k.clone(), v.clone()) for _ in range(n_sets - 1)]
    outs = [torch.empty_like(q) for _ in range(n_sets)]
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    B, H, Hkv, Nq, Nk, D = p.batch, p.heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim
    views = [tuple(cuda.as_cuda_array(t.reshape(shape)) for t, shape in
                   ((qq, (B * H, Nq, D)), (kk, (B * Hkv, Nk, D)), (vv, (B * Hkv, Nk, D)), (oo, (B * H, Nq, D))))
             for (qq, kk, vv), oo in zip(sets, outs)]
    rows = []
    min_bytes = p.min_bytes()
    sdpa_ms = None
    # SDPA first, so that every phase row can carry the ratio
    rec = {"type": "result", "phase": "torch_sdpa", "kind": "peer", "label": p.label, "problem": p.to_dict()}
    try:
        o = sdpa(p, q, k, v)
        torch.cuda.synchronize()
        c = check(o.contiguous(), ref, p.dtype)
        rec["check"] = c
        del o
        t = timer(lambda i: sdpa(p, *sets[i % n_sets]), reps=reps)
        rec.update(t, status="OK" if c["ok"] else "WRONG")
        sdpa_ms = t["time_ms"]
        if profile:
            rec["profile"] = kernel_profile(lambda i: sdpa(p, *sets[i % n_sets]), timer)
    except Exception as exc:  # noqa: BLE001
        rec.update(status="ERROR", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
    _finish(rec, min_bytes, copy_gbps, None)
    rows.append(rec)
    for name, params in variants:
        rec = {"type": "result", "phase": name, "kind": "phase", "params": params, "label": p.label,
               "problem": p.to_dict()}
        ph = get_phase(name)
        reason = ph.supports(p, **ph.resolve_params(params))
        if reason:
            rec.update(status="SKIP", reason=reason)
            rows.append(rec)
            emit(rec)
            continue
        try:
            launch = ph.plan(p, **params)
            rec["notes"] = launch.notes
            poison_(outs[0], p.dtype)
            launch(*views[0], stream)
            torch.cuda.synchronize()
            c = check(outs[0], ref, p.dtype, ph.precision)
            rec["check"] = c
            rec["resources"] = kernel_resources(launch.kernels)
            if not c["ok"]:
                rec.update(status="FAIL", reason="wrong result: " + c["reason"])
            else:
                t = timer(lambda i: launch(*views[i % n_sets], stream), reps=reps)
                rec.update(t)
                poison_(outs[0], p.dtype)  # the timed configuration must still be right
                launch(*views[0], stream)
                torch.cuda.synchronize()
                c2 = check(outs[0], ref, p.dtype, ph.precision)
                if not c2["ok"]:
                    rec.update(status="FAIL", reason="wrong after timing: " + c2["reason"])
                else:
                    rec["status"] = "OK"
                if profile and rec["status"] == "OK":
                    rec["profile"] = kernel_profile(lambda i: launch(*views[i % n_sets], stream), timer)
                if graph_check and rec["status"] == "OK":
                    from numba_attn.measure.timing import TimingConfig, second_method

                    nst = cuda.stream()
                    g = second_method(lambda i, s: launch(*views[i % n_sets], s), nst,
                                      TimingConfig(min_reps=3, budget_s=0.3))
                    rec["graph_replay_ms"] = g.get("time_ms")
                    rec["graph_method"] = g.get("method")
        except Exception as exc:  # noqa: BLE001
            rec.update(status="ERROR", reason=f"{type(exc).__name__}: {str(exc)[:300]}",
                       traceback=traceback.format_exc()[-1500:])
        _finish(rec, min_bytes, copy_gbps, sdpa_ms)
        rows.append(rec)
    del sets, outs, views, q, k, v, ref
    torch.cuda.empty_cache()
    log(f"   ({time.perf_counter() - t0:.1f} s)")
    return rows


def _finish(rec, min_bytes, copy_gbps, sdpa_ms):
    t = rec.get("time_ms")
    if t and rec.get("status") in ("OK", "WRONG"):
        rec["gbps"] = min_bytes / (t * 1e-3) / 1e9
        rec["frac_copy"] = rec["gbps"] / copy_gbps if copy_gbps else None
        if sdpa_ms:
            rec["speedup_vs_sdpa"] = sdpa_ms / t
    emit(rec)
    extra = ""
    if rec.get("notes"):
        extra = f" [{rec['notes']}]"
    if rec.get("graph_replay_ms"):
        extra += f" graph {rec['graph_replay_ms'] * 1e3:.1f}µs"
    pr = rec.get("profile")
    if pr and pr.get("kernels"):
        extra += (f" | profile: span {pr['span_us_per_call']:.1f} busy {pr['busy_us_per_call']:.1f} µs/call; "
                  + "; ".join(f"{k[:32]} {v['mean_us']:.1f}" for k, v in pr["kernels"].items()))
    if t and rec.get("gbps"):
        log(f"{rec['label']:38s} {rec['phase']:15s} {json.dumps(rec.get('params', {})):42s} "
            f"{t * 1e3:9.1f} µs {rec['gbps']:7.0f} GB/s {100 * (rec.get('frac_copy') or 0):5.1f}% "
            f"{'x%.2f' % rec['speedup_vs_sdpa'] if rec.get('speedup_vs_sdpa') else '':7s} "
            f"err {rec['check']['rel_err']:.1e} {rec.get('status')}{extra}")
    else:
        log(f"{rec['label']:38s} {rec['phase']:15s} {json.dumps(rec.get('params', {})):42s} "
            f"{rec.get('status')} {rec.get('reason', '')[:200]}")


# -- problem and variant lists -------------------------------------------------------------

def P(b, n, dt="float16", kvh=None, nq=1, causal=False):
    return Problem(batch=b, heads=32, kv_heads=kvh, q_len=nq, kv_len=n, head_dim=128, dtype=dt, causal=causal)


DECODE_SETS = {
    "tune": [P(1, 16384), P(1, 131072), P(8, 32768, "float32"), P(32, 4096), P(1, 32768, kvh=8),
             P(8, 16384, nq=4, causal=True)],
    "small": PRESETS["decode-small"],
    "full": PRESETS["decode"] + [P(8, 16384, nq=4, causal=True)],
    # the GQA shapes and the speculative one first (a deadline cuts the tail), then the preset
    "final2": [P(1, 32768, kvh=8), P(8, 32768, kvh=8), P(8, 16384, nq=4, causal=True)]
    + [p for p in PRESETS["decode"] if p.kv_heads == p.heads],
    "gqa": [P(1, 32768, kvh=8), P(8, 32768, kvh=8), P(1, 131072, kvh=8), P(8, 16384, nq=4, causal=True)],
    "gqa2": [P(1, 32768, kvh=8), P(8, 32768, kvh=8), P(1, 16384, kvh=8)],
}

VARIANTS = {
    "default": [("decode_chunked", {}), ("decode_split_k", {}), ("decode_split_k_fused", {})],
    "final": [("decode_chunked", {}), ("decode_split_k", {}), ("decode_split_k_fused", {}),
              ("decode_split_k_fused", {"lanes": 16, "keys": 2, "blocks_per_sm": 8})],
    "final2": [("decode_split_k_fused", {}), ("decode_split_k_lean", {}), ("decode_mma", {})],
    "mma": [("decode_split_k_lean", {}), ("decode_mma", {}), ("decode_mma", {"fuse_max": 0}),
            ("decode_mma", {"warps": 8, "blocks_per_sm": 1}), ("decode_mma", {"min_keys": 512}),
            ("decode_mma", {"min_keys": 4096}), ("decode_mma", {"blocks_per_sm": 1}),
            ("decode_mma", {"STAGES": 2})],
    "pdl": [("decode_mma", {"pdl": False}), ("decode_mma", {}), ("decode_mma", {"l2_prefetch": True}),
            ("decode_mma", {"STAGES": 4}), ("decode_mma", {"STAGES": 5}), ("decode_mma", {"STAGES": 6}),
            ("decode_mma", {"STAGES": 4, "blocks_per_sm": 1}), ("decode_mma", {"STAGES": 5, "blocks_per_sm": 1}),
            ("decode_mma", {"warps": 8, "blocks_per_sm": 1}), ("decode_mma", {"min_keys": 1024})],
    "pdl2": [("decode_mma", {"pdl": 0}), ("decode_mma", {"pdl": 1}), ("decode_mma", {"pdl": 2}),
             ("decode_mma", {"pdl": 3}), ("decode_mma", {"pdl": 0, "even": True, "splits": 33, "warps": 2}),
             ("decode_mma", {"pdl": 2, "even": True, "splits": 33, "warps": 2}),
             ("decode_mma", {"pdl": 0, "even": True, "splits": 33}), ("decode_mma", {"pdl": 0, "even": True}),
             ("decode_mma", {"pdl": 0, "warps": 8, "blocks_per_sm": 1}), ("decode_split_k_lean", {})],
    "pdl3": [("decode_mma", {"pdl": 0, "fixed_combine": False}), ("decode_mma", {"pdl": 0}),
             ("decode_mma", {"pdl": 3, "fixed_combine": False}), ("decode_mma", {}),
             ("decode_mma", {"warps": 8, "blocks_per_sm": 1}), ("decode_split_k_lean", {})],
    "fusetest": [("decode_mma", {}), ("decode_mma", {"fuse_max": 64}), ("decode_mma", {"fuse_max": 64, "warps": 8,
                                                                                      "blocks_per_sm": 1})],
    "tune": [("decode_chunked", {"warps": 4}), ("decode_chunked", {"warps": 8}),
             ("decode_split_k", {"warps": 4, "blocks_per_sm": 2}), ("decode_split_k", {"warps": 4, "blocks_per_sm": 4}),
             ("decode_split_k", {"warps": 8, "blocks_per_sm": 2}),
             ("decode_split_k", {"warps": 4, "blocks_per_sm": 4, "lanes": 8})],
}


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--decode", default="tune", help="tune|small|full|none")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--long-context", default="", help="comma-separated dtypes for the prefill sweep")
    ap.add_argument("--prefill-phases", default="smem_kv,split_k_prefill")
    ap.add_argument("--append", action="store_true", help="prefill of a 1024-token chunk onto a 32k cache")
    ap.add_argument("--append-phases", default="smem_kv,split_k_prefill")
    ap.add_argument("--graph-check", action="store_true")
    ap.add_argument("--profile", action="store_true", help="per-kernel device times (torch.profiler) per row")
    ap.add_argument("--max-prefill-ms", type=float, default=1500.0,
                    help="skip larger N for a prefill phase once one launch takes longer than this")
    ap.add_argument("--deadline-s", type=float, default=380.0)
    args = ap.parse_args()
    OUT = args.out
    t_start = time.perf_counter()
    torch.cuda.set_stream(torch.cuda.Stream())  # a real stream: numba launches join it by handle
    dev = cuda.get_current_device()
    env = {"type": "env", "gpu": torch.cuda.get_device_name(), "sm_count": int(dev.MULTIPROCESSOR_COUNT),
           "clock_khz": int(dev.CLOCK_RATE), "torch": torch.__version__, "commit": os.environ.get("NUMBA_ATTN_COMMIT"),
           "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    emit(env)
    log(json.dumps(env))
    timer = Timer()
    cp = copy_bandwidth(timer)
    emit(cp)
    log(f"copy bandwidth (torch copy_, 4 GiB, read+write): {cp['gbps']:.0f} GB/s ok={cp['ok']}")
    copy_gbps = cp["gbps"]
    if args.decode != "none":
        for p in DECODE_SETS[args.decode]:
            if time.perf_counter() - t_start > args.deadline_s:
                log(f"deadline: stopping before {p.label}")
                break
            run_problem(p, VARIANTS[args.variants], timer, copy_gbps, graph_check=args.graph_check,
                        profile=args.profile)
    prefill = [(n, {}) for n in args.prefill_phases.split(",") if n]
    append = [(n, {}) for n in args.append_phases.split(",") if n]
    probs = []
    if args.append:
        probs += [Problem(batch=1, heads=32, q_len=1024, kv_len=32768, head_dim=128, dtype=dt)
                  for dt in ("float32",)]
    for dt in [d for d in args.long_context.split(",") if d]:
        probs += [Problem(batch=1, heads=32, q_len=n, head_dim=128, dtype=dt) for n in (4096, 8192, 16384, 32768)]
    too_slow = set()
    for p in probs:
        if time.perf_counter() - t_start > args.deadline_s:
            log(f"deadline: stopping before {p.label}")
            break
        todo = [(n, prm) for n, prm in (append if p.q_len != p.kv_len else prefill) if (n, p.dtype) not in too_slow]
        rows = run_problem(p, todo, timer, copy_gbps, reps=3)
        for r in rows:
            if r.get("time_ms") and r["time_ms"] > args.max_prefill_ms:
                too_slow.add((r["phase"], p.dtype))
            if r.get("time_ms") and r.get("status") == "OK":
                r2 = {"type": "prefill_rate", "phase": r["phase"], "label": p.label,
                      "tflops": p.flops() / (r["time_ms"] * 1e-3) / 1e12}
                emit(r2)
                log(f"   {r['phase']:18s} {r2['tflops']:.1f} TFLOP/s")
    log(f"total {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
