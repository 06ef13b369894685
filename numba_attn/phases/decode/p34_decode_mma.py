"""Phase 34 — ``decode_mma``: the query rows of a KV head as one tensor-core tile.

Change against ``decode_split_k_lean``: the same split-K and two-pass combine; a block's query rows (GQA group ×
q_len ≤ 16) become the A operand of ``mma.sync m16n8k16`` (zero-padded to 16 rows), so scores and P·V run on the
tensor cores, the online softmax on the fragments, P in registers. Each warp streams its own ``Bc``-key tiles
through a ``stages``-deep swizzled ``cp.async`` ring (``ldmatrix``, V transposed), with no block barrier in the
loop; the warps merge through the ring's shared memory. The combine is compiled for its split count and, on
sm_90, launched as a programmatic dependent launch (``pdl``).

Prediction: GQA B=1 32k fp16 from 52 µs (``decode_split_k_lean``) to ~35 µs; B=8 310 → ~250 µs; MHA no gain.
Verdict: 0.0386 ms at B1 H32/8kv Nq1 Nk32768 D128 fp16 (H200), 1.28x decode_split_k_lean
[results/decode-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import LOG2E, NEG_BIG, fragment_update, merge_state, state_lse
from numba_attn.gpu.intrinsics import cp_async_commit, cp_async_wait
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.pdl import launch_after, launch_dependents, pdl_available, uses_griddepcontrol
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, swizzle_row_chunks
from numba_attn.gpu.split_k import make_combine_kernel, make_combine_lse_kernel, sm_count, split_plan
from numba_attn.gpu.warp import WARP_SIZE, quad_sum, syncwarp
from numba_attn.phases.decode.kv8 import kv8_decoder
from numba_attn.phases.decode.launch import (combine_args, launch_mods, split_registration, split_workspace,
                                             variant_mods, zeroed_counters)
from numba_attn.phases.decode.mma_tiles import make_mma_tiles
from numba_attn.phases.decode.paged import PAGED_KV8, PAGED_TOKEN_SCALE, paged_cache_view
from numba_attn.phases.decode.rules import (check_alignment, check_decode_mma, decode_mma_smem_bytes, ragged_mean,
                                            resolve_decode_mma)
from numba_attn.phases.decode.scores import fragment_rescore, key_mask, variant_keys
from numba_attn.phases.decode.steps import combined_output, empty_sequence_lse, f32_to_bf16
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.variants.sinks import lse_parts, stages_for, wants_lse, with_lse
from numba_attn.variants.spans import stage_split_range, whole_range
from numba_attn.variants.stages import PLAIN

FULL = 0xFFFFFFFF


@functools.cache
def make_mma_combine(D: int, WARPS: int, Nq: int, G: int, FINAL: bool, FUSED: bool, BF16: bool, LSE: bool = False):
    """``decode_mma``'s fused combine: the last block of a KV head to finish merges the splits' partials (``LSE``:
    and writes the rows' log-sum-exp to ``mods[-1]``)."""
    QUERY_ROWS = G * Nq  # query rows of a KV head (≤ 16: one m-tile)
    THREADS = WARPS * WARP_SIZE
    FLAG = WARPS * 16
    write_combined = combined_output(BF16, LSE)

    @device
    def combine_last(out, MM, kvh, tid, mods):
        """``FUSED``: the last block of this (sequence, KV head) to finish combines the splits (``MM``'s flag row
        says which). ``out``: (o, part_o, part_lse, counters, S)."""
        o, part_o, part_lse, counters, S = out
        if FUSED and not FINAL:
            cuda.threadfence()  # this block's partials are visible device-wide before it counts
            cuda.syncthreads()
            if tid == 0:
                prev = cuda.atomic.add(counters, kvh, 1)
                MM[FLAG, 0] = float32(1.0) if prev == S - 1 else float32(0.0)
            cuda.syncthreads()
            if MM[FLAG, 0] > float32(0.5):
                cuda.threadfence()
                for idx in range(tid, QUERY_ROWS * D, THREADS):
                    r = idx // D
                    d = idx - r * D
                    bh = kvh * G + r // Nq
                    i = r % Nq
                    write_combined(o, part_o, part_lse, S, bh, i, d, bh * Nq + i, mods)
                if tid == 0:
                    counters[kvh] = 0  # ready for the next launch

    return combine_last


@functools.cache
def make_mma_softmax(D: int, Bc: int, Nq: int, G: int, stage=PLAIN):
    """``tile_softmax``: ``decode_mma``'s online softmax on a tile's S fragments (raw scores; exp2 with the scale
    folded in): a variant's scores, the rows' new maxima and sums, O rescaled, S overwritten by P."""
    QUERY_ROWS = G * Nq  # query rows of a KV head (≤ 16: one m-tile)
    S_NTILES = Bc // 8  # n-tiles of S
    DTK = 16 * ((D + 15) // 16) // 8  # n-tiles of O computed (the padding's stay zero)
    softmax = fragment_update(S_NTILES, DTK)  # online softmax on the S fragments, O rescaled (device_functions)
    VARIANT = stage.active
    rescore = fragment_rescore(stage, S_NTILES)  # a variant's scores (scores.py)
    vk = variant_keys(stage)

    @device
    def tile_softmax(s, acc, state, j0, t, rows, key, scales, mods):
        """The tile of keys from ``j0`` (``s``: its masked S fragments) into the rows' state ``state`` = (m_lo,
        m_hi, l_lo, l_hi) of rows g, g+8 and ``acc``; ``rows``: (r_lo, r_hi, lim_lo, lim_hi); ``key``: (kvh, Hkv,
        Nk); ``scales``: (sl2, scale). Returns the new state."""
        r_lo, r_hi, lim_lo, lim_hi = rows
        kvh, Hkv, Nk = key
        sl2, scale = scales
        if VARIANT:  # the variant on the keys the rows see (a padding row: none)
            rescore(s, j0, t, lim_lo if r_lo < QUERY_ROWS else 0, lim_hi if r_hi < QUERY_ROWS else 0,
                    vk.position(kvh, r_lo, Hkv, G, Nq, Nk), vk.position(kvh, r_hi, Hkv, G, Nq, Nk), scale, mods)
        return softmax(s, acc, state, sl2)

    return tile_softmax


@functools.cache
def make_mma_epilogue(D: int, WARPS: int, Nq: int, G: int, FINAL: bool, BF16: bool, PAGED: bool, KV_FORMAT: int,
                      TOKEN: bool, stage=PLAIN):
    """``decode_mma``'s epilogue: a warp's state into shared memory (``warp_state``), then the warps' states merged
    and the block's rows written (``write_rows``; ``FINAL``: the output; else the split's partial and log-sum-exp;
    ``stage``: a variant's)."""
    QUERY_ROWS = G * Nq  # query rows of a KV head (≤ 16: one m-tile)
    THREADS = WARPS * WARP_SIZE
    DT = D // 8  # n-tiles of O written out
    O_REGS = 4 * (16 * ((D + 15) // 16) // 8)  # O fragments of a lane (the padding's included)
    _, UNIT = kv8_decoder(KV_FORMAT)
    LSE, store_lse, _ = lse_parts(stage)
    EMPTY_SEQUENCE = empty_sequence_lse(stage)
    VARIANT = stage.active
    vk = variant_keys(stage)

    @device
    def warp_state(MO, MM, acc, state, v_sc, h, scale, warp, g, t):
        """The warp's O fragments of rows g, g+8 into ``MO`` (8-bit cache, per tensor / head: V's scale on them
        first), their m and l (summed over the quad) into ``MM``. ``state``: (m_lo, m_hi, l_lo, l_hi)."""
        m_lo, m_hi, l_lo, l_hi = state
        l_lo = quad_sum(l_lo)
        l_hi = quad_sum(l_hi)
        if KV_FORMAT and not TOKEN:  # per tensor / head: V's scale on the block's accumulators
            vscale = v_sc[0, h] * UNIT
            for i in range(O_REGS):
                acc[i] *= vscale
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

    @device
    def write_rows(out, MO, MM, blk, tid, mods):
        """The block's rows from the warps' states in shared memory (``MO``: O, ``MM``: m, l of every warp's 16
        rows), merged; ``blk``: (split, kvh, Nk)."""
        o, part_o, part_lse, _, _ = out
        split, kvh, Nk = blk
        for idx in range(tid, QUERY_ROWS * D, THREADS):
            r = idx // D
            d = idx - r * D
            mm = NEG_BIG
            ll = float32(0.0)
            oo = float32(0.0)
            for ww in range(WARPS):
                mm, ll, ca, cb = merge_state(mm, ll, MM[ww * 16 + r, 0], MM[ww * 16 + r, 1])
                oo = oo * ca + cb * MO[ww * 16 + r, d]
            bh = kvh * G + r // Nq
            i = r % Nq
            if FINAL and VARIANT:  # 0 for a row that saw no key
                if BF16:
                    o[bh, i, d] = f32_to_bf16(vk.normalized(oo, mm, ll))
                else:
                    o[bh, i, d] = vk.normalized(oo, mm, ll)
                if LSE and d == 0:
                    store_lse(mods, bh, i, mm, ll)
            elif FINAL:
                if PAGED and BF16:
                    o[bh, i, d] = f32_to_bf16(oo / ll if ll != float32(0.0) else float32(0.0))
                elif PAGED:
                    o[bh, i, d] = oo / ll if ll != float32(0.0) else float32(0.0)  # an empty sequence: zeros
                elif BF16:
                    o[bh, i, d] = f32_to_bf16(oo / ll)
                else:
                    o[bh, i, d] = oo / ll
                if LSE and d == 0:  # the row's log-sum-exp (mm in natural units)
                    store_lse(mods, bh, i, mm, ll)
            elif VARIANT:  # a split that saw no key of the row: a zero partial, weighed 0 (or 1 where none did)
                part_o[split, bh * Nq + i, d] = vk.normalized(oo, mm, ll)
                if d == 0:
                    lse = vk.partial_lse(mm, ll, state_lse(mm, ll))
                    part_lse[split, bh * Nq + i] = lse if not PAGED or Nk > 0 or split > 0 else EMPTY_SEQUENCE
            else:
                part_o[split, bh * Nq + i, d] = oo / ll if ll != float32(0.0) else float32(0.0)
                if d == 0:
                    if PAGED:  # an empty sequence: split 0 is a zero partial of weight 1
                        part_lse[split, bh * Nq + i] = state_lse(mm, ll) if Nk > 0 or split > 0 else EMPTY_SEQUENCE
                    else:
                        part_lse[split, bh * Nq + i] = state_lse(mm, ll)

    return warp_state, write_rows


@functools.cache
def make_mma_prologue(D: int, Bc: int, Nq: int, G: int, causal: bool, EVEN: bool):
    """``decode_mma``'s prologue: a split's keys (``split_keys``) and the A fragments of a KV head's query rows
    (``query_fragments``)."""
    key_limit, _ = key_mask(causal, Nq)  # the keys a row sees (scores.py)
    DW = D // 2
    VEC = D // 8
    CVEC = 16 * ((D + 15) // 16) // 8
    QUERY_ROWS = G * Nq  # query rows of a KV head (≤ 16: one m-tile)
    QK_KSTEPS = (16 * ((D + 15) // 16)) // 16  # k-steps of Q·Kᵀ

    @device
    def split_keys(split, Nk, chunk, S):
        """Keys [lo, hi) of split ``split`` of ``S`` (``EVEN``: ``chunk`` is the number of Bc-key tiles, split s
        takes tiles s·T/S … (s+1)·T/S; else ``chunk`` keys)."""
        if EVEN:
            lo = (split * chunk) // S * Bc
            hi = min(Nk, ((split + 1) * chunk) // S * Bc)
        else:
            lo = split * chunk
            hi = min(Nk, lo + chunk)
        return lo, hi

    @device
    def query_fragments(q, qf, kvh, g, t, hi, Nk):
        """The A fragments of KV head ``kvh``'s query rows (zero-padded to 16) into ``qf``; returns rows g, g+8
        and the keys they see (< lim; causal: bottom-right aligned; a padding row sees the split's keys < ``hi``)."""
        # Q fragments: rows g and g+8 of the tile = query rows (head kvh·G + r // Nq, position r % Nq)
        r_lo = g
        r_hi = g + 8
        b_lo = kvh * G + r_lo // Nq
        i_lo = r_lo % Nq
        b_hi = kvh * G + r_hi // Nq
        i_hi = r_hi % Nq
        for ks in range(QK_KSTEPS):
            c = 8 * ks + t
            qf[4 * ks + 0] = q[b_lo, i_lo, c] if r_lo < QUERY_ROWS else uint32(0)
            qf[4 * ks + 1] = q[b_hi, i_hi, c] if r_hi < QUERY_ROWS else uint32(0)
            if CVEC > VEC:  # the last k-step's upper half lies past the row: zero
                qf[4 * ks + 2] = q[b_lo, i_lo, c + 4] if r_lo < QUERY_ROWS and c + 4 < DW else uint32(0)
                qf[4 * ks + 3] = q[b_hi, i_hi, c + 4] if r_hi < QUERY_ROWS and c + 4 < DW else uint32(0)
            else:
                qf[4 * ks + 2] = q[b_lo, i_lo, c + 4] if r_lo < QUERY_ROWS else uint32(0)
                qf[4 * ks + 3] = q[b_hi, i_hi, c + 4] if r_hi < QUERY_ROWS else uint32(0)
        lim_lo = key_limit(i_lo, hi, Nk) if r_lo < QUERY_ROWS else hi
        lim_hi = key_limit(i_hi, hi, Nk) if r_hi < QUERY_ROWS else hi
        return r_lo, r_hi, lim_lo, lim_hi

    return split_keys, query_fragments


@functools.cache
def make_decode_mma_kernel(D: int, WARPS: int, Bc: int, stages: int, Nq: int, G: int, causal: bool, FINAL: bool,
                           FUSED: bool, PDL: int = 0, L2_PREFETCH: bool = False, EVEN: bool = False, P: int = 0,
                           BF16: bool = False, KV_FORMAT: int = 0, TOKEN: bool = False, stage=PLAIN):
    """The kernel of ``decode_mma`` (a KV head's query rows as one m16 tile, a cp.async
    ring per warp) and, with a page size ``P`` > 0, of ``paged_mma``: key j of sequence
    b is cache row ``table[b, j // P] · P + j % P`` (the page index read once per tile
    when ``P % Bc == 0``), the sequence's own length ``seqlens[b]``, zeros for a
    length-0 sequence. ``BF16``: bfloat16 query, output and 16-bit cache (mma.sync bf16).

    ``KV_FORMAT`` (paged only; 1 fp8 e4m3, 2 int8; D a multiple of 16): the cache's bytes are
    copied by cp.async into a byte ring per warp (half the bytes of a 16-bit tile); when a
    tile has landed, the warp turns its codes into 16-bit values (exact: every e4m3 and
    int8 code is a float16 and a bfloat16) in one swizzled 16-bit tile per warp, which the
    fragments read by ldmatrix as before. The scales are applied in fp32: a per-tensor or
    per-head K scale is folded into the block's score scale, a per-head V scale multiplies
    the block's accumulators once at the end; per token (``TOKEN``) each key's K scale
    multiplies its column of S and its V scale its column of P (after the row sums are
    taken, so l stays the softmax normaliser), before P is rounded to 16 bits.

    ``stage``: a variant's (``scores.py``: on the S fragments after the split/causal mask; ``mods`` the kernel's
    last argument; a row that sees no key is 0)."""
    PAGED = P > 0
    DK = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps (D itself when a multiple of 16)
    QK_KSTEPS = DK // 16  # k-steps of Q·Kᵀ
    S_NTILES = Bc // 8  # n-tiles of S
    DTK = DK // 8  # n-tiles of O computed (the padding's stay zero)
    SDW = 4 * swizzle_row_chunks(D)  # words per shared row (padded so the swizzle is a permutation)
    SWM = min(8, SDW // 4) - 1
    RING = 2 * stages * Bc  # K/V rows of one warp's ring
    ROWS = WARPS * RING  # rows of the block's rings (float32 view, SDW words each)
    Q_REGS = 4 * QK_KSTEPS
    S_REGS = 4 * S_NTILES
    O_REGS = 4 * DTK
    WAIT = stages - 2
    MO_ROWS = WARPS * 16  # merge area: O of every warp's 16 rows (aliases the rings)
    ML = ROWS * SDW if ROWS * SDW >= MO_ROWS * D else MO_ROWS * D  # float offset of the m/l area
    MLR = WARPS * 16 + 1  # rows of the m/l area, and one for the last-block flag (closure constants)
    # 8-bit cache: a byte ring (rows of D bytes = DW8 words) per warp, then a 16-bit tile per warp
    DW8 = D // 4
    BYTES8 = WARPS * RING * DW8  # floats of the byte rings
    STAGE_ROWS = WARPS * 2 * Bc  # rows of the 16-bit tiles (K then V of each warp)
    _, UNIT = kv8_decoder(KV_FORMAT)
    NT2 = 2 * S_NTILES  # key columns of a lane in S
    if KV_FORMAT:
        ML = max(BYTES8 + STAGE_ROWS * SDW, MO_ROWS * D)

    copy_tile8, dequant_tile, copy_tile, tile_scores, token_scales, mask_tile, v_scales, tile_pv = make_mma_tiles(
        D, WARPS, Bc, stages, Nq, causal, L2_PREFETCH, P, BF16, KV_FORMAT)
    split_keys, query_fragments = make_mma_prologue(D, Bc, Nq, G, causal, EVEN)
    tile_softmax = make_mma_softmax(D, Bc, Nq, G, stage)
    warp_state, write_rows = make_mma_epilogue(D, WARPS, Nq, G, FINAL, BF16, PAGED, KV_FORMAT, TOKEN, stage)
    LSE = lse_parts(stage)[0]
    span_keys = stage_split_range(stage)  # with a mask function: the splits divide the keys the heads see
    SPANS = P == 0 and span_keys is not whole_range  # (a ragged paged batch's sequences each end elsewhere)
    combine_last = make_mma_combine(D, WARPS, Nq, G, FINAL, FUSED, BF16, LSE) if LSE else \
        make_mma_combine(D, WARPS, Nq, G, FINAL, FUSED, BF16)

    @device
    def mma_block(q, out, cache, sl2, scale, Hkv, Nk, seq, chunk, mods):
        """The block of split ``blockIdx.x``, KV head ``blockIdx.y`` (``Nk`` keys of sequence ``seq``).
        ``out``: (o, part_o, part_lse, counters, S); ``cache``: (k, v, table, k_sc, v_sc)."""
        S = out[4]
        k, v, table, k_sc, v_sc = cache
        if PDL == 1:
            launch_dependents()  # the combine kernel may be launched now; it waits for this grid to complete
        h = cuda.blockIdx.y - seq * Hkv  # the KV head (8-bit cache: its scales)
        if KV_FORMAT:
            KB = dynamic_tile(0, ROWS, DW8)  # the byte rings
            KV = dynamic_tile(BYTES8, STAGE_ROWS, SDW)  # the 16-bit tiles
            if not TOKEN:  # per tensor / head: K's scale folded into the score scale
                sl2 = sl2 * (k_sc[0, h] * UNIT)
                scale = scale * (k_sc[0, h] * UNIT)
        else:
            KV = dynamic_tile(0, ROWS, SDW)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        if SPANS:
            lo, hi = span_keys(mods, kvh, split, S, chunk, Nk)
        else:
            lo, hi = split_keys(split, Nk, chunk, S)  # (EVEN: `chunk` tiles spread evenly over the splits)
        tid = cuda.threadIdx.x
        warp = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        g = lane // 4
        t = lane % 4
        lm = lane // 8
        lr = lane % 8

        qf = cuda.local.array(Q_REGS, uint32)
        r_lo, r_hi, lim_lo, lim_hi = query_fragments(q, qf, kvh, g, t, hi, Nk)  # rows g, g+8: keys < lim visible
        acc = cuda.local.array(O_REGS, float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s = cuda.local.array(S_REGS, float32)
        if KV_FORMAT and TOKEN:
            vsc = cuda.local.array(NT2, float32)  # the V scales of this lane's key columns
        m_lo = NEG_BIG
        m_hi = NEG_BIG
        l_lo = float32(0.0)
        l_hi = float32(0.0)

        n_tiles = max(0, (hi - lo + Bc - 1) // Bc)
        mine = max(0, (n_tiles - warp + WARPS - 1) // WARPS)  # this warp's tiles: warp, warp + W, ...
        base = warp * RING  # first row of this warp's ring
        k_r = (lm // 2) * 8 + lr
        k_c = lm % 2
        v_r = (lm % 2) * 8 + lr
        v_c = lm // 2
        k_sw = k_r & SWM
        v_sw = v_r & SWM
        if PAGED:
            g_base = (kvh - seq * Hkv) * D  # flat element offset of the KV head within a cache row
        else:
            g_base = kvh * Nk * D  # flat element offset of (kvh, key 0) in k and v

        for st in range(stages - 1):
            if st < mine:
                if KV_FORMAT:
                    copy_tile8(KB, k, v, lo + (warp + st * WARPS) * Bc, base + st * Bc, lane, hi, table, seq, Hkv, h)
                else:
                    copy_tile(KV, k, v, lo + (warp + st * WARPS) * Bc, base + st * Bc, lane, g_base, hi, Nk, table, seq,
                              Hkv)
            cp_async_commit()

        for it in range(mine):
            cp_async_wait(WAIT)  # this lane's copies of tile `it` have landed ...
            syncwarp(FULL)  # ... and every lane's; every lane is done with tile it-1
            nxt = it + stages - 1
            if nxt < mine:
                if KV_FORMAT:
                    copy_tile8(KB, k, v, lo + (warp + nxt * WARPS) * Bc, base + (nxt % stages) * Bc, lane, hi, table,
                               seq, Hkv, h)
                else:
                    copy_tile(KV, k, v, lo + (warp + nxt * WARPS) * Bc, base + (nxt % stages) * Bc, lane, g_base, hi,
                              Nk, table, seq, Hkv)
            cp_async_commit()

            j0 = lo + (warp + it * WARPS) * Bc
            if KV_FORMAT:  # the landed bytes → the warp's 16-bit tile, read below as a 16-bit ring's would be
                kb = warp * 2 * Bc
                dequant_tile(KB, KV, base + (it % stages) * Bc, kb, lane)
                syncwarp(FULL)
                vb = kb + Bc
            else:
                kb = base + (it % stages) * Bc
                vb = kb + stages * Bc
            tile_scores(KV, qf, s, kb, k_r, k_c, k_sw)  # S = Q Kᵀ for Bc keys
            if KV_FORMAT and TOKEN:  # each key's K scale on its column of S (its V scale kept for P)
                token_scales(s, vsc, cache, seq, h, j0, hi, t)
            mask_tile(s, j0, t, lim_lo, lim_hi)  # keys past the split, or (causal) after the row
            # -- online softmax on the fragments (a variant's scores first; exp2 with the scale folded in)
            m_lo, m_hi, l_lo, l_hi = tile_softmax(s, acc, (m_lo, m_hi, l_lo, l_hi), j0, t,
                                                  (r_lo, r_hi, lim_lo, lim_hi), (kvh, Hkv, Nk), (sl2, scale), mods)
            if KV_FORMAT and TOKEN:  # each key's V scale on its column of P (l already summed)
                v_scales(s, vsc)
            tile_pv(KV, s, acc, vb, v_r, v_c, v_sw)  # O += P V

        if PDL == 2:
            launch_dependents()  # after the loop: the combine launches while the blocks merge and write
        # -- merge the warps' states through shared memory (the rings' space)
        cp_async_wait(0)
        cuda.syncthreads()
        MO = dynamic_tile(0, MO_ROWS, D)
        MM = dynamic_tile(ML, MLR, 2)
        warp_state(MO, MM, acc, (m_lo, m_hi, l_lo, l_hi), v_sc, h, scale, warp, g, t)
        cuda.syncthreads()
        write_rows(out, MO, MM, (split, kvh, Nk), tid, mods)
        combine_last(out, MM, kvh, tid, mods)

    if KV_FORMAT:
        @kernel
        def paged_mma8(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, table, seqlens, ks, vs, chunk, S,
                       mods):
            seq = cuda.blockIdx.y // Hkv
            mma_block(q, (o, part_o, part_lse, counters, S), (k, v, table, ks, vs), sl2, scale, Hkv, seqlens[seq],
                      seq, chunk, mods)

        return paged_mma8

    if PAGED:
        @kernel
        def paged_mma(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, table, seqlens, chunk, S, mods):
            seq = cuda.blockIdx.y // Hkv
            # (no scales: table stands in for them, unused)
            mma_block(q, (o, part_o, part_lse, counters, S), (k, v, table, table, table), sl2, scale, Hkv,
                      seqlens[seq], seq, chunk, mods)

        return paged_mma

    @kernel
    def decode_mma(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, chunk, S, mods):
        # (no block table, no scales: Nk and k stand in for the sequence, the table and the scales, unused)
        mma_block(q, (o, part_o, part_lse, counters, S), (k, v, k, k, k), sl2, scale, Hkv, Nk, Nk, chunk, mods)

    return decode_mma


FIXED_COMBINE_MAX = 32  # split counts up to this get a combine kernel compiled for their count


PDL_MODES = {1: "combine launched at the split kernel's start", 2: "launched after its loop",
             3: "launched at its exit"}


def decode_mma_launch(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
               fixed_combine, P=0, keys=None, note=""):
    """The host side of ``decode_mma`` (``P = 0``) and ``paged_mma`` (``P`` = page size): the split
    plan, the kernel of :func:`make_decode_mma_kernel`, the split-K workspace and combine, and the launch.
    ``keys(layout)`` gives the kernel's key arguments (``(Nk,)``, or the block table and the lengths
    of the call's ``layout``); ``note`` goes into the Launch's notes after the split size."""
    B, Hkv, Nq, Nk, D = problem.batch, problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    S, chunk = split_plan(B * Hkv, Nk, warps * Bc, sm_count(), blocks_per_sm, min_keys, splits,
                          mean_len=ragged_mean(problem))
    final = S == 1
    fused = S * G * Nq <= fuse_max
    lse_asked = wants_lse(problem)  # (the log-sum-exp's combine is launched after the kernel, not dependent)
    dependent = bool(pdl) and not final and not fused and not lse_asked and uses_griddepcontrol()
    if even:
        chunk = -(-Nk // Bc)  # tiles, spread evenly over the splits by the kernel
    bf16 = problem.dtype == "bfloat16"
    kv8 = PAGED_KV8[getattr(problem, "kv_dtype", "")] if P else 0
    extra = {"BF16": True} if bf16 else {}
    if kv8:
        extra.update(KV_FORMAT=kv8, TOKEN=bool(PAGED_TOKEN_SCALE[problem.kv_scale]))
    kern = make_decode_mma_kernel(D, warps, Bc, stages, Nq, G, problem.causal, final, fused,
                                  int(pdl) if dependent else 0,
                           bool(l2_prefetch), bool(even), P=P, stage=stages_for(problem), **extra)
    sl2 = float32(problem.sm_scale * float(LOG2E))
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv)
    nbytes = decode_mma_smem_bytes(D, warps, Bc, stages, bool(kv8))
    part_o, part_lse = split_workspace(S, B * problem.heads * Nq, D)
    kernels = [kern]
    if not final and not fused and lse_asked:
        combine = make_combine_lse_kernel(Nq, BF16=bf16)
        kernels.append(combine)
    elif not final and not fused:
        combine = make_combine_kernel(Nq, dependent, S if fixed_combine and S <= FIXED_COMBINE_MAX else 0,
                                      **({"BF16": True} if bf16 else {}))
        kernels.append(combine)
    counters = zeroed_counters(B * Hkv)
    views = {}
    opted = []
    kernel_mods = variant_mods(problem)

    def run(q, k, v, o, stream=0, layout=None, mods=None, lse=None):
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            check_alignment(k, v)
            if len(views) >= 8:
                views.clear()
            hit = views[key] = ((q, k, v, o), view_as(q, np.uint32),
                                *((paged_cache_view(problem, k), paged_cache_view(problem, v)) if kv8 else (k, v)))
        args = (hit[1], hit[2], hit[3], o, part_o, part_lse, counters, sl2, scale, Hkv, *keys(layout), chunk, S,
                with_lse(kernel_mods(stream=stream) if mods is None else mods, lse))
        if opted:
            kern[grid, warps * WARP_SIZE, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, warps * WARP_SIZE, stream, nbytes, *args)
            opted.append(True)
        if dependent:
            launch_after(combine, B * problem.heads * Nq, D, stream, 0, part_o, part_lse, o, S)
        elif not final and not fused:
            combine[B * problem.heads * Nq, D, stream](*combine_args(part_o, part_lse, o, S, lse))

    size = f"{chunk // S}-{-(-chunk // S)} tiles" if even else f"{chunk} keys"
    how = "-" if final else ("fused" if fused else "kernel")
    if not final and not fused and S <= FIXED_COMBINE_MAX and fixed_combine and not lse_asked:
        how += f" (compiled for {S} splits)"
    if dependent and pdl_available() is None:
        how += f", dependent launch ({PDL_MODES[int(pdl)]})"
    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {size}, {note}{warps} warps × {Bc}-key tiles, {stages} stages, "
                        f"combine {how}", **launch_mods(kernel_mods))


def decode_mma_registration(supports, layout="contiguous"):
    """The ``register_phase`` keywords of ``decode_mma`` and its paged form: the split-K decode phases' with the
    tensor-core tiles' space and simulator parameters, sm_80 (cp.async, ldmatrix, mma.sync), fp16/bf16."""
    return split_registration(supports, resolve_decode_mma,
                              {"warps": [2, 4, 8], "Bc": [16, 32], "stages": [2, 3, 4], "splits": [0, 8, 16, 32, 64]},
                              {"warps": 2, "Bc": 16, "stages": 2, "splits": 3}, layout, requires_cc=(8, 0),
                              dtypes=("float16", "bfloat16"))


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
    **decode_mma_registration(check_decode_mma),
)
def decode_mma(problem, warps=4, Bc=16, stages=3, splits=0, blocks_per_sm=2, min_keys=2048, fuse_max=0, pdl=3,
               l2_prefetch=False, even=False, fixed_combine=True):
    Nk = problem.kv_len
    return decode_mma_launch(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl,
                             l2_prefetch, even, fixed_combine, keys=lambda layout: (Nk,))
