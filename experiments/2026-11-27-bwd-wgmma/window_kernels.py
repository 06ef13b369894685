"""Where a windowed backward's time goes: the kernels of one ``attention_backward`` call of bwd_wgmma_overlap,
causal and causal + a 1024-key window, fp16 B1 H32 N16384 D128 (CUPTI, 5 calls, the per-kernel medians).

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-27-bwd-wgmma/window_kernels.py
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import numba_attn as na  # noqa: E402
from numba_attn import variants as V  # noqa: E402
from numba_attn.measure.config import TimingConfig  # noqa: E402
from numba_attn.measure.cupti import cupti_kernel_time  # noqa: E402

N, D = 16384, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn((1, 32, N, D), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
for name, mask in (("causal", None), ("window1024", V.sliding_window(1023))):
    o, lse = na.attention(q, k, v, causal=True, mask_mod=mask, return_lse=True)
    fn = (lambda o=o, lse=lse, mask=mask: na.attention_backward(q, k, v, o, lse, do, causal=True,
                                                                 phase="bwd_wgmma_overlap", mask_mod=mask))
    fn()
    r = cupti_kernel_time(lambda i: fn(), torch.cuda.current_stream(), TimingConfig(), calls=5)
    print(json.dumps({"case": name, "ms": round(r["time_ms"], 4),
                      "kernels": [(x["name"][-40:], round(x.get("time_ms") or 0, 4)) for x in r.get("kernels", [])]}))
