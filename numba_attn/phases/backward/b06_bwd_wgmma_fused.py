"""Backward phase 6 — ``bwd_wgmma_fused``: one kernel, five products; dQ added to a float32 accumulator by bulk
reductions.

Change against ``bwd_wgmma``: no dQ kernel (its split computes S and dP twice: seven products instead of five).
A block of two warpgroups owns 128 keys (64 each, dK_j and dV_j in registers; ``Bc=64``: one warpgroup doing both
halves of dQ, the default up to D64) and walks the Q tiles of 64 rows that see them; after Sᵀ, dPᵀ, Pᵀ, dSᵀ and
the issue of dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i as in ``bwd_wgmma``, each warpgroup stores its dSᵀ into one shared
tile dS_i (64 rows × 128 keys, K-major), and after a barrier

    dQ_i[:, half w] = dS_i · K_j[:, half w]   (a 64 × D/2 product over the block's 128 keys, both from shared memory)

goes through a shared float32 staging tile to ``cp.reduce.async.bulk ... add.f32`` (:mod:`numba_attn.gpu.bulk`):
one instruction per warpgroup and tile adds its 64 × D/2 partial into a float32 accumulator at the L2, while the
block goes on (FlashAttention-3's dQ accumulation). The accumulator is kept in the staging's thread order
(conflict-free stores); a last kernel writes dQ = scale · dQacc in the inputs' dtype and zeroes the accumulator
for the next call. The order of the adds varies: dQ is not bitwise reproducible.

Prediction: 5/7 of the products, the dQ walk's loads gone, the reductions (Nk/128 × Nq × D × 4 bytes per head:
2.1 GB at fp16 B1 H32 N4096 D128) at the L2 under the products: ~1.35× ``bwd_wgmma`` (2.60 → ~1.9 ms, ~0.7×
cuDNN's 1.33).

Verdict: 1.25× ``bwd_wgmma_overlap`` at D128 (1.80 against 2.26 ms, H200, fp16 B1 H32 N4096), 0.65-0.76× cuDNN
over N 1024/4096, D 64/128; dSᵀ's transpose through shared memory is the cost the prediction missed (the
steps: experiments/2026-11-27-bwd-fused); the tile schedule below (copies under Sᵀ and dPᵀ, dQ before dK) 1-5%
more, the warpgroups' lockstep left (experiments/2026-11-28-bwd-schedule). phase=None's second choice.
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.bulk import bulk_wait, bulk_wait_read
from numba_attn.gpu.loads import st_shared_b16
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.mbarrier import fence_proxy_async
from numba_attn.gpu.ptx_loads import dynamic_tile
from numba_attn.gpu.wgmma import make_ring_copy, make_wgmma_ss, make_wgmma_wait, row_bytes
from numba_attn.phases.backward.common import one
from numba_attn.phases.backward.wgmma_steps import (M, fused_reason, kv_elementwise, launch_fused, make_dq_staging,
                                                    make_kv_store, make_products, make_q_ring, make_scores_issue,
                                                    resolve_bc, tile_bytes)
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.pipeline import ALIGN_BYTES, ring_padding
from numba_attn.variants.stages import PLAIN

Br = M  # Q rows per tile: the M of the dQ product


def smem_bytes(D: int, Bc: int, stages: int) -> int:
    """K_j and V_j (Bc rows each), the ring of ``stages`` Q_i/dO_i pairs, dS_i (64 × Bc), the float32 dQ
    staging (64 × D), the rows' lse and Delta per stage, the alignment padding."""
    return (2 * tile_bytes(Bc, D) + 2 * stages * tile_bytes(Br, D) + tile_bytes(Br, Bc) + Br * D * 4
            + stages * 2 * Br * 4 + ALIGN_BYTES)


