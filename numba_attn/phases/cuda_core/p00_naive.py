"""Phase 0 — ``naive``: the unfused baseline.

Three kernels, as a framework without a fused attention kernel runs them:
``S = Q Kᵀ · scale`` (one thread per element of S), ``P = softmax(S)`` (one
warp per row, shuffle reductions) and ``O = P V`` (one thread per element of
O), with S and P in global memory: at B=1, H=32, N=4096 that is 2 GiB written
and read twice, which is what every later phase avoids.

Prediction: none; this is the baseline every later phase is measured against.

Verdict: 191.6 ms at B1 H32 N4096 D64 fp32 (H200) [results/roadmap-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32

from numba_attn.gpu.device_functions import NEG_INF
from numba_attn.gpu.jit import device, kernel
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.sinks import lse_parts, stages_for, with_lse
from numba_attn.variants.stages import PLAIN
from numba_attn.gpu.warp import WARP_SIZE, warp_max, warp_sum

ROWS_PER_BLOCK = 4  # softmax: one warp per row, 4 rows per block
TILE_X, TILE_Y = 32, 8  # thread block of the two GEMM kernels


@device
def element():
    """The element (column, row, batch·head) of S or O a thread of the two GEMM kernels computes."""
    return (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y,
            cuda.blockIdx.z)


@functools.cache
def make_kernels(D: int, causal: bool, stage=PLAIN):
    LSE, store_lse, _ = lse_parts(stage)

    @kernel
    def scores(q, k, s, scale, H, G, Nq, Nk, mods):
        """S[bh, i, j] = scale · Σ_d Q[bh, i, d] K[kvh, j, d]  (or −inf if masked)."""
        j, i, bh = element()
        if i >= Nq or j >= Nk:
            return
        kvh = (bh // H) * (H // G) + (bh % H) // G
        if causal and j > i + Nk - Nq:
            s[bh, i, j] = NEG_INF
            return
        b, h, q_idx = bh // H, bh % H, i + Nk - Nq
        if not stage.visible(b, h, q_idx, j, mods):  # a variant's mask
            s[bh, i, j] = NEG_INF
            return
        acc = float32(0.0)
        for d in range(D):
            acc += float32(q[bh, i, d]) * float32(k[kvh, j, d])
        s[bh, i, j] = stage.modified(acc * scale, b, h, q_idx, j, mods)

    @kernel
    def softmax(s, Nq, Nk, mods):
        """P[bh, i, :] = softmax(S[bh, i, :]) in place; one warp per row (and, with a log-sum-exp stage, the
        row's log-sum-exp from its max and sum)."""
        lane = cuda.threadIdx.x
        i = cuda.blockIdx.x * ROWS_PER_BLOCK + cuda.threadIdx.y
        bh = cuda.blockIdx.y
        if i >= Nq:  # whole warps leave together: the shuffles stay convergent
            return
        m = NEG_INF
        for j in range(lane, Nk, WARP_SIZE):
            m = max(m, s[bh, i, j])
        m = stage.finite_max(warp_max(m))  # a variant: a row that sees no key (all -inf) gives P = 0
        total = float32(0.0)
        for j in range(lane, Nk, WARP_SIZE):
            total += math.exp(s[bh, i, j] - m)
        l = warp_sum(total)
        inv = stage.inverse_l(m, l)
        if LSE and lane == 0:
            store_lse(mods, bh, i, m, l)
        for j in range(lane, Nk, WARP_SIZE):
            s[bh, i, j] = math.exp(s[bh, i, j] - m) * inv

    @kernel
    def pv(p, v, o, H, G, Nq, Nk):
        """O[bh, i, d] = Σ_j P[bh, i, j] V[kvh, j, d]."""
        d, i, bh = element()
        if i >= Nq or d >= D:
            return
        kvh = (bh // H) * (H // G) + (bh % H) // G
        acc = float32(0.0)
        for j in range(Nk):
            acc += p[bh, i, j] * float32(v[kvh, j, d])
        o[bh, i, d] = acc

    return scores, softmax, pv


@register_phase(
    name="naive", order=0, title="Unfused: S and P in global memory",
    parent=None,
    description="""
        Baseline. S = QKᵀ·scale is written to global memory by one kernel, a
        second kernel turns it into P = softmax(S) in place, a third computes
        O = PV. Every intermediate makes a round trip through HBM and the GEMMs
        read their operands from global memory with no reuse in shared memory.
    """,
    lineage="Standard attention as a GEMM → softmax → GEMM pipeline (Vaswani et al. 2017)",
    planned_speedup=1.0,
    variants=True,
    lse=True,
)
def naive(problem):
    B, H, Nq, Nk, D = problem.batch, problem.heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    scores, softmax, pv = make_kernels(D, problem.causal, stages_for(problem))
    kernel_mods = KernelMods(problem, None, None)
    scale = float32(problem.sm_scale)
    s = cuda.device_array((B * H, Nq, Nk), dtype="float32")
    grid_s = ((Nk + TILE_X - 1) // TILE_X, (Nq + TILE_Y - 1) // TILE_Y, B * H)
    grid_p = ((Nq + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK, B * H)
    grid_o = ((D + TILE_X - 1) // TILE_X, (Nq + TILE_Y - 1) // TILE_Y, B * H)

    def run(q, k, v, o, stream=0, mods=None, lse=None):
        mods = kernel_mods(stream=stream) if mods is None else mods
        scores[grid_s, (TILE_X, TILE_Y), stream](q, k, s, scale, H, G, Nq, Nk, mods)
        softmax[grid_p, (WARP_SIZE, ROWS_PER_BLOCK), stream](s, Nq, Nk, with_lse(mods, lse))
        pv[grid_o, (TILE_X, TILE_Y), stream](s, v, o, H, G, Nq, Nk)

    variant = problem.variant is not None
    return Launch(run, kernels=[scores, softmax, pv], workspace_bytes=s.nbytes,
                  kernel_mods=kernel_mods if variant else None, replayable=not variant)
