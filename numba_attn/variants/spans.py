"""The keys a decode block visits under a mask function: per (sequence, KV head), the span [first, end) of the
key tiles that any of its query heads sees, from the block mask of all the step's query rows (one query tile).

A decode step's few query rows read a long cache; a sliding window, a prefix or a padded batch leaves most of
it hidden. The split-K decode kernels divide the span among their splits instead of the whole cache
(:func:`split_range`): a window of W keys over a cache of N costs about W/N of the plain step, and the
splits stay balanced. Inside the span the mask function still decides key by key, so a tile size only changes
how much is visited, never the result.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from numba_attn.gpu.jit import device, kernel
from numba_attn.variants.blockmask import EMPTY, device_arrays
from numba_attn.variants.launching import KernelMods

SPAN_TILE = 64  # keys per tile of the block mask a span is read from


@kernel
def _spans_kernel(kinds, spans, Hkv, G, Bc, Nk):
    i = cuda.grid(1)
    if i >= spans.shape[0]:
        return
    b = i // Hkv
    kh = i - b * Hkv
    Bm, Hm, NQ, NK = kinds.shape
    first = NK
    last = -1
    for g in range(G):
        h = kh * G + g
        for qt in range(NQ):
            for kt in range(NK):
                if kinds[min(b, Bm - 1), min(h, Hm - 1), qt, kt] != 0:
                    first = min(first, kt)
                    last = max(last, kt)
    spans[i, 0] = first * Bc if last >= 0 else 0
    spans[i, 1] = min(Nk, (last + 1) * Bc) if last >= 0 else 0


def key_spans(block_mask, batch: int, kv_heads: int, group: int, stream=0):
    """int32 (batch·kv_heads, 2): the [first, end) keys that the ``group`` query heads of each KV head see in
    ``block_mask`` (kinds of shape (batch or 1, heads or 1, query tiles, key tiles)); [0, 0) where none is seen.
    On the device for a device block mask, else on the host."""
    kinds, Bc, Nk = block_mask.kinds, block_mask.Bc, block_mask.kv_len
    if not hasattr(kinds, "copy_to_host"):
        return host_key_spans(np.asarray(kinds), batch, kv_heads, group, Bc, Nk)
    spans = cuda.device_array((batch * kv_heads, 2), np.int32, stream=stream)
    n = batch * kv_heads
    if n:
        _spans_kernel[(n + 127) // 128, 128, stream](kinds, spans, kv_heads, group, Bc, Nk)
    return spans


def host_key_spans(kinds: np.ndarray, batch: int, kv_heads: int, group: int, Bc: int, Nk: int) -> np.ndarray:
    """:func:`key_spans` of a host kinds map (the same spans)."""
    spans = np.zeros((batch * kv_heads, 2), np.int32)
    Bm, Hm = kinds.shape[:2]
    for b in range(batch):
        for kh in range(kv_heads):
            seen = np.zeros(kinds.shape[3], bool)
            for g in range(group):
                seen |= (kinds[min(b, Bm - 1), min(kh * group + g, Hm - 1)] != EMPTY).any(axis=0)
            tiles = np.flatnonzero(seen)
            if tiles.size:
                spans[b * kv_heads + kh] = tiles[0] * Bc, min(Nk, (tiles[-1] + 1) * Bc)
    return spans


@device
def whole_range(mods, kvh, split, S, chunk, Nk):
    """The keys [lo, hi) of split ``split`` of ``chunk`` keys each: plain attention, every key."""
    lo = split * chunk
    return lo, min(Nk, lo + chunk)


@functools.cache
def split_range(masked: bool, after: int = 0):
    """``keys(mods, kvh, split, S, chunk, Nk) -> (lo, hi)`` of a split-K decode kernel. Plain attention: split
    ``split`` of ``chunk`` keys each, every key. With a mask function: ceil(span / S) keys each (a multiple of
    8) of the span that KV head ``kvh`` sees, [x, x) for a split past its end; the spans are the array of
    ``mods`` before its last ``after`` (the log-sum-exp's: 1)."""
    if not masked:
        return whole_range
    SPANS = -1 - after  # a constant index: mods may hold arrays of several types

    @device
    def span_range(mods, kvh, split, S, chunk, Nk):
        spans = mods[SPANS]
        a = spans[kvh, 0]
        e = spans[kvh, 1]
        per = ((e - a + S - 1) // S + 7) // 8 * 8
        lo = min(e, a + split * per)
        return lo, min(e, lo + per)

    return span_range


class SpanMods(KernelMods):
    """The ``mods`` of a decode launch: the variant's arrays, then (with a mask function) the key spans of its
    block mask over the step's query rows (one query tile of ``q_len`` rows, :data:`SPAN_TILE`-key tiles)."""

    def __init__(self, problem):
        super().__init__(problem, problem.q_len, SPAN_TILE)

    def _make(self, aux, block_mask, stream) -> tuple:
        arrays = device_arrays(aux, stream)
        if not self.variant.has_mask:
            return arrays
        p = self.problem
        bm = block_mask.at(self.Br, self.Bc) if block_mask is not None else self.block_mask(arrays, stream)
        return arrays + device_arrays((key_spans(bm, p.batch, p.kv_heads, p.group, stream),), stream)


def stage_split_range(stage):
    """:func:`split_range` of a kernel compiled for ``stage`` (a variant's, maybe writing the log-sum-exp)."""
    from numba_attn.variants.sinks import lse_parts
    from numba_attn.variants.stages import PLAIN

    return split_range(stage.tile_kind is not PLAIN.tile_kind, 1 if lse_parts(stage)[0] else 0)
