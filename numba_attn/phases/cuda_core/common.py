"""What the CUDA-core prefill phases share.

* the launch: one block per Br query rows of one (batch, head), grid
  ``(ceil(q_len / Br), batch · heads)``; every kernel of the family takes
  ``(q, k, v, o, scale, H, G, Nq, Nk)`` (:func:`row_block_launch`);
* the checks and the parameter resolution of the segmented phases
  (``segmented_out`` … ``double_buffer``: D/SEG threads per query row);
* the register-blocked kernel of ``register_blocked`` (p09), written once with
  the compile-time option of ``causal_skip`` (p10): mask only the tiles that
  cross the diagonal and walk the grid heaviest-first
  (:func:`make_register_blocked`).

Each phase file keeps its lesson (docstring), its ``supports``/``resolve`` and
its registration; the kernels that are the lesson of their phase (p00 … p08,
p12) stay in their phase file.
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32

from numba_attn.gpu.device_functions import (NEG_INF, load_tile, online_softmax_rescale2, online_softmax_step,
                                             visible_keys)
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import (MASKED, STATIC_SMEM_LIMIT, dynamic_tile, fetch4, fetch4_t, launch_dynamic, lds4,
                                      load_tile4_t, put4, put4_t, smem_reason, sts4)
from numba_attn.gpu.warp import FULL_MASK, WARP_SIZE, shfl_xor_sync
from numba_attn.phases.registry import Launch
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.sinks import lse_parts, lse_stages, with_lse
from numba_attn.variants.stages import FULL, LN2, LOG2E, PARTIAL, PLAIN

MAX_THREADS = 1024  # threads per block
REGISTERS_PER_SM = 65536
MAX_REGISTERS = 255  # per thread


def row_block_launch(kern, problem, Br: int, threads: int, smem_bytes: int = 0, scale=None,
                     Bc: int | None = None) -> Launch:
    """The :class:`Launch` of a kernel that takes ``(q, k, v, o, scale, H, G, Nq, Nk, mods)``
    with one block of ``threads`` per ``Br`` query rows of one (batch, head).
    ``smem_bytes`` > 0: that much dynamic shared memory (opting in above 48 KiB);
    ``scale`` defaults to the problem's softmax scale. ``mods``: the variant's arrays and its block
    mask of (Br × ``Bc``) tiles (``()`` without a variant; ``Bc`` None: a kernel without key tiles,
    no block mask). ``run(..., lse=)``: the (B·H, Nq) float32 array a kernel compiled with a log-sum-exp stage
    writes (:func:`~numba_attn.variants.stages.with_lse`)."""
    H, Nq, Nk, G = problem.heads, problem.q_len, problem.kv_len, problem.group
    scale = float32(problem.sm_scale if scale is None else scale)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)
    kernel_mods = KernelMods(problem, Br if Bc else None, Bc)

    if smem_bytes:
        def run(q, k, v, o, stream=0, mods=None, lse=None):
            launch_dynamic(kern, grid, threads, stream, smem_bytes, q, k, v, o, scale, H, G, Nq, Nk,
                           with_lse(kernel_mods(stream=stream) if mods is None else mods, lse))
    else:
        def run(q, k, v, o, stream=0, mods=None, lse=None):
            kern[grid, threads, stream](q, k, v, o, scale, H, G, Nq, Nk,
                                        with_lse(kernel_mods(stream=stream) if mods is None else mods, lse))

    variant = problem.variant is not None
    return Launch(run, kernels=[kern], kernel_mods=kernel_mods if variant else None, replayable=not variant)


def static_kv_reason(problem, Bc: int) -> str | None:
    """Why float32 K and V tiles of Bc rows do not fit static shared memory, or None."""
    smem = 2 * Bc * problem.head_dim * 4
    if smem > STATIC_SMEM_LIMIT:
        return f"K/V tiles need {smem} B of static shared memory (> 48 KiB); lower Bc"
    return None


# -- device functions of the row-per-thread kernels (fused_rowwise … double_buffer, split_k_prefill) --------


@device
def kv_head(bh, H, G):
    """The KV head of (batch, head) ``bh``: G query heads share one (GQA)."""
    return (bh // H) * (H // G) + (bh % H) // G


@device
def batch_head(H):
    """``(bh, b, h)`` of the block: the (batch, head) index of the arrays, the batch, the query head."""
    bh = cuda.blockIdx.y
    return bh, bh // H, bh % H


@device
def start_row(O_seg):
    """Zero the thread's output segment; (m, l) of a row that has seen no key yet."""
    for c in range(O_seg.shape[0]):
        O_seg[c] = float32(0.0)
    return NEG_INF, float32(0.0)


