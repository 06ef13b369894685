"""The log-sum-exp, sinks, varlen variants and the backward phases on the GPU at their default parameters, each
checked against the float64 reference: run under ``compute-sanitizer --tool memcheck``.

    compute-sanitizer --tool memcheck python3 experiments/2026-11-27-lse-backward-gpu/sanitize.py
    NUMBA_ATTN_BACKEND=simulator python3 experiments/2026-11-27-lse-backward-gpu/sanitize.py --small   # smoke

Prints one line per check and "ALL OK" when every check passed.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn import variants as V  # noqa: E402
from numba_attn.spec.grad_reference import grad_reference  # noqa: E402
from numba_attn.spec.reference import check, reference  # noqa: E402
from numba_attn.spec.varlen import cu_seqlens, varlen_reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    Nq, Nk, D = (13, 21, 16) if a.small else (300, 333, 128)
    bad = []

    def report(name, ok, why=""):
        print(f"{name:44s} {'OK' if ok else 'FAIL ' + str(why)}", flush=True)
        if not ok:
            bad.append(name)

    def sim(ph):
        return dict(na.get_phase(ph).sim_params) if a.small else {}

    # 1. return_lse (+ sinks) on every phase that writes it
    sinks = rng.standard_normal(4).astype(np.float32)
    for ph in na.list_phases():
        if ph.lse is not True or ph.layout != "contiguous":
            continue
        dtype = np.float16 if "float16" in ph.dtypes else np.float32
        nq = 3 if ph.kind == "decode" else Nq
        q = rng.standard_normal((2, 4, nq, D if ph.kind == "decode" or "float32" not in ph.dtypes else 64)).astype(dtype)
        d = q.shape[-1]
        k, v = (rng.standard_normal((2, 2, Nk, d)).astype(dtype) for _ in range(2))
        try:
            out, lse = na.attention(q, k, v, causal=True, phase=ph.name, return_lse=True, sinks=sinks, **sim(ph.name))
            ref, ref_lse = reference(q, k, v, causal=True, return_lse=True, sinks=sinks)
            ok = check(out, ref, dtype=np.dtype(dtype).name, precision=ph.precision).ok
            ok = ok and np.allclose(lse, ref_lse, atol=1e-3, rtol=1e-4)
            report(f"lse+sinks {ph.name}", ok, "output or lse")
        except Exception as exc:  # noqa: BLE001
            report(f"lse+sinks {ph.name}", False, f"{type(exc).__name__}: {exc}"[:300])
    # 2. varlen variants
    lq, lk = (np.array([5, 13, 9]), np.array([9, 13, 21])) if a.small else (np.array([50, 300, 170]), np.array([90, 300, 333]))
    q = rng.standard_normal((lq.sum(), 4, D)).astype(np.float16)
    k, v = (rng.standard_normal((lk.sum(), 2, D)).astype(np.float16) for _ in range(2))
    cq, ck = cu_seqlens(lq), cu_seqlens(lk)
    kw = dict(mask_mod=V.sliding_window(7 if a.small else 64), score_mod=V.softcap(5.0))
    for ph in ("tc_mma_varlen", "tc_wgmma_varlen"):
        try:
            out = na.attention_varlen(q, k, v, cq, ck, causal=True, phase=ph, params=sim(ph), **kw)
            ref = varlen_reference(q, k, v, cq, ck, causal=True, variant=V.make_variant(kw["mask_mod"], kw["score_mod"]))
            report(f"varlen variant {ph}", check(out, ref, dtype="float16").ok)
        except Exception as exc:  # noqa: BLE001
            report(f"varlen variant {ph}", False, f"{type(exc).__name__}: {exc}"[:300])
    # 3. the backward phases
    for ph in na.list_phases("backward"):
        for dtype in ph.dtypes:
            q = rng.standard_normal((2, 4, Nq, 64 if not a.small else 16)).astype(dtype)
            k, v = (rng.standard_normal((2, 2, Nk, q.shape[-1])).astype(dtype) for _ in range(2))
            do = rng.standard_normal(q.shape).astype(dtype)
            try:
                g = grad_reference(q, k, v, do, causal=True)
                dq, dk, dv = na.attention_backward(q, k, v, g.o.astype(dtype), g.lse.astype(np.float32), do,
                                                   causal=True, phase=ph.name, **sim(ph.name))
                ok = all(check(x, r, dtype=dtype).ok for x, r in ((dq, g.dq), (dk, g.dk), (dv, g.dv)))
                report(f"backward {ph.name} {dtype}", ok)
            except Exception as exc:  # noqa: BLE001
                report(f"backward {ph.name} {dtype}", False, f"{type(exc).__name__}: {exc}"[:300])
    print("ALL OK" if not bad else f"FAILED: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
