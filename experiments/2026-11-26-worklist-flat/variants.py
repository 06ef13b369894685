"""``paged_worklist`` with one work list over every (sequence, KV head) (``flat=True``) under its own name, beside
the default (a list per KV head), and the preset ``paged-ragged-uniform``: the three ragged fp16 targets and the B8
batch at uniform lengths (2048 keys each: one item per block for the list per KV head).

    PYTHONPATH=experiments/2026-11-26-worklist-flat python3 -m numba_attn.cli bench paged --setup variants \\
        --preset paged-ragged-uniform --phases paged_worklist,pwl_flat,paged_split_k,decode_split_k_lean

(At ed98ef3, the commit of the README's run, the flat list was the default and ``pwl_heads`` the list per KV
head.)
"""
from __future__ import annotations

import inspect

from numba_attn.phases.registry import get_phase, register_variant
from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS["paged-ragged-uniform"] = PRESETS["paged-ragged"] + [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=2048, head_dim=128, dtype="float16", page_size=64)]

register_variant("paged_worklist", "pwl_flat", order=39.01, flat=True)

# Part c: smaller blocks, more of them per SM (the same 16 warps per SM, 128-register cap): a round of the block's
# warps is 32 (4 warps) or 16 keys (2 warps) instead of 64, so a sequence's last partial round and a share's
# rounding cost less.
register_variant("paged_worklist", "pwl_w4b4", order=39.02, warps=4, blocks_per_sm=4)
register_variant("paged_worklist", "pwl_w2b8", order=39.03, warps=2, blocks_per_sm=8)

# Part d: the next item's first warp steps prefetched to L2 while the block ends this one (next_item 1 and 2;
# the option existed at 6da930f only, removed after the run).
if "next_item" in inspect.signature(get_phase("paged_worklist").build).parameters:
    register_variant("paged_worklist", "pwl_nx1", order=39.04, next_item=1)
    register_variant("paged_worklist", "pwl_nx2", order=39.05, next_item=2)
