"""Which rows a block of the tensor-core phases works on: its work items.

* one item per block (the default): query block ``blockIdx.x`` of head ``blockIdx.y``, batch ``blockIdx.z``, or
  counted from the last (:func:`query_block`: causal, the blocks with the most key tiles first);
* varlen: sequence ``blockIdx.z`` of a packed batch (:func:`varlen_spans`, :func:`varlen_views`; the host's
  :class:`VarlenLayout` gives the cu_seqlens);
* persistent: a block per SM walking items ``blockIdx.x``, then every ``gridDim.x``-th (:func:`first_item`,
  :func:`next_item`; query blocks counted from the last, the causal diagonal's longest first), or in rounds of
  ``gridDim.x`` items over the longest first, a section of heads at a time (:func:`balanced_items`,
  :func:`balanced_section`);
* the key tiles of an item (:func:`key_tiles`): every tile up to the causal bound, or with a variant's mask
  function the block mask's visited tiles in order, each with its kind (empty tiles are never loaded).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32

from numba_attn.gpu.intrinsics import rows_head_major
from numba_attn.gpu.jit import device
from numba_attn.variants.stages import PLAIN

__all__ = ["query_block", "varlen_spans", "varlen_views", "VarlenLayout", "first_item", "next_item",
           "balanced_items", "persistent_items", "divmod_small", "balanced_section", "schedule_load", "key_tiles"]


@functools.cache
def query_block(longest_first: bool):
    """A device function ``qt()``: the query block of this block (one item per block), ``blockIdx.x``, or with
    ``longest_first`` counted from the last. The hardware starts blocks in the order of ``blockIdx.x`` (fastest), so
    causally the blocks with the most key tiles start first and the last to start are the shortest: a list
    schedule ends at most one item after its average, and that item is now one key tile long (FlashAttention-2's
    causal order)."""
    if longest_first:
        @device
        def last_first():
            return cuda.gridDim.x - 1 - cuda.blockIdx.x

        return last_first

    @device
    def in_order():
        return cuda.blockIdx.x

    return in_order


@device
def varlen_spans(cu_q, cu_k):
    """``(q0, Nq, k0, Nk)``: the first query row and the queries, the first key row and the keys of
    sequence ``blockIdx.z`` from its cu_seqlens (the varlen layout)."""
    b = cuda.blockIdx.z
    q0 = cu_q[b]
    k0 = cu_k[b]
    return q0, cu_q[b + 1] - q0, k0, cu_k[b + 1] - k0


@device
def varlen_views(q, k, v, o, cu_q, cu_k):
    """``(q, k, v, o, Nq, Nk)`` of sequence ``blockIdx.z`` in the varlen layout: q, o (total_q, H, W)
    and k, v (total_k, Hkv, W) → its rows as head-major views (H, Nq, W) and (Hkv, Nk, W), what the
    kernels index as (b·h, row, word), and its lengths."""
    q0, nq, k0, nk = varlen_spans(cu_q, cu_k)
    return (rows_head_major(q, q0, nq), rows_head_major(k, k0, nk), rows_head_major(v, k0, nk),
            rows_head_major(o, q0, nq), nq, nk)


@device
def divmod_small(i, n):
    """``(i // n, i % n)`` for ``0 <= i`` and ``0 < n``, in a few instructions whatever the quotient: a float32
    quotient (the kernels' fastmath: an approximate reciprocal, at most one off below 2^24), corrected to the exact
    one. A run-time integer division is a subroutine call, which makes ptxas serialize wgmma, and subtracting ``n``
    until ``i < n`` costs a step a unit of the quotient (up to 256 steps over B8 H32 N1024's 2048 items: a 2.9 µs gap
    between a persistent block's items on an H200, -0.2 µs with this; ``numba-attn trace``)."""
    qt = int32(float32(i) / float32(n))
    r = i - qt * n
    while r < 0:
        r += n
        qt -= 1
    while r >= n:
        r -= n
        qt += 1
    return qt, r


@device
def first_item(n_query_blocks):
    """persistent: this block's first work item (query block ``qb`` counted from the last, head-batch
    ``bh``): item ``blockIdx.x`` of the (B·H, n_query_blocks) items, qb fastest; no division."""
    bh, qb = divmod_small(cuda.blockIdx.x, n_query_blocks)
    return qb, bh


@device
def next_item(qb, bh, n_query_blocks):
    """persistent: the work item ``gridDim.x`` items after (qb, bh)."""
    dbh, qb = divmod_small(qb + cuda.gridDim.x, n_query_blocks)
    return qb, bh + dbh


L2_SECTION_BYTES = 24 << 20  # the K/V a section of heads may read at once: half an H100's or H200's 50 MB L2
ITEM_TILES = 3  # a work item's cost beside its key tiles, in tiles (H200: 5.2-5.6 µs against 1.6-1.7 a tile)


def schedule_load(section: int, n_query_blocks: int, bh: int, grid: int, causal: bool):
    """The work of the busiest block over the average of :func:`balanced_items`'s schedule (host, NumPy): a work
    item weighs its key tiles (causally n_query_blocks - qb, ``qb`` counted from the last) plus ITEM_TILES."""
    i = np.arange(n_query_blocks * bh)
    r, p = np.divmod(i, grid)
    block = np.where(r & 1, grid - 1 - p, p)
    qb = (i % (n_query_blocks * section)) // section
    work = (n_query_blocks - qb if causal else np.full_like(qb, n_query_blocks)) + ITEM_TILES
    load = np.bincount(block, weights=work, minlength=grid)
    return float(load.max() / max(load.sum() / grid, 1e-9))


def balanced_section(problem, n_query_blocks: int, grid: int, budget: int = L2_SECTION_BYTES) -> int:
    """The heads of a section of :func:`balanced_items` for ``problem``: of 1 and the powers of two that divide
    batch × heads and whose K and V (shared by ``group`` query heads) fit in ``budget`` bytes, the one whose
    schedule loads its busiest block least (:func:`schedule_load`); of those within 0.5 % of it the smallest (fewer
    heads at a time read fewer K/V)."""
    per_head = 2 * problem.kv_len * problem.head_dim * 2 / problem.group  # K and V of a query head, 16-bit
    bh, sections = problem.batch * problem.heads, [1]
    while bh % (2 * sections[-1]) == 0 and 2 * sections[-1] * per_head <= budget:
        sections.append(2 * sections[-1])
    loads = [schedule_load(sec, n_query_blocks, bh, grid, problem.causal) for sec in sections]
    best = min(loads)
    return next(sec for sec, load in zip(sections, loads) if load <= best * 1.005)


@functools.cache
def balanced_items(section: int):
    """persistent, balanced: a device function ``item(r, n_query_blocks) -> (qb, bh)``, this block's work item of
    round ``r`` (``qb`` counted from the last; ``bh >= B·H`` past the last). The items are ordered a section of
    ``section`` heads at a time (their K/V read while they stay in the L2), within it by query block from the last
    (causally the longest first), heads fastest; round r hands items r·G … r·G + G - 1 (G = ``gridDim.x``) out to
    the blocks in a snake, forward on even rounds and backward on odd ones, so that a block taking a round's
    longest item takes the next round's shortest. ``section``: a power of two dividing B·H
    (:func:`balanced_section`)."""
    if section < 1 or section & (section - 1):
        raise ValueError(f"section (heads a section) must be a power of two, got {section}")
    LOG = section.bit_length() - 1
    MASK = section - 1

    @device
    def item(r, n_query_blocks):
        G = cuda.gridDim.x
        x = cuda.blockIdx.x
        i = r * G + (G - 1 - x if r & 1 else x)
        sec, i = divmod_small(i, n_query_blocks << LOG)  # (the section, the item in it)
        return i >> LOG, (sec << LOG) + (i & MASK)

    return item


@functools.cache
def persistent_items(section: int = 0):
    """persistent: ``(first(n_query_blocks) -> (r, qb, bh), following(r, qb, bh, n_query_blocks) -> (r, qb, bh))``,
    a block's work items one after another (``r``: the round): every ``gridDim.x``-th item from ``blockIdx.x``
    (:func:`first_item`, :func:`next_item`) or, with a ``section``, :func:`balanced_items`."""
    if not section:
        @device
        def first(n_query_blocks):
            qb, bh = first_item(n_query_blocks)
            return 0, qb, bh

        @device
        def following(r, qb, bh, n_query_blocks):
            qb, bh = next_item(qb, bh, n_query_blocks)
            return r + 1, qb, bh

        return first, following
    item = balanced_items(section)

    @device
    def first_balanced(n_query_blocks):
        qb, bh = item(0, n_query_blocks)
        return 0, qb, bh

    @device
    def following_balanced(r, qb, bh, n_query_blocks):
        qb, bh = item(r + 1, n_query_blocks)
        return r + 1, qb, bh

    return first_balanced, following_balanced


class VarlenLayout:
    """The cu_seqlens a varlen launch reads: a call's own (``attention_varlen``) or, when a call
    gives none (the runner), the problem's :meth:`VarlenProblem.layout`, uploaded once."""

    def __init__(self, problem):
        self.problem = problem
        self._own = None

    def own(self):
        if self._own is None:
            self._own = tuple(cuda.to_device(a) for a in self.problem.layout())
        return self._own


@functools.cache
def key_tiles(Bc: int, stage=PLAIN):
    """``(count, tile_at, kind_at)`` over a work item's ``walk = (mods, b, h, qt, Nq)`` (the variant's
    ``mods``, batch, head, query tile of the block mask, queries): ``count(walk, n)`` — the tiles the item
    visits of the ``n`` up to the causal bound; ``tile_at(walk, it)`` — the key tile (keys ``Bc·kt …``) of
    visit ``it``; ``kind_at(walk, kt)`` — EMPTY / PARTIAL / FULL. Plain attention: ``n``, ``it``, FULL; a
    variant's mask function: the block mask's visited tiles (:mod:`numba_attn.variants.stages`)."""
    if not stage.active:
        @device
        def count(walk, n):
            return n

        @device
        def tile_at(walk, it):
            return it

        @device
        def kind_at(walk, kt):
            return int32(2)

        return count, tile_at, kind_at

    @device
    def count_visited(walk, n):
        mods, b, h, qt, Nq = walk
        return stage.loop_keys(mods, b, h, qt, n * Bc, Bc) // Bc

    @device
    def visited_at(walk, it):
        mods, b, h, qt, Nq = walk
        return stage.tile_start(mods, b, h, qt, it * Bc, Bc) // Bc

    @device
    def kind_from_map(walk, kt):
        mods, b, h, qt, Nq = walk
        return stage.tile_kind(mods, b, h, qt, kt)

    return count_visited, visited_at, kind_from_map
