"""One call each of numba-attn's best backward and forward phases and of SDPA cuDNN's, fp16 B1 H32 N4096 D128 (or
the argv's D and causal), inside a profiler range after warm-ups, for Nsight Compute to compare:

    ncu --profile-from-start off --set full python3 experiments/2026-11-28-profile/profile.py 128 0
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import numba_attn as na  # noqa: E402

D, causal = int(sys.argv[1]), bool(int(sys.argv[2]))
which = sys.argv[3].split(",") if len(sys.argv) > 3 else ["bwd", "cudnn_bwd", "fwd", "cudnn_fwd"]
fwd_phase = os.environ.get("FWD_PHASE", "warp_specialized_tc")
bwd_phase = os.environ.get("BWD_PHASE", "bwd_wgmma_fused")
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn((1, 32, 4096, D), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
o, lse = na.attention(q, k, v, causal=causal, return_lse=True)
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
calls = {
    "bwd": lambda: na.attention_backward(q, k, v, o, lse, do, causal=causal, phase=bwd_phase),
    "cudnn_bwd": lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True),
    "fwd": lambda: na.attention(q, k, v, causal=causal, phase=fwd_phase),
    "cudnn_fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
}
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for name in which:
        for _ in range(3):
            calls[name]()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name in which:
        calls[name]()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
print("profiled", which, "D", D, "causal", causal)
