"""Out-of-tree phases for the non-causal head_dim 128 gap (issue 16: ≥ 0.9× SDPA; 0.84–0.89× measured):
``warp_specialized_tc`` with 128-key tiles, with and without the uniform warp index. Bc=128 was timed only in a
run of its own (9e1a223), against Bc=64 from other runs on other machines, "within the runs' spread"; offline
its steady loop has 20 % fewer instructions per key (sm_90a, fp16, `loop_sass.py`: 663 a 128-key tile against
417 a 64-key tile with ``uniform``), 168 registers at entry, no spill.

* ``ws_bc128`` — ``Bc=128``;  ``ws_bc128_uniform`` — ``Bc=128, uniform=True``;
* ``ws_uniform`` (``uniform_phases.py``) is the Bc=64 twin of the second.

    PYTHONPATH=experiments/2026-11-23-hopper-tma python3 -m numba_attn.cli run --gpu --setup d128_phases ...
"""
from __future__ import annotations

import uniform_phases  # noqa: F401  (ws_uniform, ws_overlap_uniform)
from numba_attn.phases.registry import register_variant

register_variant("warp_specialized_tc", "ws_bc128", order=26.8, Bc=128)
register_variant("warp_specialized_tc", "ws_bc128_uniform", order=26.9, Bc=128, uniform=True)
