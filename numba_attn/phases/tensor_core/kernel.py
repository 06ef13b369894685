"""The wgmma kernel of the Hopper phases, composed from its roles, and its host side.

:func:`make_wgmma_kernel` puts together: the ring (:mod:`.pipeline`), a load strategy (:mod:`.producer`:
"cp_async", "tma", or "ws" with a producer warpgroup), the consumers (:mod:`.consumer`) running a phase's
mainloop (plain, ``tc_wgmma_overlap.overlap_mainloop``, ``pingpong.pingpong_mainloop``), and the work items
(:mod:`.scheduler`: one per block, varlen, persistent). :func:`build_wgmma` is its launch.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint64

from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.intrinsics import rows_head_major
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.ptx_loads import dynamic_tile, launch_dynamic, smem_reason
from numba_attn.gpu.split_k import sm_count
from numba_attn.gpu.warp import FULL_MASK, shfl_sync
from numba_attn.gpu.warpspec import setmaxnreg_dec, setmaxnreg_inc
from numba_attn.phases.registry import Launch
from numba_attn.phases.tensor_core.consumer import consumer, plain_mainloop
from numba_attn.phases.tensor_core.mma_sync import supports_tc, u32_views
from numba_attn.phases.tensor_core.pipeline import (q_barriers, ring_barriers, ring_padding, wgmma_smem_bytes,
                                                    wgmma_tiles)
from numba_attn.phases.tensor_core.producer import (kv_tensor_map, kv_tensor_map_at, q_box, tensor_map_pointer,
                                                    tma_box, tma_smem_reason, ws_consumer_regs, ws_producer,
                                                    ws_producer_regs)
from numba_attn.phases.tensor_core.scheduler import (VarlenLayout, balanced_section, persistent_items, query_block,
                                                     varlen_spans)
from numba_attn.phases.tensor_core.timeline import stamps, trace_width, traced
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.sinks import stages_for, with_lse
from numba_attn.variants.stages import PLAIN, stages_of

__all__ = ["make_wgmma_kernel", "build_wgmma", "resolve_wgmma", "supports_wgmma", "supports_cp_async",
           "supports_tma", "resolve_two_consumers", "two_consumers_reason", "TWO_CONSUMERS", "TWO_CONSUMERS_SIM",
           "WS_SPACE", "wgmma_registration"]

LOAD_NAMES = {"cp_async": "tc_wgmma", "tma": "tma_wgmma", "ws": "warp_specialized_tc"}


def kernel_name(loads, mainloop, persistent, varlen, longest_first=False, balanced=0):
    """The kernel's name: its load strategy's phase, or its mainloop's (``kernel_name``, ``suffix``)."""
    name = getattr(mainloop, "kernel_name", None) or LOAD_NAMES[loads]
    return name + getattr(mainloop, "suffix", "") + ("_persistent" if persistent else "") + (
        "_varlen" if varlen else "") + ("_lpt" if longest_first else "") + (f"_bal{balanced}" if balanced else "")


