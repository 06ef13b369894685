"""Phase 37 — ``ws_overlap``: the warp-specialised kernel with the next tile's Q·Kᵀ in flight during this tile's softmax.

Change against ``warp_specialized_tc``: each consumer warpgroup runs
``tc_wgmma_overlap``'s schedule (FlashAttention-3's intra-warpgroup
overlap) instead of waiting for every product at once. Per K/V tile j:

* wait for tile j+1 on its full mbarrier and issue S_{j+1} = Q·K_{j+1}ᵀ
  (no wait) into a second set of score registers;
* mask and online softmax of S_j, O += P_j·V_j issued (no wait);
* one ``wgmma.wait_group 0`` retires both products; tile j's stage is
  released on its empty mbarrier.

The loop is unrolled by two: the two score sets swap roles at compile time
(tile j's scores in one set, tile j+1's in the other), so no scores are
copied. S_{j+1} is issued on every tile, even past the last tile or past
the warpgroup's keys (its scores then unused). Skipping it behind a branch
leaves old values in the set on one path, and ptxas then serializes every
wgmma of the loop. The ring stage and the mbarrier phase parity are loop
counters, not ``j % stages`` and ``j // stages``.

The ring must hold tile j+1 while tile j is read: ``stages`` ≥ 3 (the
producer is unchanged). Why this can pay here when it did not in
``tc_wgmma_overlap`` (1.24x slower there): the second score set (Bc/2 = 32
registers at Bc=64) cost that kernel its second block per SM, the occupancy
that hid the softmax. A warp-specialised block is alone on its SM anyway,
and its consumers have 232 registers after ``setmaxnreg.inc`` (offline, LTO
link: 168 at entry, no spill, no serialized wgmma at D=64 and 128 with
Bc=64; Bc=128 spills and serializes the wgmma, so it is refused).

Head dims up to 128 (two consumer warpgroups), fp16 and bf16, causal.

``uniform`` (on by default here since it was timed on a GPU; off in the
parent, where it did not pay): ``warp_specialized_tc``'s option, the warp
index known warp-uniform to ptxas: 417 static SASS instructions a K/V tile
instead of 472 at D128 fp16, 376 instead of 412 at D64, no spills (offline;
docs/tensor-core-notes.md, "Uniform warp index").

Prediction (written before measuring): +5-10% against warp_specialized_tc at
B1 H32 N4096 D128 fp16 (0.521 ms → ~0.48 ms, ~0.95x SDPA), the same at D64;
refuted below +2%.

Verdict: refuted, 0.725 ms at B1 H32 N4096 D128 fp16 (H200, CUPTI), 1.37x warp_specialized_tc's time in the same run (1.31-1.37x on all five problems of the run); correct on the GPU (float64 check, GPU tests, compute-sanitizer); numba's LTO link keeps setmaxnreg and the SASS has one wgmma wait per tile (no serialization); measured reason (Nsight Compute): 39% more instructions executed, all integer and copy work on the FMA/ALU pipes (the steady loop: 597 SASS instructions a tile against 454; a three-stage ring's modulo arithmetic, the score-set copy, the next tile's conditions), so the tensor pipe falls from 55% to 41% busy (docs/tensor-core-notes.md) [results/tensor-core-tma-nvidia-h200.jsonl]
Verdict (ring stage and phase carried across tiles, the loop unrolled by two with the score sets swapped: 472 SASS instructions a tile): still refuted, now near its parent: 0.5929 ms at B1 H32 N4096 D128 fp16, 1.03x warp_specialized_tc's time in the same run; causal B2 H16 N8192 1.338 ms (1.11x), D64 B4 H32 N2048 0.4581 ms (1.01x), bf16 0.5737 ms (1.06x) (H200, CUPTI) [results/tensor-core-tma-nvidia-h200.jsonl]
Verdict (``uniform`` on, since then the default: 417 SASS instructions a tile): 0.5684 ms at B1 H32 N4096 D128 fp16, causal B2 H16 N8192 1.1714 ms, D64 B4 H32 N2048 0.4069 ms, against 0.6412, 1.2663 and 0.4589 ms with it off in the same run (1.13x, 1.08x, 1.13x); against warp_specialized_tc in that run 1.03x its time at D128, 1.05x causal, 0.90x at D64 (the fastest phase there, 0.78x SDPA); timed as the out-of-tree copy ws_overlap_uniform (experiments/2026-11-23-hopper-tma/uniform_phases.py) (H200, CUPTI) [results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_overlap_uniform]
Verdict (the default with uniform on, the issue's problems in one run): 0.5669 ms at B1 H32 N4096 D128 fp16 (0.83x SDPA), bf16 0.5496 ms (0.84x), B1 H16 N16384 4.2852 ms (0.86x), causal B2 H16 N8192 1.1720 ms (0.90x), causal B1 H16 N16384 2.2475 ms (0.90x), causal bf16 B2 H16 N8192 1.1159 ms (0.92x), D64 B4 H32 N2048 0.4094 ms (0.77x); faster than warp_specialized_tc in that run at N16384 non-causal, bf16 and D64, slower causal fp16 (H200, CUPTI) [results/tensor-core-tma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, resolve_two_consumers, two_consumers_reason
from numba_attn.phases.tensor_core.p24_tc_wgmma_overlap import overlap_mainloop

MAX_BC = 64  # Bc=128: the two score sets and O need more than 232 registers (spills, serialized wgmma)


def _supports(problem, warpgroups, Bc, stages, **_):
    if Bc > MAX_BC:
        return (f"Bc={Bc}: the second score set (Bc/2 registers) does not fit above Bc={MAX_BC} "
                "(spills, serialized wgmma)")
    return two_consumers_reason(problem, warpgroups, Bc, stages, "the register split is made for", min_stages=3)


@register_phase(
    name="ws_overlap", order=37,
    title="Tensor cores: warp specialisation with the next Q·Kᵀ issued before this tile's softmax",
    parent="warp_specialized_tc",
    requires_cc="sm_90a",
    description="""
        warp_specialized_tc whose consumer warpgroups issue S_{j+1} = Q·K_{j+1}ᵀ before the
        softmax of tile j and retire it with P_j·V_j in one wgmma wait (FlashAttention-3's
        intra-warpgroup overlap), with the registers setmaxnreg gives the consumers; three
        ring stages.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), §3.2 intra-warpgroup overlapping of GEMMs and softmax",
    planned_speedup=170.0,  # warp_specialized_tc's 160 and the predicted +5-10%
    space={"warpgroups": [2], "Bc": [64], "stages": [3, 4], "uniform": [False, True]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 2, "Bc": 16, "stages": 3},
    supports=_supports,
    resolve=resolve_two_consumers,
)
def ws_overlap(problem, warpgroups=0, Bc=64, stages=3, uniform=True):
    """warp_specialized_tc's producer with tc_wgmma_overlap's mainloop; ``uniform`` as there (on by default here)."""
    return build_wgmma(problem, warpgroups, Bc, stages, overlap_mainloop, loads="ws", uniform=uniform)
