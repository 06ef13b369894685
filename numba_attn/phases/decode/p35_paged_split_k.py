"""Phase 35 — ``paged_split_k``: split-K decode over a paged KV cache.

Change against ``decode_split_k_lean``: only how a key row is found. Key ``j`` of sequence ``b`` is row ``j % P``
of page ``block_table[b, j // P]`` of the (num_blocks, P, Hkv, D) cache (``paged.py``; one page index per warp
step when a page holds whole steps). Each sequence has its own length; unequal lengths get splits sized from the
batch's total keys; a length-0 sequence gives zeros. The same kernel reads fp8 e4m3 or int8 caches with their
scales (``kv8.py``); ``wide``: 16 codes per lane per load. ``mma`` (8-bit caches, the default there): the codes
go from the loads straight into tensor-core fragments (``frag8.py``), with ``step_heads``, ``stages`` and
``prefetch`` as that path's options; ``balance`` and ``ahead`` change the warp-step kernel's splits and page reads.

Prediction: at page size ≥ 64 within 5% of ``decode_split_k_lean``; an 8-bit cache ~1.7–1.9x SDPA on fp16.
Verdict: 0.950 ms at B8 H32 KV 32k P64, 0.99x decode_split_k_lean; mma on 8-bit caches 1.67–1.76x SDPA on the
fp16 cache (the 1.7x target missed for int8/token) (H200, CUPTI)
[results/paged-nvidia-h200.jsonl] [results/paged-8bit-mma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba import float32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.ptx_loads import smem_reason
from numba_attn.phases.decode.frag8 import make_frag8_kernel
from numba_attn.phases.decode.p33_decode_split_k_lean import make_lean_kernel
from numba_attn.phases.decode.paged import PAGED_KV8, PAGED_TOKEN_SCALE, check_paged_problem, paged_launch
from numba_attn.phases.decode.rules import check_split, resolve_split, resolve_splits, ring_bytes, vector_width
from numba_attn.phases.registry import register_phase
from numba_attn.spec.errors import check_bool


def wide_path(problem, wide):
    """``wide`` resolved: None (the default) is True for an 8-bit cache read by one query row per KV head
    (no GQA group, q_len 1) at a head_dim of whole 16-code loads, where it was measured faster; with a
    GQA group the row blocks' registers spill with it (slower, measured), so False."""
    if wide is None:
        return (bool(getattr(problem, "kv_dtype", "")) and problem.group * problem.q_len == 1
                and problem.head_dim % 16 == 0)
    return check_bool("parameter wide of phase 'paged_split_k'", wide)


def elements_per_load(problem, wide):
    """Elements a lane reads per load: 16 codes of an 8-bit cache with ``wide``, else 8 (16-bit)."""
    return 16 if wide_path(problem, wide) and getattr(problem, "kv_dtype", "") else vector_width(problem.dtype)


def _mma_reason(problem):
    """Why ``mma`` cannot run ``problem`` (None when it can)."""
    if not getattr(problem, "kv_dtype", ""):
        return "mma: 8-bit caches only"
    if problem.dtype != "float16":
        return "mma: float16 queries only (the fragments are f16)"
    if problem.head_dim % 64:
        return f"mma: head_dim {problem.head_dim} is not a multiple of 64"
    if problem.group * problem.q_len > 8:
        return f"mma: {problem.group * problem.q_len} query rows per KV head > 8 (the mma's N)"
    return None


def mma_path(problem, mma, wide=None):
    """``mma`` resolved: None (the default) is True for an 8-bit cache the path can run (float16 query, head_dim
    a multiple of 64, at most 8 query rows per KV head), where it was measured faster than the paths it
    replaces (fp8: ``wide`` 1.32x at B8 KV 32k D128 MHA, two codes per load 3.4x under GQA 4; int8/token:
    ``wide`` 1.09x at B8 KV 16k and 32k, after the int8 loop's rework). A ``wide`` given explicitly asks for
    the other path."""
    if mma is None:
        return (wide is None and getattr(problem, "kv_dtype", "") in ("float8_e4m3", "int8")
                and _mma_reason(problem) is None)
    return check_bool("parameter mma of phase 'paged_split_k'", mma)


