"""Two out-of-tree phases for timing the ``uniform`` option in the same run as its default: ``ws_uniform`` is
``warp_specialized_tc`` with ``uniform=True`` and ``ws_overlap_uniform`` is ``ws_overlap`` with it (the warp
index broadcast from lane 0, so that ptxas builds the wgmma descriptors and the ring counters in the uniform
datapath; docs/tensor-core-notes.md, "Uniform warp index"). The CLI's ``--param`` sets one value per phase,
so the variants get their own names:

    PYTHONPATH=experiments/2026-11-23-hopper-tma python3 -m numba_attn.cli run --gpu --setup uniform_phases \\
        --phases warp_specialized_tc,ws_uniform,ws_overlap,ws_overlap_uniform ...
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase


def _variant(base: str, name: str, order: float):
    ph = get_phase(base)
    stages = ph.params["stages"]

    @register_phase(name=name, order=order, title=ph.title + " (uniform=True)", parent=base,
                    requires_cc=ph.requires_cc, description=ph.description + "\n\nWith uniform=True.",
                    lineage=ph.lineage, planned_speedup=ph.planned_speedup, dtypes=ph.dtypes, head_dims=ph.head_dims,
                    sim_params=ph.sim_params, supports=ph.extra_supports, resolve=ph.resolver)
    def build(problem, warpgroups=0, Bc=64, stages=stages, uniform=True):
        return ph.build(problem, warpgroups=warpgroups, Bc=Bc, stages=stages, uniform=uniform)

    return build


ws_uniform = _variant("warp_specialized_tc", "ws_uniform", 26.5)
ws_overlap_uniform = _variant("ws_overlap", "ws_overlap_uniform", 37.5)
