"""The loads of the 8-bit fragment kernel (frag8.py): direct 16-byte loads of a warp step's codes and
scales with the L2 prefetch (:func:`make_frag8_loads`), and the cp.async ring of steps in flight
(:func:`make_frag8_ring`)."""
from __future__ import annotations

import functools

from numba import float32, uint64

from numba_attn.gpu.intrinsics import ld_global_v2, ld_global_v4, ld_shared_v4
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.prefetch import prefetch_l2_at
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.paged import page_steps


def step_shape(D: int, P: int, KV_FORMAT: int, STEP_HEADS: int):
    """A warp step's shape, shared by the loads and the ring: (KEYS_PER_STEP tokens of a step, LHW = log2
    STEP_HEADS, NKS k-steps of Sᵀ (one word of a key per lane each), NKC 16-byte chunks of a key row per lane,
    VWL words of a V row per lane (dims g·D/8 …), LOGP and STEP (:func:`page_steps`: a step's tokens never
    cross a page), FP8, D4 32-bit words of a cache row of one head)."""
    KEYS_PER_STEP = 16 // STEP_HEADS
    LOGP, STEP = page_steps(P, KEYS_PER_STEP)
    NKS = D // 16
    return KEYS_PER_STEP, STEP_HEADS.bit_length() - 1, NKS, NKS // 4, D // 32, LOGP, STEP, KV_FORMAT == 1, D // 4


