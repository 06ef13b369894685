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
* The split-K workspace: partial outputs, log-sum-exps, counters.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR  # first: chooses the backend before numba is imported

from numba import cuda, float32, int32  # noqa: E402

from numba_attn.gpu.device_functions import (NEG_BIG, combine_splits, ldg_f16x8, ldg_f32x4, merge_state,  # noqa: E402
                                             merge_state2, state_lse)
from numba_attn.gpu.jit import device, kernel  # noqa: E402
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT  # noqa: E402
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan  # noqa: E402
from numba_attn.gpu.warp import WARP_SIZE, group_sum, strided_max, strided_sum  # noqa: E402
from numba_attn.phases.registry import Launch  # noqa: E402

MAX_Q_LEN = 8  # query positions per sequence a decode kernel takes; longer is prefill
LN2 = np.float32(0.6931471805599453)


# -- rules ---------------------------------------------------------------------------

def vector_width(dtype: str) -> int:
    """Elements per 16-byte load: 4 float32 or 8 float16."""
    return {"float32": 4, "float16": 8}[dtype]


def decode_rows(problem, rows: int) -> int:
    """Query rows per block: the group's ``G · q_len`` rows, at most ``rows``."""
    return max(1, min(problem.group * problem.q_len, rows))


def lanes_per_key(D: int, VW: int, RB: int, lanes: int = 0) -> int:
    """Lanes that share one key: a power of two dividing 32 and the row's
    16-byte chunks, such that a lane holds E = D/L <= min(16, max(VW, 32/RB))
    elements per row (``lanes`` > 0 forces it)."""
    if lanes:
        return lanes
    target = 16
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


def resolve_chunked(problem, rows, lanes, keys):
    """The automatic parameters of a warp-step decode kernel: ``rows`` clipped to
    the rows a KV head has, ``lanes`` (0: :func:`lanes_per_key`) and ``keys``
    (0: :func:`keys_per_group`)."""
    RB = decode_rows(problem, rows)
    L = lanes_per_key(problem.head_dim, vector_width(problem.dtype), RB, lanes)
    return {"rows": RB, "lanes": L, "keys": keys_per_group(problem.head_dim, L, RB, keys)}


