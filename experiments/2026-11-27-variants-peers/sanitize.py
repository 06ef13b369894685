"""Every phase that runs variants, on the GPU at its own default parameters, on odd shapes with a mask and a score
function, checked against the float64 reference: run under ``compute-sanitizer --tool memcheck``.

    compute-sanitizer --tool memcheck python3 experiments/2026-11-27-variants-peers/sanitize.py
    NUMBA_ATTN_BACKEND=simulator python3 experiments/2026-11-27-variants-peers/sanitize.py --small   # smoke

Prefill phases: fp16 (fp32 for tc_tf32), B2 H4 / 2 KV heads, 300 queries over 333 keys (D 128, 64 for the CUDA-core
phases), causal, ``and_masks(sliding_window(50), document)`` (90-token documents) and ``softcap(5)``. Decode phases:
B2 H8 / 2 KV heads, q_len 3 (2 for paged_mma8) over 333 keys, D 128, ``sliding_window(64)``; paged ones by ``decode_paged`` with
16-token pages (``paged_mma8`` on an int8 cache). Prints one line per phase and "ALL OK" when every check passed.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn import variants as V  # noqa: E402
from numba_attn.spec.reference import check, reference  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="simulator shapes and the phases' sim_params")
    ap.add_argument("--phases", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    Nq, Nk, Dc, Dt = (13, 21, 16, 16) if a.small else (300, 333, 64, 128)
    bad = []
    for ph in na.list_phases():
        if ph.variants is not True or (a.phases and ph.name not in a.phases.split(",")):
            continue
        params = dict(ph.sim_params) if a.small else {}
        dtype = "float32" if ph.dtypes == ("float32",) else ("float16" if "float16" in ph.dtypes else ph.dtypes[0])
        try:
            if ph.kind == "prefill":
                D = Dc if "float32" in ph.dtypes and ph.name != "tc_tf32" else Dt
                q = rng.standard_normal((2, 4, Nq, D)).astype(dtype)
                k, v = (rng.standard_normal((2, 2, Nk, D)).astype(dtype) for _ in range(2))
                doc = (np.arange(Nk)[None, :] // (7 if a.small else 90) + np.arange(2)[:, None]).astype(np.int32)
                kw = dict(mask_mod=V.and_masks(V.sliding_window(5 if a.small else 50), V.document(doc)),
                          score_mod=V.softcap(5.0))
                out = na.attention(q, k, v, causal=True, phase=ph.name, **params, **kw)
                ref = reference(q, k, v, causal=True, variant=V.make_variant(kw["mask_mod"], kw["score_mod"]))
            else:
                Lq, D = (2 if ph.name == "paged_mma8" else 3), Dt  # (paged_mma8: q_len x group <= 8)
                kw = dict(mask_mod=V.sliding_window(6 if a.small else 64))
                q = rng.standard_normal((2, 8, Lq, D)).astype(dtype)
                k, v = (rng.standard_normal((2, 2, Nk, D)).astype(dtype) for _ in range(2))
                ref = reference(q, k, v, causal=True, variant=V.make_variant(kw["mask_mod"]))
                if ph.layout == "paged":
                    P = 16
                    nb = -(-Nk // P)
                    table = rng.permutation(2 * nb).astype(np.int32).reshape(2, nb)
                    kc = np.zeros((2 * nb, P, 2, D), dtype)
                    vc = np.zeros((2 * nb, P, 2, D), dtype)
                    for b in range(2):
                        for t in range(Nk):
                            kc[table[b, t // P], t % P] = k[b, :, t]
                            vc[table[b, t // P], t % P] = v[b, :, t]
                    extra = {}
                    if ph.name == "paged_mma8":
                        ks = np.abs(kc).max() / 127.0
                        vs = np.abs(vc).max() / 127.0
                        kc = np.clip(np.rint(kc / ks), -127, 127).astype(np.int8)
                        vc = np.clip(np.rint(vc / vs), -127, 127).astype(np.int8)
                        extra = dict(k_scale=float(ks), v_scale=float(vs))
                        kd = np.zeros_like(k, dtype=np.float32)
                        vd = np.zeros_like(v, dtype=np.float32)
                        for b in range(2):
                            for t in range(Nk):
                                kd[b, :, t] = kc[table[b, t // P], t % P] * ks
                                vd[b, :, t] = vc[table[b, t // P], t % P] * vs
                        ref = reference(q, kd, vd, causal=True, variant=V.make_variant(kw["mask_mod"]))
                    seqlens = np.full(2, Nk, np.int32)
                    out = na.decode_paged(q.transpose(0, 2, 1, 3).copy(), kc, vc, table, seqlens, causal=True,
                                          phase=ph.name, **extra, **params, **kw).transpose(0, 2, 1, 3)
                else:
                    out = na.attention(q, k, v, causal=True, phase=ph.name, **params, **kw)
            c = check(out, ref, dtype=dtype, precision=ph.precision)
            print(f"{ph.name:22s} {dtype:8s} {'OK' if c.ok else 'FAIL ' + str(c.reason)}", flush=True)
            if not c.ok:
                bad.append(ph.name)
        except Exception as exc:  # noqa: BLE001
            print(f"{ph.name:22s} ERROR {type(exc).__name__}: {exc}"[:400], flush=True)
            bad.append(ph.name)
    print("ALL OK" if not bad else f"FAILED: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
