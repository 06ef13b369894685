"""Phase 22 — ``tc_tf32``: fp32 inputs on the tensor cores through tf32 ``mma.sync.m16n8k8``.

Change against ``tc_pipelined``: the storage dtype is float32, multiplied as tf32 (m16n8k8, one register per
element). P stays in registers by permuting the keys (column t of a k-step stands for key 2t, t+4 for 2t+1;
V's rows follow); tiles are padded (rows of D+4 words) instead of swizzled.

Prediction: 100–150 TFLOP/s at D=64, N=4096: 3–4× PyTorch SDPA fp32, relative error near 1e-3.

Verdict: 1.326 ms at B1 H32 N4096 D64 fp32 (H200), 3.0x PyTorch SDPA fp32, the target met; 3.18 ms at D128.
[results/tensor-core-nvidia-h200.jsonl]
"""
from __future__ import annotations

import functools

from numba import cuda, float32, uint32

from numba_attn.gpu.intrinsics import SMEM_ALIGN, cp_async16, cp_async_wait, lds, mma_tf32, to_tf32
from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.epilogue import store_fragments
from numba_attn.phases.tensor_core.fragments import q_start, qk_fragments, warp_rows
from numba_attn.phases.tensor_core.mask import key_ends
from numba_attn.phases.tensor_core.mma_sync import launch_mma
from numba_attn.phases.tensor_core.pipeline import cp_async_ring
from numba_attn.phases.tensor_core.scheduler import key_tiles
from numba_attn.phases.tensor_core.softmax import masked_update
from numba_attn.variants.stages import PLAIN, stages_of

ALIGN = SMEM_ALIGN


