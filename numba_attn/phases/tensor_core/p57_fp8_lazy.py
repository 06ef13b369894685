"""Phase 57 — ``fp8_lazy``: fp8_overlap rescaling O only when a row's maximum moved.

Change against ``fp8_overlap`` (FlashAttention-4's conditional rescale, :func:`.fp8.fp8_softmax` with ``lazy``): a
row's running maximum moves only when a tile's exceeds it by more than 0.8 in base 2, so P = 2^8 · 2^(s − m) stays
under 2^8.8 ≈ 446, inside e4m3's 448; where no row of a warp moved, the warp skips O's rescale (64 multiplies a
thread and tile at D128) by one vote.

Why FP8, when ``lazy_rescale`` was refuted in fp16 (experiments/2026-11-28-lazy-rescale): there the tile waits on its
products; ``fp8_exp_fma``'s verdict put the FP8 tile's bound on the FP32 pipe, and O's rescale sits between the wait
for P·V and the next tile's products. ``fp8_ws``'s profile counted ~68 FMUL of ~530 instructions a warp and tile.

Prediction: 1.02-1.06× ``fp8_overlap``'s attention kernel at B1 H32 N8192 D128 (most tiles past the first few skip
the rescale; a warp rescales when any of its 16 rows moved), level at D64.

Verdict: confirmed at D128, refuted at D64 (H200, 2f2c524): N8192 D128 1.054× (fp16), 1.051× (e4m3 inputs: 1.29×
cuDNN fp16), 1.042× causal; D64 0.94×. Its error is higher (1.3e-2 → 1.5e-2 on e4m3 inputs: a row's largest P is
no longer 2^8, exact in e4m3), so it is not ``attention_fp8``'s default (experiments/2026-11-29-fp8-lazy).
[results/fp8-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.p42_fp8_ws import FP8_RING_OPTIONS, build_fp8_ws
from numba_attn.phases.tensor_core.p44_fp8_overlap import HEAD_UNITS, fp8_overlap_loop
from numba_attn.variants.stages import PLAIN


def lazy_loop(D: int, Bc: int, STAGES: int, WG: int, causal: bool, stage=PLAIN):
    """fp8_overlap's consumer loop (:func:`.p44_fp8_overlap.fp8_overlap_loop`) with the conditional rescale, as a
    mainloop factory of ``build_fp8_ws``."""
    return fp8_overlap_loop(D, Bc, STAGES, WG, causal, stage, HEAD_UNITS, 0, True)


lazy_loop.kernel_name = "fp8_lazy"


@register_phase(
    name="fp8_lazy", order=57, title="FP8 (e4m3): O rescaled only when a row's maximum moved",
    parent="fp8_overlap",
    description="""
        fp8_overlap with FlashAttention-4's conditional rescale: the running maximum moves only by more than
        0.8 in base 2 (P under 2^8.8, inside e4m3), and a warp skips O's rescale where none of its rows moved.
    """,
    lineage="FlashAttention-4 (Dao et al. 2025): the softmax rescale made conditional, threshold in log2 units",
    planned_speedup=365.0,  # fp8_overlap's 350 and a predicted ~1.04x
    **FP8_RING_OPTIONS,
)
def fp8_lazy(problem, warpgroups=0, Bc=0, stages=3, uniform=True):
    """fp8_ws's kernel running fp8_overlap's loop with the conditional rescale."""
    return build_fp8_ws(problem, warpgroups, Bc, stages, uniform, lazy_loop)
