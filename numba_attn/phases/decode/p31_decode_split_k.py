"""Phase 31 — ``decode_split_k``: flash-decoding, the KV range split across blocks.

Change against ``decode_chunked``: that kernel launches ``batch × kv_heads``
blocks, 32 for one sequence of 32 heads — a quarter of the 132 SMs of an
H100/H200, and an SM alone cannot pull much of the chip's bandwidth. Here the
KV range of each (sequence, KV head) is split into ``S`` chunks, one block
each, so that even B=1 launches several blocks per SM:

* ``S = floor(SMs × blocks_per_sm / (batch × kv_heads × row_blocks))`` (all
  blocks resident at once: no partial second wave), at most
  ``ceil(kv_len / min_keys)`` so that no block gets too little work (the
  SM count is read from the device; 132 stands in for it in the simulator);
  ``S = 1`` (large batches) launches one kernel that writes the output as
  ``decode_chunked`` does;
* a split's keys are ``[s·chunk, min(kv_len, (s+1)·chunk))`` with ``chunk``
  rounded up to whole warp steps, so the last splits can be short or empty
  (an empty split, or a row that sees none of a split's keys under the causal
  mask, writes the empty state: log-sum-exp ``NEG_BIG`` and zeros);
* each block writes its normalized partial output ``O_s`` (float32) and its
  log-sum-exp ``lse_s`` per query row; a second kernel, one thread per output
  element, combines the splits exactly:
  ``O = Σ_s exp(lse_s − lse) O_s`` with ``lse = log Σ_s exp(lse_s)``
  (``combine_splits`` in ``device_functions``, shared with the split-K
  prefill phase).

The extra traffic is ``S × rows × D × 4`` bytes written and read once, tiny
next to the KV cache (at B=1, H=32, S=16, D=128: 256 KiB against 268 MiB of
fp16 KV at 16k keys).

Prediction (before measuring): B=1 and the GQA case (8 KV heads) go from
~25–35% of the copy bandwidth (``decode_chunked``) to ≥ 70% at kv_len ≥ 16k;
at 4k the two launches and the combine cost a few µs of a ~25–50 µs kernel;
large batches are unchanged (S = 1).

Measured (H200, copy bandwidth 4.26 TB/s read + write in the same run,
commit 26e8ca2, D=128, H=32, results/dev/decode_final_h200.*):

* B=1 fp16, S=16: 4k 29.5 µs (53% of the copy figure), 16k 74.4 µs (85%),
  32k 134.5 µs (94%), 128k 487 µs (104%); SDPA 24.0 / 68.4 / 126.2 / 476.4
  µs, so 0.81–0.98× SDPA. B=1 fp32: 44–957 µs, 71–105%, 9–13× SDPA.
  The prediction (≥ 70% at ≥ 16k) holds; the combine's second launch costs
  ~3.5 µs (see ``decode_split_k_fused``), which is what keeps B=1 fp16 a few
  % behind SDPA;
* GQA, 8 KV heads, 32k fp16: B=1 78 µs (40% of the copy figure, 0.51× SDPA),
  B=8 326 µs (77%, 0.75× SDPA) — a miss. At B=1 the planner makes S=66
  splits of 512 keys for 8 KV heads; each block carries only 512 keys × 4
  rows, and the combine merges 66 partials per output element in a serial
  loop (each step waits for its loads). Fewer, longer splits and a combine
  that keeps several splits' loads in flight are the next things to try.

First run (commit 2dc3ab1, splits rounded up instead of down): S=17 × 32 =
544 blocks for 528 block slots left a 16-block second wave; B=1 16k fp16 ran
at 65–68% of the copy figure. Rounding down (one wave) and T=2 keys per lane
group give the 85% above.
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from numba_attn.gpu.device_functions import (NEG_BIG, combine_splits, combine_splits_fixed, ldg_f16x8, ldg_f32x4, merge_state,
                                state_lse)
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.split_k import make_combine_kernel, sm_count, split_plan
from numba_attn.phases.registry import Launch, register_phase
from numba_attn.gpu.warp import WARP_SIZE, group_sum, strided_max, strided_sum
from numba_attn.phases.decode.p30_decode_chunked import (check_alignment, check_decode, decode_rows, keys_per_group, lanes_per_key,
                                 vector_width)

@functools.cache
def make_kernel(D: int, VW: int, L: int, T: int, NW: int, RB: int, Nq: int, G: int, causal: bool, FINAL: bool,
                MINB: int = 1):
    E = D // L  # elements of a row per lane
    NV = E // VW  # 16-byte loads per row per lane
    KW = WARP_SIZE // L  # lane groups per warp
    KS = KW * T  # keys per warp step: T keys per group
    NT = NW * WARP_SIZE
    NROWS = G * Nq
    NRC = (NROWS + RB - 1) // RB  # row blocks per KV head
    ldv = ldg_f32x4 if VW == 4 else ldg_f16x8

    @kernel(launch_bounds=(NT, MINB))
    def decode_split_k(q, k, v, o, part_o, part_lse, scale, Hkv, Nk, chunk):
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
        for r in range(RB):
            row = row0 + r
            ok = row < NROWS
            g = row // Nq
            i = row - g * Nq
            bh = kvh * G + g  # = b * H + hkv * G + g
            if ok:
                lim[r] = min(hi, i + Nk - Nq + 1) if causal else hi  # keys < lim: in the split, visible
            else:
                lim[r] = 0
            for u in range(NV):
                for x in range(VW):
                    Qr[r, u * VW + x] = float32(q[bh, i, (sub + L * u) * VW + x]) * scale if ok else float32(0.0)
                    acc[r, u * VW + x] = float32(0.0)
            m[r] = NEG_BIG
            l[r] = float32(0.0)
        n_steps = max(0, (hi - lo + KS - 1) // KS)  # 0 for a split past the end
        for step in range(w, n_steps, NW):  # warp-uniform: the shuffles stay convergent
            j0 = lo + step * KS + grp  # this group's keys: j0 + t * KW
            for t in range(T):  # all loads of the step first: T keys in flight per group
                jj = min(j0 + t * KW, hi - 1)
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
        # merge the warps' partial (m, l, O); write the output or this split's partial
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
                bh = kvh * G + g
                if FINAL:
                    o[bh, i, d] = oo / ll
                else:
                    part_o[split, bh * Nq + i, d] = oo / ll if ll > float32(0.0) else float32(0.0)
                    if d == 0:
                        part_lse[split, bh * Nq + i] = state_lse(mm, ll)

    return decode_split_k


def _supports(problem, warps, lanes, rows, keys, splits, blocks_per_sm, min_keys):
    reason = check_decode(problem, warps, lanes, rows, keys)
    if reason:
        return reason
    if problem.head_dim > 1024:
        return "combine kernel: head_dim > 1024 threads"
    return None


@register_phase(
    name="decode_split_k", order=31, title="Decode: split-K (flash-decoding) + log-sum-exp combine",
    parent="decode_chunked", kind="decode",
    description="""
        The KV range of every (sequence, KV head) is split over S blocks, S chosen from
        the SM count so that a batch of one still fills the GPU; each block runs the
        decode_chunked loop on its chunk and writes a normalized partial output and its
        log-sum-exp; a second kernel combines the splits exactly. Uneven and empty
        splits are handled; S = 1 writes the output directly.
    """,
    lineage="Flash-Decoding (Dao, Haziza, Massa, Sizov 2023); FlashAttention-2 split-KV; "
            "FlashInfer/vLLM PagedAttention v2 reduction kernel",
    planned_speedup=40.0,
    sim_params={"warps": 2, "splits": 3},
    supports=_supports,
)
def decode_split_k(problem, warps=4, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=4, min_keys=256):
    B, H, Hkv, Nq, Nk, D = (problem.batch, problem.heads, problem.kv_heads, problem.q_len,
                            problem.kv_len, problem.head_dim)
    G = problem.group
    VW = vector_width(problem.dtype)
    RB = decode_rows(problem, rows)
    L = lanes_per_key(D, VW, RB, lanes)
    T = keys_per_group(D, L, RB, keys)
    n_rc = (G * Nq + RB - 1) // RB
    S, chunk = split_plan(B * Hkv * n_rc, Nk, warps * (WARP_SIZE // L) * T, sm_count(), blocks_per_sm,
                          min_keys, splits)
    final = S == 1
    kern = make_kernel(D, VW, L, T, warps, RB, Nq, G, problem.causal, final, blocks_per_sm)
    scale = float32(problem.sm_scale)
    grid = (S, B * Hkv * n_rc)
    if final:
        part_o = cuda.device_array((1, 1, 1), dtype="float32")
        part_lse = cuda.device_array((1, 1), dtype="float32")
        kernels = [kern]
    else:
        part_o = cuda.device_array((S, B * H * Nq, D), dtype="float32")
        part_lse = cuda.device_array((S, B * H * Nq), dtype="float32")
        combine = make_combine_kernel(Nq)
        kernels = [kern, combine]

    def run(q, k, v, o, stream=0):
        check_alignment(k, v)
        kern[grid, warps * WARP_SIZE, stream](q, k, v, o, part_o, part_lse, scale, Hkv, Nk, chunk)
        if not final:
            combine[B * H * Nq, D, stream](part_o, part_lse, o, S)

    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, L={L} lanes/key, T={T} keys/group, {RB} rows/block, "
                        f"{warps} warps")
