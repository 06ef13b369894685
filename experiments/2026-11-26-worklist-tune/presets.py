"""The preset ``paged-ragged-4k``: the ragged B8 H32 KV <= 4k D128 P64 fp16 target alone (issue 18's missed
0.95x), for a tuning sweep of ``paged_worklist``'s block shape.

    PYTHONPATH=experiments/2026-11-26-worklist-tune python3 -m numba_attn.cli tune paged_worklist \\
        --setup presets --preset paged-ragged-4k --timing cupti ...
"""
from __future__ import annotations

from numba_attn.spec.problem import PRESETS

PRESETS["paged-ragged-4k"] = PRESETS["paged-ragged"][:1]

# Part b: the best shapes of the sweep (README) under their own names, on the three ragged targets and B8 at uniform
# lengths (2048 keys), beside the defaults.
from numba_attn.phases.registry import register_variant  # noqa: E402
from numba_attn.spec.problem import PagedProblem  # noqa: E402

PRESETS.setdefault("paged-ragged-uniform", PRESETS["paged-ragged"] + [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=2048, head_dim=128, dtype="float16", page_size=64)])
register_variant("paged_worklist", "pwl_k4b1", order=39.11, keys=4, blocks_per_sm=1)
register_variant("paged_worklist", "pwl_w4k4b3", order=39.12, warps=4, keys=4, blocks_per_sm=3)
register_variant("paged_worklist", "pwl_w4k2b3", order=39.13, warps=4, keys=2, blocks_per_sm=3)
register_variant("paged_split_k", "psk_k4b1", order=35.11, keys=4, blocks_per_sm=1)
