"""Phase 54 — ``ws_tma_q_early``: ws_tma_q_rows whose consumers release Q after the item's last S = Q·Kᵀ.

Change against ``ws_tma_q_rows`` (``q_early``: :func:`.p46_ws_intra.intra_mainloop` releases Q in the loop): a
consumer warp gave Q's tiles back after its tile loop, so the producer issued the next item's Q only once every
warp had run its last tile's softmax and P·V (ws_tma_q_rows, traced: the shorter epilogue made the next item wait
0.8-0.9 µs for Q instead of 0.15). Here a warp releases Q as soon as its last S is complete — plain attention: at
the last key tile its rows see, a variant's walk: at its last tile — and the producer issues the next item's Q
before that item's first K/V tile (whose stage frees only after that S), so it lands under the last tile's
softmax, its P·V and the epilogue.

Prediction: 1.02-1.04× ``ws_tma_q`` at B8 H32/8kv N1024 D128 (the 0.5-0.8 µs the row-view epilogue saves an item
of ~16 µs, no longer paid back waiting for Q), within 1 % at N4096 and N8192.

Verdict: confirmed (H200): B8 N1024 bf16 0.2479 ms against ws_tma_q's 0.2554 (1.03×), causal 0.1629 against 0.1720
(1.06×; 0.1618 against 0.1716 in check.py's rounds, ebc6ae6); level at N4096-N16384 (0.98-1.01×). Traced, an item
costs 2.54 µs beside its tiles against 2.92, though it still books 0.8 µs to the wait for Q (not measured apart:
likely the O stores draining ahead of that stamp's store).
[results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_tma_q, ws_tma_q_rows, torch_sdpa_cudnn]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.p52_ws_tma_q import supports_tma_q


@register_phase(
    name="ws_tma_q_early", order=54, title="Tensor cores: Q released after the item's last S = Q·Kᵀ",
    parent="ws_tma_q_rows",
    description="""
        ws_tma_q_rows whose consumer warps release the item's Q tiles as soon as their last S = Q·Kᵀ is
        complete, inside the tile loop, so that the producer's TMA of the next item's Q runs under the last
        tile's softmax, its P·V and the epilogue.
    """,
    lineage="FlashAttention-3's Q pipeline (Shah et al. 2024): the next Q loads while this tile's softmax runs",
    planned_speedup=190.0,  # ws_tma_q_rows' 185 and the predicted few percent on short sequences
    **wgmma_registration(supports_tma_q, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
                         launch_params=("blocks",)),
)
def ws_tma_q_early(problem, warpgroups=0, Bc=0, stages=2, uniform=True, blocks=0):
    """ws_tma_q_rows' kernel with ``q_early``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       blocks=blocks, balanced=True, q_tma=True, o_rows=True, q_early=True)
