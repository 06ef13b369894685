"""Out-of-tree copies of ``paged_worklist`` at fixed worker counts (blocks per KV head: 4, 12, 16; the default
fills the SMs' slots once: 8 at H32 on 132 SMs), for timing them beside the default in one run:

    PYTHONPATH=experiments/2026-11-25-paged-worklist python3 -m numba_attn.cli bench paged \\
        --preset paged-ragged --setup worker_counts --phases paged_worklist,paged_worklist_w4,...
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant

for i, w in enumerate((4, 12, 16)):
    register_variant("paged_worklist", f"paged_worklist_w{w}", order=39.1 + i / 100, workers=w)