@device
def start_row_q(Q_i, O_i, q, bh, i, scale, row_ok):
    """``Q_i = q[bh, i] · scale`` (zeros where not ``row_ok``) and ``O_i = 0``; (m, l) of a
    row that has seen no key yet."""
    for d in range(O_i.shape[0]):
        Q_i[d] = float32(q[bh, i, d]) * scale if row_ok else float32(0.0)
        O_i[d] = float32(0.0)
    return NEG_INF, float32(0.0)


@device
def load_kv(K_s, V_s, k, v, kvh, j0, Nk, t, n):
    """Key rows ``j0 ..`` of KV head ``kvh`` into the shared tiles ``K_s`` and ``V_s`` (zeros past
    ``Nk``), by thread ``t`` of ``n``."""
    load_tile(K_s, k, kvh, j0, Nk, t, n)
    load_tile(V_s, v, kvh, j0, Nk, t, n)


@functools.cache
def tile_rows(D: int, stage=PLAIN):
    """The inner loop of smem_kv and split_k_prefill: one thread's query row (``Q_i`` in
    registers) against the first ``n`` keys of a K/V tile in shared memory, the online
    softmax folding each score into (m, l) and ``O_i``; returns the new (m, l).
    ``at = (b, h, q_idx, j0, kind)``: where the tile is, for the variant ``stage`` (a key its
    mask hides is skipped; its score function rewrites s)."""
    @device
    def rows(Q_i, K_j, V_j, n, m, l, O_i, at, mods):
        b, h, q_idx, j0, kind = at
        for jj in range(n):
            if kind != FULL and not stage.visible(b, h, q_idx, j0 + jj, mods):
                continue
            s = float32(0.0)
            for d in range(D):
                s += Q_i[d] * K_j[jj, d]
            s = stage.modified(s, b, h, q_idx, j0 + jj, mods)
            m, l, corr, p = online_softmax_step(m, l, s)
            for d in range(D):
                O_i[d] = O_i[d] * corr + p * V_j[jj, d]
        return m, l

    return rows


@functools.cache
def store_row(W: int, stage=PLAIN):
    """The end of a row: ``o[bh, i, c0:c0+W] = O / l``, a whole row (W = D, c0 = 0) or a
    thread's segment (W = SEG); 0 for a row a variant's mask left without keys. A stage that writes the
    log-sum-exp (:func:`~numba_attn.variants.sinks.lse_parts`): the row's first segment stores it from
    (m, l), natural units."""
    LSE, store_lse, _ = lse_parts(stage)

    @device
    def store(o, bh, i, c0, O, m, l, mods):
        inv_l = stage.inverse_l(m, l)
        for c in range(W):
            o[bh, i, c0 + c] = O[c] * inv_l
        if LSE and c0 == 0:
            store_lse(mods, bh, i, m, l)

    return store


# -- the segmented phases (segmented_out … double_buffer) ---------------------------------


def resolve_seg(problem, **params) -> dict:
    """SEG larger than head_dim means one segment (SEG = head_dim)."""
    return {**params, "SEG": min(params["SEG"], problem.head_dim)}


def n_segments(D: int, SEG: int) -> int:
    return D // SEG


