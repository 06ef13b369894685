"""One checked launch of ``paged_split_k`` on int8/head B8 H32 D128 P64 KV 16k with the direct loads and with the
ring, for Nsight Compute (each output compared with the float64 reference first; a wrong one stops the script).
A case name ending in ``_tok`` runs int8 with a per-token scale instead.

    ncu --clock-control none -k regex:paged_split_k --metrics ... python3 experiments/2026-11-26-decode-ring/launch_ring.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from numba_attn.measure.check import checked_launches  # noqa: E402
from numba_attn.spec.problem import PagedProblem  # noqa: E402

PROB = PagedProblem(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64,
                    kv_dtype="int8", kv_scale="head")
TOKEN = PagedProblem(**{**PROB.to_dict(), "kv_scale": "token"})
PARAMS = {"direct": {}, "ring2": {"stages": 2}, "ring3_b1": {"stages": 3, "blocks_per_sm": 1}}
CASES = {name: ("paged_split_k", PROB, params) for name, params in PARAMS.items()}
CASES.update({f"{name}_tok": ("paged_split_k", TOKEN, params) for name, params in PARAMS.items()})

if __name__ == "__main__":
    checked_launches(CASES, sys.argv[1:])
