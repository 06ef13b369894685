"""Phase 45 — ``fp8_block``: fp8_overlap with one scale a tile, quantized in one pass.

Change against ``fp8_overlap`` (FlashAttention-3's block quantization): Q is quantized per 64-row block (a
warpgroup's rows), K and V per tile of Bc keys (:class:`BlockQuantized`), each tile by one block of the
quantization kernels, which reads it once for its maximum and again, from L2, for its codes
(:func:`.quantize.make_block_quant_rows`, :func:`.quantize.make_block_quant_vt`). The parent's per-head scales
needed a maximum over the whole head first: Q, K and V read twice from memory. The scales cost the consumer
nothing a key (:func:`fp8_block_loop`): K's tile scale goes into the tile's log2 factor (the running maxima kept in
log2 units, turned into the tile's code units and back: four multiplies a tile), V's into O's rescale (O kept in
the units of the last tile's V: the factor corr · sv_{j-1}/sv_j), and the last tile's into the row sums.

Prediction: the quantization (0.153 ms of the parent's 1.46 ms at B1 H32 N8192 D128) about halves: ~1.05× the
parent, ~1.2× cuDNN fp16; the error against float64 no larger (a tile's scale fits its own values).

Verdict: refuted. 1.546 ms and 1.580 ms at B1 H32 N8192 D128 fp16 against the parent's 1.490 ms and 1.511 ms in
the same runs (bf16 1.557 ms against 1.513 ms; H200): the three one-pass kernels took 0.183 against the four
kernels' 0.154, in ms (a tile's second read waits on its maximum), the attention kernel 1.35-1.42 against 1.29
(the tile scales' loads and conversions). More precise where a head's magnitude varies by tile (a test), not faster.
[results/fp8-nvidia-h200.jsonl, rows of fp8_overlap]
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.jit import device
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.p38_fp8_wgmma import code_buffers
from numba_attn.phases.tensor_core.p42_fp8_ws import FP8_RING_OPTIONS, build_fp8_ws
from numba_attn.phases.tensor_core.p44_fp8_overlap import fp8_overlap_loop
from numba_attn.phases.tensor_core.quantize import QTH, make_block_quant_rows, make_block_quant_vt
from numba_attn.variants.stages import PLAIN

QB = 64  # rows of a Q block: one consumer warpgroup's


class BlockQuantized:
    """:class:`.p38_fp8_wgmma.Quantized`'s codes (``q8``, ``k8``, ``vt8``, the same layouts) with one scale a tile:
    ``scales`` = Q's (B·H, ⌈Nq/64⌉), K's and V's (B·Hkv, NkP/Bc); ``kflag`` (B·Hkv, NkP/Bc) 1 where a K tile holds
    an infinite value, ``kmul`` its keys' factors. ``quantize(qw, kw, vw, stream)`` runs three kernels, one pass
    over each input."""

    def __init__(self, problem, Bc):
        B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
        Nq, Nk = problem.q_len, problem.kv_len
        self.bf16 = problem.dtype == "bfloat16"
        self.Bc = Bc
        NkP = (Nk + Bc - 1) // Bc * Bc
        self.BH, self.BHkv, self.NkP, self.NQB = B * H, B * Hkv, NkP, (Nq + QB - 1) // QB
        self.qrows = make_block_quant_rows(D // 2, QB, False)
        self.krows = make_block_quant_rows(D // 2, Bc, True)
        self.qvt = make_block_quant_vt(D, Bc)
        self.q8, self.k8, self.vt8 = code_buffers(problem, NkP)
        self.scales = [cuda.to_device(np.ones(shape, np.float32))
                       for shape in ((self.BH, self.NQB), (self.BHkv, NkP // Bc), (self.BHkv, NkP // Bc))]
        self.qflag = cuda.to_device(np.zeros((self.BH, self.NQB), np.float32))  # (Q's infinities: NaN codes)
        self.kflag = cuda.to_device(np.zeros((self.BHkv, NkP // Bc), np.float32))
        self.kmul = cuda.to_device(np.ones((self.BHkv, NkP), np.float32))
        self.kernels = [self.qrows, self.krows, self.qvt]
        self.nbytes = self.q8.nbytes + self.k8.nbytes + self.vt8.nbytes

    def quantize(self, qw, kw, vw, stream):
        tiles = self.NkP // self.Bc
        self.qrows[(self.NQB, self.BH), QTH, stream](qw, self.q8, self.scales[0], self.qflag, self.kmul, self.bf16)
        self.krows[(tiles, self.BHkv), QTH, stream](kw, self.k8, self.scales[1], self.kflag, self.kmul, self.bf16)
        self.qvt[(tiles, self.BHkv), QTH, stream](vw, self.vt8, self.scales[2], self.bf16)

    def kernel_args(self):
        """The attention kernel's arguments after the codes: the scales of Q, K, V, kflag, kmul."""
        return self.scales[0], self.scales[1], self.scales[2], self.kflag, self.kmul


