"""Phase 28 — ``tc_mma_varlen``: ``tc_mma`` on a packed ragged batch (FlashAttention's varlen layout).

Change against ``tc_mma``: only where a block's rows are. q (total_q, H, D), k/v (total_k, Hkv, D) and
cu_seqlens; grid (query tiles of the longest sequence, heads, sequences). A block takes its sequence's rows as
head-major views (:func:`.scheduler.varlen_views`), exits when the sequence ends before its first row, and masks
the keys past the sequence's length (``tc_mma``'s mask at ``Nk``). A mask_mod/score_mod variant sees each
sequence's own positions (``b`` the sequence, ``q_idx = i + Lk_b − Lq_b``) and runs on every key tile up to the
causal bound, without a block mask (one is made for one (Nq, Nk) shape): no empty tile is skipped.

Prediction: the same time per useful FLOP as ``tc_mma`` on the padded batch (within 10%).

Verdict: 9.37 ms at B8 H32 N<=4096 D128 fp16 ragged, 0.46x the padded batch's time per useful FLOP.
[results/varlen-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.mma_sync import MMA_REGISTRATION, launch_mma_varlen
from numba_attn.phases.tensor_core.p20_tc_mma import make_mma_kernel
from numba_attn.variants.stages import stages_of


@register_phase(
    name="tc_mma_varlen", order=28, title="Tensor cores: mma.sync on a packed ragged batch (cu_seqlens)",
    parent="tc_mma", layout="varlen",
    description="""
        tc_mma's kernel on FlashAttention's varlen layout: q (total_q, H, D), k/v (total_k, Hkv, D)
        and cu_seqlens. Grid (query tiles of the longest sequence, heads, sequences); a block reads
        its sequence's offsets and lengths, exits when the sequence ends before its rows, masks the
        keys past the sequence and stores only its rows; causal bottom-right per sequence.
    """,
    lineage="FlashAttention-2 varlen (flash_attn_varlen_func): packed sequences with cu_seqlens",
    planned_speedup=60.0,  # the parent's: the same time per useful FLOP
    **MMA_REGISTRATION,
    variants=True,
)
def tc_mma_varlen(problem, warps=8, Bc=0):
    kern = make_mma_kernel(problem.head_dim, warps, Bc, problem.causal, problem.dtype == "bfloat16", True,
                           stages_of(problem.variant, listed=False))  # a variant: its functions on every tile
    return launch_mma_varlen(problem, kern, 16 * warps, warps)
