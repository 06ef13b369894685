"""Phase 47 — ``ws_intra_kv``: ws_intra's K and V on barriers of their own, so two stages hold wider tiles.

Change against ``ws_intra`` (``split_kv``: :func:`.pipeline.kv_barriers`, :func:`.producer.ws_producer`): each
stage's K and V have a full and an empty barrier each. A consumer releases K_j as soon as S_j is complete and V_j
after its P·V, and the producer refills K and V apart. With one barrier pair a stage, holding V_{j-1} through the
softmax of S_j held K_{j-1} too, so ``ws_intra`` needs three stages; here K_{j+2} is issued while the consumers
still hold V_j, so two stages give the same slack in two thirds of the shared memory, and the key tiles can widen
(FlashAttention-3's forward at D128: 176-key tiles, two stages, K and V pipelines apart).

Prediction: 0.98-1.02× ``ws_intra`` at the same 128-key tiles (two stages here, three there: the same slack);
what it buys is shared memory (128 KB of ring instead of 192 at D128), for wider tiles once Q leaves the registers.

Verdict: confirmed, a little above (H200): B1 H32 N4096 fp16 0.450 ms against ws_intra's 0.467 ms (1.04×), bf16
0.441 ms against 0.451 ms (1.02×), 0.94× cuDNN's 0.424 ms; causal 0.98-1.01×; 144-key tiles 0.98×, a third stage
1.02×. [results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_intra, torch_sdpa_cudnn]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra, supports_intra

MAX_BC_D128 = 144  # 160 spills 96 bytes at D128 beside Q's registers (serialized wgmma)


def supports_intra_kv(problem, warpgroups, Bc, stages, **_):
    """``supports`` of ws_intra_kv: ws_intra's with two stages, and at most 144-key tiles from D128."""
    if problem.head_dim >= 128 and Bc > MAX_BC_D128:
        return (f"Bc={Bc} at head_dim {problem.head_dim}: S, the held P, O and Q spill above Bc={MAX_BC_D128} "
                "(offline, sm_90a)")
    return supports_intra(problem, warpgroups, Bc, stages, min_stages=2)


@register_phase(
    name="ws_intra_kv", order=47, title="Tensor cores: K and V on barriers of their own, two stages of wider tiles",
    parent="ws_intra",
    description="""
        ws_intra whose ring gives K and V a full and an empty barrier each: a consumer releases K_j once S_j
        is complete and V_j after its P·V, and the producer refills them apart, so two stages keep the
        consumers fed as three did in two thirds of the shared memory (FlashAttention-3's separate K and V
        pipelines).
    """,
    lineage="FlashAttention-3 (Shah et al. 2024): separate K and V pipelines, 176-key tiles at D128",
    planned_speedup=170.0,  # ws_intra's 170: the same speed, in less shared memory
    **wgmma_registration(supports_intra_kv, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128, 144], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 2, "Bc": 16, "stages": 2}),
)
def ws_intra_kv(problem, warpgroups=0, Bc=0, stages=2, uniform=True):
    """ws_intra's kernel with ``split_kv``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True)