@functools.cache
def make_frag8_loads(D: int, P: int, KV_FORMAT: int, TOKEN: bool, STEP_HEADS: int):
    """The 8-bit fragment kernel's direct loads: a warp step's cache words into registers, straight from global
    memory, and the L2 prefetch of a later step. ``cache`` is (k, v, ks, vs, table); the words go into ``regs``,
    (kw, vw, ksc, vsc)."""
    from numba_attn.gpu.intrinsics import add_u32, ld_at, ld_global_v2_at, ld_global_v4_at, mad_u32

    KEYS_PER_STEP, LHW, NKS, NKC, VWL, LOGP, STEP, FP8, D4 = step_shape(D, P, KV_FORMAT, STEP_HEADS)

    @device
    def prefetch_step(cache, tbl, seq, h, Hkv, jn, hi, g, t):
        """L2 prefetch of the cache rows of the warp's step at key ``jn`` (< ``hi``), one ``prefetch`` per
        128-byte line of each row among the 32 lanes: lane (g, t) takes line t & 1 of K row g + 8·(t >> 1)
        and line g & 1 of V row 2t + (g >> 1 & 1) + 8·(g >> 2) (the step's 16 K and 16 V rows, D ≤ 256), and
        with per-token scales the K and V scales of its K row (line 0 lanes); rows found as the int8 loads
        find theirs (keys past ``hi`` clamped to the last)."""
        k, v, ks, vs, table = cache
        if STEP:  # (int8: tbl, the sequence's block-table row, flat, as its loads read it)
            pg = table[seq, jn >> LOGP] if FP8 else ld_at(table, add_u32(tbl, jn >> LOGP))
            rb = mad_u32(pg, P, jn & (P - 1))
            rl = add_u32(rb, hi - 1 - jn)
        kl = t & 1
        vl = g & 1
        ko = g + 8 * (t >> 1)
        vo = 2 * t + ((g >> 1) & 1) + 8 * (g >> 2)
        if STEP:
            krow = min(add_u32(rb, ko), rl)
            vrow = min(add_u32(rb, vo), rl)
        else:
            jk = min(jn + ko, hi - 1)
            jv = min(jn + vo, hi - 1)
            krow = mad_u32(table[seq, jk >> LOGP], P, jk & (P - 1))
            vrow = mad_u32(table[seq, jv >> LOGP], P, jv & (P - 1))
        krh = mad_u32(krow, Hkv, h)
        if 128 * kl < D:
            prefetch_l2_at(k, krh, D4, 32 * kl, 0)
        if 128 * vl < D:
            prefetch_l2_at(v, mad_u32(vrow, Hkv, h), D4, 32 * vl, 0)
        if TOKEN and kl == 0:
            prefetch_l2_at(ks, krh, 1, 0, 0)
            prefetch_l2_at(vs, krh, 1, 0, 0)

    @device
    def load_step(cache, regs, scale, tbl, seq, h, Hkv, j0, hi, g, t):
        """The warp step at key ``j0``'s K words (rows g, g+8; chunks t, t+4, …) and V words (rows 2t, 2t+1, 2t+8,
        2t+9; words g·D/32 …) into ``regs``, with per-token scales their scales, straight from global memory."""
        k, v, ks, vs, table = cache
        kw, vw, ksc, vsc = regs
        if FP8:
            pg = table[seq, j0 >> LOGP] if STEP else 0
            for kk in range(2):  # K rows g, g+8
                jj = min(j0 + ((g + 8 * kk) >> LHW), hi - 1)
                page = pg if STEP else table[seq, jj >> LOGP]
                crow = page * P + (jj & (P - 1))
                hk = h + ((g + 8 * kk) & (STEP_HEADS - 1))
                for c in range(NKC):
                    x0, x1, x2, x3 = ld_global_v4(k, crow, hk, 4 * (t + 4 * c))
                    kw[kk * NKS + 4 * c] = x0
                    kw[kk * NKS + 4 * c + 1] = x1
                    kw[kk * NKS + 4 * c + 2] = x2
                    kw[kk * NKS + 4 * c + 3] = x3
                if TOKEN:
                    ksc[kk] = scale * ks[crow, hk]
            for kk in range(4):  # V rows 2t, 2t+1, 2t+8, 2t+9
                vr = 2 * t + (kk & 1) + 8 * (kk >> 1)
                jj = min(j0 + (vr >> LHW), hi - 1)
                page = pg if STEP else table[seq, jj >> LOGP]
                crow = page * P + (jj & (P - 1))
                hv = h + (vr & (STEP_HEADS - 1))
                if VWL % 4 == 0:
                    for c in range(VWL // 4):
                        x0, x1, x2, x3 = ld_global_v4(v, crow, hv, g * VWL + 4 * c)
                        vw[kk * VWL + 4 * c] = x0
                        vw[kk * VWL + 4 * c + 1] = x1
                        vw[kk * VWL + 4 * c + 2] = x2
                        vw[kk * VWL + 4 * c + 3] = x3
                else:
                    for c in range(VWL // 2):
                        x0, x1 = ld_global_v2(v, crow, hv, g * VWL + 2 * c)
                        vw[kk * VWL + 2 * c] = x0
                        vw[kk * VWL + 2 * c + 1] = x1
                if TOKEN:
                    vsc[kk] = vs[crow, hv]
        else:  # int8: addresses from 32-bit cache row indices (row·Hkv + h: a (row, head) of D/4 words)
            if STEP:  # the step's page: rows rb + o of keys j0 + o, clamped to the last key's row rl
                rb = mad_u32(ld_at(table, add_u32(tbl, j0 >> LOGP)), P, j0 & (P - 1))
                rl = add_u32(rb, hi - 1 - j0)
            for kk in range(2):  # K rows g, g+8, and their K and V scales (per token)
                if STEP:
                    krow = min(add_u32(rb, (g + 8 * kk) >> LHW), rl)
                else:
                    jk = min(j0 + ((g + 8 * kk) >> LHW), hi - 1)
                    krow = mad_u32(table[seq, jk >> LOGP], P, jk & (P - 1))
                krh = mad_u32(krow, Hkv, h + ((g + 8 * kk) & (STEP_HEADS - 1)))
                for c in range(NKC):
                    x0, x1, x2, x3 = ld_global_v4_at(k, krh, D4, 4 * t, 16 * c)
                    kw[kk * NKS + 4 * c] = x0
                    kw[kk * NKS + 4 * c + 1] = x1
                    kw[kk * NKS + 4 * c + 2] = x2
                    kw[kk * NKS + 4 * c + 3] = x3
                if TOKEN:  # the scales are (rows, Hkv): the same index
                    ksc[kk] = scale * ld_at(ks, krh)
                    vsc[kk] = ld_at(vs, krh)
            for kk in range(4):  # V rows 2t, 2t+1, 2t+8, 2t+9
                vr = 2 * t + (kk & 1) + 8 * (kk >> 1)
                if STEP:
                    vrow = min(add_u32(rb, vr >> LHW), rl)
                else:
                    jv = min(j0 + (vr >> LHW), hi - 1)
                    vrow = mad_u32(table[seq, jv >> LOGP], P, jv & (P - 1))
                vrh = mad_u32(vrow, Hkv, h + (vr & (STEP_HEADS - 1)))
                if VWL % 4 == 0:
                    for c in range(VWL // 4):
                        x0, x1, x2, x3 = ld_global_v4_at(v, vrh, D4, g * VWL, 4 * c)
                        vw[kk * VWL + 4 * c] = x0
                        vw[kk * VWL + 4 * c + 1] = x1
                        vw[kk * VWL + 4 * c + 2] = x2
                        vw[kk * VWL + 4 * c + 3] = x3
                else:
                    for c in range(VWL // 2):
                        x0, x1 = ld_global_v2_at(v, vrh, D4, g * VWL, 2 * c)
                        vw[kk * VWL + 2 * c] = x0
                        vw[kk * VWL + 2 * c + 1] = x1

    return prefetch_step, load_step


@functools.cache
def make_frag8_ring(D: int, P: int, KV_FORMAT: int, TOKEN: bool, STEP_HEADS: int, STAGES: int):
    """The 8-bit fragment kernel's ``cp.async`` ring: its slots' offsets, the copies of a step into a slot, the
    K and V words and per-token scales read back. ``cache`` is (k, v, ks, vs, table)."""
    from numba_attn.gpu.intrinsics import add_u32, cp_async16_at_ca, ld_at, mad_u32

    KEYS_PER_STEP, LHW, NKS, NKC, VWL, LOGP, STEP, FP8, D4 = step_shape(D, P, KV_FORMAT, STEP_HEADS)
    CPR = D // 16  # 16-byte chunks of a cache row of one head
    NCP = 16 * CPR // WARP_SIZE  # ring: 16-byte copies per lane per step, of K and of V each
    NVC = max(1, VWL // 4)  # ring: 16-byte reads of a V row per lane
    NSQ = max(1, (STAGES - 1) * 4)  # ring: a lane's int8 per-token scales, 4 a step, queued for STAGES − 1 steps
    if STAGES and not STEP:
        raise ValueError(f"the ring needs pages of whole warp steps (page size {P}, {KEYS_PER_STEP} tokens a step)")
    if STAGES and TOKEN and FP8:
        raise ValueError("the ring: per-token scales with int8 codes only (fp8 takes a tensor or head scale)")
    SWZ = min(8, CPR) - 1

    @device
    def ring_chunk(c, r):
        """Where 16-byte chunk ``c`` of ring row ``r`` is stored in its row: ``c`` XOR ((r & 1)·4 ^ ((r >> 1) & 3)·2)
        on its low three bits (two at D 64), a permutation of the row's chunks under which the K fragment reads
        (rows g, g+8; chunks t + 4c) and the V reads (rows 2t + b; chunk g·D/128 + c) each hit every bank once per
        8 lanes at D 128."""
        return c ^ ((((r & 1) << 2) ^ (((r >> 1) & 3) << 1)) & SWZ)

    @device
    def put_words(a, i, x):
        """The four words of a 16-byte load ``x`` into ``a[i … i+3]``."""
        a[i] = x[0]
        a[i + 1] = x[1]
        a[i + 2] = x[2]
        a[i + 3] = x[3]

    @device
    def row_head(r, Hkv, h):
        """The (cache row, head) index of step row ``r`` (token r / HW, head h + r % HW) relative to the step's
        first cache row."""
        return mad_u32(r >> LHW, Hkv, h + (r & (STEP_HEADS - 1)))

    @device
    def ring_offsets(h, Hkv, lane, g, t, csrc, cdst, kof, vof, sof):
        """The lane's constant parts of the ring's addresses, computed once before the key loop: ``csrc[j]``, the
        (cache row, head) index of copy j's row relative to the step's first row (row r = lane / (D/16) + j·32/(D/16));
        ``cdst[j]``, its word in a ring slot (chunk lane % (D/16) of row r, swizzled); ``kof``, ``vof``, the words
        of the K and V fragments' 16-byte reads in a slot (``ring_chunk``); ``sof``, the rows of the lane's
        per-token scales (K rows g, g+8), then their (row, head) indices relative to the step's first cache row."""
        c = lane % CPR
        for j in range(NCP):
            r = lane // CPR + j * (WARP_SIZE // CPR)
            csrc[j] = row_head(r, Hkv, h)
            cdst[j] = r * D4 + 4 * ring_chunk(c, r)
        for kk in range(2):
            r = g + 8 * kk
            for c in range(NKC):
                kof[kk * NKC + c] = r * D4 + 4 * ring_chunk(t + 4 * c, r)
        for kk in range(4):
            vr = 2 * t + (kk & 1) + 8 * (kk >> 1)
            for c in range(NVC):
                ch = g * (VWL // 4) + c if VWL % 4 == 0 else g >> 1
                vof[kk * NVC + c] = (16 + vr) * D4 + 4 * ring_chunk(ch, vr)
        for m in range(2):
            sof[m] = g + 8 * m
            sof[2 + m] = row_head(g + 8 * m, Hkv, h)

    @device
    def issue_step(cache, ring, sq, tbl, Hkv, j0, hi, wr, lane, offs):
        """cp.async of the warp step at key ``j0`` (< ``hi``; both 32-bit) into the ring slot at row ``wr`` (K; V 16
        rows on), and with per-token scales the lane's 4 scales loaded into the last 4 registers of the queue ``sq``
        (plain loads: they land while the NST − 1 steps before this one compute). Row r is token
        j0 + r / HW, head h + r % HW (a step never crosses a page: one page index); lane L copies chunk L % (D/16)
        of rows L / (D/16) + j·32/(D/16). A token at or past ``hi`` is zero-filled and not read, its scales zero (its
        scores are masked; zeros keep a stale NaN code or scale out of P·V). ``offs``: (csrc, cdst, sof)."""
        k, v, ks, vs, table = cache
        csrc, cdst, sof = offs
        rb = mad_u32(ld_at(table, add_u32(tbl, j0 >> LOGP)), P, j0 & (P - 1))  # the step's first cache row
        rbh = mad_u32(rb, Hkv, 0)
        nn = mad_u32(min(hi - j0, uint64(KEYS_PER_STEP)), STEP_HEADS, 0)  # rows of the step that exist
        wd = mad_u32(wr, D4, 0)
        for j in range(NCP):
            ok = add_u32(lane // CPR, j * (WARP_SIZE // CPR)) < nn
            row = add_u32(rbh, csrc[j])
            do = add_u32(wd, cdst[j])
            cp_async16_at_ca(ring, do, k, row, D4, 4 * (lane % CPR), 0, ok)  # (.ca: .cg read every L2 sector
            cp_async16_at_ca(ring, add_u32(do, 16 * D4), v, row, D4, 4 * (lane % CPR), 0, ok)  # twice, measured)
        if TOKEN:
            for m in range(4):  # the K scales of rows g, g+8, then their V scales
                x = float32(0.0)
                if sof[m & 1] < nn:
                    x = ld_at(ks if m < 2 else vs, add_u32(rbh, sof[2 + (m & 1)]))
                sq[NSQ - 4 + m] = x

    @device
    def ring_k(ring, kw, rk, kof):
        """The step's K fragment words (rows g, g+8; chunks t, t+4, …) from its ring slot (at row ``rk``), as the
        direct loads give them."""
        kb = mad_u32(rk, D4, 0)
        for kk in range(2):
            for c in range(NKC):
                put_words(kw, kk * NKS + 4 * c, ld_shared_v4(ring, 0, add_u32(kb, kof[kk * NKC + c])))

    @device
    def ring_scales(sq, ksc, vsc, scale):
        """This step's per-token scales from the front of the queue ``sq`` (as the direct loads give them), and
        the queue moved up by one step."""
        ksc[0] = scale * sq[0]
        ksc[1] = scale * sq[1]
        vsc[0] = sq[2]
        vsc[1] = sq[3]
        for i in range(NSQ - 4):
            sq[i] = sq[4 + i]

    @device
    def ring_v(ring, vw, rk, vof, g):
        """The step's V words (rows 2t, 2t+1, 2t+8, 2t+9; words g·D/32 …) from its ring slot (at row ``rk``), as
        the direct loads give them."""
        kb = mad_u32(rk, D4, 0)
        for kk in range(4):
            if VWL % 4 == 0:
                for c in range(NVC):
                    put_words(vw, kk * VWL + 4 * c, ld_shared_v4(ring, 0, add_u32(kb, vof[kk * NVC + c])))
            else:  # D 64: words 2g, 2g+1, half of chunk g / 2
                x0, x1, x2, x3 = ld_shared_v4(ring, 0, add_u32(kb, vof[kk]))
                vw[kk * VWL] = x2 if g & 1 else x0
                vw[kk * VWL + 1] = x3 if g & 1 else x1

    return ring_offsets, issue_step, ring_k, ring_scales, ring_v
