"""Phase 33 — ``decode_split_k_lean``: fewer instructions per key in the decode loop.

Change against ``decode_split_k_fused``: the same blocks, splits and loads, less work between the loads (with a
GQA group of 4 rows the loop was issue-bound: 395 instructions per warp step of 4 keys). A step's partial dot
products are summed over the lanes of a group by one reduce-scatter and one all-gather instead of a butterfly per
score (``score_plan``); scores in base 2 (log2 e folded into the query scale, ``exp2``); the accumulators are
rescaled only when a row's maximum moved; the last-block combine only while ``S × rows ≤ fuse_max``.

Prediction: GQA B=8 32k fp16 326 → ~280 µs; B=1 75 → ~45 µs; MHA unchanged within 2%.
Verdict: 0.0495 ms at B1 H32/8kv Nk32768 D128 fp16 (H200), short of the ~45 µs predicted: the loop was not
issue-bound [results/decode-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32, uint32

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.intrinsics import u32_as_f32
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.warp import FULL_MASK, WARP_SIZE, shfl_sync, shfl_xor_sync
from numba_attn.phases.decode.kv8 import NAN_BITS, e4m3x4_f32_finite, int8x4_f32
from numba_attn.phases.decode.launch import split_launch, split_registration
from numba_attn.phases.decode.paged import page_steps, paged_keys, paged_words
from numba_attn.phases.decode.rules import check_split, resolve_split, vector_width
from numba_attn.phases.decode.scores import key_mask, step_rescore
from numba_attn.phases.decode.steps import chunk_steps, empty_sequence_lse, merge_arrays
from numba_attn.phases.registry import register_phase
from numba_attn.variants.sinks import stages_for
from numba_attn.variants.spans import stage_split_range, whole_range
from numba_attn.variants.stages import PLAIN


def _log2(n: int) -> int:
    return n.bit_length() - 1


def score_plan(lanes: int, rows: int, keys: int):
    """(padded, scatter_stages, held): the rows·keys partial dot products of a lane are padded to ``padded``
    (a power of two); ``scatter_stages`` reduce-scatter stages halve them (offsets lanes/2, lanes/4, ...), the
    remaining log2(lanes) − scatter_stages stages are plain xor-sums of the ``held`` = padded / 2^scatter_stages
    values a lane still holds. Afterwards value v sits in lane ``(v // held) · (lanes >> scatter_stages)`` of
    its group (and the lanes just above it)."""
    padded = 1
    while padded < rows * keys:
        padded *= 2
    scatter_stages = min(_log2(padded), _log2(lanes))
    return padded, scatter_stages, padded >> scatter_stages


@device
def balanced_split(split, chunk, Nk, keys_per_step):
    """Keys [lo, hi) of split ``split`` of a sequence of ``Nk`` keys cut into n = ⌈Nk / chunk⌉ splits:
    n − 1 of ⌈Nk / n⌉ keys rounded up to whole steps of ``keys_per_step`` keys, the last (never empty) the
    rest (``chunk`` a multiple of keys_per_step: no split is longer than ``chunk``; splits n, n+1, … are empty).
    A sequence of 1100 keys with chunk 1024 gets two splits of 552 and 548 keys (8 keys a step) instead of 1024
    and 76: a block of 76 keys pays the
    fixed cost of a block for few bytes, and the longest split decides when the last wave ends."""
    n = max(1, (Nk + chunk - 1) // chunk)
    ck = ((Nk + n - 1) // n + keys_per_step - 1) // keys_per_step * keys_per_step
    lo = split * ck
    return lo, min(Nk, lo + ck)


@functools.cache
def make_lean_steps(D: int, VW: int, LANES: int, KEYS: int, ROWS: int, Nq: int, G: int, causal: bool, P: int,
                    KV_FORMAT: int, BALANCE: bool):
    """``decode_split_k_lean``'s steps: a block's split and keys (``split_keys``), a step's partial dot products
    (``dot_scores``), its scores summed over the lanes of a group (``reduce_scores``) and its online-softmax update
    (``lazy_update``)."""
    PAGED = P > 0
    visible = key_mask(causal, Nq)[1]  # (the rows' key limits: load_rows)
    WIDE = PAGED and KV_FORMAT > 0 and VW == 16
    E = D // LANES  # elements of a row per lane
    GROUPS = WARP_SIZE // LANES  # lane groups per warp
    KEYS_PER_STEP = GROUPS * KEYS  # keys per warp step: T keys per group
    ROW_BLOCKS = (G * Nq + ROWS - 1) // ROWS  # row blocks per KV head
    PADDED, SCATTER_STAGES, HELD = score_plan(LANES, ROWS, KEYS)
    LOG2L = _log2(LANES)
    HALF = max(1, PADDED // 2)
    SRC = LANES >> SCATTER_STAGES  # lanes of a group that share one reduced value set
    NV_RT = ROWS * KEYS

    @device
    def split_keys(chunk, Nk):
        """Block (split, row block of a KV head)'s split, KV head (b · Hkv + h), first query row and keys
        [lo, hi) of its sequence's ``Nk``."""
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y // ROW_BLOCKS  # b * Hkv + kv head
        row0 = (cuda.blockIdx.y - kvh * ROW_BLOCKS) * ROWS  # first of this block's query rows (g * Nq + i)
        if BALANCE:  # this sequence's own split length: equal whole steps
            lo, hi = balanced_split(split, chunk, Nk, KEYS_PER_STEP)
        else:
            lo = split * chunk  # this block's keys: [lo, hi)
            hi = min(Nk, lo + chunk)
        return split, kvh, row0, lo, hi

    @device
    def dot_scores(Qr, K_j, vals):
        """This lane's partial dot products of the ROWS query rows ``Qr`` with the step's KEYS key rows ``K_j``
        (its E elements of each) into ``vals`` (row-major: ``vals[r · KEYS + t]``)."""
        for r in range(ROWS):
            for t in range(KEYS):
                s = float32(0.0)
                for e in range(E):
                    s += Qr[r, e] * K_j[t, e]
                vals[r * KEYS + t] = s

    @device
    def reduce_scores(vals, sc, sub, grp):
        """The step's ROWS·KEYS scores summed over the LANES lanes of a group, from each lane's partial dot
        products ``vals`` into ``sc`` of every lane of the group: a reduce-scatter (each stage sends half of the
        values still held, keeps the other half), plain xor-sums for the stages left, one all-gather."""
        for vi in range(NV_RT, PADDED):
            vals[vi] = float32(0.0)
        # reduce-scatter: PADDED − 1 shuffles instead of ROWS·KEYS·log2(LANES)
        for st in range(SCATTER_STAGES):
            off = LANES >> (st + 1)
            half = PADDED >> (st + 1)
            up = (sub & off) != 0
            for i in range(HALF):
                if i < half:
                    a = vals[i]
                    b = vals[i + half]
                    send = a if up else b
                    keep = b if up else a
                    vals[i] = keep + shfl_xor_sync(FULL_MASK, send, off)
        for st in range(SCATTER_STAGES, LOG2L):
            off = LANES >> (st + 1)
            for i in range(HELD):
                vals[i] += shfl_xor_sync(FULL_MASK, vals[i], off)
        # all-gather: every lane of the group gets the ROWS·KEYS scores
        for vi in range(NV_RT):
            if LANES == 1:
                sc[vi // KEYS, vi % KEYS] = vals[vi]
            else:
                sc[vi // KEYS, vi % KEYS] = shfl_sync(FULL_MASK, vals[vi % HELD], grp * LANES + (vi // HELD) * SRC)

    @device
    def lazy_update(sc, m, l, acc, lim, j0, V_j):
        """One online-softmax update per row for the step's KEYS keys (base 2; keys a row does not see count 0),
        the accumulators rescaled only when the row's maximum moved; then, unless WIDE, O += P V."""
        for r in range(ROWS):  # one online-softmax update per row for the T keys (base 2)
            m_old = m[r]
            m_new = m_old
            for t in range(KEYS):
                if visible(j0 + t * GROUPS, lim[r]):
                    m_new = max(m_new, sc[r, t])
            lsum = float32(0.0)
            for t in range(KEYS):
                p = math.exp2(sc[r, t] - m_new) if visible(j0 + t * GROUPS, lim[r]) else float32(0.0)
                sc[r, t] = p
                lsum += p
            if m_new > m_old:  # rescale only when the row's maximum moved
                corr = math.exp2(m_old - m_new)
                m[r] = m_new
                l[r] = l[r] * corr + lsum
                for e in range(E):
                    acc[r, e] *= corr
            else:
                l[r] += lsum
            if not WIDE:
                for e in range(E):
                    a = acc[r, e]
                    for t in range(KEYS):
                        a += sc[r, t] * V_j[t, e]
                    acc[r, e] = a

    return split_keys, dot_scores, reduce_scores, lazy_update


@functools.cache
def make_lean_wide(D: int, LANES: int, KEYS: int, ROWS: int, KV_FORMAT: int):
    """``paged_split_k``'s wide steps (``VW`` = 16, an 8-bit cache): a step's partial dot products from its K words
    (``wide_scores``), O += P V from its V words (``wide_pv``), the codes decoded 4 at a time where they are used,
    the scales applied once per score and per probability; a NaN code read by a lane of the warp makes the warp's
    accumulators NaN (``nan_warp``, fp8)."""
    E = D // LANES  # elements of a row per lane
    EW = max(1, E // 4)  # 32-bit words of a row per lane
    dq4 = e4m3x4_f32_finite if KV_FORMAT == 1 else int8x4_f32

    @device
    def wide_scores(K_words, Qr, sks, vals):
        """This lane's partial dot products of the ROWS query rows ``Qr`` with the step's keys (``K_words``, their
        K scales ``sks``) into ``vals`` (``vals[r · KEYS + t]``): the K scale per score."""
        for t in range(KEYS):
            for r in range(ROWS):
                vals[r * KEYS + t] = float32(0.0)
            for i in range(EW):
                x0, x1, x2, x3 = dq4(K_words[t, i])
                for r in range(ROWS):
                    s = vals[r * KEYS + t]
                    s += Qr[r, 4 * i] * x0
                    s += Qr[r, 4 * i + 1] * x1
                    s += Qr[r, 4 * i + 2] * x2
                    s += Qr[r, 4 * i + 3] * x3
                    vals[r * KEYS + t] = s
            for r in range(ROWS):
                vals[r * KEYS + t] *= sks[t]

    @device
    def wide_pv(V_words, sc, svs, acc):
        """O += P V for the step's keys (``V_words``, their V scales ``svs``; ``sc``: P): each key's V scale on its
        probabilities (l is already summed)."""
        for t in range(KEYS):
            for r in range(ROWS):
                sc[r, t] *= svs[t]
            for i in range(EW):
                x0, x1, x2, x3 = dq4(V_words[t, i])
                for r in range(ROWS):
                    p = sc[r, t]
                    acc[r, 4 * i] += p * x0
                    acc[r, 4 * i + 1] += p * x1
                    acc[r, 4 * i + 2] += p * x2
                    acc[r, 4 * i + 3] += p * x3

    @device
    def nan_warp(acc, bad):
        """A NaN code read by any lane of the warp (``bad`` ≠ 0 in one): the warp's accumulators NaN."""
        f = int32(1) if bad != uint32(0) else int32(0)
        for off in (16, 8, 4, 2, 1):
            f |= shfl_xor_sync(FULL_MASK, f, off)
        if f != 0:
            for r in range(ROWS):
                for e in range(E):
                    acc[r, e] = u32_as_f32(NAN_BITS)

    return wide_scores, wide_pv, nan_warp


@functools.cache
def make_lean_kernel(D: int, VW: int, LANES: int, KEYS: int, WARPS: int, ROWS: int, Nq: int, G: int, causal: bool,
                     FINAL: bool, FUSED: bool, MIN_BLOCKS: int = 1, P: int = 0, KV_FORMAT: int = 0, TOKEN: bool = False,
                     BF16: bool = False, BALANCE: bool = False, WORKLIST: bool = False, PAGE_AHEAD: bool = False,
                     stage=PLAIN):
    """The kernel of ``decode_split_k_lean`` (reduce-scatter scores, exp2, lazy
    rescale) and, with a page size ``P`` > 0, of ``paged_split_k``: a key row found
    through the block table (:func:`paged_keys`; ``KV_FORMAT``/``TOKEN``: an 8-bit cache
    and its scales), the sequence's own length ``seqlens[b]``, every split writing
    a partial (a length-0 sequence gets zeros). ``BF16``: bfloat16 query, output and
    16-bit cache (:func:`chunk_steps`). ``BALANCE`` (paged): ``chunk`` is the most keys of a split, and
    a sequence of ``Nk`` keys is cut into n = ⌈Nk / chunk⌉ splits of equal whole warp steps
    (:func:`balanced_split`) instead of n − 1 full ones and a remainder. ``WORKLIST`` (paged,
    ``paged_worklist``): block (w, row block) runs the items ``wptr[w] … wptr[w+1] − 1`` of a host-planned
    work list (:func:`worklist_plan`), each a (KV head of a sequence b · Hkv + h, split, keys [lo, hi), splits
    of that KV head) one after the other through the same block code, combined by the last block to finish a
    KV head's row block (per-(sequence, KV head) counters). ``PAGE_AHEAD`` (paged, pages holding whole
    warp steps): a warp reads the page index of its next step during this one, so that the block table's
    load is no longer a round trip before every step's K/V loads. ``stage``: a variant's (``scores.py``, on a
    step's scores after their reduction; the kernel's last argument ``mods``).

    ``VW`` = 16 with ``KV_FORMAT`` (``paged_split_k``'s ``wide``): a lane owns 16 consecutive
    codes per chunk, read by one 16-byte load (:func:`paged_words`), and decodes them where
    they are used, the scales applied once per score and per probability instead of per
    element; fp8's NaN codes are not patched per word: the lane ORs the codes' NaN tests,
    and a warp that read one sets its accumulators to NaN at the end (the rows of that
    sequence and KV head come out NaN)."""
    PAGED = P > 0
    THREADS = WARPS * WARP_SIZE
    WIDE = PAGED and KV_FORMAT > 0 and VW == 16
    load_rows, load_keys, _, merge_lanes, write_rows, combine_last = chunk_steps(
        D, VW, LANES, KEYS, WARPS, ROWS, Nq, G, causal, FINAL, BASE2=True, BF16=BF16, stage=stage)
    merge_smem = merge_arrays(WARPS, ROWS, D)
    E = D // LANES  # elements of a row per lane
    GROUPS = WARP_SIZE // LANES  # lane groups per warp
    KEYS_PER_STEP = GROUPS * KEYS  # keys per warp step: T keys per group
    if PAGED:
        load_keys = paged_keys(D, VW, LANES, KEYS, P, KEYS_PER_STEP, KV_FORMAT, TOKEN, BF16)
    LOGP, STEP = page_steps(P, KEYS_PER_STEP)
    AHEAD_STEP = PAGE_AHEAD and STEP
    EW = max(1, E // 4)  # 32-bit words of a row per lane (WIDE)
    if WIDE:
        load_words = paged_words(D, LANES, KEYS, P, KEYS_PER_STEP, KV_FORMAT, TOKEN)
        wide_scores, wide_pv, nan_warp = make_lean_wide(D, LANES, KEYS, ROWS, KV_FORMAT)
    THREADS = WARPS * WARP_SIZE
    ROW_BLOCKS = (G * Nq + ROWS - 1) // ROWS  # row blocks per KV head
    PADDED = score_plan(LANES, ROWS, KEYS)[0]
    VARIANT = stage.active
    EMPTY_SEQUENCE = empty_sequence_lse(stage)
    span_keys = stage_split_range(stage)  # a contiguous cache with a mask function: the splits divide its span
    SPANS = not PAGED and span_keys is not whole_range
    rescore = step_rescore(stage, ROWS, KEYS, GROUPS, Nq, G, causal, True)  # a variant's scores (base 2)

    split_keys, dot_scores, reduce_scores, lazy_update = make_lean_steps(D, VW, LANES, KEYS, ROWS, Nq, G, causal, P,
                                                                         KV_FORMAT, BALANCE)

    @device
    def lean_block(q, out, cache, scale, Hkv, Nk, seq, blk, sm, mods):
        """Block ``blk`` = (split, kvh, row0, lo, hi, ci): keys [lo, hi) of KV head kvh (b · Hkv + h) for its query
        rows from row0; ``ci`` its combine counter. ``out``: (o, part_o, part_lse, counters, S); ``cache``: (k, v,
        table, ks, vs); ``sm``: (sm_m, sm_l, sm_o, sm_last)."""
        o, part_o, part_lse, counters, S = out
        k, v, table, ks, vs = cache
        sm_m, sm_l, sm_o, sm_last = sm
        split, kvh, row0, lo, hi, ci = blk
        Qr = cuda.local.array((ROWS, E), float32)
        acc = cuda.local.array((ROWS, E), float32)
        m = cuda.local.array(ROWS, float32)
        l = cuda.local.array(ROWS, float32)
        lim = cuda.local.array(ROWS, int32)
        K_j = cuda.local.array((KEYS, E), float32)
        V_j = cuda.local.array((KEYS, E), float32)
        sc = cuda.local.array((ROWS, KEYS), float32)
        vals = cuda.local.array(PADDED, float32)
        if WIDE:
            K_words = cuda.local.array((KEYS, EW), uint32)
            V_words = cuda.local.array((KEYS, EW), uint32)
            sks = cuda.local.array(KEYS, float32)
            svs = cuda.local.array(KEYS, float32)
            bad = uint32(0)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // LANES
        sub = lane % LANES
        load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, hi, Nk)
        n_steps = max(0, (hi - lo + KEYS_PER_STEP - 1) // KEYS_PER_STEP)  # 0 for a split past the end
        nxt = 0
        if AHEAD_STEP:  # the warp's first page
            if w < n_steps:
                nxt = table[seq, (lo + w * KEYS_PER_STEP) >> LOGP]
        for step in range(w, n_steps, WARPS):  # warp-uniform: the shuffles stay convergent
            j0 = lo + step * KEYS_PER_STEP + grp  # this group's keys: j0 + t * KW
            pg = 0  # the step's page (STEP), read before its keys' loads, or a step ahead (AHEAD)
            if STEP:
                if AHEAD_STEP:
                    pg = nxt
                    if step + WARPS < n_steps:  # the warp's next step: its page index in flight during this one
                        nxt = table[seq, (lo + (step + WARPS) * KEYS_PER_STEP) >> LOGP]
                else:
                    pg = table[seq, (lo + step * KEYS_PER_STEP) >> LOGP]
            if WIDE:  # the words, decoded here: 4 codes at a time for every row; the K scale per score
                bad |= load_words(k, v, K_words, V_words, sks, svs, table, seq, kvh - seq * Hkv, pg, j0, hi, sub,
                                  ks, vs)
                wide_scores(K_words, Qr, sks, vals)
            else:
                if PAGED:
                    load_keys(k, v, K_j, V_j, table, seq, kvh - seq * Hkv, pg, j0, hi, sub, ks, vs)
                else:
                    load_keys(k, v, K_j, V_j, kvh, j0, hi, sub)
                dot_scores(Qr, K_j, vals)  # this lane's partial dot products
            reduce_scores(vals, sc, sub, grp)  # the scores: reduce-scatter, then all-gather
            if VARIANT:
                rescore(sc, lim, j0, (kvh, row0, Hkv, Nk), mods)
            lazy_update(sc, m, l, acc, lim, j0, V_j)  # (base 2) the rescale only when a maximum moved
            if WIDE:  # O += P V: each key's V scale on its probabilities (l is already summed)
                wide_pv(V_words, sc, svs, acc)
        if WIDE and KV_FORMAT == 1:  # a NaN code read by any lane of the warp: the warp's accumulators NaN
            nan_warp(acc, bad)
        merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub)  # base 2: exp2
        cuda.syncthreads()
        write_rows(o, part_o, part_lse, split, kvh, row0, tid, sm_m, sm_l, sm_o, mods)  # lse back to natural units
        if PAGED:
            if Nk == 0 and split == 0:  # an empty sequence: a zero partial of weight 1, the output is zeros
                for idx in range(tid, ROWS * D, THREADS):  # the threads that wrote the log-sum-exps (d = 0)
                    r = idx // D
                    if idx == r * D and row0 + r < G * Nq:
                        bh = kvh * G + (row0 + r) // Nq
                        part_lse[0, bh * Nq + (row0 + r) % Nq] = EMPTY_SEQUENCE
        if FUSED and not FINAL:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid, ci, mods)

    if WORKLIST:
        @kernel(launch_bounds=(THREADS, MIN_BLOCKS))
        def paged_worklist(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, work, wptr,
                           mods):
            sm = merge_smem()
            for it in range(wptr[cuda.blockIdx.x], wptr[cuda.blockIdx.x + 1]):
                kvh = work[it, 0]  # the item's KV head of a sequence (b · Hkv + h)
                seq = kvh // Hkv
                hrb = kvh * ROW_BLOCKS + cuda.blockIdx.y  # (sequence, KV head, row block): its counter
                Nk = seqlens[seq]  # (the item's values read in this order: the loads' order of the code)
                split = work[it, 1]
                lo = work[it, 2]
                hi = work[it, 3]
                S = work[it, 4]  # the item's KV head's number of splits
                lean_block(q, (o, part_o, part_lse, counters, S), (k, v, table, ks, vs), scale, Hkv, Nk, seq,
                           (split, kvh, (hrb - kvh * ROW_BLOCKS) * ROWS, lo, hi, hrb), sm, mods)
                cuda.syncthreads()  # the next item's warps write the merge arrays this one read

        return paged_worklist

    if PAGED:
        @kernel(launch_bounds=(THREADS, MIN_BLOCKS))
        def paged_split_k(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, chunk, S,
                          mods):
            sm = merge_smem()
            seq = cuda.blockIdx.y // ROW_BLOCKS // Hkv
            Nk = seqlens[seq]  # the sequence's own number of keys
            split, kvh, row0, lo, hi = split_keys(chunk, Nk)
            lean_block(q, (o, part_o, part_lse, counters, S), (k, v, table, ks, vs), scale, Hkv, Nk, seq,
                       (split, kvh, row0, lo, hi, cuda.blockIdx.y), sm, mods)

        return paged_split_k

    @kernel(launch_bounds=(THREADS, MIN_BLOCKS))
    def decode_split_k_lean(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, chunk, S, mods):
        sm = merge_smem()
        # (no block table, no scales: Nk, k and scale stand in for them, unused)
        split, kvh, row0, lo, hi = split_keys(chunk, Nk)
        if SPANS:
            lo, hi = span_keys(mods, kvh, split, S, chunk, Nk)
        lean_block(q, (o, part_o, part_lse, counters, S), (k, v, k, scale, scale), scale, Hkv, Nk, Nk,
                   (split, kvh, row0, lo, hi, cuda.blockIdx.y), sm, mods)

    return decode_split_k_lean


@register_phase(
    name="decode_split_k_lean", order=33,
    title="Decode: split-K with a lean inner loop (reduce-scatter scores, exp2, lazy rescale)",
    parent="decode_split_k_fused", kind="decode",
    description="""
        decode_split_k_fused with fewer instructions per key: the partial dot products
        of all rows and keys of a step are summed over the lanes of a group with a
        reduce-scatter and one all-gather instead of one butterfly per score; scores in
        base 2 (log2 e folded into the query scale, exp2); the accumulators are
        rescaled only when a row's maximum moved; the combine runs in the last block
        when it is small (S x rows <= fuse_max) and in a second kernel otherwise.
    """,
    lineage="Flash-Decoding (Dao et al. 2023); reduce-scatter/all-gather all-reduce (Rabenseifner); "
            "FlashAttention-2 exp2 scaling; lazy rescaling (FlashAttention-3 / FlashInfer)",
    planned_speedup=45.0,
    dtypes=("float32", "float16", "bfloat16"),
    **split_registration(check_split, resolve_split, {"warps": [4, 8], "keys": [0, 1, 2, 4],
                                                      "splits": [0, 8, 16, 32, 64], "blocks_per_sm": [1, 2, 4]}),
)
def decode_split_k_lean(problem, warps=8, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=2, min_keys=256,
                        fuse_max=64):
    final = splits == 1
    fused = splits * rows <= fuse_max
    kern = make_lean_kernel(problem.head_dim, vector_width(problem.dtype), lanes, keys, warps, rows, problem.q_len,
                            problem.group, problem.causal, final, fused, blocks_per_sm,
                            BF16=problem.dtype == "bfloat16", stage=stages_for(problem))
    scale = float32(problem.sm_scale * float(LOG2E))  # scores in base 2: exp2 instead of exp
    return split_launch(problem, kern, scale, warps, lanes, rows, keys, splits, counters=True, combine=not fused,
                        notes=f", combine {'-' if final else ('fused' if fused else 'kernel')}")
