"""Phase 9 — ``register_blocked``: micro-tiles of S and O in registers.

Change against ``double_buffer``: the work of a block is no longer split by
query row. Each thread computes a TM×TN micro-tile of the score tile S
(TM query rows × TN keys) and a TM×TD micro-tile of the output O (TM rows ×
TD = D·TN/Bc columns), both held in registers:

* S = Q Kᵀ as outer products: for each d the thread loads a Q fragment (TM
  values) and a K fragment (TN values) with 16-byte shared loads and does
  TM·TN FMAs, so a value read from shared memory serves TN (or TM) FMAs
  instead of one. Q and K sit transposed in shared memory (Qᵀ: D × Br,
  Kᵀ: D × Bc) so both fragments are contiguous; a warp's lanes read 4 Q
  pieces and 8 K pieces (broadcasts, no bank conflict).
* tile-wise online softmax: one rescale per tile and row instead of one per
  key. The row maximum of the tile is reduced over the KG = Bc/TN lanes that
  share the rows (xor shuffles inside the warp), then
  ``online_softmax_rescale2`` (base 2: log2(e) is folded into the Q scale,
  so p = exp2(s − m) is one ex2 per score). The running sum l stays a
  per-thread partial sum and is reduced once at the end.
* P goes through shared memory (Pᵀ: Bc × Br) and O += P V is again an outer
  product per key: a P fragment (TM) and a V fragment (TD) per FMA block.
* the K/V double buffering of the parent (register staging, two shared
  stages) is kept; K is staged transposed.

Per thread and tile the inner loops issue one 16-byte shared load per
TM·TN/2 (S) or TM·TD/(TM/4 + TD/4) (O) FMAs, instead of one shared load
per FMA (or per 4 FMAs with the parent's vector loads): the kernel should
move from shared-memory-issue-bound to FFMA-bound.

Prediction (written before measuring): the parent runs at ~6 TFLOP/s at
B1 H32 N4096 D64 fp32 (one shared load per 4 FMAs and per-key exps);
this phase should reach 25–30 TFLOP/s on an H200 (FFMA ceiling ≈ 44 in
numba, ~85% of the issued instructions FFMA), i.e. ≥ 0.75× SDPA fp32
(≈ 34 TFLOP/s) and 30× the naive baseline. Registers ≈ 100–128 with
TM = TN = 4, no local memory.

Causal: the loop stops at the last key the block's last row sees (as in
every phase since ``smem_kv``); every element of every tile is compared
with its row's causal limit and with kv_len. ``causal_skip`` masks only the
tiles that need it.

Measured (NVIDIA H200, numba-cuda 0.30.4, B1 H32 N4096 fp32, median of events-timed back-to-back
launches; one run of commit dcebff6, ``bench/dev/roadmap_final_h200.jsonl``; in the same run naive
191.4 ms at D=64 and 379.3 ms at D=128, SDPA fp32 3.99 ms and 6.09 ms):

* D=64, default (Br=128, Bc=32, TM=4, TN=8): **4.255 ms = 32.30 TFLOP/s =
  0.94× SDPA fp32** (3.990 ms, 34.45 TFLOP/s), **45.0× naive** and 1.56×
  double_buffer. That is 57% of the numba FFMA ceiling measured in the same
  run (56.8 TFLOP/s). 235 registers, no local memory. Both targets are met
  (≥ 0.75× SDPA, ≥ 30× naive).
* Other tiles at D=64: TN=4 4.401 ms (127 registers); Br=128 Bc=64 TN=8
  5.399; Br=64 Bc=64 TN=8 5.196; Br=128 TM=8 TN=4 4.425 and Br=64 Bc=32 TN=4
  5.620 (both tune1). ``maxreg=168`` gave 4.202 ms, but ptxas still reported
  235 registers: the cap did not apply. That difference is row-to-row
  variation, not the parameter.
* D=128 (TN=4 by the TN=0 rule): 9.630 ms = 28.55 TFLOP/s = **0.63× SDPA**
  (6.093 ms), 199 registers, no local memory. With Bc=64 (512 threads)
  9.612 ms, but the launch bounds cap registers at 128 and 56 bytes spill.
  TN=8 spills at D=128 (offline: 255 registers, 232-byte stack), hence the
  rule.
* Causal, D=64: 2.657 ms = 25.87 TFLOP/s = 0.86× SDPA causal (2.294 ms).
* The prediction (25–30 TFLOP/s) was exceeded (32.3), but from a stronger
  parent than predicted: double_buffer ran at 20.65 TFLOP/s, not ~6 (its
  16-byte accessors removed more index arithmetic than expected, see
  ``vectorized``), so this step's own gain is 1.56×. Registers (235) are far
  above the predicted 100–128: ptxas unrolls the d loop 8× and keeps
  fragments of several steps in flight. The predicted ~85% FFMA came out at
  ~76%. SASS (same main loop as causal_skip): the QKᵀ loop
  is 256 FFMA, 24 LDS.128 and 7 others per 8 steps of d (89% FFMA); the PV
  loop is 64 FFMA, 5 LDS.128 and 9 others per key (82%); about 76% of a
  tile's instructions are FFMA. The rest of the gap to the FFMA ceiling is
  latency: at 235 registers an SM holds 2 blocks of 4 warps.
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32

from numba_attn.gpu.device_functions import LOG2E, online_softmax_rescale2, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import (MASKED, dynamic_tile, fetch4, fetch4_t, launch_dynamic, lds4, load_tile4_t, put4,
                         put4_t, smem_reason, sts4)
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.gpu.warp import FULL_MASK, WARP_SIZE, shfl_xor_sync


def auto_tn(D):
    """TN=0 in the parameters: 8 keys per thread up to head_dim 64, 4 above (with TN=8
    and Bc=32 a thread holds D/4 output columns per row: 128 accumulators at D=128,
    which spill)."""
    return 8 if D <= 64 else 4


def geometry(D, Br, Bc, TM, TN):
    """Derived sizes: key groups, threads, O columns per thread, shared floats."""
    KG = Bc // TN
    NT = (Br // TM) * KG
    TD = D // KG
    smem_floats = D * Br + 2 * D * Bc + 2 * Bc * D + Bc * Br
    return KG, NT, TD, smem_floats


@functools.cache
def make_kernel(D: int, Br: int, Bc: int, TM: int, TN: int, maxreg: int, causal: bool):
    KG, NT, TD, _ = geometry(D, Br, Bc, TM, TN)
    QC, KC, DC = TM // 4, TN // 4, TD // 4  # 16-byte chunks of the Q, K and O/V fragments
    KSTRIDE = 4 * KG  # a thread's key chunks (and O column chunks) are KSTRIDE apart
    STAGE = (Bc * D // 4 + NT - 1) // NT * 4  # floats staged per thread and tile (K, and V)
    QT_OFF = 0
    KT_OFF = QT_OFF + D * Br
    V_OFF = KT_OFF + 2 * D * Bc
    PT_OFF = V_OFF + 2 * Bc * D

    # launch_bounds: ptxas keeps the registers within what one block of NT threads may
    # use; maxreg (0: no cap) trades registers for occupancy
    @kernel(launch_bounds=NT, max_registers=maxreg or None)
    def register_blocked(q, k, v, o, scale2, H, G, Nq, Nk):
        Q_t = dynamic_tile(QT_OFF, D, Br)  # Qᵀ, pre-scaled by scale·log2(e)
        P_t = dynamic_tile(PT_OFF, Bc, Br)  # Pᵀ of the current tile
        tid = cuda.threadIdx.x
        rg = tid // KG  # row group: rows rg·TM .. rg·TM+TM-1
        kg = tid - rg * KG  # key group (S) = column group (O)
        row0 = cuda.blockIdx.x * Br
        bh = cuda.blockIdx.y
        kvh = (bh // H) * (H // G) + (bh % H) // G
        off = Nk - Nq
        load_tile4_t(Q_t, q, bh, row0, Nq, scale2, tid, NT, Br, D)
        block_keys = visible_keys(min(row0 + Br, Nq) - 1, Nq, Nk, causal)

        acc = cuda.local.array((TM, TD), float32)
        s = cuda.local.array((TM, TN), float32)
        m = cuda.local.array(TM, float32)
        l = cuda.local.array(TM, float32)
        corr = cuda.local.array(TM, float32)
        qf = cuda.local.array(TM, float32)
        kf = cuda.local.array(TN, float32)
        vf = cuda.local.array(TD, float32)
        for a in range(TM):
            m[a] = MASKED
            l[a] = float32(0.0)
            for c in range(TD):
                acc[a, c] = float32(0.0)
        stage_k = cuda.local.array(STAGE, float32)
        stage_v = cuda.local.array(STAGE, float32)
        fetch4_t(stage_k, k, kvh, 0, Nk, tid, NT, Bc, D)
        fetch4(stage_v, v, kvh, 0, Nk, tid, NT, Bc, D)
        put4_t(dynamic_tile(KT_OFF, D, Bc), stage_k, tid, NT, Bc, D)
        put4(dynamic_tile(V_OFF, Bc, D), stage_v, tid, NT, Bc, D)

        for j0 in range(0, block_keys, Bc):
            st = (j0 // Bc) & 1
            K_t = dynamic_tile(KT_OFF + st * (D * Bc), D, Bc)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 visible; everyone is done with the other stage and with P_t
            has_next = j0 + Bc < block_keys
            if has_next:  # global loads of the next tile in flight during this tile's math
                fetch4_t(stage_k, k, kvh, j0 + Bc, Nk, tid, NT, Bc, D)
                fetch4(stage_v, v, kvh, j0 + Bc, Nk, tid, NT, Bc, D)

            # S micro-tile = Q[rows] · K[keys]ᵀ, outer products over d
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = float32(0.0)
            d = 0
            while d < D:  # hot loops are `while` loops: numba's range() hides the trip count from LLVM
                for c in range(QC):
                    x = lds4(Q_t, d, rg * TM + 4 * c)
                    for u in range(4):
                        qf[4 * c + u] = x[u]
                for c in range(KC):
                    x = lds4(K_t, d, c * KSTRIDE + kg * 4)
                    for u in range(4):
                        kf[4 * c + u] = x[u]
                for a in range(TM):
                    for b in range(TN):
                        s[a, b] += qf[a] * kf[b]
                d += 1

            # mask, tile-wise online softmax, P to shared memory
            for a in range(TM):
                i = row0 + rg * TM + a
                lim = min(Nk, i + off + 1) if causal else Nk
                tmax = MASKED
                for b in range(TN):
                    j = j0 + (b // 4) * KSTRIDE + kg * 4 + (b % 4)
                    if j >= lim:
                        s[a, b] = MASKED
                    tmax = max(tmax, s[a, b])
                w = KG // 2
                while w > 0:
                    tmax = max(tmax, shfl_xor_sync(FULL_MASK, tmax, w))
                    w //= 2
                m[a], l[a], corr[a] = online_softmax_rescale2(m[a], l[a], tmax)
                for b in range(TN):
                    p = math.exp2(s[a, b] - m[a])
                    s[a, b] = p
                    l[a] += p
            for b in range(TN):
                col = (b // 4) * KSTRIDE + kg * 4 + (b % 4)
                for c in range(QC):
                    sts4(P_t, col, rg * TM + 4 * c, s[4 * c, b], s[4 * c + 1, b], s[4 * c + 2, b], s[4 * c + 3, b])
            cuda.syncthreads()  # P_t visible

            # O micro-tile = corr · O + P[rows] · V[:, cols]
            for a in range(TM):
                for c in range(TD):
                    acc[a, c] *= corr[a]
            j = 0
            while j < Bc:
                for c in range(QC):
                    x = lds4(P_t, j, rg * TM + 4 * c)
                    for u in range(4):
                        qf[4 * c + u] = x[u]
                for c in range(DC):
                    x = lds4(V_j, j, c * KSTRIDE + kg * 4)
                    for u in range(4):
                        vf[4 * c + u] = x[u]
                for a in range(TM):
                    for c in range(TD):
                        acc[a, c] += qf[a] * vf[c]
                j += 1

            if has_next:  # the other stage was last read before this tile's first barrier
                put4_t(dynamic_tile(KT_OFF + (1 - st) * (D * Bc), D, Bc), stage_k, tid, NT, Bc, D)
                put4(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), stage_v, tid, NT, Bc, D)

        for a in range(TM):
            w = KG // 2
            lsum = l[a]
            while w > 0:
                lsum += shfl_xor_sync(FULL_MASK, lsum, w)
                w //= 2
            i = row0 + rg * TM + a
            if i < Nq:
                inv_l = float32(1.0) / lsum
                for c in range(TD):
                    o[bh, i, (c // 4) * KSTRIDE + kg * 4 + (c % 4)] = acc[a, c] * inv_l

    return register_blocked


def _supports(problem, Br, Bc, TM, TN, maxreg):
    D = problem.head_dim
    TN = TN or auto_tn(D)
    if TM % 4 or TN % 4:
        return f"TM={TM} and TN={TN} must be multiples of 4 (16-byte fragments)"
    if Br % TM or Bc % TN:
        return f"Br={Br} must be a multiple of TM={TM} and Bc={Bc} of TN={TN}"
    KG, NT, TD, smem = geometry(D, Br, Bc, TM, TN)
    if KG > WARP_SIZE or WARP_SIZE % KG:
        return f"Bc/TN = {KG} key groups must divide the warp size (row reductions stay in a warp)"
    if NT % WARP_SIZE or NT > 1024:
        return f"{NT} threads per block: must be a multiple of 32 and at most 1024"
    if D % KG or TD % 4:
        return f"head_dim {D} must split into {KG} column groups of a multiple of 4 (TD={D / KG:g})"
    return smem_reason(smem * 4)


@register_phase(
    name="register_blocked", order=9, title="Register-blocked micro-tiles of S and O",
    parent="double_buffer",
    description="""
        Each thread computes a TM×TN micro-tile of S and a TM×TD micro-tile of O in
        registers from 16-byte fragments of Qᵀ, Kᵀ, Pᵀ and V in shared memory (outer
        products), with a tile-wise online softmax in base 2 (one rescale per tile and
        row, log2(e) folded into the Q scale). K/V stay double-buffered.
    """,
    lineage="Register blocking of SGEMM (Volkov & Demmel 2008; CUTLASS thread-level tiles) "
            "applied to both GEMMs of FlashAttention-2 (Dao 2023) on CUDA cores",
    planned_speedup=60.0,
    sim_params={"Br": 32, "Bc": 16, "TM": 4, "TN": 4, "maxreg": 0},
    supports=_supports,
)
def register_blocked(problem, Br=128, Bc=32, TM=4, TN=0, maxreg=0):
    H, Nq, Nk, D = problem.heads, problem.q_len, problem.kv_len, problem.head_dim
    TN = TN or auto_tn(D)
    kern = make_kernel(D, Br, Bc, TM, TN, maxreg, problem.causal)
    _, NT, _, smem = geometry(D, Br, Bc, TM, TN)
    scale2 = float32(problem.sm_scale * LOG2E)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)

    def run(q, k, v, o, stream=0):
        launch_dynamic(kern, grid, NT, stream, smem * 4, q, k, v, o, scale2, H, problem.group, Nq, Nk)

    return Launch(run, kernels=[kern])
