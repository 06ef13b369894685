"""Phase 21 — ``tc_pipelined``: ldmatrix from swizzled shared memory, cp.async multi-buffering.

Change against ``tc_mma``: K/V tiles are copied with ``cp.async`` into a ring of ``stages`` buffers (one
barrier per tile), stored with the 16-byte chunks XOR-swizzled by row, and read into fragments with
``ldmatrix.x4`` (K) and ``ldmatrix.x4.trans`` (V): no padding, no bank conflicts, a quarter of the shared loads.

Prediction: 1.5–2× over ``tc_mma``, ~200–250 TFLOP/s at D=64/128 fp16, near 0.5× SDPA.

Verdict: 0.545 ms at B1 H32 N4096 D64 fp16 (H200), 1.55x tc_mma; 0.950 ms at D128, 2.90x.
[results/tensor-core-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.device_functions import NEG_BIG, fragment_rescale, fragment_softmax
from numba_attn.gpu.intrinsics import (SMEM_ALIGN, cp_async16_flat, cp_async_wait, ldmatrix_x4,
                                       ldmatrix_x4_trans, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2)
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT, dynamic_tile, smem_reason, swizzle_row_chunks
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fragments import q_fragments
from numba_attn.phases.tensor_core.mask import key_ends, variant_fragments
from numba_attn.phases.tensor_core.mma_sync import launch_mma, supports_tc
from numba_attn.phases.tensor_core.pipeline import cp_async_ring
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import LN2, PLAIN, stages_of

ALIGN = SMEM_ALIGN


@functools.cache
def make_kernel(D: int, W: int, Bc: int, STAGES: int, MT: int, MAXREG: int, causal: bool, bf16: bool,
                DYN: bool = False, stage=PLAIN):
    """The kernel ``(q, k, v, o, sl2, H, G, Nq, Nk, mods)``; ``stage``: a variant's (the tile loop and the refills
    walk the block mask's visited tiles, :func:`.scheduler.key_tiles`; ``mods`` ``()`` for plain attention)."""
    mma = mma_bf16 if bf16 else mma_f16
    pack = pack_bf16x2 if bf16 else pack_f16x2
    WR = 16 * MT  # query rows per warp (MT m-tiles of 16)
    Br = WR * W  # query rows per block
    threads = 32 * W
    DW = D // 2  # words per row (global memory)
    d_padded = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps (D itself when a multiple of 16)
    qk_steps = d_padded // 16  # k-steps of Q·Kᵀ
    s_tiles = Bc // 8  # n-tiles of S
    s_tile_pairs = Bc // 16  # pairs of n-tiles (one ldmatrix.x4 each per k-step)
    pv_steps = Bc // 16  # k-steps of P·V
    o_tiles = D // 8  # n-tiles of O written out
    DTK = d_padded // 8  # n-tiles of O computed (the padding's stay zero)
    DP = d_padded // 16  # pairs of d-tiles (one ldmatrix.x4.trans each per k-step)
    row_chunks = D // 8  # 16-byte chunks per row in global memory
    CVEC = d_padded // 8  # chunks per row copied (past row_chunks: zero-filled)
    SVEC = swizzle_row_chunks(D)  # chunks per shared row: a power of two up to 8, a multiple of 8 above
    SDW = 4 * SVEC  # words per shared row
    SWM = min(8, SVEC) - 1  # swizzle: chunk c of row r lives at c ^ (r & SWM), a permutation of SVEC chunks
    RSTEP = threads // CVEC  # tile rows copied per pass of the block (one 16-byte chunk per thread)
    CTH = RSTEP * CVEC  # threads that copy (all of them when CVEC divides the block)
    CPT = (Bc + RSTEP - 1) // RSTEP  # passes per tile
    VOFF = STAGES * Bc * SDW  # V buffers start this many words after the K buffers
    ROWS = 2 * STAGES * Bc  # K stages, then V stages
    q_regs = 4 * qk_steps  # Q registers per m-tile
    s_regs = 4 * s_tiles  # score accumulators per m-tile
    o_regs = 4 * DTK  # output accumulators per m-tile
    softmax = fragment_softmax(s_tiles)  # online softmax on the S fragments (device_functions)
    rescale = fragment_rescale(DTK)
    load_q = q_fragments(qk_steps, False, DW)
    store = store_fragments(o_tiles, "bf16" if bf16 else "f16")
    NQA = MT * q_regs
    NSA = MT * s_regs
    NOA = MT * o_regs
    NR = 2 * MT  # rows g and g+8 of each m-tile
    ends = key_ends(Br, WR, causal)
    vary = variant_fragments(s_tiles, stage)  # a variant's score and mask functions (nothing for plain attention)
    count, tile_at, kind_at = key_tiles(Bc, stage)  # every tile to the causal bound, or a variant's visited ones

    @device
    def copy_tile(tile, sb, to):
        """Issue this thread's cp.async copies of K/V tile ``tile`` into buffer ``sb``;
        ``to = (KV, k, v, Nk, lr0, lc, g_base)``."""
        KV, k, v, Nk, lr0, lc, g_base = to
        for i in range(CPT):
            r = lr0 + i * RSTEP
            if r < Bc:
                row = tile * Bc + r
                so = (sb * Bc + r) * SDW + 4 * (lc ^ (r & SWM))
                go = g_base + min(row, Nk - 1) * DW
                if CVEC > row_chunks:  # the chunk past the row (odd multiple of 8): zero-filled
                    ok = row < Nk and lc < row_chunks
                else:
                    ok = row < Nk
                cp_async16_flat(KV, so, k, go, ok)
                cp_async16_flat(KV, so + VOFF, v, go, ok)

    fill, refill = cp_async_ring(STAGES, Bc, copy_tile, stage)  # the prologue, and per tile wait and refill

    @kernel(**({"max_registers": MAXREG} if MAXREG else {}))
    def tc_pipelined(q, k, v, o, sl2, H, G, Nq, Nk, mods):
        if DYN:  # dynamic shared memory (over 48 KiB: the launch opts in); a float32 view,
            # used only through addresses (cp.async, ldmatrix), so the bits are the same
            KV = dynamic_tile(0, ROWS, SDW)
        else:
            KV = cuda.shared.array((ROWS, SDW), uint32, alignment=ALIGN)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        lm = lane // 8  # which of the 4 matrices this lane addresses in ldmatrix.x4
        lr = lane % 8  # which row of it
        bh = cuda.blockIdx.y
        kvh = (bh // H) * (H // G) + (bh % H) // G
        blk0 = cuda.blockIdx.x * Br
        row0 = blk0 + WR * warp  # first query row of this warp; m-tile mt: row0 + 16 mt
        off = Nk - Nq

        qf = cuda.local.array(NQA, uint32)
        for mt in range(MT):
            load_q(qf, mt * q_regs, q, bh, row0 + 16 * mt + g, Nq, t)
        acc = cuda.local.array(NOA, float32)
        for i in range(NOA):
            acc[i] = float32(0.0)
        s = cuda.local.array(NSA, float32)
        m = cuda.local.array(NR, float32)  # running max (raw scores) of rows g, g+8 of each m-tile
        l = cuda.local.array(NR, float32)  # running sum, this lane's columns only
        for i in range(NR):
            m[i] = NEG_BIG
            l[i] = float32(0.0)

        kv_end, warp_end = ends(blk0, row0, Nq, Nk, off)
        walk = (mods, bh // H, bh % H, cuda.blockIdx.x, Nq)  # the block mask's row of tiles (a variant)
        n_tiles = count(walk, (kv_end + Bc - 1) // Bc)

        # ldmatrix row addresses of this lane (row within a 16-row group, chunk offset)
        k_r = (lm // 2) * 8 + lr  # K: matrices (keys 0-7, k lo), (0-7, k hi), (8-15, lo), (8-15, hi)
        k_c = lm % 2
        v_r = (lm % 2) * 8 + lr  # V: matrices (keys 0-7, d lo), (8-15, d lo), (0-7, d hi), (8-15, d hi)
        v_c = lm // 2
        k_sw = k_r & SWM
        v_sw = v_r & SWM

        # this thread's share of a tile copy: rows lr0, lr0 + RSTEP, ...; one 16-byte chunk each
        lr0 = tid // CVEC
        lc = tid % CVEC
        if CTH < threads:  # CVEC does not divide the block: the last threads copy nothing
            lr0 = Bc if tid >= CTH else lr0
        g_base = kvh * Nk * DW + 4 * lc  # flat word offset of (kvh, row 0, chunk lc) in k and v
        if CVEC > row_chunks:  # the zero-filled chunk reads nothing; its address stays inside the row
            g_base = kvh * Nk * DW + 4 * min(lc, row_chunks - 1)

        to = (KV, k, v, Nk, lr0, lc, g_base)  # the tile copies' arguments
        fill(walk, n_tiles, to)  # prologue: tiles 0 .. STAGES-2 in flight
        for it in range(n_tiles):
            refill(walk, it, n_tiles, to)  # tile it landed (every thread's copies); refill the buffer of tile it-1
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < warp_end:
                kb = (it % STAGES) * Bc  # first row of this tile's K buffer
                vb = kb + STAGES * Bc  # ... and of its V buffer
                # -- S = Q Kᵀ: each K fragment pair serves the MT m-tiles
                for i in range(NSA):
                    s[i] = float32(0.0)
                for ks in range(qk_steps):
                    kcol = 4 * ((2 * ks + k_c) ^ k_sw)
                    for np_ in range(s_tile_pairs):
                        b = ldmatrix_x4(KV, kb + 16 * np_ + k_r, kcol)
                        for mt in range(MT):
                            n0 = mt * s_regs + 8 * np_  # accumulators of n-tile 2·np_
                            q0 = mt * q_regs + 4 * ks
                            s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3] = mma(
                                qf[q0], qf[q0 + 1], qf[q0 + 2], qf[q0 + 3], b[0], b[1],
                                s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3])
                            s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7] = mma(
                                qf[q0], qf[q0 + 1], qf[q0 + 2], qf[q0 + 3], b[2], b[3],
                                s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7])
                # -- a variant's score and mask functions (natural units), then keys past the end and (causal)
                # above the diagonal masked
                for mt in range(MT):
                    vary(s, mt * s_regs, j0, row0 + 16 * mt + g, t, Nq, Nk, off,
                         (walk[1], walk[2], kind_at(walk, kt), sl2 * LN2), mods)
                if j0 + Bc > Nk or (causal and j0 + Bc - 1 > row0 + off):
                    for mt in range(MT):
                        for nt in range(s_tiles):
                            for e in range(4):
                                col = j0 + nt * 8 + 2 * t + (e % 2)
                                row = row0 + 16 * mt + g + 8 * (e // 2)
                                if col >= Nk or (causal and col > row + off):
                                    s[mt * s_regs + 4 * nt + e] = NEG_BIG
                # -- online softmax on the fragments, per m-tile
                for mt in range(MT):
                    m[2 * mt], m[2 * mt + 1], corr_lo, corr_hi, rs_lo, rs_hi = softmax(
                        s, mt * s_regs, m[2 * mt], m[2 * mt + 1], sl2)
                    l[2 * mt] = l[2 * mt] * corr_lo + rs_lo
                    l[2 * mt + 1] = l[2 * mt + 1] * corr_hi + rs_hi
                    rescale(acc, mt * o_regs, corr_lo, corr_hi)
                # -- O += P V: each V fragment pair serves the MT m-tiles
                for kk in range(pv_steps):
                    vrow = vb + 16 * kk + v_r
                    for dp in range(DP):
                        b = ldmatrix_x4_trans(KV, vrow, 4 * ((2 * dp + v_c) ^ v_sw))
                        for mt in range(MT):
                            p0 = mt * s_regs + 8 * kk  # S n-tiles 2kk, 2kk+1 = A fragment of k-step kk
                            a0 = pack(s[p0], s[p0 + 1])
                            a1 = pack(s[p0 + 2], s[p0 + 3])
                            a2 = pack(s[p0 + 4], s[p0 + 5])
                            a3 = pack(s[p0 + 6], s[p0 + 7])
                            d0 = mt * o_regs + 8 * dp  # accumulators of d-tile 2·dp
                            acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3] = mma(
                                a0, a1, a2, a3, b[0], b[1], acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3])
                            acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7] = mma(
                                a0, a1, a2, a3, b[2], b[3], acc[d0 + 4], acc[d0 + 5], acc[d0 + 6],
                                acc[d0 + 7])

        cp_async_wait(0)  # no copy may still target shared memory when the block exits
        for mt in range(MT):
            store(o, bh, row0 + 16 * mt + g, acc, mt * o_regs, l[2 * mt], l[2 * mt + 1], Nq, t)

    return tc_pipelined


