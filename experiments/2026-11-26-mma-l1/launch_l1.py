"""One checked launch of ``paged_mma`` and ``decode_mma`` with ``.cg`` (default) and ``.ca`` (``l1``) copies, for
Nsight Compute (each output compared with the float64 reference first; a wrong one stops the script): fp16 GQA
B8 H32/8 D128 KV 32k, paged (P64) and contiguous.

    ncu --clock-control none -k regex:'paged_mma|decode_mma' --metrics ... \\
        python3 experiments/2026-11-26-mma-l1/launch_l1.py [case ...]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from numba_attn.measure.check import checked_launches  # noqa: E402
from numba_attn.spec.problem import PagedProblem, Problem  # noqa: E402

_GQA = dict(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16")
CASES = {"paged_cg": ("paged_mma", PagedProblem(page_size=64, **_GQA), {}),
         "paged_ca": ("paged_mma", PagedProblem(page_size=64, **_GQA), {"l1": True}),
         "contig_cg": ("decode_mma", Problem(**_GQA), {}),
         "contig_ca": ("decode_mma", Problem(**_GQA), {"l1": True})}

if __name__ == "__main__":
    checked_launches(CASES, sys.argv[1:])
