"""Phase 35 — ``paged_split_k``: split-K decode over a paged KV cache.

Change against ``decode_split_k_lean``: only how a key row is found. The
cache is FlashAttention's paged layout, (num_blocks, page_size, Hkv, D), and
key ``j`` of sequence ``b`` is row ``j % P`` of page ``block_table[b, j // P]``
(``paged_keys`` in ``decode/common.py``). A warp step's KS keys are
consecutive and steps are aligned to KS, so when pages hold whole steps
(``P % KS == 0``) the page index is one load per step; otherwise (a smaller
page, or a step of 3·8 keys) it is read per key. Each sequence has its own length
(``cache_seqlens[b]``): split s of every sequence covers keys
[s·chunk, (s+1)·chunk), chunk sized for the longest, and a split past a
sequence's end is empty (an early exit). When the lengths differ the split
count comes from the batch's total keys (``split_plan``'s ragged plan: a
split at most a quarter of a block slot's share of the keys), so a long
sequence is read by proportionally more blocks, over several waves, instead
of one wave of (sequence, head) blocks waiting for the longest. Every split
writes a partial (no one-split direct write) so that a sequence of length 0
gets zeros (its split 0 writes a zero partial with log-sum-exp 0). The same kernel reads an 8-bit cache
(fp8 e4m3 or int8 bytes, two 32-bit words per 8 elements, dequantized in
registers and multiplied by the per-tensor, per-head or per-token scale), and
a float16 or bfloat16 query (a bfloat16 cache read as 32-bit words, each
split into two floats by shifts). ``wide`` (8-bit caches; the default where a
KV head has one query row): a lane owns 16
consecutive codes per chunk and reads them with one 16-byte load, so a key needs
half the lanes and its per-key work (address, page index, shuffles, softmax)
is shared by twice the bytes; the codes are decoded where they are used, the
scales applied per score and per probability, and fp8's NaN codes are tested
once per load instead of patched per word. ``mma`` (8-bit caches, float16
query, D a multiple of 64, at most 8 query rows per KV head; the default for
8-bit caches, where it was measured faster):
the codes go from the 16-byte loads straight into ``mma.m16n8k16`` fragments
(keys on M, query rows on N; fp8 decoded by ``cvt.rn.f16x2.e4m3x2``, two codes
per instruction), so an fp8 key costs ~23 loop instructions instead of ~53 with
``wide`` (``make_frag8_kernel`` in ``common``).
The kernel is ``decode_split_k_lean``'s with a page size (``make_lean_kernel``
in ``common``).

Prediction: at page size >= 64 the same bandwidth as ``decode_split_k_lean``
(within 5%: one extra L1-cached load per step); an 8-bit cache halves the
bytes, ~1.7-1.9x faster than SDPA on the fp16 contiguous cache at KV >= 16k; ``wide``:
half the main loop's instructions per key on fp8 (100 -> 52.5), a quarter fewer on int8. ``mma``
(prediction written before any GPU run; offline SASS of the key loop: 22.7 instructions per key against
``wide``'s 52.8 on fp8, 37.8 against 46.2 on int8/token, registers unchanged at ~128): fp8/head reads its
bytes at >= 3.9 TB/s at B8 H32 D128 KV 16k/32k, >= 1.7x SDPA on the fp16 cache; int8/token gains less
(~1.5-1.6x SDPA: its decoding and per-token scale addresses stay in the loop).
``prefetch`` (``mma`` only; 0, the default, off): a warp prefetches into L2 the cache rows and per-token
scales of its step ``prefetch`` rounds ahead (``prefetch.global.L2``: no register waits for them). Offline
(sm_90a SASS at B8 H32 D128 P64, experiments/2026-11-23-paged-8bit/inflight_sass.py): the fp16 loop issues its
8 16-byte loads (4 KiB per warp per 8 keys) before it uses any, 64 KiB per SM in flight at 16 warps; the
8-bit loop (4 KiB per warp per 16 keys) issues V's loads after the first K mma, which waits for K (the PTX has
them first: ptxas moves them, at 126-128 registers), so only 2 KiB (int8/token) or 3 KiB (fp8/head) per warp
are in flight during the first wait and the rest makes a second round trip: 32-48 KiB per SM, for twice the
keys. Prediction (before any GPU run): with ``prefetch=1`` (+2-3 loop instructions per key) the 8-bit caches
read at >= 4.2 TB/s, int8/token >= 1.7x SDPA on the fp16 cache at KV 16k/32k, fp8/head >= 1.8x;
``prefetch=2`` within 2% of ``prefetch=1``.
``balance`` (the warp-step kernel: 16-bit caches, ``wide``, ``mma=False``; off by default): a sequence of Nk keys is
cut into n = ceil(Nk/chunk) splits of equal whole warp steps instead of n-1 full splits and a remainder
(``balanced_split``), which also makes any split count as good as a power of two. Prediction (before any GPU run;
host model in experiments/2026-11-23-paged-ragged-balance): at ragged B8 KV <= 4k, balance alone <= 4% faster;
with 3 splits 65-70 us, 0.88-0.95x the contiguous twin (from 0.84x).
``ahead`` (the warp-step kernel, pages holding whole warp steps; off by default; also ``paged_worklist``'s): a
warp reads the page index of its next step while this step's K/V loads are in flight, instead of before them, so
a step is one dependent round trip to memory instead of two. Prediction (before any GPU run; H200, B8 H32 D128 P64
fp16): at uniform lengths of 2024 keys, where the block table costs 3.5 % (0.0649 against the twin's 0.0626 ms),
half of it or more back: 0.975-0.99x the twin; at ragged B8 KV <= 4k ``paged_worklist`` 1-3 % faster (0.91-0.92x
the twin: the target stays missed); at KV <= 32k within +-1 %.
``step_heads`` (the mma path, one query row per KV head; S = 2 by default where kv_heads is even, since it was
measured): a warp step's 16 rows are 16 / S tokens × S adjacent KV heads instead of 16 tokens of one head, the S
heads' queries in the mma's N columns and a score counting only in its own head's column (``make_frag8_kernel``,
``HW``), so a step reads S heads' rows of a token as S·128 contiguous bytes, where one head's rows lie Hkv·128 bytes
apart. Why (experiments/2026-11-26-decode-profile): the same int8/head bytes as 256 sequences of one head (a page
one head's contiguous rows) ran 5.3 % faster than B8 H32; a block reading several heads with separate warps
(``head_group``, 75e82a4) was 1-3 % slower, so the locality that counts is within a warp's step. Prediction (before
any GPU run): S = 8 gains 3-5 % on the three 8-bit caches at B8 H32 KV 16k and 32k, S = 2 and 4 in between;
int8/token then >= 1.7x SDPA on the fp16 twin.
``stages`` (the mma path; 0, the default, off): each warp owns a ring of ``stages`` warp steps in dynamic shared
memory, filled by ``cp.async.ca`` with whole rows (one instruction moves 512 contiguous bytes; int8's per-token scales
queued in registers), and keeps ``stages`` − 1 steps in flight while it computes one; the fragments are read from the ring as they
were from global memory (``make_frag8_kernel``, ``NST``). Why: the 8-bit kernels are latency-bound, and at the
128-register cap ptxas issues part of a step's loads after the first mma, so a step's 4 KiB per warp are never all in
flight and none are during its arithmetic (experiments/2026-11-26-decode-ring). Prediction (before any GPU run): at
B8 H32 D128 P64, 3 stages are the fastest, int8/head and fp8/head at KV 16k at >= 4.2 TB/s, int8/token >= 1.7x SDPA
on the fp16 twin at KV 16k and 32k; 2 stages 1-3 % faster than the direct loads; 4 stages (one block per SM) slower
than 3.
Verdict: 0.950 ms at B8 H32 KV 32k P64 (equal lengths), 0.99x decode_split_k_lean; ragged B8 KV <= 32k 0.504 ms with the ragged plan (0.592 ms before), 0.95x; 8-bit caches at B8 KV 16k: 0.483 ms fp8/head, 0.389 ms int8/token, 0.98x and 1.22x SDPA on the fp16 cache (the 1.7x target missed) (H200, CUPTI) [results/paged-nvidia-h200.jsonl]
Verdict (mma, the default for fp8 caches from this run on): as predicted for fp8/head, B8 KV 16k 0.2766 ms and KV 32k 0.5476 ms, 3.9 TB/s of cache bytes, 1.72x and 1.73x SDPA on the fp16 cache in the same process (wide 1.29x and 1.31x in that run); GQA (group 4) fp8 KV 32k 0.1493 ms, 1.63x SDPA and 3.4x the previous default there; refuted for int8/token before the int8 loop's rework (next line), mma 2-5% slower than wide, then its default: 0.3219 ms and 0.6384 ms, 1.47x and 1.49x SDPA (the 1.7x target missed for int8) (H200, CUPTI) [results/paged-8bit-mma-nvidia-h200.jsonl]
Verdict (mma on int8, after the int8 loop's rework; now the default for 8-bit caches): int8/token B8 KV 16k 0.2933 ms and KV 32k 0.5851 ms, 1.62x SDPA on the fp16 cache in the same process, 1.10x and 1.09x wide (0.3221 ms and 0.6387 ms in that run); 3.8 TB/s of cache and scale bytes, against fp8/head's 3.9; 8 bytes of local memory (a spill outside the key loop); the 1.7x target still missed for int8/token (H200, CUPTI) [results/paged-8bit-mma-nvidia-h200.jsonl]
Verdict (prefetch): refuted, slower on every target and left out of the tuning space (still an option): fp8/head KV 16k 0.2770 and 0.2963 ms with prefetch 1 and 2 against 0.2715 ms without; int8/token KV 16k 0.3546 and 0.3612 against 0.2807, KV 32k 0.6992 and 0.7724 against 0.5561 (H200, CUPTI, one process per problem). The defaults after the 32-bit warp index: fp8/head 1.71x SDPA on the fp16 cache at KV 16k, int8/token 1.66x at 16k and 32k (from 1.62x): the 1.7x target still missed for int8/token [results/paged-8bit-mma-nvidia-h200.jsonl]
Verdict (int8 with a per-head scale, first timed): B8 KV 16k 0.2745 ms, 1.69x SDPA on the fp16 cache (fp8/head 0.2719 ms, 1.71x, in the run before it), KV 32k 0.5419 ms, 1.71x: within 1% of fp8/head as predicted (H200, CUPTI) [results/paged-8bit-mma-nvidia-h200.jsonl]
Verdict (balance): at ragged B8 KV <= 4k 3 balanced splits are the fastest setting, 71.4 us (predicted 65-70), 0.86x the contiguous twin (default 73.5 us, 0.84x); balance at the plan's split count is 3% slower; at B8 KV <= 32k and B32 KV <= 4k within 2% of the default (H200, CUPTI) [results/paged-nvidia-h200.jsonl; experiments/2026-11-23-paged-ragged-balance]
Verdict (wide, the int8 default before mma): B8 KV 16k 0.369 ms fp8/head, 0.327 ms int8/token, 1.29x and 1.46x SDPA on the fp16 cache in the same process; KV 32k 0.725 ms and 0.654 ms, 1.31x and 1.45x; GQA (group 4) fp8 at 32k slower with it, 0.635 ms against 0.513 ms (spills); the 1.7x target still missed (H200, CUPTI) [results/paged-8bit-wide-nvidia-h200.jsonl]
Verdict (step_heads): faster for every S on all six problems, by less than predicted: KV 16k int8/head 0.2755 ms at S = 1 against 0.2722, 0.2706, 0.2714 ms at S = 2, 4, 8; int8/token 0.2816 against 0.2775, 0.2790, 0.2804; fp8/head 0.2740 against 0.2671, 0.2707, 0.2722; KV 32k int8/head 0.5419 against 0.5299, 0.5268, 0.5242; int8/token 0.5557 against 0.5466, 0.5456, 0.5431; fp8/head 0.5327 against 0.5244, 0.5275, 0.5271 (1.2-3.3 %; S = 2 the steadiest, 1.2-2.5 %, now the default). SDPA on the fp16 twin 0.4625 and 0.9221 ms: S = 2 reaches 1.70x and 1.74x for int8/head, 1.73x and 1.76x for fp8/head, 1.67x and 1.69x for int8/token (the 1.7x target still missed, by 1-2 %). int8/head spills 8 bytes at S > 1. Memcheck of the mma tests with it on the GPU: 16 passed, 0 errors (H200, CUPTI, one process per length, 9586a99). Again with the default at 2 beside psk_sh1 (b1c4a48, one process): KV 16k int8/head 0.2711 against 0.2751 ms, int8/token 0.2781 against 0.2822, fp8/head 0.2675 against 0.2726; KV 32k 0.5304 against 0.5425, 0.5467 against 0.5564, 0.5247 against 0.5333 (1.5-2.2 %); SDPA 0.4627 and 0.9285 ms: int8/token 1.66x and 1.70x (1.698) [results/paged-8bit-mma-nvidia-h200.jsonl, rows of psk_sh1, psk_sh2, psk_sh4, psk_sh8, torch_sdpa, torch_sdpa_cudnn]
Verdict (stages, copies by cp.async.cg): refuted on an H100 (not yet run on an H200): slower than the direct loads on every cache at both lengths, by 4.7-6.7 % at two blocks per SM (int8/token 10-12.5 %), 2.8-3.4 % at one (int8/token 7.4-8.1 %), with no spill (124-128 registers; 165-172 at one block per SM); KV 16k int8/head 0.3692 ms against 0.3888, 0.3878, 0.3941 ms at 2, 3, 4 stages and 0.3818, 0.3795 ms at 3, 4 stages with one block per SM; int8/token 0.3797 against 0.4201, 0.4259, 0.4177, 0.4093, 0.4105; fp8/head 0.3684 against 0.3856, 0.3857, 0.3916, 0.3810, 0.3790; KV 32k int8/head 0.6993 against 0.7326, 0.7351, 0.7392, 0.7214, 0.7193; int8/token 0.7229 against 0.8056, 0.8134, 0.7950, 0.7764, 0.7768; fp8/head 0.6965 against 0.7303, 0.7314, 0.7375, 0.7174, 0.7159 ms. There the direct loads already read at 94 % of SDPA's bandwidth on the fp16 twin (85 % on the H200, the gap the ring was meant to close: not yet measured there). Off by default and out of the tuning space; memcheck of its tests: 15 passed, 0 errors (CUPTI, one process per length, 8261984 and 3f0a7db) [results/paged-nvidia-h100.jsonl, rows of psk_st2, psk_st3, psk_st4, psk_st3b1, psk_st4b1]
Verdict (stages, copies by cp.async.ca): the first runs copied by cp.async.cg, which Nsight Compute found reading twice the L2 sectors of the direct loads (67.1M against 33.6M, int8/head KV 16k, H100); with .ca the ring reads the same sectors in 14 % fewer requests, and 3 stages at one block per SM is 1.6-1.7 % faster than the direct loads for the per-head caches: KV 16k int8/head 0.3490 ms against 0.3548 ms, fp8/head 0.3475 against 0.3534, KV 32k int8/head 0.6867 against 0.6989; int8/token still slower, 0.3698 against 0.3638 and 0.7430 against 0.7228 ms (its 4-byte scale copies); 2 stages within 1 % (int8/head 0.3525 ms), int8/token 0.3772 ms. Still off by default until the H200 run (H100, CUPTI, one process, 0a85197) [results/paged-nvidia-h100.jsonl, rows of psk_st2, psk_st3b1]
Verdict (stages after the ring's rework: addresses from per-lane offsets computed before the key loop, 412 loop instructions a step from 496 offline, int8's per-token scales in a register queue instead of 4-byte copies): 3 stages at one block per SM now faster than the direct loads on all three 8-bit caches at both lengths, by 2.0-3.3 %: KV 16k int8/head 0.3571 ms against 0.3694, int8/token 0.3722 against 0.3798, fp8/head 0.3566 against 0.3671; KV 32k 0.7076 against 0.7283, 0.7345 against 0.7551, 0.7059 against 0.7259 ms; SDPA on the fp16 twin 0.6939 and 1.3807 ms (int8/token 1.86x and 1.88x from 1.83x). Nsight Compute: the per-token ring's 4-byte copies had cost it 131M instructions against the direct loads' 94M (now 108M) and it was 1 % slower; queued, 2.1 % faster (single launches). Memcheck of its GPU tests: 15 passed, 0 errors. Not yet run on an H200; off by default, now a tuning candidate (H100, CUPTI, one process, d3672e7) [results/paged-nvidia-h100.jsonl, rows of psk_st3b1, torch_sdpa, torch_sdpa_cudnn]
Verdict (ahead): refuted, no faster on the H200 of the prediction nor on an H100, two runs in one process each beside the defaults and the twin. H200: at uniform lengths (B8 KV 2024 P64) 0.0653 and 0.0655 ms against 0.0650 and 0.0649 ms without it (the twin 0.0626 and 0.0627 ms: the block table's 3.5-4 % stays), paged_worklist 0.0660 and 0.0659 against 0.0658; ragged B8 KV <= 4k 0.0757 and 0.0755 ms against 0.0744 and 0.0741 (1.8 % slower; paged_worklist 0.0701 and 0.0703 against 0.0699 and 0.0695), KV <= 32k and B32 1.0-1.2 % slower. H100: within 0.8 % everywhere (uniform 0.0909 and 0.0910 against 0.0908 and 0.0909 ms). So the block table's cost is not the index load's latency. Off by default and out of the tuning space; memcheck of its tests on both GPUs: 4 passed, 0 errors (CUPTI, 3eec6a2) [results/paged-nvidia-h200.jsonl, rows of psk_ahead, pwl_ahead, paged_worklist, decode_split_k_lean] [results/paged-nvidia-h100.jsonl, rows of psk_ahead]
"""
from __future__ import annotations