def _step_heads(problem, step_heads, mma=None, wide=None, prefetch=0):
    """``step_heads`` resolved: None (the default) is 2 on the mma path for one query row per KV head, an even
    number of KV heads and no prefetch (measured 1.2-2.5 % faster than 1 on every 8-bit cache at B8 H32 KV 16k
    and 32k, H200), else 1."""
    if step_heads is None:
        return 2 if (mma_path(problem, mma, wide) and _mma_reason(problem) is None
                     and problem.group * problem.q_len == 1
                     and problem.kv_heads % 2 == 0 and not prefetch) else 1
    return step_heads


def _merge_smem(problem, warps, rows, step_heads):
    """Static shared memory of the mma kernel's block merge: m, l and O of every warp's rows (+ the combine's
    flag, rounded up)."""
    return warps * rows * step_heads * (problem.head_dim + 2) * 4 + 16


def check_paged_split_k(problem, wide=None, mma=None, prefetch=0, balance=False, ahead=False, step_heads=None, stages=0,
              **params):
    reason = check_paged_problem(problem)
    if reason:
        return reason
    if not 0 <= prefetch <= 4:
        return f"prefetch={prefetch} out of range 0..4 (warp steps ahead)"
    if prefetch and not mma_path(problem, mma, wide):
        return "prefetch: the mma path only (8-bit caches)"
    if balance and mma_path(problem, mma, wide):
        return "balance: not on the mma path (8-bit caches: use mma=False)"
    if ahead and mma_path(problem, mma, wide):
        return "ahead: not on the mma path (8-bit caches: use mma=False)"
    step_heads = _step_heads(problem, step_heads, mma, wide, prefetch)
    if step_heads != 1:
        if step_heads not in (2, 4, 8):
            return f"step_heads={step_heads} not 1, 2, 4 or 8"
        if not mma_path(problem, mma, wide):
            return "step_heads: the mma path only (8-bit caches)"
        if problem.group * problem.q_len != 1:
            return "step_heads: one query row per KV head only (the mma's columns hold the heads)"
        if problem.kv_heads % step_heads:
            return f"step_heads={step_heads} does not divide kv_heads ({problem.kv_heads})"
        if prefetch:
            return "step_heads: not with prefetch"
    if mma_path(problem, mma, wide):
        reason = _mma_reason(problem)
        if reason or not 1 <= params["warps"] <= 32:
            return reason or f"warps={params['warps']} out of range 1..32"
        smem = _merge_smem(problem, params["warps"], params["rows"], step_heads)
        if smem > 48 * 1024:
            return f"block merge needs {smem} B of shared memory (> 48 KiB); lower warps"
        if stages:
            if stages not in (2, 3, 4):
                return f"stages={stages} not 0 (off), 2, 3 or 4"
            if prefetch:
                return "stages: not with prefetch (the ring already has the next steps in flight)"
            ring = ring_bytes(problem.head_dim, params["warps"], stages)
            return smem_reason(ring + smem)
        return None
    if stages:
        return "stages: the mma path only (8-bit caches)"
    if wide is not None and wide_path(problem, wide) and not problem.kv_dtype:
        return "wide: 8-bit caches only (a 16-bit cache already reads 16 bytes per load)"
    return check_split(problem, **params, VW=elements_per_load(problem, wide))


def _resolve(problem, wide=None, mma=None, step_heads=None, **params):
    if mma_path(problem, mma, wide) and not _mma_reason(problem):
        # mma: one row block per KV head, 16 keys per warp step (reported as 2 lanes per key, 1 key per group);
        # step_heads HW: 16 / HW tokens of HW KV heads per warp step (reported as 2·HW lanes per key)
        rows = problem.group * problem.q_len
        hw = _step_heads(problem, step_heads, mma, wide, params["prefetch"])
        S = resolve_splits(problem, params["warps"] * 16 // hw, rows, params["blocks_per_sm"], params["min_keys"],
                           params["splits"], heads=hw)
        return {**params, "rows": rows, "lanes": 2 * hw, "keys": 1, "splits": S, "wide": False, "mma": True,
                "step_heads": hw}
    # mma=True where it cannot run stays True, so that supports() says why
    return {**resolve_split(problem, **params, VW=elements_per_load(problem, wide)), "wide": wide_path(problem, wide),
            "mma": mma is True,
            "step_heads": 1 if step_heads is None else step_heads}


