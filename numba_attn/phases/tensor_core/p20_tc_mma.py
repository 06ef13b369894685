"""Phase 20 — ``tc_mma``: QKᵀ and PV on the tensor cores (``mma.sync``), FlashAttention-2 style.

Change against ``smem_kv``: both products run as ``mma.sync.m16n8k16`` (f16/bf16 in, f32 accumulate). A warp
owns 16 query rows and keeps them in registers: Q as A fragments loaded once, S as accumulator fragments, the
online softmax on them (quad shuffles for the row max), P rounded and packed in place into the A fragments of
P·V. K/V tiles are staged in padded shared memory (conflict-free 32-bit K and 2×16-bit V fragment reads).

Prediction: 100–150 TFLOP/s at D=64/128, N=4096 fp16 — about 10× ``smem_kv``.

Verdict: 0.844 ms at B1 H32 N4096 D64 fp16 (H200), 163 TFLOP/s, in range; D128 2.75 ms, 100 TFLOP/s, below it.
[results/tensor-core-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint16, uint32

from numba_attn.gpu.intrinsics import (SMEM_ALIGN, ld_global_v4, lds, mma_bf16, mma_f16, pack_b16x2, pack_bf16x2,
                                       pack_f16x2, st_shared_v4)
from numba_attn.gpu.jit import kernel
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fragments import q_start, qk_fragments, warp_rows
from numba_attn.phases.tensor_core.mask import key_ends
from numba_attn.phases.tensor_core.mma_sync import MMA_REGISTRATION, launch_mma
from numba_attn.phases.tensor_core.scheduler import varlen_views
from numba_attn.phases.tensor_core.softmax import masked_update
from numba_attn.variants.stages import PLAIN, stages_of


@functools.cache
def make_mma_kernel(D: int, W: int, Bc: int, causal: bool, bf16: bool, varlen: bool = False, stage=PLAIN):
    """The mma.sync kernel of ``tc_mma`` ``(q, k, v, o, sl2, H, G, Nq, Nk, mods)`` (its docstring has the
    lesson): ``W`` warps of 16 query rows, K/V tiles of ``Bc`` keys staged in padded shared memory.
    ``varlen`` (``tc_mma_varlen``): q, o are (total_q, H, D/2) and k, v (total_k, Hkv, D/2) uint32
    views of packed sequences, ``Nq``/``Nk`` their cu_seqlens, the grid (query blocks of the longest
    sequence, heads, sequences); a block takes its sequence's rows (:func:`varlen_views`) and exits
    when they end before its first row. ``stage``: a variant's (:func:`numba_attn.variants.stages.stages_of`;
    the tile loop walks the block mask's visited tiles, ``mods`` its arrays and block mask, ``()`` plain)."""
    mma = mma_bf16 if bf16 else mma_f16
    pack = pack_bf16x2 if bf16 else pack_f16x2
    Br = 16 * W  # query rows per block (16 per warp)
    threads = 32 * W
    d_padded = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps of Q·Kᵀ (D itself when a multiple of 16)
    qk_steps = d_padded // 16  # k-steps of Q·Kᵀ
    s_tiles = Bc // 8  # n-tiles of S (8 keys each)
    pv_steps = Bc // 16  # k-steps of P·V
    o_tiles = D // 8  # n-tiles of O (8 columns each)
    row_chunks = D // 8  # 16-byte chunks per row of K or V
    k_row_words = d_padded // 2 + 4  # K tile row in words (padded: conflict-free fragment reads)
    v_row_halves = D + 8  # V tile row in halves (padded)
    q_regs = 4 * qk_steps  # Q fragment registers
    s_regs = 4 * s_tiles  # score accumulators
    o_regs = 4 * o_tiles  # output accumulators
    start = q_start(qk_steps, o_regs, False, D // 2)
    qk = qk_fragments(s_tiles, qk_steps, mma)
    update = masked_update(s_tiles, Bc, causal, o_tiles, stage)  # variant, mask, online softmax, O rescaled
    lanes = warp_rows(Br, 16)
    ends = key_ends(Br, 16, causal)
    store = store_fragments(o_tiles, "bf16" if bf16 else "f16")

    def tc_mma(q, k, v, o, sl2, H, G, Nq, Nk, mods):
        # q, k, v, o: uint32 views (two f16/bf16 per word) of (BH, N, D)
        Ks = cuda.shared.array((Bc, k_row_words), uint32, alignment=SMEM_ALIGN)
        Vs = cuda.shared.array((Bc, v_row_halves), uint16, alignment=SMEM_ALIGN)
        if varlen:  # this block's sequence (blockIdx.z) as head-major views; Nq, Nk its lengths
            q, k, v, o, Nq, Nk = varlen_views(q, k, v, o, Nq, Nk)
            if cuda.blockIdx.x * Br >= Nq:
                return
        tid, warp, lane, g, t, bh, kvh, blk0, row0 = lanes(H, G)
        r_lo = row0 + g  # this lane's rows: r_lo and r_lo + 8
        off = Nk - Nq  # causal: row i sees keys j <= i + off

        qf = cuda.local.array(q_regs, uint32)
        acc = cuda.local.array(o_regs, float32)
        m_lo, m_hi, l_lo, l_hi = start(qf, acc, q, bh, r_lo, Nq, t)  # Q's A fragments, O = 0
        s = cuda.local.array(s_regs, float32)

        kv_end, warp_end = ends(blk0, row0, Nq, Nk, off)
        b, h, qt = (cuda.blockIdx.z, bh, cuda.blockIdx.x) if varlen else (bh // H, bh % H, cuda.blockIdx.x)
        kv_end = stage.loop_keys(mods, b, h, qt, kv_end, Bc)  # a variant: Bc times the block mask's visited tiles

        for jv in range(0, kv_end, Bc):
            j0 = stage.tile_start(mods, b, h, qt, jv, Bc)  # (a variant: the visited tile's first key)
            kind = stage.tile_kind(mods, b, h, qt, j0 // Bc)
            # -- stage the K and V tiles: 16 bytes per thread and access
            for e in range(tid, Bc * row_chunks, threads):
                r = e // row_chunks
                c = e - r * row_chunks
                if j0 + r < Nk:
                    x = ld_global_v4(k, kvh, j0 + r, 4 * c)
                    st_shared_v4(Ks, r, 4 * c, x[0], x[1], x[2], x[3])
                    y = ld_global_v4(v, kvh, j0 + r, 4 * c)
                    st_shared_v4(Vs, r, 8 * c, y[0], y[1], y[2], y[3])
                else:
                    z = uint32(0)
                    st_shared_v4(Ks, r, 4 * c, z, z, z, z)
                    st_shared_v4(Vs, r, 8 * c, z, z, z, z)
            if d_padded > D:  # the K columns that complete the last k-step are zero
                for r in range(tid, Bc, threads):
                    z = uint32(0)
                    st_shared_v4(Ks, r, 4 * row_chunks, z, z, z, z)
            cuda.syncthreads()
            if j0 < warp_end:  # warp-uniform: the warp's rows see some key of this tile
                qk(s, qf, Ks, 0, g, t)  # -- S = Q Kᵀ on the tensor cores
                # -- mask keys past the end and (causal) above the diagonal, online softmax on the fragments
                m_lo, m_hi, l_lo, l_hi = update(s, acc, j0, row0, r_lo, t, Nq, Nk, off, m_lo, m_hi, l_lo, l_hi, sl2,
                                                (b, h, kind), mods)
                # -- O += P V: two S n-tiles = one A fragment of P
                for kk in range(pv_steps):
                    a0 = pack(s[8 * kk], s[8 * kk + 1])
                    a1 = pack(s[8 * kk + 2], s[8 * kk + 3])
                    a2 = pack(s[8 * kk + 4], s[8 * kk + 5])
                    a3 = pack(s[8 * kk + 6], s[8 * kk + 7])
                    kr = 16 * kk + 2 * t
                    for dt in range(o_tiles):
                        cc = 8 * dt + g
                        b0 = pack_b16x2(lds(Vs, kr, cc), lds(Vs, kr + 1, cc))
                        b1 = pack_b16x2(lds(Vs, kr + 8, cc), lds(Vs, kr + 9, cc))
                        (acc[4 * dt], acc[4 * dt + 1], acc[4 * dt + 2], acc[4 * dt + 3]) = mma(
                            a0, a1, a2, a3, b0, b1, acc[4 * dt], acc[4 * dt + 1], acc[4 * dt + 2],
                            acc[4 * dt + 3])
            cuda.syncthreads()

        store(o, bh, r_lo, acc, 0, l_lo, l_hi, Nq, t)

    tc_mma.__name__ = tc_mma.__qualname__ = "tc_mma_varlen" if varlen else "tc_mma"
    return kernel(tc_mma)



@register_phase(
    name="tc_mma", order=20, title="Tensor cores: mma.sync m16n8k16, fragments in registers",
    parent="smem_kv",
    description="""
        Q·Kᵀ and P·V as mma.sync.m16n8k16 (f16/bf16 in, f32 accumulate). A warp owns
        16 query rows: Q fragments, score and output accumulators stay in registers;
        the online softmax runs on the accumulator fragments (quad shuffles for the
        row max, row sums reduced once at the end); P is rounded and packed in
        registers into the A fragments of P·V. K/V tiles are staged in padded shared
        memory by the whole block with 128-bit accesses; fragments are read with
        32-bit (K) and 2×16-bit (V) shared loads.
    """,
    lineage="FlashAttention-2 (Dao 2023): warps split Q, P kept in registers; "
            "PTX mma.sync m16n8k16 fragment layouts",
    planned_speedup=60.0,
    variants=True,
    **MMA_REGISTRATION,
)
def tc_mma(problem, warps=8, Bc=0):
    kern = make_mma_kernel(problem.head_dim, warps, Bc, problem.causal, problem.dtype == "bfloat16", False,
                           stages_of(problem.variant))
    return launch_mma(problem, kern, 16 * warps, warps, Bc=Bc)
