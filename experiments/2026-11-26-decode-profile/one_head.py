"""The uniform B8 H32 KV 2024 batch as 256 sequences of one head (B256 H1, the same 2024 keys each, the same bytes,
one block per sequence as there is one per (sequence, head) in B8 H32): a page then holds 64 consecutive key rows
of one head (16 KiB, contiguous) instead of 64 rows every 8 KiB (the 32 heads' rows of a token side by side), so
the paged rows against their contiguous twin show what the (token, head) interleaving costs, apart from the table.

    PYTHONPATH=experiments/2026-11-26-decode-profile python3 -m numba_attn.cli bench paged --setup one_head \\
        --preset paged-one-head --phases paged_split_k,decode_split_k_lean
"""
from __future__ import annotations

from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS["paged-one-head"] = [PagedProblem(batch=256, heads=1, q_len=1, kv_len=2024, head_dim=128, dtype="float16",
                                          page_size=p) for p in (64, 256)]

# The same comparison for an int8 cache with a per-head scale (paged_split_k's mma path) and for fp16, at 16k keys a
# sequence: B8 H32 (a head's 128-byte int8 row every 4 KiB) against B256 H1 (a page is 8 KiB of one head's rows).
PRESETS["paged-one-head-16k"] = [
    PagedProblem(batch=b, heads=h, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64, **kv)
    for kv in ({"kv_dtype": "int8", "kv_scale": "head"}, {}) for b, h in ((8, 32), (256, 1))]
