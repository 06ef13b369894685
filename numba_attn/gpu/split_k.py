"""Split-K over the keys: the plan (how many splits, how many keys each) and the
kernel that combines the splits' partial outputs through their log-sum-exps.

Shared by every phase that splits the key range over blocks (the split-K
decode phases and ``split_k_prefill``). The combine's per-element device
function (``combine_splits``, ``combine_splits_fixed``) is in
:mod:`numba_attn.gpu.device_functions`.
"""
from __future__ import annotations

import functools
import math

from numba_attn.gpu.backend import IS_SIMULATOR  # first: chooses the backend before numba is imported

from numba import cuda, float32, uint16, uint32  # noqa: E402

from numba_attn.gpu.device_functions import (EMPTY_LSE_BELOW, NEG_BIG, combine_splits,  # noqa: E402
                                             combine_splits_fixed)
from numba_attn.gpu.intrinsics import pack_bf16x2  # noqa: E402
from numba_attn.gpu.jit import device, kernel  # noqa: E402
from numba_attn.gpu.pdl import grid_dependency_wait  # noqa: E402

SIMULATOR_SMS = 132  # stand-in for the SM count where there is no device to ask


def sm_count() -> int:
    if IS_SIMULATOR:
        return SIMULATOR_SMS
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:  # noqa: BLE001 - offline compilation has no device
        return SIMULATOR_SMS


BALANCE = 4  # a ragged batch's plan: a split's keys at most 1/BALANCE of the mean keys per block slot
# ... and at least this many keys per split: paged_split_k on a ragged B8 H32 batch of lengths up to 4k
# (H200, CUPTI): 16 splits of 256 keys 96.1 µs, 4 of 1024 73.5 µs, 2 of 2048 75.0 µs (a split's fixed cost
# against its keys); B8 up to 32k and B32 up to 4k planned alike with 256 and 1024 (495.1 and 495.3 µs,
# 307.0 and 306.5 µs). results/archive/2026-11-23-gpu-checks-de/min-keys.txt
RAGGED_MIN_KEYS = 1024
RAGGED_MIN_SPLITS = 4  # ... unless the longest sequence would then have fewer splits than this


