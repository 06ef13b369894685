"""Phase 4 — ``segmented_out``: the output accumulator split into segments.

Change against ``q_smem``: a query row is no longer one thread's. Its D
output columns are split into NSEG = D/SEG segments and each of NSEG
threads owns SEG columns of O in registers (``O_seg``, SEG floats, loops
over compile-time SEG: registers, no local-memory array). Every one of these
threads still needs the row's scores, so each computes the full dot product
``Q_i · K_j`` itself: K is re-read (and QKᵀ recomputed) once per segment.
Thread ``tid`` of the Br·NSEG threads takes row ``tid % Br`` and segment
``tid // Br``; with Br a multiple of 32 a warp holds one segment, so its K
and V reads stay broadcasts.

The trade-off, SEG as the parameter:

* registers: O costs SEG instead of D registers per thread;
* work: QKᵀ is done NSEG times (FLOPs per key and row: 2·D·NSEG + 2·D
  instead of 4·D), and the exps of the online softmax NSEG times;
* parallelism: NSEG times more threads per block (more warps to hide
  shared-memory latency).

SEG = D reproduces the parent. At D=128 the parent holds 128 accumulators
per thread (~170 registers); SEG=64 halves that at the price of 1.5× the
FLOPs, SEG=32 of 2.5×.

Prediction (before measuring): at D=64 SEG=32 is ~1.2× q_smem (twice the
warps, 1.5× the FLOPs, fewer registers); SEG=16 is slower than SEG=32 (2.5×
the FLOPs). At D=128 SEG=64 ~1.3× q_smem.

Measured (NVIDIA H200, numba-cuda 0.30.4, B1 H32 N4096 fp32, median of events-timed back-to-back
launches; one run of commit dcebff6, ``bench/dev/roadmap_final_h200.jsonl``; in the same run naive
191.4 ms at D=64 and 379.3 ms at D=128, SDPA fp32 3.99 ms and 6.09 ms):

* D=64 (Br=64): SEG=64 (one thread per row) 44.90 ms, SEG=32 68.99 ms,
  SEG=16 130.36 ms (``roadmap_tune1_h200.jsonl``); registers 128, 128, 96.
* D=128: SEG=128 112.64 ms (168 registers), SEG=64 146.66 ms (128),
  SEG=32 257.1 ms (tune1).
* Each halving of SEG costs 1.5–1.9×: the recomputed QKᵀ and exps are paid
  in full, and fewer registers buy nothing once ``q_smem`` has removed the
  spill. The prediction (SEG=32 ~1.2× q_smem) missed: SEG=32 is 0.52× of
  q_smem at D=64. The best measured configuration is SEG = D, i.e. no split,
  so the default is SEG=128 (SEG = D for every head_dim up to 128). SEG stays
  the parameter of the trade-off.
* At SEG = D this kernel is q_smem with Br=64 plus a run-time column offset
  ``c0``. It is still 15% slower than q_smem at Br=64 (44.90 against
  38.06 ms): the ``V_j[jj, c0 + c]`` reads lose their constant offsets.
  Against q_smem's default (Br=128): 0.80×.
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.device_functions import NEG_INF, load_tile, online_softmax_step, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, load_tile_t_scaled, smem_reason
from numba_attn.phases.registry import Launch, register_phase


def smem_floats(D, Br, Bc):
    return D * Br + 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, SEG: int, causal: bool):
    K_OFF = D * Br
    V_OFF = K_OFF + Bc * D
    NT = Br * (D // SEG)

    @kernel
    def segmented_out(q, k, v, o, scale, H, G, Nq, Nk):
        Q_t = dynamic_tile(0, D, Br)  # Qᵀ · scale
        K_j = dynamic_tile(K_OFF, Bc, D)
        V_j = dynamic_tile(V_OFF, Bc, D)
        tid = cuda.threadIdx.x
        r = tid % Br  # the thread's query row in the block
        c0 = (tid // Br) * SEG  # first output column of its segment
        i = cuda.blockIdx.x * Br + r
        bh = cuda.blockIdx.y
        kvh = (bh // H) * (H // G) + (bh % H) // G
        row_ok = i < Nq
        load_tile_t_scaled(Q_t, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        for c in range(SEG):
            O_seg[c] = float32(0.0)
        m = NEG_INF
        l = float32(0.0)
        n_keys = visible_keys(i, Nq, Nk, causal)
        # keys any row of this block can see: the block's last row sees the most
        block_keys = visible_keys(min(cuda.blockIdx.x * Br + Br, Nq) - 1, Nq, Nk, causal)
        for j0 in range(0, block_keys, Bc):
            load_tile(K_j, k, kvh, j0, Nk, tid, NT)
            load_tile(V_j, v, kvh, j0, Nk, tid, NT)
            cuda.syncthreads()
            if row_ok:
                for jj in range(min(Bc, n_keys - j0)):
                    s = float32(0.0)  # the full score: every segment's thread recomputes it
                    for d in range(D):
                        s += Q_t[d, r] * K_j[jj, d]
                    m, l, corr, p = online_softmax_step(m, l, s)
                    for c in range(SEG):
                        O_seg[c] = O_seg[c] * corr + p * V_j[jj, c0 + c]
            cuda.syncthreads()
        if row_ok:
            inv_l = float32(1.0) / l
            for c in range(SEG):
                o[bh, i, c0 + c] = O_seg[c] * inv_l

    return segmented_out


def n_segments(D, SEG):
    return D // min(SEG, D)


def _supports(problem, Br, Bc, SEG):
    D = problem.head_dim
    if Br % 32:
        return f"Br={Br} must be a multiple of 32 (whole warps per segment)"
    if D % min(SEG, D):
        return f"SEG={SEG} must divide head_dim {D}"
    if Br * n_segments(D, SEG) > 1024:
        return f"Br·D/SEG = {Br * n_segments(D, SEG)} threads per block > 1024"
    return smem_reason(4 * smem_floats(D, Br, Bc))


@register_phase(
    name="segmented_out", order=4, title="Output split into register segments",
    parent="q_smem",
    description="""
        D/SEG threads per query row, each owning SEG columns of O in registers and
        recomputing the row's scores (K re-read once per segment): fewer registers and
        more warps for more QKᵀ work. SEG is the parameter of the trade-off.
    """,
    lineage="Splitting the head dimension across threads, as in FlashAttention-2's "
            "work partitioning (Dao 2023) but without sharing the scores",
    planned_speedup=7.0,
    sim_params={"Br": 32, "Bc": 16, "SEG": 8},
    supports=_supports,
)
def segmented_out(problem, Br=64, Bc=32, SEG=128):
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    SEG = min(SEG, problem.head_dim)
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, problem.causal)
    NT = Br * n_segments(problem.head_dim, SEG)
    scale = float32(problem.sm_scale)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)
    smem = 4 * smem_floats(problem.head_dim, Br, Bc)

    def run(q, k, v, o, stream=0):
        launch_dynamic(kern, grid, NT, stream, smem, q, k, v, o, scale, H, problem.group, Nq, Nk)

    return Launch(run, kernels=[kern])
