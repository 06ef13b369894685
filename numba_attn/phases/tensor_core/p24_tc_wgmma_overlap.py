"""Phase 24 — ``tc_wgmma_overlap``: the next tile's Q·Kᵀ runs on the tensor cores during this tile's softmax.

Change against ``tc_wgmma``: there every product is waited for at once, so a
warpgroup's tensor cores idle while it runs its online softmax (max, quad
shuffles, 32 exp2, packing, the rescale of O) — the rest of the SM fills that
gap only with the other warpgroups. Here the schedule per K/V tile j is the
intra-warpgroup pipelining of FlashAttention-3:

* issue S_{j+1} = Q·K_{j+1}ᵀ (``wgmma`` without a wait: ``make_wgmma_rs(...,
  wait=False)``), into a second set of score registers;
* run the softmax of S_j and issue O += P_j·V_j (also without a wait);
* ``wgmma.wait_group 0`` for both (``make_wgmma_wait``, which passes the
  accumulators through the wait so that no later instruction reads them
  earlier). The loop is unrolled by two, so the two score sets swap roles at
  compile time and no scores are copied. S_{j+1} is issued on every tile,
  even past the last one (its scores then unused): a branch around it made
  ptxas serialize the wgmma.

The tile ring needs tile j+1 resident while tile j is still read, so
``stages`` ≥ 3; one barrier per tile, as before. The cost: a second score set
(Bc/2 registers), hence 2 warpgroups per block by default.

Head dims: every multiple of 8 up to 256, padded as in ``tc_wgmma`` (one kernel).

Prediction (before measuring): the softmax hides behind the next Q·Kᵀ, about
a third of a tile's tensor work at D=128 (8 of 12 wgmma) — +10–20% at D=128
and D=64 (FlashAttention-3 reports ~+10% from this overlap alone).

Verdict: refuted, 0.820 ms at B1 H32 N4096 D128 fp16 (H200), 1.24x slower than tc_wgmma; 0.617 ms at D64 [results/tensor-core-overlap-nvidia-h200.jsonl]

The overlap is in the SASS, but the second score set costs the occupancy (the other
warpgroups) that hid the softmax in tc_wgmma; docs/tensor-core-notes.md has the runs.
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.common import build_wgmma, resolve_wgmma, supports_wgmma


def _supports(problem, warpgroups, Bc, stages):
    return supports_wgmma(problem, warpgroups, Bc, stages, min_stages=3)


@register_phase(
    name="tc_wgmma_overlap", order=24,
    title="Tensor cores: wgmma with the next tile's Q·Kᵀ in flight during the softmax",
    parent="tc_wgmma",
    requires_cc="sm_90a",
    description="""
        tc_wgmma with FlashAttention-3's intra-warpgroup pipelining: the wgmma for the next
        tile's scores is issued before this tile's softmax and P·V, and one wait_group
        retires both; a second score set in registers, stages >= 3.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), intra-warpgroup overlap of softmax and GEMMs",
    planned_speedup=170.0,
    space={"warpgroups": [1, 2, 3], "Bc": [32, 64, 128], "stages": [2, 3, 4]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 1, "Bc": 16, "stages": 3},
    supports=_supports,
    resolve=resolve_wgmma,
)
def tc_wgmma_overlap(problem, warpgroups=2, Bc=64, stages=3):
    """tc_wgmma's kernel with ``overlap=True``."""
    return build_wgmma(problem, warpgroups, Bc, stages, overlap=True)
