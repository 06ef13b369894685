"""Phase 38 — ``fp8_wgmma``: both products of tc_wgmma in FP8 (e4m3), k32 steps.

Change against ``tc_wgmma``: Q, K and V are quantized per head inside the launch (:mod:`.quantize`: amax,
then e4m3 codes; V written transposed with its keys permuted), then S = Q·Kᵀ and O += P·V run as 8-bit wgmma
m64nNk32 with P converted to e4m3 in registers; the scales fold into the softmax and the row sums. Precision
``e4m3``.

Prediction: ~1.4-1.6x tc_wgmma, ~1.0-1.2x SDPA fp16 at B1 H32 N8192 D128 non-causal.

Verdict: refuted on time, 2.245 ms at B1 H32 N8192 D128 fp16 (0.81x SDPA fp16, H200); error 5e-2 as predicted.
[results/fp8-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

import numpy as np


from numba import cuda, float32, uint32  # noqa: E402
from numba_attn.gpu.device_functions import LOG2E, fragment_rescale, fragment_softmax
from numba_attn.gpu.intrinsics import (cp_async16_flat, cp_async_wait, pack_e4m3x4)
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, smem_reason
from numba_attn.gpu.wgmma import kmajor_params, make_wgmma_rs, shared_address
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fragments import q_start
from numba_attn.phases.tensor_core.mask import key_ends, mask_fragments, variant_fragments
from numba_attn.phases.tensor_core.mma_sync import u32_views
from numba_attn.phases.tensor_core.pipeline import ALIGN_BYTES, cp_async_ring
from numba_attn.phases.tensor_core.quantize import (HEAD_DIMS, NCH, P_SCALE, QTH, RCH, TILES, VTK, make_amax,
                                                    make_quant_rows, make_quant_vt)
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.stages import LN2, PLAIN, stages_of


def qk_depth(D):
    """The bytes of a Q/K row of codes: D, at least 32 (the smallest swizzle; D=16 padded with zero codes)."""
    return max(D, 32)


def fp8_smem_bytes(D, Bc, stages):
    """The ring (K tiles of Bc×qk_depth(D) bytes, V^T tiles of D×Bc bytes, ``stages`` each) and the
    alignment pad."""
    return stages * Bc * (qk_depth(D) + D) + ALIGN_BYTES


@functools.cache
def make_fp8_kernel(D: int, WG: int, Bc: int, STAGES: int, G: int, causal: bool, bf16: bool, permute: bool = True,
                    stage=PLAIN):
    """The FP8 wgmma kernel ``(q8, k8, vt8, o, qs, ks, vs, kflag, kmul, sl2, H, Nq, Nk, mods)``: q8 (B·H, Nq, D/4)
    and k8 (B·Hkv, NkP, D/4) uint32 codes, vt8 (B·Hkv, D, NkP/4) the transposed permuted V codes, o the
    uint32 view of the output, qs/ks/vs the heads' scales; a KV head with ``kflag`` set (an infinite K
    value) has its scores multiplied by ``kmul`` (inf for the keys holding one: ±inf scores).
    ``permute=False`` packs P in the plain key order
    (wrong against the permuted V: the tests' negative case). ``stage``, ``mods``: a variant's (as tc_wgmma)."""
    W = 4 * WG
    NTH = 32 * W
    Br = 64 * WG
    DQ = qk_depth(D)  # bytes of a Q/K row of codes
    KS = DQ // 32  # k32 steps of Q·Kᵀ
    KK = Bc // 32  # k32 steps of P·V
    NT = Bc // 8
    mask = mask_fragments(NT, Bc, causal)  # keys past Nk and (causal) above the diagonal
    vary = variant_fragments(NT, stage)  # a variant's score and mask functions
    count, tile_at, kind_at = key_tiles(Bc, stage)  # the key tiles visited (a variant: its block mask's)
    DT = D // 8
    NQ = 4 * KS
    NS = Bc // 2
    NO = D // 2
    NP = 4 * KK
    TILEK = Bc * DQ  # bytes of one K stage
    TILEV = D * Bc  # bytes of one V^T stage
    VBASE = STAGES * TILEK  # the V^T stages follow the K stages
    KVR = STAGES * (TILEK + TILEV) // 16
    CHK = DQ // 16  # 16-byte chunks of a K row
    CHV = Bc // 16  # of a V^T row
    NCK = Bc * CHK  # chunks of a K tile
    NCV = D * CHV  # of a V^T tile
    softmax = fragment_softmax(NT)
    rescale = fragment_rescale(DT)
    ends = key_ends(Br, 64, causal)
    start = q_start(KS, NO, False, DQ // 4)
    store = store_fragments(DT, "bf16" if bf16 else "f16")
    qk_off, qk_lbo, qk_sbo = kmajor_params(Bc, KS, DQ)
    pv_off, pv_lbo, pv_sbo = kmajor_params(D, KK, Bc)
    qk = make_wgmma_rs("e4m3", Bc, False, True, qk_off, qk_lbo, qk_sbo, DQ)
    pv = make_wgmma_rs("e4m3", D, False, False, pv_off, pv_lbo, pv_sbo, Bc)
    SWK = DQ // 16 - 1
    SWV = Bc // 16 - 1
    PS = float32(P_SCALE)

    @device
    def copy_v(KV, vt8, nkw, e, tile, buf, kvh):
        """Chunk ``e`` of the V^T tile: head-dim row e // CHV, its keys' 16-byte chunk e mod CHV."""
        rv = e // CHV
        cv = e % CHV
        so = (VBASE + buf * TILEV + rv * Bc + 16 * (cv ^ (((rv * Bc) >> 7) & SWV))) // 4
        go = (kvh * D + rv) * nkw + tile * (Bc // 4) + 4 * cv
        cp_async16_flat(KV, so, vt8, go, True)

    @device
    def copy_tile(tile, buf, to):
        """Thread ``tid``'s cp.async copies of tile ``tile`` (K rows and V^T columns of its keys;
        the key axis is padded to whole tiles) into ring stage ``buf``, 16 bytes each, swizzled;
        ``to = (KV, k8, vt8, tid, kvh)``."""
        KV, k8, vt8, tid, kvh = to
        nkw = vt8.shape[2]  # words of a V^T row (NkP / 4)
        # one loop over both tiles when they have as many chunks (D >= 32: fewer live registers), else two
        for e in range(tid, NCK, NTH):
            r = e // CHK  # K: key row r, chunk c
            c = e % CHK
            so = (buf * TILEK + r * DQ + 16 * (c ^ (((r * DQ) >> 7) & SWK))) // 4
            go = ((kvh * k8.shape[1]) + tile * Bc + r) * (DQ // 4) + 4 * c
            cp_async16_flat(KV, so, k8, go, True)
            if NCV == NCK:
                copy_v(KV, vt8, nkw, e, tile, buf, kvh)
        if NCV != NCK:
            for e in range(tid, NCV, NTH):
                copy_v(KV, vt8, nkw, e, tile, buf, kvh)

    fill, refill = cp_async_ring(STAGES, Bc, copy_tile, stage)

    def body(q8, k8, vt8, o, qs, ks, vs, kflag, kmul, sl2, H, Nq, Nk, mods):
        base = dynamic_tile(0, 1, 4)
        pad = ((ALIGN_BYTES - (shared_address(base) & (ALIGN_BYTES - 1))) & (ALIGN_BYTES - 1)) // 4
        KV = dynamic_tile(pad, KVR, 4)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        bh = b * H + h
        kvh = b * (H // G) + h // G
        blk0 = cuda.blockIdx.x * Br
        wg0 = blk0 + 64 * (warp // 4)
        row0 = blk0 + 16 * warp
        off = Nk - Nq
        sl2q = sl2 * qs[bh] * ks[kvh]  # scores in code units
        lscale = PS / vs[kvh]  # the row sums in the units of O's accumulators
        kinf = kflag[kvh] != float32(0.0)  # block-uniform: only a head with an infinite K value

        qf = cuda.local.array(NQ, uint32)
        r_lo = row0 + g
        acc = cuda.local.array(NO, float32)
        m_lo, m_hi, l_lo, l_hi = start(qf, acc, q8, bh, r_lo, Nq, t)  # Q's A fragments (codes), O = 0
        s = cuda.local.array(NS, float32)
        pf = cuda.local.array(NP, uint32)

        kv_end, wg_end = ends(blk0, wg0, Nq, Nk, off)  # the block's keys, this warpgroup's
        walk = (mods, b, h, cuda.blockIdx.x, Nq)
        n_tiles = count(walk, (kv_end + Bc - 1) // Bc)

        to = (KV, k8, vt8, tid, kvh)  # the tile copies' arguments
        fill(walk, n_tiles, to)  # tiles 0 .. STAGES-2 in flight
        for it in range(n_tiles):
            refill(walk, it, n_tiles, to)  # tile it landed; tile it+STAGES-1 into tile it-1's stage
            st = it % STAGES
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < wg_end:
                qk(s, qf, 0, KV, st * TILEK)
                if kinf:  # keys with infinite values: ±inf scores (kmul inf; 1 elsewhere)
                    for nt in range(NT):
                        for e in range(4):
                            s[4 * nt + e] *= kmul[kvh, j0 + nt * 8 + 2 * t + (e % 2)]
                vary(s, 0, j0, row0 + g, t, Nq, Nk, off, (b, h, kind_at(walk, kt), sl2q * LN2), mods)
                mask(s, 0, j0, row0, row0 + g, t, Nk, off)
                m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2q)
                l_lo = l_lo * corr_lo + rs_lo
                l_hi = l_hi * corr_hi + rs_hi
                for kk in range(KK):  # n-tiles 4kk..4kk+3 → the four A registers of k-step kk
                    i0 = 16 * kk
                    if permute:  # bytes: (nt 4kk, e 0/1; nt 4kk+1, e 0/1) = stored keys 4t..4t+3
                        pf[4 * kk + 0] = pack_e4m3x4(s[i0] * PS, s[i0 + 1] * PS, s[i0 + 4] * PS, s[i0 + 5] * PS)
                        pf[4 * kk + 1] = pack_e4m3x4(s[i0 + 2] * PS, s[i0 + 3] * PS, s[i0 + 6] * PS,
                                                     s[i0 + 7] * PS)
                        pf[4 * kk + 2] = pack_e4m3x4(s[i0 + 8] * PS, s[i0 + 9] * PS, s[i0 + 12] * PS,
                                                     s[i0 + 13] * PS)
                        pf[4 * kk + 3] = pack_e4m3x4(s[i0 + 10] * PS, s[i0 + 11] * PS, s[i0 + 14] * PS,
                                                     s[i0 + 15] * PS)
                    else:  # the accumulator values in their own order (wrong against the permuted V)
                        pf[4 * kk + 0] = pack_e4m3x4(s[i0] * PS, s[i0 + 1] * PS, s[i0 + 2] * PS, s[i0 + 3] * PS)
                        pf[4 * kk + 1] = pack_e4m3x4(s[i0 + 4] * PS, s[i0 + 5] * PS, s[i0 + 6] * PS,
                                                     s[i0 + 7] * PS)
                        pf[4 * kk + 2] = pack_e4m3x4(s[i0 + 8] * PS, s[i0 + 9] * PS, s[i0 + 10] * PS,
                                                     s[i0 + 11] * PS)
                        pf[4 * kk + 3] = pack_e4m3x4(s[i0 + 12] * PS, s[i0 + 13] * PS, s[i0 + 14] * PS,
                                                     s[i0 + 15] * PS)
                rescale(acc, 0, corr_lo, corr_hi)
                pv(acc, pf, 0, KV, VBASE + st * TILEV)
        cp_async_wait(0)
        store(o, bh, r_lo, acc, 0, l_lo * lscale, l_hi * lscale, Nq, t)

    body.__name__ = body.__qualname__ = "fp8_wgmma"
    return kernel(body, launch_bounds=(NTH,)) if NTH > 256 else kernel(body)


# -- host side ------------------------------------------------------------------------------

def resolve_fp8(problem, warpgroups, Bc, stages):
    """warpgroups=0: 3 at D=128 (as tc_wgmma: 168 registers with Bc=64, no spills, sm_90a offline
    compile), 2 otherwise."""
    if warpgroups < 0:
        raise ValueError("warpgroups (per block) must be at least 1 (0: by head_dim)")
    return {"warpgroups": warpgroups or (3 if problem.head_dim == 128 else 2), "Bc": Bc, "stages": stages}


def supports_fp8(problem, warpgroups, Bc, stages):
    D = problem.head_dim
    if D not in HEAD_DIMS:
        return (f"head_dim {D}: the FP8 kernel takes rows of 32, 64 or 128 bytes (head_dim 16 padded to 32, "
                "32, 64, 128: one swizzled column block of e4m3 codes)")
    if Bc not in TILES:
        return f"Bc={Bc}: the transposed V tile has rows of Bc bytes: 32, 64 or 128"
    if warpgroups > 3:
        return f"warpgroups={warpgroups}: at most 3 (168 registers a thread at 384 threads)"
    if warpgroups == 3 and D == 128 and Bc == 128:
        return ("warpgroups=3 with Bc=128 at head_dim 128: 64 score and 64 output accumulators do not fit the "
                "168 registers of a 384-thread block (120-148 bytes of spills, wgmma serialized; sm_90a offline "
                "compile); use Bc=64 or warpgroups <= 2")
    if stages < 2:
        return "stages must be at least 2"
    return smem_reason(fp8_smem_bytes(D, Bc, stages))


def build_fp8(problem, warpgroups, Bc, stages, permute=True):
    """The :class:`Launch`: the quantization kernels (amax, codes of Q and K, transposed codes of V)
    into scratch allocated here, then the attention kernel."""
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    Nq, Nk = problem.q_len, problem.kv_len
    bf16 = problem.dtype == "bfloat16"
    NkP = (Nk + Bc - 1) // Bc * Bc
    variant = getattr(problem, "variant", None)
    kern = make_fp8_kernel(D, warpgroups, Bc, stages, problem.group, problem.causal, bf16, permute,
                           stages_of(variant))
    amax = make_amax(D // 2)
    qrows = make_quant_rows(D // 2, False)
    krows = make_quant_rows(D // 2, True)
    qvt = make_quant_vt(D)
    BH, BHkv = B * H, B * Hkv
    DQ = qk_depth(D)
    q8 = cuda.to_device(np.zeros((BH, Nq, DQ // 4), np.uint32))  # D=16: the codes of columns 16..31 stay zero
    k8 = cuda.to_device(np.zeros((BHkv, NkP, DQ // 4), np.uint32))  # rows past Nk stay zero
    vt8 = cuda.to_device(np.zeros((BHkv, D, NkP // 4), np.uint32))
    part = cuda.to_device(np.zeros((BH + 2 * BHkv, NCH), np.float32))  # the heads of Q, then K, then V
    bad = cuda.to_device(np.zeros((BH + 2 * BHkv, NCH), np.float32))
    cuts = ((0, BH), (BH, BH + BHkv), (BH + BHkv, BH + 2 * BHkv))
    parts = [part[a:b] for a, b in cuts]
    bads = [bad[a:b] for a, b in cuts]
    scales = [cuda.to_device(np.ones(n, np.float32)) for n in (BH, BHkv, BHkv)]
    flags = [cuda.to_device(np.zeros(n, np.float32)) for n in (BH, BHkv)]
    kmul = cuda.to_device(np.ones((BHkv, NkP), np.float32))  # rows past Nk stay 1 (their scores are masked)
    sl2 = float32(problem.sm_scale * LOG2E)
    Br = 64 * warpgroups
    grid = ((Nq + Br - 1) // Br, H, B)
    nbytes = fp8_smem_bytes(D, Bc, stages)
    nthreads = 128 * warpgroups
    opted = []
    kernel_mods = KernelMods(problem, Br, Bc)  # a variant's arrays and block mask at (Br, Bc); plain: ()

    def run(q, k, v, o, stream=0, mods=None):
        qw, kw, vw, ow = u32_views(q, k, v, o)
        amax[(NCH, BH + 2 * BHkv), QTH, stream](qw, kw, vw, part, bad, bf16)
        qrows[(RCH, BH), QTH, stream](qw, q8, parts[0], bads[0], scales[0], flags[0], kmul, bf16)
        krows[(RCH, BHkv), QTH, stream](kw, k8, parts[1], bads[1], scales[1], flags[1], kmul, bf16)
        qvt[((NkP + VTK - 1) // VTK, BHkv), QTH, stream](vw, vt8, parts[2], scales[2], bf16)
        args = (q8, k8, vt8, ow, scales[0], scales[1], scales[2], flags[1], kmul, sl2, H, Nq, Nk,
                kernel_mods(stream=stream) if mods is None else mods)
        if opted:
            kern[grid, nthreads, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, nthreads, stream, nbytes, *args)
            opted.append(True)

    ws = q8.nbytes + k8.nbytes + vt8.nbytes
    return Launch(run, kernels=[kern, amax, qrows, krows, qvt], workspace_bytes=ws,
                  kernel_mods=kernel_mods if variant is not None else None, replayable=variant is None)


@register_phase(
    name="fp8_wgmma", order=38, title="Tensor cores: wgmma in FP8 (e4m3), per-head scales",
    parent="tc_wgmma",
    requires_cc="sm_90a",
    description="""
        tc_wgmma with both products in FP8: Q, K and V quantized per (batch, head) to e4m3
        (scale amax/448) by kernels inside the launch, V written transposed with the keys of each
        32-key block permuted; S = Q·Kᵀ with wgmma m64nBc k32 e4m3 (Q in registers, K K-major in
        shared memory), P converted in registers to e4m3 in the permuted order (no shuffles) and
        O += P·V with V^T as the K-major operand; the scales folded into the softmax exponent and
        the final normalization. Layout it requires: V^T in e4m3, keys padded to whole tiles
        (made by the launch). Precision e4m3: not chosen automatically.
        Prediction: ~1.5x tc_wgmma at D128 (FP8 wgmma twice the f16 rate, softmax unchanged).
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), FP8 forward: e4m3 wgmma, in-register P layout "
            "matched by permuting V; per-head scales",
    planned_speedup=225.0,  # tc_wgmma's 150 and the predicted 1.5x
    space={"warpgroups": [1, 2, 3], "Bc": [64, 128], "stages": [2, 3]},
    dtypes=("float16", "bfloat16"),
    head_dims=HEAD_DIMS,
    precision="e4m3",
    sim_params={"warpgroups": 1, "Bc": 32, "stages": 2},
    supports=supports_fp8,
    resolve=resolve_fp8,
    variants=True,
)
def fp8_wgmma(problem, warpgroups=0, Bc=64, stages=2):
    """Quantize (per head), then the FP8 wgmma kernel."""
    return build_fp8(problem, warpgroups, Bc, stages)
