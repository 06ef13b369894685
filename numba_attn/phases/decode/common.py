"""What the decode phases share.

* The rules: rows per block, lanes per key, keys per lane group, the
  ``supports`` checks, the ``resolve`` of the automatic parameters.
* :func:`chunk_steps` — the device functions of a block that streams its KV
  range in warp steps (``decode_chunked`` and the split-K phases built on it):
  load the block's query rows, load a step's keys, the per-key update, the
  merge of a warp's lane groups, the merge of the warps and the output write,
  and the last-block combine.
* :func:`make_split_kernel` — the split-K kernel of ``decode_split_k`` and,
  with ``FUSED``, of ``decode_split_k_fused`` (the combine done by the last
  block of each row block: one launch).
* :func:`make_lean_kernel` — the kernel of ``decode_split_k_lean`` and, with a
  page size, of ``paged_split_k`` (the key rows found through a block table).
* :func:`make_mma_kernel` — the kernel of ``decode_mma`` and, with a page size,
  of ``paged_mma``; their ``supports`` checks and ``resolve``.
* The split-K workspace: partial outputs, log-sum-exps, counters.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR  # first: chooses the backend before numba is imported

from numba import cuda, float32, float64, int32, uint16, uint32, uint64  # noqa: E402

from numba_attn.gpu.arrays import view_as  # noqa: E402
from numba_attn.gpu.device_functions import (LOG2E, NEG_BIG, combine_splits, fragment_rescale,  # noqa: E402
                                             fragment_softmax, ldg_f16x8, ldg_f32x4, merge_state, merge_state2,
                                             state_lse)
from numba_attn.gpu.intrinsics import (byte_perm, cp_async16_flat, cp_async16_flat_l2_256,  # noqa: E402
                                       cp_async_commit, cp_async_wait, ld_global_v2, ld_global_v4, ld_shared_v4,
                                       ldmatrix_x4, ldmatrix_x4_trans, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2,
                                       st_shared_v4, u32_as_f32, unpack_bf16x2, unpack_f16x2)
from numba_attn.gpu.jit import device, kernel  # noqa: E402
from numba_attn.gpu.pdl import launch_after, launch_dependents, pdl_available, uses_griddepcontrol  # noqa: E402
from numba_attn.gpu.ptx_loads import (STATIC_SMEM_LIMIT, dynamic_tile, launch_dynamic, smem_reason,  # noqa: E402
                                      swizzle_row_chunks)
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan  # noqa: E402
from numba_attn.gpu.warp import (FULL_MASK, WARP_SIZE, group_sum, quad_sum, shfl_sync,  # noqa: E402
                                 shfl_xor_sync, strided_max, strided_sum, syncwarp)
from numba_attn.phases.registry import Launch  # noqa: E402

MAX_Q_LEN = 8  # query positions per sequence a decode kernel takes; longer is prefill
LN2 = np.float32(0.6931471805599453)

if IS_SIMULATOR:
    def prefetch_l2_at(arr, row, n, col, off):
        """``prefetch.global.L2`` of flat element ``row·n + col + off`` of ``arr`` (``row`` a 32-bit index). It
        changes no value; the simulator checks that the element lies in the array, as a load's would be."""
        a = np.asarray(getattr(arr, "_ary", arr))
        if not 0 <= int(row) <= 0xFFFFFFFF:
            raise IndexError(f"row index {int(row)} is not a 32-bit unsigned value")
        i = int(row) * int(n) + int(col) + int(off)
        if not 0 <= i < a.size:
            raise IndexError(f"prefetch of flat element {i} out of bounds for size {a.size}")
else:
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda.extending import intrinsic as _intrinsic

    from numba_attn.gpu.intrinsics import asm_call, flat_ptr, global_ptr

    @_intrinsic
    def prefetch_l2_at(typingctx, arr, row, n, col, off):
        """``prefetch.global.L2`` of the line holding flat element ``row·n + col + off`` of a C-contiguous
        array (addressed as ``ld_global_v4_at`` addresses its load: one ``mad.wide.u32`` on a hoisted base):
        the bytes start towards L2 with no register waiting for them."""
        if not (isinstance(arr, _types.Array) and arr.layout == "C"
                and all(isinstance(x, _types.Integer) for x in (row, n, col, off))):
            return None
        sig = _types.void(arr, row, n, col, off)

        def codegen(context, builder, sig, args):
            ptr = flat_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], args[2], args[3:],
                            sig.args[2:])
            asm_call(builder, _ir.VoidType(), [_ir.IntType(64)], "prefetch.global.L2 [$0];", "l",
                 [global_ptr(builder, ptr)], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen


# -- rules ---------------------------------------------------------------------------

def vector_width(dtype: str) -> int:
    """Elements per 16-byte load: 4 float32 or 8 float16/bfloat16."""
    return {"float32": 4, "float16": 8, "bfloat16": 8}[dtype]


@device
def bf16_to_f32(h):
    """One bfloat16 bit pattern (a uint16 element) → float32 (exact)."""
    return unpack_bf16x2(uint32(h))[0]


@device
def f32_to_bf16(x):
    """float32 → the bfloat16 bit pattern (uint16), rounded to nearest even (``cvt.rn``)."""
    return uint16(pack_bf16x2(x, float32(0.0)) & uint32(0xFFFF))


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


# -- split-K workspace and launch --------------------------------------------------------

def split_workspace(S: int, rows: int, D: int):
    """(part_o, part_lse): every split's normalized partial output and log-sum-exp
    per query row (float32); a 1-element stand-in when S = 1 writes the output."""
    if S == 1:
        return cuda.device_array((1, 1, 1), dtype="float32"), cuda.device_array((1, 1), dtype="float32")
    return cuda.device_array((S, rows, D), dtype="float32"), cuda.device_array((S, rows), dtype="float32")


def zeroed_counters(n: int):
    """``n`` int32 zeros on the device: the per-tile split counters of a last-block combine.
    On a GPU they are zeroed by a memset, which does not wait for the device (a copy from the host
    would: every new plan, e.g. each decode step's new kv_len, would drain the queue)."""
    counters = cuda.device_array(n, dtype=np.int32)
    if isinstance(counters, np.ndarray):  # host stand-in (offline compilation)
        counters[:] = 0
    elif IS_SIMULATOR:
        counters.copy_to_device(np.zeros(n, np.int32))
    else:
        from numba.cuda.cudadrv import driver

        driver.device_memset(counters, 0, counters.nbytes)
    return counters


def tile_notes(lanes, keys, rows, warps) -> str:
    """The ``Launch.notes`` of a warp-step decode kernel's tiling."""
    return f"L={lanes} lanes/key, T={keys} keys/group, {rows} rows/block, {warps} warps"


def split_launch(problem, kern, scale, warps, lanes, rows, keys, splits, counters, combine, notes=""):
    """The :class:`Launch` of a split-K kernel: grid (split, row block of a KV head),
    the workspace, with ``counters`` the kernel's per-tile counters (and split
    count) as arguments, with ``combine`` the combine kernel after it (unless one
    split writes the output)."""
    B, H, Hkv, Nq, Nk, D = (problem.batch, problem.heads, problem.kv_heads, problem.q_len,
                            problem.kv_len, problem.head_dim)
    S = splits
    n_rc, chunk = split_layout(problem, warps, rows, lanes, keys, S)
    final = S == 1
    grid = (S, B * Hkv * n_rc)
    part_o, part_lse = split_workspace(S, B * H * Nq, D)
    kernels = [kern]
    combine = combine and not final
    bf16 = problem.dtype == "bfloat16"
    if combine:
        comb = make_combine_kernel(Nq, BF16=bf16) if bf16 else make_combine_kernel(Nq)
        kernels.append(comb)
    cnt = zeroed_counters(B * Hkv * n_rc) if counters else None

    def run(q, k, v, o, stream=0):
        if bf16:
            k, v = kernel_words(problem, k, v)
        check_alignment(k, v)
        if counters:
            kern[grid, warps * WARP_SIZE, stream](q, k, v, o, part_o, part_lse, cnt, scale, Hkv, Nk, chunk, S)
        else:
            kern[grid, warps * WARP_SIZE, stream](q, k, v, o, part_o, part_lse, scale, Hkv, Nk, chunk)
        if combine:
            comb[B * H * Nq, D, stream](part_o, part_lse, o, S)

    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, {tile_notes(lanes, keys, rows, warps)}{notes}")


# -- the warp-step loop --------------------------------------------------------------

@functools.cache
def row_loader(VW: int, L: int, NV: int, BF16: bool):
    """``load_row(k, v, KK, VV, t, a, b, sub)``: this lane's E = NV·VW elements of K row ``k[a, b]``
    and V row ``v[a, b]`` into ``KK[t]``/``VV[t]``, 16 bytes per load (lane ``sub`` of the row's
    L lanes takes chunks sub, sub + L, …); float32 or float16 rows (``ldg_f32x4``/``ldg_f16x8``),
    or a bfloat16 row as its uint32 word view (``BF16``: four words, each split by shifts).
    The contiguous cache passes (KV head, key), the paged one (cache row, KV head)."""
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8

    @device
    def load_row(k, v, KK, VV, t, a, b, sub):
        for u in range(NV):
            if BF16:  # 8 elements: 4 words of the uint32 view
                kw = ld_global_v4(k, a, b, (sub + L * u) * 4)
                vw = ld_global_v4(v, a, b, (sub + L * u) * 4)
                for x in range(4):
                    KK[t, u * VW + 2 * x], KK[t, u * VW + 2 * x + 1] = unpack_bf16x2(kw[x])
                    VV[t, u * VW + 2 * x], VV[t, u * VW + 2 * x + 1] = unpack_bf16x2(vw[x])
            else:
                kx = ldv(k, a, b, (sub + L * u) * VW)
                vx = ldv(v, a, b, (sub + L * u) * VW)
                for x in range(VW):
                    KK[t, u * VW + x] = kx[x]
                    VV[t, u * VW + x] = vx[x]

    return load_row


@functools.cache
def chunk_steps(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool,
                FINAL: bool = True, BASE2: bool = False, BF16: bool = False):
    """Device functions of a block of ``NW`` warps that computes ``RB`` query rows
    of one KV head over a range of keys: a group of ``L`` lanes takes ``T`` keys
    per warp step, a lane holding ``E = D / L`` elements of a row in registers.

    ``FINAL``: the block writes the output (else its split's partial output and
    log-sum-exp); ``BASE2``: the scores are in base 2 (log2 e folded into the
    query scale; ``exp2``, and the log-sum-exp converted back); ``BF16``: q and o are
    bfloat16 bit patterns (uint16), k and v their (…, D/2) uint32 word views.
    Returns ``(load_rows, load_keys, score_update, merge_lanes, write_rows, combine_last)``.
    """
    E = D // L  # elements of a row per lane
    NV = E // VW  # 16-byte loads per row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    NT = NW * WARP_SIZE
    NROWS = G * Nq
    load_row = row_loader(VW, L, NV, BF16)  # one key row of K and V, 16 bytes per load

    @device
    def load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, hi, Nk):
        """Query rows row0 … row0+RB-1 of KV head ``kvh`` (row g·Nq + i is query head
        kvh·G + g, position i), scaled, into this lane's E elements ``Qr``; an
        empty state (acc, m, l); ``lim[r]``: the row sees keys < lim[r] (the block's
        keys end at ``hi``; causal: bottom-right aligned; 0 for a padding row)."""
        for r in range(RB):
            row = row0 + r
            ok = row < NROWS
            g = row // Nq
            i = row - g * Nq
            bh = kvh * G + g  # = b * H + hkv * G + g
            if ok:
                lim[r] = min(hi, i + Nk - Nq + 1) if causal else hi
            else:
                lim[r] = 0
            for u in range(NV):
                for x in range(VW):
                    if BF16:
                        Qr[r, u * VW + x] = bf16_to_f32(q[bh, i, (sub + L * u) * VW + x]) * scale if ok \
                            else float32(0.0)
                    else:
                        Qr[r, u * VW + x] = float32(q[bh, i, (sub + L * u) * VW + x]) * scale if ok else float32(0.0)
                    acc[r, u * VW + x] = float32(0.0)
            m[r] = NEG_BIG
            l[r] = float32(0.0)

    @device
    def load_keys(k, v, KK, VV, kvh, j0, hi, sub):
        """All loads of a step first: keys j0 + t·KW (t < T, clamped below ``hi``),
        this lane's E elements of each K and V row, 16 bytes at a time."""
        for t in range(T):
            load_row(k, v, KK, VV, t, kvh, min(j0 + t * KW, hi - 1), sub)

    @device
    def score_update(Qr, KK, VV, sc, m, l, acc, lim, j0):
        """The scores of the step's T keys for every row (each summed over the
        group's L lanes by a butterfly), then one online-softmax update per row."""
        for r in range(RB):
            for t in range(T):
                s = float32(0.0)
                for e in range(E):
                    s += Qr[r, e] * KK[t, e]
                sc[r, t] = group_sum(s, L)
        for r in range(RB):  # one online-softmax update per row for the T keys
            m_new = m[r]
            for t in range(T):
                if j0 + t * KW < lim[r]:
                    m_new = max(m_new, sc[r, t])
            corr = math.exp(m[r] - m_new)
            lsum = float32(0.0)
            for t in range(T):
                p = math.exp(sc[r, t] - m_new) if j0 + t * KW < lim[r] else float32(0.0)
                sc[r, t] = p
                lsum += p
            m[r] = m_new
            l[r] = l[r] * corr + lsum
            for e in range(E):
                a = acc[r, e] * corr
                for t in range(T):
                    a += sc[r, t] * VV[t, e]
                acc[r, e] = a

    @device
    def merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub):
        """The lane groups of warp ``w`` merge (common max, rescale, sum); its first
        group stores the warp's (m, l, O) in shared memory."""
        for r in range(RB):
            mw = strided_max(m[r], L)
            if BASE2:
                c = math.exp2(m[r] - mw)
            else:
                c = math.exp(m[r] - mw)
            lw = strided_sum(l[r] * c, L)
            for e in range(E):
                acc[r, e] = strided_sum(acc[r, e] * c, L)
            if lane < L:
                for u in range(NV):
                    for x in range(VW):
                        sm_o[w, r, (sub + L * u) * VW + x] = acc[r, u * VW + x]
                if lane == 0:
                    sm_m[w, r] = mw
                    sm_l[w, r] = lw

    @device
    def write_rows(o, part_o, part_lse, split, kvh, row0, tid, sm_m, sm_l, sm_o):
        """Merge the warps' partial (m, l, O), one thread per element; write the
        output (``FINAL``) or split ``split``'s partial output and log-sum-exp."""
        for idx in range(tid, RB * D, NT):
            r = idx // D
            d = idx - r * D
            row = row0 + r
            if row < NROWS:
                g = row // Nq
                i = row - g * Nq
                mm = NEG_BIG
                ll = float32(0.0)
                oo = float32(0.0)
                for ww in range(NW):
                    if BASE2:
                        mm, ll, ca, cb = merge_state2(mm, ll, sm_m[ww, r], sm_l[ww, r])
                    else:
                        mm, ll, ca, cb = merge_state(mm, ll, sm_m[ww, r], sm_l[ww, r])
                    oo = oo * ca + cb * sm_o[ww, r, d]
                bh = kvh * G + g
                if FINAL:
                    if BF16:
                        o[bh, i, d] = f32_to_bf16(oo / ll)
                    else:
                        o[bh, i, d] = oo / ll
                else:
                    part_o[split, bh * Nq + i, d] = oo / ll if ll != float32(0.0) else float32(0.0)
                    if d == 0:
                        if BASE2:
                            part_lse[split, bh * Nq + i] = state_lse(mm * LN2, ll)
                        else:
                            part_lse[split, bh * Nq + i] = state_lse(mm, ll)

    @device
    def combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid, ci):
        """The last block of this (sequence, KV head, row block) to finish combines
        the S splits' partials (``combine_splits``) and resets its counter ``counters[ci]``."""
        cuda.threadfence()  # this block's partials are visible device-wide before it counts
        cuda.syncthreads()
        if tid == 0:
            prev = cuda.atomic.add(counters, ci, 1)
            sm_last[0] = 1 if prev == S - 1 else 0
        cuda.syncthreads()
        if sm_last[0] == 1:
            cuda.threadfence()
            for idx in range(tid, RB * D, NT):
                r = idx // D
                d = idx - r * D
                row = row0 + r
                if row < NROWS:
                    g = row // Nq
                    i = row - g * Nq
                    bh = kvh * G + g
                    if BF16:
                        o[bh, i, d] = f32_to_bf16(combine_splits(part_o, part_lse, S, bh * Nq + i, d))
                    else:
                        o[bh, i, d] = combine_splits(part_o, part_lse, S, bh * Nq + i, d)
            if tid == 0:
                counters[ci] = 0  # ready for the next launch

    return load_rows, load_keys, score_update, merge_lanes, write_rows, combine_last


