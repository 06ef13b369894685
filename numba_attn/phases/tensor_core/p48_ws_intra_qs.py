"""Phase 48 — ``ws_intra_qs``: ws_intra_kv with Q in shared memory, so the score tiles widen.

Change against ``ws_intra_kv`` (``q_smem``: :func:`.consumer.q_operand`): each consumer warpgroup writes its Q
fragments once into a 64-row swizzled tile after the ring and S = Q·Kᵀ reads A from there (wgmma SS) instead of
from 32 registers (D128). The registers go to the scores: 176-key tiles at D128 without a mask (S 88, the held P 44
and O 64 of the 232), in two stages beside Q (208 KB); with a mask 128 (the diagonal tile widens with Bc). At D256
two consumers fit (O 128, S 40, P 20 with 80-key tiles), which Q's 64 registers forbade: FlashAttention-3's tiles.

Prediction: 1.03-1.08× ``ws_intra`` at B1 H32 N4096 D128 fp16 (a tile's fixed costs over 176 keys instead of 128);
causal within ±3 %; D256 with two consumers 1.1-1.3× ``tma_wgmma``.

Verdict: refuted at D128 (H200): 176-key tiles 0.469 ms against ws_intra's 0.467 ms, causal 0.99×. Confirmed at
D256: 0.425 ms against tma_wgmma's 0.482 ms (1.13×), bf16 0.4165 ms against 0.489 ms (1.17×), causal N8192 0.929 ms
against 1.079 ms (1.16×); 0.92× cuDNN's 0.392 ms. [results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_intra,
tma_wgmma, torch_sdpa_cudnn]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, supports_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.pipeline import wgmma_smem_bytes
from numba_attn.phases.tensor_core.producer import smem_reason, tma_smem_reason

WIDE_D128 = 176  # Bc=0 at D128 without a mask (FlashAttention-3's tile)
MAX_HEAD_DIM = 256
MAX_BC = {128: 176, 256: 80}  # offline, sm_90a: the widest tile checked free of spills (two consumers); else 128


def _resolve(problem, warpgroups, Bc, stages, **_):
    D = problem.head_dim
    if not warpgroups and D > 128:
        warpgroups = 2  # Q's registers no longer forbid two consumers above D128
    r = resolve_intra(problem, warpgroups, Bc, stages)
    if not Bc and D == 128 and r["warpgroups"] == 2 and not problem.causal \
            and getattr(problem, "variant", None) is None:
        r["Bc"] = WIDE_D128
    if not Bc and D > 128:
        r["Bc"] = 80 if D == 256 else 64  # (D256: FlashAttention-3's tile; its ring and Q take 225 KB)
    return r


def _supports(problem, warpgroups, Bc, stages, **_):
    D = problem.head_dim
    if warpgroups > 3 or (warpgroups == 3 and (Bc > 64 or D > 64)):
        return (f"warpgroups={warpgroups} with Bc={Bc} at head_dim {D}: at most three consumers, three only at D64 "
                "with 64-key tiles (160 registers each)")
    if D > MAX_HEAD_DIM:
        return f"head_dim {D}: checked free of spills up to D{MAX_HEAD_DIM}"
    if Bc > MAX_BC.get(D, 128):
        return f"Bc={Bc} at head_dim {D}: checked free of spills up to Bc={MAX_BC.get(D, 128)}"
    return (supports_wgmma(problem, warpgroups, Bc, stages, min_stages=2) or tma_smem_reason(problem, Bc, stages)
            or smem_reason(wgmma_smem_bytes(D, Bc, stages, 64 * warpgroups) + 32 * stages))  # and Q's tiles


@register_phase(
    name="ws_intra_qs", order=48, title="Tensor cores: Q in shared memory, wider score tiles",
    parent="ws_intra_kv",
    description="""
        ws_intra_kv whose consumers write Q once into a swizzled shared tile and read it from there in every
        S = Q·Kᵀ (wgmma with both operands in shared memory): the registers Q held go to the scores, so the
        key tiles widen to 176 at D128 without a mask, and two consumers fit at D256.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024): Q in shared memory, 128x176 tiles at D128, two consumers at D256",
    planned_speedup=180.0,  # ws_intra_kv's 170 and a predicted ~1.05x
    **wgmma_registration(_supports, _resolve,
                         {"warpgroups": [2], "Bc": [128, 144, 176], "stages": [2], "uniform": [True]},
                         {"warpgroups": 2, "Bc": 16, "stages": 2}),
)
def ws_intra_qs(problem, warpgroups=0, Bc=0, stages=2, uniform=True):
    """ws_intra_kv's kernel with ``q_smem``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       q_smem=True)
