"""The backward phases with variants on the GPU at their default parameters, each checked against the float64
reference (its chain rule for score functions): run under ``compute-sanitizer --tool memcheck``.

    compute-sanitizer --tool memcheck python3 experiments/2026-11-27-bwd-atomic-variants/sanitize.py
    NUMBA_ATTN_BACKEND=simulator python3 experiments/2026-11-27-bwd-atomic-variants/sanitize.py --small   # smoke

B2 H4/2kv, 300 queries over 333 keys (D 64 and 128; 13 over 21, D16 with --small), causal, float16 and bfloat16
where the phase takes it; variants: a window, documents (ids through aux), a window with a softcap, ALiBi.
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
from numba_attn.spec.problem import numpy_dtype  # noqa: E402
from numba_attn.spec.reference import check  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    Nq, Nk = (13, 21) if a.small else (300, 333)
    bad = []
    docs = np.repeat(np.arange(Nk // 7 + 1, dtype=np.int32), 7)[None, :Nk].repeat(2, 0)
    variants = {"plain": (None, None), "window": (V.sliding_window(5 if a.small else 64), None),
                "document": (V.document(docs), None),
                "window+softcap": (V.sliding_window(9 if a.small else 100), V.softcap(1.5)),
                "alibi": (None, V.alibi(V.alibi_slopes(4)))}
    for ph in na.list_phases("backward"):
        if ph.name == "bwd_naive" and not a.small:
            continue  # materialises P: covered by the earlier run; the slowest by far
        for D in ((16,) if a.small else (64, 128)):
            for dtype in ph.dtypes:
                for vname, (mask, score) in variants.items():
                    if dtype != ph.dtypes[0] and vname not in ("plain", "window+softcap"):
                        continue
                    dt = numpy_dtype(dtype)
                    q = rng.standard_normal((2, 4, Nq, D)).astype(dt)
                    k, v = (rng.standard_normal((2, 2, Nk, D)).astype(dt) for _ in range(2))
                    do = rng.standard_normal(q.shape).astype(dt)
                    name = f"{ph.name} D{D} {dtype} {vname}"
                    try:
                        variant = V.make_variant(mask, score) if (mask or score) else None
                        g = grad_reference(q, k, v, do, causal=True, variant=variant)
                        grads = na.attention_backward(q, k, v, g.o.astype(dt), g.lse.astype(np.float32), do,
                                                      causal=True, phase=ph.name, mask_mod=mask, score_mod=score,
                                                      **(dict(ph.sim_params) if a.small else {}))
                        res = [check(x, r, dtype=dtype) for x, r in zip(grads, (g.dq, g.dk, g.dv))]
                        ok = all(c.ok for c in res)
                        print(f"{name:44s} {'OK' if ok else 'FAIL'} rel {[round(c.rel_err, 5) for c in res]}",
                              flush=True)
                    except Exception as exc:  # noqa: BLE001
                        ok = False
                        print(f"{name:44s} FAIL {type(exc).__name__}: {exc}"[:400], flush=True)
                    if not ok:
                        bad.append(name)
    print("ALL OK" if not bad else f"FAILED: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