def split_plan(n_blocks: int, kv_len: int, keys_per_round: int, sms: int, blocks_per_sm: int,
               min_keys: int, splits: int = 0, mean_len: float = 0):
    """(S, chunk): the number of KV splits and the keys per split.

    ``n_blocks`` blocks exist without splitting; S is the largest count whose
    ``S × n_blocks`` blocks still fit the ``sms × blocks_per_sm`` block slots
    at once (a second, partial wave would leave most SMs idle at the end),
    with at least ``min_keys`` keys per split (``splits`` > 0 forces S). ``chunk`` is rounded up to whole
    ``keys_per_round``, so the last splits may be shorter or empty.

    ``mean_len``: the sequences of the batch have unequal lengths, ``mean_len`` keys
    on average, at most ``kv_len`` (0, or ``kv_len``: every block has ``kv_len``
    keys, the plan above). Split ``s`` of every sequence covers keys
    ``[s·chunk, (s+1)·chunk)``, so one wave with a split count for the longest
    sequence leaves the blocks of the long sequences running alone at the end.
    The ragged plan sizes the splits from the total work instead: ``mean_len × n_blocks``
    keys over the block slots, each split at most 1/``BALANCE`` of a slot's share
    (at least ``min_keys``, and ``RAGGED_MIN_KEYS`` where the longest sequence still gets
    ``RAGGED_MIN_SPLITS`` splits), so the non-empty (sequence, split) blocks are small
    against a slot's share and even out over several waves (a split past a
    sequence's end exits at once). S is rounded up to a power of two (a kernel
    compiled for its split count is compiled for few counts), capped by ``min_keys``
    as above, and never below the one-wave S.
    """
    if splits > 0:
        S = splits
    else:
        cap = -(-kv_len // max(1, min_keys))
        S = max(1, min(sms * blocks_per_sm // n_blocks, cap))
        if 0 < mean_len < kv_len:
            share = mean_len * n_blocks / (sms * blocks_per_sm)  # keys per block slot
            floor = min(RAGGED_MIN_KEYS, kv_len // RAGGED_MIN_SPLITS)  # the longest still split
            ragged = -(-kv_len // max(1, min_keys, floor, int(share / BALANCE)))
            S = max(S, min(1 << (ragged - 1).bit_length(), cap))
    chunk = -(-kv_len // S)
    chunk = -(-chunk // keys_per_round) * keys_per_round
    return S, chunk


@functools.cache
def make_combine_kernel(Nq: int, WAIT: bool = False, NS: int = 0, BF16: bool = False):
    """The combine kernel; with ``WAIT`` it first waits for the grid it was launched
    after (``numba_attn.gpu.pdl``: launched while the split kernel still runs); with
    ``NS`` > 0 the split count is that compile-time constant (``combine_splits_fixed``:
    all loads in flight at once) and the ``S`` argument must equal it. ``BF16``: ``o``
    holds bfloat16 bit patterns (uint16), rounded to nearest even."""
    fixed = combine_splits_fixed(max(NS, 1))  # typed even where NS = 0 leaves it unused

    @kernel
    def combine(part_o, part_lse, o, S):
        """o[bh, i, d] from the S partial outputs of row bh·Nq + i; one thread per d."""
        if WAIT:
            grid_dependency_wait()  # the split kernel has completed, its partials are visible
        row = cuda.blockIdx.x
        d = cuda.threadIdx.x
        bh = row // Nq
        if BF16:
            x = fixed(part_o, part_lse, row, d) if NS > 0 else combine_splits(part_o, part_lse, S, row, d)
            o[bh, row - bh * Nq, d] = uint16(pack_bf16x2(x, float32(0.0)) & uint32(0xFFFF))
        elif NS > 0:
            o[bh, row - bh * Nq, d] = fixed(part_o, part_lse, row, d)
        else:
            o[bh, row - bh * Nq, d] = combine_splits(part_o, part_lse, S, row, d)

    return combine


ROW_SAW_NOTHING = float32(-1e27)  # a combined log-sum-exp below this: no split saw a key of the row


@device
def combined_lse(part_lse, S, row):
    """``log Σ_s exp(part_lse[s, row])`` over the ``S`` splits that saw keys of ``row``; -inf where none did."""
    m = NEG_BIG
    for s in range(S):
        m = max(m, part_lse[s, row])
    total = float32(0.0)
    for s in range(S):
        x = part_lse[s, row]
        if x > EMPTY_LSE_BELOW:
            total += math.exp(x - m)
    return m + math.log(total) if m > ROW_SAW_NOTHING and total > float32(0.0) else float32(-math.inf)


@functools.cache
def make_combine_lse_kernel(Nq: int, BF16: bool = False):
    """The combine kernel that also writes each row's log-sum-exp, ``lse[bh, i] = log Σ_s exp(lse_s)`` over the
    splits that saw keys (-inf where none did): ``combine(part_o, part_lse, o, S, lse)``. ``BF16``: ``o`` holds
    bfloat16 bit patterns (uint16)."""

    @kernel
    def combine_lse(part_o, part_lse, o, S, lse):
        row = cuda.blockIdx.x
        d = cuda.threadIdx.x
        bh = row // Nq
        x = combine_splits(part_o, part_lse, S, row, d)
        if BF16:
            o[bh, row - bh * Nq, d] = uint16(pack_bf16x2(x, float32(0.0)) & uint32(0xFFFF))
        else:
            o[bh, row - bh * Nq, d] = x
        if d == 0:
            lse[bh, row - bh * Nq] = combined_lse(part_lse, S, row)

    return combine_lse
