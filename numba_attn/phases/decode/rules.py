"""The rules of the decode phases: the q_len limit, vector widths, rows, lanes and keys of a warp step, the split plans,
the ``supports`` checks and the ``resolve`` of the automatic parameters."""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT, smem_reason, swizzle_row_chunks
from numba_attn.gpu.split_k import sm_count, split_plan
from numba_attn.gpu.warp import WARP_SIZE

MAX_Q_LEN = 8  # query positions per sequence a decode kernel takes; longer is prefill


def vector_width(dtype: str) -> int:
    """Elements per 16-byte load: 4 float32 or 8 float16/bfloat16."""
    return {"float32": 4, "float16": 8, "bfloat16": 8}[dtype]


def kernel_words(problem, *arrays):
    """The arrays a kernel reads as uint32 words where it does (bfloat16: its 16-bit patterns
    are unpacked by shifts), else as they are."""
    if problem.dtype != "bfloat16":
        return arrays
    return tuple(view_as(a, np.uint32) for a in arrays)


def decode_rows(problem, rows: int) -> int:
    """Query rows per block: the group's ``G · q_len`` rows, at most ``rows``."""
    return max(1, min(problem.group * problem.q_len, rows))


def lanes_per_key(D: int, VW: int, RB: int, lanes: int = 0) -> int:
    """Lanes that share one key: a power of two dividing 32 and the row's
    chunks of VW elements, such that a lane holds E = D/L <= min(max(16, 2·VW),
    max(VW, 32/RB)) elements per row (``lanes`` > 0 forces it). VW = 16 (an 8-bit
    cache read 16 codes per load): 32 elements, half the lanes of VW = 8."""
    if lanes:
        return lanes
    target = max(16, 2 * VW)
    while target * RB > 32 and target > VW:
        target //= 2
    valid = [L for L in (1, 2, 4, 8, 16, 32) if (D // VW) % L == 0]
    for L in valid:
        if D // L <= target:
            return L
    return valid[-1]


def keys_per_group(D: int, L: int, RB: int, keys: int = 0) -> int:
    """Keys a lane group loads per step (all loads first, then one softmax
    update for the T keys): as many as fit ~96 registers of K, V, Q and the
    accumulator per lane, ``2·T·E + 2·RB·E <= 96`` (1 to 4; ``keys`` > 0
    forces it). More keys in flight per warp, but more registers per thread
    and so fewer resident warps."""
    if keys:
        return keys
    E = D // L
    return max(1, min(4, (96 - 2 * RB * E) // (2 * E)))


def resolve_chunked(problem, rows, lanes, keys, VW=0):
    """The automatic parameters of a warp-step decode kernel: ``rows`` clipped to
    the rows a KV head has, ``lanes`` (0: :func:`lanes_per_key`) and ``keys``
    (0: :func:`keys_per_group`); ``VW``: elements per load (0: the dtype's,
    :func:`vector_width`)."""
    RB = decode_rows(problem, rows)
    L = lanes_per_key(problem.head_dim, VW or vector_width(problem.dtype), RB, lanes)
    return {"rows": RB, "lanes": L, "keys": keys_per_group(problem.head_dim, L, RB, keys)}


def ragged_mean(problem) -> float:
    """The mean length of a paged problem's sequences when they differ (``split_plan``'s
    ``mean_len``: the ragged plan); 0 for a contiguous problem or one whose sequences all
    have one length (the one-wave plan). ``PagedProblem.mean_len`` when set (``decode_paged``:
    the call's lengths), else the mean of ``seqlens()`` (the runner's problems)."""
    if not getattr(problem, "page_size", 0):
        return 0
    if problem.mean_len:
        return problem.mean_len
    lens = problem.seqlens()
    return float(lens.mean()) if lens.size and lens.min() != lens.max() else 0


def resolve_splits(problem, keys_per_round, rows_per_block, blocks_per_sm, min_keys, splits, heads=1):
    """``splits`` (0: as many as fill the SMs' block slots in one wave, ``split_plan``; a paged
    problem with unequal lengths: the ragged plan, :func:`ragged_mean`); ``heads``: KV heads a block reads."""
    n_rc = -(-problem.group * problem.q_len // max(1, rows_per_block))
    S, _ = split_plan(problem.batch * problem.kv_heads * n_rc // heads, problem.kv_len, max(1, keys_per_round),
                      sm_count(), blocks_per_sm, min_keys, splits, mean_len=ragged_mean(problem))
    return S


def resolve_split(problem, warps, lanes, rows, keys, splits, blocks_per_sm, min_keys, VW=0, **_):
    """:func:`resolve_chunked` and the split count of a split-K phase (0: :func:`resolve_splits`);
    a split-K phase's ``resolve`` (other parameters pass through)."""
    p = resolve_chunked(problem, rows, lanes, keys, VW)
    kpr = warps * (WARP_SIZE // p["lanes"]) * p["keys"]
    return {**p, "splits": resolve_splits(problem, kpr, p["rows"], blocks_per_sm, min_keys, splits)}


def split_layout(problem, warps, rows, lanes, keys, splits):
    """(row blocks per KV head, keys per split): the split's keys rounded up to whole warp steps."""
    n_rc = (problem.group * problem.q_len + rows - 1) // rows
    _, chunk = split_plan(problem.batch * problem.kv_heads * n_rc, problem.kv_len, warps * (WARP_SIZE // lanes) * keys,
                          sm_count(), 1, 1, splits)  # (splits given: the SM count and limits play no part)
    return n_rc, chunk


def check_decode(problem, warps, lanes, rows, keys, max_warps=32, VW=0, **_):
    """The supports() rules shared by the decode phases (None when runnable); ``VW``:
    elements per load (0: the dtype's); other parameters play no part."""
    if problem.q_len > MAX_Q_LEN:
        return f"decode kernel: q_len {problem.q_len} > {MAX_Q_LEN} (use a prefill phase)"
    if problem.q_len < 1 or problem.kv_len < 1:
        return "decode kernel: needs q_len >= 1 and kv_len >= 1"
    D = problem.head_dim
    if VW == 16:
        if D % VW:
            return f"head_dim {D} is not a multiple of 16 (wide: a lane reads 16 codes of a row per load)"
    else:
        VW = vector_width(problem.dtype)
        if D % VW:
            return f"head_dim {D} is not a multiple of {VW} ({problem.dtype} rows must be whole 16-byte vectors)"
    if not 1 <= warps <= max_warps:
        return f"warps={warps} out of range 1..{max_warps}"
    RB = decode_rows(problem, rows)
    L = lanes_per_key(D, VW, RB, lanes)
    if L not in (1, 2, 4, 8, 16, 32) or (D // VW) % L:
        return f"lanes={L}: must be a power of two <= 32 dividing the {D // VW} vectors of a row"
    if not 1 <= keys_per_group(D, L, RB, keys) <= 16:
        return f"keys={keys}: 1..16 keys per lane group per step"
    smem = warps * RB * (D + 2) * 4
    if smem > STATIC_SMEM_LIMIT:
        return f"block merge needs {smem} B of shared memory (> 48 KiB); lower warps or rows"
    return None


def check_split(problem, warps, lanes, rows, keys, VW=0, **_):
    """check_decode, and the combine kernel's one thread per element of a row."""
    reason = check_decode(problem, warps, lanes, rows, keys, VW=VW)
    if reason:
        return reason
    if problem.head_dim > 1024:
        return "combine kernel: head_dim > 1024 threads"
    return None


def check_alignment(*arrays):
    """16-byte loads need 16-byte aligned rows: refuse misaligned device arrays."""
    if IS_SIMULATOR:
        return
    for a in arrays:
        ptr = a.__cuda_array_interface__["data"][0] if hasattr(a, "__cuda_array_interface__") else 0
        if ptr % 16:
            raise ValueError("decode kernels need 16-byte aligned K/V device arrays")


def decode_mma_smem_bytes(D, warps, Bc, stages, kv8=False):
    """Dynamic shared memory of :func:`make_decode_mma_kernel`: the rings (``kv8``: the byte rings
    and one 16-bit K/V tile per warp) or the merge area, and the m/l rows."""
    ring = warps * 2 * stages * Bc * swizzle_row_chunks(D) * 16
    if kv8:
        ring = warps * 2 * stages * Bc * D + warps * 2 * Bc * swizzle_row_chunks(D) * 16
    merge = warps * 16 * D * 4
    return max(ring, merge) + (warps * 16 + 1) * 2 * 4


def check_decode_mma(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
                     fixed_combine):
    """``supports`` of ``decode_mma`` (and of ``paged_mma`` after its paged checks)."""
    if problem.dtype not in ("float16", "bfloat16"):
        return f"dtype {problem.dtype}: decode_mma computes on f16/bf16 tensor cores (16-bit storage)"
    if problem.q_len > MAX_Q_LEN:
        return f"decode kernel: q_len {problem.q_len} > {MAX_Q_LEN} (use a prefill phase)"
    NR = problem.group * problem.q_len
    if NR > 16:
        return f"{NR} query rows per KV head (group × q_len) > 16: one m16 tile per block"
    D = problem.head_dim
    if D % 8 or D > 256:
        return f"head_dim {D} must be a multiple of 8 (16-byte rows), at most 256"
    if Bc % 16 or Bc < 16:
        return f"Bc={Bc} must be a multiple of 16"
    chunks = (D + 15) // 16 * 2
    if (Bc * chunks) % WARP_SIZE:
        return f"Bc={Bc} × {chunks} chunks is not a whole number of 16-byte copies per lane"
    if stages < 2:
        return "stages must be at least 2"
    if not 1 <= warps <= 32:
        return f"warps={warps} out of range 1..32"
    if int(pdl) not in (0, 1, 2, 3):
        return f"pdl={pdl}: 0 (plain launch) or 1/2/3 (dependent launch; see decode_mma's PDL_MODES)"
    return smem_reason(decode_mma_smem_bytes(D, warps, Bc, stages, bool(getattr(problem, "kv_dtype", ""))))


def resolve_decode_mma(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch,
                       even, fixed_combine):
    """``resolve`` of ``decode_mma`` and ``paged_mma``: the split count (a paged problem with unequal
    lengths: the ragged plan of ``split_plan``, :func:`ragged_mean`)."""
    S, _ = split_plan(problem.batch * problem.kv_heads, problem.kv_len, max(1, warps * Bc), sm_count(), blocks_per_sm,
                      min_keys, splits, mean_len=ragged_mean(problem))
    return {"splits": S}


def ring_bytes(D: int, warps: int, stages: int) -> int:
    """Dynamic shared memory of ``make_frag8_kernel``'s ring (frag8.py): ``stages`` slots per warp of 16 K and
    16 V rows of D bytes."""
    return warps * stages * 32 * D
