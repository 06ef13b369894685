"""Phase 49 — ``ws_intra_lpt``: ws_intra_kv with the causal query blocks started longest first.

Change against ``ws_intra_kv`` (``longest_first``: :func:`.scheduler.query_block`): a block takes query block
``gridDim.x - 1 - blockIdx.x``. One block fills an SM (192-232 KB of ring, 384 threads), so the hardware runs the
grid as a list schedule in ``blockIdx`` order. Causally, query block i sees i + 1 key tiles, so the blocks started
last were the longest; an SM that is handed one at the end runs up to a whole item (N/Bc tiles) past the others.
Counted from the last, the last blocks started are one tile long (FlashAttention-2's causal order). Without a mask
the kernel is ``ws_intra_kv``'s.

Prediction: at B8 H32/8kv N1024 D128 causal (8 query blocks a head, 15.5 a SM, 4.5 tiles each on average) the tail
shrinks from up to 8 tiles to 1 of ~70 an SM: 1.03-1.08× ``ws_intra_kv``; 1.00-1.02× at N8192 causal.

Verdict: refuted (H200): B8 H32/8kv N1024 bf16 causal 0.217 ms against ws_intra_kv's 0.216 ms, B2 H16 N8192
0.9585 ms against 0.968 ms. The tail was not the cost: a work item costs 5.2-5.6 µs beside its tiles, cuDNN's
0.6-1.0 (experiments/2026-11-28-ws-intra). [results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_intra_kv]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.p47_ws_intra_kv import supports_intra_kv


@register_phase(
    name="ws_intra_lpt", order=49, title="Tensor cores: the causal query blocks started longest first",
    parent="ws_intra_kv",
    description="""
        ws_intra_kv whose block b takes query block gridDim.x - 1 - b: the hardware starts blocks in order,
        so the causal blocks with the most key tiles start first and the grid ends on one-tile blocks
        instead of the longest (a list schedule's tail is its last item).
    """,
    lineage="FlashAttention-2 (Dao 2023): causal query blocks in reverse order; LPT scheduling in FlashAttention-3",
    planned_speedup=175.0,  # ws_intra_kv's 170 and the predicted few percent on short causal sequences
    **wgmma_registration(supports_intra_kv, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 2, "Bc": 16, "stages": 2}),
)
def ws_intra_lpt(problem, warpgroups=0, Bc=0, stages=2, uniform=True):
    """ws_intra_kv's kernel with ``longest_first``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       longest_first=True)
