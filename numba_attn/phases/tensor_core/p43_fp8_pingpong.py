"""Phase 43 — ``fp8_pingpong``: fp8_ws's two consumer warpgroups take turns at the tensor cores.

Change against ``fp8_ws`` (:func:`fp8_pingpong_loop`, the schedule of ``pingpong``): consumer c's turn is named
barrier 1 + c. A turn only issues — O += P_{j-1}·V_{j-1}, then S_j = Q·K_jᵀ — and passes to the other consumer;
outside its turn a consumer waits for its products, releases tile j-1's stage and runs its softmax while the other's
products run. The products of :func:`.fp8.fp8_products` unwaited, the softmax of :func:`.fp8.fp8_scores_to_p`:
the same registers as the parent (S, O, Q and P: P packs to 16 registers, so S_j's accumulators are free when
P_{j-1}·V_{j-1} is issued).

Why here, when ``pingpong`` was refuted at fp16: in FP8 a tile's products take half the tensor time, as long as its
exponentials on the MUFU pipe (Bc·64 a warpgroup at 16 a cycle), so a consumer that waits for its own products
leaves the tensor pipe idle for a softmax as long as them. ``fp8_ws``'s tiles took ~2.7× either pipe's time
(H200, 1.43 ms at B1 H32 N8192 D128).

Prediction: 1.1-1.3× ``fp8_ws``'s attention kernel at B1 H32 N8192 D128.

Verdict: refuted. 1.603 ms at B1 H32 N8192 D128 fp16 against the parent's 1.687 ms and its uniform warp index's
1.551 ms in the same run (H200); causal 0.947 ms against 0.970 ms; D64 (B4 N2048) 0.463 ms against 0.399 ms.
Taking turns did not shorten a consumer's tile: ``fp8_overlap`` puts the softmax under the consumer's own P·V
instead. [results/fp8-nvidia-h200.jsonl, rows of fp8_ws, fp8_ws_uniform]
"""
from __future__ import annotations

import functools

from numba_attn.gpu.jit import device
from numba_attn.gpu.wgmma import make_wgmma_wait
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.fp8 import fp8_products, fp8_scores_to_p, qk_depth
from numba_attn.phases.tensor_core.p27_pingpong import TURN_BARRIER, TURN_THREADS, turn_pass, turn_wait
from numba_attn.phases.tensor_core.p42_fp8_ws import build_fp8_ws, supports_fp8_ws
from numba_attn.phases.tensor_core.pipeline import ring_barriers, ring_functions
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.gpu.warpspec import named_barrier_arrive
from numba_attn.variants.stages import PLAIN


@functools.cache
def fp8_pingpong_loop(D: int, Bc: int, STAGES: int, WG: int, causal: bool, stage=PLAIN):
    """``fp8_ws_loop``'s interface with two consumers taking turns: in its turn a consumer issues O += P·V of tile
    it-1 and (tile it landed) S_it = Q·K_itᵀ, then passes the turn, waits for both, releases tile it-1's stage and
    computes P_it. Consumer 0 takes the first turn; each consumer passes the turn once per tile, also for a tile it
    skips, and once after the loop (the other's last P·V): the turns alternate strictly."""
    if WG != 2:
        raise ValueError("the ping-pong alternates exactly two consumer warpgroups")
    TILEK, TILEV = Bc * qk_depth(D), D * Bc
    VBASE = STAGES * TILEK
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    wait_full, release = ring_barriers(STAGES, 4 * WG)[1:]
    advance = ring_functions(STAGES)[0]
    qk, pv = fp8_products(D, Bc, wait=False)
    to_p = fp8_scores_to_p(D, Bc, causal, True, stage)
    wait_all = make_wgmma_wait(0, Bc // 2, D // 2)  # S and O complete (passed through the wait)
    wait_o = make_wgmma_wait(0, D // 2)

    @device
    def loop(n_tiles, regs, stats, KV, bars, walk, wg_end, kinf, kmul, kvh, pos, mods, lane, first):
        s, qf, pf, acc = regs
        if first:  # consumer 0 takes the first turn ...
            named_barrier_arrive(TURN_BARRIER, TURN_THREADS)
        turn_wait(first)  # ... consumer 1 waits for consumer 0's first arrival
        ring = (0, 0)
        prev_stage = STAGES - 1  # tile it-1's stage
        for it in range(n_tiles):
            wait_full(bars, ring)  # tile it has landed
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < wg_end:
                qk(s, qf, 0, KV, ring[0] * TILEK)  # S = Q Kᵀ issued in this consumer's turn ...
                turn_pass(first)  # ... then the other consumer's turn
                wait_all(s, acc)  # S and the last tile's O complete: the softmax overlaps the other's products
                if it > 0:  # tile it-1's P·V retired: its stage may be refilled
                    release(bars, prev_stage, lane)
                stats = to_p(s, pf, acc, stats, j0, kind_at(walk, kt), kinf, kmul, kvh, pos, mods)
                turn_wait(first)  # this consumer's next turn: O += P V, then (next tile) S above
                pv(acc, pf, 0, KV, VBASE + ring[0] * TILEV)
            else:  # a tile this consumer skips: its turns all the same (the barriers stay balanced)
                turn_pass(first)
                wait_o(acc, acc)  # the last P·V complete: tile it-1's stage may be refilled
                if it > 0:
                    release(bars, prev_stage, lane)
                turn_wait(first)
            prev_stage = ring[0]
            ring = advance(ring)
        turn_pass(first)  # the other consumer's last turn (its last P·V); this consumer's last P·V retired
        wait_o(acc, acc)
        return stats

    return loop


fp8_pingpong_loop.kernel_name = "fp8_pingpong"


def _supports(problem, warpgroups, Bc, stages, uniform=False):
    if warpgroups not in (0, 2):
        return f"warpgroups={warpgroups}: the ping-pong alternates exactly 2 consumer warpgroups"
    return supports_fp8_ws(problem, 2, Bc, stages, uniform)


def _resolve(problem, warpgroups, Bc, stages, **more):
    """warpgroups=0: the two the ping-pong alternates."""
    return {"warpgroups": warpgroups or 2}


@register_phase(
    name="fp8_pingpong", order=43, title="FP8 (e4m3): two consumer warpgroups take turns at the tensor cores",
    parent="fp8_ws",
    requires_cc="sm_90a",
    description="""
        fp8_ws with FlashAttention-3's inter-warpgroup ping-pong: each of the two consumer warpgroups issues its
        P·V and next Q·Kᵀ (e4m3, unwaited) only in its turn (bar.sync on its own named barrier, bar.arrive on the
        other's once issued), so one consumer's softmax runs under the other's products.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.1 pingpong scheduling, with its FP8 forward",
    planned_speedup=360.0,  # fp8_ws's 300 and a predicted ~1.2x
    space={"Bc": [64, 128], "stages": [2, 3, 4], "uniform": [False, True]},
    dtypes=("float16", "bfloat16"),
    head_dims=(16, 32, 64, 128),
    precision="e4m3",
    sim_params={"warpgroups": 2, "Bc": 64, "stages": 2},
    supports=_supports,
    resolve=_resolve,
    variants=True,
)
def fp8_pingpong(problem, warpgroups=0, Bc=128, stages=3, uniform=False):
    """fp8_ws's kernel running :func:`fp8_pingpong_loop`."""
    return build_fp8_ws(problem, warpgroups, Bc, stages, uniform, fp8_pingpong_loop)
