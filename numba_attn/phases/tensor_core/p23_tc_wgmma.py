"""Phase 23 — ``tc_wgmma``: Hopper warpgroup MMA, B operands straight from shared memory.

Change against ``tc_pipelined`` — the cp.async ring of K/V tiles, the online
softmax on the accumulator fragments and P kept in registers are the same;
what changes is the instruction that multiplies:

* **wgmma instead of mma.sync.** The four warps of a warpgroup (64 query
  rows, 16 per warp as before) issue ``wgmma.mma_async.m64nNk16`` together:
  S = Q·Kᵀ is ``D/16`` of them with N = Bc, O += P·V is ``Bc/16`` with N = D
  (``numba_attn.gpu.wgmma``). Q and P stay A operands in registers (the same
  fragments as mma.sync's); K and V are read by the tensor cores from shared
  memory through a matrix descriptor — no ``ldmatrix``, no B fragments in
  registers. On sm_90 mma.sync runs at about half of the tensor cores' rate
  (the measured mma.sync ceiling on an H200 is ~540 TFLOP/s f16, while SDPA's
  Hopper kernels run at ~640); wgmma is the instruction those kernels use.
* **Tiles in the hardware's swizzled layout.** K/V tiles are stored as
  64-column blocks of 128-byte rows with the 16-byte chunks XOR-swizzled by
  row (the descriptor's 128-byte swizzle mode; 64/32-byte modes for D = 32/16).
  One layout serves as the K-major B operand of Q·Kᵀ (K) and as the MN-major,
  transposed B operand of P·V (V), so the copy code is the same for both.
  The ring starts at a 1024-byte aligned shared address (the kernel pads its
  dynamic shared memory to it).
* **Warpgroup-uniform control.** wgmma is collective over 128 threads: the
  causal tile skip is decided per warpgroup (64 rows), not per warp.

Head dims: every multiple of 8 up to 256. Tiles other than 16, 32 or whole
64-column blocks are padded to the next (D=40 → 64 columns, 80/96/112 → 128,
160 → 192, ``gpu.wgmma.padded_columns``); Q·Kᵀ takes D rounded up to 16 (a
zero-filled chunk, Q's extra words zero), P·V has N = D: the padding is never
read into O nor written out.

Each call issues its k-steps, commits and waits (``wgmma.wait_group 0``), so
a warpgroup does not yet overlap its softmax with its next product
(FlashAttention-3's intra-warpgroup pipelining and ping-pong scheduling are
further steps); the overlap comes from the other warpgroups of the SM.

Prediction (written before measuring): the tensor-core time per tile halves
and the 64 ldmatrix per warp and tile disappear; the softmax, unchanged,
becomes the larger part. B1 H32 N4096 fp16: D=128 from 0.96 ms (286 TFLOP/s,
0.45× SDPA) to ~0.6–0.7 ms (390–460 TFLOP/s, 0.6–0.7× SDPA); D=64 from ~0.55
to ~0.4 ms.

Verdict: 0.662 ms at B1 H32 N4096 D128 fp16 (H200), 1.44x tc_pipelined; 0.391 ms at D64, 1.39x [results/tensor-core-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, resolve_wgmma, supports_wgmma


def _supports(problem, warpgroups, Bc, stages):
    return supports_wgmma(problem, warpgroups, Bc, stages, min_stages=2)


@register_phase(
    name="tc_wgmma", order=23, title="Tensor cores: Hopper wgmma, K/V straight from swizzled shared memory",
    parent="tc_pipelined",
    requires_cc="sm_90a",
    description="""
        tc_pipelined's cp.async ring and on-fragment softmax, multiplied with Hopper's
        warpgroup MMA: each warpgroup (4 warps, 64 query rows) issues wgmma.mma_async
        m64nNk16 with Q / P as register A operands and K / V read by the tensor cores
        from shared memory through matrix descriptors (128-byte swizzled tiles, V as a
        transposed MN-major operand): no ldmatrix, no B fragments in registers.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 GMMA: wgmma with "
            "shared-memory descriptors, register-sourced P",
    planned_speedup=150.0,
    space={"warpgroups": [0, 1, 2, 3], "Bc": [32, 64, 128], "stages": [2, 3, 4]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 1, "Bc": 16, "stages": 2},
    supports=_supports,
    resolve=resolve_wgmma,
)
def tc_wgmma(problem, warpgroups=0, Bc=64, stages=2):
    """The wgmma kernel (:mod:`.kernel`): the cp.async ring, each product waited for at once
    (:func:`.consumer.plain_mainloop`)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="cp_async")