@functools.cache
def make_kernel(D: int, W: int, Bc: int, STAGES: int, MAXREG: int, causal: bool, stage=PLAIN):
    """The kernel ``(q, k, v, o, sl2, H, G, Nq, Nk, mods)``; ``stage``: a variant's (the tile loop and the refills
    walk the block mask's visited tiles, :func:`.scheduler.key_tiles`; ``mods`` ``()`` for plain attention)."""
    Br = 16 * W
    threads = 32 * W
    ROW = D + 4  # tile row stride in floats: ≡ 4 (mod 32) banks, 16-byte aligned rows
    qk_steps = D // 8  # k-steps of Q·Kᵀ (8 d's each)
    s_tiles = Bc // 8  # n-tiles of S
    pv_steps = Bc // 8  # k-steps of P·V (8 keys each)
    o_tiles = D // 8  # n-tiles of O
    row_chunks = D // 4  # 16-byte chunks per row
    CHUNKS = Bc * row_chunks
    CPT = (CHUNKS + threads - 1) // threads
    ROWS = 2 * STAGES * Bc
    q_regs = 4 * qk_steps
    s_regs = 4 * s_tiles
    o_regs = 4 * o_tiles
    start = q_start(qk_steps, o_regs, tf32=True)
    qk = qk_fragments(s_tiles, qk_steps, mma_tf32, tf32=True)
    update = masked_update(s_tiles, Bc, causal, o_tiles, stage)  # variant, mask, online softmax, O rescaled
    count, tile_at, kind_at = key_tiles(Bc, stage)  # every tile to the causal bound, or a variant's visited ones
    lanes = warp_rows(Br, 16)
    ends = key_ends(Br, 16, causal)
    store = store_fragments(o_tiles, "f32")

    @device
    def copy_tile(tile, sb, to):
        """Thread ``tid``'s cp.async copies of K/V tile ``tile`` (keys from ``j0``) into ring stage ``sb``;
        ``to = (KV, k, v, kvh, tid, Nk)``."""
        KV, k, v, kvh, tid, Nk = to
        j0 = tile * Bc
        for i in range(CPT):
            e = tid + i * threads
            if e < CHUNKS:
                r = e // row_chunks
                c = 4 * (e - r * row_chunks)
                ok = j0 + r < Nk
                src = min(j0 + r, Nk - 1)
                cp_async16(KV, sb * Bc + r, c, k, kvh, src, c, ok)
                cp_async16(KV, (STAGES + sb) * Bc + r, c, v, kvh, src, c, ok)

    fill, refill = cp_async_ring(STAGES, Bc, copy_tile, stage)

    @kernel(**({"max_registers": MAXREG} if MAXREG else {}))
    def tc_tf32(q, k, v, o, sl2, H, G, Nq, Nk, mods):
        KV = cuda.shared.array((ROWS, ROW), float32, alignment=ALIGN)
        tid, warp, lane, g, t, bh, kvh, blk0, row0 = lanes(H, G)
        r_lo = row0 + g  # this lane's rows: r_lo and r_lo + 8
        off = Nk - Nq

        qf = cuda.local.array(q_regs, uint32)
        acc = cuda.local.array(o_regs, float32)
        m_lo, m_hi, l_lo, l_hi = start(qf, acc, q, bh, r_lo, Nq, t)  # Q's A fragments rounded to tf32, O = 0
        s = cuda.local.array(s_regs, float32)

        kv_end, warp_end = ends(blk0, row0, Nq, Nk, off)
        walk = (mods, bh // H, bh % H, cuda.blockIdx.x, Nq)  # the block mask's row of tiles (a variant)
        n_tiles = count(walk, (kv_end + Bc - 1) // Bc)

        to = (KV, k, v, kvh, tid, Nk)  # the tile copies' arguments
        fill(walk, n_tiles, to)  # tiles 0 .. STAGES-2 in flight
        for it in range(n_tiles):
            refill(walk, it, n_tiles, to)  # tile it landed; tile it+STAGES-1 into tile it-1's stage
            kt = tile_at(walk, it)
            j0 = kt * Bc
            if j0 < warp_end:
                kb = (it % STAGES) * Bc
                vb = kb + STAGES * Bc
                qk(s, qf, KV, kb, g, t)  # -- S = Q Kᵀ: B fragment (k t / t+4, n g) = K[key g, d t / t+4]
                m_lo, m_hi, l_lo, l_hi = update(s, acc, j0, row0, r_lo, t, Nq, Nk, off, m_lo, m_hi, l_lo, l_hi, sl2,
                                                (walk[1], walk[2], kind_at(walk, kt)), mods)
                # -- O += P V with keys permuted: column t ↔ key 2t, column t+4 ↔ key 2t+1
                for kk in range(pv_steps):
                    a0 = to_tf32(s[4 * kk])  # (g, key 2t)
                    a1 = to_tf32(s[4 * kk + 2])  # (g+8, key 2t)
                    a2 = to_tf32(s[4 * kk + 1])  # (g, key 2t+1)
                    a3 = to_tf32(s[4 * kk + 3])  # (g+8, key 2t+1)
                    vr = vb + 8 * kk + 2 * t
                    for dt in range(o_tiles):
                        b0 = to_tf32(lds(KV, vr, 8 * dt + g))
                        b1 = to_tf32(lds(KV, vr + 1, 8 * dt + g))
                        acc[4 * dt], acc[4 * dt + 1], acc[4 * dt + 2], acc[4 * dt + 3] = mma_tf32(
                            a0, a1, a2, a3, b0, b1, acc[4 * dt], acc[4 * dt + 1], acc[4 * dt + 2],
                            acc[4 * dt + 3])

        cp_async_wait(0)
        store(o, bh, r_lo, acc, 0, l_lo, l_hi, Nq, t)

    return tc_tf32


def smem_bytes(D, Bc, stages):
    return 2 * stages * Bc * (D + 4) * 4


def _resolve(problem, warps, Bc, stages, maxreg):
    """Bc=0: the largest tile whose two stages fit 48 KiB, 32 keys at D≤64, 16 above
    (8 above D=184, where 16 keys no longer fit); warps=0: 8 up to D=64, 4 above
    (docs/tensor-core-notes.md has the runs)."""
    D = problem.head_dim
    if not Bc:
        Bc = 32 if D <= 64 else 16
        if D > 128 and smem_bytes(D, Bc, stages) > STATIC_SMEM_LIMIT:
            Bc = 8
    return {"warps": warps or (8 if D <= 64 else 4), "Bc": Bc, "stages": stages, "maxreg": maxreg}


def _supports(problem, warps, Bc, stages, maxreg):
    D = problem.head_dim
    if D % 8 or D > 256:
        return f"head_dim {D} must be a multiple of 8 and at most 256 (fragments live in registers)"
    if Bc % 8:
        return f"Bc={Bc} must be a multiple of 8"
    if stages < 2:
        return "stages must be at least 2"
    nb = smem_bytes(D, Bc, stages)
    if nb > STATIC_SMEM_LIMIT:
        return f"{stages} stages of fp32 K/V tiles need {nb} B of static shared memory (> 48 KiB)"
    return None


@register_phase(
    name="tc_tf32", order=22, title="Tensor cores for fp32: tf32 mma.sync m16n8k8",
    parent="tc_pipelined",
    description="""
        fp32 inputs through tf32 mma.sync.m16n8k8 (cvt.rna to tf32, fp32 accumulate),
        with tc_pipelined's cp.async ring and one barrier per tile. P stays in
        registers by permuting the keys of each k-step (column t ↔ key 2t, t+4 ↔
        2t+1, V's rows alike); B fragments are 32-bit loads from padded fp32 tiles
        (row stride ≡ 4 banks: conflict-free).
    """,
    lineage="TF32 tensor cores (NVIDIA A100, 2020); FlashAttention-2 structure",
    planned_speedup=40.0,
    space={"warps": [0, 4, 8], "Bc": [0, 32, 64], "stages": [2, 3]},
    requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
    dtypes=("float32",),
    precision="tf32",
    head_dims=None,
    sim_params={"warps": 2, "Bc": 16, "stages": 2},
    supports=_supports,
    resolve=_resolve,
    variants=True,
)
def tc_tf32(problem, warps=0, Bc=0, stages=2, maxreg=0):
    kern = make_kernel(problem.head_dim, warps, Bc, stages, maxreg, problem.causal, stages_of(problem.variant))
    return launch_mma(problem, kern, 16 * warps, warps, views=False, Bc=Bc)