@functools.cache
def make_split_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool,
                      FINAL: bool, FUSED: bool, MINB: int = 1):
    """The split-K kernel: block (s, tile) runs the warp-step loop over split s of
    the keys of one (sequence, KV head, row block) and writes the split's partial
    (or, with ``FINAL``, the one split's output). ``FUSED``: the last block of a
    tile combines the splits (``decode_split_k_fused``); otherwise the combine is
    a second kernel (``decode_split_k``)."""
    load_rows, load_keys, score_update, merge_lanes, write_rows, combine_last = chunk_steps(
        D, VW, L, T, NW, RB, Nq, G, causal, FINAL)
    E = D // L
    KS = (WARP_SIZE // L) * T  # keys per warp step: T keys per group
    NT = NW * WARP_SIZE
    NRC = (G * Nq + RB - 1) // RB  # row blocks per KV head

    @device
    def split_block(q, k, v, o, part_o, part_lse, counters, scale, Nk, chunk, S, sm_m, sm_l, sm_o, sm_last):
        Qr = cuda.local.array((RB, E), float32)
        acc = cuda.local.array((RB, E), float32)
        m = cuda.local.array(RB, float32)
        l = cuda.local.array(RB, float32)
        lim = cuda.local.array(RB, int32)
        KK = cuda.local.array((T, E), float32)
        VV = cuda.local.array((T, E), float32)
        sc = cuda.local.array((RB, T), float32)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y // NRC  # b * Hkv + kv head
        row0 = (cuda.blockIdx.y - kvh * NRC) * RB  # first of this block's query rows (g * Nq + i)
        lo = split * chunk  # this block's keys: [lo, hi)
        hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // L
        sub = lane % L
        load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, hi, Nk)
        n_steps = max(0, (hi - lo + KS - 1) // KS)  # 0 for a split past the end
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = lo + step * KS + grp  # this group's keys: j0 + t * KW
            load_keys(k, v, KK, VV, kvh, j0, hi, sub)
            score_update(Qr, KK, VV, sc, m, l, acc, lim, j0)
        merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub)
        cuda.syncthreads()
        write_rows(o, part_o, part_lse, split, kvh, row0, tid, sm_m, sm_l, sm_o)
        if FUSED and not FINAL:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid, cuda.blockIdx.y)

    if not FUSED:
        @kernel(launch_bounds=(NT, MINB))
        def decode_split_k(q, k, v, o, part_o, part_lse, scale, Hkv, Nk, chunk):
            sm_m = cuda.shared.array((NW, RB), float32)
            sm_l = cuda.shared.array((NW, RB), float32)
            sm_o = cuda.shared.array((NW, RB, D), float32)
            # (no counters, no last-block flag: part_lse, chunk and sm_l stand in for them, unused)
            split_block(q, k, v, o, part_o, part_lse, part_lse, scale, Nk, chunk, chunk, sm_m, sm_l, sm_o, sm_l)

        return decode_split_k

    @kernel(launch_bounds=(NT, MINB))
    def decode_split_k_fused(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, chunk, S):
        sm_m = cuda.shared.array((NW, RB), float32)
        sm_l = cuda.shared.array((NW, RB), float32)
        sm_o = cuda.shared.array((NW, RB, D), float32)
        sm_last = cuda.shared.array(1, int32)
        split_block(q, k, v, o, part_o, part_lse, counters, scale, Nk, chunk, S, sm_m, sm_l, sm_o, sm_last)

    return decode_split_k_fused



def _log2(n: int) -> int:
    return n.bit_length() - 1


def score_plan(L: int, RB: int, T: int):
    """(NP, SPL, NR): the RB·T partial dot products of a lane are padded to
    NP (a power of two); SPL reduce-scatter stages halve them (offsets L/2,
    L/4, ...), the remaining log2(L) − SPL stages are plain xor-sums of the NR
    = NP / 2^SPL values a lane still holds. Afterwards value v sits in lane
    ``(v // NR) · (L >> SPL)`` of its group (and the lanes just above it)."""
    NP = 1
    while NP < RB * T:
        NP *= 2
    SPL = min(_log2(NP), _log2(L))
    return NP, SPL, NP >> SPL


@device
def balanced_split(split, chunk, Nk, KS):
    """Keys [lo, hi) of split ``split`` of a sequence of ``Nk`` keys cut into n = ⌈Nk / chunk⌉ splits:
    n − 1 of ⌈Nk / n⌉ keys rounded up to whole steps of ``KS`` keys, the last (never empty) the rest
    (``chunk`` a multiple of KS: no split is longer than ``chunk``; splits n, n+1, … are empty). A sequence of 1100 keys with chunk
    1024 gets two splits of 552 and 548 keys (KS 8) instead of 1024 and 76: a block of 76 keys pays the
    fixed cost of a block for few bytes, and the longest split decides when the last wave ends."""
    n = max(1, (Nk + chunk - 1) // chunk)
    ck = ((Nk + n - 1) // n + KS - 1) // KS * KS
    lo = split * ck
    return lo, min(Nk, lo + ck)


@functools.cache
def make_lean_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool, FINAL: bool,
                     FUSED: bool, MINB: int = 1, P: int = 0, KV8: int = 0, TOKEN: bool = False,
                     BF16: bool = False, BAL: bool = False, WORK: bool = False, AHEAD: bool = False):
    """The kernel of ``decode_split_k_lean`` (reduce-scatter scores, exp2, lazy
    rescale) and, with a page size ``P`` > 0, of ``paged_split_k``: a key row found
    through the block table (:func:`paged_keys`; ``KV8``/``TOKEN``: an 8-bit cache
    and its scales), the sequence's own length ``seqlens[b]``, every split writing
    a partial (a length-0 sequence gets zeros). ``BF16``: bfloat16 query, output and
    16-bit cache (:func:`chunk_steps`). ``BAL`` (paged): ``chunk`` is the most keys of a split, and
    a sequence of ``Nk`` keys is cut into n = ⌈Nk / chunk⌉ splits of equal whole warp steps
    (:func:`balanced_split`) instead of n − 1 full ones and a remainder. ``WORK`` (paged,
    ``paged_worklist``): block (w, row block) runs the items ``wptr[w] … wptr[w+1] − 1`` of a host-planned
    work list (:func:`worklist_plan`), each a (KV head of a sequence b · Hkv + h, split, keys [lo, hi), splits
    of that KV head) one after the other through the same block code, combined by the last block to finish a
    KV head's row block (per-(sequence, KV head) counters). ``AHEAD`` (paged, pages holding whole
    warp steps): a warp reads the page index of its next step during this one, so that the block table's
    load is no longer a round trip before every step's K/V loads.

    ``VW`` = 16 with ``KV8`` (``paged_split_k``'s ``wide``): a lane owns 16 consecutive
    codes per chunk, read by one 16-byte load (:func:`paged_words`), and decodes them where
    they are used, the scales applied once per score and per probability instead of per
    element; fp8's NaN codes are not patched per word: the lane ORs the codes' NaN tests,
    and a warp that read one sets its accumulators to NaN at the end (the rows of that
    sequence and KV head come out NaN)."""
    PAGED = P > 0
    WIDE = PAGED and KV8 > 0 and VW == 16
    load_rows, load_keys, _, merge_lanes, write_rows, combine_last = chunk_steps(
        D, VW, L, T, NW, RB, Nq, G, causal, FINAL, BASE2=True, BF16=BF16)
    E = D // L  # elements of a row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    KS = KW * T  # keys per warp step: T keys per group
    if PAGED:
        load_keys = paged_keys(D, VW, L, T, P, KS, KV8, TOKEN, BF16)
    LOGP, STEP = page_steps(P, KS)
    AHEAD_STEP = AHEAD and STEP
    EW = max(1, E // 4)  # 32-bit words of a row per lane (WIDE)
    if WIDE:
        load_words = paged_words(D, L, T, P, KS, KV8, TOKEN)
        dq4 = e4m3x4_f32_finite if KV8 == 1 else int8x4_f32
    NT = NW * WARP_SIZE
    NRC = (G * Nq + RB - 1) // RB  # row blocks per KV head
    NP, SPL, NR = score_plan(L, RB, T)
    LOG2L = _log2(L)
    HALF = max(1, NP // 2)
    SRC = L >> SPL  # lanes of a group that share one reduced value set
    NV_RT = RB * T

    @device
    def split_keys(chunk, Nk):
        """Block (split, row block of a KV head)'s split, KV head (b · Hkv + h), first query row and keys
        [lo, hi) of its sequence's ``Nk``."""
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y // NRC  # b * Hkv + kv head
        row0 = (cuda.blockIdx.y - kvh * NRC) * RB  # first of this block's query rows (g * Nq + i)
        if BAL:  # this sequence's own split length: equal whole steps
            lo, hi = balanced_split(split, chunk, Nk, KS)
        else:
            lo = split * chunk  # this block's keys: [lo, hi)
            hi = min(Nk, lo + chunk)
        return split, kvh, row0, lo, hi

    @device
    def lean_block(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, seq, table, ks, vs, split, kvh, row0,
                   lo, hi, S, ci, sm_m, sm_l, sm_o, sm_last):
        Qr = cuda.local.array((RB, E), float32)
        acc = cuda.local.array((RB, E), float32)
        m = cuda.local.array(RB, float32)
        l = cuda.local.array(RB, float32)
        lim = cuda.local.array(RB, int32)
        KK = cuda.local.array((T, E), float32)
        VV = cuda.local.array((T, E), float32)
        sc = cuda.local.array((RB, T), float32)
        vals = cuda.local.array(NP, float32)
        if WIDE:
            KQ = cuda.local.array((T, EW), uint32)
            VQ = cuda.local.array((T, EW), uint32)
            sks = cuda.local.array(T, float32)
            svs = cuda.local.array(T, float32)
            bad = uint32(0)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // L
        sub = lane % L
        load_rows(q, Qr, acc, m, l, lim, kvh, row0, sub, scale, hi, Nk)
        n_steps = max(0, (hi - lo + KS - 1) // KS)  # 0 for a split past the end
        nxt = 0
        if AHEAD_STEP:  # the warp's first page
            if w < n_steps:
                nxt = table[seq, (lo + w * KS) >> LOGP]
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = lo + step * KS + grp  # this group's keys: j0 + t * KW
            pg = 0  # the step's page (STEP), read before its keys' loads, or a step ahead (AHEAD)
            if STEP:
                if AHEAD_STEP:
                    pg = nxt
                    if step + NW < n_steps:  # the warp's next step: its page index in flight during this one
                        nxt = table[seq, (lo + (step + NW) * KS) >> LOGP]
                else:
                    pg = table[seq, (lo + step * KS) >> LOGP]
            if WIDE:  # the words, decoded here: 4 codes at a time for every row; the K scale per score
                bad |= load_words(k, v, KQ, VQ, sks, svs, table, seq, kvh - seq * Hkv, pg, j0, hi, sub, ks, vs)
                for t in range(T):
                    for r in range(RB):
                        vals[r * T + t] = float32(0.0)
                    for i in range(EW):
                        x0, x1, x2, x3 = dq4(KQ[t, i])
                        for r in range(RB):
                            s = vals[r * T + t]
                            s += Qr[r, 4 * i] * x0
                            s += Qr[r, 4 * i + 1] * x1
                            s += Qr[r, 4 * i + 2] * x2
                            s += Qr[r, 4 * i + 3] * x3
                            vals[r * T + t] = s
                    for r in range(RB):
                        vals[r * T + t] *= sks[t]
            else:
                if PAGED:
                    load_keys(k, v, KK, VV, table, seq, kvh - seq * Hkv, pg, j0, hi, sub, ks, vs)
                else:
                    load_keys(k, v, KK, VV, kvh, j0, hi, sub)
                for r in range(RB):
                    for t in range(T):
                        s = float32(0.0)
                        for e in range(E):
                            s += Qr[r, e] * KK[t, e]
                        vals[r * T + t] = s
            for vi in range(NV_RT, NP):
                vals[vi] = float32(0.0)
            # reduce-scatter over the L lanes of the group: each stage sends half of the
            # values still held and keeps the other half (NP - 1 shuffles instead of
            # RB·T·log2(L)), then plain xor-sums for the stages left
            for st in range(SPL):
                off = L >> (st + 1)
                half = NP >> (st + 1)
                up = (sub & off) != 0
                for i in range(HALF):
                    if i < half:
                        a = vals[i]
                        b = vals[i + half]
                        send = a if up else b
                        keep = b if up else a
                        vals[i] = keep + shfl_xor_sync(FULL_MASK, send, off)
            for st in range(SPL, LOG2L):
                off = L >> (st + 1)
                for i in range(NR):
                    vals[i] += shfl_xor_sync(FULL_MASK, vals[i], off)
            # all-gather: every lane of the group gets the RB·T scores
            for vi in range(NV_RT):
                if L == 1:
                    sc[vi // T, vi % T] = vals[vi]
                else:
                    sc[vi // T, vi % T] = shfl_sync(FULL_MASK, vals[vi % NR], grp * L + (vi // NR) * SRC)
            for r in range(RB):  # one online-softmax update per row for the T keys (base 2)
                m_old = m[r]
                m_new = m_old
                for t in range(T):
                    if j0 + t * KW < lim[r]:
                        m_new = max(m_new, sc[r, t])
                lsum = float32(0.0)
                for t in range(T):
                    p = math.exp2(sc[r, t] - m_new) if j0 + t * KW < lim[r] else float32(0.0)
                    sc[r, t] = p
                    lsum += p
                if m_new > m_old:  # rescale only when the row's maximum moved
                    corr = math.exp2(m_old - m_new)
                    m[r] = m_new
                    l[r] = l[r] * corr + lsum
                    for e in range(E):
                        acc[r, e] *= corr
                else:
                    l[r] += lsum
                if not WIDE:
                    for e in range(E):
                        a = acc[r, e]
                        for t in range(T):
                            a += sc[r, t] * VV[t, e]
                        acc[r, e] = a
            if WIDE:  # O += P V: each key's V scale on its probabilities (l is already summed)
                for t in range(T):
                    for r in range(RB):
                        sc[r, t] *= svs[t]
                    for i in range(EW):
                        x0, x1, x2, x3 = dq4(VQ[t, i])
                        for r in range(RB):
                            p = sc[r, t]
                            acc[r, 4 * i] += p * x0
                            acc[r, 4 * i + 1] += p * x1
                            acc[r, 4 * i + 2] += p * x2
                            acc[r, 4 * i + 3] += p * x3
        if WIDE and KV8 == 1:  # a NaN code read by any lane of the warp: the warp's accumulators NaN
            f = int32(1) if bad != uint32(0) else int32(0)
            for off in (16, 8, 4, 2, 1):
                f |= shfl_xor_sync(FULL_MASK, f, off)
            if f != 0:
                for r in range(RB):
                    for e in range(E):
                        acc[r, e] = u32_as_f32(_NAN_BITS)
        merge_lanes(m, l, acc, sm_m, sm_l, sm_o, w, lane, sub)  # base 2: exp2
        cuda.syncthreads()
        write_rows(o, part_o, part_lse, split, kvh, row0, tid, sm_m, sm_l, sm_o)  # lse back to natural units
        if PAGED:
            if Nk == 0 and split == 0:  # an empty sequence: a zero partial of weight 1, the output is zeros
                for idx in range(tid, RB * D, NT):  # the threads that wrote the log-sum-exps (d = 0)
                    r = idx // D
                    if idx == r * D and row0 + r < G * Nq:
                        bh = kvh * G + (row0 + r) // Nq
                        part_lse[0, bh * Nq + (row0 + r) % Nq] = float32(0.0)
        if FUSED and not FINAL:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid, ci)

    if WORK:
        @kernel(launch_bounds=(NT, MINB))
        def paged_worklist(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, work, wptr):
            sm_m = cuda.shared.array((NW, RB), float32)
            sm_l = cuda.shared.array((NW, RB), float32)
            sm_o = cuda.shared.array((NW, RB, D), float32)
            sm_last = cuda.shared.array(1, int32)
            for it in range(wptr[cuda.blockIdx.x], wptr[cuda.blockIdx.x + 1]):
                kvh = work[it, 0]  # the item's KV head of a sequence (b · Hkv + h)
                seq = kvh // Hkv
                hrb = kvh * NRC + cuda.blockIdx.y  # (sequence, KV head, row block): its counter
                lean_block(q, k, v, o, part_o, part_lse, counters, scale, Hkv, seqlens[seq], seq, table, ks, vs,
                           work[it, 1], kvh, (hrb - kvh * NRC) * RB, work[it, 2], work[it, 3], work[it, 4], hrb,
                           sm_m, sm_l, sm_o, sm_last)
                cuda.syncthreads()  # the next item's warps write the merge arrays this one read

        return paged_worklist

    if PAGED:
        @kernel(launch_bounds=(NT, MINB))
        def paged_split_k(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, chunk, S):
            sm_m = cuda.shared.array((NW, RB), float32)
            sm_l = cuda.shared.array((NW, RB), float32)
            sm_o = cuda.shared.array((NW, RB, D), float32)
            sm_last = cuda.shared.array(1, int32)
            seq = cuda.blockIdx.y // NRC // Hkv
            Nk = seqlens[seq]  # the sequence's own number of keys
            split, kvh, row0, lo, hi = split_keys(chunk, Nk)
            lean_block(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, seq, table, ks, vs, split, kvh, row0,
                       lo, hi, S, cuda.blockIdx.y, sm_m, sm_l, sm_o, sm_last)

        return paged_split_k

    @kernel(launch_bounds=(NT, MINB))
    def decode_split_k_lean(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, chunk, S):
        sm_m = cuda.shared.array((NW, RB), float32)
        sm_l = cuda.shared.array((NW, RB), float32)
        sm_o = cuda.shared.array((NW, RB, D), float32)
        sm_last = cuda.shared.array(1, int32)
        # (no block table, no scales: Nk, k and scale stand in for them, unused)
        split, kvh, row0, lo, hi = split_keys(chunk, Nk)
        lean_block(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, Nk, k, scale, scale, split, kvh, row0,
                   lo, hi, S, cuda.blockIdx.y, sm_m, sm_l, sm_o, sm_last)

    return decode_split_k_lean


def split_k_launch(problem, fused, warps, lanes, rows, keys, splits, blocks_per_sm):
    """The :class:`Launch` of :func:`make_split_kernel` (``decode_split_k``, and with
    ``fused`` ``decode_split_k_fused``) for ``problem`` and resolved parameters."""
    kern = make_split_kernel(problem.head_dim, vector_width(problem.dtype), lanes, keys, warps, rows, problem.q_len,
                             problem.group, problem.causal, splits == 1, fused, blocks_per_sm)
    return split_launch(problem, kern, float32(problem.sm_scale), warps, lanes, rows, keys, splits,
                        counters=fused, combine=not fused)


# -- paged KV cache (decode_paged) ---------------------------------------------------------

PAGED_KV8 = {"": 0, "float8_e4m3": 1, "int8": 2}  # the cache format a paged kernel is compiled for
PAGED_TOKEN_SCALE = {"tensor": 0, "head": 0, "token": 1}  # scale rows per token (else one row per head)


def check_paged_problem(problem) -> str | None:
    """The paged phases run paged problems only (``PagedProblem``: page_size, block table)."""
    if not getattr(problem, "page_size", 0):
        return "paged phase: needs a paged KV cache (a PagedProblem with page_size and block table)"
    return None


E4M3_UNIT = float32(256.0)  # e4m3x4_f16x2's values are the codes' values / 256: scales carry the 256
_NAN_BITS = uint32(0x7FC00000)


@device
def e4m3x4_f16x2(w):
    """Four float8 e4m3fn codes (the bytes of ``w``, low first) → two f16x2 registers holding
    the codes' values / 256, exact, in four integer instructions: the byte moved to the top of a
    half (``prmt``), its sign kept, its 7 exponent and mantissa bits shifted right by one, so
    that e4m3's exponent (bias 7) lands in f16's (bias 15): every normal and subnormal e4m3
    value / 2⁸ is an f16 normal or subnormal with the same bits. The NaN codes (0x7F, 0xFF)
    come out finite: :func:`e4m3_nan_bytes` finds them."""
    lo = byte_perm(w, uint32(0), uint32(0x1404))  # halves: b0 << 8, b1 << 8
    hi = byte_perm(w, uint32(0), uint32(0x3424))  # b2 << 8, b3 << 8
    return ((lo & uint32(0x80008000)) | ((lo >> uint32(1)) & uint32(0x3F803F80)),
            (hi & uint32(0x80008000)) | ((hi >> uint32(1)) & uint32(0x3F803F80)))


@device
def e4m3_nan_bytes(w):
    """Non-zero when a byte of ``w`` is an e4m3fn NaN code (its low 7 bits all ones): a byte's
    low 7 bits plus one carries into its top bit only then (and never into the next byte)."""
    return ((w & uint32(0x7F7F7F7F)) + uint32(0x01010101)) & uint32(0x80808080)


@device
def e4m3_nan_fix(w, x, i):
    """``x`` (the value of byte ``i`` of ``w``), or NaN when that byte is a NaN code."""
    return u32_as_f32(_NAN_BITS) if ((w >> uint32(8 * i)) & uint32(0x7F)) == uint32(0x7F) else x


@device
def e4m3x4_f32(w):
    """Four float8 e4m3fn codes → four float32 of their values / 256 (exact; NaN codes NaN)."""
    a, b = e4m3x4_f16x2(w)
    x0, x1 = unpack_f16x2(a)
    x2, x3 = unpack_f16x2(b)
    if e4m3_nan_bytes(w):  # rare: a NaN in the cache propagates
        x0 = e4m3_nan_fix(w, x0, 0)
        x1 = e4m3_nan_fix(w, x1, 1)
        x2 = e4m3_nan_fix(w, x2, 2)
        x3 = e4m3_nan_fix(w, x3, 3)
    return x0, x1, x2, x3


@device
def e4m3x4_f32_finite(w):
    """:func:`e4m3x4_f32` without the NaN patch (a NaN code comes out finite): for a caller
    that tests the codes for NaN itself (:func:`e4m3_nan_bytes`), once per many words."""
    a, b = e4m3x4_f16x2(w)
    x0, x1 = unpack_f16x2(a)
    x2, x3 = unpack_f16x2(b)
    return x0, x1, x2, x3


@device
def int8x4_f32(w):
    """Four int8 codes → four float32, exact, without integer-to-float conversions (a quarter-rate
    instruction): the biased byte (code + 128) placed in the mantissa of 2²³ (``prmt``), then
    2²³ + 128 subtracted."""
    u = w ^ uint32(0x80808080)
    return (u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7650))) - float32(8388736.0),
            u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7651))) - float32(8388736.0),
            u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7652))) - float32(8388736.0),
            u32_as_f32(byte_perm(u, uint32(0x4B000000), uint32(0x7653))) - float32(8388736.0))


