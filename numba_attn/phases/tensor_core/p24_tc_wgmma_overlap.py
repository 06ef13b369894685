"""Phase 24 — ``tc_wgmma_overlap``: the next tile's Q·Kᵀ runs on the tensor cores during this tile's softmax.

Change against ``tc_wgmma`` (FlashAttention-3's intra-warpgroup pipelining, :func:`overlap_mainloop`): per tile
j, issue S_{j+1} into a second score set, run the softmax of S_j and issue P_j·V_j, then one wait retires
both. The loop is unrolled by two so the score sets swap roles at compile time; stages ≥ 3.

Prediction: the softmax hides behind the next Q·Kᵀ: +10–20% at D=128 and D=64.

Verdict: refuted, 0.820 ms at B1 H32 N4096 D128 fp16 (H200), 1.24x slower than tc_wgmma (occupancy lost).
[results/tensor-core-overlap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba_attn.gpu.jit import device
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import ring_steps, scores_to_p, wgmma_products
from numba_attn.phases.tensor_core.kernel import build_wgmma, supports_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.pipeline import ring_functions
from numba_attn.phases.tensor_core.producer import load_functions
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import PLAIN


@functools.cache
def overlap_mainloop(tiles, causal, bf16, loads, varlen, stage=PLAIN):
    """The tile loop with the next tile's S = Q·Kᵀ in flight during this tile's softmax: per tile it, issue
    S_{it+1} (into the other score set), scores of tile it to P, O += P·V issued, one wait for both. The
    loop is unrolled by two, the score sets ``s`` and ``sn`` trading roles at compile time (nothing copied)."""
    if varlen:
        raise ValueError("overlap runs a tile ahead on the carried ring state; the varlen kernel recomputes it")
    STAGES, Bc, TILE = tiles.stages, tiles.Bc, tiles.tile_bytes
    _, wait_first, acquire, release, _ = load_functions(tiles, loads, varlen, True, stage)
    qk, qk_next, pv, wait_all, _ = wgmma_products(tiles, bf16, False)
    to_p = scores_to_p(tiles, causal, bf16, stage)
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    advance = ring_functions(STAGES)[0]
    next_tile = ring_steps(STAGES)

    @device
    def step(it, n_tiles, s, sn, ring, refill, stats, regs, loads, rows, lane_ids):
        qf, pf, acc = regs
        KV = loads[0]
        kt = tile_at(loads[6], it)  # (a variant: the block mask's it-th visited tile, read before the
        kind = kind_at(loads[6], kt)  # wait below, which hides the two reads' latency)
        ring_next = advance(ring)  # tile it+1
        ring_next, refill = acquire(loads, it, n_tiles, ring_next, refill, lane_ids[0])  # tile it+1 has landed
        j0 = kt * Bc
        # -- issue S_{it+1} = Q K_{it+1}ᵀ: the tensor cores work on it during the softmax below. Issued
        # for every tile, also past the last one or past this warpgroup's keys (its scores then unused):
        # a branch around it leaves sn's old values on one path, and ptxas serializes every wgmma of
        # the loop unrolled by two (C7515). Past the last tile the stage holds tile it+1-STAGES (or
        # nothing yet), which no load rewrites: nothing is read that is being written.
        qk_next(sn, qf, 0, KV, ring_next[0] * TILE)
        if j0 < rows[1]:  # this warpgroup's rows see keys of the tile
            stats = to_p(s, pf, acc, stats, j0, kind, loads, rows, lane_ids)
            pv(acc, pf, 0, KV, (STAGES + ring[0]) * TILE)  # issued, not waited
        wait_all(sn, acc)  # both products complete (warpgroup-uniform); S_{it+1} is in sn
        release(loads, ring[0], lane_ids[1])
        stage, phase, refill_stage, refill_phase = next_tile(ring, refill)
        return stats, stage, phase, refill_stage, refill_phase

    @device
    def mainloop(n_tiles, ring, stats, regs, loads, rows, lane_ids):
        qf, s, sn, pf, acc = regs
        wait_first(loads, n_tiles)
        if n_tiles > 0 and rows[1] > 0:
            qk(s, qf, 0, loads[0], 0)  # S of tile 0
        stage, phase = ring  # carried as scalars: a tuple carried by the loop keeps dead fields alive
        refill_stage = STAGES - 1  # the refill's (tile it + STAGES - 1): the stage of tile it-1
        refill_phase = 0
        step_regs = (qf, pf, acc)
        for it in range(0, n_tiles, 2):  # S_it in s for even it, in sn for odd it
            stats, stage, phase, refill_stage, refill_phase = step(
                it, n_tiles, s, sn, (stage, phase), (refill_stage, refill_phase), stats, step_regs, loads, rows,
                lane_ids)
            if it + 1 < n_tiles:
                stats, stage, phase, refill_stage, refill_phase = step(
                    it + 1, n_tiles, sn, s, (stage, phase), (refill_stage, refill_phase), stats, step_regs, loads,
                    rows, lane_ids)
        return stats, (stage, phase)

    return mainloop


overlap_mainloop.ahead = True  # the loads wait for tile it+1 at tile it
overlap_mainloop.suffix = "_overlap"


def _supports(problem, warpgroups, Bc, stages):
    return supports_wgmma(problem, warpgroups, Bc, stages, min_stages=3)


@register_phase(
    name="tc_wgmma_overlap", order=24,
    title="Tensor cores: wgmma with the next tile's Q·Kᵀ in flight during the softmax",
    parent="tc_wgmma",
    description="""
        tc_wgmma with FlashAttention-3's intra-warpgroup pipelining: the wgmma for the next
        tile's scores is issued before this tile's softmax and P·V, and one wait_group
        retires both; a second score set in registers, stages >= 3.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), intra-warpgroup overlap of softmax and GEMMs",
    planned_speedup=170.0,
    **wgmma_registration(_supports, space={"warpgroups": [1, 2, 3], "Bc": [32, 64, 128], "stages": [2, 3, 4]},
                         sim_params={"warpgroups": 1, "Bc": 16, "stages": 3}),
)
def tc_wgmma_overlap(problem, warpgroups=2, Bc=64, stages=3):
    """tc_wgmma's kernel running :func:`overlap_mainloop`."""
    return build_wgmma(problem, warpgroups, Bc, stages, overlap_mainloop, loads="cp_async")
