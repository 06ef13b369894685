"""Phase 56 — ``fp8_exp_fma``: a share of fp8_overlap's exponentials computed on the FMA pipe.

Change against ``fp8_overlap`` (FlashAttention-4's software exp2): of every four n-tiles of a tile's scores,
``fma_share`` take 2^x from :func:`numba_attn.gpu.device_functions.exp2_fma` (floor, a cubic in three FMA, the
exponent from its bits: ~8 instructions on the FP32 and integer pipes, relative error 1.03e-4) instead of
``ex2.approx`` on the MUFU unit; the rest of the tile is fp8_overlap's.

Why FP8: an SM's MUFU unit does 16 exponentials a clock, its FP8 tensor cores a 64-row 192-key tile of both
products at D128 in about as many clocks as that tile's 24576 exponentials take there (~1500 at either rate); in
fp16 the products take twice as long and the exponentials hide under them. ``fp8_ws``'s profile put 24% of its
warp samples at MUFU.EX2 (11% with the MUFU queue full). P is rounded to e4m3 (3 mantissa bits), so the cubic's
error does not reach it.

Prediction: 1.05-1.15× ``fp8_overlap``'s attention kernel at B1 H32 N8192 D128 with one n-tile in four (a quarter of
the exponentials) on the FMA pipe; less with two (the FP32 pipe also runs the scores' scaling and the row sums).

Verdict: refuted. 1.00× ``fp8_overlap`` at N8192 D128 with one share, 0.94× causal, 0.92× at D64; two and three
shares 0.81-0.87× (H200, 2eafcfd). The FP32 pipe, not the MUFU, bounds the tile.
"""
from __future__ import annotations

import functools

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.p42_fp8_ws import FP8_RING_OPTIONS, build_fp8_ws
from numba_attn.phases.tensor_core.p44_fp8_overlap import HEAD_UNITS, fp8_overlap_loop
from numba_attn.variants.stages import PLAIN


@functools.cache
def fma_loop(fma_share: int):
    """fp8_overlap's consumer loop (:func:`.p44_fp8_overlap.fp8_overlap_loop`) with ``fma_share`` n-tiles of every
    four on the FMA pipe, as a mainloop factory of ``build_fp8_ws`` (one per share: the kernels are cached by it)."""

    def loop(D: int, Bc: int, STAGES: int, WG: int, causal: bool, stage=PLAIN):
        return fp8_overlap_loop(D, Bc, STAGES, WG, causal, stage, HEAD_UNITS, fma_share)

    loop.kernel_name = "fp8_exp_fma"
    return loop


def supports_exp_fma(problem, warpgroups, Bc, stages, uniform=False, fma_share=1):
    if fma_share not in (1, 2, 3):
        return f"fma_share={fma_share}: n-tiles of every four on the FMA pipe, 1, 2 or 3 (0 is fp8_overlap)"
    return FP8_RING_OPTIONS["supports"](problem, warpgroups, Bc, stages, uniform)


@register_phase(
    name="fp8_exp_fma", order=56, title="FP8 (e4m3): a share of the exponentials on the FMA pipe",
    parent="fp8_overlap",
    description="""
        fp8_overlap with FlashAttention-4's software exp2: of every four n-tiles of scores, fma_share take 2^x
        from a cubic on the FMA pipe (floor, three FMA, the exponent from its bits) instead of the MUFU unit,
        which at FP8's product rate takes as long as the products.
    """,
    lineage="FlashAttention-4 (Dao et al. 2025): exp2 emulated with a polynomial on the FMA units beside MUFU",
    planned_speedup=385.0,  # fp8_overlap's 350 and a predicted ~1.1x
    **{**FP8_RING_OPTIONS, "supports": supports_exp_fma,
       "space": {**FP8_RING_OPTIONS["space"], "fma_share": [1, 2, 3]}},
)
def fp8_exp_fma(problem, warpgroups=0, Bc=0, stages=3, uniform=True, fma_share=1):
    """fp8_ws's kernel running fp8_overlap's loop with ``fma_share`` of every four n-tiles' exponentials on the FMA
    pipe."""
    return build_fp8_ws(problem, warpgroups, Bc, stages, uniform, fma_loop(fma_share))
