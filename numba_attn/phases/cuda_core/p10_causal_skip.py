"""Phase 10 — ``causal_skip``: only the tiles that cross the diagonal are masked.

Change against ``register_blocked`` (the same kernel, ``common.make_register_blocked``,
with its compile-time option ``skip``): a tile is classified once per block;
one fully visible to every row of the block (its last key ≤ the first row's
limit and < kv_len) goes to the softmax without any comparison, one crossing
the diagonal is masked element by element as before. The causal grid is
walked heaviest-first (``heavy_first``): the long blocks start in the first wave.

Prediction: without causal ~1.03× register_blocked at N=4096 (the
compare/select per score is ~3 instructions per 2·D FMAs); with causal ~1.1×.

Verdict: 4.38 ms at B1 H32 N4096 D64 fp32 (H200), 0.98x register_blocked (no gain) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.phases.cuda_core.common import (geometry, make_register_blocked, register_blocked_reason,
                                                resolve_register_blocked, row_block_launch)
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import wants_lse
from numba_attn.variants.stages import stages_of


def _supports(problem, Br, Bc, TM, TN, maxreg, heavy_first):
    return register_blocked_reason(problem, Br, Bc, TM, TN)


@register_phase(
    name="causal_skip", order=10, title="Mask only the diagonal tiles",
    parent="register_blocked",
    description="""
        Tiles every row of the block sees entirely skip the per-score mask; only tiles
        that cross the causal diagonal or the end of the keys are masked, fully masked
        tiles are never visited, and causal grids run heaviest blocks first.
    """,
    lineage="Causal tile skipping of FlashAttention-2 (Dao 2023): masking only the "
            "diagonal blocks, longest blocks scheduled first",
    planned_speedup=65.0,
    space={"Br": [64, 128], "Bc": [16, 32, 64], "TM": [2, 4, 8], "TN": [0, 4, 8], "heavy_first": [0, 1]},
    sim_params={"Br": 32, "Bc": 16, "TM": 4, "TN": 4, "maxreg": 0, "heavy_first": 1},
    supports=_supports,
    resolve=resolve_register_blocked,
    variants=True,
    lse=True,
)
def causal_skip(problem, Br=128, Bc=32, TM=4, TN=0, maxreg=0, heavy_first=1):
    kern = make_register_blocked(problem.head_dim, Br, Bc, TM, TN, maxreg, problem.causal, wants_lse(problem),
                                 skip=True, heavy_first=bool(heavy_first), stage=stages_of(problem.variant))
    _, NT, _, smem = geometry(problem.head_dim, Br, Bc, TM, TN)
    return row_block_launch(kern, problem, Br, NT, smem * 4, scale=problem.sm_scale * LOG2E, Bc=Bc)
