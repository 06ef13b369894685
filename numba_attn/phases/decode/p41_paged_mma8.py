"""Phase 41 — ``paged_mma8``: an 8-bit paged cache's codes from the loads straight into tensor-core fragments.

Change against ``paged_split_k``: the warp step. Its 16 keys × (at most 8) query rows are two ``mma.m16n8k16``
problems (keys on M); lane (g, t)'s 16-byte loads of fp8 or int8 codes become the A fragments by ``cvt``/``prmt``,
with no float32 per element and no shared memory (``frag8.py``). Options: ``step_heads`` (a step's rows are
tokens × adjacent KV heads), ``stages`` (a ``cp.async`` ring per warp), ``prefetch`` (L2, steps ahead).

Prediction: an 8-bit cache ~1.7–1.9x SDPA on the fp16 cache (half the bytes, as fast per byte).
Verdict: fp8 GQA B8 H32/8kv KV 32k 0.149 ms, 2.2x paged_mma; 1.67–1.76x SDPA on the fp16 cache (the 1.7x target
missed for int8/token) (H200, CUPTI) [results/paged-8bit-mma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba import float32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.ptx_loads import smem_reason
from numba_attn.phases.decode.frag8 import make_frag8_kernel
from numba_attn.phases.decode.launch import split_registration
from numba_attn.phases.decode.paged import PAGED_KV8, PAGED_TOKEN_SCALE, check_paged_problem, paged_launch
from numba_attn.phases.decode.rules import resolve_splits, ring_bytes
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for


def mma8_reason(problem):
    """Why the fragment kernel cannot run ``problem`` (None when it can)."""
    if not getattr(problem, "kv_dtype", ""):
        return "paged_mma8: 8-bit caches only (fp8 e4m3 or int8; paged_split_k reads 16-bit ones)"
    if problem.dtype != "float16":
        return "paged_mma8: float16 queries only (the fragments are f16)"
    if problem.head_dim % 64:
        return f"paged_mma8: head_dim {problem.head_dim} is not a multiple of 64"
    if problem.group * problem.q_len > 8:
        return f"paged_mma8: {problem.group * problem.q_len} query rows per KV head > 8 (the mma's N)"
    return None


def resolve_step_heads(problem, step_heads=0, prefetch=0):
    """``step_heads`` resolved: 0 (automatic) is 2 for one query row per KV head, an even number of KV heads and no
    prefetch (measured 1.2-2.5 % faster than 1 on every 8-bit cache at B8 H32 KV 16k and 32k, H200), else 1."""
    if step_heads:
        return step_heads
    return 2 if problem.group * problem.q_len == 1 and problem.kv_heads % 2 == 0 and not prefetch else 1


def merge_smem(problem, warps, step_heads):
    """Static shared memory of the block merge: m, l and O of every warp's rows (+ the combine's flag)."""
    return warps * problem.group * problem.q_len * step_heads * (problem.head_dim + 2) * 4 + 16


def _options_reason(problem, step_heads, stages, prefetch):
    """Why ``step_heads``, ``stages`` or ``prefetch`` cannot run ``problem`` (None when they can)."""
    if not 0 <= prefetch <= 4:
        return f"prefetch={prefetch} out of range 0..4 (warp steps ahead)"
    if step_heads != 1:
        if step_heads not in (2, 4, 8):
            return f"step_heads={step_heads} not 1, 2, 4 or 8"
        if problem.group * problem.q_len != 1:
            return "step_heads: one query row per KV head only (the mma's columns hold the heads)"
        if problem.kv_heads % step_heads:
            return f"step_heads={step_heads} does not divide kv_heads ({problem.kv_heads})"
        if prefetch:
            return "step_heads: not with prefetch"
    if stages:
        if stages not in (2, 3, 4):
            return f"stages={stages} not 0 (off), 2, 3 or 4"
        if prefetch:
            return "stages: not with prefetch (the ring already has the next steps in flight)"
        if problem.page_size % (16 // step_heads):
            return f"stages: page size {problem.page_size} does not hold whole warp steps ({16 // step_heads} tokens)"
        if problem.kv_dtype == "float8_e4m3" and problem.kv_scale == "token":
            return "stages: per-token scales with int8 codes only (fp8 takes a tensor or head scale)"
    return None


def check_paged_mma8(problem, warps=8, step_heads=0, stages=0, prefetch=0, **_):
    reason = check_paged_problem(problem) or mma8_reason(problem)
    if reason:
        return reason
    if not 1 <= warps <= 32:
        return f"warps={warps} out of range 1..32"
    step_heads = resolve_step_heads(problem, step_heads, prefetch)
    reason = _options_reason(problem, step_heads, stages, prefetch)
    if reason:
        return reason
    smem = merge_smem(problem, warps, step_heads)
    if smem > 48 * 1024:
        return f"block merge needs {smem} B of shared memory (> 48 KiB); lower warps"
    return smem_reason(ring_bytes(problem.head_dim, warps, stages) + smem) if stages else None


def _resolve(problem, warps, splits, blocks_per_sm, min_keys, step_heads=0, prefetch=0, **params):
    """``step_heads`` and the split count (a warp step: 16 / step_heads tokens of step_heads KV heads)."""
    hw = resolve_step_heads(problem, step_heads, prefetch)
    S = resolve_splits(problem, warps * 16 // hw, problem.group * problem.q_len, blocks_per_sm, min_keys, splits,
                       heads=hw)
    return {**params, "warps": warps, "splits": S, "blocks_per_sm": blocks_per_sm, "min_keys": min_keys,
            "step_heads": hw, "prefetch": prefetch}


@register_phase(
    name="paged_mma8", order=41,
    title="Paged decode: 8-bit codes from the loads straight into mma.sync fragments (fp8, int8 caches)",
    parent="paged_split_k", kind="decode",
    description="""
        paged_split_k's warp step on tensor cores for an 8-bit paged cache (fp8 e4m3 or int8,
        per-tensor, per-head or per-token scale): a step's 16 keys against the KV head's (at
        most 8) query rows are two mma.m16n8k16 problems, the keys on M; the 16-byte loads'
        codes become the A fragments by cvt/prmt in registers (int8 as f16 1152 + c, the bias
        taken out of the scores' start), the scales applied in fp32. Options: step_heads (a
        step's rows are tokens of adjacent KV heads), stages (a cp.async ring per warp),
        prefetch (L2, warp steps ahead). float16 queries, head_dim a multiple of 64.
        Tolerance: float16's 4e-3 against the float64 reference on the dequantized cache.
    """,
    lineage="vLLM PagedAttention (Kwon et al. 2023); FlashInfer GQA decode on tensor cores; "
            "Flash-Decoding split-K",
    planned_speedup=60.0,
    dtypes=("float16",),
    requires_cc=(8, 0),  # mma.sync
    # prefetch (1, 2) was measured slower on every 8-bit target (H200, H100): not a candidate; stages 3 (one
    # block per SM) 2.0-3.3 % faster than the direct loads on an H100, not yet run on an H200: a candidate,
    # off by default
    **split_registration(check_paged_mma8, _resolve,
                         {"warps": [4, 8], "splits": [0, 8, 16, 32, 64], "blocks_per_sm": [1, 2, 4],
                          "step_heads": [1, 2, 4, 8], "stages": [0, 3]}, layout="paged"),
)
def paged_mma8(problem, warps=8, splits=0, blocks_per_sm=2, min_keys=256, fuse_max=64, step_heads=0, stages=0,
               prefetch=0):
    rows = problem.group * problem.q_len  # one row block per KV head (reported as 2·HW lanes per key, 1 key)
    fused = splits * rows * step_heads <= fuse_max
    kern = make_frag8_kernel(problem.head_dim, warps, problem.q_len, problem.group, problem.causal, fused,
                             blocks_per_sm, problem.page_size, PAGED_KV8[problem.kv_dtype],
                             bool(PAGED_TOKEN_SCALE[problem.kv_scale]), PREFETCH=prefetch, STEP_HEADS=step_heads,
                             STAGES=stages, stage=stages_for(problem))
    notes = f", combine {'fused' if fused else 'kernel'}, 8-bit codes into mma fragments"
    notes += f", L2 prefetch {prefetch} step{'s' if prefetch > 1 else ''} ahead" if prefetch else ""
    notes += f", {step_heads} KV heads per warp step" if step_heads > 1 else ""
    notes += f", cp.async ring of {stages} steps per warp" if stages else ""
    return paged_launch(problem, kern, float32(problem.sm_scale * float(LOG2E)), warps, 2 * step_heads, rows, 1,
                        splits, fused, notes=notes, heads=step_heads,
                        dyn_bytes=ring_bytes(problem.head_dim, warps, stages) if stages else 0,
                        static_bytes=merge_smem(problem, warps, step_heads))
