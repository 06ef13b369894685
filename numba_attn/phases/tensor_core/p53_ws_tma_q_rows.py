"""Phase 53 — ``ws_tma_q_rows``: ws_tma_q whose epilogue stores through its two rows' views, made once.

Change against ``ws_tma_q`` (``o_rows``: :func:`.epilogue.store_rows`): each store of O was its row's address
rebuilt from the array's strides (reloaded, 64-bit index products and a wraparound check a store: 759 instructions
at D128); with the two rows' views made once a store is a base address and a constant offset (244). Tried before
on ``ws_intra_kv`` (H200, c87c407): the epilogue went from 2.24 to 1.66 µs an item but the call did not move (the
block's exit waited for its stores), and the persistent kernels, Q in registers, spilled 8-60 bytes. Here Q is out
of the registers and the next item starts while the stores drain, so both reasons are gone; the epilogue is the
largest part of an item beside its tiles (2.6 µs of 2.9 at B8 N1024, ``numba-attn trace``).

Prediction: 1.02-1.04× ``ws_tma_q`` at B8 H32/8kv N1024 D128 (0.6 µs of an item's ~16 µs), within 1 % at N8192.

Verdict: refuted (H200): 0.2573 ms against 0.2550 at B8 N1024, causal 0.1817 against 0.1786, N4096 fp16 0.4437
against 0.4402 (0.98-0.99×). Traced, the epilogue is 0.5-0.8 µs shorter and the next item starts as much earlier,
then waits for its Q (0.15 → 0.8-0.9 µs): Q's load, issued once the last loop ends, is now the critical path.
[results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_tma_q, torch_sdpa_cudnn]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.p52_ws_tma_q import supports_tma_q


@register_phase(
    name="ws_tma_q_rows", order=53, title="Tensor cores: ws_tma_q's epilogue through its rows' views",
    parent="ws_tma_q",
    description="""
        ws_tma_q whose epilogue makes the views of its lane's two output rows once and stores each packed
        pair at a constant offset from them, instead of indexing the output array a store.
    """,
    lineage="a store's address arithmetic hoisted (CUTLASS's epilogue iterators: a base pointer, constant strides)",
    planned_speedup=185.0,  # ws_tma_q's 180 and the predicted few percent on short sequences
    **wgmma_registration(supports_tma_q, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
                         launch_params=("blocks",)),
)
def ws_tma_q_rows(problem, warpgroups=0, Bc=0, stages=2, uniform=True, blocks=0):
    """ws_tma_q's kernel with ``o_rows``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       blocks=blocks, balanced=True, q_tma=True, o_rows=True)