def segment_reason(problem, Br: int, SEG: int, loader_warps: int = 0, vec4: bool = False) -> str | None:
    """Why Br·D/SEG compute threads (plus ``loader_warps`` warps) cannot run ``problem``,
    or None. ``vec4``: segments are read with 16-byte accesses."""
    D = problem.head_dim
    if Br % 32:
        return f"Br={Br} must be a multiple of 32 (whole warps per segment)"
    if vec4 and (D % SEG or SEG % 4):
        return f"SEG={SEG} must divide head_dim {D} and be a multiple of 4 (16-byte accesses)"
    if D % SEG:
        return f"SEG={SEG} must divide head_dim {D}"
    if loader_warps:
        if Br * n_segments(D, SEG) + 32 * loader_warps > MAX_THREADS:
            return (f"Br·D/SEG + 32·loader_warps = {Br * n_segments(D, SEG) + 32 * loader_warps} "
                    f"threads per block > {MAX_THREADS}")
    elif Br * n_segments(D, SEG) > MAX_THREADS:
        return f"Br·D/SEG = {Br * n_segments(D, SEG)} threads per block > {MAX_THREADS}"
    return None


def segment_supports(smem_floats, loaders: bool = False, vec4: bool = False):
    """The ``supports`` of a segmented phase whose shared tiles take ``smem_floats(D, Br, Bc)`` floats:
    its threads (:func:`segment_reason`; ``loaders``: at least one loader warp) and its shared memory."""
    def supports(problem, Br, Bc, SEG, loader_warps=0):
        if loaders and loader_warps < 1:
            return f"loader_warps={loader_warps}: at least one loader warp"
        return (segment_reason(problem, Br, SEG, loader_warps, vec4)
                or smem_reason(4 * smem_floats(problem.head_dim, Br, Bc)))

    return supports


