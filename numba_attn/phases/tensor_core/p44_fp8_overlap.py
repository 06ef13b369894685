"""Phase 44 — ``fp8_overlap``: fp8_ws's consumers run each tile's softmax under their own O += P·V.

Change against ``fp8_ws`` (:func:`fp8_overlap_loop`, FlashAttention-3's intra-warpgroup pipelining): a consumer
issues S_j = Q·K_jᵀ and then O += P_{j-1}·V_{j-1}, waits only for S_j (``wgmma.wait_group 1``) and computes P_j
in place of S_j (:func:`.fp8.fp8_softmax`: the masks, the maxima, the exponentials) while its P·V runs; then it
waits for O, packs P_j to e4m3 and rescales O. The parent waited for each product before the next step, so a
consumer's exponentials ran only under the other consumer's products.

Why in FP8, when the fp16 ``ws_overlap`` was refuted by its registers: P_{j-1} packs to Bc/8 registers (16 at
Bc=128, 24 at Bc=192) and S_j's accumulators are free once P_{j-1} is packed, so the overlap needs no second score
tile: S, P, O and Q's codes take 200 of the 232 registers at D128 with Bc=192. ``fp8_ws``'s profile (Nsight
Compute, D128 N4096, H200): 17% of the warp samples at the two full wgmma waits, the tensor pipe busy 39%.

Prediction: 1.1-1.25× ``fp8_ws``'s attention kernel at B1 H32 N8192 D128.

Verdict: confirmed, at the prediction's low end. B1 H32 N8192 D128 fp16, two runs (H200, quantization included):
1.459 ms and 1.467 ms against the parent's 1.566 ms and 1.646 ms (1.07-1.12×) and cuDNN fp16's 1.677 ms and
1.678 ms (1.15×); bf16 1.463 ms (1.10× cuDNN's 1.613 ms); causal 0.896 ms (1.02× cuDNN's 0.917 ms); D64 (B4 N2048)
0.383 ms (0.77× cuDNN's 0.296 ms). No spills at Bc=192. [results/fp8-nvidia-h200.jsonl, rows of fp8_ws,
torch_sdpa_cudnn]
"""
from __future__ import annotations

import functools

from numba import float32, uint32

from numba_attn.gpu.device_functions import fragment_rescale
from numba_attn.gpu.warp import FULL_MASK, ballot_sync
from numba_attn.gpu.jit import device
from numba_attn.gpu.wgmma import make_wgmma_wait
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.fp8 import fp8_products, fp8_softmax, pack_p8, qk_depth
from numba_attn.phases.tensor_core.p42_fp8_ws import FP8_RING_OPTIONS, build_fp8_ws
from numba_attn.phases.tensor_core.pipeline import ring_barriers, ring_functions
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import PLAIN


@device
def head_tile(tile_scales, kvh, kt, sl2q):
    """The scales of a tile under one scale a head (``tile_scales``: the head's infinite-K flag): ``(a, kinf,
    sv)``, the scores' log2 factor, whether the tile may hold an infinite K value and V's scale in O's units (1:
    the head's scale is applied once, at the end)."""
    return sl2q, tile_scales, float32(1.0)


@device
def same_units(m, a):
    """A running maximum kept in the scores' code units: no conversion."""
    return m


HEAD_UNITS = (head_tile, same_units, same_units)  # (tile scales, maxima into a tile's units, back)


