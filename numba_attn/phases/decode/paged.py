"""The paged KV cache (``decode_paged``): key rows found through the block table, the cache formats and their
scales, the layout a launch reads, the paged launch, and the work lists of ``paged_worklist``."""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, uint32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.intrinsics import ld_global_v2, ld_global_v4
from numba_attn.gpu.jit import device
from numba_attn.gpu.ptx_loads import launch_dynamic
from numba_attn.gpu.split_k import sm_count
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.kv8 import e4m3_nan_bytes, kv8_decoder
from numba_attn.phases.decode.launch import (combine_args, combine_kernel, launch_mods, split_workspace, tile_notes,
                                             variant_mods, zeroed_counters)
from numba_attn.phases.decode.rules import check_alignment, split_layout
from numba_attn.phases.decode.steps import row_loader
from numba_attn.phases.registry import Launch
from numba_attn.variants.sinks import with_lse

PAGED_KV8 = {"": 0, "float8_e4m3": 1, "int8": 2}  # the cache format a paged kernel is compiled for


PAGED_TOKEN_SCALE = {"tensor": 0, "head": 0, "token": 1}  # scale rows per token (else one row per head)


def check_paged_problem(problem) -> str | None:
    """The paged phases run paged problems only (``PagedProblem``: page_size, block table)."""
    if not getattr(problem, "page_size", 0):
        return "paged phase: needs a paged KV cache (a PagedProblem with page_size and block table)"
    return None


def page_steps(P: int, KEYS_PER_STEP: int):
    """(log2 of the page size ``P``, whether a page holds whole warp steps of ``KEYS_PER_STEP`` keys): with steps
    aligned to KS a step then never crosses a page, and its page index is read once per step (by the
    warp-step kernel, :func:`make_lean_kernel`, which passes it to :func:`paged_keys` / :func:`paged_words`),
    else once per key. (0, False) without pages (``P`` = 0)."""
    return (P.bit_length() - 1, P % KEYS_PER_STEP == 0) if P > 0 else (0, False)


@functools.cache
def paged_keys(D: int, VW: int, LANES: int, KEYS: int, P: int, KEYS_PER_STEP: int, KV_FORMAT: int, TOKEN: bool,
               BF16: bool = False):
    """``load_keys`` of a warp-step kernel over a paged cache: key ``jj`` of sequence
    ``b`` is cache row ``table[b, jj // P] · P + jj % P`` of the (num_blocks·P, Hkv, D)
    view. When pages hold whole warp steps (``P % KEYS_PER_STEP == 0``: steps are aligned to them)
    the page index is read once per step, by the caller (``pg``), else once per key here. ``KV_FORMAT``: 0 a
    16-bit cache (16-byte loads, as ``chunk_steps``), 1 fp8 e4m3, 2 int8: the (…, D/4) uint32 view,
    two words per 8 elements, dequantized and multiplied by the row's scale
    (``ks``/``vs``: (1, Hkv) per tensor or head, (num_blocks·P, Hkv) per ``TOKEN``).
    ``BF16`` (with ``KV_FORMAT`` 0): a bfloat16 cache as its (…, D/2) uint32 word view."""
    E = D // LANES
    NV = E // VW
    GROUPS = WARP_SIZE // LANES
    LOGP, STEP = page_steps(P, KEYS_PER_STEP)
    load_row = row_loader(VW, LANES, NV, BF16)  # one key row of K and V, 16 bytes per load
    dq4, UNIT = kv8_decoder(KV_FORMAT)

    @device
    def load_keys(k, v, K_j, V_j, table, b, h, pg, j0, hi, sub, ks, vs):
        for t in range(KEYS):
            jj = min(j0 + t * GROUPS, hi - 1)
            page = pg if STEP else table[b, jj >> LOGP]
            row = page * P + (jj & (P - 1))
            if KV_FORMAT == 0:
                load_row(k, v, K_j, V_j, t, row, h, sub)
            else:
                srow = row if TOKEN else 0
                sk = ks[srow, h] * UNIT
                sv = vs[srow, h] * UNIT
                for u in range(NV):
                    c = (sub + LANES * u) * 2  # word of the chunk's first element (8 bytes: 2 words)
                    kw0, kw1 = ld_global_v2(k, row, h, c)
                    vw0, vw1 = ld_global_v2(v, row, h, c)
                    k0, k1, k2, k3 = dq4(kw0)
                    k4, k5, k6, k7 = dq4(kw1)
                    v0, v1, v2, v3 = dq4(vw0)
                    v4, v5, v6, v7 = dq4(vw1)
                    e = u * VW
                    K_j[t, e], K_j[t, e + 1], K_j[t, e + 2], K_j[t, e + 3] = k0 * sk, k1 * sk, k2 * sk, k3 * sk
                    K_j[t, e + 4], K_j[t, e + 5], K_j[t, e + 6], K_j[t, e + 7] = k4 * sk, k5 * sk, k6 * sk, k7 * sk
                    V_j[t, e], V_j[t, e + 1], V_j[t, e + 2], V_j[t, e + 3] = v0 * sv, v1 * sv, v2 * sv, v3 * sv
                    V_j[t, e + 4], V_j[t, e + 5], V_j[t, e + 6], V_j[t, e + 7] = v4 * sv, v5 * sv, v6 * sv, v7 * sv

    return load_keys


