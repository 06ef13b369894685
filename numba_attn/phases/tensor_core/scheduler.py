"""Which rows a block of the tensor-core phases works on: its work items.

* one item per block (the default): query block ``blockIdx.x`` of head ``blockIdx.y``, batch ``blockIdx.z``, or
  counted from the last (:func:`query_block`: causal, the blocks with the most key tiles first);
* varlen: sequence ``blockIdx.z`` of a packed batch (:func:`varlen_spans`, :func:`varlen_views`; the host's
  :class:`VarlenLayout` gives the cu_seqlens);
* persistent: a block per SM walking items ``blockIdx.x``, then every ``gridDim.x``-th (:func:`first_item`,
  :func:`next_item`; query blocks counted from the last, the causal diagonal's longest first);
* the key tiles of an item (:func:`key_tiles`): every tile up to the causal bound, or with a variant's mask
  function the block mask's visited tiles in order, each with its kind (empty tiles are never loaded).
"""
from __future__ import annotations

import functools

from numba import cuda, int32

from numba_attn.gpu.intrinsics import rows_head_major
from numba_attn.gpu.jit import device
from numba_attn.variants.stages import PLAIN

__all__ = ["query_block", "varlen_spans", "varlen_views", "VarlenLayout", "first_item", "next_item", "key_tiles"]


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
def first_item(n_query_blocks):
    """persistent: this block's first work item (query block ``qb`` counted from the last, head-batch
    ``bh``): item ``blockIdx.x`` of the (B·H, n_query_blocks) items, qb fastest; no division."""
    qb = cuda.blockIdx.x
    bh = 0
    while qb >= n_query_blocks:
        qb -= n_query_blocks
        bh += 1
    return qb, bh


@device
def next_item(qb, bh, n_query_blocks):
    """persistent: the work item ``gridDim.x`` items after (qb, bh)."""
    qb += cuda.gridDim.x
    while qb >= n_query_blocks:
        qb -= n_query_blocks
        bh += 1
    return qb, bh


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
