"""ws_tma_q_wide's two-consumer tile (resolve_wide: short N at D64) under compute-sanitizer: partial blocks, causal
and not, GQA, each output checked against float64.
  compute-sanitizer --tool memcheck python experiments/2026-11-29-short/memcheck.py"""
import numpy as np

import numba_attn as na
from numba_attn.phases.tensor_core.p55_ws_tma_q_wide import resolve_wide
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, reference

for n, nk, causal, hkv in ((100, 100, True, 2), (200, 330, False, 1), (512, 512, True, 2), (640, 600, False, 2)):
    p = Problem(batch=2, heads=2, kv_heads=hkv, q_len=n, kv_len=nk, head_dim=64, dtype="float16", causal=causal)
    assert resolve_wide(p, 0, 0, 2)["warpgroups"] == 2, p.label
    q, k, v = p.inputs(7)
    out = np.asarray(na.attention(q, k, v, causal=causal, phase="ws_tma_q_wide"))
    c = check(out, reference(q, k, v, causal=causal), dtype="float16")
    print(p.label, c)
    assert c.ok, p.label
print("all checked")
