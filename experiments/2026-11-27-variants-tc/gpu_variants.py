"""Variants on the tensor-core and decode phases on a GPU: correctness, then times (CUDA events, medians)."""
import json, os, sys, time
import numpy as np
from numba import cuda
import numba_attn as na
from numba_attn import variants as V
from numba_attn.spec.reference import check, reference

out = {"gpu": cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes)
       else cuda.get_current_device().name, "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "checks": [], "times": []}
rng = np.random.default_rng(0)
t0 = time.time()

def qkv(B, H, Hkv, Nq, Nk, D, dt="float16"):
    return (rng.standard_normal((B, H, Nq, D)).astype(dt), rng.standard_normal((B, Hkv, Nk, D)).astype(dt),
            rng.standard_normal((B, Hkv, Nk, D)).astype(dt))

# -- correctness on odd shapes
doc = (np.arange(300)[None, :] // 70).astype(np.int32)
for phase, shape, kw, causal in [
        ("warp_specialized_tc", (1, 4, 2, 300, 300, 128), dict(mask_mod=V.sliding_window(50), score_mod=V.softcap(5.0)), True),
        ("warp_specialized_tc", (1, 4, 2, 300, 300, 128), dict(mask_mod=V.document(doc), score_mod=V.alibi(V.alibi_slopes(4))), False),
        ("tc_mma", (1, 4, 2, 300, 300, 64), dict(mask_mod=V.sliding_window(50), score_mod=V.softcap(5.0)), True),
        ("decode_mma", (2, 8, 2, 1, 300, 128), dict(mask_mod=V.sliding_window(64)), False)]:
    q, k, v = qkv(*shape)
    o = na.attention(q, k, v, causal=causal, phase=phase, **kw)
    ref = reference(q, k, v, causal=causal, variant=V.make_variant(kw.get("mask_mod"), kw.get("score_mod")))
    c = check(o, ref, dtype="float16")
    out["checks"].append({"phase": phase, "shape": shape, "variant": sorted(kw), "ok": bool(c.ok), "why": c.reason})
    print(out["checks"][-1], round(time.time() - t0), flush=True)

# -- times: warp_specialized_tc, fp16 B1 H32 D128
def timed(N, causal, reps=15, **kw):
    q, k, v = (cuda.to_device(a) for a in qkv(1, 32, 32, N, N, 128))
    o = na.attention(q, k, v, causal=causal, phase="warp_specialized_tc", **kw)
    cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = cuda.event(), cuda.event()
        a.record(); na.attention(q, k, v, causal=causal, phase="warp_specialized_tc", out=o, **kw); b.record()
        b.synchronize(); ts.append(cuda.event_elapsed_time(a, b))
    return float(np.median(ts))

w = V.sliding_window(1023)
for name, N, causal, kw in [("causal", 8192, True, {}), ("window 1024 (causal)", 8192, True, dict(mask_mod=w)),
                            ("window 1024 (causal)", 32768, True, dict(mask_mod=w)),
                            ("plain", 4096, False, {}), ("key_padding, every tile full", 4096, False,
                             dict(mask_mod=V.key_padding(np.array([4096], np.int32)))),
                            ("softcap 30", 4096, False, dict(score_mod=V.softcap(30.0)))]:
    ms = timed(N, causal, **kw)
    out["times"].append({"variant": name, "N": N, "ms": round(ms, 4)})
    print(out["times"][-1], round(time.time() - t0), flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_variants.json"), "w"), indent=1)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_variants.json"), "w"), indent=1)
