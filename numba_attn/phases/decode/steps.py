"""The warp-step loop of the decode phases: a block streams its keys in warp steps, a group of lanes per key
(:func:`chunk_steps`: load the query rows, load a step's keys, the per-key update, the merges, the
output write and the last-block combine; :func:`row_loader`: one key row into registers)."""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint16, uint32

from numba_attn.gpu.device_functions import (NEG_BIG, combine_splits, ldg_f16x8, ldg_f32x4, merge_state, merge_state2,
                                             state_lse)
from numba_attn.gpu.intrinsics import ld_global_v4, pack_bf16x2, unpack_bf16x2
from numba_attn.gpu.jit import device
from numba_attn.gpu.split_k import combined_lse
from numba_attn.gpu.warp import WARP_SIZE, group_sum, strided_max, strided_sum
from numba_attn.phases.decode.scores import SEEN_NOTHING_LSE, key_mask, step_rescore, variant_keys
from numba_attn.variants.sinks import lse_parts
from numba_attn.variants.stages import PLAIN

LN2 = np.float32(0.6931471805599453)


@device
def bf16_to_f32(h):
    """One bfloat16 bit pattern (a uint16 element) → float32 (exact)."""
    return unpack_bf16x2(uint32(h))[0]


@device
def f32_to_bf16(x):
    """float32 → the bfloat16 bit pattern (uint16), rounded to nearest even (``cvt.rn``)."""
    return uint16(pack_bf16x2(x, float32(0.0)) & uint32(0xFFFF))


@functools.cache
def row_loader(VW: int, LANES: int, NV: int, BF16: bool):
    """``load_row(k, v, KK, VV, t, a, b, sub)``: this lane's E = NV·VW elements of K row ``k[a, b]``
    and V row ``v[a, b]`` into ``KK[t]``/``VV[t]``, 16 bytes per load (lane ``sub`` of the row's
    L lanes takes chunks sub, sub + L, …); float32 or float16 rows (``ldg_f32x4``/``ldg_f16x8``),
    or a bfloat16 row as its uint32 word view (``BF16``: four words, each split by shifts).
    The contiguous cache passes (KV head, key), the paged one (cache row, KV head)."""
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8

    @device
    def load_row(k, v, K_j, V_j, t, a, b, sub):
        for u in range(NV):
            if BF16:  # 8 elements: 4 words of the uint32 view
                kw = ld_global_v4(k, a, b, (sub + LANES * u) * 4)
                vw = ld_global_v4(v, a, b, (sub + LANES * u) * 4)
                for x in range(4):
                    K_j[t, u * VW + 2 * x], K_j[t, u * VW + 2 * x + 1] = unpack_bf16x2(kw[x])
                    V_j[t, u * VW + 2 * x], V_j[t, u * VW + 2 * x + 1] = unpack_bf16x2(vw[x])
            else:
                kx = ldv(k, a, b, (sub + LANES * u) * VW)
                vx = ldv(v, a, b, (sub + LANES * u) * VW)
                for x in range(VW):
                    K_j[t, u * VW + x] = kx[x]
                    V_j[t, u * VW + x] = vx[x]

    return load_row


@device
def _no_combined_store(mods, part_lse, S, bh, i, row):
    pass


@device
def _combined_store(mods, part_lse, S, bh, i, row):
    lse = mods[-1]
    lse[bh, i] = combined_lse(part_lse, S, row)


def empty_sequence_lse(stage):
    """The log-sum-exp split 0 of an empty paged sequence writes: 0, a zero partial of weight 1; with a stage that
    writes the log-sum-exp ``SEEN_NOTHING_LSE`` (still weight 1 alone, and the combined log-sum-exp -inf)."""
    return SEEN_NOTHING_LSE if lse_parts(stage)[0] else np.float32(0.0)


def combined_lse_store(LSE: bool):
    """``store(mods, part_lse, S, bh, i, row)``: a last-block combine's log-sum-exp of ``row`` from the splits'
    into ``mods[-1][bh, i]`` (``LSE``), else nothing."""
    return _combined_store if LSE else _no_combined_store


@functools.cache
def combined_output(BF16: bool, LSE: bool):
    """``write_combined(o, part_o, part_lse, S, bh, i, d, row, mods)``: a last-block combine's output element
    o[bh, i, d] from the S splits' partials of ``row`` (bfloat16 bits with ``BF16``); at d = 0 with ``LSE`` the
    row's log-sum-exp into ``mods[-1][bh, i]``."""
    store_combined = combined_lse_store(LSE)

    @device
    def write_combined(o, part_o, part_lse, S, bh, i, d, row, mods):
        """o[bh, i, d] combined from the splits' partials of ``row`` (and its log-sum-exp at d = 0)."""
        if BF16:
            o[bh, i, d] = f32_to_bf16(combine_splits(part_o, part_lse, S, row, d))
        else:
            o[bh, i, d] = combine_splits(part_o, part_lse, S, row, d)
        if LSE and d == 0:
            store_combined(mods, part_lse, S, bh, i, row)

    return write_combined