def kv8_decoder(KV8: int):
    """(four codes → four float32, what the scales are multiplied by) of an 8-bit cache format
    (``KV8`` 1: e4m3fn, values / 256, so 256; 2: int8, 1)."""
    return (e4m3x4_f32, E4M3_UNIT) if KV8 == 1 else (int8x4_f32, float32(1.0))


def page_steps(P: int, KS: int):
    """(log2 of the page size ``P``, whether a page holds whole warp steps of ``KS`` keys): with steps
    aligned to KS a step then never crosses a page, and its page index is read once per step (by the
    warp-step kernel, :func:`make_lean_kernel`, which passes it to :func:`paged_keys` / :func:`paged_words`),
    else once per key. (0, False) without pages (``P`` = 0)."""
    return (P.bit_length() - 1, P % KS == 0) if P > 0 else (0, False)


@functools.cache
def paged_keys(D: int, VW: int, L: int, T: int, P: int, KS: int, KV8: int, TOKEN: bool, BF16: bool = False):
    """``load_keys`` of a warp-step kernel over a paged cache: key ``jj`` of sequence
    ``b`` is cache row ``table[b, jj // P] · P + jj % P`` of the (num_blocks·P, Hkv, D)
    view. When pages hold whole warp steps (``P % KS == 0``: steps are aligned to KS)
    the page index is read once per step, by the caller (``pg``), else once per key here. ``KV8``: 0 a 16-bit cache
    (16-byte loads, as ``chunk_steps``), 1 fp8 e4m3, 2 int8: the (…, D/4) uint32 view,
    two words per 8 elements, dequantized and multiplied by the row's scale
    (``ks``/``vs``: (1, Hkv) per tensor or head, (num_blocks·P, Hkv) per ``TOKEN``).
    ``BF16`` (with ``KV8`` 0): a bfloat16 cache as its (…, D/2) uint32 word view."""
    E = D // L
    NV = E // VW
    KW = WARP_SIZE // L
    LOGP, STEP = page_steps(P, KS)
    load_row = row_loader(VW, L, NV, BF16)  # one key row of K and V, 16 bytes per load
    dq4, UNIT = kv8_decoder(KV8)

    @device
    def load_keys(k, v, KK, VV, table, b, h, pg, j0, hi, sub, ks, vs):
        for t in range(T):
            jj = min(j0 + t * KW, hi - 1)
            page = pg if STEP else table[b, jj >> LOGP]
            row = page * P + (jj & (P - 1))
            if KV8 == 0:
                load_row(k, v, KK, VV, t, row, h, sub)
            else:
                srow = row if TOKEN else 0
                sk = ks[srow, h] * UNIT
                sv = vs[srow, h] * UNIT
                for u in range(NV):
                    c = (sub + L * u) * 2  # word of the chunk's first element (8 bytes: 2 words)
                    kw0, kw1 = ld_global_v2(k, row, h, c)
                    vw0, vw1 = ld_global_v2(v, row, h, c)
                    k0, k1, k2, k3 = dq4(kw0)
                    k4, k5, k6, k7 = dq4(kw1)
                    v0, v1, v2, v3 = dq4(vw0)
                    v4, v5, v6, v7 = dq4(vw1)
                    e = u * VW
                    KK[t, e], KK[t, e + 1], KK[t, e + 2], KK[t, e + 3] = k0 * sk, k1 * sk, k2 * sk, k3 * sk
                    KK[t, e + 4], KK[t, e + 5], KK[t, e + 6], KK[t, e + 7] = k4 * sk, k5 * sk, k6 * sk, k7 * sk
                    VV[t, e], VV[t, e + 1], VV[t, e + 2], VV[t, e + 3] = v0 * sv, v1 * sv, v2 * sv, v3 * sv
                    VV[t, e + 4], VV[t, e + 5], VV[t, e + 6], VV[t, e + 7] = v4 * sv, v5 * sv, v6 * sv, v7 * sv

    return load_keys


@functools.cache
def paged_words(D: int, L: int, T: int, P: int, KS: int, KV8: int, TOKEN: bool):
    """The ``wide`` load of an 8-bit paged cache (``KV8`` 1 fp8 e4m3, 2 int8): as
    :func:`paged_keys`, but a lane owns 16 consecutive codes per chunk (E = D/L elements,
    E/16 chunks) and reads each chunk with one 16-byte load of the (…, D/4) uint32 view.
    The words are kept as they are (``KQ``/``VQ``: (T, E/4)) and decoded where they are
    used; ``sks``/``svs`` get each key's K and V scale (times the decoder's unit). Returns,
    for fp8, the OR of :func:`e4m3_nan_bytes` of every word loaded (non-zero: a NaN code
    was read), else 0."""
    E = D // L
    NV = E // 16
    KW = WARP_SIZE // L
    LOGP, STEP = page_steps(P, KS)
    UNIT = kv8_decoder(KV8)[1]

    @device
    def load_words(k, v, KQ, VQ, sks, svs, table, b, h, pg, j0, hi, sub, ks, vs):
        bad = uint32(0)
        for t in range(T):
            jj = min(j0 + t * KW, hi - 1)
            page = pg if STEP else table[b, jj >> LOGP]
            row = page * P + (jj & (P - 1))
            srow = row if TOKEN else 0
            sks[t] = ks[srow, h] * UNIT
            svs[t] = vs[srow, h] * UNIT
            for u in range(NV):
                c = (sub + L * u) * 4  # word of the chunk's first code (16 codes: 4 words)
                kw = ld_global_v4(k, row, h, c)
                vw = ld_global_v4(v, row, h, c)
                for x in range(4):
                    KQ[t, 4 * u + x] = kw[x]
                    VQ[t, 4 * u + x] = vw[x]
                    if KV8 == 1:
                        bad |= e4m3_nan_bytes(kw[x]) | e4m3_nan_bytes(vw[x])
        return bad

    return load_words


