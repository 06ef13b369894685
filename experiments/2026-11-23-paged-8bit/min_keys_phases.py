"""Out-of-tree copies of ``paged_split_k`` with a larger minimum of keys per split (``min_keys``, 256 by
default), for timing them beside the default in one run: on ragged batches of short sequences (B8, lengths
uniform up to 4k) the ragged plan gives 16 splits of 256 keys, too short for their fixed cost
(docs/decode-notes.md). ``paged_split_k_mk1024`` and ``paged_split_k_mk2048`` change only that default:

    PYTHONPATH=experiments/2026-11-23-paged-8bit python3 -m numba_attn.cli bench paged --preset paged-ragged \\
        --setup min_keys_phases --phases paged_split_k,paged_split_k_mk1024,paged_split_k_mk2048,paged_mma,... 
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase


def _variant(min_keys: int, order: float):
    ph = get_phase("paged_split_k")
    name = f"paged_split_k_mk{min_keys}"

    @register_phase(name=name, order=order, title=ph.title + f" (min_keys={min_keys})", parent="paged_split_k",
                    kind=ph.kind, description=ph.description + f"\n\nWith min_keys={min_keys}.", lineage=ph.lineage,
                    planned_speedup=ph.planned_speedup, dtypes=ph.dtypes, head_dims=ph.head_dims,
                    sim_params=ph.sim_params, supports=ph.extra_supports, resolve=ph.resolver, layout=ph.layout,
                    launch_params=ph.launch_params)
    def build(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=min_keys, fuse_max=64,
              wide=None, mma=None):
        return ph.build(problem, warps=warps, lanes=lanes, rows=rows, keys=keys, splits=splits,
                        blocks_per_sm=blocks_per_sm, min_keys=min_keys, fuse_max=fuse_max, wide=wide, mma=mma)

    return build


mk1024 = _variant(1024, 35.1)
mk2048 = _variant(2048, 35.2)
