"""bwd_wgmma and bwd_wgmma_overlap on odd shapes, each checked against the float64 reference: run under
``compute-sanitizer --tool memcheck``.

    compute-sanitizer --tool memcheck python3 experiments/2026-11-27-bwd-wgmma/sanitize.py

B2 H4/2kv (GQA), 300 queries over 333 keys and (not causal, ``--full``) 333 over 300, D 64 and 128, float16 (and
bfloat16, ``--full``), causal and not, the phase's default tiles; a 65-key window and 50-key documents (causal).
Prints one line per check and "ALL OK" when every check passed.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn.spec.grad_reference import grad_reference  # noqa: E402
from numba_attn.spec.problem import numpy_dtype  # noqa: E402
from numba_attn.spec.reference import check  # noqa: E402
from numba_attn.variants.mods import make_variant  # noqa: E402


def cases(full: bool, phases=("bwd_wgmma", "bwd_wgmma_overlap"), dims=(64, 128)):
    """(phase, D, dtype, causal, Nq, Nk, variant name): every phase and head dim on odd shapes; with ``full`` (the
    first runs) bfloat16 and q_len > kv_len too; a window and documents on both phases."""
    out = []
    for ph in phases:
        for D in dims:
            for dtype in (("float16", "bfloat16") if full and ph != "bwd_wgmma_overlap" else ("float16",)):
                for causal in (False, True):
                    for Nq, Nk in ((300, 333), (333, 300)) if full and not causal else ((300, 333),):
                        out.append((ph, D, dtype, causal, Nq, Nk, "plain"))
            out += [(ph, D, "float16", True, 300, 333, v) for v in ("window", "document")]
    return out


def main():
    import argparse

    from numba_attn.variants.library import document, sliding_window

    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="the plain cases of the first runs too (bfloat16, Nq > Nk)")
    ap.add_argument("--phases", default="bwd_wgmma,bwd_wgmma_overlap", help="comma-separated backward phases")
    ap.add_argument("--dims", default="64,128", help="head dims, comma-separated")
    ap.add_argument("--params", default="{}", help="the phases' parameters, JSON (e.g. '{\"dq\": \"red\"}')")
    a = ap.parse_args()
    params = json.loads(a.params)
    dims = tuple(int(d) for d in a.dims.split(","))
    rng = np.random.default_rng(0)
    bad = []
    for ph, D, dtype, causal, Nq, Nk, vname in cases(a.full, a.phases.split(","), dims):
        dt = numpy_dtype(dtype)
        q = rng.standard_normal((2, 4, Nq, D)).astype(dt)
        k, v = (rng.standard_normal((2, 2, Nk, D)).astype(dt) for _ in range(2))
        do = rng.standard_normal(q.shape).astype(dt)
        docs = np.repeat(np.arange(Nk // 50 + 1, dtype=np.int32), 50)[None, :Nk].repeat(2, 0)
        mask = {"plain": None, "window": sliding_window(64), "document": document(docs)}[vname]
        name = f"{ph} D{D} {dtype} {'causal' if causal else 'full'} {Nq}x{Nk} {vname}"
        try:
            variant = make_variant(mask, None) if mask is not None else None
            g = grad_reference(q, k, v, do, causal=causal, variant=variant)
            grads = na.attention_backward(q, k, v, g.o.astype(dt), g.lse.astype(np.float32), do, causal=causal,
                                          phase=ph, mask_mod=mask, **params)
            res = [check(x, r, dtype=dtype) for x, r in zip(grads, (g.dq, g.dk, g.dv))]
            ok = all(c.ok for c in res)
            print(f"{name:56s} {'OK' if ok else 'FAIL'} rel {[round(c.rel_err, 5) for c in res]}", flush=True)
        except Exception as exc:  # noqa: BLE001
            ok = False
            print(f"{name:56s} FAIL {type(exc).__name__}: {exc}"[:400], flush=True)
        if not ok:
            bad.append(name)
    print("ALL OK" if not bad else f"FAILED: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