@functools.cache
def make_frag8_kernel(D: int, NW: int, Nq: int, G: int, causal: bool, FUSED: bool, MINB: int, P: int, KV8: int,
                      TOKEN: bool, SPLITP: bool = True, PF: int = 0, HW: int = 1, NST: int = 0):
    """``paged_split_k``'s kernel with ``mma`` (an 8-bit paged cache, float16 query, D a multiple of 64,
    at most 8 query rows per KV head): the codes go from the 16-byte loads straight into tensor-core
    fragments, with no float32 per element and no shared memory. A warp step is 16 keys, two
    ``mma.m16n8k16`` problems with the keys on M and the (at most 8) query rows on N:

    * Sᵀ = K·Qᵀ: lane (g, t) loads the D/16 words of keys g and g+8 that lane t of a k-step owns
      (16-byte chunks t, t+4, …); one word is the A fragment of one k-step (its four codes → two
      f16x2, in the order the query's B fragment is packed in: a dot product does not care which
      dims a k-step holds). c0..c3 = scores of keys g, g+8 for rows 2t, 2t+1.
    * Oᵀ += Vᵀ·Pᵀ: lane (g, t) loads D/8 codes (dims g·D/8 …) of keys 2t, 2t+1, 2t+8, 2t+9; ``prmt``
      pairs a dim of two keys (the A fragment of m-tile i: dims g·D/8 + 2i, + 2i+1); Pᵀ's B fragment
      comes from the score lanes by shuffles. Accumulators: D/16 m-tiles × 4 float32 per lane.

    Decoding: fp8 by ``cvt.rn.f16x2.e4m3x2`` (one instruction per two codes; NaN codes give NaN, so no
    test); int8 by flipping the bytes' sign bits (one logic op per word) and a ``prmt`` that puts a byte
    in the mantissa of f16 1024: 1152 + c, exact. K's codes keep the 1152: the scores' accumulators start
    at −1152·Σq (Σq of the f16 query row in float64, exact, rounded once to float32), so no subtraction
    per pair; V's pairs (one ``prmt`` of key b's dims with 0x64 bytes, one per pair putting key a's byte
    in) keep the exact f16x2 subtraction of 1152 (the bias left in P·V would cost float32 precision of the
    output: 1152·l against an output of a few code units). Precision: the products are exact
    (f16 × f16), the sums float32 on the tensor core; P is split into two f16 halves (``SPLITP``:
    P ≈ hi + lo, relative error ~2⁻²², one more mma per m-tile) so that it is not rounded to 11 bits.
    Scales: K's on the scores (per head: once in the score scale), V's on P (per token: fp8 after the
    shuffles; int8 on the score lanes, keys g, g+8, before them, after the row sum) or on the
    accumulators at the end. int8 addresses: the 32-bit (row, head) index row·Hkv + h of each key's cache
    row, from the step's page (one table load) as min(row of key j0 + offset, row of the last key), gives
    the 16-byte loads' addresses (one ``mad.wide.u32`` each on a hoisted base) and the per-token scales'
    (the K rows' index: the scales are (rows, Hkv)).

    ``PF`` > 0 (``paged_split_k``'s ``prefetch``): after its step's loads a warp prefetches into L2
    (``prefetch.global.L2``, no register held; one per 128-byte line of a cache row) the K and V rows, and
    the per-token scales, of its step ``PF`` rounds ahead (key ``j0 + PF·16·NW``, where it is below
    ``hi``). Without it ptxas, at the 128-register cap of two 8-warp blocks per SM, issues some of V's
    16-byte loads after the first K mma, which waits for K (int8/token: all four, fp8/head: two; in the PTX they
    all come first): a step makes a second round trip to DRAM where the fp16 path issues its 4 KiB per warp
    at once. With it a step's loads find their bytes in L2 or on the way, and the bytes in flight per SM no
    longer depend on the registers.

    ``HW`` > 1 (``paged_split_k``'s ``step_heads``; one query row per KV head): a warp step's 16 rows are 16 / HW
    tokens × HW adjacent KV heads (row i: token i / HW, head i % HW) instead of 16 tokens of one head, and the N
    columns are the HW heads' query rows (the block reads HW KV heads, its rows are theirs). A page row holds the
    Hkv heads' rows of a token side by side, so a step reads HW heads' rows of a token as HW·D contiguous bytes.
    Sᵀ then holds every (row, head) product; a score counts only in its own head's column (the others are masked
    out of the maxima and get probability 0, so Pᵀ's zeros keep each head's Oᵀ column its own).

    ``NST`` > 1 (``paged_split_k``'s ``stages``): the cache bytes reach the fragments through a ring of ``NST`` warp
    steps per warp in dynamic shared memory, filled by ``cp.async`` (``issue_step``): a step's 16 K rows and 16 V
    rows are copied as whole rows (lane L the 16-byte chunk L % (D/16) of row L / (D/16) of each 32 chunks, so one
    instruction moves 512 contiguous bytes of a token's S = ``HW`` heads where the direct loads move 8 half rows),
    the lane's int8 per-token scales loaded into a register queue of ``NST`` − 1 steps as the copies are issued
    (4-byte copies through shared memory made the per-token ring 3.5 % slower on an H100); a warp keeps ``NST`` − 1
    steps in flight while it computes one, where the direct loads wait for each step's bytes before its arithmetic.
    Every address's per-lane part is computed once before the key loop (``ring_offsets``).
    The fragments are then read from shared memory as they were from global (``ld.shared.v4``), a row's chunks
    stored XOR-swizzled (``ring_chunk``) so that neither the K nor the V reads conflict on banks (D = 128). The
    copies are ``cp.async.ca``: with ``.cg`` (L2 only) Nsight Compute counted twice the L2 sectors of the direct
    loads for the same DRAM bytes on an H100 (67.1M against 33.6M, int8/head KV 16k), with ``.ca`` the same 33.6M in
    fewer requests (8.4M against 9.8M)."""
    from numba_attn.gpu.intrinsics import (add_u32, cp_async16_at_ca, cvt_e4m3x4_f16x2, ld_at,
                                           ld_global_v2_at, ld_global_v4_at, mad_u32, sub_f16x2)

    NR = G * Nq  # query rows of a KV head (≤ 8: the N of the mma)
    RB = NR * HW  # query rows of the block (HW > 1: one per KV head, HW heads)
    KS = 16 // HW  # tokens of a warp step
    LHW = HW.bit_length() - 1
    _, _, _, _, write_rows, combine_last = chunk_steps(D, 8, 1, 1, NW, RB, Nq, G * HW, causal, False, BASE2=True)
    NKS = D // 16  # k-steps of Sᵀ: one word of a key per lane each
    NKC = NKS // 4  # 16-byte chunks of a key row per lane
    VWL = D // 32  # words of a V row per lane (dims g·D/8 …)
    D8 = D // 8
    NMT = D // 16  # m-tiles of Oᵀ (dims)
    NQB, NACC, NVW = 2 * NKS, 4 * NMT, 4 * VWL  # (local array sizes: compile-time constants)
    LOGP, STEP = page_steps(P, KS)  # (STEP: a step's KS tokens never cross a page)
    NT = NW * WARP_SIZE
    FP8 = KV8 == 1
    D4 = D // 4  # 32-bit words of a cache row of one head
    I8_SIGN = uint32(0x80808080)  # every byte's sign bit: int8 c → the unsigned byte c + 128
    I8_HI = uint32(0x64646464)  # the high byte of f16 1024 (x in the low byte: 1024 + x)
    I8_BIAS = uint32(0x64806480)  # f16x2 (1152, 1152)
    CPR = D // 16  # 16-byte chunks of a cache row of one head
    NCP = 16 * CPR // WARP_SIZE  # ring: 16-byte copies per lane per step, of K and of V each
    SLOT = 32  # ring rows of a step: K's 16, then V's 16
    RING_ROWS = max(1, NW * NST * SLOT)
    RING_WORDS = RING_ROWS * D4  # (dynamic_tile's sizes: closure constants, not expressions)
    WAIT = max(0, NST - 2)  # cp.async groups left in flight when a step's bytes are needed
    NVC = max(1, VWL // 4)  # ring: 16-byte reads of a V row per lane
    NKOF, NVOF = 2 * NKC, 4 * NVC  # (local array sizes)
    NSQ = max(1, (NST - 1) * 4)  # ring, per-token scales (int8): a lane's 4 a step (K's and V's of rows g, g+8),
    #                               queued for NST − 1 steps
    if NST and not STEP:
        raise ValueError(f"the ring needs pages of whole warp steps (page size {P}, {KS} tokens a step)")
    if NST and TOKEN and FP8:
        raise ValueError("the ring: per-token scales with int8 codes only (fp8 takes a tensor or head scale)")
    SWZ = min(8, CPR) - 1

    @device
    def ring_chunk(c, r):
        """Where 16-byte chunk ``c`` of ring row ``r`` is stored in its row: ``c`` XOR ((r & 1)·4 ^ ((r >> 1) & 3)·2)
        on its low three bits (two at D 64), a permutation of the row's chunks under which the K fragment reads
        (rows g, g+8; chunks t + 4c) and the V reads (rows 2t + b; chunk g·D/128 + c) each hit every bank once per
        8 lanes at D 128."""
        return c ^ ((((r & 1) << 2) ^ (((r >> 1) & 3) << 1)) & SWZ)

    @device
    def k_pairs(x):
        """One word of a key's codes → the two f16x2 of a k-step (fp8: bytes 0,1 and 2,3; int8: 0,2 and 1,3).
        int8: each code c as f16 1152 + c (exact: the sign-flipped byte in the mantissa of 1024, one
        ``prmt`` per pair); the 1152 stays in, the scores start from −1152·Σq instead."""
        if FP8:
            return cvt_e4m3x4_f16x2(x)
        y = x ^ I8_SIGN
        return byte_perm(y, I8_HI, uint32(0x4240)), byte_perm(y, I8_HI, uint32(0x4341))

    @device
    def v_pairs(a, b, lo):
        """Dims (byte 0, byte 1) of keys a, b (``lo``) or (2, 3) → two f16x2 of (key a, key b) per dim.
        int8: key b's two dims first as f16x2 1152 + c (one ``prmt``), then each pair by one ``prmt`` of
        key a's byte into it, and ``sub.rn.f16x2`` of 1152 (exact)."""
        if FP8:
            return cvt_e4m3x4_f16x2(byte_perm(a, b, uint32(0x5140 if lo else 0x7362)))
        ya = a ^ I8_SIGN
        yb = byte_perm(b ^ I8_SIGN, I8_HI, uint32(0x4140 if lo else 0x4342))  # b's dims (0, 1) or (2, 3)
        return (sub_f16x2(byte_perm(ya, yb, uint32(0x5450 if lo else 0x5452)), I8_BIAS),
                sub_f16x2(byte_perm(ya, yb, uint32(0x7651 if lo else 0x7653)), I8_BIAS))

    @device
    def prefetch_step(k, v, ks, vs, table, tbl, seq, h, Hkv, jn, hi, g, t):
        """L2 prefetch of the cache rows of the warp's step at key ``jn`` (< ``hi``), one ``prefetch`` per
        128-byte line of each row among the 32 lanes: lane (g, t) takes line t & 1 of K row g + 8·(t >> 1)
        and line g & 1 of V row 2t + (g >> 1 & 1) + 8·(g >> 2) (the step's 16 K and 16 V rows, D ≤ 256), and
        with per-token scales the K and V scales of its K row (line 0 lanes); rows found as the int8 loads
        find theirs (keys past ``hi`` clamped to the last)."""
        if STEP:  # (int8: tbl, the sequence's block-table row, flat, as its loads read it)
            pg = table[seq, jn >> LOGP] if FP8 else ld_at(table, add_u32(tbl, jn >> LOGP))
            rb = mad_u32(pg, P, jn & (P - 1))
            rl = add_u32(rb, hi - 1 - jn)
        kl = t & 1
        vl = g & 1
        ko = g + 8 * (t >> 1)
        vo = 2 * t + ((g >> 1) & 1) + 8 * (g >> 2)
        if STEP:
            krow = min(add_u32(rb, ko), rl)
            vrow = min(add_u32(rb, vo), rl)
        else:
            jk = min(jn + ko, hi - 1)
            jv = min(jn + vo, hi - 1)
            krow = mad_u32(table[seq, jk >> LOGP], P, jk & (P - 1))
            vrow = mad_u32(table[seq, jv >> LOGP], P, jv & (P - 1))
        krh = mad_u32(krow, Hkv, h)
        if 128 * kl < D:
            prefetch_l2_at(k, krh, D4, 32 * kl, 0)
        if 128 * vl < D:
            prefetch_l2_at(v, mad_u32(vrow, Hkv, h), D4, 32 * vl, 0)
        if TOKEN and kl == 0:
            prefetch_l2_at(ks, krh, 1, 0, 0)
            prefetch_l2_at(vs, krh, 1, 0, 0)

    @device
    def put_words(a, i, x):
        """The four words of a 16-byte load ``x`` into ``a[i … i+3]``."""
        a[i] = x[0]
        a[i + 1] = x[1]
        a[i + 2] = x[2]
        a[i + 3] = x[3]

    @device
    def row_head(r, Hkv, h):
        """The (cache row, head) index of step row ``r`` (token r / HW, head h + r % HW) relative to the step's
        first cache row."""
        return mad_u32(r >> LHW, Hkv, h + (r & (HW - 1)))

    @device
    def ring_offsets(h, Hkv, lane, g, t, csrc, cdst, kof, vof, sof):
        """The lane's constant parts of the ring's addresses, computed once before the key loop: ``csrc[j]``, the
        (cache row, head) index of copy j's row relative to the step's first row (row r = lane / (D/16) + j·32/(D/16));
        ``cdst[j]``, its word in a ring slot (chunk lane % (D/16) of row r, swizzled); ``kof``, ``vof``, the words
        of the K and V fragments' 16-byte reads in a slot (``ring_chunk``); ``sof``, the rows of the lane's
        per-token scales (K rows g, g+8), then their (row, head) indices relative to the step's first cache row."""
        c = lane % CPR
        for j in range(NCP):
            r = lane // CPR + j * (WARP_SIZE // CPR)
            csrc[j] = row_head(r, Hkv, h)
            cdst[j] = r * D4 + 4 * ring_chunk(c, r)
        for kk in range(2):
            r = g + 8 * kk
            for c in range(NKC):
                kof[kk * NKC + c] = r * D4 + 4 * ring_chunk(t + 4 * c, r)
        for kk in range(4):
            vr = 2 * t + (kk & 1) + 8 * (kk >> 1)
            for c in range(NVC):
                ch = g * (VWL // 4) + c if VWL % 4 == 0 else g >> 1
                vof[kk * NVC + c] = (16 + vr) * D4 + 4 * ring_chunk(ch, vr)
        for m in range(2):
            sof[m] = g + 8 * m
            sof[2 + m] = row_head(g + 8 * m, Hkv, h)

    @device
    def issue_step(k, v, ks, vs, ring, sq, table, tbl, Hkv, j0, hi, wr, lane, csrc, cdst, sof):
        """cp.async of the warp step at key ``j0`` (< ``hi``; both 32-bit) into the ring slot at row ``wr`` (K; V 16
        rows on), and with per-token scales the lane's 4 scales loaded into the last 4 registers of the queue ``sq``
        (plain loads: they land while the NST − 1 steps before this one compute). Row r is token
        j0 + r / HW, head h + r % HW (a step never crosses a page: one page index); lane L copies chunk L % (D/16)
        of rows L / (D/16) + j·32/(D/16). A token at or past ``hi`` is zero-filled and not read, its scales zero (its
        scores are masked; zeros keep a stale NaN code or scale out of P·V)."""
        rb = mad_u32(ld_at(table, add_u32(tbl, j0 >> LOGP)), P, j0 & (P - 1))  # the step's first cache row
        rbh = mad_u32(rb, Hkv, 0)
        nn = mad_u32(min(hi - j0, uint64(KS)), HW, 0)  # rows of the step that exist
        wd = mad_u32(wr, D4, 0)
        for j in range(NCP):
            ok = add_u32(lane // CPR, j * (WARP_SIZE // CPR)) < nn
            row = add_u32(rbh, csrc[j])
            do = add_u32(wd, cdst[j])
            cp_async16_at_ca(ring, do, k, row, D4, 4 * (lane % CPR), 0, ok)  # (.ca: .cg read every L2 sector
            cp_async16_at_ca(ring, add_u32(do, 16 * D4), v, row, D4, 4 * (lane % CPR), 0, ok)  # twice, measured)
        if TOKEN:
            for m in range(4):  # the K scales of rows g, g+8, then their V scales
                x = float32(0.0)
                if sof[m & 1] < nn:
                    x = ld_at(ks if m < 2 else vs, add_u32(rbh, sof[2 + (m & 1)]))
                sq[NSQ - 4 + m] = x

    @device
    def ring_k(ring, kw, rk, kof):
        """The step's K fragment words (rows g, g+8; chunks t, t+4, …) from its ring slot (at row ``rk``), as the
        direct loads give them."""
        kb = mad_u32(rk, D4, 0)
        for kk in range(2):
            for c in range(NKC):
                put_words(kw, kk * NKS + 4 * c, ld_shared_v4(ring, 0, add_u32(kb, kof[kk * NKC + c])))

    @device
    def ring_scales(sq, ksc, vsc, scale):
        """This step's per-token scales from the front of the queue ``sq`` (as the direct loads give them), and
        the queue moved up by one step."""
        ksc[0] = scale * sq[0]
        ksc[1] = scale * sq[1]
        vsc[0] = sq[2]
        vsc[1] = sq[3]
        for i in range(NSQ - 4):
            sq[i] = sq[4 + i]

    @device
    def ring_v(ring, vw, rk, vof, g):
        """The step's V words (rows 2t, 2t+1, 2t+8, 2t+9; words g·D/32 …) from its ring slot (at row ``rk``), as
        the direct loads give them."""
        kb = mad_u32(rk, D4, 0)
        for kk in range(4):
            if VWL % 4 == 0:
                for c in range(NVC):
                    put_words(vw, kk * VWL + 4 * c, ld_shared_v4(ring, 0, add_u32(kb, vof[kk * NVC + c])))
            else:  # D 64: words 2g, 2g+1, half of chunk g / 2
                x0, x1, x2, x3 = ld_shared_v4(ring, 0, add_u32(kb, vof[kk]))
                vw[kk * VWL] = x2 if g & 1 else x0
                vw[kk * VWL + 1] = x3 if g & 1 else x1

    @device
    def frag_block(q, k, v, o, part_o, part_lse, counters, scale, Hkv, Nk, seq, table, ks, vs, chunk, S,
                   sm_m, sm_l, sm_o, sm_last, ring):
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y  # b * Hkv + kv head (one row block: NR ≤ 8); HW > 1: b * Hkv / HW + group of HW heads
        h = (kvh - seq * (Hkv // HW)) * HW  # the (first) KV head
        lo = split * chunk
        hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        w = add_u32(tid >> 5, 0)  # (a 32-bit warp index: int64 tid // 32 was spilled across the key loop, 8 B)
        lane = tid % WARP_SIZE
        g = lane // 4
        t = lane % 4
        # Qᵀ's B fragments: row g, the dims of lane t's word of each k-step, paired as k_pairs pairs them
        qb = cuda.local.array(NQB, uint32)
        qi = g - (g // Nq) * Nq
        bh = kvh * (G * HW) + g // Nq
        qsum = float64(0.0)  # int8: row g's sum over this lane's dims (float64: exact for f16 values)
        for kx in range(NKS):
            d0 = 4 * (4 * (t + 4 * (kx // 4)) + kx % 4)
            if g < RB:
                if FP8:
                    qb[2 * kx] = pack_f16x2(float32(q[bh, qi, d0]), float32(q[bh, qi, d0 + 1]))
                    qb[2 * kx + 1] = pack_f16x2(float32(q[bh, qi, d0 + 2]), float32(q[bh, qi, d0 + 3]))
                else:
                    x0 = float32(q[bh, qi, d0])
                    x1 = float32(q[bh, qi, d0 + 1])
                    x2 = float32(q[bh, qi, d0 + 2])
                    x3 = float32(q[bh, qi, d0 + 3])
                    qb[2 * kx] = pack_f16x2(x0, x2)
                    qb[2 * kx + 1] = pack_f16x2(x1, x3)
                    qsum += (float64(x0) + float64(x1)) + (float64(x2) + float64(x3))
            else:
                qb[2 * kx] = uint32(0)
                qb[2 * kx + 1] = uint32(0)
        # keys < lim of rows 2t, 2t+1 (causal: bottom-right aligned; a padding row sees the split)
        r0 = 2 * t
        r1 = 2 * t + 1
        cb0 = float32(0.0)
        cb1 = float32(0.0)
        if not FP8:  # int8: the scores' start, −1152·Σq of rows 2t, 2t+1 (exact sum, rounded once to float32)
            qsum += shfl_xor_sync(FULL_MASK, qsum, 1)
            qsum += shfl_xor_sync(FULL_MASK, qsum, 2)
            cb = float32(qsum * float64(-1152.0))
            cb0 = shfl_sync(FULL_MASK, cb, 4 * r0)
            if RB > 1:  # (one row: row 2t+1 is padding everywhere)
                cb1 = shfl_sync(FULL_MASK, cb, 4 * r1)
        lim0 = min(hi, r0 - (r0 // Nq) * Nq + Nk - Nq + 1) if causal and r0 < RB else hi
        lim1 = min(hi, r1 - (r1 // Nq) * Nq + Nk - Nq + 1) if causal and r1 < RB else hi
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = float32(0.0)
        kw = cuda.local.array(NQB, uint32)  # keys g, g+8: NKS words each
        vw = cuda.local.array(NVW, uint32)  # keys 2t, 2t+1, 2t+8, 2t+9: VWL words each
        ksc = cuda.local.array(2, float32)
        vsc = cuda.local.array(4, float32)
        c0h = h + (min(r0, RB - 1) if HW > 1 else 0)  # the KV heads of columns 2t, 2t+1 (HW > 1: one each)
        c1h = h + (min(r1, RB - 1) if HW > 1 else 0)
        sk0 = scale * ks[0, c0h] if not TOKEN else scale
        sk1 = scale * ks[0, c1h] if not TOKEN else scale
        tbl = mad_u32(seq, table.shape[1], 0) if not FP8 or NST else 0  # int8, ring: the block-table row, flat
        m0 = NEG_BIG
        m1 = NEG_BIG
        l0 = float32(0.0)
        l1 = float32(0.0)
        n_steps = max(0, (hi - lo + KS - 1) // KS)  # 0 for a split past the end
        rk = uint32(0)  # the ring (32-bit row indices): the slot of this step (K's rows; V's 16 on) ...
        wr = uint32(0)  # ... and the slot the step NST − 1 rounds ahead is copied into (the last step's)
        rend = uint32(0)  # (the end of the warp's slots)
        hi32 = add_u32(hi, 0)
        if NST:  # the warp's first NST − 1 steps in flight
            csrc = cuda.local.array(NCP, uint32)
            cdst = cuda.local.array(NCP, uint32)
            kof = cuda.local.array(NKOF, uint32)
            vof = cuda.local.array(NVOF, uint32)
            sof = cuda.local.array(4, uint32)
            sq = cuda.local.array(NSQ, float32)  # per-token scales of the steps in flight, this step's first
            for i in range(NSQ):
                sq[i] = float32(0.0)
            ring_offsets(h, Hkv, lane, g, t, csrc, cdst, kof, vof, sof)
            rk = mad_u32(w, NST * SLOT, 0)  # the warp's slot 0
            for st in range(NST - 1):
                if TOKEN:
                    ring_scales(sq, ksc, vsc, scale)  # (moves the queue up: step st's scales go last)
                if w + st * NW < n_steps:
                    issue_step(k, v, ks, vs, ring, sq, table, tbl, Hkv, add_u32(lo, (w + st * NW) * KS), hi32,
                               add_u32(rk, st * SLOT), lane, csrc, cdst, sof)
                cp_async_commit()
            wr = add_u32(rk, (NST - 1) * SLOT)
            rend = add_u32(rk, NST * SLOT)
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles and mma stay convergent
            j0 = lo + step * KS
            if NST:
                cp_async_wait(WAIT)  # this lane's copies of this step have landed ...
                syncwarp(FULL_MASK)  # ... and every lane's; every lane is done with slot wr (the last step's)
                if TOKEN:
                    ring_scales(sq, ksc, vsc, scale)
                jn = add_u32(j0, (NST - 1) * NW * KS)
                if jn < hi32:
                    issue_step(k, v, ks, vs, ring, sq, table, tbl, Hkv, jn, hi32, wr, lane, csrc, cdst, sof)
                cp_async_commit()
                ring_k(ring, kw, rk, kof)  # (V's words where they are used)
            elif FP8:
                pg = table[seq, j0 >> LOGP] if STEP else 0
                for kk in range(2):  # K rows g, g+8
                    jj = min(j0 + ((g + 8 * kk) >> LHW), hi - 1)
                    page = pg if STEP else table[seq, jj >> LOGP]
                    crow = page * P + (jj & (P - 1))
                    hk = h + ((g + 8 * kk) & (HW - 1))
                    for c in range(NKC):
                        x0, x1, x2, x3 = ld_global_v4(k, crow, hk, 4 * (t + 4 * c))
                        kw[kk * NKS + 4 * c] = x0
                        kw[kk * NKS + 4 * c + 1] = x1
                        kw[kk * NKS + 4 * c + 2] = x2
                        kw[kk * NKS + 4 * c + 3] = x3
                    if TOKEN:
                        ksc[kk] = scale * ks[crow, hk]
                for kk in range(4):  # V rows 2t, 2t+1, 2t+8, 2t+9
                    vr = 2 * t + (kk & 1) + 8 * (kk >> 1)
                    jj = min(j0 + (vr >> LHW), hi - 1)
                    page = pg if STEP else table[seq, jj >> LOGP]
                    crow = page * P + (jj & (P - 1))
                    hv = h + (vr & (HW - 1))
                    if VWL % 4 == 0:
                        for c in range(VWL // 4):
                            x0, x1, x2, x3 = ld_global_v4(v, crow, hv, g * VWL + 4 * c)
                            vw[kk * VWL + 4 * c] = x0
                            vw[kk * VWL + 4 * c + 1] = x1
                            vw[kk * VWL + 4 * c + 2] = x2
                            vw[kk * VWL + 4 * c + 3] = x3
                    else:
                        for c in range(VWL // 2):
                            x0, x1 = ld_global_v2(v, crow, hv, g * VWL + 2 * c)
                            vw[kk * VWL + 2 * c] = x0
                            vw[kk * VWL + 2 * c + 1] = x1
                    if TOKEN:
                        vsc[kk] = vs[crow, hv]
            else:  # int8: addresses from 32-bit cache row indices (row·Hkv + h: a (row, head) of D/4 words)
                if STEP:  # the step's page: rows rb + o of keys j0 + o, clamped to the last key's row rl
                    rb = mad_u32(ld_at(table, add_u32(tbl, j0 >> LOGP)), P, j0 & (P - 1))
                    rl = add_u32(rb, hi - 1 - j0)
                for kk in range(2):  # K rows g, g+8, and their K and V scales (per token)
                    if STEP:
                        krow = min(add_u32(rb, (g + 8 * kk) >> LHW), rl)
                    else:
                        jk = min(j0 + ((g + 8 * kk) >> LHW), hi - 1)
                        krow = mad_u32(table[seq, jk >> LOGP], P, jk & (P - 1))
                    krh = mad_u32(krow, Hkv, h + ((g + 8 * kk) & (HW - 1)))
                    for c in range(NKC):
                        x0, x1, x2, x3 = ld_global_v4_at(k, krh, D4, 4 * t, 16 * c)
                        kw[kk * NKS + 4 * c] = x0
                        kw[kk * NKS + 4 * c + 1] = x1
                        kw[kk * NKS + 4 * c + 2] = x2
                        kw[kk * NKS + 4 * c + 3] = x3
                    if TOKEN:  # the scales are (rows, Hkv): the same index
                        ksc[kk] = scale * ld_at(ks, krh)
                        vsc[kk] = ld_at(vs, krh)
                for kk in range(4):  # V rows 2t, 2t+1, 2t+8, 2t+9
                    vr = 2 * t + (kk & 1) + 8 * (kk >> 1)
                    if STEP:
                        vrow = min(add_u32(rb, vr >> LHW), rl)
                    else:
                        jv = min(j0 + (vr >> LHW), hi - 1)
                        vrow = mad_u32(table[seq, jv >> LOGP], P, jv & (P - 1))
                    vrh = mad_u32(vrow, Hkv, h + (vr & (HW - 1)))
                    if VWL % 4 == 0:
                        for c in range(VWL // 4):
                            x0, x1, x2, x3 = ld_global_v4_at(v, vrh, D4, g * VWL, 4 * c)
                            vw[kk * VWL + 4 * c] = x0
                            vw[kk * VWL + 4 * c + 1] = x1
                            vw[kk * VWL + 4 * c + 2] = x2
                            vw[kk * VWL + 4 * c + 3] = x3
                    else:
                        for c in range(VWL // 2):
                            x0, x1 = ld_global_v2_at(v, vrh, D4, g * VWL, 2 * c)
                            vw[kk * VWL + 2 * c] = x0
                            vw[kk * VWL + 2 * c + 1] = x1
            if PF:  # the warp's step PF rounds ahead: towards L2 while this one computes
                jn = j0 + PF * 16 * NW
                if jn < hi:
                    prefetch_step(k, v, ks, vs, table, tbl, seq, h, Hkv, jn, hi, g, t)
            # Sᵀ = K Qᵀ (c0, c1: key g, rows 2t, 2t+1; c2, c3: key g+8)
            s0 = cb0  # fp8: 0; int8: −1152·Σq (the codes' bias)
            s1 = cb1
            s2 = cb0
            s3 = cb1
            for kx in range(NKS):
                a0, a2 = k_pairs(kw[kx])
                a1, a3 = k_pairs(kw[NKS + kx])
                s0, s1, s2, s3 = mma_f16(a0, a1, a2, a3, qb[2 * kx], qb[2 * kx + 1], s0, s1, s2, s3)
            if TOKEN:
                s0 *= ksc[0]
                s1 *= ksc[0]
                s2 *= ksc[1]
                s3 *= ksc[1]
            else:
                s0 *= sk0
                s1 *= sk1
                s2 *= sk0
                s3 *= sk1
            # online softmax (base 2) of rows 2t, 2t+1 over the step's 16 keys (HW > 1: its (token, head) rows;
            # the 8 lanes of a t)
            ja = j0 + (g >> LHW)  # the tokens of rows g, g+8
            jb = j0 + ((g + 8) >> LHW)
            ok0 = ja < lim0
            ok1 = ja < lim1
            ok2 = jb < lim0
            ok3 = jb < lim1
            if HW > 1:  # a row's score counts in its own head's column only (rows g, g+8: head g % HW)
                hg = g & (HW - 1)
                ok0 = ok0 and hg == r0
                ok1 = ok1 and hg == r1
                ok2 = ok2 and hg == r0
                ok3 = ok3 and hg == r1
            # (a NaN score, from a NaN code in K, is left out of the maxima, as fmaxf leaves it: its
            # probability is NaN, and so the row's sum and output)
            mx0 = max(max(NEG_BIG, s0 if ok0 else NEG_BIG), s2 if ok2 else NEG_BIG)
            mx1 = max(max(NEG_BIG, s1 if ok1 else NEG_BIG), s3 if ok3 else NEG_BIG)
            for off in (4, 8, 16):
                mx0 = max(mx0, shfl_xor_sync(FULL_MASK, mx0, off))
                mx1 = max(mx1, shfl_xor_sync(FULL_MASK, mx1, off))
            mn0 = max(m0, mx0)
            mn1 = max(m1, mx1)
            p0 = math.exp2(s0 - mn0) if ok0 else float32(0.0)
            p1 = math.exp2(s1 - mn1) if ok1 else float32(0.0)
            p2 = math.exp2(s2 - mn0) if ok2 else float32(0.0)
            p3 = math.exp2(s3 - mn1) if ok3 else float32(0.0)
            if mn0 > m0 or mn1 > m1:  # rescale only when a row's maximum moved
                c0 = math.exp2(m0 - mn0)
                c1 = math.exp2(m1 - mn1)
                l0 *= c0
                l1 *= c1
                for i in range(NMT):
                    acc[4 * i] *= c0
                    acc[4 * i + 1] *= c1
                    acc[4 * i + 2] *= c0
                    acc[4 * i + 3] *= c1
                m0 = mn0
                m1 = mn1
            l0 += p0 + p2
            l1 += p1 + p3
            if TOKEN and not FP8:  # int8: keys g, g+8's V scales on their probabilities here, before the shuffles
                p0 *= vsc[0]
                p1 *= vsc[0]
                p2 *= vsc[1]
                p3 *= vsc[1]
            # Pᵀ's B fragment of lane (g, t): P[keys 2t, 2t+1 | 2t+8, 2t+9][row g], from lanes (2t | 2t+1, g // 2)
            sa = 8 * t + g // 2
            sb = sa + 4
            if RB > 1:  # row g is row 2t' or 2t'+1 of its source lanes: both fetched, one kept
                odd = (g & 1) != 0
                e0 = shfl_sync(FULL_MASK, p0, sa)
                e1 = shfl_sync(FULL_MASK, p1, sa)
                e2 = shfl_sync(FULL_MASK, p0, sb)
                e3 = shfl_sync(FULL_MASK, p1, sb)
                f0 = shfl_sync(FULL_MASK, p2, sa)
                f1 = shfl_sync(FULL_MASK, p3, sa)
                f2 = shfl_sync(FULL_MASK, p2, sb)
                f3 = shfl_sync(FULL_MASK, p3, sb)
                xa = e1 if odd else e0
                xb = e3 if odd else e2
                ya = f1 if odd else f0
                yb = f3 if odd else f2
            else:  # one row: only lanes g = 0 matter (the others compute padding rows)
                xa = shfl_sync(FULL_MASK, p0, sa)
                xb = shfl_sync(FULL_MASK, p0, sb)
                ya = shfl_sync(FULL_MASK, p2, sa)
                yb = shfl_sync(FULL_MASK, p2, sb)
            if TOKEN and FP8:  # each key's V scale on its probability (l is already summed)
                xa *= vsc[0]
                xb *= vsc[1]
                ya *= vsc[2]
                yb *= vsc[3]
            pb0 = pack_f16x2(xa, xb)
            pb1 = pack_f16x2(ya, yb)
            if SPLITP:  # the part of P that f16 rounded away, as a second f16 operand
                ha, hb = unpack_f16x2(pb0)
                hc, hd = unpack_f16x2(pb1)
                qb0 = pack_f16x2(xa - ha, xb - hb)
                qb1 = pack_f16x2(ya - hc, yb - hd)
            if NST:  # V's words from the ring only now: K's registers are free again
                ring_v(ring, vw, rk, vof, g)
                wr = rk  # the next step NST − 1 rounds ahead goes into this slot, and the next slot is read
                rk = add_u32(rk, SLOT) if add_u32(rk, SLOT) != rend else add_u32(rk, SLOT - NST * SLOT)
            # Oᵀ += Vᵀ Pᵀ, m-tiles 2x, 2x+1 from word x of the four keys
            for x in range(VWL):
                for half in range(2):
                    a0, a1 = v_pairs(vw[x], vw[VWL + x], half == 0)
                    a2, a3 = v_pairs(vw[2 * VWL + x], vw[3 * VWL + x], half == 0)
                    i = 2 * x + half
                    acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3] = mma_f16(
                        a0, a1, a2, a3, pb0, pb1, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])
                    if SPLITP:
                        acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3] = mma_f16(
                            a0, a1, a2, a3, qb0, qb1, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])
        # the warp's state: l summed over the 8 lanes of a row pair; O rows 2t, 2t+1 into shared memory
        for off in (4, 8, 16):
            l0 += shfl_xor_sync(FULL_MASK, l0, off)
            l1 += shfl_xor_sync(FULL_MASK, l1, off)
        vh0 = float32(1.0) if TOKEN else vs[0, c0h]
        vh1 = float32(1.0) if TOKEN else vs[0, c1h]
        for i in range(NMT):
            d = g * D8 + 2 * i
            if r0 < RB:
                sm_o[w, r0, d] = acc[4 * i] * vh0
                sm_o[w, r0, d + 1] = acc[4 * i + 2] * vh0
            if r1 < RB:
                sm_o[w, r1, d] = acc[4 * i + 1] * vh1
                sm_o[w, r1, d + 1] = acc[4 * i + 3] * vh1
        if g == 0:
            if r0 < RB:
                sm_m[w, r0] = m0
                sm_l[w, r0] = l0
            if r1 < RB:
                sm_m[w, r1] = m1
                sm_l[w, r1] = l1
        cuda.syncthreads()
        write_rows(o, part_o, part_lse, split, kvh, 0, tid, sm_m, sm_l, sm_o)  # lse back to natural units
        if Nk == 0 and split == 0:  # an empty sequence: a zero partial of weight 1, the output is zeros
            for idx in range(tid, RB * D, NT):  # the threads that wrote the log-sum-exps (d = 0)
                r = idx // D
                if idx == r * D:
                    part_lse[0, (kvh * G * HW + r // Nq) * Nq + r % Nq] = float32(0.0)
        if FUSED:
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, 0, tid, cuda.blockIdx.y)

    @kernel(launch_bounds=(NT, MINB))
    def paged_split_k_mma8(q, k, v, o, part_o, part_lse, counters, scale, Hkv, table, seqlens, ks, vs, chunk, S):
        sm_m = cuda.shared.array((NW, RB), float32)
        sm_l = cuda.shared.array((NW, RB), float32)
        sm_o = cuda.shared.array((NW, RB, D), float32)
        sm_last = cuda.shared.array(1, int32)
        if NST:  # the ring (dynamic shared memory: ring_bytes)
            ring = dynamic_tile(0, 1, RING_WORDS)  # (flat: 32-bit word offsets)
        else:
            ring = sm_m
        seq = cuda.blockIdx.y // (Hkv // HW)
        frag_block(q, k, v, o, part_o, part_lse, counters, scale, Hkv, seqlens[seq], seq, table, ks, vs, chunk,
                   S, sm_m, sm_l, sm_o, sm_last, ring)  # the sequence's own number of keys

    return paged_split_k_mma8


def ring_bytes(D: int, NW: int, NST: int) -> int:
    """Dynamic shared memory of ``make_frag8_kernel``'s ring: ``NST`` slots per warp of 16 K and 16 V rows of D
    bytes."""
    return NW * NST * 32 * D


def paged_scales(problem, ks, vs):
    """Host scales → the float32 (rows, Hkv) device arrays the kernels index (a dummy
    (1, 1) for a 16-bit cache)."""
    Hkv = problem.kv_heads
    out = []
    for s in (ks, vs):
        if s is None:
            out.append(np.zeros((1, 1), np.float32))
            continue
        a = np.asarray(s, np.float32)
        a = np.full((1, Hkv), float(a), np.float32) if a.ndim == 0 else a.reshape(-1, Hkv)
        out.append(np.ascontiguousarray(a))
    return tuple(cuda.to_device(a) for a in out)


class PagedLayout:
    """The block table, lengths and scales a paged launch reads: a call's own
    (``decode_paged``) or, when a call gives none (the runner), the problem's
    :meth:`PagedProblem.layout`, uploaded once at the first call."""

    def __init__(self, problem):
        self.problem = problem
        self._own = None

    def own(self):
        if self._own is None:
            table, seqlens, ks, vs = self.problem.layout()
            self._own = (cuda.to_device(table), cuda.to_device(seqlens)) + paged_scales(self.problem, ks, vs)
        return self._own


def paged_cache_view(problem, k):
    """A (num_blocks, P, Hkv, D) cache as the (num_blocks·P, Hkv, ·) view the kernels
    index: the elements of a float16 cache, the uint32 words of an 8-bit or bfloat16 one."""

    nb, P, Hkv, D = k.shape
    if getattr(problem, "kv_dtype", ""):
        if k.dtype != np.uint8:
            k = view_as(k, np.uint8)
        k = view_as(k.reshape(nb * P, Hkv, D), np.uint32)
        return k
    if problem.dtype == "bfloat16":
        return view_as(k.reshape(nb * P, Hkv, D), np.uint32)
    return k.reshape(nb * P, Hkv, D)


def paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused, notes="", heads=1, dyn_bytes=0,
                 static_bytes=0):
    """The :class:`Launch`: grid (split, row block of a sequence's KV head, or of ``heads`` adjacent KV heads),
    the workspace, the combine kernel unless fused; ``run(q, k_cache, v_cache, o, stream, layout=None)`` with
    ``layout`` (table, seqlens, k_scale, v_scale) device arrays, else the problem's own (:class:`PagedLayout`).
    ``dyn_bytes``: the kernel's dynamic shared memory (opted in to where it and ``static_bytes``, the kernel's static
    shared memory, pass 48 KiB)."""
    B, H, Hkv, Nq, D = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.head_dim
    S = splits
    n_rc, chunk = split_layout(problem, warps, rows, lanes, keys, S)
    grid = (S, B * Hkv * n_rc // heads)
    part_o, part_lse = split_workspace(max(S, 2), B * H * Nq, D)  # (every split writes a partial)
    kernels = [kern]
    if not fused:
        comb = make_combine_kernel(Nq, BF16=True) if problem.dtype == "bfloat16" else make_combine_kernel(Nq)
        kernels.append(comb)
    cnt = zeroed_counters(B * Hkv * n_rc)
    own = PagedLayout(problem)

    def run(q, k, v, o, stream=0, layout=None):
        table, seqlens, ks, vs = layout or own.own()
        kc, vc = paged_cache_view(problem, k), paged_cache_view(problem, v)
        check_alignment(kc, vc)
        launch_dynamic(kern, grid, warps * WARP_SIZE, stream, dyn_bytes, q, kc, vc, o, part_o, part_lse, cnt, scale,
                       Hkv, table, seqlens, ks, vs, chunk, S, static_bytes=static_bytes)
        if not fused:
            comb[B * H * Nq, D, stream](part_o, part_lse, o, S)

    return Launch(run, kernels=kernels, workspace_bytes=part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, P={problem.page_size}, {tile_notes(lanes, keys, rows, warps)}{notes}")


def work_list(lens, KS: int, workers: int, min_keys: int = 0):
    """The work list of ``paged_worklist`` (FlashInfer's balanced decode plan): the batch's keys, each
    sequence's rounded up to whole warp steps of ``KS`` keys and laid end to end, cut into ``W`` equal
    shares of whole steps (``W`` = ``workers``, fewer where a share would hold under ``min_keys`` keys).
    Worker w's share is the part of every sequence it covers: an item (sequence b, split s, keys [lo, hi)
    of b, n_b) where n_b is how many items b has (split s is b's s-th, in key order, so a sequence's
    splits are 0 … n_b − 1 and a combine reads exactly n_b partials). A sequence of length 0 is one
    item (b, 0, 0, 0, 1), which writes its zero partial. Returns (``work`` int32 (items, 5), ``wptr`` int32
    (W + 1,): worker w runs items wptr[w] … wptr[w+1] − 1, a contiguous run of sequences). Every item has
    keys except an empty sequence's; ``lo`` is a multiple of ``KS``."""
    lens = np.asarray(lens, np.int64).reshape(-1)
    steps = -(-lens // KS)  # each sequence in whole steps
    total = int(steps.sum())
    W = max(1, min(int(workers), total, -(-total * KS // max(1, min_keys)) if min_keys else total))
    share = -(-total // W)  # steps per worker
    items, owner = [], []
    start = 0  # the sequence's first step in the batch's steps
    for b, n in enumerate(steps.tolist()):
        if n == 0:
            items.append([b, 0, 0, 0, 1])
            owner.append(min(start // share, W - 1))
            continue
        first = len(items)
        w = start // share
        while w * share < start + n:
            lo, hi = max(start, w * share), min(start + n, (w + 1) * share)
            items.append([b, len(items) - first, (lo - start) * KS, min(int(lens[b]), (hi - start) * KS), 0])
            owner.append(w)
            w += 1
        for it in items[first:]:
            it[4] = len(items) - first
        start += n
    work = np.asarray(items, np.int32).reshape(-1, 5)
    wptr = np.searchsorted(np.asarray(owner), np.arange(W + 1), side="left").astype(np.int32)
    return work, wptr


def worklist_plan(lens, Hkv: int, KS: int, workers: int, min_keys: int = 0, flat: bool = False):
    """The work list of ``paged_worklist``'s blocks: (``work`` int32 (items, 5), ``wptr`` int32 (blocks + 1,)),
    as :func:`work_list`'s but with an item's first column the KV head of its sequence, b · Hkv + h.
    ``flat``: one list over every (sequence, KV head) in that order, cut into ``workers`` shares (a share may
    hold the end of one KV head and the start of the next, of this sequence or the next): the blocks can be
    as many as the SMs' slots, whatever the number of KV heads. Else a list per KV head (``workers`` shares
    each), the heads' lists one after the other: Hkv · ``workers`` blocks, block h · W + w running worker w's
    share of head h."""
    lens = np.asarray(lens, np.int64).reshape(-1)
    if flat:
        work, wptr = work_list(np.repeat(lens, Hkv), KS, workers, min_keys)
        return work, wptr
    work, wptr = work_list(lens, KS, workers, min_keys)
    heads = []
    for h in range(Hkv):
        wh = work.copy()
        wh[:, 0] = wh[:, 0] * Hkv + h
        heads.append(wh)
    ptr = np.concatenate([wptr[:-1] + h * len(work) for h in range(Hkv)] + [[Hkv * len(work)]])
    return np.concatenate(heads).astype(np.int32), ptr.astype(np.int32)


def worklist_launch(problem, kern, scale, warps, lanes, rows, keys, workers, blocks_per_sm, min_keys, flat=False,
                    notes=""):
    """The :class:`Launch` of ``paged_worklist``: grid (block, row block), each block running its items of the
    work list (:func:`worklist_plan`); ``workers``: shares per KV head (0: with ``flat``, as many shares as
    fill the SMs' ``blocks_per_sm`` slots once; else as many per KV head as fill them once for all heads
    together, rounded down). ``run(q, k_cache, v_cache, o,
    stream, layout=None, lens=None)`` as :func:`paged_launch`'s; the list is planned on the host from the
    lengths, as serving systems plan each decode step before launching it: the problem's, once (the
    runner's calls), else the call's: ``lens``, their host copy (``decode_paged`` passes the lengths it
    checked), or ``layout``'s read back from the device (one small copy, which waits for the device)."""
    B, H, Hkv, Nq, D = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.head_dim
    n_rc = (problem.group * Nq + rows - 1) // rows
    KS = (WARP_SIZE // lanes) * keys * warps  # keys per round of the block's warps: a split's unit
    slots = sm_count() * blocks_per_sm // n_rc  # blocks (of all KV heads) that fill the SMs' slots once
    W = workers * (Hkv if flat else 1) or max(1, slots if flat else slots // Hkv)
    cnt = zeroed_counters(B * Hkv * n_rc)
    own = PagedLayout(problem)
    plans = {}

    def plan(lens):
        """(work, wptr on the device, blocks, most items of a KV head, items) for these lengths."""
        key = lens.tobytes()
        if key not in plans:
            work, wptr = worklist_plan(lens, Hkv, KS, W, min_keys, flat)
            plans.clear()  # one plan at a time: a decode loop's lengths change every step
            plans[key] = (cuda.to_device(work), cuda.to_device(wptr), int(wptr.size) - 1, int(work[:, 4].max()),
                          int(work.shape[0]))
        return plans[key]

    lens0 = np.ascontiguousarray(problem.seqlens(), np.int32)  # the problem's own lengths (the runner's calls)
    _, _, nw0, smax0, items0 = plan(lens0)
    state = {"ws": split_workspace(max(2, smax0), B * H * Nq, D)}  # grown to a plan's most splits

    def run(q, k, v, o, stream=0, layout=None, lens=None):
        table, seqlens, ks, vs = layout or own.own()
        if lens is None:
            lens = lens0 if layout is None else seqlens.copy_to_host()
        work, wptr, nw, smax, _ = plan(np.ascontiguousarray(lens, np.int32))
        po, pl = state["ws"]
        if po.shape[0] < smax:  # a partial for every (row, split) of the plan
            state["ws"] = po, pl = split_workspace(smax, B * H * Nq, D)
        kc, vc = paged_cache_view(problem, k), paged_cache_view(problem, v)
        check_alignment(kc, vc)
        kern[(nw, n_rc), warps * WARP_SIZE, stream](q, kc, vc, o, po, pl, cnt, scale, Hkv, table, seqlens, ks,
                                                          vs, work, wptr)

    return Launch(run, kernels=[kern], workspace_bytes=state["ws"][0].nbytes + state["ws"][1].nbytes,
                  host_lengths=True,
                  notes=f"{nw0} blocks{'' if flat else f' ({nw0 // Hkv} workers of each KV head)'} of {n_rc} row "
                        f"block(s), {items0} items (at most {smax0} per KV head) "
                        f"in whole steps of {KS} keys, P={problem.page_size}, {tile_notes(lanes, keys, rows, warps)}"
                        f"{notes}")


# -- decode_mma / paged_mma: a KV head's query rows as one tensor-core tile ------------------

FULL = 0xFFFFFFFF


@functools.cache
def make_mma_kernel(D: int, W: int, Bc: int, stages: int, Nq: int, G: int, causal: bool, FINAL: bool, FUSED: bool,
                    PDL: int = 0, L2PF: bool = False, EVEN: bool = False, P: int = 0, BF16: bool = False,
                    KV8: int = 0, TOKEN: bool = False):
    """The kernel of ``decode_mma`` (a KV head's query rows as one m16 tile, a cp.async
    ring per warp) and, with a page size ``P`` > 0, of ``paged_mma``: key j of sequence
    b is cache row ``table[b, j // P] · P + j % P`` (the page index read once per tile
    when ``P % Bc == 0``), the sequence's own length ``seqlens[b]``, zeros for a
    length-0 sequence. ``BF16``: bfloat16 query, output and 16-bit cache (mma.sync bf16).

    ``KV8`` (paged only; 1 fp8 e4m3, 2 int8; D a multiple of 16): the cache's bytes are
    copied by cp.async into a byte ring per warp (half the bytes of a 16-bit tile); when a
    tile has landed, the warp turns its codes into 16-bit values (exact: every e4m3 and
    int8 code is a float16 and a bfloat16) in one swizzled 16-bit tile per warp, which the
    fragments read by ldmatrix as before. The scales are applied in fp32: a per-tensor or
    per-head K scale is folded into the block's score scale, a per-head V scale multiplies
    the block's accumulators once at the end; per token (``TOKEN``) each key's K scale
    multiplies its column of S and its V scale its column of P (after the row sums are
    taken, so l stays the softmax normaliser), before P is rounded to 16 bits."""
    PAGED = P > 0
    NR = G * Nq  # query rows of a KV head (≤ 16: one m-tile)
    NTH = W * WARP_SIZE
    DW = D // 2  # 32-bit words per K/V row (global memory)
    DK = 16 * ((D + 15) // 16)  # head_dim padded to whole k-steps (D itself when a multiple of 16)
    KS = DK // 16  # k-steps of Q·Kᵀ
    NT = Bc // 8  # n-tiles of S
    NP = Bc // 16  # n-tile pairs (one ldmatrix.x4 per k-step)
    KK = Bc // 16  # k-steps of P·V
    DT = D // 8  # n-tiles of O written out
    DTK = DK // 8  # n-tiles of O computed (the padding's stay zero)
    DP = DK // 16  # d-tile pairs (one ldmatrix.x4.trans per k-step)
    VEC = D // 8  # 16-byte chunks per row in global memory
    CVEC = DK // 8  # chunks per row copied (past VEC: zero-filled)
    SDW = 4 * swizzle_row_chunks(D)  # words per shared row (padded so the swizzle is a permutation)
    SWM = min(8, SDW // 4) - 1
    CPL = Bc * CVEC // WARP_SIZE  # chunks per lane per tile (K and V each)
    RING = 2 * stages * Bc  # K/V rows of one warp's ring
    ROWS = W * RING  # rows of the block's rings (float32 view, SDW words each)
    NQ = 4 * KS
    NS = 4 * NT
    NO = 4 * DTK
    softmax = fragment_softmax(NT)  # online softmax on the S fragments (device_functions)
    rescale = fragment_rescale(DTK)
    WAIT = stages - 2
    MO_ROWS = W * 16  # merge area: O of every warp's 16 rows (aliases the rings)
    ML = ROWS * SDW if ROWS * SDW >= MO_ROWS * D else MO_ROWS * D  # float offset of the m/l area
    MLR = W * 16 + 1  # rows of the m/l area, and one for the last-block flag (closure constants)
    FLAG = W * 16
    cp16 = cp_async16_flat_l2_256 if L2PF else cp_async16_flat
    LOGP = max(P, 1).bit_length() - 1
    TILE = P % Bc == 0  # tiles (aligned to Bc) never cross a page
    mma = mma_bf16 if BF16 else mma_f16
    pack = pack_bf16x2 if BF16 else pack_f16x2
    # 8-bit cache: a byte ring (rows of D bytes = DW8 words) per warp, then a 16-bit tile per warp
    DW8 = D // 4
    C8 = D // 16  # 16-byte chunks of a byte row
    CPL8 = -(-Bc * C8 // WARP_SIZE)  # chunks per lane per tile (K and V each)
    BYTES8 = W * RING * DW8  # floats of the byte rings
    STAGE_ROWS = W * 2 * Bc  # rows of the 16-bit tiles (K then V of each warp)
    dq4, UNIT = kv8_decoder(KV8)
    F16_FP8 = KV8 == 1 and not BF16  # e4m3 codes straight to f16 pairs (no float32 on the way)
    NT2 = 2 * NT  # key columns of a lane in S
    if KV8:
        ML = max(BYTES8 + STAGE_ROWS * SDW, MO_ROWS * D)

    @device
    def copy_tile8(KB, k, v, j0, brow, lane, hi, table, seq, Hkv, h):
        """This lane's cp.async share of the bytes of keys j0 … j0+Bc-1 (zero past ``hi``)
        into the warp's byte ring at row ``brow`` (V stages·Bc rows later); ``k``/``v`` are
        the (num_blocks·P, Hkv, D/4) word views."""
        pg = table[seq, j0 >> LOGP] if TILE else 0
        for x in range(CPL8):
            idx = lane + x * WARP_SIZE
            if idx < Bc * C8:
                r = idx // C8
                cc = idx - r * C8
                row = j0 + r
                jj = min(row, hi - 1)
                page = pg if TILE else table[seq, jj >> LOGP]
                go = ((page * P + (jj & (P - 1))) * Hkv + h) * DW8 + 4 * cc
                so = (brow + r) * DW8 + 4 * cc
                cp16(KB, so, k, go, row < hi)
                cp16(KB, so + stages * Bc * DW8, v, go, row < hi)

    @device
    def codes16(w):
        """Four 8-bit codes (one word) → two registers of two 16-bit values each, exact (e4m3:
        the values / 256, :data:`E4M3_UNIT` rides on the scales; a NaN code gives f16 NaN)."""
        if F16_FP8:
            a, b = e4m3x4_f16x2(w)
            if e4m3_nan_bytes(w):  # rare: a NaN in the cache propagates
                for i in range(4):
                    if ((w >> uint32(8 * i)) & uint32(0x7F)) == uint32(0x7F):
                        if i < 2:
                            a = (a & uint32(0xFFFF0000 if i == 0 else 0xFFFF)) | uint32(0x7E00 << (16 * i))
                        else:
                            b = (b & uint32(0xFFFF0000 if i == 2 else 0xFFFF)) | uint32(0x7E00 << (16 * (i - 2)))
            return a, b
        x0, x1, x2, x3 = dq4(w)
        return pack(x0, x1), pack(x2, x3)

    @device
    def dequant_tile(KB, KV, brow, srow, lane):
        """The warp's landed byte tile (ring row ``brow``) → its swizzled 16-bit K/V tile at row ``srow``."""
        for x in range(CPL8):
            idx = lane + x * WARP_SIZE
            if idx < Bc * C8:
                r = idx // C8
                cc = idx - r * C8
                for kv in range(2):
                    w0, w1, w2, w3 = ld_shared_v4(KB, brow + kv * stages * Bc + r, 4 * cc)
                    a0, a1 = codes16(w0)
                    a2, a3 = codes16(w1)
                    a4, a5 = codes16(w2)
                    a6, a7 = codes16(w3)
                    sr = srow + kv * Bc + r
                    st_shared_v4(KV, sr, 4 * ((2 * cc) ^ (r & SWM)), a0, a1, a2, a3)
                    st_shared_v4(KV, sr, 4 * ((2 * cc + 1) ^ (r & SWM)), a4, a5, a6, a7)

    @device
    def copy_tile(KV, k, v, j0, brow, lane, g_base, hi, Nk, table, seq, Hkv):
        """This lane's cp.async share of keys j0 … j0+Bc-1 (zero past ``hi``) into the
        warp's K buffer at ring row ``brow`` and its V buffer stages·Bc rows later.
        ``PAGED``: key j is row table[seq, j // P] · P + j % P of the cache (``g_base``:
        the KV head's offset in a row)."""
        if PAGED:
            pg = table[seq, j0 >> LOGP] if TILE else 0  # a page holds the whole tile
        for x in range(CPL):
            idx = lane + x * WARP_SIZE
            r = idx // CVEC
            cc = idx % CVEC
            row = j0 + r
            so = (brow + r) * SDW + 4 * (cc ^ (r & SWM))
            if PAGED:
                jj = min(row, hi - 1)
                page = pg if TILE else table[seq, jj >> LOGP]
                grow = ((page * P + (jj & (P - 1))) * Hkv) * D + g_base
            else:
                grow = g_base + min(row, Nk - 1) * D
            if CVEC > VEC:  # the chunk past the row (odd multiple of 8): zero-filled, reads nothing
                go = grow + 8 * min(cc, VEC - 1)
                ok = row < hi and cc < VEC
            else:
                go = grow + 8 * cc
                ok = row < hi
            cp16(KV, so, k, go, ok)
            cp16(KV, so + stages * Bc * SDW, v, go, ok)

    @device
    def mma_block(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, seq, table, k_sc, v_sc, chunk, S):
        if PDL == 1:
            launch_dependents()  # the combine kernel may be launched now; it waits for this grid to complete
        if KV8:
            KB = dynamic_tile(0, ROWS, DW8)  # the byte rings
            KV = dynamic_tile(BYTES8, STAGE_ROWS, SDW)  # the 16-bit tiles
            h = cuda.blockIdx.y - seq * Hkv  # the KV head
            if not TOKEN:  # per tensor / head: K's scale folded into the score scale
                sl2 = sl2 * (k_sc[0, h] * UNIT)
                scale = scale * (k_sc[0, h] * UNIT)
        else:
            KV = dynamic_tile(0, ROWS, SDW)
        split = cuda.blockIdx.x
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        if EVEN:  # `chunk` is the number of Bc-key tiles; split s takes tiles s·T/S … (s+1)·T/S
            lo = (split * chunk) // S * Bc
            hi = min(Nk, ((split + 1) * chunk) // S * Bc)
        else:
            lo = split * chunk
            hi = min(Nk, lo + chunk)
        tid = cuda.threadIdx.x
        warp = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        g = lane // 4
        t = lane % 4
        lm = lane // 8
        lr = lane % 8
        off = Nk - Nq

        # Q fragments: rows g and g+8 of the tile = query rows (head kvh·G + r // Nq, position r % Nq)
        qf = cuda.local.array(NQ, uint32)
        r_lo = g
        r_hi = g + 8
        b_lo = kvh * G + r_lo // Nq
        i_lo = r_lo % Nq
        b_hi = kvh * G + r_hi // Nq
        i_hi = r_hi % Nq
        for ks in range(KS):
            c = 8 * ks + t
            qf[4 * ks + 0] = q[b_lo, i_lo, c] if r_lo < NR else uint32(0)
            qf[4 * ks + 1] = q[b_hi, i_hi, c] if r_hi < NR else uint32(0)
            if CVEC > VEC:  # the last k-step's upper half lies past the row: zero
                qf[4 * ks + 2] = q[b_lo, i_lo, c + 4] if r_lo < NR and c + 4 < DW else uint32(0)
                qf[4 * ks + 3] = q[b_hi, i_hi, c + 4] if r_hi < NR and c + 4 < DW else uint32(0)
            else:
                qf[4 * ks + 2] = q[b_lo, i_lo, c + 4] if r_lo < NR else uint32(0)
                qf[4 * ks + 3] = q[b_hi, i_hi, c + 4] if r_hi < NR else uint32(0)
        # keys < lim are visible to the row (causal: bottom-right aligned); padding rows see the split
        lim_lo = min(hi, i_lo + off + 1) if causal and r_lo < NR else hi
        lim_hi = min(hi, i_hi + off + 1) if causal and r_hi < NR else hi
        acc = cuda.local.array(NO, float32)
        for i in range(NO):
            acc[i] = float32(0.0)
        s = cuda.local.array(NS, float32)
        if KV8 and TOKEN:
            vsc = cuda.local.array(NT2, float32)  # the V scales of this lane's key columns
        m_lo = NEG_BIG
        m_hi = NEG_BIG
        l_lo = float32(0.0)
        l_hi = float32(0.0)

        n_tiles = max(0, (hi - lo + Bc - 1) // Bc)
        mine = max(0, (n_tiles - warp + W - 1) // W)  # this warp's tiles: warp, warp + W, ...
        base = warp * RING  # first row of this warp's ring
        k_r = (lm // 2) * 8 + lr
        k_c = lm % 2
        v_r = (lm % 2) * 8 + lr
        v_c = lm // 2
        k_sw = k_r & SWM
        v_sw = v_r & SWM
        if PAGED:
            g_base = (kvh - seq * Hkv) * D  # flat element offset of the KV head within a cache row
        else:
            g_base = kvh * Nk * D  # flat element offset of (kvh, key 0) in k and v

        for st in range(stages - 1):
            if st < mine:
                if KV8:
                    copy_tile8(KB, k, v, lo + (warp + st * W) * Bc, base + st * Bc, lane, hi, table, seq, Hkv, h)
                else:
                    copy_tile(KV, k, v, lo + (warp + st * W) * Bc, base + st * Bc, lane, g_base, hi, Nk, table, seq,
                              Hkv)
            cp_async_commit()

        for it in range(mine):
            cp_async_wait(WAIT)  # this lane's copies of tile `it` have landed ...
            syncwarp(FULL)  # ... and every lane's; every lane is done with tile it-1
            nxt = it + stages - 1
            if nxt < mine:
                if KV8:
                    copy_tile8(KB, k, v, lo + (warp + nxt * W) * Bc, base + (nxt % stages) * Bc, lane, hi, table,
                               seq, Hkv, h)
                else:
                    copy_tile(KV, k, v, lo + (warp + nxt * W) * Bc, base + (nxt % stages) * Bc, lane, g_base, hi, Nk,
                              table, seq, Hkv)
            cp_async_commit()

            j0 = lo + (warp + it * W) * Bc
            if KV8:  # the landed bytes → the warp's 16-bit tile, read below as a 16-bit ring's would be
                kb = warp * 2 * Bc
                dequant_tile(KB, KV, base + (it % stages) * Bc, kb, lane)
                syncwarp(FULL)
                vb = kb + Bc
            else:
                kb = base + (it % stages) * Bc
                vb = kb + stages * Bc
            # -- S = Q Kᵀ for Bc keys
            for i in range(NS):
                s[i] = float32(0.0)
            for ks in range(KS):
                kcol = 4 * ((2 * ks + k_c) ^ k_sw)
                for np_ in range(NP):
                    b = ldmatrix_x4(KV, kb + 16 * np_ + k_r, kcol)
                    n0 = 8 * np_
                    s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3] = mma(
                        qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b[0], b[1],
                        s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3])
                    s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7] = mma(
                        qf[4 * ks], qf[4 * ks + 1], qf[4 * ks + 2], qf[4 * ks + 3], b[2], b[3],
                        s[n0 + 4], s[n0 + 5], s[n0 + 6], s[n0 + 7])
            if KV8 and TOKEN:  # each key's K scale on its column of S (its V scale kept for P)
                for nt in range(NT):
                    for e in range(2):
                        jj = min(j0 + nt * 8 + 2 * t + e, hi - 1)
                        crow = table[seq, jj >> LOGP] * P + (jj & (P - 1))
                        kscl = k_sc[crow, h] * UNIT
                        vsc[2 * nt + e] = v_sc[crow, h] * UNIT
                        s[4 * nt + e] *= kscl
                        s[4 * nt + e + 2] *= kscl
            # -- mask keys past the split and (causal) after the row's position
            if j0 + Bc > min(lim_lo, lim_hi) or causal:
                for nt in range(NT):
                    for e in range(4):
                        col = j0 + nt * 8 + 2 * t + (e % 2)
                        lim = lim_lo if e < 2 else lim_hi
                        if col >= lim:
                            s[4 * nt + e] = NEG_BIG
            # -- online softmax on the fragments (raw scores; exp2 with the scale folded in)
            m_lo, m_hi, corr_lo, corr_hi, rs_lo, rs_hi = softmax(s, 0, m_lo, m_hi, sl2)
            l_lo = l_lo * corr_lo + rs_lo
            l_hi = l_hi * corr_hi + rs_hi
            rescale(acc, 0, corr_lo, corr_hi)
            if KV8 and TOKEN:  # each key's V scale on its column of P (l already summed)
                for nt in range(NT):
                    for e in range(2):
                        s[4 * nt + e] *= vsc[2 * nt + e]
                        s[4 * nt + e + 2] *= vsc[2 * nt + e]
            # -- O += P V
            for kk in range(KK):
                p0 = 8 * kk
                a0 = pack(s[p0], s[p0 + 1])
                a1 = pack(s[p0 + 2], s[p0 + 3])
                a2 = pack(s[p0 + 4], s[p0 + 5])
                a3 = pack(s[p0 + 6], s[p0 + 7])
                vrow = vb + 16 * kk + v_r
                for dp in range(DP):
                    b = ldmatrix_x4_trans(KV, vrow, 4 * ((2 * dp + v_c) ^ v_sw))
                    d0 = 8 * dp
                    acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3] = mma(
                        a0, a1, a2, a3, b[0], b[1], acc[d0], acc[d0 + 1], acc[d0 + 2], acc[d0 + 3])
                    acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7] = mma(
                        a0, a1, a2, a3, b[2], b[3], acc[d0 + 4], acc[d0 + 5], acc[d0 + 6], acc[d0 + 7])

        if PDL == 2:
            launch_dependents()  # after the loop: the combine launches while the blocks merge and write
        # -- merge the warps' states through shared memory (the rings' space)
        cp_async_wait(0)
        cuda.syncthreads()
        MO = dynamic_tile(0, MO_ROWS, D)
        MM = dynamic_tile(ML, MLR, 2)
        l_lo = quad_sum(l_lo)
        l_hi = quad_sum(l_hi)
        if KV8 and not TOKEN:  # per tensor / head: V's scale on the block's accumulators
            vscale = v_sc[0, h] * UNIT
            for i in range(NO):
                acc[i] *= vscale
        for dt in range(DT):
            MO[warp * 16 + g, 8 * dt + 2 * t] = acc[4 * dt]
            MO[warp * 16 + g, 8 * dt + 2 * t + 1] = acc[4 * dt + 1]
            MO[warp * 16 + g + 8, 8 * dt + 2 * t] = acc[4 * dt + 2]
            MO[warp * 16 + g + 8, 8 * dt + 2 * t + 1] = acc[4 * dt + 3]
        if t == 0:  # m in natural units of the scaled scores (NEG_BIG stays the empty marker)
            MM[warp * 16 + g, 0] = m_lo * scale if m_lo != NEG_BIG else NEG_BIG
            MM[warp * 16 + g, 1] = l_lo
            MM[warp * 16 + g + 8, 0] = m_hi * scale if m_hi != NEG_BIG else NEG_BIG
            MM[warp * 16 + g + 8, 1] = l_hi
        cuda.syncthreads()
        for idx in range(tid, NR * D, NTH):
            r = idx // D
            d = idx - r * D
            mm = NEG_BIG
            ll = float32(0.0)
            oo = float32(0.0)
            for ww in range(W):
                mm, ll, ca, cb = merge_state(mm, ll, MM[ww * 16 + r, 0], MM[ww * 16 + r, 1])
                oo = oo * ca + cb * MO[ww * 16 + r, d]
            bh = kvh * G + r // Nq
            i = r % Nq
            if FINAL:
                if PAGED and BF16:
                    o[bh, i, d] = f32_to_bf16(oo / ll if ll != float32(0.0) else float32(0.0))
                elif PAGED:
                    o[bh, i, d] = oo / ll if ll != float32(0.0) else float32(0.0)  # an empty sequence: zeros
                elif BF16:
                    o[bh, i, d] = f32_to_bf16(oo / ll)
                else:
                    o[bh, i, d] = oo / ll
            else:
                part_o[split, bh * Nq + i, d] = oo / ll if ll != float32(0.0) else float32(0.0)
                if d == 0:
                    if PAGED:  # an empty sequence: split 0 is a zero partial of weight 1
                        part_lse[split, bh * Nq + i] = state_lse(mm, ll) if Nk > 0 or split > 0 else float32(0.0)
                    else:
                        part_lse[split, bh * Nq + i] = state_lse(mm, ll)
        if FUSED and not FINAL:
            # the last block of this (sequence, KV head) to finish combines the splits
            cuda.threadfence()  # this block's partials are visible device-wide before it counts
            cuda.syncthreads()
            if tid == 0:
                prev = cuda.atomic.add(counters, kvh, 1)
                MM[FLAG, 0] = float32(1.0) if prev == S - 1 else float32(0.0)
            cuda.syncthreads()
            if MM[FLAG, 0] > float32(0.5):
                cuda.threadfence()
                for idx in range(tid, NR * D, NTH):
                    r = idx // D
                    d = idx - r * D
                    bh = kvh * G + r // Nq
                    i = r % Nq
                    if BF16:
                        o[bh, i, d] = f32_to_bf16(combine_splits(part_o, part_lse, S, bh * Nq + i, d))
                    else:
                        o[bh, i, d] = combine_splits(part_o, part_lse, S, bh * Nq + i, d)
                if tid == 0:
                    counters[kvh] = 0  # ready for the next launch

    if KV8:
        @kernel
        def paged_mma8(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, table, seqlens, ks, vs, chunk, S):
            seq = cuda.blockIdx.y // Hkv
            mma_block(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, seqlens[seq], seq, table, ks, vs,
                      chunk, S)

        return paged_mma8

    if PAGED:
        @kernel
        def paged_mma(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, table, seqlens, chunk, S):
            seq = cuda.blockIdx.y // Hkv
            # (no scales: table stands in for them, unused)
            mma_block(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, seqlens[seq], seq, table, table,
                      table, chunk, S)

        return paged_mma

    @kernel
    def decode_mma(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, chunk, S):
        # (no block table, no scales: Nk and k stand in for the sequence, the table and the scales, unused)
        mma_block(q, k, v, o, part_o, part_lse, counters, sl2, scale, Hkv, Nk, Nk, k, k, k, chunk, S)

    return decode_mma


FIXED_COMBINE_MAX = 32  # split counts up to this get a combine kernel compiled for their count

PDL_MODES = {1: "combine launched at the split kernel's start", 2: "launched after its loop",
             3: "launched at its exit"}


def mma_smem_bytes(D, W, Bc, stages, kv8=False):
    """Dynamic shared memory of :func:`make_mma_kernel`: the rings (``kv8``: the byte rings
    and one 16-bit K/V tile per warp) or the merge area, and the m/l rows."""
    ring = W * 2 * stages * Bc * swizzle_row_chunks(D) * 16
    if kv8:
        ring = W * 2 * stages * Bc * D + W * 2 * Bc * swizzle_row_chunks(D) * 16
    merge = W * 16 * D * 4
    return max(ring, merge) + (W * 16 + 1) * 2 * 4


def check_mma(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
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
        return f"pdl={pdl}: 0 (plain launch) or 1/2/3 (dependent launch; see PDL_MODES)"
    return smem_reason(mma_smem_bytes(D, warps, Bc, stages, bool(getattr(problem, "kv_dtype", ""))))


def resolve_mma(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
                fixed_combine):
    """``resolve`` of ``decode_mma`` and ``paged_mma``: the split count (a paged problem with unequal
    lengths: the ragged plan of ``split_plan``, :func:`ragged_mean`)."""
    S, _ = split_plan(problem.batch * problem.kv_heads, problem.kv_len, max(1, warps * Bc), sm_count(), blocks_per_sm,
                      min_keys, splits, mean_len=ragged_mean(problem))
    return {"splits": S}


def mma_launch(problem, warps, Bc, stages, splits, blocks_per_sm, min_keys, fuse_max, pdl, l2_prefetch, even,
               fixed_combine, P=0, keys=None, note=""):
    """The host side of ``decode_mma`` (``P = 0``) and ``paged_mma`` (``P`` = page size): the split
    plan, the kernel of :func:`make_mma_kernel`, the split-K workspace and combine, and the launch.
    ``keys(layout)`` gives the kernel's key arguments (``(Nk,)``, or the block table and the lengths
    of the call's ``layout``); ``note`` goes into the Launch's notes after the split size."""
    B, Hkv, Nq, Nk, D = problem.batch, problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    S, chunk = split_plan(B * Hkv, Nk, warps * Bc, sm_count(), blocks_per_sm, min_keys, splits,
                          mean_len=ragged_mean(problem))
    final = S == 1
    fused = S * G * Nq <= fuse_max
    dependent = bool(pdl) and not final and not fused and uses_griddepcontrol()
    if even:
        chunk = -(-Nk // Bc)  # tiles, spread evenly over the splits by the kernel
    bf16 = problem.dtype == "bfloat16"
    kv8 = PAGED_KV8[getattr(problem, "kv_dtype", "")] if P else 0
    extra = {"BF16": True} if bf16 else {}
    if kv8:
        extra.update(KV8=kv8, TOKEN=bool(PAGED_TOKEN_SCALE[problem.kv_scale]))
    kern = make_mma_kernel(D, warps, Bc, stages, Nq, G, problem.causal, final, fused, int(pdl) if dependent else 0,
                           bool(l2_prefetch), bool(even), P=P, **extra)
    sl2 = float32(problem.sm_scale * float(LOG2E))
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv)
    nbytes = mma_smem_bytes(D, warps, Bc, stages, bool(kv8))
    part_o, part_lse = split_workspace(S, B * problem.heads * Nq, D)
    kernels = [kern]
    if not final and not fused:
        combine = make_combine_kernel(Nq, dependent, S if fixed_combine and S <= FIXED_COMBINE_MAX else 0,
                                      **({"BF16": True} if bf16 else {}))
        kernels.append(combine)
    counters = zeroed_counters(B * Hkv)
    views = {}
    opted = []

    def run(q, k, v, o, stream=0, layout=None):
        key = (id(q), id(k), id(v), id(o))
        hit = views.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], (q, k, v, o))):
            check_alignment(k, v)
            if len(views) >= 8:
                views.clear()
            hit = views[key] = ((q, k, v, o), view_as(q, np.uint32),
                                *((paged_cache_view(problem, k), paged_cache_view(problem, v)) if kv8 else (k, v)))
        args = (hit[1], hit[2], hit[3], o, part_o, part_lse, counters, sl2, scale, Hkv, *keys(layout), chunk, S)
        if opted:
            kern[grid, warps * WARP_SIZE, stream, nbytes](*args)
        else:
            launch_dynamic(kern, grid, warps * WARP_SIZE, stream, nbytes, *args)
            opted.append(True)
        if dependent:
            launch_after(combine, B * problem.heads * Nq, D, stream, 0, part_o, part_lse, o, S)
        elif not final and not fused:
            combine[B * problem.heads * Nq, D, stream](part_o, part_lse, o, S)

    size = f"{chunk // S}-{-(-chunk // S)} tiles" if even else f"{chunk} keys"
    how = "-" if final else ("fused" if fused else "kernel")
    if not final and not fused and S <= FIXED_COMBINE_MAX and fixed_combine:
        how += f" (compiled for {S} splits)"
    if dependent and pdl_available() is None:
        how += f", dependent launch ({PDL_MODES[int(pdl)]})"
    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {size}, {note}{warps} warps × {Bc}-key tiles, {stages} stages, "
                        f"combine {how}")
