"""Phase 29 — ``tc_wgmma_varlen``: ``tc_wgmma`` on a packed ragged batch (FlashAttention's varlen layout).

Change against ``tc_wgmma``: only where a block's rows are, as ``tc_mma_varlen`` against ``tc_mma``: a block
takes sequence ``blockIdx.z`` (:func:`.scheduler.varlen_spans`), its cp.async ring copies K/V token-major from
the sequence's first key, and the ring state is recomputed from the tile index (carried, it spilled).

Prediction: within 10% of ``tc_wgmma``'s time per useful FLOP on the padded batch.

Verdict: 2.27 ms at B8 H32 N<=4096 D128 fp16 ragged, 0.45x the padded batch's time per useful FLOP (H200).
[results/varlen-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, supports_cp_async, wgmma_registration


@register_phase(
    name="tc_wgmma_varlen", order=29, title="Tensor cores: Hopper wgmma on a packed ragged batch (cu_seqlens)",
    parent="tc_wgmma",
    description="""
        tc_wgmma's kernel on FlashAttention's varlen layout: q (total_q, H, D), k/v (total_k, Hkv, D)
        and cu_seqlens. Grid (query tiles of the longest sequence, heads, sequences); a block reads
        its sequence's offsets and lengths, exits when the sequence ends before its rows, copies
        K/V tiles token-major from the sequence's first key, masks the keys past the sequence and
        stores only its rows; causal bottom-right per sequence.
    """,
    lineage="FlashAttention-2/3 varlen (flash_attn_varlen_func): packed sequences with cu_seqlens",
    planned_speedup=150.0,  # the parent's: the same time per useful FLOP
    **wgmma_registration(supports_cp_async, layout="varlen",
                         lse="the varlen phases write no log-sum-exp yet"),
)
def tc_wgmma_varlen(problem, warpgroups=0, Bc=64, stages=2):
    """tc_wgmma's kernel on the packed layout (:mod:`.scheduler`: a block's sequence)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="cp_async", varlen=True)
