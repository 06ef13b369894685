"""Phase 25 — ``tma_wgmma``: K/V tiles brought by TMA into an mbarrier ring, one thread issuing the loads.

Change against ``tc_wgmma`` — the wgmma products, the on-fragment softmax and
the swizzled tile layout are the same; what changes is how a K_j / V_j tile
reaches shared memory and how the block learns that it has:

* **One thread issues a tile.** In ``tc_wgmma`` every thread computes the
  addresses of its share of 16-byte ``cp.async`` copies (Bc·D/8 of them per
  tile, K and V). Here thread 0 announces the tile's bytes with
  ``mbarrier.arrive.expect_tx`` on the stage's "full" barrier and issues one
  ``cp.async.bulk.tensor.3d`` per 64-column block of K_j and of V_j
  (``numba_attn.gpu.tma``): the Tensor Memory Accelerator walks the box of
  (1 head, Bc keys, 64 columns) of a tensor map of the (B·Hkv, Nk, D) tensor.
  Keys past Nk of a head lie outside the map's rows and are zero-filled (the
  mask of keys ≥ Nk stays: zeros are not −∞).
* **The hardware's swizzle is the wgmma layout.** With the 128-byte swizzle
  (``CU_TENSOR_MAP_SWIZZLE_128B``, box rows of 64 fp16) TMA stores the 16-byte
  chunk c of row r at ``c ^ (r mod 8)`` — the column-block layout
  (``gpu.wgmma.tile_offset``) the descriptors of ``tc_wgmma`` already read, so
  a box lands as one column block of the ring tile. D = 32 / 16 use the 64 /
  32-byte modes, as the parent does; padded head dims (40, 80, 96, …) load a
  whole 64-column box whose columns past D are zero-filled.
* **Barriers instead of wait_group + __syncthreads.** Every warp waits on the
  stage's full barrier with the phase parity of the tile (tile j is phase
  j // stages of stage j mod stages); there is no ``cp.async.wait_group`` and
  no block barrier in the loop. A stage is refilled only after every warp is
  done with it: each warp, its wgmma complete, syncs its lanes and arrives
  (lane 0) on the stage's "empty" barrier (one arrival per warp), on which
  thread 0 waits before the next load into it. An empty barrier rather than the parent's
  block barrier, because only thread 0 writes the ring: no other thread has
  to wait for the slowest warpgroup (thread 0's warpgroup still does, at the
  refill). A warpgroup that skips a tile (causal) still waits for it before
  arriving, so that its arrival cannot count for a later phase.

Requirements: sm_90a, fp16/bf16, head_dim a multiple of 8 up to 256 (rows of
D·2 bytes, a multiple of the 16 bytes TMA needs); K and V at 16-byte aligned
addresses (checked when the tensor maps are made: misaligned inputs raise
ValueError). Tensor maps are encoded on the host per (address, shape,
strides) and cached: a repeated call allocates nothing.

Prediction (written before measuring): the copies stop costing the consumer
warps instructions and registers (address arithmetic, 2·Bc·D/8 ``cp.async``
per tile per block) and the per-tile ``bar.sync`` goes away, but the
schedule stays that of ``tc_wgmma`` (thread 0's warpgroup still stalls for the
slowest one at each refill): +5–10% at D=128 and D=64 (B1 H32 N4096 fp16:
~0.60–0.63 ms at D128 against 0.66), an eighth to a quarter of the gap to
SDPA (0.43 ms); the larger step is the warp-specialised producer that follows.

Verdict: confirmed, 0.591 ms at B1 H32 N4096 D128 fp16 (H200, CUPTI), 1.13x tc_wgmma, 0.78x SDPA; 0.365 ms at B4 H32 N2048 D64, 1.08x tc_wgmma [results/tensor-core-tma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, resolve_wgmma, supports_wgmma
from numba_attn.phases.tensor_core.producer import tma_smem_reason


def _supports(problem, warpgroups, Bc, stages):
    return (supports_wgmma(problem, warpgroups, Bc, stages, min_stages=2)
            or tma_smem_reason(problem, Bc, stages))


@register_phase(
    name="tma_wgmma", order=25, title="Tensor cores: wgmma with K/V tiles brought by TMA into an mbarrier ring",
    parent="tc_wgmma",
    requires_cc="sm_90a",
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
    space={"warpgroups": [0, 1, 2, 3], "Bc": [32, 64, 128], "stages": [2, 3, 4]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 1, "Bc": 16, "stages": 2},
    supports=_supports,
    resolve=resolve_wgmma,
)
def tma_wgmma(problem, warpgroups=0, Bc=64, stages=2):
    """tc_wgmma's kernel whose tiles come by TMA, thread 0 issuing them (:func:`.producer.tma_loads`)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="tma")
