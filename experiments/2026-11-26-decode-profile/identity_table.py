"""A paged problem whose block table is the identity (sequence b's pages in order, one after the other in the
cache), beside the shuffled table every other paged problem has: the preset ``paged-identity`` holds the ragged
B8 KV <= 4k target's shape at uniform lengths (2024 keys, P64, fp16) twice, shuffled (seed 0) and in order
(seed 4242). The two read the same bytes through the same kernel and the same (token, head)-interleaved rows;
only the pages' order in memory differs.

    PYTHONPATH=experiments/2026-11-26-decode-profile python3 -m numba_attn.cli bench paged --setup identity_table \\
        --preset paged-identity --phases paged_split_k,paged_worklist,decode_split_k_lean
"""
from __future__ import annotations

import numpy as np

import numba_attn.spec.paged as paged
from numba_attn.spec.problem import PRESETS, PagedProblem

IDENTITY_SEED = 4242  # a problem with this seed gets its pages in order
_shuffled = paged.problem_layout


def problem_layout(p):
    table, seqlens, ks, vs = _shuffled(p)
    if p.seed != IDENTITY_SEED:
        return table, seqlens, ks, vs
    npages = (seqlens + p.page_size - 1) // p.page_size
    table = np.zeros_like(table)
    at = 0
    for b in range(p.batch):
        table[b, : npages[b]] = np.arange(at, at + npages[b], dtype=np.int32)
        at += npages[b]
    return table, seqlens, ks, vs


paged.problem_layout = problem_layout  # (PagedProblem.layout and problem_inputs look it up at each call)

UNIFORM = dict(batch=8, heads=32, q_len=1, kv_len=2024, head_dim=128, dtype="float16", page_size=64)
PRESETS["paged-identity"] = [PagedProblem(**UNIFORM), PagedProblem(**UNIFORM, seed=IDENTITY_SEED)]
