"""Phase 39 — ``paged_worklist``: a ragged paged batch cut into equal shares of keys across sequences.

Change against ``paged_split_k``: which keys a block reads. The host lays the sequences' keys end to end in whole
rounds of the block's warp steps and cuts them into W equal shares (FlashInfer's balanced decode plan,
``work_list`` in ``paged.py``); block (worker, row block) runs its items (sequence, split, keys) one after the
other through ``paged_split_k``'s block code, and the last block to finish a (sequence, KV head, row block)
combines its partials: one launch, every block the same number of keys whatever the lengths.

Prediction: at ragged B8 H32 KV ≤ 4k D128 P64 fp16, 0.92–0.98x the contiguous twin (``paged_split_k`` 0.86x).
Verdict: the fastest paged phase, but 0.89x and 0.90x the twin on the H200 (0.94x on an H100): the 0.95x target
missed [results/paged-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.decode.p35_paged_split_k import (check_paged_split_k, elements_per_load, paged_lean_kernel,
                                                         wide_path)
from numba_attn.phases.decode.launch import split_registration
from numba_attn.phases.decode.paged import worklist_launch
from numba_attn.phases.decode.rules import resolve_chunked
from numba_attn.phases.registry import register_phase


def _supports(problem, workers=0, flat=False, **params):
    if not 0 <= workers <= 4096:
        return f"workers={workers} out of range 0..4096 (0: as many as fill the SMs once)"
    # paged_split_k's warp-step kernel (16-bit caches, and 8-bit ones read as words)
    return check_paged_split_k(problem, **{**params, "balance": False, "ahead": False})


def _resolve(problem, rows, lanes, keys, wide=None, **_):
    """The tiling of the warp-step kernel (``paged_split_k``'s, without splits), and ``wide`` resolved."""
    return {**resolve_chunked(problem, rows, lanes, keys, elements_per_load(problem, wide)),
            "wide": wide_path(problem, wide)}


@register_phase(
    name="paged_worklist", order=39,
    title="Paged decode: a ragged batch cut into equal shares of keys across sequences (a work list per block)",
    parent="paged_split_k", kind="decode",
    description="""
        paged_split_k with a host-planned work list: the batch's keys, laid end to end in
        whole warp-step rounds, are cut into equal shares, one per block (a block's share spans
        the end of one sequence and the start of the next); each block runs its items (sequence,
        split, key range) one after the other through paged_split_k's block code, and the last
        block of a sequence's KV head combines its partials. Every block reads the same number of
        keys however unequal the lengths. float16 or bfloat16 queries; 16-bit caches, or 8-bit
        ones (fp8 e4m3, int8) read as words. Tolerance: the query dtype's against the float64
        reference on the dequantized cache.
    """,
    lineage="FlashInfer's load-balanced decode scheduling (Ye et al. 2025); Flash-Decoding split-K; "
            "vLLM PagedAttention",
    planned_speedup=48.0,
    dtypes=("float16", "bfloat16"),
    # ahead (paged_split_k's option): no faster on an H200 or an H100, not a candidate; flat (one list over all
    # KV heads): 4-13 % slower on an H100 (experiments/2026-11-26-worklist-flat), not a candidate
    **split_registration(_supports, _resolve, {"warps": [4, 8], "keys": [0, 1, 2, 4], "workers": [0, 4, 8, 16],
                                               "wide": [False, True]},
                         {"warps": 2, "workers": 3}, "paged", launch_params=()),  # (no split count: a work list)
)
def paged_worklist(problem, warps=8, lanes=0, rows=4, keys=0, workers=0, blocks_per_sm=2, min_keys=256, wide=None,
                   ahead=False, flat=False):
    kern, scale, wide_note = paged_lean_kernel(problem, wide, lanes, keys, warps, rows, True, blocks_per_sm, ahead,
                                               WORKLIST=True)
    return worklist_launch(problem, kern, scale, warps, lanes, rows, keys, workers, blocks_per_sm, min_keys, flat,
                           notes=f", combine fused{wide_note}")
