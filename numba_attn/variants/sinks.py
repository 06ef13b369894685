"""The log-sum-exp a phase writes (``attention(return_lse=True)``) and attention sinks (gpt-oss, transformers'
``s_aux``): per-head sink logits applied after a phase from that log-sum-exp.

The log-sum-exp is a compile-time part of a kernel's variant stage (:mod:`numba_attn.variants.stages`):
:func:`stages_for` gives the phase's stage for a problem, and for a problem that asks for the log-sum-exp
(:func:`lse_problem`) the same stage with ``lse`` True, whose ``store_lse(mods, bh, i, m, l)`` (natural units)
and ``store_lse2`` (base 2) write ``lse[bh, i]`` (-inf for a row that saw no key) to the last array of the
kernel's ``mods`` (:func:`with_lse`). A plain call's stage has no store: its kernels compile as before.

A sink is one more key in every row's softmax, of score ``sinks[h]`` (natural units) and value 0. It changes
no probability ratio between the real keys, so the output of plain softmax over the keys is only scaled::

    out = out_keys · Σ exp(s) / (Σ exp(s) + exp(sink)) = out_keys / (1 + exp(sink - lse))

with ``lse`` the row's log-sum-exp over its keys, which the phase writes (``attention(return_lse=True)``).
A row that sees no key (``lse`` -inf) gives 0. :func:`apply_sinks` launches that factor, one block per row.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint16, uint32

from numba_attn.gpu.convert import pack_bf16x2, u32_as_f32
from numba_attn.gpu.jit import device, kernel
from numba_attn.variants.stages import LN2, PLAIN, SEEN_NOTHING, Stages, block_mask_readers, stages_of

NEG_INF = float32(-math.inf)


# -- the log-sum-exp stage ----------------------------------------------------------------------------


@device
def _no_store(mods, bh, i, m, l):
    pass


@device
def _store_lse(mods, bh, i, m, l):
    lse = mods[-1]
    lse[bh, i] = m + math.log(l) if m > SEEN_NOTHING and l > float32(0.0) else NEG_INF


@device
def _store_lse2(mods, bh, i, m, l):
    lse = mods[-1]
    lse[bh, i] = (m + math.log2(l)) * LN2 if m > SEEN_NOTHING and l > float32(0.0) else NEG_INF


class LseStages(Stages):
    """A stage that also writes the log-sum-exp; compared by identity of type too (a plain stage with the same
    functions is another kernel)."""

    __slots__ = ()
    lse = True

    def __eq__(self, other):
        return type(other) is LseStages and tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((LseStages, tuple(self)))


class _LseProblems:
    """The subclass of each problem class that asks for the log-sum-exp (``problem.lse`` True)."""

    @staticmethod
    @functools.cache
    def of(cls):
        return type(cls.__name__, (cls,), {"__slots__": (), "lse": True, "__module__": cls.__module__})


def lse_problem(problem):
    """``problem`` asking for the log-sum-exp: phases registered without ``lse=True`` refuse it."""
    import dataclasses

    return problem if wants_lse(problem) else _LseProblems.of(type(problem))(
        **{f.name: getattr(problem, f.name) for f in dataclasses.fields(problem) if f.init})


def wants_lse(problem) -> bool:
    return bool(getattr(problem, "lse", False))


@functools.cache
def lse_stages(base: Stages) -> LseStages:
    """``base`` (a plain or variant stage) that also writes the log-sum-exp."""
    masked = base.tile_kind is not PLAIN.tile_kind
    if masked:  # the block mask's arrays one place further from the end of ``mods`` (the lse array is last)
        keys, start, kind = block_mask_readers(after=1)
        base = base._replace(loop_keys=keys, tile_start=start, tile_kind=kind)
    return LseStages(*base)


def stages_for(problem) -> Stages:
    """The stage of a phase's kernels for ``problem``: its variant's, with the log-sum-exp store when asked."""
    base = stages_of(getattr(problem, "variant", None))
    return lse_stages(base) if wants_lse(problem) else base


def lse_parts(stage):
    """``(LSE, store_lse, store_lse2)`` of a stage: whether it writes the log-sum-exp, and its stores (no-ops
    for a stage that does not)."""
    if isinstance(stage, LseStages):
        return True, _store_lse, _store_lse2
    return False, _no_store, _no_store


def with_lse(mods: tuple, lse) -> tuple:
    """A kernel's ``mods`` with the log-sum-exp array last (``lse`` None: ``mods`` as they are)."""
    return mods if lse is None else tuple(mods) + (lse,)


# -- sinks ------------------------------------------------------------------------------------------------


@functools.cache
def make_sink_kernel(BF16: bool):
    """``sink_scale(o, lse, sinks, H, Nq)``: ``o[bh, i, :] *= 1 / (1 + exp(sinks[bh % H] - lse[bh, i]))`` in place;
    one block per row (bh, i), one thread per column (blocks of ``blockDim.x`` columns). ``BF16``: ``o`` holds
    bfloat16 bit patterns (uint16), rounded to nearest even."""

    @kernel
    def sink_scale(o, lse, sinks, H, Nq):
        row = cuda.blockIdx.x
        bh = row // Nq
        i = row - bh * Nq
        x = lse[bh, i]
        factor = float32(0.0)
        if x > float32(-math.inf):
            factor = float32(1.0) / (float32(1.0) + math.exp(float32(sinks[bh % H]) - x))
        for d in range(cuda.threadIdx.x, o.shape[2], cuda.blockDim.x):
            if BF16:
                y = u32_as_f32(uint32(o[bh, i, d]) << uint32(16)) * factor
                o[bh, i, d] = uint16(pack_bf16x2(y, float32(0.0)) & uint32(0xFFFF))
            else:
                o[bh, i, d] = float32(o[bh, i, d]) * factor

    return sink_scale


def check_sinks(sinks, heads: int):
    """``sinks`` as a float32 host array of shape (heads,) (NumPy, a tensor, a numba device array or a list);
    else a ValueError naming the problem."""
    from numba_attn.array_kinds import host_array

    if hasattr(sinks, "detach"):  # a tensor (any float dtype, any device)
        sinks = sinks.detach().float().cpu().numpy()
    arr = np.asarray(host_array(sinks) if not isinstance(sinks, (list, tuple)) else sinks, dtype=np.float32)
    if arr.shape != (heads,):
        raise ValueError(f"sinks must have shape (heads,) = ({heads},); got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("sinks must be finite")
    return arr


def apply_sinks(o, lse, sinks, heads: int, stream=0, bf16: bool = False) -> None:
    """Scale ``o`` (B·H, Nq, D) in place by each row's sink factor from ``lse`` (B·H, Nq) and ``sinks`` (H,)
    (device arrays, or a host array for ``sinks``)."""
    n_rows, Nq, D = o.shape
    if n_rows * Nq == 0:
        return
    if isinstance(sinks, np.ndarray):
        sinks = cuda.to_device(np.ascontiguousarray(sinks, dtype=np.float32), stream=stream)
    threads = min(256, max(32, (D + 31) // 32 * 32))
    make_sink_kernel(bool(bf16))[n_rows * Nq, threads, stream](o, lse, sinks, heads, Nq)
