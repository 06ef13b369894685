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
from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.intrinsics import cp_async16_flat, cp_async_wait
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, smem_reason
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fp8 import fp8_ring_bytes, fp8_tile, qk_depth
from numba_attn.phases.tensor_core.fragments import q_start
from numba_attn.phases.tensor_core.mask import key_ends
from numba_attn.phases.tensor_core.mma_sync import u32_views
from numba_attn.phases.tensor_core.pipeline import ALIGN_BYTES, cp_async_ring, ring_padding
from numba_attn.phases.tensor_core.quantize import (HEAD_DIMS, NCH, QTH, RCH, TILES, VTK, make_amax,
                                                    make_codes_vt, make_quant_rows, make_quant_vt)
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.stages import PLAIN, stages_of


def fp8_smem_bytes(D, Bc, stages):
    """The ring (:func:`.fp8.fp8_ring_bytes`: K tiles of Bc×qk_depth(D) bytes, V^T tiles of D×Bc bytes, ``stages``
    each) and the alignment pad."""
    return fp8_ring_bytes(D, Bc, stages) + ALIGN_BYTES


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
    count, tile_at, kind_at = key_tiles(Bc, stage)  # the key tiles visited (a variant: its block mask's)
    DT = D // 8
    NQ = 4 * KS
    NS = Bc // 2
    NO = D // 2
    NP = 4 * (Bc // 32)
    TILEK = Bc * DQ  # bytes of one K stage
    TILEV = D * Bc  # bytes of one V^T stage
    VBASE = STAGES * TILEK  # the V^T stages follow the K stages
    KVR = fp8_ring_bytes(D, Bc, STAGES) // 16
    CHK = DQ // 16  # 16-byte chunks of a K row
    CHV = Bc // 16  # of a V^T row
    NCK = Bc * CHK  # chunks of a K tile
    NCV = D * CHV  # of a V^T tile
    tile = fp8_tile(D, Bc, causal, permute, stage)  # S, the softmax, P in e4m3, O += P V: one tile
    ends = key_ends(Br, 64, causal)
    start = q_start(KS, NO, False, DQ // 4)
    store = store_fragments(DT, "bf16" if bf16 else "f16")
    SWK = DQ // 16 - 1
    SWV = Bc // 16 - 1

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
        KV = dynamic_tile(ring_padding(dynamic_tile(0, 1, 4)), KVR, 4)
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
        lscale = float32(1.0) / vs[kvh]  # the row sums (P's units) in those of O's accumulators
        kinf = kflag[kvh] != float32(0.0)  # block-uniform: only a head with an infinite K value

        qf = cuda.local.array(NQ, uint32)
        r_lo = row0 + g
        acc = cuda.local.array(NO, float32)
        stats = start(qf, acc, q8, bh, r_lo, Nq, t)  # Q's A fragments (codes), O = 0, (m, l) of rows g, g+8
        s = cuda.local.array(NS, float32)
        pf = cuda.local.array(NP, uint32)

        kv_end, wg_end = ends(blk0, wg0, Nq, Nk, off)  # the block's keys, this warpgroup's
        walk = (mods, b, h, cuda.blockIdx.x, Nq)
        n_tiles = count(walk, (kv_end + Bc - 1) // Bc)
        pos = (row0, g, t, Nq, Nk, off, sl2q, b, h)

        to = (KV, k8, vt8, tid, kvh)  # the tile copies' arguments
        fill(walk, n_tiles, to)  # tiles 0 .. STAGES-2 in flight
        for it in range(n_tiles):
            refill(walk, it, n_tiles, to)  # tile it landed; tile it+STAGES-1 into tile it-1's stage
            st = it % STAGES
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < wg_end:
                stats = tile(s, qf, pf, acc, stats, KV, st * TILEK, VBASE + st * TILEV, j0, kind_at(walk, kt), kinf,
                             kmul, kvh, pos, mods)
        cp_async_wait(0)
        store(o, bh, r_lo, acc, 0, stats[2] * lscale, stats[3] * lscale, Nq, t)

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


def code_buffers(problem, NkP):
    """The e4m3 codes' scratch, zeroed: ``q8`` (B·H, Nq, qk_depth/4) and ``k8`` (B·Hkv, NkP, qk_depth/4) uint32 rows
    (D=16: columns 16..31 stay zero; K rows past Nk stay zero), ``vt8`` (B·Hkv, D, NkP/4) V transposed."""
    BH, BHkv, D = problem.batch * problem.heads, problem.batch * problem.kv_heads, problem.head_dim
    DQ = qk_depth(D)
    return (cuda.to_device(np.zeros((BH, problem.q_len, DQ // 4), np.uint32)),
            cuda.to_device(np.zeros((BHkv, NkP, DQ // 4), np.uint32)),
            cuda.to_device(np.zeros((BHkv, D, NkP // 4), np.uint32)))


class Quantized:
    """The e4m3 codes of one launch's Q, K and V in scratch allocated once (:mod:`.quantize`): ``q8`` (B·H, Nq,
    qk_depth/4) and ``k8`` (B·Hkv, NkP, qk_depth/4) uint32 rows of codes (keys padded to whole tiles of ``Bc``,
    rows past Nk zero), ``vt8`` (B·Hkv, D, NkP/4) V transposed with its keys permuted; ``scales`` of Q, K, V per
    head, ``kflag``/``kmul`` (an infinite K value). ``quantize(qw, kw, vw, stream)`` runs the four kernels on the
    uint32 views of the inputs."""

    def __init__(self, problem, Bc):
        B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
        self.bf16 = problem.dtype == "bfloat16"
        self.Bc = Bc
        NkP = (problem.kv_len + Bc - 1) // Bc * Bc
        self.amax = make_amax(D // 2)
        self.qrows = make_quant_rows(D // 2, False)
        self.krows = make_quant_rows(D // 2, True)
        self.qvt = make_quant_vt(D)
        self.BH, self.BHkv, self.NkP = BH, BHkv, NkP = B * H, B * Hkv, NkP
        self.q8, self.k8, self.vt8 = code_buffers(problem, NkP)
        self.part = cuda.to_device(np.zeros((BH + 2 * BHkv, NCH), np.float32))  # the heads of Q, then K, then V
        self.bad = cuda.to_device(np.zeros((BH + 2 * BHkv, NCH), np.float32))
        cuts = ((0, BH), (BH, BH + BHkv), (BH + BHkv, BH + 2 * BHkv))
        self.parts = [self.part[a:b] for a, b in cuts]
        self.bads = [self.bad[a:b] for a, b in cuts]
        self.scales = [cuda.to_device(np.ones(n, np.float32)) for n in (BH, BHkv, BHkv)]
        self.flags = [cuda.to_device(np.zeros(n, np.float32)) for n in (BH, BHkv)]
        self.kmul = cuda.to_device(np.ones((BHkv, NkP), np.float32))  # rows past Nk stay 1 (masked scores)
        self.kernels = [self.amax, self.qrows, self.krows, self.qvt]
        self.nbytes = self.q8.nbytes + self.k8.nbytes + self.vt8.nbytes

    def quantize(self, qw, kw, vw, stream):
        BH, BHkv, bf16, parts, bads, scales, flags = (self.BH, self.BHkv, self.bf16, self.parts, self.bads,
                                                      self.scales, self.flags)
        self.amax[(NCH, BH + 2 * BHkv), QTH, stream](qw, kw, vw, self.part, self.bad, bf16)
        self.qrows[(RCH, BH), QTH, stream](qw, self.q8, parts[0], bads[0], scales[0], flags[0], self.kmul, bf16)
        self.krows[(RCH, BHkv), QTH, stream](kw, self.k8, parts[1], bads[1], scales[1], flags[1], self.kmul, bf16)
        self.qvt[((self.NkP + VTK - 1) // VTK, BHkv), QTH, stream](vw, self.vt8, parts[2], scales[2], bf16)

    def kernel_args(self):
        """The attention kernel's arguments after the codes: the scales of Q, K, V, kflag, kmul."""
        return self.scales[0], self.scales[1], self.scales[2], self.flags[1], self.kmul


def fp8_launcher(kern, grid, nthreads, nbytes):
    """``go(stream, *args)``: ``kern`` over ``grid`` with ``nthreads`` threads and ``nbytes`` of dynamic shared memory
    (opted in at the first launch)."""
    opted = []

    def go(stream, *args):
        if opted:
            kern[grid, nthreads, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, nthreads, stream, nbytes, *args)
            opted.append(True)

    return go


def quantized_launch(problem, kern, qz, kv, Br, nthreads, nbytes):
    """The :class:`Launch` of an FP8 phase: ``qz`` (:class:`Quantized`) quantizes the call's inputs, then ``kern``
    runs over grid (query blocks of ``Br`` rows, heads, batch) with ``nthreads`` threads and ``nbytes`` of
    dynamic shared memory (opt-in at the first launch), taking the Q codes, ``kv`` (the K and Vᵀ codes, or
    tensor maps over them), the output, the scales and a variant's ``mods``."""
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    variant = getattr(problem, "variant", None)
    sl2 = float32(problem.sm_scale * LOG2E)
    go = fp8_launcher(kern, ((Nq + Br - 1) // Br, H, problem.batch), nthreads, nbytes)
    kernel_mods = KernelMods(problem, Br, qz.Bc)  # a variant's arrays and block mask; plain: ()

    def run(q, k, v, o, stream=0, mods=None):
        qw, kw, vw, ow = u32_views(q, k, v, o)
        qz.quantize(qw, kw, vw, stream)
        go(stream, qz.q8, *kv, ow, *qz.kernel_args(), sl2, H, Nq, Nk,
           kernel_mods(stream=stream) if mods is None else mods)

    return Launch(run, kernels=[kern, *qz.kernels], workspace_bytes=qz.nbytes,
                  kernel_mods=kernel_mods if variant is not None else None, replayable=variant is None)


class GivenCodes:
    """Q, K and V given as e4m3 codes with their scales (:mod:`numba_attn.spec.fp8_inputs`): nothing is
    quantized; V's codes are rearranged into ``vt8`` (:class:`Quantized`'s layout, :func:`.quantize.make_codes_vt`),
    the kernel reads the caller's Q and K codes. e4m3fn has no infinity: ``kflag`` 0, ``kmul`` 1. ``descale``: the
    problem's own scales (``problem.scales()``, flattened per head), used when a call gives none (the runner's)."""

    def __init__(self, problem, Bc):
        BHkv, D = problem.batch * problem.kv_heads, problem.head_dim
        self.descale = tuple(cuda.to_device(np.ascontiguousarray(s, np.float32).reshape(-1))
                             for s in problem.scales())
        self.Bc = Bc
        self.NkP = NkP = (problem.kv_len + Bc - 1) // Bc * Bc
        self.vt8 = cuda.to_device(np.zeros((BHkv, D, NkP // 4), np.uint32))
        self.kflag = cuda.to_device(np.zeros(BHkv, np.float32))
        self.kmul = cuda.to_device(np.ones((BHkv, NkP), np.float32))
        self.transpose = make_codes_vt(D)
        self.grid = ((NkP + VTK - 1) // VTK, BHkv)
        self.kernels = [self.transpose]
        self.nbytes = self.vt8.nbytes + self.kmul.nbytes + sum(d.nbytes for d in self.descale)


def codes_launch(problem, kern, gc, k_map, vmap, Br, nthreads, nbytes):
    """The :class:`Launch` of an FP8 phase on e4m3 inputs: ``run(q, k, v, o, stream=0, mods=None, descale=None)``
    with q, k, v the codes ((B·H, N, D) bytes) and ``descale`` = (q's, k's, v's per-head float32 scales, (B·H,),
    (B·Hkv,), (B·Hkv,) device arrays; None: the problem's, ``gc.descale``): V's codes rearranged (``gc``:
    :class:`GivenCodes`), then ``kern`` on the caller's Q codes and the K tensor map ``k_map(k's uint32 view)``
    (cached by address)."""
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    variant = getattr(problem, "variant", None)
    sl2 = float32(problem.sm_scale * LOG2E)
    go = fp8_launcher(kern, ((Nq + Br - 1) // Br, H, problem.batch), nthreads, nbytes)
    kernel_mods = KernelMods(problem, Br, gc.Bc)

    def run(q, k, v, o, stream=0, mods=None, descale=None):
        descale = gc.descale if descale is None else descale
        qw, kw, vw = (view_as(a, np.uint32) for a in (q, k, v))
        gc.transpose[gc.grid, QTH, stream](vw, gc.vt8)
        go(stream, qw, k_map(kw), vmap, view_as(o, np.uint32), *descale, gc.kflag, gc.kmul, sl2, H, Nq, Nk,
           kernel_mods(stream=stream) if mods is None else mods)

    return Launch(run, kernels=[kern, *gc.kernels], workspace_bytes=gc.nbytes,
                  kernel_mods=kernel_mods if variant is not None else None, replayable=False)


def build_fp8(problem, warpgroups, Bc, stages, permute=True):
    """The quantization kernels (amax, codes of Q and K, transposed codes of V) into scratch allocated here
    (:class:`Quantized`), then the attention kernel reading the codes with cp.async."""
    kern = make_fp8_kernel(problem.head_dim, warpgroups, Bc, stages, problem.group, problem.causal,
                           problem.dtype == "bfloat16", permute, stages_of(getattr(problem, "variant", None)))
    qz = Quantized(problem, Bc)
    return quantized_launch(problem, kern, qz, (qz.k8, qz.vt8), 64 * warpgroups, 128 * warpgroups,
                            fp8_smem_bytes(problem.head_dim, Bc, stages))


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
