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

import numpy as np
from numba import float32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.pdl import launch_after, pdl_available, uses_griddepcontrol
from numba_attn.gpu.ptx_loads import launch_dynamic
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.common import (FIXED_COMBINE_MAX, PDL_MODES, check_alignment, check_mma,
                                             make_mma_kernel, mma_smem_bytes, resolve_mma, split_workspace,
                                             zeroed_counters)
from numba_attn.phases.registry import Launch, register_phase


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
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float16",),
    sim_params={"warps": 2, "Bc": 16, "stages": 2, "splits": 3},
    supports=check_mma,
    resolve=resolve_mma,
)
def decode_mma(problem, warps=4, Bc=16, stages=3, splits=0, blocks_per_sm=2, min_keys=2048, fuse_max=0, pdl=3,
               l2_prefetch=False, even=False, fixed_combine=True):
    B, Hkv, Nq, Nk, D = problem.batch, problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    S, chunk = split_plan(B * Hkv, Nk, warps * Bc, sm_count(), blocks_per_sm, min_keys, splits)
    final = S == 1
    fused = S * G * Nq <= fuse_max
    dependent = bool(pdl) and not final and not fused and uses_griddepcontrol()
    if even:
        chunk = -(-Nk // Bc)  # tiles, spread evenly over the splits by the kernel
    kern = make_mma_kernel(D, warps, Bc, stages, Nq, G, problem.causal, final, fused, int(pdl) if dependent else 0,
                           bool(l2_prefetch), bool(even))
    sl2 = float32(problem.sm_scale * float(LOG2E))
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv)
    nbytes = mma_smem_bytes(D, warps, Bc, stages)
    part_o, part_lse = split_workspace(S, B * problem.heads * Nq, D)
    kernels = [kern]
    if not final and not fused:
        combine = make_combine_kernel(Nq, dependent, S if fixed_combine and S <= FIXED_COMBINE_MAX else 0)
        kernels.append(combine)
    counters = zeroed_counters(B * Hkv)
    views = {}
    opted = []

    def run(q, k, v, o, stream=0):
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            check_alignment(k, v)
            if len(views) >= 8:
                views.clear()
            hit = views[key] = ((q, k, v, o), view_as(q, np.uint32))
        args = (hit[1], k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, chunk, S)
        if opted:
            kern[grid, warps * WARP_SIZE, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, warps * WARP_SIZE, stream, nbytes, *args)
            opted.append(True)
        if dependent:
            launch_after(combine, B * problem.heads * Nq, D, stream, 0, part_o, part_lse, o, S)
        elif not final and not fused:
            combine[B * problem.heads * Nq, D, stream](part_o, part_lse, o, S)

    size = f"{chunk // S}-{-(-chunk // S)} tiles" if even else f"{chunk} keys"
    how = "-" if final else ("fused" if fused else "kernel")
    if not final and not fused and S <= FIXED_COMBINE_MAX and fixed_combine:
        how += f" (compiled for {S} splits)"
    if dependent and pdl_available() is None:
        how += f", dependent launch ({PDL_MODES[int(pdl)]})"
    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {size}, {warps} warps × {Bc}-key tiles, {stages} stages, combine {how}")
