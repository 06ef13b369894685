"""The preset ``paged-uniform``: the ragged B8 KV <= 4k target's shape with every sequence at its mean length (2024
keys, P64, fp16), so that ``paged_worklist`` runs one whole sequence per block (one item) and ``paged_split_k``
one split: what the block table alone costs against the contiguous twin (the same lengths and bytes), apart from the
ragged batch's items, shares and combines.

    PYTHONPATH=experiments/2026-11-26-h200-targets python3 -m numba_attn.cli bench paged --preset paged-uniform \\
        --setup paged_uniform --phases paged_split_k,paged_worklist,decode_split_k_lean
"""
from __future__ import annotations

from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS["paged-uniform"] = [PagedProblem(batch=8, heads=32, q_len=1, kv_len=2024, head_dim=128, dtype="float16",
                                         page_size=64)]
