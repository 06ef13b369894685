"""Phase 30 — ``decode_chunked``: decode (q_len 1–8) as a bandwidth-bound GEMV.

Change against ``fused_rowwise`` (one thread per query row, walking every key
alone): in decode there are only 1–8 query rows per head, so one thread per
row would leave the GPU empty and read K/V with one thread per row. Here one
block handles one (sequence, KV head) and *all* the query rows that read it —
the ``G`` query heads of a grouped-query group times ``q_len`` — so each K/V
row is read from memory once per block, whatever the group size:

* the block's warps take the KV sequence in steps, round-robin; within a
  warp, a group of ``L`` lanes takes one key, each lane reading 16 bytes at a
  time (``ld.global.nc.v4``: 4 float32 or 8 float16) of the K row and the V
  row, so a warp reads ``32 / L`` whole rows per step, fully coalesced;
* each lane dots its slice of the key with its slice of every query row
  (registers), the group sums the slices with ``log2 L`` xor-shuffles, and
  every group keeps its own online softmax ``(m, l, O)`` per row;
* at the end the groups of a warp merge with shuffles (max, rescale, sum) and
  the warps merge their partial ``(m, l, O)`` through shared memory.

``L`` is chosen so that a lane holds ``E = D / L`` elements per row, with the
``rows × E`` query and accumulator registers bounded (E = 32 for one row,
fewer for more rows); more than ``rows`` query rows are split over blocks.
Causal with ``q_len > 1`` is bottom-right aligned: row ``i`` sees the keys
``j <= i + kv_len - q_len`` (a masked key is simply skipped for that row).

Prediction: K and V are read once with 16-byte coalesced loads at ~2 FLOP
per byte, so a full grid should run near the copy bandwidth (≥ 70% of it);
but the grid is only ``batch × kv_heads`` blocks (32 blocks on 132 SMs at
B=1, H=32), so B=1 should reach only ~25–35% of it. The split-K phase
(``decode_split_k``) fixes small batches.
Verdict: no row in a committed results file; the development runs (docs/decode-notes.md)
measured 28–31% of the copy bandwidth at B=1 fp16 and 102–109% at B=8 and B=32, as predicted.
"""
from __future__ import annotations

import functools

from numba import cuda, float32, int32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.common import (check_alignment, check_decode, chunk_steps, resolve_chunked,
                                             vector_width)
from numba_attn.phases.registry import Launch, register_phase


@functools.cache
def make_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool,
                MINB: int = 1):
    load_rows, load_keys, score_update, merge_lanes, write_rows, _ = chunk_steps(D, VW, L, T, NW, RB, Nq, G, causal)
    E = D // L  # elements of a row per lane
    KS = (WARP_SIZE // L) * T  # keys per warp step: T keys per group
    NT = NW * WARP_SIZE

    @kernel(launch_bounds=(NT, MINB))
    def decode_chunked(q, k, v, o, scale, Hkv, Nk):
        sm_m = cuda.shared.array((NW, RB), float32)
        sm_l = cuda.shared.array((NW, RB), float32)
        sm_o = cuda.shared.array((NW, RB, D), float32)
        Qr = cuda.local.array((RB, E), float32)
        acc = cuda.local.array((RB, E), float32)
        m = cuda.local.array(RB, float32)
        l = cuda.local.array(RB, float32)
        lim = cuda.local.array(RB, int32)
        KK = cuda.local.array((T, E), float32)
        VV = cuda.local.array((T, E), float32)
        sc = cuda.local.array((RB, T), float32)
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        row0 = cuda.blockIdx.x * RB  # first of this block's query rows (g * Nq + i)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // L
        sub = lane % L
        load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, Nk, Nk)
        n_steps = (Nk + KS - 1) // KS
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = step * KS + grp  # this group's keys: j0 + t * KW
            load_keys(k, v, KK, VV, kvh, j0, Nk, sub)
            score_update(Qr, KK, VV, sc, m, l, acc, lim, j0)
        merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub)
        cuda.syncthreads()
        write_rows(o, o, o, 0, kvh, row0, tid, sm_m, sm_l, sm_o)  # (no partials: o stands in, unused)

    return decode_chunked


def _resolve(problem, warps, lanes, rows, keys):
    return resolve_chunked(problem, rows, lanes, keys)


def _supports(problem, warps, lanes, rows, keys):
    return check_decode(problem, warps, lanes, rows, keys)


@register_phase(
    name="decode_chunked", order=30, title="Decode: block per (sequence, KV head), warps over KV chunks",
    parent="fused_rowwise", kind="decode",
    description="""
        One block per (sequence, KV head) computes all the query rows that read that
        KV head (GQA group × q_len ≤ 8). Warps take KV steps round-robin; a group of
        lanes takes one key with 16-byte loads, dots it with every query row
        (xor-shuffle sum within the group) and keeps a per-group online softmax;
        groups merge with shuffles, warps merge their partial (m, l, O) in shared
        memory. K and V are read once, coalesced.
    """,
    lineage="Decode attention as a batched GEMV (vLLM PagedAttention v1, Kwon et al. 2023; "
            "FlashInfer decode kernels), online softmax per warp and a block merge",
    planned_speedup=20.0,
    space={"warps": [4, 8], "rows": [1, 2, 4, 8], "keys": [0, 1, 2, 4]},
    sim_params={"warps": 2},
    supports=_supports,
    resolve=_resolve,
)
def decode_chunked(problem, warps=8, lanes=0, rows=4, keys=0):
    Hkv, Nq, Nk, D = problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    RB, L, T = rows, lanes, keys
    kern = make_kernel(D, vector_width(problem.dtype), L, T, warps, RB, Nq, G, problem.causal, max(1, 16 // warps))
    scale = float32(problem.sm_scale)
    grid = ((G * Nq + RB - 1) // RB, problem.batch * Hkv)

    def run(q, k, v, o, stream=0):
        check_alignment(k, v)
        kern[grid, warps * WARP_SIZE, stream](q, k, v, o, scale, Hkv, Nk)

    return Launch(run, kernels=[kern], notes=f"L={L} lanes/key, T={T} keys/group, {RB} rows/block, {warps} warps")
