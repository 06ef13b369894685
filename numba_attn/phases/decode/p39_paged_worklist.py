"""Phase 39 — ``paged_worklist``: a ragged paged batch cut into equal shares of keys across sequences.

Change against ``paged_split_k``: which keys a block reads. There, block (split s, KV head of
sequence b) reads keys [s·chunk, (s+1)·chunk) of b, so a batch of unequal lengths is a set of
blocks of unequal work: one wave leaves the long sequences' blocks running alone at the end, many
small splits pay a block's fixed cost many times, and no split count fits every batch (at B8 KV <= 4k
ragged the best, 3 balanced splits, reads at 0.86x the bandwidth of the contiguous kernel on a batch of
the same bytes). Here the host lays the sequences' keys end to end, in whole rounds of the block's warp
steps, and cuts them into W equal shares (FlashInfer's balanced decode plan; ``work_list`` in
``decode/common.py``): worker w's share is a run of items (sequence b, split s, keys [lo, hi) of b),
most workers holding the end of one sequence and the start of the next. The grid is (worker, row block
of a KV head), W chosen so that the blocks fill the SMs' slots once: every block reads the same number
of keys, whatever the lengths. A block runs its items one after the other through ``paged_split_k``'s
block code (the same loop, merge and partial write, a barrier between items); the last block to finish a
(sequence, KV head, row block) combines that sequence's partials (its own split count, from the list),
so one launch. The list is planned on the host from the lengths (the runner: once; ``decode_paged``: from
the call's lengths, read back from the device), as serving systems plan each decode step. ``flat`` (off): one
list over every (sequence, KV head) instead of one per KV head, as many shares as the SMs' slots (at H32 on 132
SMs the list per KV head fills 256 of 264): slower on an H100 (experiments/2026-11-26-worklist-flat), where the
list per KV head keeps every head's blocks on the same tokens at the same time.

Prediction (written before any GPU run): at ragged B8 H32 KV <= 4k D128 P64 fp16 (lengths
[3674, 1712, 974, 2975, 3575, 1242, 1581, 456]: 8 workers × 32 KV heads = 256 blocks of ~2024 keys, 18
items per KV head) 63-67 us against the contiguous twin's 61.7 us and ``paged_split_k``'s 71.4-73.5: 0.92-0.98x
the twin (the 0.95x target inside that range); at B8 KV <= 32k and B32 KV <= 4k within 3 % of the best paged
rows (their splits already even out over several waves).
Verdict (H100, not the H200 of the prediction; CUPTI, paged_split_k and the twins in the same process, two runs):
B8 KV <= 4k 94.1 and 94.4 us against the twin's 88.8 and 88.6, 0.94x (paged_split_k 97.8 us, 0.91x; its 3 balanced
splits 96.1 us, 0.92x): the fastest paged phase, the 0.95x target missed by 1 %; a share is 33 rounds of 64 keys
where the twin's block reads 32 (2112 keys against 2024), and a block runs 1-3 items (15 per KV head, not the 18
predicted). B8 KV <= 32k 0.693 and 0.695 ms, 1.01x the twin (paged_split_k 0.711); B32 KV <= 4k 0.433 ms, 0.99x
(0.438). 4, 12 or 16 workers per KV head instead of 8 (one wave) are 1-7 % slower. Memcheck of its tests: 0 errors
[results/paged-nvidia-h100.jsonl; experiments/2026-11-25-paged-worklist]
Verdict (H200, the GPU of the prediction; CUPTI, the twins in the same process, two runs, edaa51f and cb83b40): B8 KV <= 4k 0.0690 and 0.0697 ms, 0.89x and 0.90x the twin (the prediction, 0.92-0.98x, refuted; paged_split_k 0.0733 and 0.0742 ms, 0.84x): still the fastest paged phase, the 0.95x target missed; B8 KV <= 32k 0.4687 and 0.4798 ms, 0.98x (paged_split_k 0.4951); B32 KV <= 4k 0.2967 and 0.3045 ms, 0.97-0.98x (0.3069). The same batch at uniform lengths (every sequence 2024 keys: one item per block) 0.0659 ms, 0.95x the twin (paged_split_k 0.0649 ms, 0.96x): the block table costs 3-5 % at these lengths, the ragged batch's shares, items and combines 5-6 % more. Memcheck of its tests on the H200: 17 passed, 0 errors [results/paged-nvidia-h200.jsonl, rows of paged_split_k]
"""
from __future__ import annotations

from numba import float32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.phases.decode.common import (PAGED_KV8, PAGED_TOKEN_SCALE, make_lean_kernel, resolve_chunked,
                                             worklist_launch)
from numba_attn.phases.decode.p35_paged_split_k import _supports as _split_supports, _vw, _wide
from numba_attn.phases.registry import register_phase


def _supports(problem, workers=0, flat=False, **params):
    if not 0 <= workers <= 4096:
        return f"workers={workers} out of range 0..4096 (0: as many as fill the SMs once)"
    # paged_split_k's warp-step kernel (16-bit caches, and 8-bit ones read as words)
    return _split_supports(problem, **{**params, "mma": False, "balance": False, "prefetch": 0, "ahead": False})


def _resolve(problem, rows, lanes, keys, wide=None, **_):
    """The tiling of the warp-step kernel (``paged_split_k``'s, without splits), and ``wide`` resolved."""
    return {**resolve_chunked(problem, rows, lanes, keys, _vw(problem, wide)), "wide": _wide(problem, wide)}


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
    space={"warps": [4, 8], "keys": [0, 1, 2, 4], "workers": [0, 4, 8, 16], "wide": [False, True]},
    # ahead (paged_split_k's option): no faster on an H200 or an H100, not a candidate; flat (one list over all
    # KV heads): 4-13 % slower on an H100 (experiments/2026-11-26-worklist-flat), not a candidate
    sim_params={"warps": 2, "workers": 3},
    supports=_supports,
    resolve=_resolve,
    layout="paged",
)
def paged_worklist(problem, warps=8, lanes=0, rows=4, keys=0, workers=0, blocks_per_sm=2, min_keys=256, wide=None,
                   ahead=False, flat=False):
    kern = make_lean_kernel(problem.head_dim, _vw(problem, wide), lanes, keys, warps, rows, problem.q_len,
                            problem.group, problem.causal, False, True, blocks_per_sm, P=problem.page_size,
                            KV8=PAGED_KV8[problem.kv_dtype], TOKEN=bool(PAGED_TOKEN_SCALE[problem.kv_scale]),
                            BF16=problem.dtype == "bfloat16", WORK=True, AHEAD=ahead)
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    wide_note = ", 16 codes per load" if _vw(problem, wide) == 16 else ""
    wide_note += ", page index a step ahead" if ahead else ""
    return worklist_launch(problem, kern, scale, warps, lanes, rows, keys, workers, blocks_per_sm, min_keys, flat,
                           notes=f", combine fused{wide_note}")
