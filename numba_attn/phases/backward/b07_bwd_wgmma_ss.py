"""Backward phase 7 — ``bwd_wgmma_ss``: dV and dK from shared memory (SS wgmma), the next Q tile's Sᵀ and dPᵀ
issued before this tile's products are waited for.

Change against ``bwd_wgmma_fused``: dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i take A from shared memory instead of
register fragments: Pᵀ and dSᵀ go into a tile each a warpgroup (64 keys × 64 query rows, K-major, one 32-bit store
a packed pair), and dQ's product reads the dSᵀ tiles transposed (an MN-major A: wgmma's transpose of A). The 32 A
registers a thread held (D128) carry the next tile instead: once dQ_i is added, the next tile's Sᵀ and dPᵀ are
issued behind dK's product, so a warpgroup's chain (Sᵀ → P → dV; dPᵀ → dS → dQ, dK) no longer leaves the tensor
pipe idle between tiles. One block barrier a tile, after the dS stores, also tells that the next tile has landed
(a ring of 3 stages); a warpgroup waits only for the other's dQ before overwriting its dSᵀ tile (named barriers).
dQ's partials go to the float32 accumulator from the registers (``dq="red"``; ``"bulk"``: staged, one bulk
reduction a tile); dV's and dK's A stay in registers as the parent has them (``rs``, the default).

Prediction: the 21% of samples at the tile barrier and part of the idle tensor time recovered: ~1.1-1.2×
``bwd_wgmma_fused`` at fp16 B1 H32 N4096 D128 (~0.85× cuDNN); less at D64. Registers: 217-218 at D64, 252-255 at
D128, no spills (the first version spilled 84-228 bytes at D128: the warpgroup index was not warp-uniform).

Verdict: 1.16× ``bwd_wgmma_fused`` at D128, 1.10× causal, 1.09× at D64 (H200); with the dSᵀ tiles and dQ from
the registers 1.13-1.22× the parent, 0.76-0.86× cuDNN; ``rs`` 1.12-1.15× more at D64 (0.87-0.92× cuDNN, H100),
1.06-1.10× at D128 (0.897-0.923× cuDNN, H200; fp16/bf16 N4096). The default of phase=None.
[experiments/2026-11-28-bwd-ss, experiments/2026-11-28-bwd-smem]
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.bulk import bulk_wait, bulk_wait_read, red_add_f32x4
from numba_attn.gpu.intrinsics import cp_async_wait, pack_bf16x2, pack_f16x2
from numba_attn.gpu.loads import st_shared_b32
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.mbarrier import fence_proxy_async
from numba_attn.gpu.ptx_loads import dynamic_tile
from numba_attn.gpu.warp import FULL_MASK, shfl_sync
from numba_attn.gpu.warpspec import named_barrier_arrive, named_barrier_sync
from numba_attn.gpu.wgmma import make_ring_copy, make_wgmma_ss, make_wgmma_wait, mnmajor_params, row_bytes
from numba_attn.phases.backward.b06_bwd_wgmma_fused import Br
from numba_attn.phases.backward.b06_bwd_wgmma_fused import smem_bytes as fused_smem_bytes
from numba_attn.phases.backward.common import one
from numba_attn.phases.backward.wgmma_steps import (M, fused_reason, kv_elementwise, launch_fused, make_dq_staging,
                                                    make_kv_store, make_products, make_q_ring, make_scores_issue,
                                                    resolve_bc, tile_bytes)
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.pipeline import ring_padding
from numba_attn.variants.stages import PLAIN

DS_FREE = 3  # named barriers 3, 4: warpgroup w may overwrite its dS_i columns (the other's dQ is done with them)


def smem_bytes(D: int, Bc: int, stages: int) -> int:
    """``bwd_wgmma_fused``'s (K_j, V_j, the ring, dS_i, the dQ staging, the rows' statistics), and the Pᵀ tiles
    (64 × 64 a warpgroup)."""
    return fused_smem_bytes(D, Bc, stages) + tile_bytes(Bc, Br)


@functools.cache
def make_ss_accumulate(bf16: bool, D: int):
    """``accumulate(acc, sm, a_off, sm, b_off)``: acc += A · (a ring tile of Br rows, transposed: MN-major B),
    issued, not waited for. A from shared memory: the warpgroup's K-major Pᵀ or dSᵀ tile (64 keys × Br query
    rows)."""
    rb = row_bytes(D)
    offs, lbo, sbo = mnmajor_params(Br, Br // 16, rb)
    return make_wgmma_ss("bf16" if bf16 else "f16", D, True, False, offs, lbo, sbo, rb, False)


@functools.cache
def make_dq_product_t(bf16: bool, D: int, Bc: int):
    """``dq_product(acc, sm, dst_off, sm, k_off)``: ``bwd_wgmma_fused``'s acc = dS_i · K_j[:, half] (64 × D/2, over
    the block's Bc keys) with A = dS_i read from the warpgroups' dSᵀ tiles (at ``dst_off``, one after the other:
    row = key 0 … Bc − 1, 128 bytes of query rows) as an MN-major A: k-step s = key rows 16s … 16s + 15."""
    rb = row_bytes(D)
    T64 = tile_bytes(M, D)
    offs = tuple((s // 4) * T64 + (s % 4) * 16 * rb for s in range(Bc // 16))
    return make_wgmma_ss("bf16" if bf16 else "f16", D // 2, True, True, offs, M * rb, 8 * rb, rb, False,
                         mnmajor_params(Bc, Bc // 16, 2 * M))


@functools.cache
def make_pt_store(bf16: bool):
    """``store_pt(sm, pt_b, St, ww, g, t)``: the warpgroup's Pᵀ (accumulator layout: keys 16ww + g + 8hi, query
    rows 8nt + 2t and + 1) packed into its K-major tile at byte ``pt_b`` (a multiple of 128; row = key, 128 bytes of
    query rows, chunk nt at nt ^ (key mod 8)): one 32-bit store a pair, a warp's store 8 rows × 4 words in distinct
    banks."""
    pack2 = pack_bf16x2 if bf16 else pack_f16x2

    @device
    def store_pt(sm, pt_b, St, ww, g, t):
        # x: row 16ww + g's word t in chunk g (pt_b a multiple of 128): chunk nt ^ g is at x ^ 16nt, row + 8 at
        # + 1024. x comes through a shuffle from the lane itself: the compiler keeps one register across the walk
        # and forms the addresses here (one XOR a store), instead of hoisting eight out of the loop (spilled at D128)
        x = shfl_sync(FULL_MASK, pt_b + (16 * ww + g) * 128 + 16 * g + 4 * t, cuda.laneid)
        for hi in range(2):
            for nt in range(Br // 8):
                st_shared_b32(sm, (x ^ (16 * nt)) + 1024 * hi, pack2(St[4 * nt + 2 * hi], St[4 * nt + 2 * hi + 1]))

    return store_pt


@functools.cache
def kv_in_shared(bf16: bool, D: int, Bc: int, STAGES: int):
    """K_j and V_j as the A of Sᵀ and dPᵀ straight from their shared tiles: ``(issue, load_kv, NKV)``, ``issue(St,
    dPt, kv, sm, sb, own_b, ring_b, w)`` (``kv``: the registers a child phase holds them in; none here, NKV = 1)."""
    issue_sm = make_scores_issue(bf16, D, Bc, STAGES)

    @device
    def issue(St, dPt, kv, sm, sb, own_b, ring_b, w):
        issue_sm(St, dPt, sm, sb, own_b, ring_b, w)

    @device
    def load_kv(kv, sm, own_b, w, ww, g, t):
        return

    return issue, load_kv, 1


@functools.cache
def ss_kv_tile(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one, red: bool = False,
               rs: bool = False, kv_operands=kv_in_shared):
    """``(issue, scores, grads, issue_next, publish)``: one Q tile for warpgroup w (its 64 keys). ``issue``: Sᵀ,
    dPᵀ in flight. ``scores``: Pᵀ into its tile, dV_j += Pᵀ dO_i issued (SS), dSᵀ into its tile (after the other
    warpgroup's dQ of the tile before). The kernel's block barrier follows. ``grads``: dQ_i's halves = dS_i K_j (dS_i
    read transposed from the dSᵀ tiles), dK_j += dSᵀ Q_i (SS) behind the last, each half added to ``dqa`` from the
    registers (``red``) or staged once done; ``issue_next``: the next tile's Sᵀ and dPᵀ behind dK; ``publish``:
    the staged partial added by one bulk reduction. dK is waited for by the next tile's first wait (products
    complete in order) or, after the last tile, by ``publish``. ``rs``: dV's and dK's A from the registers (P and
    dS packed, as ``bwd_wgmma_fused`` has them) instead of the Pᵀ and dSᵀ tiles (the dSᵀ tile is still stored for
    dQ's product). ``kv_operands``: where Sᵀ's and dPᵀ's A come from (:func:`kv_in_shared`)."""
    issue = kv_operands(bf16, D, Bc, STAGES)[0]
    pack, accumulate = make_products(bf16, Br, D, STAGES)[2:]
    acc_p = make_ss_accumulate(bf16, D)
    wait_s = make_wgmma_wait(1, Br // 2)  # Sᵀ done, dPᵀ in flight
    wait_dp = make_wgmma_wait(1, Br // 2)  # dPᵀ done, dV in flight
    wait_dq = make_wgmma_wait(0, D // 4, D // 2)
    wait_dq_dk = make_wgmma_wait(1, D // 4, D // 2)  # all but the newest group (dK's product)
    wait_dk = make_wgmma_wait(0, D // 2)
    wait_dk_next = make_wgmma_wait(2, D // 2)
    probabilities, score_grads = kv_elementwise(Br, causal, stage, dmod)
    dq_product = make_dq_product_t(bf16, D, Bc)
    stage_dq, add_dq = make_dq_staging(D, Bc)
    HALF = M * D // 2  # floats of a dQ half

    @device
    def red_dq(dqa, at, tw, dQ):
        """``red``: a dQ half added to ``dqa`` from the registers, 16 bytes a reduction, in the staging's thread order
        (values 4m … 4m + 3 of thread tw at ``at`` + 512m + 4tw: a warp's reductions are one 512-byte run)."""
        for m in range(D // 16):
            red_add_f32x4(dqa, at + 512 * m + 4 * tw, dQ[4 * m], dQ[4 * m + 1], dQ[4 * m + 2], dQ[4 * m + 3])

    store_pt = make_pt_store(bf16)
    WGS = Bc // M
    NH = 2 // WGS  # dQ halves per warpgroup
    TILE = tile_bytes(Br, D)
    HALF_COLS = D // 2 * 2  # bytes of half of a K row (a dQ half's columns, within a 64-column block)
    rb = row_bytes(D)
    A64 = M * 2 * M  # bytes of a warpgroup's Pᵀ tile and of its dSᵀ tile (64 keys × Br = 64 query rows)

    @device
    def scores(regs, sm, sb, i0, j_lo, where, Nq, Nk, scale, var):
        St, dPt, dK, dV, Gt, dQ, pf, dsf = regs
        rows, own_b, ring_b, ds_b, pt_b, w, tw, ww, g, t, lead = where
        wait_s(St, St)  # Sᵀ done, dPᵀ in flight
        probabilities(St, Gt, rows, sb, i0, j_lo, t, Nq, Nk, scale, var)
        if rs:
            pack(pf, St)
            accumulate(dV, pf, 0, sm, ring_b + (STAGES + sb) * TILE)  # dV_j += Pᵀ dO_i from the registers
        else:
            store_pt(sm, pt_b + w * A64, St, ww, g, t)
            fence_proxy_async()  # the stores, then the tensor cores' reads of the Pᵀ tile
            named_barrier_sync(1 + w, 128)  # the warpgroup's Pᵀ is in its tile
            acc_p(dV, sm, pt_b + w * A64, sm, ring_b + (STAGES + sb) * TILE)  # dV_j += Pᵀ dO_i, in flight
        wait_dp(dPt, dPt)  # dPᵀ done, dV in flight
        score_grads(St, dPt, Gt, rows, sb, t)
        if rs:
            pack(dsf, dPt)  # dK's A
        if WGS > 1:  # (before the first tile: the other's arrival before the walk)
            named_barrier_sync(DS_FREE + w, 256)  # the other warpgroup's dQ of the tile before has read dS_i
        store_pt(sm, ds_b + w * A64, dPt, ww, g, t)  # dSᵀ into the warpgroup's tile, as Pᵀ
        fence_proxy_async()  # the stores, then the tensor cores' reads of dS_i
        if lead and not red:
            bulk_wait_read(0)  # the last tile's dQ reduction has read the staging tile

    @device
    def grads(regs, sm, sb, where, out):
        St, dPt, dK, dV, Gt, dQ, pf, dsf = regs
        rows, own_b, ring_b, ds_b, pt_b, w, tw, ww, g, t, lead = where
        for hh in range(NH):
            h = w * NH + hh
            # dQ_i[:, half h] = dS_i K_j[:, half h] (half h: column block h at D128, 64 bytes in at D64), dS_i
            # read transposed from the dSᵀ tiles
            dq_product(dQ, sm, ds_b, sm, own_b + (h * (D // 2) // 64) * M * rb + (h * HALF_COLS) % rb)
            if hh == NH - 1:
                if rs:
                    accumulate(dK, dsf, 0, sm, ring_b + sb * TILE)  # dK_j += dSᵀ Q_i, behind dQ's last half
                else:
                    acc_p(dK, sm, ds_b + w * A64, sm, ring_b + sb * TILE)
                wait_dq_dk(dQ, dV)  # dV and the half done, dK in flight
            else:
                wait_dq(dQ, dV)
            if red:
                red_dq(out[1], out[2] + (w * NH + hh) * HALF, tw, dQ)
            else:
                stage_dq(out[0], hh, tw, dQ)

    @device
    def issue_next(St, dPt, kv, sm, sb, where):
        """The next tile's Sᵀ and dPᵀ, behind dK's product (once this warpgroup's dQ is done with dS_i)."""
        w = where[5]
        if WGS > 1:
            named_barrier_arrive(DS_FREE + 1 - w, 256)  # done with dS_i: the other may overwrite its columns
        issue(St, dPt, kv, sm, sb + 1 if sb + 1 < STAGES else 0, where[1], where[2], w)

    @device
    def publish(dK, last, where, out):
        """The staged partial added to ``dqa`` by one bulk reduction; after the last tile, dK waited for."""
        w, lead = where[5], where[10]
        staging, dqa, doff = out
        if not red:
            add_dq(staging, dqa, doff, w, lead)
        if last:
            wait_dk(dK, dK)
        else:
            wait_dk_next(dK, dK)  # dK done, the next tile's Sᵀ and dPᵀ in flight

    return issue, scores, grads, issue_next, publish


@functools.cache
def make_grad_ss(D: int, Bc: int, STAGES: int, causal: bool, bf16: bool, stage=PLAIN, dmod=one, red: bool = False,
                 rs: bool = False, kv_operands=kv_in_shared):
    """grad_ss: ``bwd_wgmma_fused``'s kernel (Bc/64 warpgroups of 64 keys walking the Q tiles that see them)
    with the tile step of :func:`ss_kv_tile`: one block barrier a tile, after the dS stores, which also tells that
    the next tile has landed; the ring refilled after it (STAGES ≥ 3: the tile two ahead, into the stage of the
    tile before, whose products every warpgroup has waited for)."""
    issue, scores, grads, issue_next, publish = ss_kv_tile(D, Bc, STAGES, causal, bf16, stage, dmod, red, rs,
                                                           kv_operands)
    _, load_kv, NKV = kv_operands(bf16, D, Bc, STAGES)
    WGS = Bc // M
    THREADS = 128 * WGS
    copy_own = make_ring_copy(D, M, WGS, 128)  # K_j's and V_j's 64-key tiles: one per warpgroup
    walk_of, fill, _, following, q_tile_of, ready, refill = make_q_ring(D, Br, STAGES, THREADS, causal, stage)
    store_kv = make_kv_store(D, bf16)
    OWN_B = 2 * WGS * tile_bytes(M, D)  # K_j's tiles, then V_j's
    RING_B = 2 * STAGES * tile_bytes(Br, D)
    DS_B = tile_bytes(Br, Bc)
    PT_B = tile_bytes(Bc, Br)
    STAGE_B = Br * D * 4
    ROWS_B = STAGES * 2 * Br * 4
    TOTAL_ROWS = (OWN_B + RING_B + DS_B + PT_B + STAGE_B + ROWS_B) // 16
    STAT_ROWS = 2 * STAGES
    OWN_ROWS, RING_ROWS = OWN_B // 16, RING_B // 16  # (compile-time: a view's shape)
    NH = 2 // WGS
    HALF = Br * D // 2  # floats of a half of dQ_i
    NQ = D // 4  # its accumulator registers
    STAGE_ROWS = NH * NQ  # a warpgroup's staging rows (of 128 floats)
    NS, NA, NP = Br // 2, D // 2, Br // 4
    NG = NS if stage.scored else 1
    AHEAD = STAGES - 3  # copy groups that may stay in flight when the next tile must have landed

    @kernel
    def grad_ss(q, k, v, do, st, dk, dv, dqa, scale, H, G, Nq, Nk, mods):
        pad = ring_padding(dynamic_tile(0, 1, 4))
        sm = dynamic_tile(pad, TOTAL_ROWS, 4)  # words: K_j, V_j | ring | dS_i | Pᵀ | staging | rows
        tid = cuda.threadIdx.x
        # the warpgroup (keys 64w ..): lane 0's, known warp-uniform to ptxas (the descriptors of Sᵀ and dPᵀ formed
        # at each issue in uniform registers; from tid // 128, sixteen 64-bit A descriptors were kept across the
        # walk and spilled at D128)
        w = shfl_sync(FULL_MASK, tid // 128, 0)
        tw = tid % 128
        ww, lane = tw // 32, cuda.laneid
        g, t = lane // 4, lane % 4
        lead = tw == 0  # issues the warpgroup's reductions
        kvh = cuda.blockIdx.y
        jb = cuda.blockIdx.x * Bc
        own = dynamic_tile(pad, OWN_ROWS, 4)
        ring = dynamic_tile(pad + OWN_B // 4, RING_ROWS, 4)
        staging = dynamic_tile(pad + (OWN_B + RING_B + DS_B + PT_B) // 4 + w * NH * HALF, STAGE_ROWS, 128)
        rows = dynamic_tile(pad + (OWN_B + RING_B + DS_B + PT_B + STAGE_B) // 4, STAT_ROWS, Br)
        copy_own(own, k, v, WGS * cuda.blockIdx.x + w, w, tw, kvh, Nk)
        walk, bh0, b = walk_of(jb, cuda.blockIdx.x, kvh, H, G, Nq, Nk, mods)
        to = (ring, rows, q, do, st, tid, Nq)
        cur, nxt, sb_next = fill(walk, bh0, to)
        St = cuda.local.array(NS, float32)
        dPt = cuda.local.array(NS, float32)
        Gt = cuda.local.array(NG, float32)
        dK = cuda.local.array(NA, float32)
        dV = cuda.local.array(NA, float32)
        dQ = cuda.local.array(NQ, float32)
        pf = cuda.local.array(NP, uint32)  # (rs: P and dS packed, dV's and dK's A)
        dsf = cuda.local.array(NP, uint32)
        kv = (cuda.local.array(NKV, uint32), cuda.local.array(NKV, uint32))  # (K_j's, V_j's A where held)
        for e in range(NA):
            dK[e] = float32(0.0)
            dV[e] = float32(0.0)
        j_lo = jb + 64 * w + 16 * ww + g
        where = (rows, 0, OWN_B, OWN_B + RING_B, OWN_B + RING_B + DS_B, w, tw, ww, g, t, lead)
        regs = (St, dPt, dK, dV, Gt, dQ, pf, dsf)
        ready()  # the first tile (and K_j, V_j) has landed
        load_kv(kv, sm, 0, w, ww, g, t)
        if cur[0] < G:
            issue(St, dPt, kv, sm, 0, 0, OWN_B, w)
            if WGS > 1:  # nothing of dS_i to wait for at the first tile: no flag kept across the walk
                named_barrier_arrive(DS_FREE + 1 - w, 256)
        sb = 0
        while cur[0] < G:
            after = following(cur, walk)
            h = walk[4] + cur[0]
            qt = q_tile_of(cur, walk)
            var = (b, h, stage.tile_kind(mods, b, h, qt, cuda.blockIdx.x), mods)
            scores(regs, sm, sb, qt * Br, j_lo, where, Nq, Nk, scale, var)
            cp_async_wait(AHEAD)  # the next tile has landed (this thread's copies) ...
            cuda.syncthreads()  # ... every thread's; every warpgroup's dSᵀ is in dS_i, its tile before done
            nxt, sb_next = refill(nxt, sb_next, walk, bh0, to)  # into the stage of the tile before
            out = (staging, dqa, (bh0 + cur[0]) * dqa.shape[1] + qt * (Br * D))  # (dqa's shape: no 64-bit tile
            # count kept live across the walk)
            grads(regs, sm, sb, where, out)
            if after[0] >= G:  # (a path of its own: Sᵀ, dPᵀ carried to the next tile only from their issue)
                publish(dK, True, where, out)
                break
            issue_next(St, dPt, kv, sm, sb, where)
            publish(dK, False, where, out)
            sb = sb + 1 if sb + 1 < STAGES else 0
            cur = after
        if lead and not red:
            bulk_wait(0)  # the staging tile stays valid until the last reduction has read it
        store_kv(dk, dv, dK, dV, kvh, j_lo, t, Nk, scale)

    return grad_ss


def supports_ss(problem, Bc, stages, dq="red", rs=None):
    if dq not in ("bulk", "red"):
        return f"dq={dq!r}: dQ's partials are added by one bulk reduction a tile ('bulk') or from the registers ('red')"
    return fused_reason(problem, Bc, stages, 3, "the next tile landed while this one is read, before the stage of "
                        "the one before is refilled", smem_bytes)


def resolve_ss(problem, Bc, rs=None, **params):
    """Bc=0: 128 keys a block (two warpgroups) at every head dim. Unlike the parent's one-warpgroup blocks at D64:
    with the next tile issued early, 128 keys are 1.07× faster than 64 at D64 (1.04× causal; H200, fp16 B1 H32
    N4096, experiments/2026-11-28-bwd-ss). rs=None: dV's and dK's A from the registers, 1.12-1.15× the shared
    tiles at D64 (H100), 1.06-1.10× at D128 (H200; fp16/bf16 B1 H32 N4096, experiments/2026-11-28-bwd-smem)."""
    return {"Bc": Bc or 128, "rs": True if rs is None else bool(rs)}


@register_phase(
    name="bwd_wgmma_ss", order=107,
    title="Backward in one wgmma kernel, dV and dK from shared memory, the next tile's scores issued early",
    parent="bwd_wgmma_fused", kind="backward",
    description="""
        bwd_wgmma_fused with dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i as SS wgmma: Pᵀ through a shared tile of its own,
        dSᵀ through one too, read transposed (an MN-major A) by dQ's product. The A registers freed carry the
        next Q tile's Sᵀ and dPᵀ, issued behind dK's product once dQ is added (from the registers by default);
        one block barrier a tile (after the dS stores; a ring of 3 stages refilled after it), named barriers
        between the warpgroups for dS.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) backward: P and dS through shared memory for the dV and dK "
            "products, the next tile's products issued before this tile's are waited for",
    planned_speedup=1550.0,  # against bwd_naive, as every planned speedup: ~1.15x bwd_wgmma_fused (1350)
    dtypes=("float16", "bfloat16"), requires_cc="sm_90a", head_dims=(64, 128),
    space={"Bc": [64, 128], "stages": [3, 4], "dq": ["bulk", "red"], "rs": [False, True]},
    sim_params={"Bc": 128, "stages": 3}, supports=supports_ss, resolve=resolve_ss, variants=True,
)
def bwd_wgmma_ss(problem, Bc=0, stages=3, dq="red", rs=None):
    return launch_fused("bwd_wgmma_ss", problem, Bc, stages, make_grad_ss, smem_bytes, dq == "red", bool(rs))
