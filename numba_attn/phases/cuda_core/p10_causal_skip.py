"""Phase 10 — ``causal_skip``: only the tiles that cross the diagonal are masked.

Change against ``register_blocked``: the parent compares every score of
every tile with its row's causal limit and with kv_len. Here a tile is
classified once per block:

* fully masked for every row of the block (keys past the block's last row's
  limit): never visited — the loop bound, inherited since ``smem_kv``;
* fully visible to every row of the block (its last key ≤ the first row's
  limit and < kv_len): the scores go to the softmax without any comparison;
* crossing the diagonal (or the end of the keys): masked element by element
  as before. For a causal square problem with Br = 128, Bc = 32 that is
  4–5 tiles per block out of up to 128.

With causal masking the blocks' costs differ (block x visits ~x+1 tiles),
so the grid is also walked heaviest-first (``heavy_first``): the longest
blocks start in the first wave and the short ones fill the tail.

Prediction (before measuring): without causal, ~1.03× register_blocked at
N=4096 (the compare/select per score is ~3 instructions per 2·D FMAs; the
last tile is full at N=4096). With causal ~1.1× (masking cost gone from
the interior tiles, better tail).

Measured (NVIDIA H200, numba-cuda 0.30.4, B1 H32 N4096 fp32, median of events-timed back-to-back
launches; one run of commit dcebff6, ``bench/dev/roadmap_final_h200.jsonl``; in the same run naive
191.4 ms at D=64 and 379.3 ms at D=128, SDPA fp32 3.99 ms and 6.09 ms):

* D=64: 4.363 ms (31.50 TFLOP/s, 241 registers) against register_blocked's
  4.255 ms: **0.975×**. Causal: 2.665 against 2.657 ms, **1.00×** (25.79
  TFLOP/s, 0.86× SDPA causal; heavy_first=0: 2.717 ms, so heaviest-first is
  worth 2%).
* D=128: 9.756 against 9.630 ms (0.99×). Causal: 5.543 ms = 24.80 TFLOP/s
  (0.58× SDPA causal, 3.225 ms).
* float16 storage, fp32 accumulation: D=64 4.788 ms (28.71 TFLOP/s), D=128
  11.226 ms (24.49 TFLOP/s), relative error 2.1e-4. That is 10–15% slower
  than float32. The loads are 8 bytes plus four conversions each; the cause
  of the difference was not analyzed further.
* Prediction (1.03× without causal, 1.1× with) missed: no gain. The parent's
  per-score mask was already under 1% of a tile's instructions (the SASS
  holds 32 FSEL per tile against ~4100 FFMA per thread), and the second code
  path costs 6 registers. Skipping the fully masked tiles is what makes
  causal 1.6× faster than non-causal (2.67 against 4.36 ms for about half the
  pairs), and that skip was inherited from smem_kv's loop bound. The best
  phase is therefore ``register_blocked``; this one is kept as the measured
  answer to "does masking only the diagonal pay" (not on CUDA cores at these
  tile sizes).
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
def make_kernel(D: int, Br: int, Bc: int, TM: int, TN: int, maxreg: int, heavy_first: bool, causal: bool):
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
    def causal_skip(q, k, v, o, scale2, H, G, Nq, Nk):
        Q_t = dynamic_tile(QT_OFF, D, Br)  # Qᵀ, pre-scaled by scale·log2(e)
        P_t = dynamic_tile(PT_OFF, Bc, Br)  # Pᵀ of the current tile
        tid = cuda.threadIdx.x
        rg = tid // KG  # row group: rows rg·TM .. rg·TM+TM-1
        kg = tid - rg * KG  # key group (S) = column group (O)
        bx = cuda.gridDim.x - 1 - cuda.blockIdx.x if heavy_first else cuda.blockIdx.x
        row0 = bx * Br
        bh = cuda.blockIdx.y
        kvh = (bh // H) * (H // G) + (bh % H) // G
        off = Nk - Nq
        load_tile4_t(Q_t, q, bh, row0, Nq, scale2, tid, NT, Br, D)
        block_keys = visible_keys(min(row0 + Br, Nq) - 1, Nq, Nk, causal)
        full_keys = visible_keys(row0, Nq, Nk, causal)  # keys every row of the block sees

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

            # mask (diagonal and last tiles only), tile-wise online softmax, P to shared memory
            needs_mask = j0 + Bc > full_keys
            for a in range(TM):
                if needs_mask:
                    i = row0 + rg * TM + a
                    lim = min(Nk, i + off + 1) if causal else Nk
                    for b in range(TN):
                        j = j0 + (b // 4) * KSTRIDE + kg * 4 + (b % 4)
                        if j >= lim:
                            s[a, b] = MASKED
                tmax = MASKED
                for b in range(TN):
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

    return causal_skip


def _supports(problem, Br, Bc, TM, TN, maxreg, heavy_first):
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
    name="causal_skip", order=10, title="Mask only the diagonal tiles",
    parent="register_blocked",
    description="""
        Tiles every row of the block sees entirely skip the per-score mask; only tiles
        that cross the causal diagonal or the end of the keys are masked, fully masked
        tiles are never visited, and causal grids run heaviest blocks first.
    """,
    lineage="Causal tile skipping of FlashAttention-2 (Dao 2023): masking only the "
            "diagonal blocks, longest blocks scheduled first",
    planned_speedup=65.0,
    sim_params={"Br": 32, "Bc": 16, "TM": 4, "TN": 4, "maxreg": 0, "heavy_first": 1},
    supports=_supports,
)
def causal_skip(problem, Br=128, Bc=32, TM=4, TN=0, maxreg=0, heavy_first=1):
    H, Nq, Nk, D = problem.heads, problem.q_len, problem.kv_len, problem.head_dim
    TN = TN or auto_tn(D)
    kern = make_kernel(D, Br, Bc, TM, TN, maxreg, bool(heavy_first), problem.causal)
    _, NT, _, smem = geometry(D, Br, Bc, TM, TN)
    scale2 = float32(problem.sm_scale * LOG2E)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)

    def run(q, k, v, o, stream=0):
        launch_dynamic(kern, grid, NT, stream, smem * 4, q, k, v, o, scale2, H, problem.group, Nq, Nk)

    return Launch(run, kernels=[kern])
