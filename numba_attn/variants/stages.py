"""The variant stage a kernel composes: device functions that are trivial for plain attention.

``stages_of(variant)`` gives, for a kernel walking key tiles of ``Bc`` keys for its query tile ``qt``:

* ``loop_keys(mods, b, h, qt, keys, Bc)`` -> the keys its tile loop runs over: ``keys`` (what the kernel
  computed, e.g. the causal bound), or with a mask function ``Bc`` times the visited tiles of the block mask;
* ``tile_start(mods, b, h, qt, j, Bc)`` -> the first key of the loop's tile at ``j``: ``j`` itself, or the
  block mask's ``j // Bc``-th visited tile (empty tiles are never loaded);
* ``tile_kind(mods, b, h, qt, kt)`` -> EMPTY / PARTIAL / FULL (always FULL without a mask function);
* ``visible(b, h, q_idx, kv_idx, mods)`` -> bool (always True without a mask function);
* ``modified(s, b, h, q_idx, kv_idx, mods)`` -> the score after the score function (``s`` without one),
  in natural units (a kernel in base-2 units converts around it);
* ``inverse_l(m, l)`` -> ``1 / l``; with a variant 0 for a row that saw no key (``m`` still -inf or the
  finite MASKED sentinel);
* ``finite_max(m)`` -> ``m``; with a variant 0 for a row that saw no key (so that ``exp(s - m)`` is 0, not
  NaN, for a whole row of -inf scores).

Kernels call them unconditionally; for ``variant=None`` they inline to what the kernel did before, so a
plain kernel compiles to the same code (its ``mods`` argument is an empty tuple, which has no parameters).
The kernels' ``mods``: the functions' arrays, then (with a mask function) the block mask's kinds, counts
and indices (:class:`~numba_attn.variants.launching.KernelMods`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import float32, int32

from numba_attn.gpu.jit import device
from numba_attn.variants.blockmask import EMPTY, FULL, PARTIAL  # noqa: F401 (re-exported for kernels)

LN2 = np.float32(0.6931471805599453)  # a base-2 score times LN2 is in natural units (what score functions see)
LOG2E = np.float32(1.4426950408889634)
SEEN_NOTHING = np.float32(-5e29)  # a running max at or below this: the row saw no key (-inf, or MASKED -1e30)


class Stages(NamedTuple):
    loop_keys: object
    tile_start: object
    tile_kind: object
    visible: object
    modified: object
    inverse_l: object
    finite_max: object
    active: bool
    scored: bool = False  # a score function (a mask-only variant leaves FULL tiles' scores as they are)


@device
def _keys(mods, b, h, qt, keys, Bc):
    return keys


@device
def _start(mods, b, h, qt, j, Bc):
    return j


@device
def _full(mods, b, h, qt, kt):
    return int32(2)


@functools.cache
def block_mask_readers(after: int = 0):
    """The block mask's readers ``(loop_keys, tile_start, tile_kind)`` of a kernel's ``mods``, whose last three
    arrays are the mask's (kinds, counts, indices) followed by ``after`` more (the log-sum-exp's: 1)."""
    KINDS, COUNTS, INDICES = -3 - after, -2 - after, -1 - after

    @device
    def listed_keys(mods, b, h, qt, keys, Bc):
        counts = mods[COUNTS]
        return counts[min(b, counts.shape[0] - 1), min(h, counts.shape[1] - 1), qt] * Bc

    @device
    def listed_start(mods, b, h, qt, j, Bc):
        indices = mods[INDICES]
        return indices[min(b, indices.shape[0] - 1), min(h, indices.shape[1] - 1), qt, j // Bc] * Bc

    @device
    def kind_from_map(mods, b, h, qt, kt):
        kinds = mods[KINDS]
        return int32(kinds[min(b, kinds.shape[0] - 1), min(h, kinds.shape[1] - 1), qt, kt])

    return listed_keys, listed_start, kind_from_map


_listed_keys, _listed_start, _kind_from_map = block_mask_readers()


@device
def _partial(mods, b, h, qt, kt):
    return int32(1)


@device
def _all_visible(b, h, q_idx, kv_idx, mods):
    return True


@device
def _same(s, b, h, q_idx, kv_idx, mods):
    return s


@device
def _inverse(m, l):
    return float32(1.0) / l


@device
def _inverse_or_zero(m, l):
    return float32(1.0) / l if m > SEEN_NOTHING and l > float32(0.0) else float32(0.0)


@device
def _max(m):
    return m


@device
def _finite_max(m):
    return m if m > SEEN_NOTHING else float32(0.0)


PLAIN = Stages(_keys, _start, _full, _all_visible, _same, _inverse, _max, False)


def stages_of(variant, listed: bool = True) -> Stages:
    """The stage of ``variant`` (PLAIN for None). ``listed`` False: a kernel without a block mask (the varlen
    phases, whose sequences each have their own positions): every key tile up to the kernel's bound is visited
    and PARTIAL (the mask function on every score); ``mods`` holds only the functions' arrays."""
    if variant is None:
        return PLAIN
    return _stages(variant.signature(), len(variant.mask.aux) if variant.mask else 0, listed)


@functools.cache
def _stages(signature, mask_arrays: int, listed: bool = True) -> Stages:
    from numba_attn.variants.mods import score_stage, visible_stage

    mask_sig, score_sig = signature
    masked = mask_sig is not None
    lists = masked and listed
    return Stages(_listed_keys if lists else _keys, _listed_start if lists else _start,
                  (_kind_from_map if listed else _partial) if masked else _full,
                  visible_stage(mask_sig) if masked else _all_visible,
                  score_stage(score_sig, mask_arrays) if score_sig is not None else _same,
                  _inverse_or_zero, _finite_max, True, score_sig is not None)
