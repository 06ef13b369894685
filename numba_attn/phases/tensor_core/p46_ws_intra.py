"""Phase 46 — ``ws_intra``: warp_specialized_tc's consumers run each tile's softmax under their own O += P·V.

Change against ``warp_specialized_tc`` (:func:`intra_mainloop`, FlashAttention-3's intra-warpgroup pipelining in
the order ``fp8_overlap`` timed): a consumer issues S_j = Q·K_jᵀ and then O += P_{j-1}·V_{j-1}, waits only for
S_j (``wgmma.wait_group 1``), runs the softmax of S_j in place while its P·V runs, then waits for O, releases
tile j-1's stage, packs P_j and rescales O. ``ws_overlap`` (refuted) kept S_{j+1} in flight instead and needed a
second score tile; here S_j's registers are free once P_{j-1} is packed: Q, S, P and O take 192 of the 232.

Prediction: 1.04-1.10× ``warp_specialized_tc`` at B1 H32 N4096 D128 fp16 (``fp8_overlap`` gained 1.07-1.12× over
its parent with the same schedule); 1.0-1.05× causal and at D64.

Verdict: confirmed at D128 with the uniform warp index (H200): B1 H32 N4096 fp16 0.472 ms against 0.492 ms (1.04×,
bf16 1.07×), B2 H16 N8192 causal 0.970 ms against 1.072 ms (1.11×), N16384 bf16 causal 1.19×; cuDNN's 0.424 ms and
0.939 ms (0.90×, 0.97×). Refuted at D64: 0.94× its parent. [results/tensor-core-tma-nvidia-h200.jsonl, rows of
warp_specialized_tc, torch_sdpa_cudnn]
"""
from __future__ import annotations

import functools

from numba import uint32

from numba_attn.gpu.jit import device
from numba_attn.gpu.wgmma import make_wgmma_wait
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import q_operand, scores_softmax, wgmma_products
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p26_warp_specialized_tc import resolve_warp_specialized, supports_warp_specialized
from numba_attn.phases.tensor_core.pipeline import kv_barriers, q_barriers, ring_functions
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.phases.tensor_core.softmax import pack_p, rescale_o
from numba_attn.variants.stages import PLAIN

MIN_STAGES = 3  # a stage stays held through the next tile's softmax: two stages would stall the producer
MAX_HEAD_DIM = 224  # offline, sm_90a: no spill up to D224 (252 registers, one consumer), 172 bytes at D256


