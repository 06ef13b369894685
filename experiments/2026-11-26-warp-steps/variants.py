"""``paged_worklist`` with its shares cut in warp steps and dealt to the warps across items (``warp_steps=True``)
under its own name, ``pwl_ws``, beside the default (shares in whole rounds of the block's 8 warps, a barrier and
merge after every item), and the preset ``paged-ragged-uniform``: the three ragged fp16 targets and B8 at uniform
lengths (2048 keys each).

    PYTHONPATH=experiments/2026-11-26-warp-steps python3 -m numba_attn.cli bench paged --setup variants \\
        --preset paged-ragged-uniform --phases paged_worklist,pwl_ws,paged_split_k,decode_split_k_lean
"""
from __future__ import annotations

import inspect

from numba_attn.phases.registry import get_phase, register_variant
from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS.setdefault("paged-ragged-uniform", PRESETS["paged-ragged"] + [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=2048, head_dim=128, dtype="float16", page_size=64)])

# (the option existed from 7a65c37 to 3c2e5ca only, removed after part c)
if "warp_steps" in inspect.signature(get_phase("paged_worklist").build).parameters:
    register_variant("paged_worklist", "pwl_ws", order=39.06, warp_steps=True)