def resolve_splits(problem, keys_per_round, rows_per_block, blocks_per_sm, min_keys, splits):
    """``splits`` (0: as many as fill the SMs' block slots in one wave, ``split_plan``)."""
    n_rc = -(-problem.group * problem.q_len // max(1, rows_per_block))
    S, _ = split_plan(problem.batch * problem.kv_heads * n_rc, problem.kv_len, max(1, keys_per_round), sm_count(),
                      blocks_per_sm, min_keys, splits)
    return S


def resolve_split(problem, warps, lanes, rows, keys, splits, blocks_per_sm, min_keys, **_):
    """:func:`resolve_chunked` and the split count of a split-K phase (0: :func:`resolve_splits`);
    a split-K phase's ``resolve`` (other parameters pass through)."""
    p = resolve_chunked(problem, rows, lanes, keys)
    kpr = warps * (WARP_SIZE // p["lanes"]) * p["keys"]
    return {**p, "splits": resolve_splits(problem, kpr, p["rows"], blocks_per_sm, min_keys, splits)}


def split_layout(problem, warps, rows, lanes, keys, splits):
    """(row blocks per KV head, keys per split): the split's keys rounded up to whole warp steps."""
    n_rc = (problem.group * problem.q_len + rows - 1) // rows
    _, chunk = split_plan(problem.batch * problem.kv_heads * n_rc, problem.kv_len, warps * (WARP_SIZE // lanes) * keys,
                          sm_count(), 1, 1, splits)  # (splits given: the SM count and limits play no part)
    return n_rc, chunk


def check_decode(problem, warps, lanes, rows, keys, max_warps=32, **_):
    """The supports() rules shared by the decode phases (None when runnable); other
    parameters play no part."""
    if problem.q_len > MAX_Q_LEN:
        return f"decode kernel: q_len {problem.q_len} > {MAX_Q_LEN} (use a prefill phase)"
    if problem.q_len < 1 or problem.kv_len < 1:
        return "decode kernel: needs q_len >= 1 and kv_len >= 1"
    VW = vector_width(problem.dtype)
    D = problem.head_dim
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


def check_split(problem, warps, lanes, rows, keys, **_):
    """check_decode, and the combine kernel's one thread per element of a row."""
    reason = check_decode(problem, warps, lanes, rows, keys)
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
    if combine:
        comb = make_combine_kernel(Nq)
        kernels.append(comb)
    cnt = zeroed_counters(B * Hkv * n_rc) if counters else None

    def run(q, k, v, o, stream=0):
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
def chunk_steps(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool,
                FINAL: bool = True, BASE2: bool = False):
    """Device functions of a block of ``NW`` warps that computes ``RB`` query rows
    of one KV head over a range of keys: a group of ``L`` lanes takes ``T`` keys
    per warp step, a lane holding ``E = D / L`` elements of a row in registers.

    ``FINAL``: the block writes the output (else its split's partial output and
    log-sum-exp); ``BASE2``: the scores are in base 2 (log2 e folded into the
    query scale; ``exp2``, and the log-sum-exp converted back).
    Returns ``(load_rows, load_keys, score_update, merge_lanes, write_rows, combine_last)``.
    """
    E = D // L  # elements of a row per lane
    NV = E // VW  # 16-byte loads per row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    NT = NW * WARP_SIZE
    NROWS = G * Nq
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8

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
                    Qr[r, u * VW + x] = float32(q[bh, i, (sub + L * u) * VW + x]) * scale if ok else float32(0.0)
                    acc[r, u * VW + x] = float32(0.0)
            m[r] = NEG_BIG
            l[r] = float32(0.0)

    @device
    def load_keys(k, v, KK, VV, kvh, j0, hi, sub):
        """All loads of a step first: keys j0 + t·KW (t < T, clamped below ``hi``),
        this lane's E elements of each K and V row, 16 bytes at a time."""
        for t in range(T):
            jj = min(j0 + t * KW, hi - 1)
            for u in range(NV):
                kx = ldv(k, kvh, jj, (sub + L * u) * VW)
                vx = ldv(v, kvh, jj, (sub + L * u) * VW)
                for x in range(VW):
                    KK[t, u * VW + x] = kx[x]
                    VV[t, u * VW + x] = vx[x]

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
                    o[bh, i, d] = oo / ll
                else:
                    part_o[split, bh * Nq + i, d] = oo / ll if ll > float32(0.0) else float32(0.0)
                    if d == 0:
                        if BASE2:
                            part_lse[split, bh * Nq + i] = state_lse(mm * LN2, ll)
                        else:
                            part_lse[split, bh * Nq + i] = state_lse(mm, ll)

    @device
    def combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid):
        """The last block of this (sequence, KV head, row block) to finish combines
        the S splits' partials (``combine_splits``) and resets its counter."""
        cuda.threadfence()  # this block's partials are visible device-wide before it counts
        cuda.syncthreads()
        if tid == 0:
            prev = cuda.atomic.add(counters, cuda.blockIdx.y, 1)
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
                    o[bh, i, d] = combine_splits(part_o, part_lse, S, bh * Nq + i, d)
            if tid == 0:
                counters[cuda.blockIdx.y] = 0  # ready for the next launch

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
            combine_last(o, part_o, part_lse, counters, S, sm_last, kvh, row0, tid)

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


@device
def fp8_e4m3_to_f32(b):
    """One float8 e4m3fn byte (an int 0..255) → float32, exact: subnormals (exponent
    0) are m · 2⁻⁹, normals (8 + m) · 2^(e−10); 0x7F/0xFF are NaN (no infinities)."""
    x = int32(b)
    e = (x >> 3) & 15
    mm = x & 7
    mant = mm + 8 if e > 0 else mm
    val = float32(mant) * float32(1 << max(e, 1)) * float32(0.0009765625)
    if e == 15 and mm == 7:
        val = float32(math.nan)
    return -val if x >= 128 else val


@device
def int8_to_f32(b):
    """One int8 byte (as an int 0..255) → float32."""
    x = int32(b)
    return float32(x - 256 if x >= 128 else x)


@functools.cache
def paged_keys(D: int, VW: int, L: int, T: int, P: int, KS: int, KV8: int, TOKEN: bool):
    """``load_keys`` of a warp-step kernel over a paged cache: key ``jj`` of sequence
    ``b`` is cache row ``table[b, jj // P] · P + jj % P`` of the (num_blocks·P, Hkv, D)
    view. When pages hold whole warp steps (``P % KS == 0``: steps are aligned to KS)
    the page index is read once per step, else once per key. ``KV8``: 0 a 16-bit cache
    (16-byte loads, as ``chunk_steps``), 1 fp8 e4m3, 2 int8: the (…, D/4) uint32 view,
    two words per 8 elements, dequantized and multiplied by the row's scale
    (``ks``/``vs``: (1, Hkv) per tensor or head, (num_blocks·P, Hkv) per ``TOKEN``)."""
    E = D // L
    NV = E // VW
    KW = WARP_SIZE // L
    LOGP = P.bit_length() - 1
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8
    dq = fp8_e4m3_to_f32 if KV8 == 1 else int8_to_f32
    STEP = P % KS == 0  # a step never crosses a page

    @device
    def load_keys(k, v, KK, VV, table, b, h, js, j0, hi, sub, ks, vs):
        pg = table[b, js >> LOGP] if STEP else 0
        for t in range(T):
            jj = min(j0 + t * KW, hi - 1)
            page = pg if STEP else table[b, jj >> LOGP]
            row = page * P + (jj & (P - 1))
            if KV8 == 0:
                for u in range(NV):
                    kx = ldv(k, row, h, (sub + L * u) * VW)
                    vx = ldv(v, row, h, (sub + L * u) * VW)
                    for x in range(VW):
                        KK[t, u * VW + x] = kx[x]
                        VV[t, u * VW + x] = vx[x]
            else:
                srow = row if TOKEN else 0
                sk = ks[srow, h]
                sv = vs[srow, h]
                for u in range(NV):
                    c = (sub + L * u) * 2  # word of the chunk's first element (8 bytes: 2 words)
                    for wi in range(2):
                        kw = k[row, h, c + wi]
                        vw = v[row, h, c + wi]
                        for x in range(4):
                            KK[t, u * VW + 4 * wi + x] = dq((kw >> (8 * x)) & 255) * sk
                            VV[t, u * VW + 4 * wi + x] = dq((vw >> (8 * x)) & 255) * sv

    return load_keys


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
    index: the elements of a 16-bit cache, the uint32 words of an 8-bit one."""
    from numba_attn.gpu.arrays import view_as

    nb, P, Hkv, D = k.shape
    if getattr(problem, "kv_dtype", ""):
        if k.dtype != np.uint8:
            k = view_as(k, np.uint8)
        k = view_as(k.reshape(nb * P, Hkv, D), np.uint32)
        return k
    return k.reshape(nb * P, Hkv, D)


def paged_launch(problem, kern, scale, warps, lanes, rows, keys, splits, fused, notes=""):
    """The :class:`Launch`: grid (split, row block of a sequence's KV head), the
    workspace, the combine kernel unless fused; ``run(q, k_cache, v_cache, o, stream,
    layout=None)`` with ``layout`` (table, seqlens, k_scale, v_scale) device arrays,
    else the problem's own (:class:`PagedLayout`)."""
    B, H, Hkv, Nq, D = problem.batch, problem.heads, problem.kv_heads, problem.q_len, problem.head_dim
    S = splits
    n_rc, chunk = split_layout(problem, warps, rows, lanes, keys, S)
    grid = (S, B * Hkv * n_rc)
    part_o, part_lse = split_workspace(max(S, 2), B * H * Nq, D)  # (every split writes a partial)
    kernels = [kern]
    if not fused:
        comb = make_combine_kernel(Nq)
        kernels.append(comb)
    cnt = zeroed_counters(B * Hkv * n_rc)
    own = PagedLayout(problem)

    def run(q, k, v, o, stream=0, layout=None):
        table, seqlens, ks, vs = layout or own.own()
        kc, vc = paged_cache_view(problem, k), paged_cache_view(problem, v)
        check_alignment(kc, vc)
        kern[grid, warps * WARP_SIZE, stream](q, kc, vc, o, part_o, part_lse, cnt, scale, Hkv, table, seqlens, ks,
                                              vs, chunk, S)
        if not fused:
            comb[B * H * Nq, D, stream](part_o, part_lse, o, S)

    return Launch(run, kernels=kernels, workspace_bytes=part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, P={problem.page_size}, {tile_notes(lanes, keys, rows, warps)}{notes}")
