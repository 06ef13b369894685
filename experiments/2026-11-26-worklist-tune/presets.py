"""The preset ``paged-ragged-4k``: the ragged B8 H32 KV <= 4k D128 P64 fp16 target alone (issue 18's missed
0.95x), for a tuning sweep of ``paged_worklist``'s block shape.

    PYTHONPATH=experiments/2026-11-26-worklist-tune python3 -m numba_attn.cli tune paged_worklist \\
        --setup presets --preset paged-ragged-4k --timing cupti ...
"""
from __future__ import annotations

from numba_attn.spec.problem import PRESETS

PRESETS["paged-ragged-4k"] = PRESETS["paged-ragged"][:1]
