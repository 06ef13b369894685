"""Out-of-tree phases for timing ``fp8_ws``'s wider key tiles in the same run as the default (Bc=128):
``fp8_ws_bc192`` (Vᵀ in three 64-byte boxes a stage) and ``fp8_ws_bc256`` (two 128-byte boxes; two stages at
D128 hold 128 KB), both with the default's other parameters:

    PYTHONPATH=experiments/2026-11-28-fp8-ws python3 -m numba_attn.cli run --gpu --setup tile_phases \\
        --phases fp8_ws,fp8_ws_bc192,fp8_ws_bc256 ...
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase

_ws = get_phase("fp8_ws")


def _register(Bc, order):
    @register_phase(name=f"fp8_ws_bc{Bc}", order=order, title=f"{_ws.title} (Bc={Bc})", parent="fp8_ws",
                    requires_cc=_ws.requires_cc, description=_ws.description + f"\n\nWith Bc={Bc}.",
                    lineage=_ws.lineage, planned_speedup=_ws.planned_speedup, dtypes=_ws.dtypes,
                    head_dims=_ws.head_dims, precision=_ws.precision, sim_params=_ws.sim_params,
                    supports=lambda problem, warpgroups, stages: _ws.extra_supports(problem, warpgroups, Bc, stages),
                    resolve=lambda problem, warpgroups, stages: _ws.resolver(problem, warpgroups, Bc, stages))
    def phase(problem, warpgroups=0, stages=3):
        return _ws.build(problem, warpgroups=warpgroups, Bc=Bc, stages=stages)

    return phase


fp8_ws_bc192 = _register(192, 42.7)
fp8_ws_bc256 = _register(256, 42.8)
