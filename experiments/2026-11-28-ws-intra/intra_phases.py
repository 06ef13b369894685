"""Out-of-tree phases for timing ``ws_intra``'s settings in the same run as its default (and its parent):
``ws_intra_s4`` (four ring stages), ``ws_intra_u`` (the warp index made uniform), ``ws_intra_bc144`` (144-key tiles) and ``ws_intra_wg2`` (two
consumers with 128-key tiles, the default at D64 being three with 64-key tiles):

    PYTHONPATH=experiments/2026-11-28-ws-intra python3 -m numba_attn.cli run --gpu --setup intra_phases \\
        --phases warp_specialized_tc,ws_intra,ws_intra_s4,ws_intra_u ...
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase

_wi = get_phase("ws_intra")


def _register(suffix, order, fixed):
    """ws_intra with the parameters ``fixed`` and its automatic choice for the others (no parameters of its own)."""
    @register_phase(name=f"ws_intra_{suffix}", order=order, title=f"{_wi.title} ({fixed})", parent="ws_intra",
                    requires_cc=_wi.requires_cc, description=_wi.description + f"\n\nWith {fixed}.",
                    lineage=_wi.lineage, planned_speedup=_wi.planned_speedup, dtypes=_wi.dtypes,
                    head_dims=_wi.head_dims, precision=_wi.precision,
                    supports=lambda problem: _wi.supports(problem, **_wi.resolve(problem, fixed)))
    def phase(problem):
        return _wi.build(problem, **_wi.resolve(problem, fixed))

    return phase


ws_intra_s4 = _register("s4", 46.1, {"stages": 4})
ws_intra_u = _register("u", 46.2, {"uniform": True})
ws_intra_wg2 = _register("wg2", 46.3, {"warpgroups": 2, "Bc": 128})
ws_intra_bc144 = _register("bc144", 46.4, {"Bc": 144})  # three stages of 144 keys: 216 KB, the most that fits at D128
