"""An out-of-tree phase for timing three consumer warpgroups at D64 in the same run as the default two:
``fp8_ws_wg3`` is ``fp8_ws`` with ``warpgroups=3`` (152 registers a consumer thread, no spills at D64):

    PYTHONPATH=experiments/2026-11-28-fp8-ws python3 -m numba_attn.cli run --gpu --setup wg3_phases \\
        --phases fp8_ws,fp8_ws_wg3 -D 64 ...
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase

_ws = get_phase("fp8_ws")


@register_phase(name="fp8_ws_wg3", order=42.5, title=_ws.title + " (three consumer warpgroups)", parent="fp8_ws",
                requires_cc=_ws.requires_cc, description=_ws.description + "\n\nWith warpgroups=3.",
                lineage=_ws.lineage, planned_speedup=_ws.planned_speedup, dtypes=_ws.dtypes,
                head_dims=(16, 32, 64), precision=_ws.precision, sim_params=_ws.sim_params,
                supports=_ws.extra_supports)
def fp8_ws_wg3(problem, warpgroups=3, Bc=128, stages=3):
    return _ws.build(problem, warpgroups=warpgroups, Bc=Bc, stages=stages)
