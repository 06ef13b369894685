"""``paged_split_k``'s ``stages`` (the mma path: the cache rows and per-token scales through a per-warp ``cp.async``
ring of warp steps in shared memory) under its own names, timed beside the default (direct 16-byte loads into the
fragments) in one run, on the presets ``paged-8bit-16k`` and ``paged-8bit-32k`` (B8 H32 D128 P64; int8 per head,
int8 per token, fp8 per head).

    PYTHONPATH=experiments/2026-11-26-decode-ring python3 -m numba_attn.cli bench paged --setup ring \\
        --preset paged-8bit-16k --phases paged_split_k,psk_st2,psk_st3,psk_st4,decode_split_k_lean
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant
from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS["paged-8bit-16k"] = [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype=kd, kv_scale=sc)
    for kd, sc in (("int8", "head"), ("int8", "token"), ("float8_e4m3", "head"))]
PRESETS["paged-8bit-32k"] = [PagedProblem(**{**p.to_dict(), "kv_len": 32768}) for p in PRESETS["paged-8bit-16k"]]

for st in (2, 3, 4):
    register_variant("paged_split_k", f"psk_st{st}", order=35 + st / 100, stages=st)
for st in (3, 4):  # one block per SM: the registers up to 255 (two blocks: 128, the ring spilled at first)
    register_variant("paged_split_k", f"psk_st{st}b1", order=35.05 + st / 100, stages=st, blocks_per_sm=1)
