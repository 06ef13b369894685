"""Phase 25 — ``tma_wgmma``: K/V tiles brought by TMA into an mbarrier ring, one thread issuing the loads.

Change against ``tc_wgmma``: thread 0 announces a tile's bytes on its stage's "full" mbarrier and issues one
``cp.async.bulk.tensor`` per 64-column block (the 128-byte swizzle is the wgmma layout); every warp waits on the
full barrier and releases the stage on an "empty" one, on which thread 0 waits before refilling it
(:func:`.producer.tma_loads`). No cp.async, no block barrier in the loop.

Prediction: +5–10% at D=128 and D=64 (B1 H32 N4096 fp16: ~0.60–0.63 ms at D128 against 0.66).

Verdict: confirmed, 0.591 ms at B1 H32 N4096 D128 fp16 (H200, CUPTI), 1.13x tc_wgmma; D64 1.08x.
[results/tensor-core-tma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, supports_tma, wgmma_registration


@register_phase(
    name="tma_wgmma", order=25, title="Tensor cores: wgmma with K/V tiles brought by TMA into an mbarrier ring",
    parent="tc_wgmma",
    description="""
        tc_wgmma with the K/V tiles loaded by the Tensor Memory Accelerator: one thread
        issues a cp.async.bulk.tensor per 64-column block of a tile after an expect_tx on
        the stage's full mbarrier (128-byte swizzle = the wgmma tile layout); warps wait
        on that barrier's phase and release the stage on an empty barrier. No cp.async,
        no block barrier per tile.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 TMA pipelines: "
            "cp.async.bulk.tensor with mbarrier transaction counts",
    planned_speedup=160.0,
    **wgmma_registration(supports_tma),
)
def tma_wgmma(problem, warpgroups=0, Bc=64, stages=2):
    """tc_wgmma's kernel whose tiles come by TMA, thread 0 issuing them (:func:`.producer.tma_loads`)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="tma")
