"""Attention variants on numba-attn beside FlexAttention, FlashAttention-4 and SDPA/cuDNN: CUPTI kernel time,
all in one process, the implementations interleaved over rounds.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-variants-peers/peers.py --out peers.json

Problems (bf16, B1 H32 D128, as the variants issue's peer table): causal N8192; sliding window 1024 (causal)
at N8192 and N32768; document mask (1000-token documents) + causal at N8192; softcap 30 + causal at N8192; and
the full-tile pair: plain non-causal N4096 against the same problem under a ``key_padding`` mask that keeps every
key (every tile FULL: no mask is applied, only the block mask's lists are walked).

Implementations: numba-attn ``phase=None`` (the phase it names is recorded), ``warp_specialized_tc`` and
``ws_persistent``;
FlexAttention (``torch.compile(flex_attention)`` with ``create_block_mask`` / ``score_mod``); FlashAttention-4
(``flash_attn.cute.flash_attn_func``: ``causal``, ``window_size=(1023, 0)``, ``softcap=30``), where it has the
variant; SDPA under the cuDNN backend for plain causal/non-causal. A missing peer is a row with its reason.

Correctness first, at every N8192/N4096 problem: each output against a float32 reference computed head by head
on the GPU (scores, the same mask and score function, softmax, times V); an implementation whose error is over
3x FlexAttention's on that problem (or NaN) is not timed. Timing: ``numba_attn.measure.cupti.cupti_kernel_time``
(the sum of every kernel of one call, median over the profiled calls), the same function for every side; 3 rounds,
the implementations in turn within each round; the median of the rounds is reported.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn import variants as V  # noqa: E402
from numba_attn.measure.config import TimingConfig  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402

B, H, D = 1, 32, 128
DOC = 1000


def problems():
    """(name, N, causal, kind): kind picks the mask/score functions below."""
    return [("causal", 8192, True, "plain"), ("window 1024", 8192, True, "window"),
            ("window 1024", 32768, True, "window"), ("document 1000 + causal", 8192, True, "document"),
            ("softcap 30 + causal", 8192, True, "softcap"), ("plain, not causal", 4096, False, "plain"),
            ("all-keys key_padding (every tile full)", 4096, False, "allkeys")]


def ours_kwargs(kind, N):
    if kind == "window":
        return dict(mask_mod=V.sliding_window(1023))
    if kind == "document":
        return dict(mask_mod=V.document((np.arange(N)[None, :] // DOC).astype(np.int32)))
    if kind == "softcap":
        return dict(score_mod=V.softcap(30.0))
    if kind == "allkeys":
        return dict(mask_mod=V.key_padding(np.array([N], np.int32)))
    return {}


def visible(kind, N, causal, dev):
    """Boolean (N, N) of what a query sees, for the reference and FlexAttention's block mask."""
    i = torch.arange(N, device=dev)[:, None]
    j = torch.arange(N, device=dev)[None, :]
    m = (j <= i) if causal else torch.ones((N, N), dtype=torch.bool, device=dev)
    if kind == "window":
        m = m & (j >= i - 1023)
    if kind == "document":
        m = m & (i // DOC == j // DOC)
    return m


def reference(q, k, v, kind, causal):
    N = q.shape[2]
    scale = 1.0 / math.sqrt(D)
    seen = visible(kind, N, causal, q.device)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for h in range(q.shape[1]):
        s = (q[0, h].float() @ k[0, h].float().T) * scale
        if kind == "softcap":
            s = 30.0 * torch.tanh(s / 30.0)
        s = s.masked_fill(~seen, float("-inf"))
        out[0, h] = torch.softmax(s, -1) @ v[0, h].float()
    return out


def flex_fn(q, k, v, kind, N, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.arange(N, device=q.device) // DOC

    def mask_mod(b, h, qi, kj):
        m = (kj <= qi) if causal else (kj >= 0)
        if kind == "window":
            m = m & (kj >= qi - 1023)
        if kind == "document":
            m = m & (doc[qi] == doc[kj])
        return m

    def softcap(score, b, h, qi, kj):
        return 30.0 * torch.tanh(score / 30.0)

    bm = create_block_mask(mask_mod, None, None, N, N, device=q.device)
    fa = torch.compile(flex_attention)
    sm = softcap if kind == "softcap" else None
    return lambda: fa(q, k, v, score_mod=sm, block_mask=bm)


def fa4_fn(q, k, v, kind, causal):
    if kind not in ("plain", "window", "softcap"):
        return None, "FlashAttention-4's flash_attn_func has no such variant argument"
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:  # noqa: BLE001
        return None, f"flash_attn.cute not importable: {type(exc).__name__}: {exc}"[:300]
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (B, N, H, D), outside the timed calls
    kw = dict(causal=causal)
    if kind == "window":
        kw["window_size"] = (1023, 0)
    if kind == "softcap":
        kw["softcap"] = 30.0

    def call():
        o = flash_attn_func(qt, kt, vt, **kw)
        return (o[0] if isinstance(o, tuple) else o).transpose(1, 2)
    return call, None


def sdpa_fn(q, k, v, kind, causal):
    if kind != "plain":
        return None, "only plain (causal or not) problems run on SDPA's cuDNN backend here"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call, None


def one_arg(fn):
    """``fn`` as the timing's ``fn(i)`` (a second parameter would be taken for the stream)."""
    return lambda i: fn()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--only", default=None, help="comma-separated problem kinds to run")
    a = ap.parse_args()
    dev = torch.device("cuda")
    res = {"env": environment(), "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "torch": torch.__version__,
           "problem": f"bf16 B{B} H{H} D{D}", "rows": []}
    cfg = TimingConfig()
    stream = torch.cuda.current_stream()

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)

    for name, N, causal, kind in problems():
        if a.only and kind not in a.only.split(","):
            continue
        t0 = time.time()
        g = torch.Generator(device=dev).manual_seed(N + len(name))
        q, k, v = (torch.randn((B, H, N, D), generator=g, device=dev, dtype=torch.bfloat16) for _ in range(3))
        impls, why = {}, {}
        kw = ours_kwargs(kind, N)
        for label, phase in (("numba-attn (phase=None)", None),
                             ("numba-attn warp_specialized_tc", "warp_specialized_tc"),
                             ("numba-attn ws_persistent", "ws_persistent")):
            o = torch.empty_like(q)
            try:
                ran = na.explain(q, k, v, causal=causal, phase=phase, **kw).name
                impls[f"{label}"] = (lambda o=o, phase=phase: na.attention(q, k, v, causal=causal, phase=phase,
                                                                           out=o, **kw))
                why[label + " runs"] = ran
            except Exception as exc:  # noqa: BLE001
                why[label] = f"{type(exc).__name__}: {exc}"[:300]
        try:
            impls["FlexAttention"] = flex_fn(q, k, v, kind, N, causal)
        except Exception as exc:  # noqa: BLE001
            why["FlexAttention"] = f"{type(exc).__name__}: {exc}"[:300]
        for label, maker in (("FlashAttention-4", lambda: fa4_fn(q, k, v, kind, causal)),
                             ("SDPA cuDNN", lambda: sdpa_fn(q, k, v, kind, causal))):
            fn, reason = maker()
            if fn is None:
                why[label] = reason
            else:
                impls[label] = fn
        row = {"variant": name, "N": N, "causal": causal, "kind": kind, "notes": why, "errors": {}, "ms": {}}
        ref = reference(q, k, v, kind, causal) if N <= 8192 else None
        outs = {}
        for label, fn in list(impls.items()):
            try:
                out = fn()
                torch.cuda.synchronize()
                outs[label] = out
                if ref is not None:
                    row["errors"][label] = float((out.float() - ref).abs().max())
            except Exception as exc:  # noqa: BLE001
                row["notes"][label] = f"failed: {type(exc).__name__}: {exc}"[:400]
                traceback.print_exc()
                impls.pop(label)
        if ref is None and "FlashAttention-4" in outs:  # N32768: against FlashAttention-4's output
            row["errors_vs_fa4"] = {lb: float((o.float() - outs["FlashAttention-4"].float()).abs().max())
                                    for lb, o in outs.items()}
        del ref, outs
        flex_err = row["errors"].get("FlexAttention")
        for label in list(impls):
            e = row["errors"].get(label)
            if e is not None and (not math.isfinite(e) or (flex_err is not None and e > 3 * flex_err + 1e-3)):
                row["notes"][label] = f"not timed: error {e} against FlexAttention's {flex_err}"
                impls.pop(label)
        per = {label: [] for label in impls}
        for _ in range(a.rounds):
            for label, fn in impls.items():
                try:
                    t = cupti_kernel_time(one_arg(fn), stream, cfg, calls=a.calls)
                    per[label].append(t["time_ms"])
                    row.setdefault("kernels", {})[label] = t.get("kernels")
                except Exception as exc:  # noqa: BLE001
                    row["notes"][label] = f"timing failed: {type(exc).__name__}: {exc}"[:300]
        row["ms"] = {label: round(statistics.median(t), 4) for label, t in per.items() if t}
        row["rounds_ms"] = {label: [round(x, 4) for x in t] for label, t in per.items()}
        row["seconds"] = round(time.time() - t0, 1)
        res["rows"].append(row)
        print(json.dumps({k: row[k] for k in ("variant", "N", "ms", "errors", "notes")}, default=str), flush=True)
        save()
        del q, k, v
        torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
