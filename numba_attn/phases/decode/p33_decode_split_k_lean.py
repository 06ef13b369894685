"""Phase 33 — ``decode_split_k_lean``: fewer instructions per key in the decode loop.

Change against ``decode_split_k_fused``: the same blocks, splits and loads;
the work between the loads is cut, because with several query rows per block
(a GQA group of 4) the loop was issue-bound, not memory-bound. Offline SASS
of the parent's loop for B=1, 8 KV heads, D=128, fp16 (4 rows, 16 lanes per
key, 2 keys per lane group): 395 instructions per warp step of 4 keys, of
which 128 FFMA and 32 HADD2 (f16→f32) are the dot products and P·V themselves; the rest: 32 SHFL + 32 FADD (one 4-stage
butterfly for each of the 8 scores), 12 MUFU + 12 FMUL (exp), 32 FMUL (the
rescale of the 4 × 8 accumulators at every step), index arithmetic. Per SM
that is ~25 µs of issue at 1.98 GHz for the 1986 keys it streams at B=1 —
close to the 29 µs memory floor, so loads and arithmetic do not overlap.

* Scores: a lane's 8 partial dot products are summed over the 16 lanes of
  its group by a reduce-scatter (each xor stage sends half of the values it
  still holds and keeps the other half: 4 + 2 + 1 shuffles, then one plain
  stage) and one all-gather (8 indexed shuffles): 16 shuffles and 8 adds
  instead of 32 and 32 (``score_plan``; a lane's values are padded to a power
  of two; with fewer lanes than values the lane keeps several).
* Scores in base 2: ``log2(e)`` is folded into the query scale, so each
  exponential is one ``ex2.approx`` (``math.exp2``) without a multiply; the
  log-sum-exp written for the combine is converted back (``m · ln 2 + log l``).
* Lazy rescale: the accumulators of a row are multiplied by
  ``exp2(m_old − m_new)`` only when the row's maximum moved (a per-lane
  branch; with random scores the running maximum rarely moves after the
  first steps), instead of at every step.
* Combine placement: the last-block combine of the parent is kept when it is
  small (``S × rows ≤ fuse_max``); otherwise (GQA at B=1: 66 splits × 4 rows,
  which the parent's last block merged alone on one SM) the combine is the
  second kernel of ``decode_split_k``. Both use the two-pass combine of
  ``combine_splits`` (maximum first, then the weighted sum, 8 splits' loads
  in flight), which replaced the one-pass merge that waited on each split.

bfloat16 storage (compile-time): K and V read as 16-byte loads of 32-bit
words, each split into two floats by shifts; the output rounded to bf16.

Prediction: GQA (8 KV heads, 32k, fp16) B=8 326 → ~280 µs (−15%, the
loop's issue time); B=1 75 → ~45 µs (the combine from ~20 to ~3 µs, the loop
−15%); MHA (one row per block: 2 scores per step, little to save) unchanged
within 2%.
Verdict: 0.0495 ms at B1 H32/8kv Nq1 Nk32768 D128 fp16 (H200), short of the ~45 µs predicted: the loop was not issue-bound [results/decode-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba import float32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.phases.decode.common import check_split, make_lean_kernel, resolve_split, split_launch, vector_width
from numba_attn.phases.registry import register_phase


@register_phase(
    name="decode_split_k_lean", order=33, title="Decode: split-K with a lean inner loop (reduce-scatter scores, exp2, lazy rescale)",
    parent="decode_split_k_fused", kind="decode",
    description="""
        decode_split_k_fused with fewer instructions per key: the partial dot products
        of all rows and keys of a step are summed over the lanes of a group with a
        reduce-scatter and one all-gather instead of one butterfly per score; scores in
        base 2 (log2 e folded into the query scale, exp2); the accumulators are
        rescaled only when a row's maximum moved; the combine runs in the last block
        when it is small (S x rows <= fuse_max) and in a second kernel otherwise.
    """,
    lineage="Flash-Decoding (Dao et al. 2023); reduce-scatter/all-gather all-reduce (Rabenseifner); "
            "FlashAttention-2 exp2 scaling; lazy rescaling (FlashAttention-3 / FlashInfer)",
    planned_speedup=45.0,
    space={"warps": [4, 8], "keys": [0, 1, 2, 4], "splits": [0, 8, 16, 32, 64], "blocks_per_sm": [1, 2, 4]},
    launch_params=("splits",),  # the split count is a launch argument: its candidates mostly share kernels
    dtypes=("float32", "float16", "bfloat16"),
    sim_params={"warps": 2, "splits": 3},
    supports=check_split,
    resolve=resolve_split,
)
def decode_split_k_lean(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256,
                        fuse_max=64):
    final = splits == 1
    fused = splits * rows <= fuse_max
    kern = make_lean_kernel(problem.head_dim, vector_width(problem.dtype), lanes, keys, warps, rows, problem.q_len,
                            problem.group, problem.causal, final, fused, blocks_per_sm,
                            BF16=problem.dtype == "bfloat16")
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    return split_launch(problem, kern, scale, warps, lanes, rows, keys, splits, counters=True, combine=not fused,
                        notes=f", combine {'-' if final else ('fused' if fused else 'kernel')}")
