"""``decode_mma`` and ``paged_mma`` with their rings' copies through L1 (``l1=True``: ``cp.async.ca``) under their own
names, and the preset ``gqa-l1``: paged fp16 GQA (32 query heads, 8 KV heads) at B8 KV 32k uniform and ragged
(KV <= 32k), B1 KV 32k (``paged_mma`` the default of all three; the twins run ``decode_mma``), and an fp8 cache
(per head) at B8 KV 32k through ``paged_mma``.

    PYTHONPATH=experiments/2026-11-26-mma-l1 python3 -m numba_attn.cli bench paged --setup variants \\
        --preset gqa-l1 --phases paged_mma,pmma_l1,decode_mma,dmma_l1
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant
from numba_attn.spec.problem import PRESETS, PagedProblem

_GQA = dict(heads=32, kv_heads=8, q_len=1, head_dim=128, dtype="float16", page_size=64)
PRESETS["gqa-l1"] = [
    PagedProblem(batch=8, kv_len=32768, **_GQA),
    PagedProblem(batch=8, kv_len=32768, ragged=True, **_GQA),
    PagedProblem(batch=1, kv_len=32768, **_GQA),
    PagedProblem(batch=8, kv_len=32768, kv_dtype="float8_e4m3", kv_scale="head", **_GQA),
]

register_variant("paged_mma", "pmma_l1", order=36.01, l1=True)
register_variant("decode_mma", "dmma_l1", order=34.01, l1=True)
