"""Out-of-tree variants for the persistent-block run (issue 16). The CLI's ``--param`` sets one value per phase,
so each variant gets a name:

* ``wsp_uniform`` — ``ws_persistent`` with ``uniform=True`` (the warp index known warp-uniform);
* ``ws3`` — ``warp_specialized_tc`` with three consumer warpgroups (D64: 192 query rows a block);
* ``wsp3`` — ``ws_persistent`` with three consumer warpgroups.

    PYTHONPATH=experiments/2026-11-25-persistent python3 -m numba_attn.cli run --gpu --setup persistent_phases \\
        --phases warp_specialized_tc,ws_persistent,wsp_uniform -B 1 -H 32 -N 4096 -D 128 ...
"""
from __future__ import annotations

from numba_attn.phases.registry import register_variant

register_variant("ws_persistent", "wsp_uniform", order=40.1, uniform=True)
register_variant("warp_specialized_tc", "ws3", order=26.6, warpgroups=3)
register_variant("ws_persistent", "wsp3", order=40.2, warpgroups=3)
# the ablation: the persistent kernel with one block per work item (the grid is capped at the items), so the
# hardware schedules the items as it does warp_specialized_tc's blocks; what remains is the kernel's own code
register_variant("ws_persistent", "wsp_all", order=40.3, blocks=1 << 30)
