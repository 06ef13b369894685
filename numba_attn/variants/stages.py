"""The variant stage a kernel composes: four device functions, trivial for plain attention.

``stages_of(variant)`` gives

* ``tile_kind(mods, b, h, q_tile, k_tile)`` -> EMPTY / PARTIAL / FULL from the block mask (always FULL
  without a mask function: a kernel then visits the tiles it always did);
* ``visible(b, h, q_idx, kv_idx, mods)`` -> bool (always True without a mask function);
* ``modified(s, b, h, q_idx, kv_idx, mods)`` -> the score after the score function (``s`` without one);
* ``inverse_l(l)`` -> ``1 / l``, and 0 for a row that saw no key (a variant's convention; plain attention
  keeps ``1 / l``).

Kernels call all four unconditionally; for ``variant=None`` they inline to nothing, so a plain kernel
compiles to the code it had before (the ``mods`` argument is then an empty tuple, which has no
parameters). The block mask's kinds are the last element of ``mods``, after the functions' arrays.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from numba import float32, int32

from numba_attn.gpu.jit import device
from numba_attn.variants.blockmask import EMPTY, FULL, PARTIAL  # noqa: F401 (re-exported for kernels)


class Stages(NamedTuple):
    tile_kind: object
    visible: object
    modified: object
    inverse_l: object
    active: bool


@device
def _full(mods, b, h, q_tile, k_tile):
    return int32(2)


@device
def _kind_from_map(mods, b, h, q_tile, k_tile):
    kinds = mods[-1]
    return int32(kinds[min(b, kinds.shape[0] - 1), min(h, kinds.shape[1] - 1), q_tile, k_tile])


@device
def _all_visible(b, h, q_idx, kv_idx, mods):
    return True


@device
def _same(s, b, h, q_idx, kv_idx, mods):
    return s


@device
def _inverse(l):
    return float32(1.0) / l


@device
def _inverse_or_zero(l):
    return float32(1.0) / l if l > float32(0.0) else float32(0.0)


PLAIN = Stages(_full, _all_visible, _same, _inverse, False)


def stages_of(variant) -> Stages:
    if variant is None:
        return PLAIN
    return _stages(variant.signature(), len(variant.mask.aux) if variant.mask else 0)


@functools.cache
def _stages(signature, mask_arrays: int) -> Stages:
    from numba_attn.variants.mods import score_stage, visible_stage

    mask_sig, score_sig = signature
    return Stages(_kind_from_map if mask_sig is not None else _full,
                  visible_stage(mask_sig) if mask_sig is not None else _all_visible,
                  score_stage(score_sig, mask_arrays) if score_sig is not None else _same,
                  _inverse_or_zero, True)
