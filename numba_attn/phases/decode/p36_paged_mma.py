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

Prediction: at page size >= 64, within 5% of ``decode_mma``'s bandwidth on the
same lengths (the page index is one L1-cached load per 16-key tile); at page
size 16 a few percent lower (a cp.async row of 16 keys × 256 B per page).
Verdict: not measured yet (no committed GPU row).
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
from numba_attn.phases.decode.common import (MAX_Q_LEN, PagedLayout, check_alignment, check_paged_problem,
                                             split_workspace, zeroed_counters)

FULL = 0xFFFFFFFF


@functools.cache
def make_kernel(D: int, W: int, Bc: int, stages: int, Nq: int, G: int, causal: bool, P: int, FINAL: bool, FUSED: bool,
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
    LOGP = P.bit_length() - 1
    TILE = P % Bc == 0  # tiles (aligned to Bc) never cross a page

    @device
    def copy_tile(KV, k, v, j0, brow, lane, g_base, hi, table, seq, Hkv):
        """This lane's cp.async share of keys j0 … j0+Bc-1 (zero past ``hi``) into the
        warp's K buffer at ring row ``brow`` and its V buffer stages·Bc rows later;
        key j is row table[b, j // P] · P + j % P of the cache (``g_base``: the KV head's
        offset in a row)."""
        pg = table[seq, j0 >> LOGP] if TILE else 0  # a page holds the whole tile
        for x in range(CPL):
            idx = lane + x * WARP_SIZE
            r = idx // CVEC
            cc = idx % CVEC
            row = min(j0 + r, hi - 1)
            page = pg if TILE else table[seq, row >> LOGP]
            crow = ((page * P + (row & (P - 1))) * Hkv) * D + g_base
            so = (brow + r) * SDW + 4 * (cc ^ (r & SWM))
            if CVEC > VEC:  # the chunk past the row (odd multiple of 8): zero-filled, reads nothing
                go = crow + 8 * min(cc, VEC - 1)
                ok = j0 + r < hi and cc < VEC
            else:
                go = crow + 8 * cc
                ok = j0 + r < hi
            cp16(KV, so, k, go, ok)
            cp16(KV, so + stages * Bc * SDW, v, go, ok)

    @kernel
    def paged_mma(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, table, seqlens, chunk, S):
        if PDL == 1:
            launch_dependents()  # the combine kernel may be launched now; it waits for this grid to complete
        KV = dynamic_tile(0, ROWS, SDW)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        seq = kvh // Hkv
        Nk = seqlens[seq]  # this sequence's keys
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
        g_base = (kvh - seq * Hkv) * D  # flat element offset of the KV head within a cache row

        for st in range(stages - 1):
            if st < mine:
                copy_tile(KV, k, v, lo + (warp + st * W) * Bc, base + st * Bc, lane, g_base, hi, table, seq, Hkv)
            cp_async_commit()

        for it in range(mine):
            cp_async_wait(WAIT)  # this lane's copies of tile `it` have landed ...
            syncwarp(FULL)  # ... and every lane's; every lane is done with tile it-1
            nxt = it + stages - 1
            if nxt < mine:
                copy_tile(KV, k, v, lo + (warp + nxt * W) * Bc, base + (nxt % stages) * Bc, lane, g_base, hi, table,
                          seq, Hkv)
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
                o[bh, i, d] = oo / ll if ll > float32(0.0) else float32(0.0)  # an empty sequence: zeros
            else:
                part_o[split, bh * Nq + i, d] = oo / ll if ll > float32(0.0) else float32(0.0)
                if d == 0:  # an empty sequence: split 0 is a zero partial of weight 1
                    part_lse[split, bh * Nq + i] = state_lse(mm, ll) if Nk > 0 or split > 0 else float32(0.0)
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

    return paged_mma


FIXED_COMBINE_MAX = 32  # split counts up to this get a combine kernel compiled for their count

PDL_MODES = {1: "combine launched at the split kernel's start", 2: "launched after its loop",
             3: "launched at its exit"}


def smem_bytes(D, W, Bc, stages):
    ring = W * 2 * stages * Bc * swizzle_row_chunks(D) * 16
    merge = W * 16 * D * 4
    return max(ring, merge) + (W * 16 + 1) * 2 * 4


def _supports(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
             fixed_combine):
    reason = check_paged_problem(problem)
    if reason:
        return reason
    if problem.kv_dtype:
        return f"a {problem.kv_dtype} cache: paged_mma reads 16-bit caches (paged_split_k dequantizes 8-bit ones)"
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
    resolve=_resolve,
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
    kern = make_kernel(D, warps, Bc, stages, Nq, G, problem.causal, problem.page_size, final, fused,
                       int(pdl) if dependent else 0, bool(l2_prefetch), bool(even))
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
