"""The tiles of ``decode_mma`` (p34): the cp.async copies of K and V (and their 8-bit codes and scales), the
decoding, S = Q·Kᵀ, the mask and P·V on mma.sync, as one cached factory (:func:`make_mma_tiles`)."""
from __future__ import annotations

import functools

from numba import float32, uint32

from numba_attn.gpu.device_functions import NEG_BIG
from numba_attn.gpu.intrinsics import (cp_async16_flat, cp_async16_flat_l2_256, ld_shared_v4, ldmatrix_x4,
                                       ldmatrix_x4_trans, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2, st_shared_v4)
from numba_attn.gpu.jit import device
from numba_attn.gpu.ptx_loads import swizzle_row_chunks
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.kv8 import e4m3_nan_bytes, e4m3x4_f16x2, kv8_decoder
from numba_attn.phases.decode.scores import key_mask


@functools.cache
def make_mma_tiles(D: int, WARPS: int, Bc: int, stages: int, Nq: int, causal: bool, L2_PREFETCH: bool, P: int,
                   BF16: bool, KV_FORMAT: int):
    """``decode_mma``'s tiles: a warp's cp.async copies of a Bc-key tile into its ring (``copy_tile``; 8-bit:
    ``copy_tile8`` into the byte ring, ``dequant_tile`` into the 16-bit tile), S = Q·Kᵀ (``tile_scores``), its mask
    (``mask_tile``), per-token scales (``token_scales``, ``v_scales``) and O += P·V (``tile_pv``) by ``ldmatrix``
    and ``mma.sync``."""
    PAGED = P > 0
    _, visible = key_mask(causal, Nq)  # the keys a row sees (scores.py)
    DK = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps (D itself when a multiple of 16)
    QK_KSTEPS = DK // 16  # k-steps of Q·Kᵀ
    S_NTILES = Bc // 8  # n-tiles of S
    S_NPAIRS = Bc // 16  # n-tile pairs (one ldmatrix.x4 per k-step)
    PV_KSTEPS = Bc // 16  # k-steps of P·V
    DP = DK // 16  # d-tile pairs (one ldmatrix.x4.trans per k-step)
    VEC = D // 8  # 16-byte chunks per row in global memory
    CVEC = DK // 8  # chunks per row copied (past VEC: zero-filled)
    SDW = 4 * swizzle_row_chunks(D)  # words per shared row (padded so the swizzle is a permutation)
    SWM = min(8, SDW // 4) - 1
    CPL = Bc * CVEC // WARP_SIZE  # chunks per lane per tile (K and V each)
    S_REGS = 4 * S_NTILES
    cp16 = cp_async16_flat_l2_256 if L2_PREFETCH else cp_async16_flat
    LOGP = max(P, 1).bit_length() - 1
    TILE = P % Bc == 0  # tiles (aligned to Bc) never cross a page
    mma = mma_bf16 if BF16 else mma_f16
    pack = pack_bf16x2 if BF16 else pack_f16x2
    # 8-bit cache: a byte ring (rows of D bytes = DW8 words) per warp, then a 16-bit tile per warp
    DW8 = D // 4
    C8 = D // 16  # 16-byte chunks of a byte row
    CPL8 = -(-Bc * C8 // WARP_SIZE)  # chunks per lane per tile (K and V each)
    dq4, UNIT = kv8_decoder(KV_FORMAT)
    F16_FP8 = KV_FORMAT == 1 and not BF16  # e4m3 codes straight to f16 pairs (no float32 on the way)

    @device
    def copy_tile8(KB, k, v, j0, brow, lane, hi, table, seq, Hkv, h):
        """This lane's cp.async share of the bytes of keys j0 … j0+Bc-1 (zero past ``hi``)
        into the warp's byte ring at row ``brow`` (V stages·Bc rows later); ``k``/``v`` are
        the (num_blocks·P, Hkv, D/4) word views."""
        pg = table[seq, j0 >> LOGP] if TILE else 0
        for x in range(CPL8):
            idx = lane + x * WARP_SIZE
            if idx < Bc * C8:
                r = idx // C8
                cc = idx - r * C8
                row = j0 + r
                jj = min(row, hi - 1)
                page = pg if TILE else table[seq, jj >> LOGP]
                go = ((page * P + (jj & (P - 1))) * Hkv + h) * DW8 + 4 * cc
                so = (brow + r) * DW8 + 4 * cc
                cp16(KB, so, k, go, row < hi)
                cp16(KB, so + stages * Bc * DW8, v, go, row < hi)

    @device
    def codes16(w):
        """Four 8-bit codes (one word) → two registers of two 16-bit values each, exact (e4m3:
        the values / 256, :data:`E4M3_UNIT` rides on the scales; a NaN code gives f16 NaN)."""
        if F16_FP8:
            a, b = e4m3x4_f16x2(w)
            if e4m3_nan_bytes(w):  # rare: a NaN in the cache propagates
                for i in range(4):
                    if ((w >> uint32(8 * i)) & uint32(0x7F)) == uint32(0x7F):
                        if i < 2:
                            a = (a & uint32(0xFFFF0000 if i == 0 else 0xFFFF)) | uint32(0x7E00 << (16 * i))
                        else:
                            b = (b & uint32(0xFFFF0000 if i == 2 else 0xFFFF)) | uint32(0x7E00 << (16 * (i - 2)))
            return a, b
        x0, x1, x2, x3 = dq4(w)
        return pack(x0, x1), pack(x2, x3)

    @device
    def dequant_tile(KB, KV, brow, srow, lane):
        """The warp's landed byte tile (ring row ``brow``) → its swizzled 16-bit K/V tile at row ``srow``."""
        for x in range(CPL8):
            idx = lane + x * WARP_SIZE
            if idx < Bc * C8:
                r = idx // C8
                cc = idx - r * C8
                for kv in range(2):
                    w0, w1, w2, w3 = ld_shared_v4(KB, brow + kv * stages * Bc + r, 4 * cc)
                    a0, a1 = codes16(w0)
                    a2, a3 = codes16(w1)
                    a4, a5 = codes16(w2)
                    a6, a7 = codes16(w3)
                    sr = srow + kv * Bc + r
                    st_shared_v4(KV, sr, 4 * ((2 * cc) ^ (r & SWM)), a0, a1, a2, a3)
                    st_shared_v4(KV, sr, 4 * ((2 * cc + 1) ^ (r & SWM)), a4, a5, a6, a7)

    @device
    def copy_tile(KV, k, v, j0, brow, lane, g_base, hi, Nk, table, seq, Hkv):
        """This lane's cp.async share of keys j0 … j0+Bc-1 (zero past ``hi``) into the
        warp's K buffer at ring row ``brow`` and its V buffer stages·Bc rows later.
        ``PAGED``: key j is row table[seq, j // P] · P + j % P of the cache (``g_base``:
        the KV head's offset in a row)."""
        if PAGED:
            pg = table[seq, j0 >> LOGP] if TILE else 0  # a page holds the whole tile
        for x in range(CPL):
            idx = lane + x * WARP_SIZE
            r = idx // CVEC
            cc = idx % CVEC
            row = j0 + r
            so = (brow + r) * SDW + 4 * (cc ^ (r & SWM))
            if PAGED:
                jj = min(row, hi - 1)
                page = pg if TILE else table[seq, jj >> LOGP]
                grow = ((page * P + (jj & (P - 1))) * Hkv) * D + g_base
            else:
                grow = g_base + min(row, Nk - 1) * D
            if CVEC > VEC:  # the chunk past the row (odd multiple of 8): zero-filled, reads nothing
                go = grow + 8 * min(cc, VEC - 1)
                ok = row < hi and cc < VEC
            else:
                go = grow + 8 * cc
                ok = row < hi
            cp16(KV, so, k, go, ok)
            cp16(KV, so + stages * Bc * SDW, v, go, ok)

    @device
    def tile_scores(KV, qf, s, kb, k_r, k_c, k_sw):
        """S = Q Kᵀ for the Bc keys of the K tile at ring row ``kb``: this lane's S fragments (raw scores)."""
        for i in range(S_REGS):
            s[i] = float32(0.0)
        for ks in range(QK_KSTEPS):
            kcol = 4 * ((2 * ks + k_c) ^ k_sw)
            for np_ in range(S_NPAIRS):
                b = ldmatrix_x4(KV, kb + 16 * np_ + k_r, kcol)
                n0 = 8 * np_
                s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3] = mma(
                    qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b[0], b[1],
                    s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3])
                s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7] = mma(
                    qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b[2], b[3],
                    s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7])

    @device
    def mask_tile(s, j0, t, lim_lo, lim_hi):
        """Keys past a row's split or sequence and (causal) after its position get NEG_BIG (``visible``,
        scores.py); a tile wholly visible is left as it is."""
        if j0 + Bc > min(lim_lo, lim_hi) or causal:
            for nt in range(S_NTILES):
                for e in range(4):
                    col = j0 + nt * 8 + 2 * t + (e % 2)
                    lim = lim_lo if e < 2 else lim_hi
                    if not visible(col, lim):
                        s[4 * nt + e] = NEG_BIG

    @device
    def token_scales(s, vsc, cache, seq, h, j0, hi, t):
        """Per-token scales (8-bit paged cache): each key's K scale on its column of S, its V scale into ``vsc``.
        ``cache``: (k, v, table, k_sc, v_sc)."""
        _, _, table, k_sc, v_sc = cache
        for nt in range(S_NTILES):
            for e in range(2):
                jj = min(j0 + nt * 8 + 2 * t + e, hi - 1)
                crow = table[seq, jj >> LOGP] * P + (jj & (P - 1))
                kscl = k_sc[crow, h] * UNIT
                vsc[2 * nt + e] = v_sc[crow, h] * UNIT
                s[4 * nt + e] *= kscl
                s[4 * nt + e + 2] *= kscl

    @device
    def v_scales(s, vsc):
        """Each key's V scale ``vsc`` on its column of P (the S fragments ``s``)."""
        for nt in range(S_NTILES):
            for e in range(2):
                s[4 * nt + e] *= vsc[2 * nt + e]
                s[4 * nt + e + 2] *= vsc[2 * nt + e]

    @device
    def tile_pv(KV, s, acc, vb, v_r, v_c, v_sw):
        """O += P V: P packed from the S fragments (the A operand), V by ``ldmatrix.trans`` from the tile at ring
        row ``vb``."""
        for kk in range(PV_KSTEPS):
            p0 = 8 * kk
            a0 = pack(s[p0], s[p0 + 1])
            a1 = pack(s[p0 + 2], s[p0 + 3])
            a2 = pack(s[p0 + 4], s[p0 + 5])
            a3 = pack(s[p0 + 6], s[p0 + 7])
            vrow = vb + 16 * kk + v_r
            for dp in range(DP):
                b = ldmatrix_x4_trans(KV, vrow, 4 * ((2 * dp + v_c) ^ v_sw))
                d0 = 8 * dp
                acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3] = mma(
                    a0, a1, a2, a3, b[0], b[1], acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3])
                acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7] = mma(
                    a0, a1, a2, a3, b[2], b[3], acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7])

    return copy_tile8, dequant_tile, copy_tile, tile_scores, token_scales, mask_tile, v_scales, tile_pv
