"""Phase 6 — ``warp_specialized``: loader warps and compute warps.

Change against ``one_barrier``: the block gets LW extra warps that only load
K/V tiles; the Br·D/SEG compute threads never load K or V. While the
compute warps work on tile t from one stage, the loader warps fill the other
stage with tile t+1; the one barrier per tile (now over loaders and compute
warps) hands the stages over::

    loaders: load tile 0 → stage 0
    for t:  barrier
            loaders: load tile t+1 → stage (t+1)%2   |   compute: tile t from stage t%2

In the parent every warp first loads its share of tile t+1 and then
computes tile t; the global-load latency of that share sits in every warp's
critical path once per tile unless other blocks fill the gap. Here it
overlaps the compute warps' work by construction.

Costs: LW·32 more threads per block that hold no accumulators but still
occupy warp slots; the loaders must stream a tile (Bc·D·2 elements) in the
time the compute warps take for it, or the compute warps wait at the barrier.

Prediction (before measuring): with one shared load per FMA the compute
warps are issue-bound, not latency-bound, so the overlap buys little:
~1.05× one_barrier at LW=1 (LW=2 the same or worse).

Measured (NVIDIA H200, numba-cuda 0.30.4, B1 H32 N4096 fp32, median of events-timed back-to-back
launches; one run of commit dcebff6, ``bench/dev/roadmap_final_h200.jsonl``; in the same run naive
191.4 ms at D=64 and 379.3 ms at D=128, SDPA fp32 3.99 ms and 6.09 ms):

* D=64, SEG=64: LW=1 45.27 ms, LW=2 44.05 ms against one_barrier's 47.25 ms:
  **1.07×** with LW=2 (prediction 1.05×: met). SEG=32, LW=1: 68.19 against
  63.02 ms: 0.92×.
* D=128, LW=1: SEG=64 146.92 against 145.38 ms (0.99×); SEG=128 167.90
  against 226.53 ms (1.35×: there the loader warp is a third warp in a
  2-warp block).
* The overlap helps where the parent's blocks were too small to hide their
  own load latency. It does not help where the compute warps are issue-bound
  (SEG=32). Default SEG=64, LW=2: the best measured at D=64.
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.device_functions import NEG_INF, load_tile, online_softmax_step, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, load_tile_t_scaled, smem_reason
from numba_attn.phases.registry import Launch, register_phase


def smem_floats(D, Br, Bc):
    return D * Br + 2 * 2 * Bc * D


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, SEG: int, LW: int, causal: bool):
    K_OFF = D * Br
    V_OFF = K_OFF + 2 * Bc * D  # two stages each
    NT = Br * (D // SEG)  # compute threads; the LW loader warps come after them
    NL = 32 * LW

    @kernel
    def warp_specialized(q, k, v, o, scale, H, G, Nq, Nk):
        Q_t = dynamic_tile(0, D, Br)  # Qᵀ · scale
        tid = cuda.threadIdx.x
        r = tid % Br  # the thread's query row in the block
        c0 = (tid // Br) * SEG  # first output column of its segment
        i = cuda.blockIdx.x * Br + r
        bh = cuda.blockIdx.y
        kvh = (bh // H) * (H // G) + (bh % H) // G
        loader = tid >= NT
        lid = tid - NT  # loader lane
        row_ok = i < Nq and not loader
        load_tile_t_scaled(Q_t, q, bh, cuda.blockIdx.x * Br, Nq, scale, tid, NT + NL, Br, D)
        O_seg = cuda.local.array(SEG, float32)
        for c in range(SEG):
            O_seg[c] = float32(0.0)
        m = NEG_INF
        l = float32(0.0)
        n_keys = visible_keys(i, Nq, Nk, causal)
        # keys any row of this block can see: the block's last row sees the most
        block_keys = visible_keys(min(cuda.blockIdx.x * Br + Br, Nq) - 1, Nq, Nk, causal)
        if loader:
            load_tile(dynamic_tile(K_OFF, Bc, D), k, kvh, 0, Nk, lid, NL)
            load_tile(dynamic_tile(V_OFF, Bc, D), v, kvh, 0, Nk, lid, NL)
        for j0 in range(0, block_keys, Bc):
            st = (j0 // Bc) & 1
            K_j = dynamic_tile(K_OFF + st * (Bc * D), Bc, D)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 stored; every thread is done with the other stage
            if loader:
                if j0 + Bc < block_keys:
                    load_tile(dynamic_tile(K_OFF + (1 - st) * (Bc * D), Bc, D), k, kvh, j0 + Bc, Nk, lid, NL)
                    load_tile(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), v, kvh, j0 + Bc, Nk, lid, NL)
            elif row_ok:
                for jj in range(min(Bc, n_keys - j0)):
                    s = float32(0.0)  # the full score: every segment's thread recomputes it
                    for d in range(D):
                        s += Q_t[d, r] * K_j[jj, d]
                    m, l, corr, p = online_softmax_step(m, l, s)
                    for c in range(SEG):
                        O_seg[c] = O_seg[c] * corr + p * V_j[jj, c0 + c]
        if row_ok:
            inv_l = float32(1.0) / l
            for c in range(SEG):
                o[bh, i, c0 + c] = O_seg[c] * inv_l

    return warp_specialized


def n_segments(D, SEG):
    return D // min(SEG, D)


def _supports(problem, Br, Bc, SEG, LW):
    D = problem.head_dim
    if Br % 32:
        return f"Br={Br} must be a multiple of 32 (whole warps per segment)"
    if D % min(SEG, D):
        return f"SEG={SEG} must divide head_dim {D}"
    if LW < 1:
        return f"LW={LW}: at least one loader warp"
    if Br * n_segments(D, SEG) + 32 * LW > 1024:
        return f"Br·D/SEG + 32·LW = {Br * n_segments(D, SEG) + 32 * LW} threads per block > 1024"
    return smem_reason(4 * smem_floats(D, Br, Bc))


@register_phase(
    name="warp_specialized", order=6, title="Loader warps and compute warps",
    parent="one_barrier",
    description="""
        LW extra warps only load K/V tiles into the free stage while the compute warps
        work on the current one; one barrier per tile hands the stages over.
    """,
    lineage="Warp specialization (producer/consumer warps): CudaDMA (Bauer et al. 2011), "
            "FlashAttention-3 (Shah et al. 2024) on Hopper",
    planned_speedup=8.0,
    sim_params={"Br": 32, "Bc": 16, "SEG": 8, "LW": 1},
    supports=_supports,
)
def warp_specialized(problem, Br=64, Bc=32, SEG=64, LW=2):
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    SEG = min(SEG, problem.head_dim)
    kern = make_kernel(problem.head_dim, Br, Bc, SEG, LW, problem.causal)
    NT = Br * n_segments(problem.head_dim, SEG) + 32 * LW
    scale = float32(problem.sm_scale)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)
    smem = 4 * smem_floats(problem.head_dim, Br, Bc)

    def run(q, k, v, o, stream=0):
        launch_dynamic(kern, grid, NT, stream, smem, q, k, v, o, scale, H, problem.group, Nq, Nk)

    return Launch(run, kernels=[kern])
