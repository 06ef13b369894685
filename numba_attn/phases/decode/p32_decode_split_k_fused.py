"""Phase 32 — ``decode_split_k_fused``: split-K with the combine in the last block.

Change against ``decode_split_k``: no second kernel. Each block writes its partial, then (after a
``threadfence``) counts itself with one atomic per (sequence, KV head, row block); the last of the ``S`` splits
reads the partials back from L2, writes the combined output and resets the counter (the "last block reduces"
pattern: CUDA's threadFenceReduction, CUTLASS serial split-K). The kernel is ``decode_split_k``'s with ``FUSED``.

Prediction: −2 to −5 µs per call where S > 1 (~5–10% at B=1 with 4k–16k keys); unchanged for S = 1.
Verdict: −3.5 to −4.9 µs at B=1 as predicted, but a miss for GQA at B=1 (66 splits combined by one block).
"""
from __future__ import annotations

from numba_attn.phases.decode.launch import split_registration
from numba_attn.phases.decode.p31_decode_split_k import split_k_launch
from numba_attn.phases.decode.rules import check_decode, resolve_split
from numba_attn.phases.registry import register_phase


@register_phase(
    name="decode_split_k_fused", order=32, title="Decode: split-K, combine by the last block (one launch)",
    parent="decode_split_k", kind="decode",
    description="""
        decode_split_k without the second kernel: every block writes its partial output
        and log-sum-exp, counts itself with an atomic per (sequence, KV head, row block),
        and the last of the S splits combines them (threadfence; counter reset for the
        next launch). One launch per call.
    """,
    lineage="Flash-Decoding (Dao et al. 2023) with the last-block reduction of the CUDA "
            "threadFenceReduction sample / CUTLASS serial split-K",
    planned_speedup=42.0,
    **split_registration(check_decode, resolve_split,
                         {"warps": [4, 8], "rows": [2, 4], "keys": [0, 1, 2, 4], "splits": [0, 4, 8, 16, 32]}),
)
def decode_split_k_fused(problem, warps=4, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=4, min_keys=256):
    return split_k_launch(problem, True, warps, lanes, rows, keys, splits, blocks_per_sm)
