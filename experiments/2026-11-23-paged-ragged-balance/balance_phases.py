"""Out-of-tree copies of ``paged_split_k`` with ``balance=True`` (each sequence cut into equal splits instead of
full splits and a remainder), with the ragged plan's split count and with fixed split counts (3, 5, 6, 8: on the
B8 KV <= 4k batch, splits of at most 1366, 820, 683 and 512 keys), for timing them beside the default in one run:

    PYTHONPATH=experiments/2026-11-23-paged-ragged-balance python3 -m numba_attn.cli bench paged \\
        --preset paged-ragged --setup balance_phases --phases paged_split_k,paged_split_k_bal,...
"""
from __future__ import annotations

import inspect

from numba_attn.phases.registry import get_phase, register_phase


def _variant(name: str, order: float, note: str, **fixed):
    ph = get_phase("paged_split_k")
    sig = inspect.signature(ph.build)  # the parameters and defaults of paged_split_k, ``fixed`` as new defaults

    def build(problem, **params):
        return ph.build(problem, **params)

    build.__signature__ = sig.replace(parameters=[p.replace(default=fixed.get(p.name, p.default))
                                                  for p in sig.parameters.values()])
    register_phase(name=name, order=order, title=ph.title + f" ({note})", parent="paged_split_k",
                    kind=ph.kind, description=ph.description + f"\n\nWith {note}.", lineage=ph.lineage,
                    planned_speedup=ph.planned_speedup, dtypes=ph.dtypes, head_dims=ph.head_dims,
                    sim_params=ph.sim_params, supports=ph.extra_supports, resolve=ph.resolver, layout=ph.layout,
                    launch_params=ph.launch_params)(build)
    return build


def _register():
    _variant("paged_split_k_bal", 35.3, "balance=True", balance=True)
    for i, s in enumerate((3, 5, 6, 8)):
        _variant(f"paged_split_k_bal_s{s}", 35.4 + i / 100, f"balance=True, splits={s}", balance=True, splits=s)
        _variant(f"paged_split_k_s{s}", 35.5 + i / 100, f"splits={s}", splits=s)


_register()
