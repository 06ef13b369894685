"""An out-of-tree phase for timing ``lazy_rescale`` in the same run as its default: ``ws_lazy`` is
``warp_specialized_tc`` with ``lazy_rescale=True`` (FlashAttention-4's conditional rescale: a row's running max
moves only when a tile's exceeds it by more than 2^8 in base-2 units, and a warp multiplies O only when one of its
rows' max moved). The CLI's ``--param`` sets one value per phase, so the variant gets its own name:

    PYTHONPATH=experiments/2026-11-28-lazy-rescale python3 -m numba_attn.cli run --gpu --setup lazy_phases \\
        --phases warp_specialized_tc,ws_lazy ...
"""
from __future__ import annotations

from numba_attn.phases.registry import get_phase, register_phase

_ws = get_phase("warp_specialized_tc")


@register_phase(name="ws_lazy", order=26.6, title=_ws.title + " (lazy_rescale=True)", parent="warp_specialized_tc",
                requires_cc=_ws.requires_cc, description=_ws.description + "\n\nWith lazy_rescale=True.",
                lineage="FlashAttention-4: conditional softmax rescaling", planned_speedup=_ws.planned_speedup,
                dtypes=_ws.dtypes, head_dims=_ws.head_dims, sim_params=_ws.sim_params, supports=_ws.extra_supports,
                resolve=_ws.resolver)
def ws_lazy(problem, warpgroups=0, Bc=0, stages=_ws.params["stages"], uniform=False):
    return _ws.build(problem, warpgroups=warpgroups, Bc=Bc, stages=stages, uniform=uniform, lazy_rescale=True)