@device
def block_scales(qs, ks, vs, kflag, bh, kvh, qb, sl2):
    """What :func:`fp8_block_loop` takes of the scales: the log2 factor of this warpgroup's Q block, no row-sum
    factor (the loop returns the sums in O's units) and the per-tile arrays in place of ``kinf``. A warpgroup past
    the last query row (the last block's second) takes the last Q block's scale: its rows are not stored."""
    return sl2 * qs[bh, min(qb, qs.shape[1] - 1)], float32(1.0), (ks, vs, kflag)


@device
def block_tile(tile_scales, kvh, kt, sl2q):
    """Tile ``kt``'s scales (``tile_scales = (ks, vs, kflag)``): the scores' log2 factor a_t = the Q block's
    factor times K's tile scale, the tile's infinite-K flag, V's tile scale."""
    ks, vs, kflag = tile_scales
    return sl2q * ks[kvh, kt], kflag[kvh, kt] != float32(0.0), vs[kvh, kt]


@device
def into_tile(m, a):
    """A running maximum in log2 units into a tile's code units (NEG_BIG, no key seen yet, stays)."""
    return m / a if m != NEG_BIG else NEG_BIG


@device
def out_of_tile(m, a):
    """A running maximum in a tile's code units back into log2 units."""
    return m * a if m != NEG_BIG else NEG_BIG


BLOCK_UNITS = (block_tile, into_tile, out_of_tile)


@functools.cache
def fp8_block_loop(D: int, Bc: int, STAGES: int, WG: int, causal: bool, stage=PLAIN):
    """:func:`.p44_fp8_overlap.fp8_overlap_loop` with the scales of each tile (:data:`BLOCK_UNITS`): tile t's
    scores are ``s · a_t`` in log2 units, so the running maxima are kept in those units and passed to the softmax
    in the tile's code units; O is kept in the units of the last visible tile's V (its rescale factor corr ·
    sv_{t-1}/sv_t) and the row sums come back divided by that tile's V scale."""
    return fp8_overlap_loop(D, Bc, STAGES, WG, causal, stage, BLOCK_UNITS)


fp8_block_loop.kernel_name = "fp8_block"


@register_phase(
    name="fp8_block", order=45, title="FP8 (e4m3) with one scale a tile, quantized in one pass",
    parent="fp8_overlap",
    description="""
        fp8_overlap with FlashAttention-3's block quantization: Q per 64-row block, K and V per tile of Bc keys,
        each tile quantized by one block that reads it once for its maximum (the second read from L2). K's
        tile scale goes into the tile's log2 factor, V's into O's rescale, at no cost a key.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.3 block quantization",
    planned_speedup=370.0,  # fp8_overlap's 350 and a predicted ~1.05x
    **{**FP8_RING_OPTIONS, "e4m3_inputs": False},  # (its scales are per tile; e4m3 inputs come with one a head)
)
def fp8_block(problem, warpgroups=0, Bc=0, stages=3, uniform=True):
    """Quantize per tile (:class:`BlockQuantized`), then fp8_ws's kernel running :func:`fp8_block_loop`."""
    return build_fp8_ws(problem, warpgroups, Bc, stages, uniform, fp8_block_loop, block_scales, BlockQuantized)
