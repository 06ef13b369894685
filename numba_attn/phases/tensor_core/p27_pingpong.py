"""Phase 27 — ``pingpong``: the two consumer warpgroups take turns at the tensor cores.

Change against ``warp_specialized_tc`` (FlashAttention-3's inter-warpgroup ping-pong, :func:`pingpong_mainloop`):
consumer c's turn is named barrier 1 + c. A turn only issues — O += P_{j-1}·V_{j-1}, then S_j = Q·K_jᵀ — and
passes to the other consumer (``bar.arrive``); outside its turn a consumer waits for its products and computes
its softmax while the other's products run. Consumer 0 starts; every tile, also a skipped one, is one turn.

Prediction: +8% against warp_specialized_tc at B1 H32 N4096 D128 fp16 (~0.53 ms); refuted below 3%.

Verdict: refuted, 0.643 ms at B1 H32 N4096 D128 fp16 (H200), 1.11x warp_specialized_tc's time.
[results/tensor-core-tma-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba_attn.gpu.jit import device
from numba_attn.gpu.warpspec import named_barrier_arrive, named_barrier_sync
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import scores_to_p, wgmma_products
from numba_attn.phases.tensor_core.kernel import (TWO_CONSUMERS_SIM, build_wgmma, resolve_two_consumers,
                                                  two_consumers_reason, wgmma_registration)
from numba_attn.phases.tensor_core.pipeline import ring_functions
from numba_attn.phases.tensor_core.producer import load_functions
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import PLAIN

TURN_BARRIER = 1  # consumer c's turn is named barrier TURN_BARRIER + c (0 is syncthreads)
TURN_THREADS = 256  # threads counted at either barrier: the two consumer warpgroups


@device
def turn_wait(first):
    """Wait for this consumer's turn, ``bar.sync`` on its own barrier (``first``: consumer 0).
    The ids are constants in each branch: no register holds them through the loop."""
    if first:
        named_barrier_sync(TURN_BARRIER, TURN_THREADS)
    else:
        named_barrier_sync(TURN_BARRIER + 1, TURN_THREADS)


@device
def turn_pass(first):
    """Give the turn to the other consumer, ``bar.arrive`` on its barrier."""
    if first:
        named_barrier_arrive(TURN_BARRIER + 1, TURN_THREADS)
    else:
        named_barrier_arrive(TURN_BARRIER, TURN_THREADS)


@functools.cache
def pingpong_mainloop(tiles, causal, bf16, loads, varlen, stage=PLAIN):
    """The tile loop of two consumers taking turns at the tensor cores. A turn only issues: O += P·V of tile
    it-1, then (tile it landed) S_it = Q·K_itᵀ; the turn passes, the consumer waits for both products, releases
    tile it-1's stage and computes its softmax while the other consumer's products run. Consumer 0 takes the
    first turn; each consumer passes the turn once per tile, also for a tile it skips, and once after the loop
    (the other's last P·V): the turns alternate strictly."""
    if loads != "ws" or tiles.warpgroups != 2:
        raise ValueError("pingpong alternates two consumer warpgroups: it needs loads='ws' and two warpgroups")
    STAGES, Bc, TILE = tiles.stages, tiles.Bc, tiles.tile_bytes
    acquire, release = load_functions(tiles, loads, varlen, False, stage)[2:4]
    _, qk_next, pv, wait_all, wait_o = wgmma_products(tiles, bf16, False)
    to_p = scores_to_p(tiles, causal, bf16, stage)
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    advance = ring_functions(STAGES)[0]

    @device
    def step(it, n_tiles, ring, prev_stage, stats, regs, loads, rows, lane_ids):
        qf, s, sn, pf, acc = regs
        tid, lane, g, t, first = lane_ids
        KV = loads[0]
        kt = tile_at(loads[6], it)  # (a variant: the block mask's it-th visited tile, read before the
        kind = kind_at(loads[6], kt)  # wait below, which hides the two reads' latency)
        ring, _ = acquire(loads, it, n_tiles, ring, ring, tid)
        j0 = kt * Bc
        if j0 < rows[1]:  # this warpgroup's rows see keys of the tile
            qk_next(s, qf, 0, KV, ring[0] * TILE)  # S = Q Kᵀ issued in this consumer's turn ...
            turn_pass(first)  # ... then the other consumer's turn
            wait_all(s, acc)  # S and the last tile's O complete: the softmax below overlaps the other's products
            if it > 0:  # tile it-1's P·V retired: its stage may be refilled (before this consumer's
                release(loads, prev_stage, lane)  # next turn: two stages suffice)
            stats = to_p(s, pf, acc, stats, j0, kind, loads, rows, lane_ids)
            turn_wait(first)  # this consumer's next turn: O += P V, then (next tile) S above
            pv(acc, pf, 0, KV, (STAGES + ring[0]) * TILE)
        else:  # a tile this consumer skips: its turns all the same (the barriers stay balanced)
            turn_pass(first)
            wait_o(acc, acc)  # the last P·V complete: tile it-1's stage may be refilled
            if it > 0:
                release(loads, prev_stage, lane)
            turn_wait(first)
        stage, phase = advance(ring)
        return stats, stage, phase, ring[0]

    @device
    def mainloop(n_tiles, ring, stats, regs, loads, rows, lane_ids):
        first = lane_ids[4]
        acc = regs[4]
        if first:  # consumer 0 takes the first turn ...
            named_barrier_arrive(TURN_BARRIER, TURN_THREADS)
        turn_wait(first)  # ... consumer 1 waits for consumer 0's first arrival
        stage, phase = ring  # carried as two scalars: a tuple carried by the loop keeps dead fields alive
        prev_stage = STAGES - 1  # tile it-1's stage
        for it in range(n_tiles):
            stats, stage, phase, prev_stage = step(it, n_tiles, (stage, phase), prev_stage, stats, regs, loads, rows,
                                                   lane_ids)
        turn_pass(first)  # the other consumer's last turn (its last P·V); this consumer's last P·V retired
        wait_o(acc, acc)
        return stats, (stage, phase)

    return mainloop


pingpong_mainloop.kernel_name = "pingpong"


def _supports(problem, warpgroups, Bc, stages):
    return two_consumers_reason(problem, warpgroups, Bc, stages, "the ping-pong alternates", min_stages=2)


@register_phase(
    name="pingpong", order=27,
    title="Tensor cores: two consumer warpgroups take turns at the GEMMs (named barriers)",
    parent="warp_specialized_tc",
    description="""
        warp_specialized_tc with FlashAttention-3's inter-warpgroup ping-pong: each of the two
        consumer warpgroups issues its P·V and next Q·Kᵀ only in its turn (bar.sync on its own
        named barrier, bar.arrive on the other's once issued), so one consumer's softmax runs
        under the other's GEMMs. Three ring stages by default.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.1 pingpong scheduling: "
            "warp_scheduler_barrier_sync / warp_scheduler_barrier_arrive",
    planned_speedup=173.0,  # warp_specialized_tc's 160 and the predicted +8%
    **wgmma_registration(_supports, resolve_two_consumers, {"warpgroups": [2], "Bc": [64, 128], "stages": [2, 3, 4]},
                         TWO_CONSUMERS_SIM),
)
def pingpong(problem, warpgroups=0, Bc=64, stages=3):
    """warp_specialized_tc's kernel running :func:`pingpong_mainloop`."""
    return build_wgmma(problem, warpgroups, Bc, stages, pingpong_mainloop, loads="ws")
