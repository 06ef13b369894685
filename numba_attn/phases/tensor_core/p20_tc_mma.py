"""Phase 20 — ``tc_mma``: QKᵀ and PV on the tensor cores (``mma.sync``), FlashAttention-2 style.

Change against ``smem_kv`` (the best CUDA-core phase present when this was
written; the roadmap's later CUDA-core phases are not its parent): the two
matrix products run as ``mma.sync.m16n8k16`` (f16 or bf16 inputs, f32
accumulation) instead of scalar FMAs, and the work is split the FlashAttention-2
way — one warp owns 16 query rows and keeps everything about them in
registers:

* Q: the warp's 16×D slice as A fragments (D/16 k-steps × 4 packed registers),
  loaded once with 32-bit loads straight from the ``uint32`` view of q;
* S = Q·Kᵀ for a tile of Bc keys: Bc/8 accumulator fragments (4 f32 each);
  the B fragments are 32-bit words of the K tile in shared memory (a row of K
  is a column of Kᵀ, and two consecutive d's are one word);
* online softmax on the accumulator fragments: a lane holds 2 scores of each
  of its rows g and g+8 per n-tile; the row max is a max over the lane's
  values and a ``quad_max`` over the 4 lanes of the row; the row sum stays
  per lane until the end (one ``quad_sum``), since the rescale factor is the
  same on the 4 lanes;
* P never leaves registers: the C fragments of two neighbouring n-tiles are
  exactly the A fragment of one k-step of P·V, so P is rounded to f16/bf16
  and packed in place (``pack_f16x2``);
* V's B fragments need two keys of one column: two 16-bit shared loads packed
  into one register (``pack_b16x2``); ``tc_pipelined`` replaces these by
  ``ldmatrix.trans``.

K/V tiles are staged as in ``smem_kv`` (whole block, two barriers per tile)
but with 128-bit loads and stores, rows padded so that the fragment reads are
free of bank conflicts (K: D/2+4 words, V: D+8 halves). The ``warps`` of a
block (Br = 16·warps query rows) share each tile. Scores are kept raw; the
exponent is ``exp2((s - m)·scale·log2 e)``; masked scores are a finite
``-1e30`` (the kernels compile with fastmath, which assumes no infinities).

Head dims: every multiple of 8 up to 256; an odd multiple of 8 runs as the next
multiple of 16 (Q's and K's extra 8 columns zero, those of O not computed), and
Bc=0 picks 32 keys above head_dim 184 (two 64-key tiles would exceed 48 KiB).

Prediction (written before measuring): the CUDA-core phases are bound by
FFMA issue (~50 TFLOP/s fp32 peak, realistically 10–20); mma.sync at
m16n8k16 reaches ~380 TFLOP/s in a register loop on an H200. With the staging
barriers, scalar shared-memory fragment loads (two 16-bit loads per V
register) and the softmax between the two products, expect 100–150 TFLOP/s at
D=64/128, N=4096 fp16 — about 10× ``smem_kv`` and 10–20× over ``naive``.

Verdict: 0.844 ms at B1 H32 N4096 D64 fp16 (H200), 163 TFLOP/s, in the predicted range; 2.75 ms at D128, 100 TFLOP/s, below it (the shared-memory fragment loads set the pace) [results/tensor-core-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.common import launch_mma, make_mma_kernel, resolve_mma, supports_mma


@register_phase(
    name="tc_mma", order=20, title="Tensor cores: mma.sync m16n8k16, fragments in registers",
    parent="smem_kv",
    description="""
        Q·Kᵀ and P·V as mma.sync.m16n8k16 (f16/bf16 in, f32 accumulate). A warp owns
        16 query rows: Q fragments, score and output accumulators stay in registers;
        the online softmax runs on the accumulator fragments (quad shuffles for the
        row max, row sums reduced once at the end); P is rounded and packed in
        registers into the A fragments of P·V. K/V tiles are staged in padded shared
        memory by the whole block with 128-bit accesses; fragments are read with
        32-bit (K) and 2×16-bit (V) shared loads.
    """,
    lineage="FlashAttention-2 (Dao 2023): warps split Q, P kept in registers; "
            "PTX mma.sync m16n8k16 fragment layouts",
    planned_speedup=60.0,
    space={"warps": [4, 8], "Bc": [0, 32, 64]},
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warps": 2, "Bc": 16},
    supports=supports_mma,
    resolve=resolve_mma,
)
def tc_mma(problem, warps=8, Bc=0):
    kern = make_mma_kernel(problem.head_dim, warps, Bc, problem.causal, problem.dtype == "bfloat16")
    return launch_mma(problem, kern, 16 * warps, warps)
