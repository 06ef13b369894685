"""Phase 30 — ``decode_chunked``: decode (q_len 1–8) as a bandwidth-bound GEMV.

Change against ``fused_rowwise`` (one thread per query row): one block per (sequence, KV head) computes every
query row that reads it (GQA group × q_len), so each K/V row is read once. The warps take the keys in steps,
round-robin; a group of ``L`` lanes takes one key with 16-byte loads, dots it with every query row (an
xor-shuffle sum over the group) and keeps its own online softmax; the groups of a warp merge by shuffles, the
warps through shared memory (``steps.py``). Causal with q_len > 1 is bottom-right aligned (``scores.py``).

Prediction: a full grid near the copy bandwidth (≥ 70%); B=1 only ~25–35% of it (32 blocks on 132 SMs).
Verdict: 28–31% of the copy bandwidth at B=1 fp16, 102–109% at B=8 and B=32, as predicted (docs/decode-notes.md).
"""
from __future__ import annotations

import functools

from numba import cuda, float32, int32

from numba_attn.gpu.jit import kernel
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.launch import launch_mods, tile_notes, variant_mods
from numba_attn.phases.decode.rules import check_alignment, check_decode, resolve_chunked, vector_width
from numba_attn.phases.decode.steps import chunk_steps
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.variants.sinks import stages_for, with_lse
from numba_attn.variants.stages import PLAIN


@functools.cache
def make_kernel(D: int, VW: int, LANES: int, KEYS: int, WARPS: int, ROWS: int, Nq: int, G: int, causal: bool,
                MIN_BLOCKS: int = 1, stage=PLAIN):
    load_rows, load_keys, score_update, merge_lanes, write_rows, _ = chunk_steps(D, VW, LANES, KEYS, WARPS, ROWS, Nq,
                                                                                 G, causal, stage=stage)
    E = D // LANES  # elements of a row per lane
    KEYS_PER_STEP = (WARP_SIZE // LANES) * KEYS  # keys per warp step: T keys per group
    THREADS = WARPS * WARP_SIZE

    @kernel(launch_bounds=(THREADS, MIN_BLOCKS))
    def decode_chunked(q, k, v, o, scale, Hkv, Nk, mods):
        sm_m = cuda.shared.array((WARPS, ROWS), float32)
        sm_l = cuda.shared.array((WARPS, ROWS), float32)
        sm_o = cuda.shared.array((WARPS, ROWS, D), float32)
        Qr = cuda.local.array((ROWS, E), float32)
        acc = cuda.local.array((ROWS, E), float32)
        m = cuda.local.array(ROWS, float32)
        l = cuda.local.array(ROWS, float32)
        lim = cuda.local.array(ROWS, int32)
        K_j = cuda.local.array((KEYS, E), float32)
        V_j = cuda.local.array((KEYS, E), float32)
        sc = cuda.local.array((ROWS, KEYS), float32)
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        row0 = cuda.blockIdx.x * ROWS  # first of this block's query rows (g * Nq + i)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // LANES
        sub = lane % LANES
        load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, Nk, Nk)
        n_steps = (Nk + KEYS_PER_STEP - 1) // KEYS_PER_STEP
        for step in range(w, n_steps, WARPS):  # warp-uniform: the shuffles stay convergent
            j0 = step * KEYS_PER_STEP + grp  # this group's keys: j0 + t * KW
            load_keys(k, v, K_j, V_j, kvh, j0, Nk, sub)
            score_update(Qr, K_j, V_j, sc, m, l, acc, lim, j0, (kvh, row0, Hkv, Nk), mods)
        merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub)
        cuda.syncthreads()
        write_rows(o, o, o, 0, kvh, row0, tid, sm_m, sm_l, sm_o, mods)  # (no partials: o stands in, unused)

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
    variants=True,
    lse=True,
    supports=_supports,
    resolve=_resolve,
)
def decode_chunked(problem, warps=8, lanes=0, rows=4, keys=0):
    Hkv, Nq, Nk, D = problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    kern = make_kernel(D, vector_width(problem.dtype), lanes, keys, warps, rows, Nq, G, problem.causal,
                       max(1, 16 // warps), stages_for(problem))
    scale = float32(problem.sm_scale)
    grid = ((G * Nq + rows - 1) // rows, problem.batch * Hkv)

    kernel_mods = variant_mods(problem)

    def run(q, k, v, o, stream=0, mods=None, lse=None):
        check_alignment(k, v)
        kern[grid, warps * WARP_SIZE, stream](q, k, v, o, scale, Hkv, Nk,
                                              with_lse(kernel_mods(stream=stream) if mods is None else mods, lse))

    return Launch(run, kernels=[kern], notes=tile_notes(lanes, keys, rows, warps), **launch_mods(kernel_mods))
