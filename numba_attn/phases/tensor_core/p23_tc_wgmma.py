"""Phase 23 — ``tc_wgmma``: Hopper warpgroup MMA, B operands straight from shared memory.

Change against ``tc_pipelined``: a warpgroup (4 warps, 64 query rows) issues ``wgmma.mma_async.m64nNk16``:
S = Q·Kᵀ is D/16 of them (N = Bc), O += P·V is Bc/16 (N = D). Q and P stay register A operands; K and V are read
by the tensor cores from the swizzled ring through matrix descriptors (V as the transposed operand). Each product
is waited for at once (:func:`.consumer.plain_mainloop`). The kernel: :mod:`.kernel`.

Prediction: B1 H32 N4096 fp16 D=128 from 0.96 to ~0.6–0.7 ms (0.6–0.7× SDPA); D=64 from ~0.55 to ~0.4 ms.

Verdict: 0.662 ms at B1 H32 N4096 D128 fp16 (H200), 1.44x tc_pipelined; 0.391 ms at D64, 1.39x.
[results/tensor-core-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, supports_cp_async, wgmma_registration


@register_phase(
    name="tc_wgmma", order=23, title="Tensor cores: Hopper wgmma, K/V straight from swizzled shared memory",
    parent="tc_pipelined",
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
    **wgmma_registration(supports_cp_async),
)
def tc_wgmma(problem, warpgroups=0, Bc=64, stages=2):
    """The wgmma kernel (:mod:`.kernel`): the cp.async ring, each product waited for at once
    (:func:`.consumer.plain_mainloop`)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="cp_async")