from numba import float32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.ptx_loads import smem_reason
from numba_attn.phases.decode.common import (PAGED_KV8, PAGED_TOKEN_SCALE, check_paged_problem, check_split,
                                             make_frag8_kernel, make_lean_kernel, paged_launch, resolve_split,
                                             resolve_splits, ring_bytes, vector_width)
from numba_attn.phases.registry import register_phase
from numba_attn.spec.errors import check_bool


def _wide(problem, wide):
    """``wide`` resolved: None (the default) is True for an 8-bit cache read by one query row per KV head
    (no GQA group, q_len 1) at a head_dim of whole 16-code loads, where it was measured faster; with a
    GQA group the row blocks' registers spill with it (slower, measured), so False."""
    if wide is None:
        return (bool(getattr(problem, "kv_dtype", "")) and problem.group * problem.q_len == 1
                and problem.head_dim % 16 == 0)
    return check_bool("parameter wide of phase 'paged_split_k'", wide)


def _vw(problem, wide):
    """Elements a lane reads per load: 16 codes of an 8-bit cache with ``wide``, else 8 (16-bit)."""
    return 16 if _wide(problem, wide) and getattr(problem, "kv_dtype", "") else vector_width(problem.dtype)


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
        return wide is None and getattr(problem, "kv_dtype", "") in ("float8_e4m3", "int8") and _mma_reason(problem) is None
    return check_bool("parameter mma of phase 'paged_split_k'", mma)


