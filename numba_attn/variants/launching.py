"""The ``mods`` tuple a phase's kernels receive for one problem: the variant's arrays on the device, then
(with a mask function) its block mask at the kernel's own tiles.

A :class:`KernelMods` is made once per (problem, tile size) when a phase builds its launch: the block mask
of the problem's own arrays is computed then (on the device; on the host in the simulator, where both are
the CPU). A call with other arrays (``attention(aux=...)``) passes them, with or without its own
``block_mask``; without one, the block mask is computed again for those arrays, except for the same
tensors at the same version as the previous call (a model's layers all pass one mask tensor) and NumPy arrays
(up to 1 MiB) of the same content as the previous call's.
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.variants.blockmask import (BlockMask, column_lists, create_block_mask, device_arrays,
                                          device_column_lists, host_block_mask)


SMALL_HOST_BYTES = 1 << 20  # NumPy aux arrays up to this size are compared by content between calls


class KernelMods:
    def __init__(self, problem, Br: int | None, Bc: int | None, columns: bool = False):
        """``columns``: the block mask's lists per column of key tiles (:func:`column_lists`: a kernel that walks
        query tiles for its key tile, as a backward's dK/dV kernel does) in place of the lists per row."""
        self.variant = getattr(problem, "variant", None)
        self.problem, self.Br, self.Bc, self.columns = problem, Br, Bc, columns
        self._default = None
        self._last = None  # (the tensors of the last call's aux, their versions, its mods)
        self._last_host = None  # (the content of the last call's NumPy aux, its mods)

    def block_mask(self, aux, stream=0) -> BlockMask:
        """The block mask of the variant's mask function over ``aux`` at (Br, Bc), causal folded in."""
        p, mask = self.problem, self.variant.mask
        batch = p.batch if "b" in mask.depends else None
        heads = p.heads if "h" in mask.depends else None
        mod = mask.with_aux(aux[:len(mask.aux)])
        if IS_SIMULATOR:
            return host_block_mask(mod, batch, heads, p.q_len, p.kv_len, Br=self.Br, Bc=self.Bc, causal=p.causal)
        return create_block_mask(mod, batch, heads, p.q_len, p.kv_len, Br=self.Br, Bc=self.Bc, causal=p.causal,
                                 stream=stream)

    def __call__(self, aux=None, block_mask: BlockMask | None = None, stream=0) -> tuple:
        """The kernels' ``mods``: ``()`` for plain attention; the problem's own arrays when ``aux`` is None."""
        if self.variant is None:
            return ()
        if aux is None and block_mask is None:
            if self._default is None:
                self._default = self._make(self.variant.aux, None, stream)
            return self._default
        aux = self.variant.aux if aux is None else tuple(aux)
        if block_mask is None and aux and all(type(a) is np.ndarray for a in aux) and \
                sum(a.nbytes for a in aux) <= SMALL_HOST_BYTES:  # small host arrays: kept per content
            content = tuple((a.shape, a.dtype.str, a.tobytes()) for a in aux)
            last = self._last_host
            if last is not None and last[0] == content:
                return last[1]
            mods = self._make(aux, None, stream)
            self._last_host = (content, mods)
            return mods
        if block_mask is None and aux and all(hasattr(a, "_version") for a in aux):  # tensors: kept per version
            versions = tuple(a._version for a in aux)
            last = self._last
            if last is not None and all(a is b for a, b in zip(last[0], aux)) and last[1] == versions:
                return last[2]
            mods = self._make(aux, None, stream)
            self._last = (aux, versions, mods)  # every layer of a model's forward passes the same mask tensor
            return mods
        return self._make(aux, block_mask, stream)

    def _make(self, aux, block_mask, stream) -> tuple:
        arrays = device_arrays(aux, stream)
        if not self.variant.has_mask or self.Br is None:  # no mask, or a kernel without tiles: no block mask
            return arrays
        bm = block_mask.at(self.Br, self.Bc) if block_mask is not None else self.block_mask(arrays, stream)
        if self.columns:
            lists = device_column_lists(bm.kinds, stream) if hasattr(bm.kinds, "copy_to_host") else \
                column_lists(np.asarray(bm.kinds))
            return arrays + device_arrays((bm.kinds, *lists), stream)
        return arrays + device_arrays((bm.kinds, bm.counts, bm.indices), stream)
