"""Phase 52 — ``ws_tma_q``: ws_intra_persistent whose producer brings Q by TMA, the next item's during this one's end.

Change against ``ws_intra_persistent`` (``q_tma``: :func:`.producer.tma_q`, :func:`.pipeline.q_barriers`): a
consumer warp no longer loads its Q fragments from global memory at an item's start (32 scattered 4-byte loads a
lane at D128, 1.7-1.9 µs an item before its first S on an H200, ``numba-attn trace``). The producer brings each
work item's Q tiles into shared memory with TMA, on a full and an empty barrier of their own, and S = Q·Kᵀ reads A
from there (wgmma SS, ``ws_intra_qs``'s tile layout). The block's first item's Q goes out before its first K/V
tile; a later item's after its first tile, once the consumers released the last item's Q (after their tile loop),
so it lands during that item's epilogue. Q's 32 registers go free (the persistent causal kernel spilled 40 bytes).

Prediction: 1.04-1.08× ``ws_intra_persistent`` at B8 H32/8kv N1024 D128 (1.5 µs of an item's 17-18 µs), 1.01-1.02×
at N4096 and N8192.

Verdict: confirmed, above it (H200; traced, Q 1.9 → 0.15 µs an item): B8 N1024 bf16 0.2532 ms against 0.2791
(1.10×), causal 0.1719 against 0.2263 (1.32×; no spill now); B1 H32 N4096 fp16 0.4406 against 0.4760 (1.08×, 0.96×
cuDNN); N8192 causal fp16 0.9216 against 0.9940, GQA bf16 0.8695 against 0.9467 (1.07× and 1.09× cuDNN).
[results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_intra_persistent, torch_sdpa_cudnn]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.p47_ws_intra_kv import supports_intra_kv
from numba_attn.phases.tensor_core.pipeline import wgmma_smem_bytes
from numba_attn.phases.tensor_core.producer import smem_reason


MAX_HEAD_DIM = 160  # offline, sm_90a, bf16 causal: one consumer spills 24 bytes at D176, 84 at D192, 76 at D224


def supports_tma_q(problem, warpgroups, Bc, stages, **kw):
    """ws_intra_persistent's, with Q's 64-row tiles beside the ring, up to D160."""
    if problem.head_dim > MAX_HEAD_DIM:
        return (f"head_dim {problem.head_dim}: the persistent kernel's S, held P and O spill above D{MAX_HEAD_DIM} "
                "(D176: 24 bytes, D192: 84; offline sm_90a); use ws_intra_qs")
    return supports_intra_kv(problem, warpgroups, Bc, stages, **kw) or smem_reason(
        wgmma_smem_bytes(problem.head_dim, Bc, stages, 64 * warpgroups) + 32 * stages + 16)


@register_phase(
    name="ws_tma_q", order=52, title="Tensor cores: Q by the producer's TMA, the next item's during this one's end",
    parent="ws_intra_persistent",
    description="""
        ws_intra_persistent whose producer brings each work item's Q tiles into shared memory by TMA (a
        full and an empty barrier of their own) and whose S = Q·Kᵀ reads them there: the consumers load no
        Q, and a later item's Q lands while the consumers store the last item's O.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024): Q by the producer warp's TMA, the next tile's Q during the epilogue",
    planned_speedup=180.0,  # ws_intra_persistent's 175 and the predicted few percent on short sequences
    **wgmma_registration(supports_tma_q, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
                         launch_params=("blocks",)),
)
def ws_tma_q(problem, warpgroups=0, Bc=0, stages=2, uniform=True, blocks=0):
    """ws_intra_persistent's kernel with ``q_tma``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       blocks=blocks, balanced=True, q_tma=True)
