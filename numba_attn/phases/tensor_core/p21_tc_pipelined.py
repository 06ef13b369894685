"""Phase 21 — ``tc_pipelined``: ldmatrix from swizzled shared memory, cp.async multi-buffering.

Change against ``tc_mma`` — the tensor-core math and the online softmax on the
fragments are the same; what changes is how K and V reach the fragments:

* **cp.async pipeline.** K/V tiles are copied global → shared with
  ``cp.async.cg`` (16 bytes per instruction, no register round trip, the
  rows past the end zero-filled by the instruction) into a ring of
  ``STAGES`` buffers. While the warps compute on tile j, the copies of tiles
  j+1 … j+STAGES-1 are in flight. One barrier per tile instead of two:
  waiting for tile j (``cp.async.wait_group STAGES-2``) then ``syncthreads``
  both publishes tile j and proves every warp has finished tile j-1, whose
  buffer is the one refilled next.
* **ldmatrix.** One ``ldmatrix.x4`` gives a lane the B fragments of two
  n-tiles of Kᵀ (both k halves); one ``ldmatrix.x4.trans`` gives the B
  fragments of two d-tiles of V, transposed in flight. This replaces 4
  32-bit loads (K) and 8 16-bit loads plus 4 packs (V) per instruction.
* **Swizzled tiles.** Rows are D·2 bytes, unpadded; the 16-byte chunk c of row
  r is stored at chunk ``c ^ (r mod 8)``. The 8 rows an ldmatrix phase reads
  at one logical chunk land in 8 different bank groups, so neither the
  cp.async writes nor the ldmatrix reads conflict, and rows stay 16-byte
  aligned for both.

Several warps per block (W, 16 query rows each) share every tile; all of a
block's K/V data sits in one shared array (K stages, then V stages).

Prediction (written before measuring): ``tc_mma`` stalls on the staging
(global → registers → shared, two barriers) and on ~3× more shared-memory
instructions per mma. Overlapping the copies and cutting the fragment loads
should give 1.5–2× over ``tc_mma``: ~200–250 TFLOP/s at D=64/128 fp16 on an
H200, near 0.5× SDPA — the target.

Measured (H200, commit 6c8cbec, ``bench/dev/tc_run2_*.log``; W=4, Bc=64 at
D64 / 32 at D128, STAGES=2; SDPA in the same run): B1 H32 N4096 D64 fp16
226.7 TFLOP/s = 0.49× SDPA (460), bf16 222.8 = 0.48×; D128 fp16 211.8 = 0.36×
(585), bf16 211.0 = 0.34× (630); D64 causal 190.3 = 0.51×; B16 H16 N512 D64
163.5 = 0.46×. Variants: D128 with W=8 224.9 (0.38×; now the default there);
D64 with W=8 214.5, STAGES=3 217.1, Bc=32 204.1. 1.6× (D64) and 2.6× (D128)
over ``tc_mma``, 40% of the 568 TFLOP/s mma.sync ceiling. 167 registers (D64)
/ 219 (D128), 32 KiB shared, no local memory; SASS per tile: 64 HMMA, 32
LDSM, 16 LDGSTS.

The prediction held in TFLOP/s; the 0.5× target holds for D64 causal, is
just missed at D64 (0.49×, bf16 0.48×) and missed at D128 (0.38×). Why,
from the SASS (``bench/dev/tc_sass.py``) and the counts: a warp spends ~1200
cycles of its scheduler per 64-key tile for ~640 issued instructions and 64
HMMA (~480 cycles of tensor pipe), so neither issue nor the tensor pipe is
saturated — the warps wait: 3 warps per scheduler (166 registers → 3 blocks
of 4 warps per SM), a barrier per tile, and inside each warp the chain QKᵀ →
row max → shuffles → exp2 → pack → PV leaves the tensor cores idle during the
softmax (~200 instructions: FMNMX, FFMA, 34 MUFU.EX2, FADD, the rescale
FMULs). D128 is hit harder: two stages of 64-key tiles would need 64 KiB, over
the 48 KiB of static shared memory, so Bc=32 halves the keys each barrier and
softmax round trip serves, and 219 registers leave 8 warps per SM. Grid
quantization costs too: 2048 blocks on 3×132 slots is 5.2 waves.

D=128 with 64-key tiles (``Bc=64``, now the default there). Two stages of
64-key K/V tiles at D=128 need 64 KiB; above the 48 KiB a static array may
have, the ring lives in dynamic shared memory (``ptx_loads.dynamic_tile``, a
float32 view used only through cp.async/ldmatrix addresses) and the launch
opts in (``ptx_loads.launch_dynamic``); configurations that fit 48 KiB keep
the static array (``DYN=1`` forces the dynamic path, for the simulator test).
Prediction (before measuring): twice the keys per barrier and per softmax
round trip, as at D=64, for +15-25% at D=128 despite ~237 registers (one
8-warp block per SM either way). Measured (H200, commit 770cede,
``results/dev/tc_d128_bc64_h200.log``, SDPA in the same run: 0.430 ms
non-causal, 0.296 ms causal): B1 H32 N4096 D128 fp16 Bc=64 W=8 0.960 ms =
286.5 TFLOP/s = 0.449× SDPA, against Bc=32 W=8 (old default) 1.155 ms = 238.1
TFLOP/s = 0.373× — 1.20× faster; Bc=64 W=4 0.990 ms, STAGES=3 (96 KiB) W=4
1.015 / W=8 0.997; Bc=32 from dynamic shared memory 1.176 ms (the dynamic
array by itself costs nothing measurable, ~2%). Causal: Bc=64 W=8 0.575 ms =
0.514× SDPA against 0.837 ms (0.353×) — 1.46×. 237 registers (Bc=64 W=8),
no local memory. The prediction held (+20%); the 0.5× target is met causal
but still missed non-causal (0.449×; against the 480 µs SDPA of earlier runs
it would be 0.50×, but this run's SDPA took 430 µs): with one 8-warp block
per SM the warps still wait through each tile's softmax (see above); a
third stage does not help, so the copies are not the limit.

Since run 2 (not yet measured on a GPU separately; checked in the simulator and
compiled for sm_90 without spills): the copy addresses are flat offsets
(``cp_async16_flat``: ~75 fewer instructions per tile at D64), and two
tunables — ``MT=2`` (32 query rows per warp: every ldmatrix feeds twice the
mma, 254 registers at D64) and ``MAXREG`` (register cap for more blocks per
SM; a 128 cap at D64 costs 16 spill instructions).
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.intrinsics import (SMEM_ALIGN, cp_async16_flat, cp_async_commit, cp_async_wait, ldmatrix_x4,
                          ldmatrix_x4_trans, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2)
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT, dynamic_tile, launch_dynamic, smem_reason
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.gpu.device_functions import fragment_rescale, fragment_softmax
from numba_attn.gpu.warp import quad_sum
from numba_attn.phases.tensor_core.p20_tc_mma import LOG2E, NEG_BIG, supports_tc, u32_views

ALIGN = SMEM_ALIGN


@functools.cache
def make_kernel(D: int, W: int, Bc: int, STAGES: int, MT: int, MAXREG: int, causal: bool, bf16: bool,
                DYN: bool = False):
    mma = mma_bf16 if bf16 else mma_f16
    pack = pack_bf16x2 if bf16 else pack_f16x2
    WR = 16 * MT  # query rows per warp (MT m-tiles of 16)
    Br = WR * W  # query rows per block
    NTH = 32 * W
    DW = D // 2  # words per row
    KS = D // 16  # k-steps of Q·Kᵀ
    NT = Bc // 8  # n-tiles of S
    NP = Bc // 16  # pairs of n-tiles (one ldmatrix.x4 each per k-step)
    KK = Bc // 16  # k-steps of P·V
    DT = D // 8  # n-tiles of O
    DP = D // 16  # pairs of d-tiles (one ldmatrix.x4.trans each per k-step)
    VEC = D // 8  # 16-byte chunks per row
    SWM = min(8, VEC) - 1  # swizzle: chunk c of row r lives at c ^ (r & SWM)
    RSTEP = NTH // VEC  # tile rows copied per pass of the block (one 16-byte chunk per thread)
    CPT = (Bc + RSTEP - 1) // RSTEP  # passes per tile
    VOFF = STAGES * Bc * DW  # V buffers start this many words after the K buffers
    ROWS = 2 * STAGES * Bc  # K stages, then V stages
    NQ = 4 * KS  # Q registers per m-tile
    NS = 4 * NT  # score accumulators per m-tile
    NO = 4 * DT  # output accumulators per m-tile
    softmax = fragment_softmax(NT)  # online softmax on the S fragments (device_functions)
    rescale = fragment_rescale(DT)
    NQA = MT * NQ
    NSA = MT * NS
    NOA = MT * NO
    NR = 2 * MT  # rows g and g+8 of each m-tile
    WAIT = STAGES - 2  # copy groups that may stay in flight when tile j is needed

    @kernel(**({"max_registers": MAXREG} if MAXREG else {}))
    def tc_pipelined(q, k, v, o, sl2, H, G, Nq, Nk):
        if DYN:  # dynamic shared memory (over 48 KiB: the launch opts in); a float32 view,
            # used only through addresses (cp.async, ldmatrix), so the bits are the same
            KV = dynamic_tile(0, ROWS, DW)
        else:
            KV = cuda.shared.array((ROWS, DW), uint32, alignment=ALIGN)
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
            r_lo = row0 + 16 * mt + g
            r_hi = r_lo + 8
            for ks in range(KS):
                c = 8 * ks + t
                qf[mt * NQ + 4 * ks + 0] = q[bh, r_lo, c] if r_lo < Nq else uint32(0)
                qf[mt * NQ + 4 * ks + 1] = q[bh, r_hi, c] if r_hi < Nq else uint32(0)
                qf[mt * NQ + 4 * ks + 2] = q[bh, r_lo, c + 4] if r_lo < Nq else uint32(0)
                qf[mt * NQ + 4 * ks + 3] = q[bh, r_hi, c + 4] if r_hi < Nq else uint32(0)
        acc = cuda.local.array(NOA, float32)
        for i in range(NOA):
            acc[i] = float32(0.0)
        s = cuda.local.array(NSA, float32)
        m = cuda.local.array(NR, float32)  # running max (raw scores) of rows g, g+8 of each m-tile
        l = cuda.local.array(NR, float32)  # running sum, this lane's columns only
        for i in range(NR):
            m[i] = NEG_BIG
            l[i] = float32(0.0)

        kv_end = Nk
        warp_end = Nk
        if causal:
            kv_end = min(Nk, min(blk0 + Br, Nq) + off)
            warp_end = min(Nk, min(row0 + WR, Nq) + off)
        if row0 >= Nq:
            warp_end = 0
        n_tiles = (kv_end + Bc - 1) // Bc

        # ldmatrix row addresses of this lane (row within a 16-row group, chunk offset)
        k_r = (lm // 2) * 8 + lr  # K: matrices (keys 0-7, k lo), (0-7, k hi), (8-15, lo), (8-15, hi)
        k_c = lm % 2
        v_r = (lm % 2) * 8 + lr  # V: matrices (keys 0-7, d lo), (8-15, d lo), (0-7, d hi), (8-15, d hi)
        v_c = lm // 2
        k_sw = k_r & SWM
        v_sw = v_r & SWM

        # this thread's share of a tile copy: rows lr0, lr0 + RSTEP, ...; one 16-byte chunk each
        lr0 = tid // VEC
        lc = tid % VEC
        g_base = kvh * Nk * DW + 4 * lc  # flat word offset of (kvh, row 0, chunk lc) in k and v

        # prologue: tiles 0 .. STAGES-2 in flight
        for st in range(STAGES - 1):
            if st < n_tiles:
                for i in range(CPT):
                    r = lr0 + i * RSTEP
                    if r < Bc:
                        row = st * Bc + r
                        so = (st * Bc + r) * DW + 4 * (lc ^ (r & SWM))
                        go = g_base + min(row, Nk - 1) * DW
                        cp_async16_flat(KV, so, k, go, row < Nk)
                        cp_async16_flat(KV, so + VOFF, v, go, row < Nk)
            cp_async_commit()

        for it in range(n_tiles):
            cp_async_wait(WAIT)  # tile `it` has landed (for this thread's copies) ...
            cuda.syncthreads()  # ... for every thread's; and every warp is done with tile it-1
            nxt = it + STAGES - 1
            if nxt < n_tiles:  # refill the buffer of tile it-1
                sb = nxt % STAGES
                for i in range(CPT):
                    r = lr0 + i * RSTEP
                    if r < Bc:
                        row = nxt * Bc + r
                        so = (sb * Bc + r) * DW + 4 * (lc ^ (r & SWM))
                        go = g_base + min(row, Nk - 1) * DW
                        cp_async16_flat(KV, so, k, go, row < Nk)
                        cp_async16_flat(KV, so + VOFF, v, go, row < Nk)
            cp_async_commit()

            j0 = it * Bc
            if j0 < warp_end:
                kb = (it % STAGES) * Bc  # first row of this tile's K buffer
                vb = kb + STAGES * Bc  # ... and of its V buffer
                # -- S = Q Kᵀ: each K fragment pair serves the MT m-tiles
                for i in range(NSA):
                    s[i] = float32(0.0)
                for ks in range(KS):
                    kcol = 4 * ((2 * ks + k_c) ^ k_sw)
                    for np_ in range(NP):
                        b = ldmatrix_x4(KV, kb + 16 * np_ + k_r, kcol)
                        for mt in range(MT):
                            n0 = mt * NS + 8 * np_  # accumulators of n-tile 2·np_
                            q0 = mt * NQ + 4 * ks
                            s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3] = mma(
                                qf[q0], qf[q0 + 1], qf[q0 + 2], qf[q0 + 3], b[0], b[1],
                                s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3])
                            s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7] = mma(
                                qf[q0], qf[q0 + 1], qf[q0 + 2], qf[q0 + 3], b[2], b[3],
                                s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7])
                # -- mask keys past the end and (causal) above the diagonal
                if j0 + Bc > Nk or (causal and j0 + Bc - 1 > row0 + off):
                    for mt in range(MT):
                        for nt in range(NT):
                            for e in range(4):
                                col = j0 + nt * 8 + 2 * t + (e % 2)
                                row = row0 + 16 * mt + g + 8 * (e // 2)
                                if col >= Nk or (causal and col > row + off):
                                    s[mt * NS + 4 * nt + e] = NEG_BIG
                # -- online softmax on the fragments, per m-tile
                for mt in range(MT):
                    m[2 * mt], m[2 * mt + 1], corr_lo, corr_hi, rs_lo, rs_hi = softmax(
                        s, mt * NS, m[2 * mt], m[2 * mt + 1], sl2)
                    l[2 * mt] = l[2 * mt] * corr_lo + rs_lo
                    l[2 * mt + 1] = l[2 * mt + 1] * corr_hi + rs_hi
                    rescale(acc, mt * NO, corr_lo, corr_hi)
                # -- O += P V: each V fragment pair serves the MT m-tiles
                for kk in range(KK):
                    vrow = vb + 16 * kk + v_r
                    for dp in range(DP):
                        b = ldmatrix_x4_trans(KV, vrow, 4 * ((2 * dp + v_c) ^ v_sw))
                        for mt in range(MT):
                            p0 = mt * NS + 8 * kk  # S n-tiles 2kk, 2kk+1 = A fragment of k-step kk
                            a0 = pack(s[p0], s[p0 + 1])
                            a1 = pack(s[p0 + 2], s[p0 + 3])
                            a2 = pack(s[p0 + 4], s[p0 + 5])
                            a3 = pack(s[p0 + 6], s[p0 + 7])
                            d0 = mt * NO + 8 * dp  # accumulators of d-tile 2·dp
                            acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3] = mma(
                                a0, a1, a2, a3, b[0], b[1], acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3])
                            acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7] = mma(
                                a0, a1, a2, a3, b[2], b[3], acc[d0 + 4], acc[d0 + 5], acc[d0 + 6],
                                acc[d0 + 7])

        cp_async_wait(0)  # no copy may still target shared memory when the block exits
        for mt in range(MT):
            r_lo = row0 + 16 * mt + g
            r_hi = r_lo + 8
            l_lo = quad_sum(l[2 * mt])
            l_hi = quad_sum(l[2 * mt + 1])
            inv_lo = float32(1.0) / l_lo if l_lo > float32(0.0) else float32(0.0)  # 0: rows past Nq
            inv_hi = float32(1.0) / l_hi if l_hi > float32(0.0) else float32(0.0)
            for dt in range(DT):
                i0 = mt * NO + 4 * dt
                if r_lo < Nq:
                    o[bh, r_lo, 4 * dt + t] = pack(acc[i0] * inv_lo, acc[i0 + 1] * inv_lo)
                if r_hi < Nq:
                    o[bh, r_hi, 4 * dt + t] = pack(acc[i0 + 2] * inv_hi, acc[i0 + 3] * inv_hi)

    return tc_pipelined


def smem_bytes(D, Bc, STAGES):
    return 2 * STAGES * Bc * D * 2


def default_bc(D, Bc):
    """Bc=0 picks the tile: 64 keys up to D=64 and at D=128, 32 in between.

    At D=128 two stages of 64-key tiles need 64 KiB and run from dynamic shared
    memory (:func:`use_dynamic`); H200, ``results/dev/tc_d128_bc64_h200.log``:
    0.960 ms against 1.155 ms with Bc=32 (causal 0.575 against 0.837). D=80-112
    keep the 32-key static tiles: not measured with 64."""
    return Bc if Bc else (64 if D <= 64 or D == 128 else 32)


def use_dynamic(D, Bc, STAGES, DYN):
    """The K/V ring lives in dynamic shared memory when it needs more than the 48 KiB
    a static array may have (the launch then opts in through
    ``ptx_loads.launch_dynamic``), or when DYN=1 forces it (to test that path
    at small shapes); otherwise in a static array, as before."""
    return bool(DYN) or smem_bytes(D, Bc, STAGES) > STATIC_SMEM_LIMIT


def default_w(D, W):
    """W=0 picks the warps per block: 4 up to D=64, 8 above (H200, run 2: D=128
    fp16 224.9 TFLOP/s with 8 warps against 211.8 with 4; D=64 226.7 with 4,
    214.5 with 8)."""
    return W if W else (4 if D <= 64 else 8)


def _supports(problem, W, Bc, STAGES, MT, MAXREG, DYN=0):
    Bc = default_bc(problem.head_dim, Bc)
    reason = supports_tc(problem, Bc)
    if reason:
        return reason
    if STAGES < 2:
        return "STAGES must be at least 2 (one tile computed while the next lands)"
    if MT not in (1, 2):
        return "MT (16-row m-tiles per warp) must be 1 or 2"
    if DYN not in (0, 1):
        return "DYN must be 0 (dynamic shared memory only above 48 KiB) or 1 (always)"
    return smem_reason(smem_bytes(problem.head_dim, Bc, STAGES))


@register_phase(
    name="tc_pipelined", order=21, title="Tensor cores + ldmatrix + cp.async multi-buffering",
    parent="tc_mma",
    description="""
        tc_mma's fragments and softmax, fed differently: K/V tiles are copied with
        cp.async (16 B, zero-fill past the end) into a ring of STAGES swizzled
        shared buffers, so copies of the next tiles overlap the math on this one
        (one barrier per tile); B fragments come from ldmatrix.x4 (K) and
        ldmatrix.x4.trans (V), two n-tiles per instruction, bank-conflict free
        thanks to the XOR swizzle of 16-byte chunks.
    """,
    lineage="FlashAttention-2 (Dao 2023) as implemented with CUTLASS/CuTe on Ampere/Hopper "
            "(ldmatrix, cp.async pipelines, XOR-swizzled shared memory)",
    planned_speedup=100.0,
    dtypes=("float16", "bfloat16"),
    head_dims=(16, 32, 48, 64, 80, 96, 112, 128),
    sim_params={"W": 2, "Bc": 16, "STAGES": 2, "MT": 1, "MAXREG": 0, "DYN": 0},
    supports=_supports,
)
def tc_pipelined(problem, W=0, Bc=0, STAGES=2, MT=1, MAXREG=0, DYN=0):
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    D = problem.head_dim
    Bc = default_bc(D, Bc)
    W = default_w(D, W)
    dyn = use_dynamic(D, Bc, STAGES, DYN)
    nbytes = smem_bytes(D, Bc, STAGES)
    kern = make_kernel(D, W, Bc, STAGES, MT, MAXREG, problem.causal, problem.dtype == "bfloat16", dyn)
    sl2 = float32(problem.sm_scale * LOG2E)
    Br = 16 * MT * W
    grid = ((Nq + Br - 1) // Br, problem.batch * H)

    def run(q, k, v, o, stream=0):
        if dyn:
            launch_dynamic(kern, grid, 32 * W, stream, nbytes, *u32_views(q, k, v, o), sl2, H, problem.group,
                           Nq, Nk)
        else:
            kern[grid, 32 * W, stream](*u32_views(q, k, v, o), sl2, H, problem.group, Nq, Nk)

    return Launch(run, kernels=[kern])
