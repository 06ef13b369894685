"""Block masks: which (Br query rows × Bc keys) tiles a mask leaves empty, partial or full.

A kernel walking key tiles skips an EMPTY tile, applies no mask function on a FULL one and calls it per
score only on a PARTIAL one. Beside the kinds, each row of query tiles has the list of its visited key
tiles in order (``counts``, ``indices``: FlexAttention's ``kv_num_blocks``/``kv_indices``), so a loop that
prefetches its next tile walks the list instead of the grid. :func:`create_block_mask` evaluates the mask
on the device, every element of every tile once (one block a tile); :func:`host_block_mask` is its exact
twin on the host for tests and pictures. A mask that does not depend on the batch or the head is computed
once for all of them (``batch=None``, ``heads=None``): kernels index the map with ``min(b, dim - 1)``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda, int32, int8

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel
from numba_attn.variants.grid import HostVariant
from numba_attn.variants.mods import Mod, Variant, as_mod

EMPTY, PARTIAL, FULL = 0, 1, 2
KIND_NAMES = {EMPTY: "empty", PARTIAL: "partial", FULL: "full"}
THREADS = 32 if IS_SIMULATOR else 128  # threads a tile (each strides over the tile's elements)


@dataclass(frozen=True, eq=False)
class BlockMask:
    """``kinds``: int8 (batches, heads, q tiles, key tiles), a batch or head dimension of 1 shared by all;
    ``counts`` int32 (batches, heads, q tiles): the key tiles a row of query tiles visits; ``indices`` int32
    (batches, heads, q tiles, key tiles): those tiles first, in order. On the device (numba arrays) or the
    host (NumPy) alike."""

    kinds: object
    Br: int
    Bc: int
    q_len: int
    kv_len: int
    counts: object = None
    indices: object = None

    def __post_init__(self):
        if self.counts is None:
            if hasattr(self.kinds, "copy_to_host"):
                counts, indices = device_tile_lists(self.kinds)
            else:
                counts, indices = tile_lists(np.asarray(self.kinds))
            object.__setattr__(self, "counts", counts)
            object.__setattr__(self, "indices", indices)

    @property
    def shape(self):
        return tuple(self.kinds.shape)

    def host(self) -> np.ndarray:
        k = self.kinds
        return k.copy_to_host() if hasattr(k, "copy_to_host") else np.asarray(k)

    def tally(self) -> dict:
        """How many tiles of each kind (over all batches and heads stored)."""
        h = self.host()
        return {KIND_NAMES[k]: int((h == k).sum()) for k in (EMPTY, PARTIAL, FULL)}

    def density(self) -> float:
        """The share of tiles a kernel visits (partial or full)."""
        h = self.host()
        return float((h != EMPTY).mean()) if h.size else 0.0

    def at(self, Br: int, Bc: int) -> "BlockMask":
        """The same mask at a kernel's tile size, where one divides the other on each axis: a coarser tile
        is empty/full when all its parts are, a finer tile takes the kind of the tile it lies in."""
        if (Br, Bc) == (self.Br, self.Bc):
            return self
        h = self.host()
        h = _regrid(h, self.Br, Br, self.q_len, axis=2)
        h = _regrid(h, self.Bc, Bc, self.kv_len, axis=3)
        kinds = cuda.to_device(h) if hasattr(self.kinds, "copy_to_host") else h
        return BlockMask(kinds, Br, Bc, self.q_len, self.kv_len)

    def __repr__(self):
        c = self.tally()
        return (f"BlockMask({'×'.join(map(str, self.shape))} tiles of {self.Br}×{self.Bc}, "
                f"{c['full']} full, {c['partial']} partial, {c['empty']} empty; density {self.density():.3f})")


def tile_lists(kinds: np.ndarray):
    """``(counts, indices)`` of a host kinds map: per row of query tiles, how many key tiles are not empty,
    and their indices first (in order), the rest after."""
    visited = kinds != EMPTY
    counts = visited.sum(-1).astype(np.int32)
    indices = np.argsort(~visited, axis=-1, kind="stable").astype(np.int32)
    return counts, indices


@functools.cache
def _lists_kernel(columns: bool):
    """One thread per row of query tiles (``columns``: per column of key tiles) listing the tiles it visits."""

    @kernel
    def lists(kinds, counts, indices):
        line = cuda.grid(1)
        B, H, NQ, NK = kinds.shape
        N, M = (NK, NQ) if columns else (NQ, NK)  # lines, the tiles along a line
        if line >= B * H * N:
            return
        b = line // (H * N)
        h = (line // N) % H
        a = line % N
        n = 0
        for x in range(M):
            if (kinds[b, h, x, a] if columns else kinds[b, h, a, x]) != 0:
                indices[b, h, a, n] = x
                n += 1
        counts[b, h, a] = n
        for x in range(M):  # the empty tiles after, as the host twin orders them
            if (kinds[b, h, x, a] if columns else kinds[b, h, a, x]) == 0:
                indices[b, h, a, n] = x
                n += 1

    return lists


def _device_lists(kinds, columns: bool, stream=0):
    B, H, NQ, NK = kinds.shape
    N, M = (NK, NQ) if columns else (NQ, NK)
    counts = cuda.device_array((B, H, N), np.int32, stream=stream)
    indices = cuda.device_array((B, H, N, M), np.int32, stream=stream)
    if B * H * N:
        _lists_kernel(columns)[(B * H * N + 127) // 128, 128, stream](kinds, counts, indices)
    return counts, indices


def device_tile_lists(kinds, stream=0):
    """:func:`tile_lists` on the device, one thread per row of query tiles."""
    return _device_lists(kinds, False, stream)


def column_lists(kinds: np.ndarray):
    """``(counts, indices)`` per column of key tiles (FlexAttention's ``q_num_blocks``/``q_indices``): how many
    query tiles visit the key tile, and their indices first, in order. Shapes (B, H, key tiles) and (B, H, key
    tiles, query tiles): a kernel walking query tiles for its key tile reads them as the row lists are read."""
    return tile_lists(np.ascontiguousarray(np.swapaxes(kinds, 2, 3)))


def device_column_lists(kinds, stream=0):
    """:func:`column_lists` on the device, one thread per column of key tiles."""
    return _device_lists(kinds, True, stream)


def _regrid(h: np.ndarray, have: int, want: int, n: int, axis: int) -> np.ndarray:
    tiles = -(-n // want)
    if want % have == 0:  # coarser: combine want/have tiles
        f = want // have
        pad = tiles * f - h.shape[axis]
        if pad > 0:
            widths = [(0, 0)] * 4
            widths[axis] = (0, pad)
            h = np.pad(h, widths, constant_values=-1)  # beyond the end: no opinion
        h = np.moveaxis(h, axis, -1)
        h = h.reshape(*h.shape[:-1], tiles, f)
        real = h >= 0
        any_seen = ((h != EMPTY) & real).any(-1)
        all_full = ((h == FULL) | ~real).all(-1)
        out = np.where(all_full, FULL, np.where(any_seen, PARTIAL, EMPTY)).astype(np.int8)
        return np.moveaxis(out, -1, axis)
    if have % want == 0:  # finer: repeat
        f = have // want
        return np.take(np.repeat(h, f, axis=axis), np.arange(tiles), axis=axis)
    raise ValueError(f"block mask tiles of {have} and a kernel's {want} do not divide one another; "
                     f"create the block mask with the kernel's tile size")


@functools.cache
def _kinds_kernel(visible, causal: bool):
    @kernel
    def block_kinds(kinds, Br, Bc, Nq, Nk, H_m, mods):
        kt = cuda.blockIdx.x
        qt = cuda.blockIdx.y
        bh = cuda.blockIdx.z
        b = bh // H_m
        h = bh % H_m
        seen = cuda.shared.array(2, int32)  # [visible elements, in-range elements]
        tid = cuda.threadIdx.x
        if tid < 2:
            seen[tid] = 0
        cuda.syncthreads()
        n_vis = 0
        n_all = 0
        for e in range(tid, Br * Bc, cuda.blockDim.x):
            i = qt * Br + e // Bc
            j = kt * Bc + e % Bc
            if i < Nq and j < Nk:
                q_idx = i + Nk - Nq
                n_all += 1
                if (not causal or j <= q_idx) and visible(b, h, q_idx, j, mods):
                    n_vis += 1
        cuda.atomic.add(seen, 0, n_vis)
        cuda.atomic.add(seen, 1, n_all)
        cuda.syncthreads()
        if tid == 0:
            kinds[b, h, qt, kt] = int8(2) if seen[0] == seen[1] else (int8(0) if seen[0] == 0 else int8(1))

    return block_kinds


def _mask_variant(mask_mod, aux) -> Variant:
    mod = as_mod(mask_mod, "mask", aux)
    return Variant(mod, None)


def create_block_mask(mask_mod, batch: int | None, heads: int | None, q_len: int, kv_len: int, *,
                      Br: int = 128, Bc: int = 128, aux=(), causal: bool = False, stream=0) -> BlockMask:
    """The tile map of ``mask_mod`` (a function or a built-in :class:`Mod`), computed on the device.
    ``batch``/``heads`` None: the mask depends on neither (one map for all). ``aux``: the arrays a plain
    function reads (device arrays, or host arrays copied once). ``causal``: AND the project's causal mask."""
    variant = _mask_variant(mask_mod, aux)
    Bm, Hm = batch or 1, heads or 1
    nqt, nkt = -(-q_len // Br), -(-kv_len // Bc)
    kinds = cuda.device_array((Bm, Hm, nqt, nkt), np.int8, stream=stream)
    mods = device_arrays(variant.aux, stream)
    kern = _kinds_kernel(variant.device_visible(), bool(causal))
    if nqt and nkt:
        kern[(nkt, nqt, Bm * Hm), THREADS, stream](kinds, Br, Bc, q_len, kv_len, Hm, mods)
    return BlockMask(kinds, Br, Bc, q_len, kv_len)


def device_arrays(aux, stream=0) -> tuple:
    """``aux`` as kernel arguments: device arrays and CUDA tensors as they are, host arrays copied."""
    out = []
    for a in aux:
        if hasattr(a, "copy_to_host") or (hasattr(a, "__cuda_array_interface__") and not hasattr(a, "detach")):
            out.append(a)
        elif hasattr(a, "detach"):
            out.append(a.detach() if a.is_cuda else cuda.to_device(a.detach().numpy(), stream=stream))
        else:
            out.append(cuda.to_device(np.ascontiguousarray(a), stream=stream))
    return tuple(out)


def host_block_mask(mask_mod, batch: int | None, heads: int | None, q_len: int, kv_len: int, *,
                    Br: int = 128, Bc: int = 128, aux=(), causal: bool = False) -> BlockMask:
    """:func:`create_block_mask` on the host (the same kinds), from the whole mask of each (batch, head)."""
    host = HostVariant(_mask_variant(mask_mod, aux))
    Bm, Hm = batch or 1, heads or 1
    nqt, nkt = -(-q_len // Br), -(-kv_len // Bc)
    kinds = np.zeros((Bm, Hm, nqt, nkt), np.int8)
    hidden = (np.arange(kv_len)[None, :] > np.arange(q_len)[:, None] + (kv_len - q_len)) if causal else None
    for b in range(Bm):
        for h in range(Hm):
            seen = host.visible(b, h, q_len, kv_len)
            if hidden is not None:
                seen = seen & ~hidden
            for qt in range(nqt):
                for kt in range(nkt):
                    t = seen[qt * Br:(qt + 1) * Br, kt * Bc:(kt + 1) * Bc]
                    kinds[b, h, qt, kt] = FULL if t.all() else (PARTIAL if t.any() else EMPTY)
    return BlockMask(kinds, Br, Bc, q_len, kv_len)


def draw_block_mask(block_mask: BlockMask, b: int = 0, h: int = 0, *, ax=None, path=None, title=None):
    """A picture of the tile map of one (batch, head): empty tiles white, partial ones light, full ones
    dark, one square per tile, queries down and keys across. Saves to ``path`` when given; returns the
    axes."""
    import matplotlib

    if ax is None and path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    h_ = block_mask.host()
    tile = h_[min(b, h_.shape[0] - 1), min(h, h_.shape[1] - 1)]
    colors = ["#ffffff", "#9ecae1", "#08519c"]
    if ax is None:
        nq, nk = tile.shape
        w = min(9.0, max(4.5, 0.25 * nk + 2.5))
        fig, ax = plt.subplots(figsize=(w, min(9.0, max(2.5, w * nq / max(nk, 1)))), dpi=120)
    ax.imshow(tile, cmap=ListedColormap(colors), vmin=0, vmax=2, interpolation="nearest", aspect="equal")
    ax.set_xlabel(f"key tile (Bc = {block_mask.Bc})")
    ax.set_ylabel(f"query tile (Br = {block_mask.Br})")
    c = {k: int((tile == v).sum()) for k, v in (("full", FULL), ("partial", PARTIAL), ("empty", EMPTY))}
    ax.set_title(title or f"block mask, b={b} h={h}\n{c['full']} full, {c['partial']} partial, "
                          f"{c['empty']} empty tiles", fontsize=9)
    ax.legend(handles=[Patch(facecolor=colors[k], edgecolor="#888", label=KIND_NAMES[k]) for k in (2, 1, 0)],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if path is not None:
        ax.figure.tight_layout()
        ax.figure.savefig(path)
    return ax


__all__ = ["BlockMask", "create_block_mask", "host_block_mask", "draw_block_mask", "EMPTY", "PARTIAL", "FULL",
           "Mod"]
