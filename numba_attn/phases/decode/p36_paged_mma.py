"""Phase 36 — ``paged_mma``: GQA decode on tensor cores over a paged KV cache.

Change against ``decode_mma``: only how a key row is found. The cp.async
copy of a ``Bc``-key tile reads cache row ``block_table[b, j // P] · P + j % P``
of the (num_blocks, P, Hkv, D) cache instead of row ``j`` of a contiguous
head. Tiles are aligned to Bc, so when pages hold whole tiles (``P % Bc == 0``)
the page index is one load per tile; otherwise (a page smaller than a tile) it
is looked up per row. Each sequence has its own length (``cache_seqlens[b]``: the splits are
planned for the longest, a split past a sequence's end is empty); a sequence
of length 0 gets zeros (its split 0 writes a zero partial with log-sum-exp
0, or the one-split kernel writes 0 where no key was seen). The query rows of
a KV head (GQA group × q_len ≤ 16) stay one m16 tile; 16-bit caches only.
The kernel is ``decode_mma``'s with a page size (``make_mma_kernel`` in ``common``).

Prediction: at page size >= 64, within 5% of ``decode_mma``'s bandwidth on the
same lengths (the page index is one L1-cached load per 16-key tile); at page
size 16 a few percent lower (a cp.async row of 16 keys × 256 B per page).
Verdict: not measured yet (no committed GPU row).
"""
from __future__ import annotations

import numpy as np
from numba import float32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.pdl import launch_after, pdl_available, uses_griddepcontrol
from numba_attn.gpu.ptx_loads import launch_dynamic
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.common import (FIXED_COMBINE_MAX, PDL_MODES, PagedLayout, check_alignment, check_mma,
                                             check_paged_problem, make_mma_kernel, mma_smem_bytes, resolve_mma,
                                             split_workspace, zeroed_counters)
from numba_attn.phases.registry import Launch, register_phase


def _supports(problem, **params):
    reason = check_paged_problem(problem)
    if reason:
        return reason
    if problem.kv_dtype:
        return f"a {problem.kv_dtype} cache: paged_mma reads 16-bit caches (paged_split_k dequantizes 8-bit ones)"
    return check_mma(problem, **params)


@register_phase(
    name="paged_mma", order=36, title="Paged decode: GQA rows on tensor cores, K/V tiles copied from the pages",
    parent="decode_mma", kind="decode",
    description="""
        decode_mma on a paged KV cache (FlashAttention's flash_attn_with_kvcache layout):
        the cp.async copy of a key tile finds its rows through the block table (one page
        index per tile when a page holds the tile, per row otherwise); each sequence has
        its own length (a length-0 sequence gives zeros); 16-bit caches. Tolerance:
        float16's (4e-3) against the float64 reference.
    """,
    lineage="vLLM PagedAttention (Kwon et al. 2023); FlashInfer GQA decode on tensor cores; "
            "FlashAttention flash_attn_with_kvcache",
    planned_speedup=60.0,
    space={"warps": [2, 4, 8], "Bc": [16, 32], "stages": [2, 3, 4], "splits": [0, 8, 16, 32, 64]},
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float16",),
    sim_params={"warps": 2, "Bc": 16, "stages": 2, "splits": 3},
    supports=_supports,
    resolve=resolve_mma,
    layout="paged",
)
def paged_mma(problem, warps=4, Bc=16, stages=3, splits=0, blocks_per_sm=2, min_keys=2048, fuse_max=0, pdl=3,
              l2_prefetch=False, even=False, fixed_combine=True):
    B, Hkv, Nq, Nk, D = problem.batch, problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    S, chunk = split_plan(B * Hkv, Nk, warps * Bc, sm_count(), blocks_per_sm, min_keys, splits)
    final = S == 1
    fused = S * G * Nq <= fuse_max
    dependent = bool(pdl) and not final and not fused and uses_griddepcontrol()
    if even:
        chunk = -(-Nk // Bc)  # tiles, spread evenly over the splits by the kernel
    kern = make_mma_kernel(D, warps, Bc, stages, Nq, G, problem.causal, final, fused, int(pdl) if dependent else 0,
                           bool(l2_prefetch), bool(even), P=problem.page_size)
    sl2 = float32(problem.sm_scale * float(LOG2E))
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv)
    nbytes = mma_smem_bytes(D, warps, Bc, stages)
    part_o, part_lse = split_workspace(S, B * problem.heads * Nq, D)
    kernels = [kern]
    if not final and not fused:
        combine = make_combine_kernel(Nq, dependent, S if fixed_combine and S <= FIXED_COMBINE_MAX else 0)
        kernels.append(combine)
    counters = zeroed_counters(B * Hkv)
    own = PagedLayout(problem)
    views = {}
    opted = []

    def run(q, k, v, o, stream=0, layout=None):
        table, seqlens = (layout or own.own())[:2]
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            check_alignment(k, v)
            if len(views) >= 8:
                views.clear()
            hit = views[key] = ((q, k, v, o), view_as(q, np.uint32))
        args = (hit[1], k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, table, seqlens, chunk, S)
        if opted:
            kern[grid, warps * WARP_SIZE, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, warps * WARP_SIZE, stream, nbytes, *args)
            opted.append(True)
        if dependent:
            launch_after(combine, B * problem.heads * Nq, D, stream, 0, part_o, part_lse, o, S)
        elif not final and not fused:
            combine[B * problem.heads * Nq, D, stream](part_o, part_lse, o, S)

    size = f"{chunk // S}-{-(-chunk // S)} tiles" if even else f"{chunk} keys"
    how = "-" if final else ("fused" if fused else "kernel")
    if not final and not fused and S <= FIXED_COMBINE_MAX and fixed_combine:
        how += f" (compiled for {S} splits)"
    if dependent and pdl_available() is None:
        how += f", dependent launch ({PDL_MODES[int(pdl)]})"
    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {size}, P={problem.page_size}, {warps} warps × {Bc}-key tiles, "
                        f"{stages} stages, combine {how}")
