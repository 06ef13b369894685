"""Phase 34 — ``decode_mma``: the query rows of a KV head as one tensor-core tile.

Change against ``decode_split_k_lean``: the same split-K over blocks, the same
two-pass combine; what changes is how a block computes its split when
several query rows read one KV head (a GQA group × q_len, up to 16 rows):

* **Rows as an m16 tile.** The rows are the A operand of ``mma.sync
  m16n8k16`` (f16 in, f32 accumulate), padded with zero rows to 16. Scores
  for 16 keys are 16 mma over D=128 instead of ``rows × 16 keys × 128`` FMA
  on the CUDA cores, and P·V another 16 — the arithmetic of 4 rows per key,
  which kept ``decode_split_k_lean``'s loop at ~2.8 TB/s for GQA where one
  row per block streams at ~4.4 TB/s, moves to the tensor cores. Scores and
  P stay in registers (P is the A fragment of P·V, as in ``tc_pipelined``);
  the online softmax runs on the fragments (quad shuffles).
* **A cp.async ring per warp.** Each warp streams its own key tiles
  (``Bc`` keys, tiles w, w+W, … of the split) through ``stages`` swizzled
  shared buffers with ``cp.async``, so ``stages − 1`` tiles per warp are in
  flight while it computes (no register round trip, no block barrier in the
  loop: a warp waits for its own copies and ``syncwarp``s); K and V reach the
  fragments by ``ldmatrix`` (V transposed).
* **End of a split**: the warps merge their (m, l, O) through shared memory
  (the ring's space), as in ``decode_split_k``, and write the split's partial
  output and log-sum-exp; the splits are merged by the two-pass combine
  kernel (or, with ``fuse_max`` > 0 and ``S × rows ≤ fuse_max``, by the last
  block of a KV head, as in ``decode_split_k_lean``: measured slower here,
  so off by default).
* **The combine, cheaper**: it is
  compiled for the split count (``combine_splits_fixed``: all 2·S loads in
  flight at once, one L2 round trip), and on sm_90 it is a *programmatic
  dependent launch* (``numba_attn.gpu.pdl``): it is queued while the split kernel
  runs and waits in ``griddepcontrol.wait`` for it to complete, instead of
  being launched after it. ``pdl`` chooses when the split kernel lets it
  launch: 3 (default) when its blocks exit; 1 at their start and 2 after the
  loop measured slower (the combine's blocks then sit on the SMs for the
  whole split kernel).

Storage: float16 or bfloat16 (``mma.sync`` with bf16 inputs; P rounded to
bf16 for P·V), chosen at compile time; the fp32 accumulation is the same.

Head dims: every multiple of 8 up to 256, padded as in ``tc_pipelined``: shared
rows to a power of two (≤ 8) or a multiple of 8 chunks, so the swizzle stays a
permutation (D=40/48 → 64 columns, 80/96/112 → 128, 160 → 192); an odd multiple
of 8 as the next multiple of 16 (a zero-filled chunk); the padding is never
written out.

Prediction: GQA (8 KV heads, group 4) B=1 32k fp16 from 52 µs
(``decode_split_k_lean``) to ~35 µs (the split kernel memory-bound like MHA,
plus the ~8 µs combine), faster than SDPA's 40 µs; B=8 from 310 to ~250 µs.
For one row per block (MHA) 15 of the 16 tile rows are padding: no gain.
Verdict: 0.0386 ms at B1 H32/8kv Nq1 Nk32768 D128 fp16 (H200), 1.28x decode_split_k_lean [results/decode-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.decode.common import check_mma, mma_launch, resolve_mma
from numba_attn.phases.registry import register_phase


@register_phase(
    name="decode_mma", order=34, title="Decode: the KV head's query rows as a tensor-core tile (mma.sync)",
    parent="decode_split_k_lean", kind="decode",
    description="""
        Split-K decode where the query rows of a KV head (GQA group × q_len ≤ 16) are the
        A operand of mma.sync m16n8k16: scores and P·V on tensor cores, online softmax
        on the fragments, P in registers. Each warp streams its own key tiles through a
        cp.async ring (ldmatrix, V transposed); warps merge through shared memory, the
        splits in the two-pass combine kernel.
    """,
    lineage="FlashInfer / FlashDecoding++ GQA decode on tensor cores (query heads of a group "
            "as the M dimension); FlashAttention-2 fragments",
    planned_speedup=60.0,
    space={"warps": [2, 4, 8], "Bc": [16, 32], "stages": [2, 3, 4], "splits": [0, 8, 16, 32, 64]},
    launch_params=("splits",),  # the split count is a launch argument: its candidates mostly share kernels
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float16", "bfloat16"),
    sim_params={"warps": 2, "Bc": 16, "stages": 2, "splits": 3},
    supports=check_mma,
    resolve=resolve_mma,
)
def decode_mma(problem, warps=4, Bc=16, stages=3, splits=0, blocks_per_sm=2, min_keys=2048, fuse_max=0, pdl=3,
               l2_prefetch=False, even=False, fixed_combine=True):
    Nk = problem.kv_len
    return mma_launch(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
                      fixed_combine, keys=lambda layout: (Nk,))
