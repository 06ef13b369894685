"""Phase 40 — ``ws_persistent``: warp specialisation in persistent blocks, the next item's tiles loaded early.

Change against ``warp_specialized_tc``: one block per SM runs its work items one after another
(:func:`.scheduler.first_item`, :func:`.scheduler.next_item`; the causal diagonal's longest first); the producer
carries its ring state from one item to the next, so the next item's first tiles load while the consumers
finish this one and store O. ``blocks``: the grid (0: one block per SM).

Prediction: 2-5 % faster than ``warp_specialized_tc`` at B1 H32 N4096 D128 fp16; 4-10 % at D64.

Verdict: refuted at D128, 491 µs against the parent's 493 µs at B1 H32 N4096 D128 fp16 (H100, Nsight Compute).
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import WS_SPACE, build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p26_warp_specialized_tc import resolve_warp_specialized, supports_warp_specialized


def resolve_persistent(problem, warpgroups, Bc, stages, **_):
    """As ``warp_specialized_tc``'s, but at D=64 two consumer warpgroups with 64-key tiles (its default there
    until three consumers with 128-key tiles became the parent's: here they spill 56 bytes causal, and three
    consumers were 17 % slower causal on the H100)."""
    if problem.head_dim == 64:
        warpgroups, Bc = warpgroups or 2, Bc or 64
    return resolve_warp_specialized(problem, warpgroups, Bc, stages)


@register_phase(
    name="ws_persistent", order=40,
    title="Tensor cores: warp specialisation in persistent blocks, the next item's tiles loaded during this one's end",
    parent="warp_specialized_tc",
    description="""
        warp_specialized_tc with one block per SM that runs its work items (query blocks of a
        head and batch) one after another; the producer carries the TMA ring across items, so
        the next item's first K/V tiles load while the consumers finish this one and store O.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 persistent kernels with a static tile scheduler",
    planned_speedup=165.0,  # warp_specialized_tc's 160 and the predicted +2-5 % at D128
    **wgmma_registration(supports_warp_specialized, resolve_persistent, WS_SPACE,
                         {"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
                         launch_params=("blocks",)),  # blocks: the grid only, its candidates share the kernel
)
def ws_persistent(problem, warpgroups=0, Bc=0, stages=2, uniform=False, blocks=0):
    """warp_specialized_tc's kernel in ``blocks`` persistent blocks (0: one per SM), each walking its work items
    (:func:`.scheduler.first_item`, :func:`.scheduler.next_item`) with the ring state carried across them."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="ws", uniform=uniform, blocks=blocks)
