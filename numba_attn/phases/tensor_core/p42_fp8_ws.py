"""Phase 42 — ``fp8_ws``: fp8_wgmma's tile with a producer warpgroup filling a TMA ring.

Change against ``fp8_wgmma``: the K codes and the transposed V codes reach the ring by TMA (one box each a tile,
or several swizzled boxes of Vᵀ past 128 keys), issued by thread 0 of a producer warpgroup that waits only on the
ring's "empty" barriers and gives its registers to the consumers (``setmaxnreg``); the consumers wait on the
"full" barriers, with no block barrier in the loop. Two consumers take 192-key tiles at D128 (232 registers
each); three take 128-key tiles up to D64 (152). The tile (:func:`.fp8.fp8_tile`) and the quantization
(:class:`.p38_fp8_wgmma.Quantized`) are the parent's.

Prediction: on the warp-specialized ring ~1.3-1.5× the parent's attention kernel at B1 H32 N8192 D128, ~1.0-1.2×
cuDNN fp16 with the quantization (0.15 ms) included.

Verdict: confirmed. 1.597 ms at B1 H32 N8192 D128 fp16, 1.03× cuDNN fp16 and 1.44× the parent; causal 0.963 ms,
0.96× (H200). D64 (B4 N2048): three consumers 0.399 ms, 0.73×. The warp index made uniform: 1.551 ms against
1.687 ms; tiles of 128, 192 and 256 keys: 1.627, 1.531 and 1.518 ms (256: 40 bytes spilled): the defaults since.
[results/fp8-nvidia-h200.jsonl, rows of fp8_ws_wg3, fp8_ws_uniform, fp8_ws_bc192, fp8_ws_bc256]
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32, uint64

from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.mbarrier import mbarrier_arrive_expect_tx, mbarrier_wait
from numba_attn.gpu.ptx_loads import dynamic_tile, smem_reason
from numba_attn.gpu.tma import tma_load_3d
from numba_attn.gpu.warp import FULL_MASK, shfl_sync
from numba_attn.gpu.warpspec import check_register_split, entry_registers, setmaxnreg_dec, setmaxnreg_inc
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fp8 import fp8_ring_bytes, fp8_tile, qk_depth, vt_swizzle
from numba_attn.phases.tensor_core.fragments import q_start
from numba_attn.phases.tensor_core.mask import key_ends
from numba_attn.phases.tensor_core.p38_fp8_wgmma import GivenCodes, Quantized, codes_launch, quantized_launch
from numba_attn.phases.tensor_core.pipeline import ALIGN_BYTES, ring_barriers, ring_functions, ring_padding
from numba_attn.phases.tensor_core.producer import kv_tensor_map
from numba_attn.phases.tensor_core.quantize import HEAD_DIMS
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.variants.stages import PLAIN, stages_of

TILES = (64, 128, 192, 256)  # Bc: Vᵀ rows of Bc bytes, in blocks of 64/128 (every stage 1024-byte aligned)
FP8_PRODUCER_REGS = 56  # registers a producer thread keeps (it issues the TMA boxes of a tile)
FP8_PRODUCER_REGS_UNIFORM = 40  # the same with the warp index known warp-uniform (``uniform``)


def fp8_ws_smem_bytes(D, Bc, stages):
    """The ring, its alignment pad and its 2·stages mbarriers."""
    return fp8_ring_bytes(D, Bc, stages) + ALIGN_BYTES + 16 * stages


@functools.cache
def fp8_ws_loop(D: int, Bc: int, STAGES: int, WG: int, causal: bool, stage=PLAIN):
    """The consumers' tile loop ``loop(n_tiles, regs, stats, KV, bars, walk, wg_end, kinf, kmul, kvh, pos, mods,
    lane, first) -> stats`` (``regs = (s, qf, pf, acc)``): per tile, wait until it has landed, the tile with each
    product waited for (:func:`.fp8.fp8_tile`; skipped where this warpgroup's rows see none of its keys), release
    its stage."""
    TILEK, TILEV = Bc * qk_depth(D), D * Bc
    VBASE = STAGES * TILEK
    tile_at, kind_at = key_tiles(Bc, stage)[1:]
    wait_full, release = ring_barriers(STAGES, 4 * WG)[1:]
    advance = ring_functions(STAGES)[0]
    tile = fp8_tile(D, Bc, causal, True, stage)

    @device
    def loop(n_tiles, regs, stats, KV, bars, walk, wg_end, kinf, kmul, kvh, pos, mods, lane, first):
        s, qf, pf, acc = regs
        ring = (0, 0)
        for it in range(n_tiles):
            wait_full(bars, ring)  # tile it has landed
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < wg_end:
                stats = tile(s, qf, pf, acc, stats, KV, ring[0] * TILEK, VBASE + ring[0] * TILEV, j0,
                             kind_at(walk, kt), kinf, kmul, kvh, pos, mods)
            release(bars, ring[0], lane)  # this warp is done with the stage (O += P V waited for)
            ring = advance(ring)
        return stats

    return loop


fp8_ws_loop.kernel_name = "fp8_ws"


@device
def head_scales(qs, ks, vs, kflag, bh, kvh, qb, sl2):
    """The scales of one head (:class:`.p38_fp8_wgmma.Quantized`) as the consumer loop takes them: ``(sl2q,
    lscale, kinf)``, the scores' log2 factor in code units, the row sums' factor into O's units and whether the
    KV head holds an infinite K value (block-uniform). ``qb``: the warpgroup's 64-row block (unused here)."""
    return sl2 * qs[bh] * ks[kvh], float32(1.0) / vs[kvh], kflag[kvh] != float32(0.0)


@functools.cache
def make_fp8_ws_kernel(D: int, WG: int, Bc: int, STAGES: int, G: int, causal: bool, bf16: bool, stage=PLAIN,
                       uniform: bool = False, mainloop=fp8_ws_loop, scales=head_scales):
    """The kernel ``(q8, kmap, vmap, o, qs, ks, vs, kflag, kmul, sl2, H, Nq, Nk, mods)``: ``fp8_wgmma``'s with K's
    codes and Vᵀ's (tensor maps over the parent's scratch, boxes of one tile) brought by a producer warpgroup
    (warps 0-3) ahead of ``WG`` consumer warpgroups. ``uniform``: the warp index taken from lane 0, known
    warp-uniform to ptxas (the ring stage and the descriptors in the uniform datapath, as
    ``warp_specialized_tc``'s option). ``mainloop``: the consumers' tile loop (:func:`fp8_ws_loop`, or a
    schedule's: ``fp8_pingpong``'s); ``scales``: what the loop gets of the quantization's scales
    (:func:`head_scales`, or ``fp8_block``'s per tile)."""
    Br = 64 * WG
    DQ = qk_depth(D)
    KS, NS, NO, NP = DQ // 32, Bc // 2, D // 2, 4 * (Bc // 32)
    NQ = 4 * KS
    NBARS = 2 * STAGES  # full, then empty, per stage
    TILEK = Bc * DQ  # bytes of one K stage
    TILEV = D * Bc  # bytes of one Vᵀ stage
    VW = vt_swizzle(Bc)  # a Vᵀ stage: Bc / VW boxes of D rows × VW bytes
    VBASE = STAGES * TILEK  # the Vᵀ stages follow the K stages
    KVR = fp8_ring_bytes(D, Bc, STAGES) // 16
    count, tile_at = key_tiles(Bc, stage)[:2]
    init_barriers = ring_barriers(STAGES, 4 * WG)[0]  # "empty": one arrival per consumer warp
    advance = ring_functions(STAGES)[0]
    consume = mainloop(D, Bc, STAGES, WG, causal, stage)
    ends = key_ends(Br, 64, causal)
    start = q_start(KS, NO, False, DQ // 4)
    store = store_fragments(D // 8, "bf16" if bf16 else "f16")
    give = WG >= 2  # move registers to the consumers (one consumer: no need)
    # WG=2: 56 / 224 with a per-lane warp index (at 40 / 232 ptxas spilled two values across setmaxnreg and
    # reloaded them in the loop, causal D128, offline sm_90a); with the uniform warp index 40 / 232 spills nothing
    # at Bc=128 (56 / 224: 24 bytes causal) and 8 bytes at Bc=192
    PRODUCER_REGS = FP8_PRODUCER_REGS_UNIFORM if uniform else FP8_PRODUCER_REGS
    CONSUMER_REGS = min(240, (entry_registers(128 * (WG + 1)) * (WG + 1) - PRODUCER_REGS) // WG // 8 * 8)
    check_register_split(128 * (WG + 1), PRODUCER_REGS, CONSUMER_REGS, WG)

    def body(q8, kmap, vmap, o, qs, ks, vs, kflag, kmul, sl2, H, Nq, Nk, mods):
        KV = dynamic_tile(ring_padding(dynamic_tile(0, 1, 4)), KVR, 4)
        tid = cuda.threadIdx.x
        warp = tid // 32
        if uniform:  # lane 0's warp index, the same as every lane's: known warp-uniform to ptxas
            warp = shfl_sync(FULL_MASK, warp, 0)
        lane = cuda.laneid
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        bh = b * H + h
        kvh = b * (H // G) + h // G
        blk0 = cuda.blockIdx.x * Br
        off = Nk - Nq
        bars = cuda.shared.array(NBARS, uint64)
        init_barriers(bars, kmap, vmap, tid)
        walk = (mods, b, h, cuda.blockIdx.x, Nq)
        n_tiles = count(walk, (ends(blk0, blk0, Nq, Nk, off)[0] + Bc - 1) // Bc)  # the block's key tiles

        if warp < 4:  # the producer: thread 0 brings every tile, waiting only for its stage to be released
            if give:
                setmaxnreg_dec(PRODUCER_REGS)
            if tid == 0:
                ring = (0, 0)
                for it in range(n_tiles):
                    if it >= STAGES:  # the stage's previous tile (the phase before) is released
                        mbarrier_wait(bars, STAGES + ring[0], ring[1] ^ 1)
                    mbarrier_arrive_expect_tx(bars, ring[0], TILEK + TILEV)
                    kt = tile_at(walk, it)
                    tma_load_3d(KV, ring[0] * TILEK, kmap, kvh, kt * Bc, 0, bars, ring[0])  # K: Bc rows of codes
                    for c in range(Bc // VW):  # Vᵀ: D rows of VW bytes a box
                        tma_load_3d(KV, VBASE + ring[0] * TILEV + c * D * VW, vmap, kvh, 0, (kt * Bc + c * VW) // 4,
                                    bars, ring[0])
                    ring = advance(ring)
            return

        if give:
            setmaxnreg_inc(CONSUMER_REGS)
        warp -= 4  # consumer warps 0 .. 4·WG-1
        g = lane // 4
        t = lane % 4
        row0 = blk0 + 16 * warp
        wg_end = ends(blk0, blk0 + 64 * (warp // 4), Nq, Nk, off)[1]  # the keys this warpgroup sees
        sl2q, lscale, kinf = scales(qs, ks, vs, kflag, bh, kvh, cuda.blockIdx.x * WG + warp // 4, sl2)
        qf = cuda.local.array(NQ, uint32)
        r_lo = row0 + g
        acc = cuda.local.array(NO, float32)
        stats = start(qf, acc, q8, bh, r_lo, Nq, t)  # Q's A fragments (codes), O = 0, (m, l) of rows g, g+8
        s = cuda.local.array(NS, float32)
        pf = cuda.local.array(NP, uint32)
        pos = (row0, g, t, Nq, Nk, off, sl2q, b, h)
        stats = consume(n_tiles, (s, qf, pf, acc), stats, KV, bars, walk, wg_end, kinf, kmul, kvh, pos, mods, lane,
                        warp < 4)
        store(o, bh, r_lo, acc, 0, stats[2] * lscale, stats[3] * lscale, Nq, t)

    body.__name__ = body.__qualname__ = mainloop.kernel_name
    return kernel(body, launch_bounds=(128 * (WG + 1), 1))


def resolve_fp8_ws(problem, warpgroups, Bc=0, stages=3, **more):
    """warpgroups=0: three consumer warpgroups up to D=64 (1.15× two at B4 H32 N2048 D64 fp16, H200), two above;
    Bc=0: 192-key tiles above D=64 (1.03-1.06× 128 at B1 H32 N8192 D128, H200), 128 up to it."""
    D = problem.head_dim
    return {"warpgroups": warpgroups or (3 if D <= 64 else 2), "Bc": Bc or (192 if D > 64 else 128)}


def supports_fp8_ws(problem, warpgroups, Bc, stages, uniform=False):
    D = problem.head_dim
    if getattr(problem, "e4m3_inputs", False) and qk_depth(D) != D:
        return (f"head_dim {D} with e4m3 inputs: the TMA ring reads K rows of at least 32 bytes (16 is padded to 32 "
                "by the quantization, which e4m3 inputs skip)")
    if D not in HEAD_DIMS:
        return (f"head_dim {D}: the TMA ring takes K rows of 32, 64 or 128 bytes of e4m3 codes (head_dim 16 "
                "padded to 32, 32, 64, 128: one swizzled box a tile)")
    if Bc not in TILES:
        return f"Bc={Bc}: the transposed V tile has rows of Bc bytes: 64, 128, 192 or 256"
    if warpgroups < 0:
        return f"warpgroups={warpgroups}: at least one consumer warpgroup (0: by head_dim)"
    if warpgroups > 3 or (warpgroups == 3 and D > 64):
        return (f"warpgroups={warpgroups} at head_dim {D}: at most 2 consumer warpgroups above D=64 and 3 up to it "
                "(three leave 152 registers a thread: 64 score and 32 output accumulators fit, 64 and 64 do not)")
    if warpgroups == 3 and Bc > 128:
        return (f"Bc={Bc} with 3 consumer warpgroups: their 152 registers a thread hold at most 128-key score "
                "tiles (ptxas cannot fit the 256-key product; use warpgroups=2)")
    if stages < 2:
        return "stages must be at least 2"
    return smem_reason(fp8_ws_smem_bytes(D, Bc, stages))


def build_fp8_ws(problem, warpgroups, Bc, stages, uniform=False, mainloop=fp8_ws_loop, scales=head_scales,
                 quantized=Quantized):
    """The parent's quantization into its scratch, the K and Vᵀ tensor maps over that scratch (made once: its
    addresses do not change), then the kernel. e4m3 inputs (:mod:`numba_attn.spec.fp8_inputs`): no quantization;
    V's codes rearranged into the scratch (:class:`.p38_fp8_wgmma.GivenCodes`), K's tensor map over the caller's
    codes (cached by their address)."""
    D = problem.head_dim
    kern = make_fp8_ws_kernel(D, warpgroups, Bc, stages, problem.group, problem.causal,
                              problem.dtype == "bfloat16", stages_of(getattr(problem, "variant", None)),
                              bool(uniform), mainloop, scales)
    DQ = qk_depth(D)
    VW = vt_swizzle(Bc)
    if getattr(problem, "e4m3_inputs", False):
        gc = GivenCodes(problem, Bc)
        vmap = kv_tensor_map(gc.vt8, (1, D, VW // 4), VW)
        return codes_launch(problem, kern, gc, lambda kw: kv_tensor_map(kw, (1, Bc, DQ // 4), DQ), vmap,
                            64 * warpgroups, 128 * (warpgroups + 1), fp8_ws_smem_bytes(D, Bc, stages))
    qz = quantized(problem, Bc)
    kmap = kv_tensor_map(qz.k8, (1, Bc, DQ // 4), DQ)  # a tile's K rows, swizzled by their DQ bytes
    vmap = kv_tensor_map(qz.vt8, (1, D, VW // 4), VW)  # its Vᵀ rows, VW bytes a box
    return quantized_launch(problem, kern, qz, (kmap, vmap), 64 * warpgroups, 128 * (warpgroups + 1),
                            fp8_ws_smem_bytes(D, Bc, stages))


# what a consumer-loop phase on this ring registers as fp8_ws's: the same kernel, parameters and contract
FP8_RING_OPTIONS = dict(
    requires_cc="sm_90a",
    space={"warpgroups": [2, 3], "Bc": list(TILES), "stages": [2, 3, 4], "uniform": [False, True]},
    dtypes=("float16", "bfloat16"),
    head_dims=HEAD_DIMS,
    precision="e4m3",
    sim_params={"warpgroups": 1, "Bc": 64, "stages": 2},
    supports=supports_fp8_ws,
    resolve=resolve_fp8_ws,
    variants=True,
    e4m3_inputs=True,
)


@register_phase(
    name="fp8_ws", order=42, title="FP8 (e4m3) wgmma with a producer warpgroup and a TMA ring",
    parent="fp8_wgmma",
    description="""
        fp8_wgmma's tile (S = Q·Kᵀ and O += P·V in e4m3, k32 steps, per-head scales, V transposed and
        permuted by the same quantization) on warp_specialized_tc's ring: a producer warpgroup loads each
        tile's K codes and Vᵀ codes by TMA (several swizzled Vᵀ boxes past 128 keys) and gives its registers
        to two consumer warpgroups of 192-key tiles (three of 128-key tiles up to D64), which wait on mbarriers
        instead of block barriers.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024), FP8 forward on the warp-specialized TMA pipeline",
    planned_speedup=300.0,  # fp8_wgmma's 225 and a predicted ~1.35x
    **{**FP8_RING_OPTIONS,
       "space": {"warpgroups": [1, 2, 3], "Bc": list(TILES), "stages": [2, 3, 4], "uniform": [False, True]}},
)
def fp8_ws(problem, warpgroups=0, Bc=0, stages=3, uniform=True):
    """Quantize (per head, the parent's kernels), then the warp-specialized FP8 kernel; ``uniform``: the warp index
    known warp-uniform (1.03-1.09× without it at N8192 D128, equal at D64, H200: on by default)."""
    return build_fp8_ws(problem, warpgroups, Bc, stages, uniform)