def smem_bytes(D, Bc, stages):
    return 2 * stages * Bc * swizzle_row_chunks(D) * 16


def _resolve(problem, warps, Bc, stages, m_tiles, maxreg, dynamic_smem):
    """Bc=0: 64 keys up to D=64 and at D=128, 32 in between (64 not measured there);
    warps=0: 4 up to D=64, 8 above (docs/tensor-core-notes.md has the runs behind both).
    dynamic_smem becomes 1 when the K/V ring needs more than the 48 KiB a static array
    may have (the launch then opts in), and stays 0 otherwise; 1 forces the dynamic
    array (to test that path at small shapes)."""
    D = problem.head_dim
    if dynamic_smem not in (0, 1):
        raise ValueError("dynamic_smem must be 0 (dynamic shared memory only above 48 KiB) or 1 (always)")
    Bc = Bc or (64 if D <= 64 or D == 128 else 32)
    warps = warps or (4 if D <= 64 else 8)
    dyn = int(bool(dynamic_smem) or smem_bytes(D, Bc, stages) > STATIC_SMEM_LIMIT)
    return {"warps": warps, "Bc": Bc, "stages": stages, "m_tiles": m_tiles, "maxreg": maxreg, "dynamic_smem": dyn}


def _supports(problem, warps, Bc, stages, m_tiles, maxreg, dynamic_smem):
    reason = supports_tc(problem, Bc, max_d=None)
    if reason:
        return reason
    if stages < 2:
        return "stages must be at least 2 (one tile computed while the next lands)"
    if m_tiles not in (1, 2):
        return "m_tiles (16-row m-tiles per warp) must be 1 or 2"
    return smem_reason(smem_bytes(problem.head_dim, Bc, stages))