@functools.cache
def make_wgmma_kernel(tiles, G: int, causal: bool, bf16: bool, mainloop=plain_mainloop, loads: str = "cp_async",
                      varlen: bool = False, persistent: bool = False, uniform: bool = False, stage=PLAIN,
                      longest_first: bool = False, balanced: int = 0, trace: bool = False):
    """The wgmma attention kernel ``(q, k, v, o, sl2, H, Nq, Nk, mods)`` of ``tiles`` (:class:`WgmmaTiles`), ``G``
    query heads per KV head. ``loads``: who brings the K/V tiles; "ws" adds a producer warpgroup (warps 0-3)
    that gives registers back (``setmaxnreg.dec``) and whose thread 0 loads every tile of the block, the
    consumers taking the registers (compiled with the launch bounds of its threads: ptxas needs the entry
    budget to honour setmaxnreg). ``varlen``: q, o (total_q, H, D/2) and k, v (total_k, Hkv, D/2) packed, Nq/Nk
    their cu_seqlens; a block takes sequence ``blockIdx.z``'s rows. ``persistent`` (with "ws"): a block per SM
    running work items one after another, producer and consumers carrying the ring state from one to the next.
    ``uniform``: the warp index broadcast from lane 0, known warp-uniform to ptxas (the descriptors and ring
    counters in the uniform datapath; docs/tensor-core-notes.md, "Uniform warp index"). ``stage``: a variant's
    (:func:`numba_attn.variants.stages.stages_of`; ``mods`` its arrays and block mask, ``()`` for plain attention).
    ``longest_first`` (one item per block): the query blocks counted from the last (:func:`.scheduler.query_block`).
    ``balanced`` (persistent): the items in snaked rounds, sections of that many heads
    (:func:`.scheduler.balanced_items`); 0: every ``gridDim.x``-th item. ``trace`` (with "ws", not varlen): the
    work items' steps stamped into the array last in ``mods`` (:mod:`.timeline`)."""
    ws = loads == "ws"
    if loads not in LOAD_NAMES:
        raise ValueError(f"loads={loads!r}: one of {sorted(LOAD_NAMES)}")
    if varlen and loads != "cp_async":
        raise ValueError("the varlen layout has no TMA ring (loads='cp_async')")
    if tiles.q_smem and not getattr(mainloop, "q_smem", False):
        raise ValueError("q_smem (Q's tiles in shared memory) needs a mainloop that reads Q from there "
                         "(``mainloop.q_smem``)")
    if tiles.split_kv and not (ws and getattr(mainloop, "split_kv", False)):
        raise ValueError("split_kv (K and V on barriers of their own) needs loads='ws' and a mainloop that waits "
                         "and releases them apart (``mainloop.split_kv``)")
    if longest_first and (persistent or varlen):
        raise ValueError("longest_first orders the grid's blocks: not with persistent blocks or the varlen layout")
    if persistent and not (ws and getattr(mainloop, "persistent", mainloop is plain_mainloop)):
        raise ValueError("persistent blocks carry the producer's ring across work items: they need loads='ws' "
                         "and a mainloop that returns the ring state after its last tile (``mainloop.persistent``)")
    if persistent and tiles.q_smem and not tiles.q_tma:
        raise ValueError("persistent blocks with Q in shared memory: the next item's Q store is not synchronized "
                         "with this item's last S (q_tma synchronizes it)")
    if tiles.q_tma and not ws:
        raise ValueError("q_tma: the producer warpgroup brings Q's tiles; it needs loads='ws'")
    if tiles.q_early and not getattr(mainloop, "q_early", False):
        raise ValueError("q_early: Q is released inside the tile loop; it needs a mainloop that does so "
                         "(``mainloop.q_early``)")
    if balanced and not persistent:
        raise ValueError("balanced orders a persistent block's work items: it needs persistent blocks")
    if tiles.o_smem and varlen:
        raise ValueError("o_smem (O staged for bulk copies of whole rows): not with the varlen layout")
    if trace and (not ws or varlen):
        raise ValueError("a traced kernel stamps its producer's and its consumers' steps: it needs loads='ws' "
                         "(not varlen)")
    consume = consumer(tiles, causal, bf16, loads, varlen, mainloop, stage, trace)
    block_start, producer_item, producer_done = stamps(trace, tiles.warpgroups, tiles.Br)[:3]
    produce = ws_producer(tiles, causal, stage)
    ring_rows = tiles.ring_rows
    init_barriers = ring_barriers(tiles.stages, tiles.warps, tiles.split_kv)[0]
    init_q = q_barriers(tiles)[0]
    Q_TMA = tiles.q_tma
    Br = tiles.Br
    n_barriers = tiles.n_barriers
    give_registers = ws and tiles.warpgroups >= 2  # move registers to the consumers (one consumer: no need)
    block_of = query_block(longest_first)
    first_of, following = persistent_items(balanced)
    producer_regs = ws_producer_regs(tiles.warpgroups)
    consumer_regs = ws_consumer_regs(tiles.warpgroups)

    def body(q, k, v, o, sl2, H, Nq, Nk, mods):
        t_block = block_start()  # (trace: the block's first cycle; 0 when not traced)
        if Q_TMA:  # q: (Q's uint32 view, its tensor map)
            qmap = q[1]
            q = q[0]
        else:
            qmap = k  # (never read)
        # the K/V ring: dynamic shared memory from its first 1024-byte boundary
        KV = dynamic_tile(ring_padding(dynamic_tile(0, 1, 4)), ring_rows, 4)  # float32 view, used through addresses
        tid = cuda.threadIdx.x
        warp = tid // 32
        if uniform:  # lane 0's warp index, the same as every lane's: known warp-uniform to ptxas
            warp = shfl_sync(FULL_MASK, warp, 0)
        lane = cuda.laneid  # 32-bit (tid % 32 is 64-bit: three consumers at D=64 spilled its high word)
        g = lane // 4
        t = lane % 4
        # grid (query blocks, heads, batch): no run-time integer division (a 64-bit
        # division is a subroutine call, and any call makes ptxas serialize wgmma)
        h = cuda.blockIdx.y
        b = cuda.blockIdx.z
        bh = b * H + h
        kvh = b * (H // G) + h // G  # G: compile-time
        if varlen:  # sequence b: its lengths, its Q rows as a head-major view (H, Nq, ·)
            q0, Nq, k0, Nk = varlen_spans(Nq, Nk)
            if cuda.blockIdx.x * Br >= Nq:
                return
            q = rows_head_major(q, q0, Nq)
            bh = h
            kvh = k0 * (H // G) + h // G  # the packed ring copy's first row: key k0 of head h // G
        else:
            q0 = 0  # (the store's view of the packed rows: varlen only)
        qt = block_of()  # this block's query block (blockIdx.x, or counted from the last)
        blk0 = qt * Br
        wg0 = blk0 + 64 * (warp // 4)  # first query row of this warpgroup
        row0 = blk0 + 16 * warp  # first query row of this warp
        off = Nk - Nq
        if loads != "cp_async":
            bars = cuda.shared.array(n_barriers, uint64)
            if Q_TMA:
                init_q(bars, qmap, tid)  # (before the ring's: its fence and block barrier cover Q's)
            init_barriers(bars, k, v, tid)
        else:
            bars = KV  # no barriers without the TMA ring (never used)
        first = False  # pingpong: consumer 0
        if ws:
            if warp < 4:  # the producer warpgroup: few registers; thread 0 loads every tile of the block
                if give_registers:
                    setmaxnreg_dec(producer_regs)
                if tid == 0:
                    state = (0, 0)  # the next tile's ring stage and phase (across work items: persistent)
                    if persistent:
                        loaded = 0  # tiles this block has loaded: the ring's stages are in use from the first
                        n_query_blocks = (Nq + Br - 1) // Br  # Br: compile-time, no division call
                        r, qb, bh = first_of(n_query_blocks)
                        while bh < q.shape[0]:  # (B·H, Nq, D/2): every work item of this block
                            qt = n_query_blocks - 1 - qb
                            producer_item(mods, bh, qt, Nq, t_block)
                            state, loaded = produce((KV, k, v, bars, bh // G, Nk, (mods, bh // H, bh % H, qt, Nq)),
                                                    qt * Br, state, loaded, Nq, Nk, off, (qmap, bh, r))
                            producer_done(mods, bh, qt, Nq)
                            r, qb, bh = following(r, qb, bh, n_query_blocks)
                    else:
                        producer_item(mods, bh, qt, Nq, t_block)
                        produce((KV, k, v, bars, kvh, Nk, (mods, b, h, qt, Nq)), blk0, state, 0, Nq, Nk,
                                off, (qmap, bh, 0))
                        producer_done(mods, bh, qt, Nq)
                return
            if give_registers:
                setmaxnreg_inc(consumer_regs)
            warp = warp - 4  # consumer warps 0 .. W-1
            wg0 = blk0 + 64 * (warp // 4)
            row0 = blk0 + 16 * warp
            first = warp < 4  # pingpong: consumer 0

        lane_ids = (tid, lane, g, t, first)
        state = (0, 0)  # tile it's ring stage and the phase parity of its full barrier, carried
        if persistent:  # the block's work items one after another, the ring state carried from one to the next
            n_query_blocks = (Nq + Br - 1) // Br
            r, qb, bh = first_of(n_query_blocks)
            while bh < q.shape[0]:
                qt = n_query_blocks - 1 - qb
                blk0 = qt * Br
                state = consume(q, o, (KV, k, v, bars, bh // G, Nk, (mods, bh // H, bh % H, qt, Nq)),
                                (blk0, blk0 + 64 * (warp // 4), blk0 + 16 * warp, bh, r), state, lane_ids, Nq,
                                off, sl2, q0)
                r, qb, bh = following(r, qb, bh, n_query_blocks)
        else:
            consume(q, o, (KV, k, v, bars, kvh, Nk, (mods, b, h, qt, Nq)), (blk0, wg0, row0, bh, 0), state,
                    lane_ids, Nq, off, sl2, q0)

    body.__name__ = body.__qualname__ = kernel_name(loads, mainloop, persistent, varlen, longest_first, balanced) + (
        "_kv" if tiles.split_kv else "") + ("_qs" if tiles.q_smem else "") + ("_qt" if tiles.q_tma else "") + (
        "_os" if tiles.o_smem else "") + ("_or" if tiles.o_rows else "") + ("_qe" if tiles.q_early else "") + (
        "_traced" if trace else "")
    if ws:
        return kernel(body, launch_bounds=(128 * (tiles.warpgroups + 1), 1))
    # Above 256 threads (3 warpgroups: 65536 / 384 = 170 registers a thread) the block size goes to ptxas
    # as launch bounds, so that it keeps within the registers the block may have: without them, 3 warpgroups
    # at D=128 causal with Bc=64 and 3-4 stages (190 registers) or Bc=128 (233) did not launch on an H200
    # (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, tuning run of results/archive/2026-11-22-tune-scale) although
    # supports() accepted them; varlen at D=128 causal: 195 → 168, no spills. At 256 threads and below a
    # bound only costs registers (D=64: 125 → 144, one block per SM instead of two), so there is none.
    return kernel(body, launch_bounds=(tiles.threads,)) if tiles.threads > 256 else kernel(body)


def build_wgmma(problem, warpgroups, Bc, stages, mainloop=plain_mainloop, loads="cp_async", varlen=False,
                uniform=False, blocks=None, lazy_rescale=False, split_kv=False, q_smem=False, longest_first=False,
                balanced=False, o_smem=False, q_tma=False, o_rows=False, q_early=False):
    """The :class:`Launch` of the wgmma kernel: grid (query blocks, heads, batch), the ring in
    dynamic shared memory (opt-in made at the first launch), and the uint32 views of the last
    few input sets cached (making views costs host time at every launch). ``varlen``: the packed
    layout; ``run(q, k, v, o, stream, layout=None)`` takes the call's (cu_seqlens_q, cu_seqlens_k)
    device arrays as ``layout`` (else the problem's own, :class:`VarlenLayout`) in place of the
    lengths, and the grid covers the longest sequence (``q_len``). ``loads`` "tma"/"ws": K and V are passed as
    tensor maps of their uint32 views (:func:`kv_tensor_map`, cached with the views); "ws": ``warpgroups``
    consumer warpgroups plus the producer warpgroup per block; ``blocks`` (with "ws"; None: not persistent):
    persistent blocks, a grid of ``blocks`` (0: one per SM) each running every ``blocks``-th work item, never more
    blocks than items. ``lazy_rescale``: FlashAttention-4's conditional rescale of O; ``split_kv``: K and V on
    barriers of their own; ``q_smem``: Q's tiles in shared memory (:class:`WgmmaTiles`), ``q_tma``: brought there by
    the producer (Q passed as its view and its tensor map, :func:`.producer.q_box`); ``o_rows``: the epilogue's
    stores through row views (:func:`.epilogue.store_rows`); ``q_early`` (with ``q_tma``): Q released after the
    item's last S = Q·Kᵀ, inside the tile loop (``mainloop.q_early``); ``o_smem``: O staged in
    shared memory and copied out a row a bulk copy (:func:`.epilogue.o_store`; ``o``'s rows 16-byte aligned);
    ``longest_first``: causal,
    the query blocks counted from the last (the most key tiles first; ignored without a causal mask); ``balanced``
    (with ``blocks``): the work items in snaked rounds (:func:`.scheduler.balanced_section` picks the section).
    Built inside :func:`.timeline.tracing`: the kernel traced, the launch's ``timeline`` its array (zeros, one row
    an item, filled by every call)."""
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    D = problem.head_dim
    tma = loads != "cp_async"
    variant = getattr(problem, "variant", None)
    tiles = wgmma_tiles(D, warpgroups, Bc, stages, bool(lazy_rescale), bool(split_kv), bool(q_smem or q_tma),
                        bool(o_smem), bool(q_tma), bool(o_rows), bool(q_early))
    box, swizzle = tma_box(D, Bc)
    qbox = q_box(D)[0]
    sl2 = float32(problem.sm_scale * LOG2E)
    Br = 64 * warpgroups
    grid = ((Nq + Br - 1) // Br, H, problem.batch)
    section = 0
    if blocks is not None:  # persistent: at most one block per work item
        if blocks < 0:
            raise ValueError(f"blocks (persistent blocks) must be at least 1, or 0 for one per SM; got {blocks}")
        n_query_blocks = grid[0]
        grid = (min(blocks or sm_count(), grid[0] * H * problem.batch), 1, 1)
        if balanced:
            section = balanced_section(problem, n_query_blocks, grid[0])
    trace = traced()
    if trace and getattr(problem, "lse", False):
        raise ValueError("a traced kernel's array is last in its mods, where the log-sum-exp array goes: trace "
                         "without return_lse")
    kern = make_wgmma_kernel(tiles, problem.group, problem.causal, problem.dtype == "bfloat16", mainloop, loads,
                             varlen, blocks is not None, uniform,
                             stages_of(variant, listed=False) if varlen  # (no block mask: a sequence's own positions)
                             else stages_for(problem),  # (the variant's stage; with the log-sum-exp store when asked)
                             longest_first=bool(longest_first and problem.causal), balanced=section, trace=trace)
    timeline = cuda.to_device(np.zeros(((Nq + Br - 1) // Br * H * problem.batch, trace_width(warpgroups)),
                                       np.uint64)) if trace else None
    nbytes = wgmma_smem_bytes(D, Bc, stages, 64 * warpgroups if tiles.q_smem else 0, 64 * warpgroups if o_smem else 0)
    own = VarlenLayout(problem) if varlen else None
    nthreads = 128 * (warpgroups + 1 if loads == "ws" else warpgroups)  # ws: the producer warpgroup too
    kernel_mods = KernelMods(problem, None if varlen else Br, Bc)  # a variant's arrays, block mask at (Br, Bc)

    views = {}  # uint32 views of the last few input sets: making views costs host time at every launch
    opted = []  # the >48 KiB opt-in is made once, at the first launch
    kv_geometry = []  # tma: (shape, strides) of K's and V's uint32 views, from the first launch

    def run(q, k, v, o, stream=0, layout=None, mods=None, lse=None):
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            if len(views) >= 8:
                views.clear()
            args = u32_views(q, k, v, o)
            if o_smem:
                check_bulk_rows(args[3])
            if tma:
                if not kv_geometry:
                    kv_geometry.extend((tuple(a.shape), tuple(a.strides)) for a in args[:3])
                q_arg = (args[0], kv_tensor_map(args[0], qbox, swizzle)) if q_tma else args[0]
                args = (q_arg, kv_tensor_map(args[1], box, swizzle), kv_tensor_map(args[2], box, swizzle), args[3])
            hit = views[key] = ((q, k, v, o), args)
        lengths = (layout or own.own()) if varlen else (Nq, Nk)
        mods = with_lse(kernel_mods(stream=stream) if mods is None else mods, lse)  # (lse: the array last)
        if timeline is not None:
            mods = tuple(mods) + (timeline,)
        if opted:
            kern[grid, nthreads, stream, nbytes](*hit[1], sl2, H, *lengths, mods)
        else:
            launch_dynamic(kern, grid, nthreads, stream, nbytes, *hit[1], sl2, H, *lengths, mods)
            opted.append(True)

    def derived(addresses):
        """tma: the device pointers of K's and V's (q_tma: and Q's) tensor maps at this call's addresses (cached by
        address; a replay substitutes them as it does the arrays')."""
        maps = tuple(tensor_map_pointer(kv_tensor_map_at(a, *g, box, swizzle))
                     for a, g in zip(addresses[1:3], kv_geometry[1:]))
        if q_tma:
            maps += (tensor_map_pointer(kv_tensor_map_at(addresses[0], *kv_geometry[0], qbox, swizzle)),)
        return maps

    return Launch(run, kernels=[kern], replayable=variant is None and timeline is None,
                  derived=derived if tma else None, kernel_mods=kernel_mods if variant is not None else None,
                  timeline=timeline)


def check_bulk_rows(o):
    """Raise ValueError unless the (BH, N, ·) output's rows can be bulk copies' targets: contiguous, starting on
    16-byte boundaries (``o_smem``)."""
    s0, s1, s2 = o.strides
    ptr = o.__cuda_array_interface__["data"][0] if hasattr(o, "__cuda_array_interface__") else 0
    if s2 != o.dtype.itemsize or s1 % 16 or s0 % 16 or ptr % 16:
        raise ValueError(f"o: the output's rows must be contiguous and start on 16-byte boundaries for the bulk "
                         f"copies of O (strides {o.strides} bytes, data at {ptr:#x})")


def resolve_wgmma(problem, warpgroups, Bc, stages):
    """warpgroups=0 picks the warpgroups per block: 3 at D=128 (168 registers: one
    384-thread block per SM), 2 otherwise (126 registers at D=64: two 256-thread blocks
    per SM; above D=128 a thread needs more than the 170 registers three warpgroups
    may have); see docs/tensor-core-notes.md for the runs behind the choice. With a variant 2 at D=128 too:
    three warpgroups spill 296/212 bytes with a window's stage (offline sm_90a compile)."""
    if warpgroups < 0:
        raise ValueError("warpgroups (per block) must be at least 1 (0: by head_dim)")
    three = problem.head_dim == 128 and getattr(problem, "variant", None) is None
    return {"warpgroups": warpgroups or (3 if three else 2), "Bc": Bc, "stages": stages}


def supports_wgmma(problem, warpgroups, Bc, stages, min_stages):
    D = problem.head_dim
    reason = supports_tc(problem, Bc, max_d=None)
    if reason:
        return reason
    if Bc > 256 or Bc % 16:
        return f"Bc={Bc}: wgmma N must be a multiple of 16 up to 256"
    if warpgroups > 2 and D > 128:
        return (f"warpgroups={warpgroups} at head_dim {D}: above D=128 a thread needs more registers than "
                f"{warpgroups}·128 threads may have (65536 per SM); use warpgroups ≤ 2")
    if stages < min_stages:
        return f"stages must be at least {min_stages}" + (
            " (tile j+1 resident while tile j is read)" if min_stages > 2 else "")
    return smem_reason(wgmma_smem_bytes(D, Bc, stages))


def supports_cp_async(problem, warpgroups, Bc, stages):
    """``supports`` of the wgmma phases on the cp.async ring (two stages at least)."""
    return supports_wgmma(problem, warpgroups, Bc, stages, min_stages=2)


def supports_tma(problem, warpgroups, Bc, stages, min_stages=2):
    """``supports`` of the wgmma phases on the TMA ring: :func:`supports_wgmma` and the ring's shared memory."""
    return (supports_wgmma(problem, warpgroups, Bc, stages, min_stages=min_stages)
            or tma_smem_reason(problem, Bc, stages))


WGMMA_SPACE = {"warpgroups": [0, 1, 2, 3], "Bc": [32, 64, 128], "stages": [2, 3, 4]}
WS_SPACE = {"warpgroups": [1, 2, 3], "Bc": [64, 128], "stages": [2, 3, 4], "uniform": [False, True]}


def wgmma_registration(supports, resolve=resolve_wgmma, space=None, sim_params=None, variants=True, lse=True,
                       **more):
    """The ``register_phase`` keywords the wgmma phases share (sm_90a, fp16/bf16, any head_dim, one
    warpgroup and 16-key tiles in the simulator, mask_mod/score_mod variants, the log-sum-exp written on request)
    with a phase's own ``supports``, ``resolve``, ``space``."""
    return dict(requires_cc="sm_90a", dtypes=("float16", "bfloat16"), head_dims=None,
                space=space or WGMMA_SPACE, sim_params=sim_params or {"warpgroups": 1, "Bc": 16, "stages": 2},
                supports=supports, resolve=resolve, variants=variants, lse=lse, **more)


TWO_CONSUMERS = 2  # pingpong, ws_overlap: two consumer warpgroups and the producer (384 threads)
TWO_CONSUMERS_SIM = {"warpgroups": TWO_CONSUMERS, "Bc": 16, "stages": 3}


def resolve_two_consumers(problem, warpgroups, Bc, stages, **_):
    """``resolve`` of the phases built on exactly two consumer warpgroups (warpgroups=0: two)."""
    if warpgroups < 0:
        raise ValueError("warpgroups (consumer warpgroups per block) must be 2 (0: automatic)")
    return {"warpgroups": warpgroups or TWO_CONSUMERS, "Bc": Bc, "stages": stages}


def two_consumers_reason(problem, warpgroups, Bc, stages, why, min_stages):
    """Why a phase of exactly two consumer warpgroups (``why``: what needs the two) cannot run
    ``problem`` (None when it can): head_dim up to 128, then the wgmma and TMA ring rules."""
    if warpgroups != TWO_CONSUMERS:
        return f"warpgroups={warpgroups}: {why} exactly {TWO_CONSUMERS} consumer warpgroups"
    if problem.head_dim > 128:
        return (f"head_dim {problem.head_dim}: two consumer warpgroups (384 threads: 168 registers at entry, 232 "
                "after setmaxnreg) are checked free of spills up to D=128 only; use warp_specialized_tc")
    return supports_tma(problem, warpgroups, Bc, stages, min_stages)
