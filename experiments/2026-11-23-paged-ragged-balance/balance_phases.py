"""Out-of-tree copies of ``paged_split_k`` with ``balance=True`` (each sequence cut into equal splits instead of
full splits and a remainder), with the ragged plan's split count and with fixed split counts (3, 5, 6, 8: on the
B8 KV <= 4k batch, splits of at most 1368, 824, 688 and 512 keys), and the fixed counts without balance, for
timing them beside the default in one run:

    PYTHONPATH=experiments/2026-11-23-paged-ragged-balance python3 -m numba_attn.cli bench paged \\
        --preset paged-ragged --setup balance_phases --phases paged_split_k,paged_split_k_bal,...
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant

register_variant("paged_split_k", "paged_split_k_bal", order=35.3, balance=True)
for i, s in enumerate((3, 5, 6, 8)):
    register_variant("paged_split_k", f"paged_split_k_bal_s{s}", order=35.4 + i / 100, balance=True, splits=s)
    register_variant("paged_split_k", f"paged_split_k_s{s}", order=35.5 + i / 100, splits=s)
