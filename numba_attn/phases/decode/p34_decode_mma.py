"""Phase 34 — ``decode_mma``: the query rows of a KV head as one tensor-core tile.

Change against ``decode_split_k_lean``: the same split-K over blocks, the same
two-pass combine; what changes is how a block computes its split when
several query rows read one KV head (a GQA group × q_len, up to 16 rows):

* **Rows as an m16 tile.** The rows are the A operand of ``mma.sync
  m16n8k16`` (f16 in, f32 accumulate), padded with zero rows to 16. Scores
  for 16 keys are 16 mma over D=128 instead of ``rows × 16 keys × 128`` FMA
  on the CUDA cores, and P·V another 16 — the arithmetic of 4 rows per key,
  which kept ``decode_split_k_lean``'s loop at ~2.8 TB/s for GQA where one
  row per block streams at ~4.4 TB/s, moves to the tensor cores. Scores and
  P stay in registers (P is the A fragment of P·V, as in ``tc_pipelined``);
  the online softmax runs on the fragments (quad shuffles).
* **A cp.async ring per warp.** Each warp streams its own key tiles
  (``Bc`` keys, tiles w, w+W, … of the split) through ``stages`` swizzled
  shared buffers with ``cp.async``, so ``stages − 1`` tiles per warp are in
  flight while it computes (no register round trip, no block barrier in the
  loop: a warp waits for its own copies and ``syncwarp``s); K and V reach the
  fragments by ``ldmatrix`` (V transposed).
* **End of a split**: the warps merge their (m, l, O) through shared memory
  (the ring's space), as in ``decode_split_k``, and write the split's partial
  output and log-sum-exp; the splits are merged by the two-pass combine
  kernel (or, with ``fuse_max`` > 0 and ``S × rows ≤ fuse_max``, by the last
  block of a KV head, as in ``decode_split_k_lean``: measured slower here,
  so off by default).
* **The combine, cheaper**: it is
  compiled for the split count (``combine_splits_fixed``: all 2·S loads in
  flight at once, one L2 round trip), and on sm_90 it is a *programmatic
  dependent launch* (``numba_attn.gpu.pdl``): it is queued while the split kernel
  runs and waits in ``griddepcontrol.wait`` for it to complete, instead of
  being launched after it. ``pdl`` chooses when the split kernel lets it
  launch: 3 (default) when its blocks exit; 1 at their start and 2 after the
  loop measured slower (the combine's blocks then sit on the SMs for the
  whole split kernel).

Head dims: every multiple of 8 up to 256, padded as in ``tc_pipelined``: shared
rows to a power of two (≤ 8) or a multiple of 8 chunks, so the swizzle stays a
permutation (D=40/48 → 64 columns, 80/96/112 → 128, 160 → 192); an odd multiple
of 8 as the next multiple of 16 (a zero-filled chunk); the padding is never
written out.

Prediction: GQA (8 KV heads, group 4) B=1 32k fp16 from 52 µs
(``decode_split_k_lean``) to ~35 µs (the split kernel memory-bound like MHA,
plus the ~8 µs combine), faster than SDPA's 40 µs; B=8 from 310 to ~250 µs.
For one row per block (MHA) 15 of the 16 tile rows are padding: no gain.
Verdict: 0.0386 ms at B1 H32/8kv Nq1 Nk32768 D128 fp16 (H200), 1.28x decode_split_k_lean [results/decode-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import (LOG2E, NEG_BIG, combine_splits, fragment_rescale, fragment_softmax,
                                             merge_state, state_lse)
from numba_attn.gpu.intrinsics import cp_async16_flat, cp_async16_flat_l2_256, cp_async_commit, cp_async_wait, ldmatrix_x4, \
    ldmatrix_x4_trans, mma_f16, pack_f16x2
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.pdl import launch_after, launch_dependents, pdl_available, uses_griddepcontrol
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, smem_reason, swizzle_row_chunks
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.gpu.warp import WARP_SIZE, quad_sum, syncwarp
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan
from numba_attn.phases.decode.common import MAX_Q_LEN, check_alignment, split_workspace, zeroed_counters

FULL = 0xFFFFFFFF


@functools.cache
def make_kernel(D: int, W: int, Bc: int, stages: int, Nq: int, G: int, causal: bool, FINAL: bool, FUSED: bool,
                PDL: int = 0, L2PF: bool = False, EVEN: bool = False):
    NR = G * Nq  # query rows of a KV head (≤ 16: one m-tile)
    NTH = W * WARP_SIZE
    DW = D // 2  # 32-bit words per K/V row (global memory)
    DK = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps (D itself when a multiple of 16)
    KS = DK // 16  # k-steps of Q·Kᵀ
    NT = Bc // 8  # n-tiles of S
    NP = Bc // 16  # n-tile pairs (one ldmatrix.x4 per k-step)
    KK = Bc // 16  # k-steps of P·V
    DT = D // 8  # n-tiles of O written out
    DTK = DK // 8  # n-tiles of O computed (the padding's stay zero)
    DP = DK // 16  # d-tile pairs (one ldmatrix.x4.trans per k-step)
    VEC = D // 8  # 16-byte chunks per row in global memory
    CVEC = DK // 8  # chunks per row copied (past VEC: zero-filled)
    SDW = 4 * swizzle_row_chunks(D)  # words per shared row (padded so the swizzle is a permutation)
    SWM = min(8, SDW // 4) - 1
    CPL = Bc * CVEC // WARP_SIZE  # chunks per lane per tile (K and V each)
    RING = 2 * stages * Bc  # K/V rows of one warp's ring
    ROWS = W * RING  # rows of the block's rings (float32 view, SDW words each)
    NQ = 4 * KS
    NS = 4 * NT
    NO = 4 * DTK
    softmax = fragment_softmax(NT)  # online softmax on the S fragments (device_functions)
    rescale = fragment_rescale(DTK)
    WAIT = stages - 2
    MO_ROWS = W * 16  # merge area: O of every warp's 16 rows (aliases the rings)
    ML = ROWS * SDW if ROWS * SDW >= MO_ROWS * D else MO_ROWS * D  # float offset of the m/l area
    MLR = W * 16 + 1  # rows of the m/l area, and one for the last-block flag (closure constants)
    FLAG = W * 16
    cp16 = cp_async16_flat_l2_256 if L2PF else cp_async16_flat

    @device
    def copy_tile(KV, k, v, j0, brow, lane, g_base, hi, Nk):
        """This lane's cp.async share of keys j0 … j0+Bc-1 (zero past ``hi``) into the
        warp's K buffer at ring row ``brow`` and its V buffer stages·Bc rows later."""
        for x in range(CPL):
            idx = lane + x * WARP_SIZE
            r = idx // CVEC
            cc = idx % CVEC
            row = j0 + r
            so = (brow + r) * SDW + 4 * (cc ^ (r & SWM))
            if CVEC > VEC:  # the chunk past the row (odd multiple of 8): zero-filled, reads nothing
                go = g_base + min(row, Nk - 1) * D + 8 * min(cc, VEC - 1)
                ok = row < hi and cc < VEC
            else:
                go = g_base + min(row, Nk - 1) * D + 8 * cc
                ok = row < hi
            cp16(KV, so, k, go, ok)
            cp16(KV, so + stages * Bc * SDW, v, go, ok)

    @kernel
    def decode_mma(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, chunk, S):
        if PDL == 1:
            launch_dependents()  # the combine kernel may be launched now; it waits for this grid to complete
        KV = dynamic_tile(0, ROWS, SDW)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        if EVEN:  # `chunk` is the number of Bc-key tiles; split s takes tiles s·T/S … (s+1)·T/S
            lo = (split * chunk) // S * Bc
            hi = min(Nk, ((split + 1) * chunk) // S * Bc)
        else:
            lo = split * chunk
            hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        warp = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        g = lane // 4
        t = lane % 4
        lm = lane // 8
        lr = lane % 8
        off = Nk - Nq

        # Q fragments: rows g and g+8 of the tile = query rows (head kvh·G + r // Nq, position r % Nq)
        qf = cuda.local.array(NQ, uint32)
        r_lo = g
        r_hi = g + 8
        b_lo = kvh * G + r_lo // Nq
        i_lo = r_lo % Nq
        b_hi = kvh * G + r_hi // Nq
        i_hi = r_hi % Nq
        for ks in range(KS):
            c = 8 * ks + t
            qf[4 * ks + 0] = q[b_lo, i_lo, c] if r_lo < NR else uint32(0)
            qf[4 * ks + 1] = q[b_hi, i_hi, c] if r_hi < NR else uint32(0)
            if CVEC > VEC:  # the last k-step's upper half lies past the row: zero
                qf[4 * ks + 2] = q[b_lo, i_lo, c + 4] if r_lo < NR and c + 4 < DW else uint32(0)
                qf[4 * ks + 3] = q[b_hi, i_hi, c + 4] if r_hi < NR and c + 4 < DW else uint32(0)
            else:
                qf[4 * ks + 2] = q[b_lo, i_lo, c + 4] if r_lo < NR else uint32(0)
                qf[4 * ks + 3] = q[b_hi, i_hi, c + 4] if r_hi < NR else uint32(0)
        # keys < lim are visible to the row (causal: bottom-right aligned); padding rows see the split
        lim_lo = min(hi, i_lo + off + 1) if causal and r_lo < NR else hi
        lim_hi = min(hi, i_hi + off + 1) if causal and r_hi < NR else hi
        acc = cuda.local.array(NO, float32)
        for i in range(NO):
            acc[i] = float32(0.0)
        s = cuda.local.array(NS, float32)
        m_lo = NEG_BIG
        m_hi = NEG_BIG
        l_lo = float32(0.0)
        l_hi = float32(0.0)

        n_tiles = max(0, (hi - lo + Bc - 1) // Bc)
        mine = max(0, (n_tiles - warp + W - 1) // W)  # this warp's tiles: warp, warp + W, ...
        base = warp * RING  # first row of this warp's ring
        k_r = (lm // 2) * 8 + lr
        k_c = lm % 2
        v_r = (lm % 2) * 8 + lr
        v_c = lm // 2
        k_sw = k_r & SWM
        v_sw = v_r & SWM
        g_base = kvh * Nk * D  # flat element offset of (kvh, key 0) in k and v

        for st in range(stages - 1):
            if st < mine:
                copy_tile(KV, k, v, lo + (warp + st * W) * Bc, base + st * Bc, lane, g_base, hi, Nk)
            cp_async_commit()

        for it in range(mine):
            cp_async_wait(WAIT)  # this lane's copies of tile `it` have landed ...
            syncwarp(FULL)  # ... and every lane's; every lane is done with tile it-1
            nxt = it + stages - 1
            if nxt < mine:
                copy_tile(KV, k, v, lo + (warp + nxt * W) * Bc, base + (nxt % stages) * Bc, lane, g_base, hi, Nk)
            cp_async_commit()

            j0 = lo + (warp + it * W) * Bc
            kb = base + (it % stages) * Bc
            vb = kb + stages * Bc
            # -- S = Q Kᵀ for Bc keys
            for i in range(NS):
                s[i] = float32(0.0)
            for ks in range(KS):
                kcol = 4 * ((2 * ks + k_c) ^ k_sw)
                for np_ in range(NP):
                    b = ldmatrix_x4(KV, kb + 16 * np_ + k_r, kcol)
                    n0 = 8 * np_
                    s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3] = mma_f16(
                        qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b[0], b[1],
                        s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3])
                    s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7] = mma_f16(
                        qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b[2], b[3],
                        s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7])
            # -- mask keys past the split and (causal) after the row's position
            if j0 + Bc > min(lim_lo, lim_hi) or causal:
                for nt in range(NT):
                    for e in range(4):
                        col = j0 + nt * 8 + 2 * t + (e % 2)
                        lim = lim_lo if e < 2 else lim_hi
                        if col >= lim:
                            s[4 * nt + e] = NEG_BIG
            # -- online softmax on the fragments (raw scores; exp2 with the scale folded in)
            m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2)
            l_lo = l_lo * corr_lo + rs_lo
            l_hi = l_hi * corr_hi + rs_hi
            rescale(acc, 0, corr_lo, corr_hi)
            # -- O += P V
            for kk in range(KK):
                p0 = 8 * kk
                a0 = pack_f16x2(s[p0], s[p0 + 1])
                a1 = pack_f16x2(s[p0 + 2], s[p0 + 3])
                a2 = pack_f16x2(s[p0 + 4], s[p0 + 5])
                a3 = pack_f16x2(s[p0 + 6], s[p0 + 7])
                vrow = vb + 16 * kk + v_r
                for dp in range(DP):
                    b = ldmatrix_x4_trans(KV, vrow, 4 * ((2 * dp + v_c) ^ v_sw))
                    d0 = 8 * dp
                    acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3] = mma_f16(
                        a0, a1, a2, a3, b[0], b[1], acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3])
                    acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7] = mma_f16(
                        a0, a1, a2, a3, b[2], b[3], acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7])

        if PDL == 2:
            launch_dependents()  # after the loop: the combine launches while the blocks merge and write
        # -- merge the warps' states through shared memory (the rings' space)
        cp_async_wait(0)
        cuda.syncthreads()
        MO = dynamic_tile(0, MO_ROWS, D)
        MM = dynamic_tile(ML, MLR, 2)
        l_lo = quad_sum(l_lo)
        l_hi = quad_sum(l_hi)
        for dt in range(DT):
            MO[warp * 16 + g, 8 * dt + 2 * t] = acc[4 * dt]
            MO[warp * 16 + g, 8 * dt + 2 * t + 1] = acc[4 * dt + 1]
            MO[warp * 16 + g + 8, 8 * dt + 2 * t] = acc[4 * dt + 2]
            MO[warp * 16 + g + 8, 8 * dt + 2 * t + 1] = acc[4 * dt + 3]
        if t == 0:  # m in natural units of the scaled scores (NEG_BIG stays the empty marker)
            MM[warp * 16 + g, 0] = m_lo * scale if m_lo != NEG_BIG else NEG_BIG
            MM[warp * 16 + g, 1] = l_lo
            MM[warp * 16 + g + 8, 0] = m_hi * scale if m_hi != NEG_BIG else NEG_BIG
            MM[warp * 16 + g + 8, 1] = l_hi
        cuda.syncthreads()
        for idx in range(tid, NR * D, NTH):
            r = idx // D
            d = idx - r * D
            mm = NEG_BIG
            ll = float32(0.0)
            oo = float32(0.0)
            for ww in range(W):
                mm, ll, ca, cb = merge_state(mm, ll, MM[ww * 16 + r, 0], MM[ww * 16 + r, 1])
                oo = oo * ca + cb * MO[ww * 16 + r, d]
            bh = kvh * G + r // Nq
            i = r % Nq
            if FINAL:
                o[bh, i, d] = oo / ll
            else:
                part_o[split, bh * Nq + i, d] = oo / ll if ll > float32(0.0) else float32(0.0)
                if d == 0:
                    part_lse[split, bh * Nq + i] = state_lse(mm, ll)
        if FUSED and not FINAL:
            # the last block of this (sequence, KV head) to finish combines the splits
            cuda.threadfence()  # this block's partials are visible device-wide before it counts
            cuda.syncthreads()
            if tid == 0:
                prev = cuda.atomic.add(counters, kvh, 1)
                MM[FLAG, 0] = float32(1.0) if prev == S - 1 else float32(0.0)
            cuda.syncthreads()
            if MM[FLAG, 0] > float32(0.5):
                cuda.threadfence()
                for idx in range(tid, NR * D, NTH):
                    r = idx // D
                    d = idx - r * D
                    bh = kvh * G + r // Nq
                    i = r % Nq
                    o[bh, i, d] = combine_splits(part_o, part_lse, S, bh * Nq + i, d)
                if tid == 0:
                    counters[kvh] = 0  # ready for the next launch

    return decode_mma


