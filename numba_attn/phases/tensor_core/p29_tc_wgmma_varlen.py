"""Phase 29 — ``tc_wgmma_varlen``: ``tc_wgmma`` on a packed ragged batch (FlashAttention's varlen layout).

Change against ``tc_wgmma``: only where a block's rows are, as ``tc_mma_varlen``
against ``tc_mma``. q (total_q, H, D), k/v (total_k, Hkv, D) and
``cu_seqlens_q``/``cu_seqlens_k`` (spec/varlen.py); grid (query tiles of the
longest sequence, heads, sequences). A block reads its sequence's offsets and
lengths, exits when the sequence ends before its first row, reads Q and writes
O through head-major views of the sequence's rows, and its cp.async ring copies
K/V tiles token-major from the sequence's first key (rows ``Hkv·D`` elements
apart: ``make_ring_copy(..., packed=True)``); keys past the sequence's length
are zero-filled and masked as at ``Nk`` in ``tc_wgmma``. Causal is
bottom-right aligned per sequence. The kernel is ``tc_wgmma``'s with the
compile-time ``varlen`` option (``make_wgmma_kernel`` in ``common``); the
padded layout's kernel is unchanged. With three warpgroups the varlen kernel
declares its block size as launch bounds: the sequence's lengths and offsets
live in registers (the padded kernel reads Nq, Nk from its parameters), and
without the bound ptxas took 195 registers at D=128 causal, more than three
warpgroups may have (170); with it, 168 and no spills (offline compile, sm_90a).
For the same reason the varlen kernel recomputes its ring stage from the tile
index (``j % stages``) at every tile, where the other wgmma phases carry it
from tile to tile: carried, the two stages (the tile's and the refill's)
pushed D=128 causal to 24 bytes of spills.

Prediction: within 10% of ``tc_wgmma``'s time per useful FLOP on the padded
batch (issue 18's target): the early-exit blocks are cheap, and a K/V row
read with a stride of Hkv·D elements is still whole 128-byte lines per row.

Verdict: 2.27 ms at B8 H32 N<=4096 D128 fp16 ragged, 0.45x the padded batch's time per useful FLOP and 0.93x its TFLOP/s; at N<=1024 (0.202 ms) 0.79x the TFLOP/s: sequences of 300-970 rows (H200, CUPTI) [results/varlen-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, resolve_wgmma, supports_wgmma


def _supports(problem, warpgroups, Bc, stages):
    return supports_wgmma(problem, warpgroups, Bc, stages, min_stages=2)


@register_phase(
    name="tc_wgmma_varlen", order=29, title="Tensor cores: Hopper wgmma on a packed ragged batch (cu_seqlens)",
    parent="tc_wgmma", layout="varlen",
    requires_cc="sm_90a",
    description="""
        tc_wgmma's kernel on FlashAttention's varlen layout: q (total_q, H, D), k/v (total_k, Hkv, D)
        and cu_seqlens. Grid (query tiles of the longest sequence, heads, sequences); a block reads
        its sequence's offsets and lengths, exits when the sequence ends before its rows, copies
        K/V tiles token-major from the sequence's first key, masks the keys past the sequence and
        stores only its rows; causal bottom-right per sequence.
    """,
    lineage="FlashAttention-2/3 varlen (flash_attn_varlen_func): packed sequences with cu_seqlens",
    planned_speedup=150.0,  # the parent's: the same time per useful FLOP
    space={"warpgroups": [0, 1, 2, 3], "Bc": [32, 64, 128], "stages": [2, 3, 4]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 1, "Bc": 16, "stages": 2},
    supports=_supports,
    resolve=resolve_wgmma,
)
def tc_wgmma_varlen(problem, warpgroups=0, Bc=64, stages=2):
    """tc_wgmma's kernel on the packed layout (:mod:`.scheduler`: a block's sequence)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="cp_async", varlen=True)