@functools.cache
def intra_mainloop(tiles, causal, bf16, loads, varlen, stage=PLAIN):
    """The tile loop with the softmax of tile ``it`` under the P·V of the last tile this warpgroup saw (``held``:
    its P packed in ``pf``, its V not yet released): issue S_it, issue that P·V, wait for S_it, the softmax
    in place, wait for O, release the held V, pack P_it, rescale O. Every visible tile issues both products
    (the first one's P·V adds P = 0 times its own V, so the wait for S_it is always ``wait_group 1``); at the first
    tile this warpgroup does not see (past its rows' last key; so are all later ones) the held P·V runs and its
    V is released (a later tile may wait for that stage), and each unseen tile is released at once; else the
    last P·V runs after the loop. The barriers (:func:`.pipeline.kv_barriers`): one pair a stage, K's wait being
    the tile's and V's release the stage's; with ``tiles.split_kv`` K's stage is released once S_it is complete and
    V is waited for just before its P·V. ``tiles.q_early``: a warp releases the item's Q (:func:`.pipeline.q_barriers`)
    once its last S = Q·Kᵀ is complete — plain attention: at the last tile its rows see (the walk ascends; a
    variant's walk: at the last tile) — or after the loop where it saw none."""
    if varlen or loads != "ws":
        raise ValueError("intra_mainloop runs on the warp-specialized ring (loads='ws', not varlen)")
    STAGES, Bc, TILE = tiles.stages, tiles.Bc, tiles.tile_bytes
    wait_k, release_k, wait_v, release_v = kv_barriers(STAGES, tiles.warps, tiles.split_kv)
    pv, wait_o = wgmma_products(tiles, bf16, False)[2::2]  # O += P·V only issued; the wait for O
    qk = q_operand(tiles, bf16)[1]  # S = Q·Kᵀ only issued, Q from its registers or (q_smem) its tile
    wait_s = make_wgmma_wait(1, tiles.s_regs)  # S complete; the P·V issued after it may still run
    wait_all = make_wgmma_wait(0, tiles.s_regs, tiles.o_regs)
    softmax = scores_softmax(tiles, causal, stage)
    pack = pack_p(tiles.pv_steps, bf16)
    rescale = rescale_o(tiles.o_tiles)
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    advance = ring_functions(STAGES)[0]
    P_REGS = tiles.p_regs
    BR, Q_BASE, Q_TILE = tiles.Br, tiles.q_base, tiles.q_tile_bytes
    Q_EARLY, ASCENDING = tiles.q_early, not stage.active  # (q_early) plain attention's walk: tile it is visit it
    release_q = q_barriers(tiles)[2]

    @device
    def mainloop(n_tiles, ring, stats, regs, loads, rows, lane_ids):
        qf, s, sn, pf, acc = regs
        KV, bars, lane = loads[0], loads[3], lane_ids[1]
        for i in range(P_REGS):  # no P held yet: the first tile's P·V adds 0 · V (of its own stage)
            pf[i] = uint32(0)
        held = False
        held_ring = ring  # the ring state (stage, phase) of the tile whose P is held
        q_held = Q_EARLY  # (q_early) this warp has not released the item's Q
        q_off = Q_BASE + ((rows[0] % BR) // 64) * Q_TILE  # (q_smem) this warpgroup's Q tile
        for it in range(n_tiles):
            kt = tile_at(loads[6], it)
            kind = kind_at(loads[6], kt)
            wait_k(bars, ring)  # K of tile it has landed (without split_kv: the whole tile)
            j0 = kt * Bc
            if j0 < rows[1]:  # this warpgroup's rows see keys of the tile
                if not held:
                    held_ring = ring
                qk(s, qf, q_off, KV, ring[0] * TILE)  # S_it = Q K_itᵀ, issued ...
                wait_v(bars, held_ring)
                pv(acc, pf, 0, KV, (STAGES + held_ring[0]) * TILE)  # ... then the held tile's O += P V
                wait_s(s, s)  # S_it complete (the P·V may still run)
                release_k(bars, ring[0], lane)
                if Q_EARLY:  # the item's last S done: the producer may bring the next item's Q
                    if it + 1 == n_tiles or (ASCENDING and (it + 1) * Bc >= rows[1]):
                        release_q(bars, lane)
                        q_held = False
                stats, corr_lo, corr_hi = softmax(s, stats, j0, kind, loads, rows, lane_ids)
                wait_all(s, acc)  # the held P·V complete: pf and O are free
                if held:
                    release_v(bars, held_ring[0], lane)
                pack(pf, s)
                rescale(acc, 0, corr_lo, corr_hi)
                held = True
                held_ring = ring
            else:  # a tile this warpgroup does not see (all later ones too): the held P·V first, so that its
                if held:  # stage is free before a later tile waits for the same stage
                    wait_v(bars, held_ring)
                    pv(acc, pf, 0, KV, (STAGES + held_ring[0]) * TILE)
                    wait_o(acc, acc)
                    release_v(bars, held_ring[0], lane)
                    held = False
                    for i in range(P_REGS):  # (the walk is monotone: no visible tile follows; kept correct if one did)
                        pf[i] = uint32(0)
                wait_v(bars, ring)  # (every warp waits for what it releases: its arrival must not count early)
                release_k(bars, ring[0], lane)
                release_v(bars, ring[0], lane)
            ring = advance(ring)
        if held:  # the last tile's P·V
            wait_v(bars, held_ring)
            pv(acc, pf, 0, KV, (STAGES + held_ring[0]) * TILE)
            wait_o(acc, acc)
            release_v(bars, held_ring[0], lane)
        if q_held:  # (q_early) no tile seen
            release_q(bars, lane)
        return stats, ring

    return mainloop


intra_mainloop.suffix = "_intra"
intra_mainloop.split_kv = True  # it waits for and releases K and V apart when the ring's tiles say so
intra_mainloop.q_smem = True  # it reads Q from its tile when the ring's tiles hold one
intra_mainloop.persistent = True  # it returns the ring state after its last tile, every stage released
intra_mainloop.q_early = True  # with tiles.q_early it releases Q's tiles after the item's last S = Q·Kᵀ


def resolve_intra(problem, warpgroups, Bc, stages, **_):
    """warp_specialized_tc's choice, except three consumers take 64-key tiles (128 spill: 116 bytes at D64)."""
    r = resolve_warp_specialized(problem, warpgroups, Bc, stages)
    if r["warpgroups"] == 3 and not Bc:
        r["Bc"] = 64
    return r


def supports_intra(problem, warpgroups, Bc, stages, min_stages=MIN_STAGES, **_):
    if stages < min_stages:
        return f"stages={stages}: a consumer holds a stage through the next tile, so at least {min_stages}"
    if warpgroups == 3 and Bc > 64:
        return (f"Bc={Bc} with three consumers: S, the held P, O and Q need more than their 160 registers (116 bytes "
                "spilled at D64, serialized wgmma); use Bc=64 or two consumers")
    if problem.head_dim > MAX_HEAD_DIM:
        return (f"head_dim {problem.head_dim}: one consumer's O, Q, S and the held P spill above D={MAX_HEAD_DIM} "
                "(D256: 172 bytes, serialized wgmma); use warp_specialized_tc")
    return supports_warp_specialized(problem, warpgroups, Bc, stages)


@register_phase(
    name="ws_intra", order=46, title="Tensor cores: each consumer's softmax under its own P·V",
    parent="warp_specialized_tc",
    description="""
        warp_specialized_tc with FlashAttention-3's intra-warpgroup pipelining in fp8_overlap's order: a
        consumer issues S_j = Q·K_jᵀ and the last tile's O += P·V, waits only for S_j and runs its softmax
        while the P·V runs; then it waits for O, packs P_j and rescales O. No second score tile (ws_overlap
        needed one); at least three ring stages.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.2 intra-warpgroup overlapping of GEMMs and softmax",
    planned_speedup=170.0,  # warp_specialized_tc's 160 and a predicted ~1.06x
    **wgmma_registration(supports_intra, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [3, 4], "uniform": [False, True]},
                         {"warpgroups": 2, "Bc": 16, "stages": 3}),
)
def ws_intra(problem, warpgroups=0, Bc=0, stages=3, uniform=True):
    """warp_specialized_tc's kernel running :func:`intra_mainloop`; ``uniform`` (the warp index known warp-uniform)
    on by default: 1.03-1.07× the kernel without it (H200, D128; experiments/2026-11-28-ws-intra)."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform)