FIXED_COMBINE_MAX = 32  # split counts up to this get a combine kernel compiled for their count

PDL_MODES = {1: "combine launched at the split kernel's start", 2: "launched after its loop",
             3: "launched at its exit"}


def smem_bytes(D, W, Bc, stages):
    ring = W * 2 * stages * Bc * swizzle_row_chunks(D) * 16
    merge = W * 16 * D * 4
    return max(ring, merge) + (W * 16 + 1) * 2 * 4


def _supports(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
             fixed_combine):
    if problem.dtype != "float16":
        return f"dtype {problem.dtype}: decode_mma computes on f16 tensor cores (float16 storage)"
    if problem.q_len > MAX_Q_LEN:
        return f"decode kernel: q_len {problem.q_len} > {MAX_Q_LEN} (use a prefill phase)"
    NR = problem.group * problem.q_len
    if NR > 16:
        return f"{NR} query rows per KV head (group × q_len) > 16: one m16 tile per block"
    D = problem.head_dim
    if D % 8 or D > 256:
        return f"head_dim {D} must be a multiple of 8 (16-byte rows), at most 256"
    if Bc % 16 or Bc < 16:
        return f"Bc={Bc} must be a multiple of 16"
    chunks = (D + 15) // 16 * 2
    if (Bc * chunks) % WARP_SIZE:
        return f"Bc={Bc} × {chunks} chunks is not a whole number of 16-byte copies per lane"
    if stages < 2:
        return "stages must be at least 2"
    if not 1 <= warps <= 32:
        return f"warps={warps} out of range 1..32"
    if int(pdl) not in (0, 1, 2, 3):
        return f"pdl={pdl}: 0 (plain launch) or 1/2/3 (dependent launch; see PDL_MODES)"
    return smem_reason(smem_bytes(D, warps, Bc, stages))


