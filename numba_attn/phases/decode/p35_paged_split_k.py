"""Phase 35 — ``paged_split_k``: split-K decode over a paged KV cache.

Change against ``decode_split_k_lean``: only how a key row is found. Key ``j`` of sequence ``b`` is row ``j % P``
of page ``block_table[b, j // P]`` of the (num_blocks, P, Hkv, D) cache (``paged.py``; one page index per warp
step when a page holds whole steps). Each sequence has its own length; unequal lengths get splits sized from the
batch's total keys; a length-0 sequence gives zeros. The same kernel reads fp8 e4m3 or int8 caches with their
scales (``kv8.py``); ``wide``: 16 codes per lane per load; ``balance`` and ``ahead`` change the splits and the
page reads. (The tensor-core warp step for 8-bit caches is its own phase, ``paged_mma8``.)

Prediction: at page size ≥ 64 within 5% of ``decode_split_k_lean``.
Verdict: 0.950 ms at B8 H32 KV 32k P64, 0.99x decode_split_k_lean (H200, CUPTI) [results/paged-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba import float32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.phases.decode.launch import split_registration
from numba_attn.phases.decode.p33_decode_split_k_lean import make_lean_kernel
from numba_attn.phases.decode.paged import PAGED_KV8, PAGED_TOKEN_SCALE, check_paged_problem, paged_launch
from numba_attn.phases.decode.rules import check_split, resolve_split, vector_width
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.spec.errors import check_bool


def paged_lean_kernel(problem, wide, lanes, keys, warps, rows, fused, blocks_per_sm, ahead, **options):
    """(kernel, scale, notes) of ``make_lean_kernel`` on ``problem``'s paged cache: the scale in base 2 (exp2
    instead of exp); ``options``: ``BALANCE`` or ``WORKLIST``."""
    kern = make_lean_kernel(problem.head_dim, elements_per_load(problem, wide), lanes, keys, warps, rows, problem.q_len,
                            problem.group, problem.causal, False, fused, blocks_per_sm, P=problem.page_size,
                            KV_FORMAT=PAGED_KV8[problem.kv_dtype], TOKEN=bool(PAGED_TOKEN_SCALE[problem.kv_scale]),
                            BF16=problem.dtype == "bfloat16", **options, PAGE_AHEAD=ahead, stage=stages_for(problem))
    notes = ", 16 codes per load" if elements_per_load(problem, wide) == 16 else ""
    notes += ", balanced splits" if options.get("BALANCE") else ""
    notes += ", page index a step ahead" if ahead else ""
    return kern, float32(problem.sm_scale * float(LOG2E)), notes


def wide_path(problem, wide):
    """``wide`` resolved: None (the default) is True for an 8-bit cache read by one query row per KV head
    (no GQA group, q_len 1) at a head_dim of whole 16-code loads, where it was measured faster; with a
    GQA group the row blocks' registers spill with it (slower, measured), so False."""
    if wide is None:
        return (bool(getattr(problem, "kv_dtype", "")) and problem.group * problem.q_len == 1
                and problem.head_dim % 16 == 0)
    return check_bool("parameter wide of phase 'paged_split_k'", wide)


def elements_per_load(problem, wide):
    """Elements a lane reads per load: 16 codes of an 8-bit cache with ``wide``, else 8 (16-bit)."""
    return 16 if wide_path(problem, wide) and getattr(problem, "kv_dtype", "") else vector_width(problem.dtype)


def check_paged_split_k(problem, wide=None, balance=False, ahead=False, **params):
    reason = check_paged_problem(problem)
    if reason:
        return reason
    if wide is not None and wide_path(problem, wide) and not problem.kv_dtype:
        return "wide: 8-bit caches only (a 16-bit cache already reads 16 bytes per load)"
    return check_split(problem, **params, VW=elements_per_load(problem, wide))


def _resolve(problem, wide=None, **params):
    return {**resolve_split(problem, **params, VW=elements_per_load(problem, wide)), "wide": wide_path(problem, wide)}


@register_phase(
    name="paged_split_k", order=35,
    title="Paged decode: split-K over the pages of a block table (fp16, fp8, int8 caches)",
    parent="decode_split_k_lean", kind="decode",
    description="""
        decode_split_k_lean on a paged KV cache (FlashAttention's flash_attn_with_kvcache
        layout): a key row is found through the block table (the page index read once per
        warp step when a page holds the step), each sequence has its own length (a length-0
        sequence gives zeros; unequal lengths: splits sized from the batch's total keys), and
        an 8-bit cache (fp8 e4m3 or int8, per-tensor, per-head or
        per-token scale) is dequantized in registers; float16 or bfloat16 queries. Tolerance:
        the query dtype's (float16 4e-3, bfloat16 3e-2) against the float64 reference on the
        dequantized cache, for every cache format.
    """,
    lineage="vLLM PagedAttention (Kwon et al. 2023); FlashAttention flash_attn_with_kvcache; "
            "Flash-Decoding split-K",
    planned_speedup=45.0,
    dtypes=("float16", "bfloat16"),
    # ahead was measured no faster (H200, H100): not a candidate
    **split_registration(check_paged_split_k, _resolve,
                         {"warps": [4, 8], "keys": [0, 1, 2, 4], "splits": [0, 8, 16, 32, 64],
                          "blocks_per_sm": [1, 2, 4], "wide": [False, True], "balance": [False, True]},
                         layout="paged"),
)
def paged_split_k(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256, fuse_max=64,
                  wide=None, balance=False, ahead=False):
    fused = splits * rows <= fuse_max
    kern, scale, wide_note = paged_lean_kernel(problem, wide, lanes, keys, warps, rows, fused, blocks_per_sm, ahead,
                                               BALANCE=balance)
    return paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused,
                        notes=f", combine {'fused' if fused else 'kernel'}{wide_note}")