def register_cap(D: int, Br: int, SEG: int, loader_warps: int = 0) -> dict:
    """Kernel options so that the block's Br·D/SEG (+ loader) threads fit the SM's 64K
    registers: above 256 threads a per-thread cap (spilling if it must: a finding the
    offline compiler reports) instead of a launch that fails for lack of registers;
    at 256 threads or fewer nothing (255, the cap anyway)."""
    threads = Br * n_segments(D, SEG) + 32 * loader_warps
    return {} if threads <= 256 else {"max_registers": 65536 // threads // 8 * 8}


def segment_launch(kern, problem, Br: int, SEG: int, smem_bytes: int, loader_warps: int = 0,
                   Bc: int | None = None) -> Launch:
    """The launch of a segmented kernel: Br·D/SEG compute threads plus ``loader_warps``
    warps per block, ``smem_bytes`` of dynamic shared memory, key tiles of ``Bc``."""
    threads = Br * n_segments(problem.head_dim, SEG) + 32 * loader_warps
    return row_block_launch(kern, problem, Br, threads, smem_bytes, Bc=Bc)




@device
def segment_thread(Br, SEG, H, G):
    """Where a thread of a segmented phase works: its query row ``r`` in the block
    (``tid % Br``), the first output column ``c0`` of its segment (``tid // Br``), the
    query row ``i``, the (batch, head) ``bh`` and its KV head ``kvh``."""
    tid = cuda.threadIdx.x
    r = tid % Br
    c0 = (tid // Br) * SEG
    i = cuda.blockIdx.x * Br + r
    bh = cuda.blockIdx.y
    return tid, r, c0, i, bh, kv_head(bh, H, G)


@device
def row_keys(i, Br, Nq, Nk, causal):
    """(keys query row ``i`` sees, keys any row of its block of Br rows sees: the
    block's last row sees the most)."""
    return (visible_keys(i, Nq, Nk, causal),
            visible_keys(min(cuda.blockIdx.x * Br + Br, Nq) - 1, Nq, Nk, causal))


@functools.cache
def block_walk(Br: int, Bc: int, causal: bool, stage=PLAIN):
    """The walk of a block of Br query rows over its key tiles of Bc (smem_kv … double_buffer), device functions
    ``(keys, start, tile)``: ``keys(i, bh, H, Nq, Nk, mods) -> (n_keys, block_keys, where)``, the keys query
    row ``i`` sees, those the loop walks (a variant: Bc times its visited tiles) and ``where = (b, h, qt, q_idx)``
    (``q_idx = i + Nk - Nq``: the row among the keys); ``start(where, jv, mods)``, the first key of the loop's
    tile at ``jv``; ``tile(where, jv, mods) -> (j0, at)``, that key and ``at = (b, h, q_idx, j0, kind)`` for
    the inner loop (:func:`tile_rows`)."""
    @device
    def keys(i, bh, H, Nq, Nk, mods):
        n_keys, block_keys = row_keys(i, Br, Nq, Nk, causal)
        b, h, qt = bh // H, bh % H, cuda.blockIdx.x
        return n_keys, stage.loop_keys(mods, b, h, qt, block_keys, Bc), (b, h, qt, i + Nk - Nq)

    @device
    def start(where, jv, mods):
        b, h, qt, _ = where
        return stage.tile_start(mods, b, h, qt, jv, Bc)

    @device
    def tile(where, jv, mods):
        b, h, qt, q_idx = where
        j0 = start(where, jv, mods)
        return j0, (b, h, q_idx, j0, stage.tile_kind(mods, b, h, qt, j0 // Bc))

    return keys, start, tile


@functools.cache
def segment_rows(D: int, SEG: int, stage=PLAIN):
    """The inner loop of segmented_out, one_barrier and warp_specialized: one thread's
    query row ``r`` against the first ``n`` keys of a K/V tile in shared memory
    (``Q_t`` transposed, scalar loads); the thread updates its SEG output columns from
    ``c0`` and returns the new (m, l). ``at``, ``mods``: as :func:`tile_rows`."""
    @device
    def rows(Q_t, K_j, V_j, r, c0, n, m, l, O_seg, at, mods):
        b, h, q_idx, j0, kind = at
        for jj in range(n):
            if kind != FULL and not stage.visible(b, h, q_idx, j0 + jj, mods):
                continue
            s = float32(0.0)  # the full score: every segment's thread recomputes it
            for d in range(D):
                s += Q_t[d, r] * K_j[jj, d]
            s = stage.modified(s, b, h, q_idx, j0 + jj, mods)
            m, l, corr, p = online_softmax_step(m, l, s)
            for c in range(SEG):
                O_seg[c] = O_seg[c] * corr + p * V_j[jj, c0 + c]
        return m, l

    return rows


@functools.cache
def segment_rows4(D: int, SEG: int, stage=PLAIN):
    """:func:`segment_rows` with 16-byte shared loads (vectorized, double_buffer): ``Q_s``
    row-major (padded rows), K and V rows read four floats at a time."""
    @device
    def rows(Q_s, K_j, V_j, r, c0, n, m, l, O_seg, at, mods):
        b, h, q_idx, j0, kind = at
        for jj in range(n):
            if kind != FULL and not stage.visible(b, h, q_idx, j0 + jj, mods):
                continue
            s = float32(0.0)  # the full score: every segment's thread recomputes it
            for d in range(0, D, 4):
                qv = lds4(Q_s, r, d)
                kv = lds4(K_j, jj, d)
                s += qv[0] * kv[0] + qv[1] * kv[1] + qv[2] * kv[2] + qv[3] * kv[3]
            s = stage.modified(s, b, h, q_idx, j0 + jj, mods)
            m, l, corr, p = online_softmax_step(m, l, s)
            for c in range(0, SEG, 4):
                vv = lds4(V_j, jj, c0 + c)
                for u in range(4):
                    O_seg[c + u] = O_seg[c + u] * corr + p * vv[u]
        return m, l

    return rows


# -- the register-blocked kernel (register_blocked, causal_skip) ------------------------------


def auto_tn(D: int) -> int:
    """TN=0 in the parameters: 8 keys per thread up to head_dim 64, 4 above (with TN=8
    and Bc=32 a thread holds D/4 output columns per row: 128 accumulators at D=128,
    which spill)."""
    return 8 if D <= 64 else 4


def geometry(D, Br, Bc, TM, TN):
    """Derived sizes: key groups, threads, O columns per thread, shared floats."""
    KG = Bc // TN
    NT = (Br // TM) * KG
    TD = D // KG
    smem_floats = D * Br + 2 * D * Bc + 2 * Bc * D + Bc * Br
    return KG, NT, TD, smem_floats


def launch_bound_registers(NT: int) -> int:
    """Registers per thread the launch bounds of one block of NT threads allow (what
    ptxas assumes when no lower cap is given)."""
    return min(MAX_REGISTERS, REGISTERS_PER_SM // NT // 8 * 8)


def resolve_register_blocked(problem, **params) -> dict:
    """TN=0: :func:`auto_tn`; maxreg=0: the cap the launch bounds already impose."""
    TN = params["TN"] or auto_tn(problem.head_dim)
    TM, Br, Bc = params["TM"], params["Br"], params["Bc"]
    if TN <= 0 or TM <= 0 or Bc % TN or Br % TM:
        raise ValueError(f"Br={Br} must be a multiple of TM={TM} and Bc={Bc} of TN={TN}")
    _, NT, _, _ = geometry(problem.head_dim, Br, Bc, TM, TN)
    return {**params, "TN": TN, "maxreg": params["maxreg"] or launch_bound_registers(max(NT, 32))}


def register_blocked_reason(problem, Br, Bc, TM, TN) -> str | None:
    D = problem.head_dim
    if TM % 4 or TN % 4:
        return f"TM={TM} and TN={TN} must be multiples of 4 (16-byte fragments)"
    if Br % TM or Bc % TN:
        return f"Br={Br} must be a multiple of TM={TM} and Bc={Bc} of TN={TN}"
    KG, NT, TD, smem = geometry(D, Br, Bc, TM, TN)
    if KG > WARP_SIZE or WARP_SIZE % KG:
        return f"Bc/TN = {KG} key groups must divide the warp size (row reductions stay in a warp)"
    if NT % WARP_SIZE or NT > MAX_THREADS:
        return f"{NT} threads per block: must be a multiple of 32 and at most {MAX_THREADS}"
    if D % KG or TD % 4:
        return f"head_dim {D} must split into {KG} column groups of a multiple of 4 (TD={D / KG:g})"
    return smem_reason(smem * 4)


@functools.cache
def make_register_blocked(D: int, Br: int, Bc: int, TM: int, TN: int, maxreg: int, causal: bool, lse: bool,
                          skip: bool, heavy_first: bool, stage=PLAIN):
    """The register-blocked kernel. ``skip`` (``causal_skip``): only the tiles that cross
    the causal diagonal or the end of the keys are masked; ``heavy_first``: the grid's
    query blocks run in reverse order (the longest causal blocks first). ``stage``: the variant's
    (its block mask's visited tiles, its mask on partial tiles, its score function); ``lse``: it also writes
    each row's log-sum-exp (:func:`~numba_attn.variants.sinks.lse_stages`)."""
    if lse:
        stage = lse_stages(stage)
    KG, NT, TD, _ = geometry(D, Br, Bc, TM, TN)
    QC, KC, DC = TM // 4, TN // 4, TD // 4  # 16-byte chunks of the Q, K and O/V fragments
    KSTRIDE = 4 * KG  # a thread's key chunks (and O column chunks) are KSTRIDE apart
    STAGE = (Bc * D // 4 + NT - 1) // NT * 4  # floats staged per thread and tile (K, and V)
    QT_OFF = 0
    KT_OFF = QT_OFF + D * Br
    V_OFF = KT_OFF + 2 * D * Bc
    PT_OFF = V_OFF + 2 * Bc * D
    LSE, _, store_lse2 = lse_parts(stage)  # the kernel writes each row's log-sum-exp (the last array of ``mods``)

    def register_blocked(q, k, v, o, scale2, H, G, Nq, Nk, mods):
        Q_t = dynamic_tile(QT_OFF, D, Br)  # Qᵀ, pre-scaled by scale·log2(e)
        P_t = dynamic_tile(PT_OFF, Bc, Br)  # Pᵀ of the current tile
        tid = cuda.threadIdx.x
        rg = tid // KG  # row group: rows rg·TM .. rg·TM+TM-1
        kg = tid - rg * KG  # key group (S) = column group (O)
        bx = cuda.gridDim.x - 1 - cuda.blockIdx.x if heavy_first else cuda.blockIdx.x
        row0 = bx * Br
        bh, batch, head = batch_head(H)
        kvh = kv_head(bh, H, G)
        off = Nk - Nq
        load_tile4_t(Q_t, q, bh, row0, Nq, scale2, tid, NT, Br, D)
        # the keys the tile loop walks (a variant: its visited tiles, in order) and those every row sees
        block_keys = visible_keys(min(row0 + Br, Nq) - 1, Nq, Nk, causal)
        block_keys = stage.loop_keys(mods, batch, head, bx, block_keys, Bc)
        full_keys = visible_keys(row0, Nq, Nk, causal)

        acc = cuda.local.array((TM, TD), float32)
        s = cuda.local.array((TM, TN), float32)
        m = cuda.local.array(TM, float32)
        l = cuda.local.array(TM, float32)
        corr = cuda.local.array(TM, float32)
        qf = cuda.local.array(TM, float32)
        kf = cuda.local.array(TN, float32)
        vf = cuda.local.array(TD, float32)
        for a in range(TM):
            m[a] = MASKED
            l[a] = float32(0.0)
            for c in range(TD):
                acc[a, c] = float32(0.0)
        stage_k = cuda.local.array(STAGE, float32)
        stage_v = cuda.local.array(STAGE, float32)
        first = stage.tile_start(mods, batch, head, bx, 0, Bc)
        fetch4_t(stage_k, k, kvh, first, Nk, tid, NT, Bc, D)
        fetch4(stage_v, v, kvh, first, Nk, tid, NT, Bc, D)
        put4_t(dynamic_tile(KT_OFF, D, Bc), stage_k, tid, NT, Bc, D)
        put4(dynamic_tile(V_OFF, Bc, D), stage_v, tid, NT, Bc, D)

        for jv in range(0, block_keys, Bc):
            j0 = stage.tile_start(mods, batch, head, bx, jv, Bc)
            kind = stage.tile_kind(mods, batch, head, bx, j0 // Bc)
            st = (jv // Bc) & 1
            K_t = dynamic_tile(KT_OFF + st * (D * Bc), D, Bc)
            V_j = dynamic_tile(V_OFF + st * (Bc * D), Bc, D)
            cuda.syncthreads()  # tile j0 visible; everyone is done with the other stage and with P_t
            has_next = jv + Bc < block_keys
            if has_next:  # global loads of the next tile in flight during this tile's math
                j_next = stage.tile_start(mods, batch, head, bx, jv + Bc, Bc)
                fetch4_t(stage_k, k, kvh, j_next, Nk, tid, NT, Bc, D)
                fetch4(stage_v, v, kvh, j_next, Nk, tid, NT, Bc, D)

            # S micro-tile = Q[rows] · K[keys]ᵀ, outer products over d
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = float32(0.0)
            d = 0
            while d < D:  # hot loops are `while` loops: numba's range() hides the trip count from LLVM
                for c in range(QC):
                    x = lds4(Q_t, d, rg * TM + 4 * c)
                    for u in range(4):
                        qf[4 * c + u] = x[u]
                for c in range(KC):
                    x = lds4(K_t, d, c * KSTRIDE + kg * 4)
                    for u in range(4):
                        kf[4 * c + u] = x[u]
                for a in range(TM):
                    for b in range(TN):
                        s[a, b] += qf[a] * kf[b]
                d += 1

            # mask (every tile, or with `skip` the diagonal and last tiles only),
            # tile-wise online softmax, P to shared memory
            needs_mask = j0 + Bc > full_keys
            for a in range(TM):
                if stage.active:  # the variant's scores (natural units around its function) and mask
                    i = row0 + rg * TM + a
                    for b_ in range(TN):
                        j = j0 + (b_ // 4) * KSTRIDE + kg * 4 + (b_ % 4)
                        if i < Nq and j < Nk:  # (the functions see positions in range only)
                            s[a, b_] = stage.modified(s[a, b_] * LN2, batch, head, i + off, j, mods) * LOG2E
                            if kind == PARTIAL and not stage.visible(batch, head, i + off, j, mods):
                                s[a, b_] = MASKED
                if skip:
                    if needs_mask:
                        i = row0 + rg * TM + a
                        lim = min(Nk, i + off + 1) if causal else Nk
                        for b in range(TN):
                            j = j0 + (b // 4) * KSTRIDE + kg * 4 + (b % 4)
                            if j >= lim:
                                s[a, b] = MASKED
                    tmax = MASKED
                    for b in range(TN):
                        tmax = max(tmax, s[a, b])
                else:
                    i = row0 + rg * TM + a
                    lim = min(Nk, i + off + 1) if causal else Nk
                    tmax = MASKED
                    for b in range(TN):
                        j = j0 + (b // 4) * KSTRIDE + kg * 4 + (b % 4)
                        if j >= lim:
                            s[a, b] = MASKED
                        tmax = max(tmax, s[a, b])
                w = KG // 2
                while w > 0:
                    tmax = max(tmax, shfl_xor_sync(FULL_MASK, tmax, w))
                    w //= 2
                m[a], l[a], corr[a] = online_softmax_rescale2(m[a], l[a], tmax)
                for b in range(TN):
                    p = math.exp2(s[a, b] - m[a])
                    s[a, b] = p
                    l[a] += p
            for b in range(TN):
                col = (b // 4) * KSTRIDE + kg * 4 + (b % 4)
                for c in range(QC):
                    sts4(P_t, col, rg * TM + 4 * c, s[4 * c, b], s[4 * c + 1, b], s[4 * c + 2, b], s[4 * c + 3, b])
            cuda.syncthreads()  # P_t visible

            # O micro-tile = corr · O + P[rows] · V[:, cols]
            for a in range(TM):
                for c in range(TD):
                    acc[a, c] *= corr[a]
            j = 0
            while j < Bc:
                for c in range(QC):
                    x = lds4(P_t, j, rg * TM + 4 * c)
                    for u in range(4):
                        qf[4 * c + u] = x[u]
                for c in range(DC):
                    x = lds4(V_j, j, c * KSTRIDE + kg * 4)
                    for u in range(4):
                        vf[4 * c + u] = x[u]
                for a in range(TM):
                    for c in range(TD):
                        acc[a, c] += qf[a] * vf[c]
                j += 1

            if has_next:  # the other stage was last read before this tile's first barrier
                put4_t(dynamic_tile(KT_OFF + (1 - st) * (D * Bc), D, Bc), stage_k, tid, NT, Bc, D)
                put4(dynamic_tile(V_OFF + (1 - st) * (Bc * D), Bc, D), stage_v, tid, NT, Bc, D)

        for a in range(TM):
            w = KG // 2
            lsum = l[a]
            while w > 0:
                lsum += shfl_xor_sync(FULL_MASK, lsum, w)
                w //= 2
            i = row0 + rg * TM + a
            if i < Nq:
                inv_l = stage.inverse_l(m[a], lsum)
                for c in range(TD):
                    o[bh, i, (c // 4) * KSTRIDE + kg * 4 + (c % 4)] = acc[a, c] * inv_l
                if LSE and kg == 0:  # (m, l) in base-2 units
                    store_lse2(mods, bh, i, m[a], lsum)

    if skip:  # the kernel carries the name of the phase that runs it
        register_blocked.__name__ = register_blocked.__qualname__ = "causal_skip"
    # launch_bounds: ptxas keeps the registers within what one block of NT threads may
    # use; maxreg trades registers for occupancy
    return kernel(register_blocked, launch_bounds=NT, max_registers=maxreg)
