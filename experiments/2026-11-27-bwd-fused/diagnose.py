"""Where bwd_wgmma_fused's time goes: the kernel rebuilt with one piece taken out or changed (CUPTI kernel time;
a variant that drops work computes wrong gradients and is timed only to locate the cost, its dq error printed).

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-bwd-fused/diagnose.py --out diag.json

fp16 B1 H32 N4096, D 64 and 128, not causal. Variants: as committed; no reduction issued; no wait for the staging
tile's read; the Q-tile walk of each key block started 2·kb tiles further (every block reducing into another dQ
tile at a time); no proxy fences; no dS stores; no dQ product (its accumulators read from shared memory); no
barrier before the reduction.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from numba import cuda  # noqa: E402

import numba_attn as na  # noqa: E402
import numba_attn.phases.backward.b06_bwd_wgmma_fused as F  # noqa: E402
from numba_attn.gpu.jit import device  # noqa: E402
from numba_attn.measure.config import TimingConfig  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402
from numba_attn.phases.backward.common import run_backward_launch  # noqa: E402

NAMES = ("bulk_reduce_add_f32", "bulk_wait_read", "kv_walk", "fence_proxy_async", "make_ds_store", "make_dq_product",
         "named_barrier_sync")
ORIG = {n: getattr(F, n) for n in NAMES}


@device
def no_reduce(dst, doff, src, soff, n):
    pass


@device
def no_wait(n):
    pass


@device
def no_fence():
    pass


@device
def no_barrier(i, n):
    pass


def no_ds_store():
    @device
    def store_ds(sm, ds_word, dSt, w, ww, g, t):
        pass

    return store_ds


def no_shuffle_store():
    """The stores of store_ds at the same addresses, each lane's own pair (wrong values: no shuffle)."""
    from numba_attn.gpu.convert import pack_f16x2, u32_as_f32

    @device
    def store_ds(sm, ds_word, dSt, w, ww, g, t):
        odd = g & 1
        r0 = 2 * t + odd
        jj = 16 * ww + g - odd
        for nt in range(F.Br // 8):
            r = 8 * nt + r0
            for hi in range(2):
                key = jj + 8 * hi
                x = ds_word + (w * F.M * 128 + r * 128 + 16 * ((key >> 3) ^ (r & 7)) + 2 * (key & 7)) // 4
                sm[x >> 2, x & 3] = u32_as_f32(pack_f16x2(dSt[4 * nt + 2 * hi], dSt[4 * nt + 2 * hi + 1]))

    return store_ds


def no_dq_product(bf16, D, Bc):
    @device
    def dq_product(acc, sm, a_off, sm2, b_off):
        for e in range(D // 4):
            acc[e] = sm[e, 0]

    return dq_product


def rotated_walk(Br, stage):
    first, following, q_tile_of = ORIG["kv_walk"](Br, stage)

    @device
    def q_rot(pos, walk):
        G, t0, n_plain, b, h0, kb, mods = walk
        return t0 + (pos[1] + 2 * kb) % n_plain

    return first, following, q_rot


VARIANTS = {"as committed": {}, "no reduction": {"bulk_reduce_add_f32": no_reduce},
            "no read wait": {"bulk_wait_read": no_wait}, "rotated walk": {"kv_walk": rotated_walk},
            "no proxy fences": {"fence_proxy_async": no_fence}, "no dS stores": {"make_ds_store": no_ds_store},
            "no dQ product": {"make_dq_product": no_dq_product},
            "stores without shuffles": {"make_ds_store": no_shuffle_store},
            "no staging barrier": {"named_barrier_sync": no_barrier}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated variants (with the committed one)")
    a = ap.parse_args()
    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "rows": []}
    stream = torch.cuda.current_stream()
    N = 4096
    for D in (64, 128):
        g = torch.Generator(device="cuda").manual_seed(D)
        q, k, v, do = (torch.randn((1, 32, N, D), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
        o, lse = na.attention(q, k, v, return_lse=True)
        prob = na.Problem(batch=1, heads=32, q_len=N, head_dim=D, dtype="float16")
        ref = None
        row = {"D": D, "ms": {}, "dq_err": {}, "kernels": {}}
        for name, patch in VARIANTS.items():
            for n, f in ORIG.items():
                setattr(F, n, patch.get(n, f))
            F.make_grad_fused.cache_clear()
            F.fused_kv_tile.cache_clear()
            if a.only and name not in a.only.split(",") and name != "as committed":
                continue
            launch = F.bwd_wgmma_fused(prob, stages=2)
            grads = [torch.empty_like(x) for x in (q, k, v)]

            ins = [cuda.as_cuda_array(x) for x in (q, k, v, o, lse, do)]
            outs = [cuda.as_cuda_array(x) for x in grads]

            nb = cuda.external_stream(stream.cuda_stream)

            def make_call(launch, ins, outs):
                return lambda i: run_backward_launch(launch, ins, outs, stream=nb)

            call = make_call(launch, ins, outs)

            call(0)
            torch.cuda.synchronize()  # (the first call compiles)
            if ref is None:
                ref = [x.clone() for x in grads]
            row["dq_err"][name] = [float((x.float() - r.float()).abs().max()) for x, r in zip(grads, ref)]
            times = []
            for _ in range(3):
                r = cupti_kernel_time(call, stream, TimingConfig(), calls=5)
                times.append(r["time_ms"])
            row["ms"][name] = round(statistics.median(times), 4)
            row["kernels"][name] = [(x["name"][-20:], x.get("time_ms")) for x in r.get("kernels", [])]
            print(json.dumps({"D": D, name: row["ms"][name], "err": row["dq_err"][name]}), flush=True)
        res["rows"].append(row)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
