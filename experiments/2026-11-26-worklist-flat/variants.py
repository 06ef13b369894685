"""``paged_worklist`` with one work list over every (sequence, KV head) (``flat=True``) under its own name, beside
the default (a list per KV head), and the preset ``paged-ragged-uniform``: the three ragged fp16 targets and the B8
batch at uniform lengths (2048 keys each: one item per block for the list per KV head).

    PYTHONPATH=experiments/2026-11-26-worklist-flat python3 -m numba_attn.cli bench paged --setup variants \\
        --preset paged-ragged-uniform --phases paged_worklist,pwl_flat,paged_split_k,decode_split_k_lean

(At ed98ef3, the commit of the README's run, the flat list was the default and ``pwl_heads`` the list per KV
head.)
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant
from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS["paged-ragged-uniform"] = PRESETS["paged-ragged"] + [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=2048, head_dim=128, dtype="float16", page_size=64)]

register_variant("paged_worklist", "pwl_flat", order=39.01, flat=True)