def _step_heads(problem, step_heads, mma=None, wide=None, prefetch=0):
    """``step_heads`` resolved: None (the default) is 2 on the mma path for one query row per KV head, an even
    number of KV heads and no prefetch (measured 1.2-2.5 % faster than 1 on every 8-bit cache at B8 H32 KV 16k
    and 32k, H200), else 1."""
    if step_heads is None:
        return 2 if (mma_path(problem, mma, wide) and _mma_reason(problem) is None and problem.group * problem.q_len == 1
                     and problem.kv_heads % 2 == 0 and not prefetch) else 1
    return step_heads


def _merge_smem(problem, warps, rows, step_heads):
    """Static shared memory of the mma kernel's block merge: m, l and O of every warp's rows (+ the combine's
    flag, rounded up)."""
    return warps * rows * step_heads * (problem.head_dim + 2) * 4 + 16


def _supports(problem, wide=None, mma=None, prefetch=0, balance=False, ahead=False, step_heads=None, stages=0,
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
    if wide is not None and _wide(problem, wide) and not problem.kv_dtype:
        return "wide: 8-bit caches only (a 16-bit cache already reads 16 bytes per load)"
    return check_split(problem, **params, VW=_vw(problem, wide))


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
    return {**resolve_split(problem, **params, VW=_vw(problem, wide)), "wide": _wide(problem, wide), "mma": mma is True,
            "step_heads": 1 if step_heads is None else step_heads}


@register_phase(
    name="paged_split_k", order=35, title="Paged decode: split-K over the pages of a block table (fp16, fp8, int8 caches)",
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
    supports=_supports,
    resolve=_resolve,
    layout="paged",
)
def paged_split_k(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256, fuse_max=64,
                  wide=None, mma=None, prefetch=0, balance=False, ahead=False, step_heads=None, stages=0):
    fused = splits * rows * step_heads <= fuse_max
    if mma:
        kern = make_frag8_kernel(problem.head_dim, warps, problem.q_len, problem.group, problem.causal, fused,
                                 blocks_per_sm, problem.page_size, PAGED_KV8[problem.kv_dtype],
                                 bool(PAGED_TOKEN_SCALE[problem.kv_scale]), PF=prefetch, HW=step_heads, NST=stages)
        pf_note = f", L2 prefetch {prefetch} step{'s' if prefetch > 1 else ''} ahead" if prefetch else ""
        pf_note += f", {step_heads} KV heads per warp step" if step_heads > 1 else ""
        pf_note += f", cp.async ring of {stages} steps per warp" if stages else ""
        dyn = ring_bytes(problem.head_dim, warps, stages) if stages else 0
        return paged_launch(problem, kern, float32(problem.sm_scale * float(LOG2E)), warps, lanes, rows, keys, splits,
                            fused, notes=f", combine {'fused' if fused else 'kernel'}, 8-bit codes into mma fragments"
                                         + pf_note, heads=step_heads, dyn_bytes=dyn,
                            static_bytes=_merge_smem(problem, warps, rows, step_heads))
    kern = make_lean_kernel(problem.head_dim, _vw(problem, wide), lanes, keys, warps, rows, problem.q_len,
                            problem.group, problem.causal, False, fused, blocks_per_sm, P=problem.page_size,
                            KV8=PAGED_KV8[problem.kv_dtype], TOKEN=bool(PAGED_TOKEN_SCALE[problem.kv_scale]),
                            BF16=problem.dtype == "bfloat16", BAL=balance, AHEAD=ahead)
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    wide_note = ", 16 codes per load" if _vw(problem, wide) == 16 else ""
    wide_note += ", balanced splits" if balance else ""
    wide_note += ", page index a step ahead" if ahead else ""
    return paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused,
                        notes=f", combine {'fused' if fused else 'kernel'}{wide_note}")