def _resolve(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
             fixed_combine):
    S, _ = split_plan(problem.batch * problem.kv_heads, problem.kv_len, max(1, warps * Bc), sm_count(), blocks_per_sm,
                      min_keys, splits)
    return {"splits": S}


@register_phase(
    name="decode_mma", order=34, title="Decode: the KV head's query rows as a tensor-core tile (mma.sync)",
    parent="decode_split_k_lean", kind="decode",
    description="""
        Split-K decode where the query rows of a KV head (GQA group × q_len ≤ 16) are the
        A operand of mma.sync m16n8k16: scores and P·V on tensor cores, online softmax
        on the fragments, P in registers. Each warp streams its own key tiles through a
        cp.async ring (ldmatrix, V transposed); warps merge through shared memory, the
        splits in the two-pass combine kernel.
    """,
    lineage="FlashInfer / FlashDecoding++ GQA decode on tensor cores (query heads of a group "
            "as the M dimension); FlashAttention-2 fragments",
    planned_speedup=60.0,
    space={"warps": [2, 4, 8], "Bc": [16, 32], "stages": [2, 3, 4], "splits": [0, 8, 16, 32, 64]},
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float16",),
    sim_params={"warps": 2, "Bc": 16, "stages": 2, "splits": 3},
    supports=_supports,
    resolve=_resolve,
)
def decode_mma(problem, warps=4, Bc=16, stages=3, splits=0, blocks_per_sm=2, min_keys=2048, fuse_max=0, pdl=3,
               l2_prefetch=False, even=False, fixed_combine=True):
    B, Hkv, Nq, Nk, D = problem.batch, problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    S, chunk = split_plan(B * Hkv, Nk, warps * Bc, sm_count(), blocks_per_sm, min_keys, splits)
    final = S == 1
    fused = S * G * Nq <= fuse_max
    dependent = bool(pdl) and not final and not fused and uses_griddepcontrol()
    if even:
        chunk = -(-Nk // Bc)  # tiles, spread evenly over the splits by the kernel
    kern = make_kernel(D, warps, Bc, stages, Nq, G, problem.causal, final, fused, int(pdl) if dependent else 0,
                       bool(l2_prefetch), bool(even))
    sl2 = float32(problem.sm_scale * float(LOG2E))
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv)
    nbytes = smem_bytes(D, warps, Bc, stages)
    part_o, part_lse = split_workspace(S, B * problem.heads * Nq, D)
    kernels = [kern]
    if not final and not fused:
        combine = make_combine_kernel(Nq, dependent, S if fixed_combine and S <= FIXED_COMBINE_MAX else 0)
        kernels.append(combine)
    counters = zeroed_counters(B * Hkv)
    views = {}
    opted = []

    def run(q, k, v, o, stream=0):
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            check_alignment(k, v)
            if len(views) >= 8:
                views.clear()
            hit = views[key] = ((q, k, v, o), view_as(q, np.uint32))
        args = (hit[1], k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, chunk, S)
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
                  notes=f"S={S} splits of {size}, {warps} warps × {Bc}-key tiles, {stages} stages, combine {how}")