@functools.cache
def paged_words(D: int, LANES: int, KEYS: int, P: int, KEYS_PER_STEP: int, KV_FORMAT: int, TOKEN: bool):
    """The ``wide`` load of an 8-bit paged cache (``KV_FORMAT`` 1 fp8 e4m3, 2 int8): as
    :func:`paged_keys`, but a lane owns 16 consecutive codes per chunk (E = D/L elements,
    E/16 chunks) and reads each chunk with one 16-byte load of the (…, D/4) uint32 view.
    The words are kept as they are (``KQ``/``VQ``: (T, E/4)) and decoded where they are
    used; ``sks``/``svs`` get each key's K and V scale (times the decoder's unit). Returns,
    for fp8, the OR of :func:`e4m3_nan_bytes` of every word loaded (non-zero: a NaN code
    was read), else 0."""
    E = D // LANES
    NV = E // 16
    GROUPS = WARP_SIZE // LANES
    LOGP, STEP = page_steps(P, KEYS_PER_STEP)
    UNIT = kv8_decoder(KV_FORMAT)[1]

    @device
    def load_words(k, v, K_words, V_words, sks, svs, table, b, h, pg, j0, hi, sub, ks, vs):
        bad = uint32(0)
        for t in range(KEYS):
            jj = min(j0 + t * GROUPS, hi - 1)
            page = pg if STEP else table[b, jj >> LOGP]
            row = page * P + (jj & (P - 1))
            srow = row if TOKEN else 0
            sks[t] = ks[srow, h] * UNIT
            svs[t] = vs[srow, h] * UNIT
            for u in range(NV):
                c = (sub + LANES * u) * 4  # word of the chunk's first code (16 codes: 4 words)
                kw = ld_global_v4(k, row, h, c)
                vw = ld_global_v4(v, row, h, c)
                for x in range(4):
                    K_words[t, 4 * u + x] = kw[x]
                    V_words[t, 4 * u + x] = vw[x]
                    if KV_FORMAT == 1:
                        bad |= e4m3_nan_bytes(kw[x]) | e4m3_nan_bytes(vw[x])
        return bad

    return load_words


def paged_scales(problem, ks, vs):
    """Host scales → the float32 (rows, Hkv) device arrays the kernels index (a dummy
    (1, 1) for a 16-bit cache)."""
    Hkv = problem.kv_heads
    out = []
    for s in (ks, vs):
        if s is None:
            out.append(np.zeros((1, 1), np.float32))
            continue
        a = np.asarray(s, np.float32)
        a = np.full((1, Hkv), float(a), np.float32) if a.ndim == 0 else a.reshape(-1, Hkv)
        out.append(np.ascontiguousarray(a))
    return tuple(cuda.to_device(a) for a in out)


class PagedLayout:
    """The block table, lengths and scales a paged launch reads: a call's own
    (``decode_paged``) or, when a call gives none (the runner), the problem's
    :meth:`PagedProblem.layout`, uploaded once at the first call."""

    def __init__(self, problem):
        self.problem = problem
        self._own = None

    def own(self):
        if self._own is None:
            table, seqlens, ks, vs = self.problem.layout()
            self._own = (cuda.to_device(table), cuda.to_device(seqlens)) + paged_scales(self.problem, ks, vs)
        return self._own


def paged_cache_view(problem, k):
    """A (num_blocks, P, Hkv, D) cache as the (num_blocks·P, Hkv, ·) view the kernels
    index: the elements of a float16 cache, the uint32 words of an 8-bit or bfloat16 one."""

    nb, P, Hkv, D = k.shape
    if getattr(problem, "kv_dtype", ""):
        if k.dtype != np.uint8:
            k = view_as(k, np.uint8)
        k = view_as(k.reshape(nb * P, Hkv, D), np.uint32)
        return k
    if problem.dtype == "bfloat16":
        return view_as(k.reshape(nb * P, Hkv, D), np.uint32)
    return k.reshape(nb * P, Hkv, D)


def paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused, notes="", heads=1, dyn_bytes=0,
                 static_bytes=0):
    """The :class:`Launch`: grid (split, row block of a sequence's KV head, or of ``heads`` adjacent KV heads),
    the workspace, the combine kernel unless fused; ``run(q, k_cache, v_cache, o, stream, layout=None, mods=None)``
    with ``layout`` (table, seqlens, k_scale, v_scale) device arrays, else the problem's own (:class:`PagedLayout`),
    and ``mods`` a variant's kernel arguments for a call's arrays (None: the problem's own).
    ``dyn_bytes``: the kernel's dynamic shared memory (opted in to where it and ``static_bytes``, the kernel's static
    shared memory, pass 48 KiB)."""
    B, H, Hkv, Nq, D = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.head_dim
    S = splits
    n_rc, chunk = split_layout(problem, warps, rows, lanes, keys, S)
    grid = (S, B * Hkv * n_rc // heads)
    part_o, part_lse = split_workspace(max(S, 2), B * H * Nq, D)  # (every split writes a partial)
    kernels = [kern]
    if not fused:
        comb = combine_kernel(problem, Nq, problem.dtype == "bfloat16")
        kernels.append(comb)
    cnt = zeroed_counters(B * Hkv * n_rc)
    own = PagedLayout(problem)
    kernel_mods = variant_mods(problem)

    def run(q, k, v, o, stream=0, layout=None, mods=None, lse=None):
        table, seqlens, ks, vs = layout or own.own()
        kc, vc = paged_cache_view(problem, k), paged_cache_view(problem, v)
        check_alignment(kc, vc)
        launch_dynamic(kern, grid, warps * WARP_SIZE, stream, dyn_bytes, q, kc, vc, o, part_o, part_lse, cnt, scale,
                       Hkv, table, seqlens, ks, vs, chunk, S,
                       with_lse(kernel_mods(stream=stream) if mods is None else mods, lse), static_bytes=static_bytes)
        if not fused:
            comb[B * H * Nq, D, stream](*combine_args(part_o, part_lse, o, S, lse))

    return Launch(run, kernels=kernels, workspace_bytes=part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, P={problem.page_size}, "
                        f"{tile_notes(lanes, keys, rows, warps)}{notes}", **launch_mods(kernel_mods))


def work_list(lens, keys_per_step: int, workers: int, min_keys: int = 0):
    """The work list of ``paged_worklist`` (FlashInfer's balanced decode plan): the batch's keys, each
    sequence's rounded up to whole warp steps of ``keys_per_step`` keys and laid end to end, cut into ``W`` equal
    shares of whole steps (``W`` = ``workers``, fewer where a share would hold under ``min_keys`` keys).
    Worker w's share is the part of every sequence it covers: an item (sequence b, split s, keys [lo, hi)
    of b, n_b) where n_b is how many items b has (split s is b's s-th, in key order, so a sequence's
    splits are 0 … n_b − 1 and a combine reads exactly n_b partials). A sequence of length 0 is one
    item (b, 0, 0, 0, 1), which writes its zero partial. Returns (``work`` int32 (items, 5), ``wptr`` int32
    (W + 1,): worker w runs items wptr[w] … wptr[w+1] − 1, a contiguous run of sequences). Every item has
    keys except an empty sequence's; ``lo`` is a multiple of ``keys_per_step``."""
    lens = np.asarray(lens, np.int64).reshape(-1)
    steps = -(-lens // keys_per_step)  # each sequence in whole steps
    total = int(steps.sum())
    W = max(1, min(int(workers), total, -(-total * keys_per_step // max(1, min_keys)) if min_keys else total))
    share = -(-total // W)  # steps per worker
    items, owner = [], []
    start = 0  # the sequence's first step in the batch's steps
    for b, n in enumerate(steps.tolist()):
        if n == 0:
            items.append([b, 0, 0, 0, 1])
            owner.append(min(start // share, W - 1))
            continue
        first = len(items)
        w = start // share
        while w * share < start + n:
            lo, hi = max(start, w * share), min(start + n, (w + 1) * share)
            items.append([b, len(items) - first, (lo - start) * keys_per_step,
                          min(int(lens[b]), (hi - start) * keys_per_step), 0])
            owner.append(w)
            w += 1
        for it in items[first:]:
            it[4] = len(items) - first
        start += n
    work = np.asarray(items, np.int32).reshape(-1, 5)
    wptr = np.searchsorted(np.asarray(owner), np.arange(W + 1), side="left").astype(np.int32)
    return work, wptr


def worklist_plan(lens, Hkv: int, keys_per_step: int, workers: int, min_keys: int = 0, flat: bool = False):
    """The work list of ``paged_worklist``'s blocks: (``work`` int32 (items, 5), ``wptr`` int32 (blocks + 1,)),
    as :func:`work_list`'s but with an item's first column the KV head of its sequence, b · Hkv + h.
    ``flat``: one list over every (sequence, KV head) in that order, cut into ``workers`` shares (a share may
    hold the end of one KV head and the start of the next, of this sequence or the next): the blocks can be
    as many as the SMs' slots, whatever the number of KV heads. Else a list per KV head (``workers`` shares
    each), the heads' lists one after the other: Hkv · ``workers`` blocks, block h · W + w running worker w's
    share of head h."""
    lens = np.asarray(lens, np.int64).reshape(-1)
    if flat:
        work, wptr = work_list(np.repeat(lens, Hkv), keys_per_step, workers, min_keys)
        return work, wptr
    work, wptr = work_list(lens, keys_per_step, workers, min_keys)
    heads = []
    for h in range(Hkv):
        wh = work.copy()
        wh[:, 0] = wh[:, 0] * Hkv + h
        heads.append(wh)
    ptr = np.concatenate([wptr[:-1] + h * len(work) for h in range(Hkv)] + [[Hkv * len(work)]])
    return np.concatenate(heads).astype(np.int32), ptr.astype(np.int32)


def worklist_launch(problem, kern, scale, warps, lanes, rows, keys, workers, blocks_per_sm, min_keys, flat=False,
                    notes=""):
    """The :class:`Launch` of ``paged_worklist``: grid (block, row block), each block running its items of the
    work list (:func:`worklist_plan`); ``workers``: shares per KV head (0: with ``flat``, as many shares as
    fill the SMs' ``blocks_per_sm`` slots once; else as many per KV head as fill them once for all heads
    together, rounded down). ``run(q, k_cache, v_cache, o,
    stream, layout=None, lens=None, mods=None)`` as :func:`paged_launch`'s; the list is planned on the host from the
    lengths, as serving systems plan each decode step before launching it: the problem's, once (the
    runner's calls), else the call's: ``lens``, their host copy (``decode_paged`` passes the lengths it
    checked), or ``layout``'s read back from the device (one small copy, which waits for the device)."""
    B, H, Hkv, Nq, D = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.head_dim
    n_rc = (problem.group * Nq + rows - 1) // rows
    keys_per_round = (WARP_SIZE // lanes) * keys * warps  # keys per round of the block's warps: a split's unit
    slots = sm_count() * blocks_per_sm // n_rc  # blocks (of all KV heads) that fill the SMs' slots once
    W = workers * (Hkv if flat else 1) or max(1, slots if flat else slots // Hkv)
    cnt = zeroed_counters(B * Hkv * n_rc)
    own = PagedLayout(problem)
    plans = {}

    def plan(lens):
        """(work, wptr on the device, blocks, most items of a KV head, items) for these lengths."""
        key = lens.tobytes()
        if key not in plans:
            work, wptr = worklist_plan(lens, Hkv, keys_per_round, W, min_keys, flat)
            plans.clear()  # one plan at a time: a decode loop's lengths change every step
            plans[key] = (cuda.to_device(work), cuda.to_device(wptr), int(wptr.size) - 1, int(work[:, 4].max()),
                          int(work.shape[0]))
        return plans[key]

    lens0 = np.ascontiguousarray(problem.seqlens(), np.int32)  # the problem's own lengths (the runner's calls)
    _, _, nw0, smax0, items0 = plan(lens0)
    state = {"ws": split_workspace(max(2, smax0), B * H * Nq, D)}  # grown to a plan's most splits
    kernel_mods = variant_mods(problem)

    def run(q, k, v, o, stream=0, layout=None, lens=None, mods=None, lse=None):
        table, seqlens, ks, vs = layout or own.own()
        if lens is None:
            lens = lens0 if layout is None else seqlens.copy_to_host()
        work, wptr, nw, smax, _ = plan(np.ascontiguousarray(lens, np.int32))
        po, pl = state["ws"]
        if po.shape[0] < smax:  # a partial for every (row, split) of the plan
            state["ws"] = po, pl = split_workspace(smax, B * H * Nq, D)
        kc, vc = paged_cache_view(problem, k), paged_cache_view(problem, v)
        check_alignment(kc, vc)
        kern[(nw, n_rc), warps * WARP_SIZE, stream](q, kc, vc, o, po, pl, cnt, scale, Hkv, table, seqlens, ks,
                                                          vs, work, wptr,
                                                          with_lse(kernel_mods(stream=stream) if mods is None else mods,
                                                                   lse))

    return Launch(run, kernels=[kern], workspace_bytes=state["ws"][0].nbytes + state["ws"][1].nbytes,
                  host_lengths=True,
                  notes=f"{nw0} blocks{'' if flat else f' ({nw0 // Hkv} workers of each KV head)'} of {n_rc} row "
                        f"block(s), {items0} items (at most {smax0} per KV head) "
                        f"in whole steps of {keys_per_round} keys, P={problem.page_size}, "
                        f"{tile_notes(lanes, keys, rows, warps)}"
                        f"{notes}", **launch_mods(kernel_mods))