@register_phase(
    name="paged_split_k", order=35,
    title="Paged decode: split-K over the pages of a block table (fp16, fp8, int8 caches)",
    parent="decode_split_k_lean", kind="decode",
    description="""
        decode_split_k_lean on a paged KV cache (FlashAttention's flash_attn_with_kvcache
        layout): a key row is found through the block table (the page index read once per
        warp step when a page holds the step), each sequence has its own length (a length-0
        sequence gives zeros; unequal lengths: splits sized from the batch's total keys), and
        an 8-bit cache (fp8 e4m3 or int8, per-tensor, per-head or
        per-token scale) is dequantized in registers; float16 or bfloat16 queries. Tolerance:
        the query dtype's (float16 4e-3, bfloat16 3e-2) against the float64 reference on the
        dequantized cache, for every cache format.
    """,
    lineage="vLLM PagedAttention (Kwon et al. 2023); FlashAttention flash_attn_with_kvcache; "
            "Flash-Decoding split-K",
    planned_speedup=45.0,
    dtypes=("float16", "bfloat16"),
    space={"warps": [4, 8], "keys": [0, 1, 2, 4], "splits": [0, 8, 16, 32, 64], "blocks_per_sm": [1, 2, 4],
           "wide": [False, True], "mma": [False, True], "balance": [False, True], "step_heads": [1, 2, 4, 8],
           "stages": [0, 3]},
    # prefetch (1, 2) was measured slower on every 8-bit target, ahead no faster (H200, H100): not candidates;
    # stages 3 (one block per SM) 2.0-3.3 % faster than the direct loads on an H100, not yet run on an H200: a
    # candidate, off by default
    launch_params=("splits",),  # the split count is a launch argument: its candidates mostly share kernels
    sim_params={"warps": 2, "splits": 3},
    supports=check_paged_split_k,
    resolve=_resolve,
    layout="paged",
)
def paged_split_k(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256, fuse_max=64,
                  wide=None, mma=None, prefetch=0, balance=False, ahead=False, step_heads=None, stages=0):
    fused = splits * rows * step_heads <= fuse_max
    if mma:
        kern = make_frag8_kernel(problem.head_dim, warps, problem.q_len, problem.group, problem.causal, fused,
                                 blocks_per_sm, problem.page_size, PAGED_KV8[problem.kv_dtype],
                                 bool(PAGED_TOKEN_SCALE[problem.kv_scale]), PREFETCH=prefetch, STEP_HEADS=step_heads,
                                 STAGES=stages)
        pf_note = f", L2 prefetch {prefetch} step{'s' if prefetch > 1 else ''} ahead" if prefetch else ""
        pf_note += f", {step_heads} KV heads per warp step" if step_heads > 1 else ""
        pf_note += f", cp.async ring of {stages} steps per warp" if stages else ""
        dyn = ring_bytes(problem.head_dim, warps, stages) if stages else 0
        return paged_launch(problem, kern, float32(problem.sm_scale * float(LOG2E)), warps, lanes, rows, keys, splits,
                            fused, notes=f", combine {'fused' if fused else 'kernel'}, 8-bit codes into mma fragments"
                                         + pf_note, heads=step_heads, dyn_bytes=dyn,
                            static_bytes=_merge_smem(problem, warps, rows, step_heads))
    kern = make_lean_kernel(problem.head_dim, elements_per_load(problem, wide), lanes, keys, warps, rows, problem.q_len,
                            problem.group, problem.causal, False, fused, blocks_per_sm, P=problem.page_size,
                            KV_FORMAT=PAGED_KV8[problem.kv_dtype], TOKEN=bool(PAGED_TOKEN_SCALE[problem.kv_scale]),
                            BF16=problem.dtype == "bfloat16", BALANCE=balance, PAGE_AHEAD=ahead)
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    wide_note = ", 16 codes per load" if elements_per_load(problem, wide) == 16 else ""
    wide_note += ", balanced splits" if balance else ""
    wide_note += ", page index a step ahead" if ahead else ""
    return paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused,
                        notes=f", combine {'fused' if fused else 'kernel'}{wide_note}")