@functools.cache
def fp8_overlap_loop(D: int, Bc: int, STAGES: int, WG: int, causal: bool, stage=PLAIN, units=HEAD_UNITS,
                     fma_share: int = 0, lazy: bool = False):
    """``fp8_ws_loop``'s interface with the softmax of tile ``it`` under the P·V of the last tile this warpgroup
    saw (``held``: P packed in ``pf``, its stage not yet released): issue S_it, issue that P·V, wait for S_it,
    the softmax in place, wait for O, release that tile's stage, pack P_it and rescale O. Every visible tile
    issues both products (the first one's P·V adds P = 0 times its own V: the wait for S_it is always
    ``wait_group 1``); at the first tile this warpgroup does not see (past its rows' last key, as are all later
    ones) the held P·V runs and its stage is released (a later tile may wait for that stage), each unseen tile is
    released at once; else the last P·V runs after the loop. ``units = (tile, to_tile, from_tile)``: a tile's
    scales ``tile(tile_scales, kvh, kt, sl2q) -> (a, kinf, sv)`` and the running maxima into its units and back
    (:data:`HEAD_UNITS`; a scale a tile: ``fp8_block``'s); O is kept in the units of the held tile's V (rescaled
    by corr · sv_held / sv) and the row sums come back in them. ``fma_share``: :func:`.fp8.fp8_softmax`'s
    (exponentials on the FMA pipe). ``lazy``: its conditional rescale; a warp then multiplies O only when one of its
    rows' maximum moved or the units changed."""
    TILEK, TILEV = Bc * qk_depth(D), D * Bc
    VBASE = STAGES * TILEK
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    wait_full, release = ring_barriers(STAGES, 4 * WG)[1:]
    advance = ring_functions(STAGES)[0]
    qk, pv = fp8_products(D, Bc, wait=False)
    softmax = fp8_softmax(D, Bc, causal, stage, fma_share, lazy)
    pack = pack_p8(Bc // 32)
    rescale = fragment_rescale(D // 8)
    wait_s = make_wgmma_wait(1, Bc // 2)  # S complete; the P·V issued after it may still run
    wait_all = make_wgmma_wait(0, Bc // 2, D // 2)  # both complete
    NP = 4 * (Bc // 32)  # registers of packed P

    @device
    def rescale_always(acc, out, f):
        """O times the rows' correction factors and the change of units ``f``."""
        rescale(acc, 0, out[1] * f, out[2] * f)

    @device
    def rescale_when_moved(acc, out, f):
        """(``lazy``) the same, only where a row of the warp moved its maximum or the units changed: O's multiplies
        skipped by the whole warp together (a vote)."""
        if ballot_sync(FULL_MASK, out[3] or f != float32(1.0)) != 0:
            rescale(acc, 0, out[1] * f, out[2] * f)

    rescale_o = rescale_when_moved if lazy else rescale_always
    tile_units, to_tile, from_tile = units

    @device
    def loop(n_tiles, regs, stats, KV, bars, walk, wg_end, tile_scales, kmul, kvh, pos, mods, lane, first):
        s, qf, pf, acc = regs
        row0, g, t, Nq, Nk, off, sl2q, b, h = pos
        m_lo, m_hi, l_lo, l_hi = stats
        for i in range(NP):  # no P held yet: the first tile's P·V adds 0 · V (of its own stage)
            pf[i] = uint32(0)
        ring = (0, 0)
        held = False  # pf holds the P of the tile in stage ``held_stage``, its P·V not yet issued
        held_stage = 0
        sv_held = float32(1.0)  # O's units: the V scale of the held tile
        for it in range(n_tiles):
            wait_full(bars, ring)  # tile it has landed
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < wg_end:
                if not held:
                    held_stage = ring[0]
                qk(s, qf, 0, KV, ring[0] * TILEK)  # S_it = Q K_itᵀ, issued ...
                pv(acc, pf, 0, KV, VBASE + held_stage * TILEV)  # ... then the held tile's O += P V
                a, kinf, sv = tile_units(tile_scales, kvh, kt, sl2q)
                wait_s(s, s)  # S_it complete (the P·V may still run)
                out = softmax(s, (to_tile(m_lo, a), to_tile(m_hi, a), l_lo, l_hi), j0, kind_at(walk, kt), kinf, kmul,
                              kvh, (row0, g, t, Nq, Nk, off, a, b, h), mods)
                st = out[0]
                m_lo = from_tile(st[0], a)
                m_hi = from_tile(st[1], a)
                l_lo = st[2]
                l_hi = st[3]
                f = sv_held / sv  # O from the held tile's V units into this tile's
                wait_all(s, acc)  # the held P·V complete: pf and O are free
                if held:
                    release(bars, held_stage, lane)
                pack(pf, s)
                rescale_o(acc, out, f)
                held = True
                held_stage = ring[0]
                sv_held = sv
            else:  # a tile this warpgroup does not see (nor any later one): the held P·V first, so that its
                if held:  # stage is free before a later tile waits for the same stage (≥ STAGES unseen tiles)
                    pv(acc, pf, 0, KV, VBASE + held_stage * TILEV)
                    wait_all(s, acc)
                    release(bars, held_stage, lane)
                    held = False
                    for i in range(NP):  # (the walk is monotone: no visible tile follows; kept correct if one did)
                        pf[i] = uint32(0)
                release(bars, ring[0], lane)
            ring = advance(ring)
        if held:  # the last tile's P·V
            pv(acc, pf, 0, KV, VBASE + held_stage * TILEV)
            wait_all(s, acc)
            release(bars, held_stage, lane)
        inv_sv = float32(1.0) / sv_held  # the row sums in O's units
        return m_lo, m_hi, l_lo * inv_sv, l_hi * inv_sv

    return loop


fp8_overlap_loop.kernel_name = "fp8_overlap"


@register_phase(
    name="fp8_overlap", order=44, title="FP8 (e4m3): each consumer's softmax under its own P·V",
    parent="fp8_ws",
    description="""
        fp8_ws with FlashAttention-3's intra-warpgroup pipelining: a consumer issues S_j = Q·K_jᵀ and the last
        tile's O += P·V, waits only for S_j, and computes P_j in place while its P·V runs; then it waits for O,
        packs P_j to e4m3 and rescales O. In FP8 the packed P frees the score accumulators, so no second score
        tile is needed.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.2 intra-warpgroup overlapping of GEMMs and softmax",
    planned_speedup=350.0,  # fp8_ws's 300 and a predicted ~1.15x
    **FP8_RING_OPTIONS,
)
def fp8_overlap(problem, warpgroups=0, Bc=0, stages=3, uniform=True):
    """fp8_ws's kernel running :func:`fp8_overlap_loop`."""
    return build_fp8_ws(problem, warpgroups, Bc, stages, uniform, fp8_overlap_loop)
