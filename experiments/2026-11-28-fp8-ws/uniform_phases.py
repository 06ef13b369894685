"""An out-of-tree phase for timing ``uniform=True`` in the same run as the default: ``fp8_ws_uniform`` is ``fp8_ws``
with the warp index taken from lane 0 (the ring stage and the QGMMA descriptors in the uniform datapath):

    PYTHONPATH=experiments/2026-11-28-fp8-ws python3 -m numba_attn.cli run --gpu --setup uniform_phases \\
        --phases fp8_ws,fp8_ws_uniform ...
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase

_ws = get_phase("fp8_ws")


@register_phase(name="fp8_ws_uniform", order=42.6, title=_ws.title + " (uniform=True)", parent="fp8_ws",
                requires_cc=_ws.requires_cc, description=_ws.description + "\n\nWith uniform=True.",
                lineage=_ws.lineage, planned_speedup=_ws.planned_speedup, dtypes=_ws.dtypes,
                head_dims=_ws.head_dims, precision=_ws.precision, sim_params=_ws.sim_params,
                supports=_ws.extra_supports, resolve=_ws.resolver)
def fp8_ws_uniform(problem, warpgroups=0, Bc=128, stages=3):
    return _ws.build(problem, warpgroups=warpgroups, Bc=Bc, stages=stages, uniform=True)
