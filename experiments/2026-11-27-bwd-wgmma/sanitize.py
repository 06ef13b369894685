"""bwd_wgmma and bwd_wgmma_overlap on odd shapes, each checked against the float64 reference: run under ``compute-sanitizer --tool memcheck``.

    compute-sanitizer --tool memcheck python3 experiments/2026-11-27-bwd-wgmma/sanitize.py

B2 H4/2kv (GQA), 300 queries over 333 keys and (not causal) 333 over 300, D 64 and 128, float16 and bfloat16, causal and not,
the phase's default tiles. Prints one line per check and "ALL OK" when every check passed.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn.spec.grad_reference import grad_reference  # noqa: E402
from numba_attn.spec.problem import numpy_dtype  # noqa: E402
from numba_attn.spec.reference import check  # noqa: E402


def main():
    rng = np.random.default_rng(0)
    bad = []
    for ph, D in [(ph, D) for ph in ("bwd_wgmma", "bwd_wgmma_overlap") for D in (64, 128)]:
        for dtype in ("float16", "bfloat16") if ph == "bwd_wgmma" else ("float16",):
            for causal in (False, True):
                for Nq, Nk in ((300, 333), (333, 300)) if not causal else ((300, 333),):
                    dt = numpy_dtype(dtype)
                    q = rng.standard_normal((2, 4, Nq, D)).astype(dt)
                    k, v = (rng.standard_normal((2, 2, Nk, D)).astype(dt) for _ in range(2))
                    do = rng.standard_normal(q.shape).astype(dt)
                    name = f"{ph} D{D} {dtype} {'causal' if causal else 'full'} {Nq}x{Nk}"
                    try:
                        g = grad_reference(q, k, v, do, causal=causal)
                        grads = na.attention_backward(q, k, v, g.o.astype(dt), g.lse.astype(np.float32), do,
                                                      causal=causal, phase=ph)
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