@functools.cache
def make_dq_product(bf16: bool, D: int, Bc: int):
    """``dq_product(acc, sm, ds_off, sm, k_off)``: acc = dS_i · K_j[:, half], a 64 × D/2 product over the block's
    Bc keys (Bc/16 k-steps): A = dS_i (64 rows × Bc keys, K-major: 64-key column blocks), B = K_j's 64-key tiles
    as an MN-major operand (k-steps 0-3 in the first tile, 4-7 in the second), from byte ``k_off`` (the half's
    columns). Issued, not waited for."""
    rb = row_bytes(D)
    T64 = tile_bytes(M, D)
    offs = tuple((s // 4) * T64 + (s % 4) * 16 * rb for s in range(Bc // 16))
    return make_wgmma_ss("bf16" if bf16 else "f16", D // 2, True, True, offs, M * rb, 8 * rb, rb, False)


@functools.cache
def make_ds_store():
    """``store_ds(sm, ds_b, dsf, w, ww, g, t)``: warpgroup w's dSᵀ, packed (``dsf``, the A fragment of dK's
    product: register 2nt + hi holds keys 16ww + g + 8hi of its 64, query rows 8nt + 2t and + 1) into dS_i at byte
    ``ds_b`` of ``sm`` (row = query row, the block's keys in swizzled 64-key column blocks, 16-bit): each value by
    one 16-bit store. A store instruction writes 4 rows × 8 keys, the
    rows' chunks in distinct banks (the swizzle); two lanes share a word. (Pairing neighbouring keys into 32-bit
    words by a shuffle halves the stores but cost 1.1 ms of 2.6 at D64: experiments/2026-11-27-bwd-fused.)"""
    @device
    def store_ds(sm, ds_b, dsf, w, ww, g, t):
        for hi in range(2):
            for c in range(2):
                # row r = 8nt + 2t + c, key 16ww + 8hi + g: chunk (2ww + hi) ^ (r mod 8), the same for every nt
                at = ds_b + w * M * 128 + (2 * t + c) * 128 + 16 * ((2 * ww + hi) ^ (2 * t + c)) + 2 * g
                for nt in range(Br // 8):
                    st_shared_b16(sm, at + 1024 * nt, dsf[2 * nt + hi] >> (16 * c))

    return store_ds


@functools.cache
def fused_kv_tile(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one,
                  overlap: bool = False):
    """``(issue, kv_tile)``: one Q tile of the fused kernel for warpgroup w (its 64 keys). ``issue``: Sᵀ and dPᵀ,
    in flight (the kernel issues the ring's next copies under them); ``kv_tile``: Pᵀ, dSᵀ; dV_j += Pᵀ dO_i
    issued; dSᵀ into dS_i; a barrier (every warpgroup's part of dS_i); dQ_i's halves (the warpgroup's one of two,
    or both when it is alone) = dS_i K_j with dK_j += dSᵀ Q_i issued behind the first, each half staged as soon
    as it is done (under dK's product) and added to ``dqa`` by one bulk reduction. ``overlap``: Pᵀ computed while
    dPᵀ runs and dSᵀ while dV's product runs (``bwd_wgmma_overlap``'s schedule: a wait for all but the newest
    group)."""
    _, wait_two, pack, accumulate = make_products(bf16, Br, D, STAGES)
    issue = make_scores_issue(bf16, D, Bc, STAGES)
    wait_older = make_wgmma_wait(1, Br // 2)
    wait_dq_dv = make_wgmma_wait(1, D // 4, D // 2)  # all but the newest group (dK's product)
    wait_dq_dk = make_wgmma_wait(0, D // 4, D // 2)
    wait_dk = make_wgmma_wait(0, D // 2)
    probabilities, score_grads = kv_elementwise(Br, causal, stage, dmod)
    dq_product = make_dq_product(bf16, D, Bc)
    stage_dq, add_dq = make_dq_staging(D, Bc)
    store_ds = make_ds_store()
    NH = 2 // (Bc // M)  # dQ halves per warpgroup
    TILE = tile_bytes(Br, D)
    HALF_COLS = D // 2 * 2  # bytes of half of a K row (a dQ half's columns, within a 64-column block)
    rb = row_bytes(D)

    @device
    def kv_tile(regs, sm, sb, i0, j_lo, where, Nq, Nk, scale, var, out):
        St, dPt, pf, dsf, dK, dV, Gt, dQ = regs
        rows, own_b, ring_b, ds_b, w, tw, ww, g, t, lead = where
        staging, dqa, doff = out
        if overlap:
            wait_older(St, St)  # Sᵀ done, dPᵀ in flight
            probabilities(St, Gt, rows, sb, i0, j_lo, t, Nq, Nk, scale, var)
            pack(pf, St)
            accumulate(dV, pf, 0, sm, ring_b + (STAGES + sb) * TILE)  # dV_j += Pᵀ dO_i, in flight
            wait_older(dPt, dPt)  # dPᵀ done, dV in flight
            score_grads(St, dPt, Gt, rows, sb, t)
            pack(dsf, dPt)
            store_ds(sm, ds_b, dsf, w, ww, g, t)
        else:
            wait_two(St, dPt)
            probabilities(St, Gt, rows, sb, i0, j_lo, t, Nq, Nk, scale, var)
            score_grads(St, dPt, Gt, rows, sb, t)
            pack(pf, St)
            pack(dsf, dPt)
            store_ds(sm, ds_b, dsf, w, ww, g, t)
            accumulate(dV, pf, 0, sm, ring_b + (STAGES + sb) * TILE)  # dV_j += Pᵀ dO_i, in flight
        fence_proxy_async()  # the stores, then the tensor cores' reads of dS_i
        if lead:
            bulk_wait_read(0)  # the last tile's dQ reduction has read the staging tile
        cuda.syncthreads()  # every warpgroup's dSᵀ is in dS_i
        for hh in range(NH):
            h = w * NH + hh
            # dQ_i[:, half h] = dS_i K_j[:, half h] (half h: column block h at D128, 64 bytes in at D64)
            dq_product(dQ, sm, ds_b, sm, own_b + (h * (D // 2) // 64) * M * rb + (h * HALF_COLS) % rb)
            if hh == 0:
                accumulate(dK, dsf, 0, sm, ring_b + sb * TILE)  # dK_j += dSᵀ Q_i, behind dQ's first half
                wait_dq_dv(dQ, dV)  # dV and the half done, dK in flight
            else:
                wait_dq_dk(dQ, dK)
            stage_dq(staging, hh, tw, dQ)
        add_dq(staging, dqa, doff, w, lead)
        if NH == 1:
            wait_dk(dK, dK)  # (the two-half walk waited for it before its second half)

    return issue, kv_tile


@functools.cache
def make_grad_fused(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one,
                    overlap: bool = False):
    """grad_fused: a block of Bc/64 warpgroups owns Bc keys of one KV head (64 each), walks the Q tiles (64 rows)
    of its G query heads that see them, the tiles through a cp.async ring (:func:`make_q_ring`); dK_j, dV_j in
    registers, each tile's dQ_i partial added to ``dqa`` by a bulk reduction per warpgroup."""
    issue, kv_tile = fused_kv_tile(D, Bc, STAGES, causal, bf16, stage, dmod, overlap)
    WGS = Bc // M
    THREADS = 128 * WGS
    copy_own = make_ring_copy(D, M, WGS, 128)  # K_j's and V_j's 64-key tiles: one per warpgroup
    walk_of, fill, _, following, q_tile_of, ready, refill = make_q_ring(D, Br, STAGES, THREADS, causal, stage)
    store_kv = make_kv_store(D, bf16)
    OWN_B = 2 * WGS * tile_bytes(M, D)  # K_j's tiles, then V_j's
    RING_B = 2 * STAGES * tile_bytes(Br, D)
    DS_B = tile_bytes(Br, Bc)
    STAGE_B = Br * D * 4
    ROWS_B = STAGES * 2 * Br * 4
    TOTAL_ROWS = (OWN_B + RING_B + DS_B + STAGE_B + ROWS_B) // 16
    STAT_ROWS = 2 * STAGES
    OWN_ROWS, RING_ROWS = OWN_B // 16, RING_B // 16  # (compile-time: a view's shape)
    NH = 2 // WGS
    HALF = Br * D // 2  # floats of a half of dQ_i
    NQ = D // 4  # its accumulator registers
    STAGE_ROWS = NH * NQ  # a warpgroup's staging rows (of 128 floats)
    NS, NA, NP = Br // 2, D // 2, Br // 4
    NG = NS if stage.scored else 1

    @kernel
    def grad_fused(q, k, v, do, st, dk, dv, dqa, scale, H, G, Nq, Nk, mods):
        pad = ring_padding(dynamic_tile(0, 1, 4))
        sm = dynamic_tile(pad, TOTAL_ROWS, 4)  # words: K_j, V_j | ring | dS_i | staging | rows
        tid = cuda.threadIdx.x
        w = tid // 128  # the warpgroup: keys 64w .. of the block
        tw = tid % 128
        ww, lane = tw // 32, cuda.laneid
        g, t = lane // 4, lane % 4
        lead = tw == 0  # issues the warpgroup's reductions
        kvh = cuda.blockIdx.y
        jb = cuda.blockIdx.x * Bc
        own = dynamic_tile(pad, OWN_ROWS, 4)
        ring = dynamic_tile(pad + OWN_B // 4, RING_ROWS, 4)
        staging = dynamic_tile(pad + (OWN_B + RING_B + DS_B) // 4 + w * NH * HALF, STAGE_ROWS, 128)
        rows = dynamic_tile(pad + (OWN_B + RING_B + DS_B + STAGE_B) // 4, STAT_ROWS, Br)
        copy_own(own, k, v, WGS * cuda.blockIdx.x + w, w, tw, kvh, Nk)
        walk, bh0, b = walk_of(jb, cuda.blockIdx.x, kvh, H, G, Nq, Nk, mods)
        to = (ring, rows, q, do, st, tid, Nq)
        cur, nxt, sb_next = fill(walk, bh0, to)
        St = cuda.local.array(NS, float32)
        dPt = cuda.local.array(NS, float32)
        pf = cuda.local.array(NP, uint32)
        dsf = cuda.local.array(NP, uint32)
        Gt = cuda.local.array(NG, float32)
        dK = cuda.local.array(NA, float32)
        dV = cuda.local.array(NA, float32)
        dQ = cuda.local.array(NQ, float32)
        for e in range(NA):
            dK[e] = float32(0.0)
            dV[e] = float32(0.0)
        j_lo = jb + 64 * w + 16 * ww + g
        where = (rows, 0, OWN_B, OWN_B + RING_B, w, tw, ww, g, t, lead)
        NQT = dqa.shape[1] // (Br * D)
        sb = 0
        while cur[0] < G:
            ready()  # the tile has landed; every warp is done with the stage refilled next
            issue(St, dPt, sm, sb, 0, OWN_B, w)
            nxt, sb_next = refill(nxt, sb_next, walk, bh0, to)  # the next copies, under Sᵀ and dPᵀ
            h = walk[4] + cur[0]
            qt = q_tile_of(cur, walk)
            var = (b, h, stage.tile_kind(mods, b, h, qt, cuda.blockIdx.x), mods)
            kv_tile((St, dPt, pf, dsf, dK, dV, Gt, dQ), sm, sb, qt * Br, j_lo, where, Nq, Nk, scale, var,
                    (staging, dqa, ((bh0 + cur[0]) * NQT + qt) * Br * D))
            sb = sb + 1 if sb + 1 < STAGES else 0
            cur = following(cur, walk)
        if lead:
            bulk_wait(0)  # the staging tile stays valid until the last reduction has read it
        store_kv(dk, dv, dK, dV, kvh, j_lo, t, Nk, scale)

    return grad_fused


def _supports(problem, Bc, stages, overlap):
    return fused_reason(problem, Bc, stages, 2, "tile it+1 loading while tile it is read", smem_bytes)


@register_phase(
    name="bwd_wgmma_fused", order=106,
    title="Backward in one wgmma kernel: dS through shared memory, dQ added by bulk reductions (five products)",
    parent="bwd_wgmma", kind="backward",
    description="""
        bwd_wgmma's dK/dV kernel, one or two warpgroups of 64 keys a block (Bc = 64 up to D64, 128 above),
        computes dQ too: each warpgroup stores its dSᵀ into a shared dS tile, and dQ_i = dS_i K_j (both from
        shared memory, a warpgroup a half of its columns) goes through a float32 staging tile to one
        cp.reduce.async.bulk add per warpgroup and Q tile into a float32 accumulator; a last kernel writes dQ.
        S and dP are computed once (five products instead of seven). dQ is not bitwise reproducible.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) backward: one kernel over K/V blocks, dS through shared memory, "
            "dQ accumulated in float32 by TMA reduce-add",
    planned_speedup=1350.0,  # against bwd_naive, as every planned speedup: ~1.35x bwd_wgmma (1000)
    dtypes=("float16", "bfloat16"), requires_cc="sm_90a", head_dims=(64, 128),
    space={"Bc": [64, 128], "stages": [2, 3], "overlap": [False, True]},
    sim_params={"Bc": 128, "stages": 2, "overlap": True}, supports=_supports, resolve=resolve_bc, variants=True,
)
def bwd_wgmma_fused(problem, Bc=0, stages=2, overlap=True):
    return launch_fused("bwd_wgmma_fused", problem, Bc, stages, make_grad_fused, smem_bytes, bool(overlap))
