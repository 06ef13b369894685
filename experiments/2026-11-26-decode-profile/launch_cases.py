"""One checked launch of each decode case below, for Nsight Compute (each launch's output is compared with the
float64 reference before the next case; a wrong one stops the script, so no profile is of a launch that computed
something else). ncu flushes the caches before each profiled launch, so the checked launch is the profiled one.

    ncu --clock-control none -k regex:'decode_split_k_lean|paged_split_k|paged_worklist' \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 experiments/2026-11-26-decode-profile/launch_cases.py [CASE ...]

Cases (H32 D128 fp16 query):
  twin          decode_split_k_lean, contiguous (B, H, N, D) cache, B8, every sequence 2024 keys
  psk_uniform   paged_split_k, P64, B8, every sequence 2024 keys, shuffled table
  psk_identity  the same with the identity table (identity_table.py)
  pwl_uniform   paged_worklist on psk_uniform's problem
  pwl_ragged    paged_worklist, P64, B8 ragged KV <= 4k (the missed target)
  int8_token    paged_split_k (mma), B8 KV 16k P64, int8 cache, per-token scales
  int8_head     the same, per-head scales
  fp8_head      the same, fp8 e4m3 cache, per-head scales
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", ".."))
sys.path.insert(0, here)

import identity_table  # noqa: E402
from numba_attn.measure.check import checked_launches  # noqa: E402
from numba_attn.spec.problem import PagedProblem, Problem  # noqa: E402

UNI = identity_table.UNIFORM
BIG = dict(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64)
CASES = {
    "twin": ("decode_split_k_lean", Problem(batch=8, heads=32, q_len=1, kv_len=2024, head_dim=128, dtype="float16"),
             {}),
    "psk_uniform": ("paged_split_k", PagedProblem(**UNI), {}),
    "psk_identity": ("paged_split_k", PagedProblem(**UNI, seed=identity_table.IDENTITY_SEED), {}),
    "pwl_uniform": ("paged_worklist", PagedProblem(**UNI), {}),
    "pwl_ragged": ("paged_worklist", PagedProblem(**{**UNI, "kv_len": 4096}, ragged=True), {}),
    "int8_token": ("paged_split_k", PagedProblem(**BIG, kv_dtype="int8", kv_scale="token"), {}),
    "int8_head": ("paged_split_k", PagedProblem(**BIG, kv_dtype="int8", kv_scale="head"), {}),
    "fp8_head": ("paged_split_k", PagedProblem(**BIG, kv_dtype="float8_e4m3", kv_scale="head"), {}),
}

if __name__ == "__main__":
    checked_launches(CASES, sys.argv[1:])
