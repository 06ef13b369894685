"""Phase 36 — ``paged_mma``: GQA decode on tensor cores over a paged KV cache.

Change against ``decode_mma``: only how a key row is found. The ``cp.async`` copy of a ``Bc``-key tile reads
cache row ``block_table[b, j // P] · P + j % P`` (one page index per tile when ``P % Bc == 0``, else per row);
each sequence has its own length (a length-0 sequence gives zeros). 8-bit caches (fp8 e4m3, int8; head_dim a
multiple of 16): the tile's bytes are copied into a byte ring and turned into 16-bit values in shared memory
(exact), the scales applied in fp32 on S and on P or O. The kernel is ``decode_mma``'s with a page size.

Prediction: at page size ≥ 64 within 5% of ``decode_mma``'s bandwidth; an 8-bit cache about half the time.
Verdict: 0.249 ms at GQA B8 H32/8 KV 32k, 0.99x decode_mma; fp8 GQA 0.326 ms, 0.74x SDPA on the fp16 cache
(H200, CUPTI) [results/paged-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.decode.p34_decode_mma import decode_mma_launch, decode_mma_registration
from numba_attn.phases.decode.paged import PagedLayout, check_paged_problem
from numba_attn.phases.decode.rules import check_decode_mma
from numba_attn.phases.registry import register_phase


def _supports(problem, **params):
    reason = check_paged_problem(problem)
    if reason:
        return reason
    if problem.kv_dtype and problem.head_dim % 16:
        return (f"a {problem.kv_dtype} cache with head_dim {problem.head_dim}: paged_mma copies 8-bit rows in "
                "16-byte chunks (head_dim a multiple of 16; paged_split_k reads the others)")
    return check_decode_mma(problem, **params)


@register_phase(
    name="paged_mma", order=36,
    title="Paged decode: GQA rows on tensor cores, K/V tiles copied from the pages (fp16/bf16, fp8, int8 caches)",
    parent="decode_mma", kind="decode",
    description="""
        decode_mma on a paged KV cache (FlashAttention's flash_attn_with_kvcache layout):
        the cp.async copy of a key tile finds its rows through the block table (one page
        index per tile when a page holds the tile, per row otherwise); each sequence has
        its own length (a length-0 sequence gives zeros; unequal lengths: splits sized from
        the batch's total keys); float16 or bfloat16 queries and
        caches, and fp8 e4m3 or int8 caches (per-tensor, per-head or per-token scale) whose
        bytes are copied and turned into 16-bit values in shared memory, the scales applied
        in fp32 on S and on P or O. Tolerance: the query dtype's (float16 4e-3, bfloat16
        3e-2) against the float64 reference on the dequantized cache, for every cache format.
    """,
    lineage="vLLM PagedAttention (Kwon et al. 2023); FlashInfer GQA decode on tensor cores; "
            "FlashAttention flash_attn_with_kvcache",
    planned_speedup=60.0,
    **decode_mma_registration(_supports, layout="paged"),
)
def paged_mma(problem, warps=4, Bc=16, stages=3, splits=0, blocks_per_sm=2, min_keys=2048, fuse_max=0, pdl=3,
              l2_prefetch=False, even=False, fixed_combine=True):
    own = PagedLayout(problem)  # the runner's calls give no layout: the problem's, uploaded at the first call
    n = 4 if problem.kv_dtype else 2  # the table and lengths (8-bit: and the scales)
    return decode_mma_launch(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl,
                             l2_prefetch, even, fixed_combine, P=problem.page_size,
                             keys=lambda layout: tuple((layout or own.own())[:n]),
                             note=f"P={problem.page_size}, " + (f"{problem.kv_dtype} cache ({problem.kv_scale} scale), "
                                                                if problem.kv_dtype else ""))
