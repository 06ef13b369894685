"""One call of a backward phase at fp16 B1 H32 N4096 (a compile call first), for a profiler to look at:

    ncu --kernel-name regex:grad --launch-skip 2 --launch-count 1 python3 experiments/2026-11-27-bwd-fused/once.py PHASE D
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import numba_attn as na  # noqa: E402

phase, D = sys.argv[1], int(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn((1, 32, 4096, D), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
o, lse = na.attention(q, k, v, return_lse=True)
for _ in range(2):
    na.attention_backward(q, k, v, o, lse, do, phase=phase)
torch.cuda.synchronize()