@register_phase(
    name="tc_pipelined", order=21, title="Tensor cores + ldmatrix + cp.async multi-buffering",
    parent="tc_mma",
    description="""
        tc_mma's fragments and softmax, fed differently: K/V tiles are copied with
        cp.async (16 B, zero-fill past the end) into a ring of `stages` swizzled
        shared buffers, so copies of the next tiles overlap the math on this one
        (one barrier per tile); B fragments come from ldmatrix.x4 (K) and
        ldmatrix.x4.trans (V), two n-tiles per instruction, bank-conflict free
        thanks to the XOR swizzle of 16-byte chunks.
    """,
    lineage="FlashAttention-2 (Dao 2023) as implemented with CUTLASS/CuTe on Ampere/Hopper "
            "(ldmatrix, cp.async pipelines, XOR-swizzled shared memory)",
    planned_speedup=100.0,
    space={"warps": [0, 4, 8], "Bc": [0, 32, 64], "stages": [2, 3, 4]},
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warps": 2, "Bc": 16, "stages": 2, "m_tiles": 1, "maxreg": 0, "dynamic_smem": 0},
    supports=_supports,
    resolve=_resolve,
    variants=True,
)
def tc_pipelined(problem, warps=0, Bc=0, stages=2, m_tiles=1, maxreg=0, dynamic_smem=0):
    kern = make_kernel(problem.head_dim, warps, Bc, stages, m_tiles, maxreg, problem.causal,
                       problem.dtype == "bfloat16", bool(dynamic_smem), stages_of(problem.variant))
    nbytes = smem_bytes(problem.head_dim, Bc, stages) if dynamic_smem else 0
    return launch_mma(problem, kern, 16 * m_tiles * warps, warps, dyn_bytes=nbytes, Bc=Bc)
