"""Phase 30 — ``decode_chunked``: decode (q_len 1–8) as a bandwidth-bound GEMV.

Change against ``fused_rowwise`` (one thread per query row, walking every key
alone): in decode there are only 1–8 query rows per head, so one thread per
row would leave the GPU empty and read K/V with one thread per row. Here one
block handles one (sequence, KV head) and *all* the query rows that read it —
the ``G`` query heads of a grouped-query group times ``q_len`` — so each K/V
row is read from memory once per block, whatever the group size:

* the block's warps take the KV sequence in steps, round-robin; within a
  warp, a group of ``L`` lanes takes one key, each lane reading 16 bytes at a
  time (``ld.global.nc.v4``: 4 float32 or 8 float16) of the K row and the V
  row, so a warp reads ``32 / L`` whole rows per step, fully coalesced;
* each lane dots its slice of the key with its slice of every query row
  (registers), the group sums the slices with ``log2 L`` xor-shuffles, and
  every group keeps its own online softmax ``(m, l, O)`` per row;
* at the end the groups of a warp merge with shuffles (max, rescale, sum) and
  the warps merge their partial ``(m, l, O)`` through shared memory.

``L`` is chosen so that a lane holds ``E = D / L`` elements per row, with the
``rows × E`` query and accumulator registers bounded (E = 32 for one row,
fewer for more rows); more than ``rows`` query rows are split over blocks.
Causal with ``q_len > 1`` is bottom-right aligned: row ``i`` sees the keys
``j <= i + kv_len - q_len`` (a masked key is simply skipped for that row).

Prediction (before measuring): the kernel reads K and V once with 16-byte
coalesced loads and does ~2 FLOP per byte, so a full grid should run near the
copy bandwidth (≥ 70% of it). But the grid is only ``batch × kv_heads``
blocks: at B=1, H=32 that is 32 blocks on 132 SMs, and a single SM cannot pull
more than a few % of the chip's bandwidth, so B=1 should reach only ~25–35% of
it; B=8 (256 blocks) and B=32 (1024 blocks) should be near the target. The
split-K phase (``decode_split_k``) fixes small batches.

Measured (H200, 132 SMs, copy bandwidth 4.26 TB/s read + write measured in
the same run; ``bench/dev/decode_bench.py``, results/dev/decode_final_h200.*,
commit 26e8ca2; D=128, H=32):

* B=1, q_len 1: fp16 1.27–1.31 TB/s, 28–31% of the copy figure at 4k–128k
  keys (16k: 211 µs against SDPA's 68 µs) — the predicted 25–35%: 32 blocks
  on 132 SMs; fp32 52–58% (each block streams twice the bytes);
* B=8 and B=32: 4.36–4.66 TB/s of K/V read, 102–109% of the copy figure
  (a copy moves its bytes both ways; reading alone streams faster), equal to
  SDPA in fp16 (1.00×, within the 1% noise) and 3.3–3.5× faster in fp32
  (SDPA has no flash kernel for fp32: 1.4 TB/s);
* q_len 4, causal, B=8, 16k, fp16: 645 µs, 78% of the copy figure, 1.20×
  SDPA (which applies the bottom-right mask as a dense mask);
* GQA, B=1, 8 KV heads: 8 blocks, 925 µs (3% of the copy figure).

110–128 registers, no spills (launch bounds 256 threads × 2 blocks). How
the kernel got there, from the first run (commit 2dc3ab1): with 4 lanes per
key (32 elements per lane) and one key per group per step, fp32 needed 140
registers and B=8 fp32 ran at 49% of the copy figure; 8 lanes per key (16
elements) and T=2 keys per group per step (all loads first, one softmax
update per tile) bring it to 107%.
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.device_functions import NEG_BIG, ldg_f16x8, ldg_f32x4, merge_state
from numba_attn.gpu.jit import kernel
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.gpu.warp import WARP_SIZE, group_sum, strided_max, strided_sum

MAX_Q_LEN = 8
SMEM_LIMIT = 48 * 1024


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


def check_decode(problem, warps, lanes, rows, keys, max_warps=32):
    """The supports() rules shared by the decode phases (None when runnable)."""
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
    if smem > SMEM_LIMIT:
        return f"block merge needs {smem} B of shared memory (> 48 KiB); lower warps or rows"
    return None


@functools.cache
def make_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool,
                MINB: int = 1):
    E = D // L  # elements of a row per lane
    NV = E // VW  # 16-byte loads per row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    KS = KW * T  # keys per warp step: T keys per group
    NT = NW * WARP_SIZE
    NROWS = G * Nq
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8

    @kernel(launch_bounds=(NT, MINB))
    def decode_chunked(q, k, v, o, scale, Hkv, Nk):
        sm_m = cuda.shared.array((NW, RB), float32)
        sm_l = cuda.shared.array((NW, RB), float32)
        sm_o = cuda.shared.array((NW, RB, D), float32)
        Qr = cuda.local.array((RB, E), float32)
        acc = cuda.local.array((RB, E), float32)
        m = cuda.local.array(RB, float32)
        l = cuda.local.array(RB, float32)
        lim = cuda.local.array(RB, int32)
        KK = cuda.local.array((T, E), float32)
        VV = cuda.local.array((T, E), float32)
        sc = cuda.local.array((RB, T), float32)
        kvh = cuda.blockIdx.y  # b * Hkv + kv head
        row0 = cuda.blockIdx.x * RB  # first of this block's query rows (g * Nq + i)
        tid = cuda.threadIdx.x
        w = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        grp = lane // L
        sub = lane % L
        for r in range(RB):
            row = row0 + r
            ok = row < NROWS
            g = row // Nq
            i = row - g * Nq
            bh = kvh * G + g  # = b * H + hkv * G + g
            if ok:
                lim[r] = min(Nk, i + Nk - Nq + 1) if causal else Nk
            else:
                lim[r] = 0
            for u in range(NV):
                for x in range(VW):
                    Qr[r, u * VW + x] = float32(q[bh, i, (sub + L * u) * VW + x]) * scale if ok else float32(0.0)
                    acc[r, u * VW + x] = float32(0.0)
            m[r] = NEG_BIG
            l[r] = float32(0.0)
        n_steps = (Nk + KS - 1) // KS
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = step * KS + grp  # this group's keys: j0 + t * KW
            for t in range(T):  # all loads of the step first: T keys in flight per group
                jj = min(j0 + t * KW, Nk - 1)
                for u in range(NV):
                    kx = ldv(k, kvh, jj, (sub + L * u) * VW)
                    vx = ldv(v, kvh, jj, (sub + L * u) * VW)
                    for x in range(VW):
                        KK[t, u * VW + x] = kx[x]
                        VV[t, u * VW + x] = vx[x]
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
        # merge the lane groups of the warp: common max, rescale, sum
        for r in range(RB):
            mw = strided_max(m[r], L)
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
        cuda.syncthreads()
        # merge the warps' partial (m, l, O) and write the output
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
                    mm, ll, ca, cb = merge_state(mm, ll, sm_m[ww, r], sm_l[ww, r])
                    oo = oo * ca + cb * sm_o[ww, r, d]
                o[kvh * G + g, i, d] = oo / ll

    return decode_chunked


def _supports(problem, warps, lanes, rows, keys):
    return check_decode(problem, warps, lanes, rows, keys)


def check_alignment(*arrays):
    """16-byte loads need 16-byte aligned rows: refuse misaligned device arrays."""
    if IS_SIMULATOR:
        return
    for a in arrays:
        ptr = a.__cuda_array_interface__["data"][0] if hasattr(a, "__cuda_array_interface__") else 0
        if ptr % 16:
            raise ValueError("decode kernels need 16-byte aligned K/V device arrays")


@register_phase(
    name="decode_chunked", order=30, title="Decode: block per (sequence, KV head), warps over KV chunks",
    parent="fused_rowwise", kind="decode",
    description="""
        One block per (sequence, KV head) computes all the query rows that read that
        KV head (GQA group × q_len ≤ 8). Warps take KV steps round-robin; a group of
        lanes takes one key with 16-byte loads, dots it with every query row
        (xor-shuffle sum within the group) and keeps a per-group online softmax;
        groups merge with shuffles, warps merge their partial (m, l, O) in shared
        memory. K and V are read once, coalesced.
    """,
    lineage="Decode attention as a batched GEMV (vLLM PagedAttention v1, Kwon et al. 2023; "
            "FlashInfer decode kernels), online softmax per warp and a block merge",
    planned_speedup=20.0,
    sim_params={"warps": 2},
    supports=_supports,
)
def decode_chunked(problem, warps=8, lanes=0, rows=4, keys=0):
    Hkv, Nq, Nk, D = problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim
    G = problem.group
    VW = vector_width(problem.dtype)
    RB = decode_rows(problem, rows)
    L = lanes_per_key(D, VW, RB, lanes)
    T = keys_per_group(D, L, RB, keys)
    kern = make_kernel(D, VW, L, T, warps, RB, Nq, G, problem.causal, max(1, 16 // warps))
    scale = float32(problem.sm_scale)
    grid = ((G * Nq + RB - 1) // RB, problem.batch * Hkv)

    def run(q, k, v, o, stream=0):
        check_alignment(k, v)
        kern[grid, warps * WARP_SIZE, stream](q, k, v, o, scale, Hkv, Nk)

    return Launch(run, kernels=[kern], notes=f"L={L} lanes/key, T={T} keys/group, {RB} rows/block, {warps} warps")