@functools.cache
def merge_arrays(WARPS: int, ROWS: int, D: int):
    """``merge_smem() -> (sm_m, sm_l, sm_o, sm_last)``: the shared arrays a split-K decode block merges its warps'
    (m, l, O) of ROWS rows in (WARPS × ROWS, WARPS × ROWS × D, float32) and its last-block flag (int32)."""

    @device
    def merge_smem():
        """The block's merge arrays and last-block flag in shared memory."""
        sm_m = cuda.shared.array((WARPS, ROWS), float32)
        sm_l = cuda.shared.array((WARPS, ROWS), float32)
        sm_o = cuda.shared.array((WARPS, ROWS, D), float32)
        sm_last = cuda.shared.array(1, int32)
        return sm_m, sm_l, sm_o, sm_last

    return merge_smem


@functools.cache
def chunk_steps(D: int, VW: int, LANES: int, KEYS: int, WARPS: int, ROWS: int, Nq: int, G: int, causal: bool,
                FINAL: bool = True, BASE2: bool = False, BF16: bool = False, stage=PLAIN):
    """Device functions of a block of ``WARPS`` warps that computes ``ROWS`` query rows
    of one KV head over a range of keys: a group of ``LANES`` lanes takes ``KEYS`` keys
    per warp step, a lane holding ``E = D / LANES`` elements of a row in registers.

    ``FINAL``: the block writes the output (else its split's partial output and
    log-sum-exp); ``BASE2``: the scores are in base 2 (log2 e folded into the
    query scale; ``exp2``, and the log-sum-exp converted back); ``BF16``: q and o are
    bfloat16 bit patterns (uint16), k and v their (…, D/2) uint32 word views; ``stage``: a variant's
    (``scores.py``: ``score_update`` takes ``at`` = (kvh, row0, Hkv, Nk) and ``mods``; rows that see no key are 0);
    a stage that writes the log-sum-exp (:func:`~numba_attn.variants.sinks.lse_parts`): ``write_rows`` (``FINAL``)
    and ``combine_last`` store each row's to the last array of ``mods``.
    Returns ``(load_rows, load_keys, score_update, merge_lanes, write_rows, combine_last)``.
    """
    E = D // LANES  # elements of a row per lane
    NV = E // VW  # 16-byte loads per row per lane
    GROUPS = WARP_SIZE // LANES  # lane groups per warp
    THREADS = WARPS * WARP_SIZE
    NROWS = G * Nq
    load_row = row_loader(VW, LANES, NV, BF16)  # one key row of K and V, 16 bytes per load
    key_limit, visible = key_mask(causal, Nq)  # the keys a row sees (scores.py)
    VARIANT = stage.active
    rescore = step_rescore(stage, ROWS, KEYS, GROUPS, Nq, G, causal, BASE2)  # a variant's scores (scores.py)
    vk = variant_keys(stage, BASE2)
    LSE, store_lse, store_lse2 = lse_parts(stage)
    write_combined = combined_output(BF16, LSE)

    @device
    def load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, hi, Nk):
        """Query rows row0 … row0+RB-1 of KV head ``kvh`` (row g·Nq + i is query head
        kvh·G + g, position i), scaled, into this lane's E elements ``Qr``; an
        empty state (acc, m, l); ``lim[r]``: the row sees keys < lim[r] (the block's
        keys end at ``hi``; causal: bottom-right aligned; 0 for a padding row)."""
        for r in range(ROWS):
            row = row0 + r
            ok = row < NROWS
            g = row // Nq
            i = row - g * Nq
            bh = kvh * G + g  # = b * H + hkv * G + g
            if ok:
                lim[r] = key_limit(i, hi, Nk)
            else:
                lim[r] = 0
            for u in range(NV):
                for x in range(VW):
                    if BF16:
                        Qr[r, u * VW + x] = bf16_to_f32(q[bh, i, (sub + LANES * u) * VW + x]) * scale if ok \
                            else float32(0.0)
                    else:
                        Qr[r, u * VW + x] = float32(q[bh, i, (sub + LANES * u) * VW + x]) * scale if ok \
                            else float32(0.0)
                    acc[r, u * VW + x] = float32(0.0)
            m[r] = NEG_BIG
            l[r] = float32(0.0)

    @device
    def load_keys(k, v, K_j, V_j, kvh, j0, hi, sub):
        """All loads of a step first: keys j0 + t·KW (t < T, clamped below ``hi``),
        this lane's E elements of each K and V row, 16 bytes at a time."""
        for t in range(KEYS):
            load_row(k, v, K_j, V_j, t, kvh, min(j0 + t * GROUPS, hi - 1), sub)

    @device
    def score_update(Qr, K_j, V_j, sc, m, l, acc, lim, j0, at, mods):
        """The scores of the step's T keys for every row (each summed over the
        group's L lanes by a butterfly), a variant's on them, then one online-softmax update per row."""
        for r in range(ROWS):
            for t in range(KEYS):
                s = float32(0.0)
                for e in range(E):
                    s += Qr[r, e] * K_j[t, e]
                sc[r, t] = group_sum(s, LANES)
        if VARIANT:
            rescore(sc, lim, j0, at, mods)
        for r in range(ROWS):  # one online-softmax update per row for the T keys
            m_new = m[r]
            for t in range(KEYS):
                if visible(j0 + t * GROUPS, lim[r]):
                    m_new = max(m_new, sc[r, t])
            corr = math.exp(m[r] - m_new)
            lsum = float32(0.0)
            for t in range(KEYS):
                p = math.exp(sc[r, t] - m_new) if visible(j0 + t * GROUPS, lim[r]) else float32(0.0)
                sc[r, t] = p
                lsum += p
            m[r] = m_new
            l[r] = l[r] * corr + lsum
            for e in range(E):
                a = acc[r, e] * corr
                for t in range(KEYS):
                    a += sc[r, t] * V_j[t, e]
                acc[r, e] = a

    @device
    def merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub):
        """The lane groups of warp ``w`` merge (common max, rescale, sum); its first
        group stores the warp's (m, l, O) in shared memory."""
        for r in range(ROWS):
            mw = strided_max(m[r], LANES)
            if BASE2:
                c = math.exp2(m[r] - mw)
            else:
                c = math.exp(m[r] - mw)
            lw = strided_sum(l[r] * c, LANES)
            for e in range(E):
                acc[r, e] = strided_sum(acc[r, e] * c, LANES)
            if lane < LANES:
                for u in range(NV):
                    for x in range(VW):
                        sm_o[w, r, (sub + LANES * u) * VW + x] = acc[r, u * VW + x]
                if lane == 0:
                    sm_m[w, r] = mw
                    sm_l[w, r] = lw

    @device
    def block_element(idx, row0):
        """(r, d, row): element ``idx`` of the block's ROWS × D outputs, in its row r (query row ``row0 + r``)."""
        r = idx // D
        return r, idx - r * D, row0 + r

    @device
    def write_rows(o, part_o, part_lse, split, kvh, row0, tid, sm_m, sm_l, sm_o, mods):
        """Merge the warps' partial (m, l, O), one thread per element; write the
        output (``FINAL``) or split ``split``'s partial output and log-sum-exp."""
        for idx in range(tid, ROWS * D, THREADS):
            r, d, row = block_element(idx, row0)
            if row < NROWS:
                g = row // Nq
                i = row - g * Nq
                mm = NEG_BIG
                ll = float32(0.0)
                oo = float32(0.0)
                for ww in range(WARPS):
                    if BASE2:
                        mm, ll, ca, cb = merge_state2(mm, ll, sm_m[ww, r], sm_l[ww, r])
                    else:
                        mm, ll, ca, cb = merge_state(mm, ll, sm_m[ww, r], sm_l[ww, r])
                    oo = oo * ca + cb * sm_o[ww, r, d]
                bh = kvh * G + g
                if FINAL:
                    if VARIANT:  # 0 for a row that saw no key
                        if BF16:
                            o[bh, i, d] = f32_to_bf16(vk.normalized(oo, mm, ll))
                        else:
                            o[bh, i, d] = vk.normalized(oo, mm, ll)
                    elif BF16:
                        o[bh, i, d] = f32_to_bf16(oo / ll)
                    else:
                        o[bh, i, d] = oo / ll
                    if LSE and d == 0:  # the row's log-sum-exp, natural units
                        if BASE2:
                            store_lse2(mods, bh, i, mm, ll)
                        else:
                            store_lse(mods, bh, i, mm, ll)
                else:
                    part_o[split, bh * Nq + i, d] = oo / ll if ll != float32(0.0) else float32(0.0)
                    if d == 0:
                        if BASE2:
                            lse = state_lse(mm * LN2, ll)
                        else:
                            lse = state_lse(mm, ll)
                        if VARIANT:  # a split that saw no key of the row: weighed 0, or 1 where none did
                            lse = vk.partial_lse(mm, ll, lse)
                        part_lse[split, bh * Nq + i] = lse

    @device
    def combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid, ci, mods):
        """The last block of this (sequence, KV head, row block) to finish combines
        the S splits' partials (``combine_splits``) and resets its counter ``counters[ci]``."""
        cuda.threadfence()  # this block's partials are visible device-wide before it counts
        cuda.syncthreads()
        if tid == 0:
            prev = cuda.atomic.add(counters, ci, 1)
            sm_last[0] = 1 if prev == S - 1 else 0
        cuda.syncthreads()
        if sm_last[0] == 1:
            cuda.threadfence()
            for idx in range(tid, ROWS * D, THREADS):
                r, d, row = block_element(idx, row0)
                if row < NROWS:
                    g = row // Nq
                    i = row - g * Nq
                    bh = kvh * G + g
                    write_combined(o, part_o, part_lse, S, bh, i, d, bh * Nq + i, mods)
            if tid == 0:
                counters[ci] = 0  # ready for the next launch

    return load_rows, load_keys, score_update, merge_lanes, write_rows, combine_last
