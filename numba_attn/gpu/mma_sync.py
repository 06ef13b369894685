"""The warp-level tensor-core instructions: ``mma.sync`` (f16, bf16, tf32) and ``ldmatrix``.

On the GPU each name emits one PTX instruction; in the simulator the fallback gathers every lane's
registers with :func:`numba_attn.gpu.warp.warp_exchange`, rebuilds the matrices from the PTX fragment
layout (the host models below), computes, and hands each lane exactly the registers the hardware would
give it. A kernel that puts a value in the wrong fragment register gets the wrong answer in both.

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8";
lane = 4·g + t, g = lane // 4 in 0..7, t = lane % 4)
--------------------------------------------------------------------------
``mma.m16n8k16`` (f16, bf16), A 16×16 row-major, B 16×8 "col", C/D 16×8 f32:

* A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9)
* B: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
* C/D: c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)

``mma.m16n8k8`` (tf32), A 16×8, B 8×8, one tf32 per register:

* A: a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4)
* B: b0 = (k t, n g), b1 = (k t+4, n g)
* C/D: as above.

``ldmatrix.m8n8.x4.b16``: lanes 8i..8i+7 give the 16-byte row addresses of
matrix i (row lane % 8); each lane receives one register per matrix, holding
(row lane//4, cols 2(lane%4), 2(lane%4)+1) of it, or with ``.trans`` the
elements (rows 2(lane%4), 2(lane%4)+1; col lane//4) — i.e. the row-major
rows of the transposed matrix. Non-transposed K rows give the B operand of
QKᵀ; transposed V rows give the B operand of PV.
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.bits import MASK32, checked_u32

# ---------------------------------------------------------------------------
# Host-side reference models of the fragment layouts (used by the simulator
# fallbacks, and by the tests to build and read fragments).
# ---------------------------------------------------------------------------


_LANE = np.arange(32)
_G = (_LANE // 4)[:, None]  # a lane's group: rows g and g + 8
_T2 = 2 * (_LANE % 4)[:, None] + np.arange(2)  # its two columns (or k indices) 2t, 2t + 1


def _registers(regs, n: int) -> np.ndarray:
    """The first ``n`` registers of all 32 lanes as a (32, n) uint32 array, refusing what a packed register
    cannot be (as :func:`~numba_attn.gpu.bits.checked_u32`)."""
    a = np.asarray([tuple(r[:n]) for r in regs])
    if a.dtype.kind not in "iu" and a.dtype != object:
        raise TypeError(f"expected packed 32-bit registers (uint32), got {a.dtype}")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() > MASK32):
        raise ValueError("a register value does not fit 32 bits")
    return a.astype(np.uint32)


def _halves(words: np.ndarray, kind: str) -> np.ndarray:
    """(…, 2) float64: the low and high f16/bf16 elements of packed registers."""
    if kind == "f16":
        return np.ascontiguousarray(words).view(np.uint16).view(np.float16).astype(np.float64).reshape(
            words.shape + (2,))
    if kind == "bf16":
        bits = np.stack([(words & 0xFFFF) << 16, words & 0xFFFF0000], axis=-1).astype(np.uint32)
        return bits.view(np.float32).astype(np.float64)
    raise ValueError(kind)


def mma_k16_reference(regs, kind: str):
    """All 32 lanes' ``(a0..a3, b0, b1, c0..c3)`` → each lane's ``(d0..d3)`` for
    ``mma.m16n8k16`` with f16/bf16 inputs (computed in float64, rounded to f32). Lane 4g + t holds
    A[g, 2t:2t+2] (a0), A[g+8, 2t:2t+2] (a1), A[g, 2t+8:2t+10] (a2), A[g+8, 2t+8:2t+10] (a3),
    B[2t:2t+2, g] (b0), B[2t+8:2t+10, g] (b1)."""
    H = _halves(_registers(regs, 6), kind)  # (32, 6, 2)
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    A[_G, _T2], A[_G + 8, _T2], A[_G, _T2 + 8], A[_G + 8, _T2 + 8] = H[:, 0], H[:, 1], H[:, 2], H[:, 3]
    B[_T2, _G], B[_T2 + 8, _G] = H[:, 4], H[:, 5]
    return _mma_reference(regs, A, B)


def mma_k8_tf32_reference(regs):
    """Like :func:`mma_k16_reference` for ``mma.m16n8k8`` with tf32 inputs: lane 4g + t holds A[g, t],
    A[g+8, t], A[g, t+4], A[g+8, t+4] and B[t, g], B[t+4, g] (the low 13 bits of each register ignored)."""
    V = (_registers(regs, 6) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)  # (32, 6)
    g, t = _G[:, 0], _LANE % 4
    A = np.zeros((16, 8))
    B = np.zeros((8, 8))
    A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = V[:, 0], V[:, 1], V[:, 2], V[:, 3]
    B[t, g], B[t + 4, g] = V[:, 4], V[:, 5]
    return _mma_reference(regs, A, B)


def _mma_reference(regs, A, B):
    """``D = A @ B + C`` of an ``m16n8kK`` mma, C the f32 accumulators of all 32 lanes (lane 4g + t:
    C[g, 2t:2t+2], C[g+8, 2t:2t+2]); each lane's ``(d0..d3)``."""
    c = np.asarray([tuple(r[6:10]) for r in regs], np.float64)  # (32, 4)
    C = np.zeros((16, 8))
    C[_G, _T2], C[_G + 8, _T2] = c[:, 0:2], c[:, 2:4]
    D = (A @ B + C).astype(np.float32)
    return list(zip(*(D[_G, _T2].T), *(D[_G + 8, _T2].T)))


def ldmatrix_reference(rows, trans: bool):
    """``rows[m]`` = the 8 row contents (8 uint16 each) of matrix m, m < 4 →
    each lane's 4 registers of ``ldmatrix.x4`` (optionally ``.trans``)."""
    out = []
    for lane in range(32):
        g, t = divmod(lane, 4)
        regs = []
        for m in range(4):
            M = rows[m]
            if trans:
                lo, hi = int(M[2 * t][g]), int(M[2 * t + 1][g])
            else:
                lo, hi = int(M[g][2 * t]), int(M[g][2 * t + 1])
            regs.append(np.uint32(lo | (hi << 16)))
        out.append(tuple(regs))
    return out


if IS_SIMULATOR:
    from numba_attn.gpu.inline_ptx import bytes16_at
    from numba_attn.gpu.warp import WARP_SIZE, warp_exchange

    def _lane():
        from numba_attn.gpu import warp

        return warp.laneid()

    def _full_warp(vals, what):
        if len(vals) != WARP_SIZE:
            raise RuntimeError(f"{what} needs a full warp of 32 lanes (got {len(vals)})")

    def _mma_fallback(kind, args):
        if len(args) != 10:
            raise TypeError("mma takes a0, a1, a2, a3, b0, b1, c0, c1, c2, c3")
        regs = tuple(checked_u32(a) for a in args[:6]) + tuple(np.float32(c) for c in args[6:])
        vals = warp_exchange(regs)
        _full_warp(vals, "mma.sync")
        lane = _lane()
        d = mma_k8_tf32_reference(vals) if kind == "tf32" else mma_k16_reference(vals, kind)
        return tuple(np.float32(x) for x in d[lane])

    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C, m16n8k16, f16 inputs (packed uint32), f32 accumulators."""
        return _mma_fallback("f16", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C, m16n8k16, bf16 inputs (packed uint32), f32 accumulators."""
        return _mma_fallback("bf16", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

    def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A·B + C, m16n8k8, tf32 inputs (uint32 from :func:`to_tf32`), f32 accumulators."""
        return _mma_fallback("tf32", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

    def _ldmatrix(arr, row, col, trans):
        vals = warp_exchange((arr, int(row), int(col)))
        _full_warp(vals, "ldmatrix")
        rows = [[bytes16_at(a, (r, c)) for (a, r, c) in vals[8 * m:8 * m + 8]] for m in range(4)]
        return ldmatrix_reference(rows, trans)[_lane()]

    def ldmatrix_x4(smem, row, col):
        """Four 8×8 b16 matrices; this lane gives the address of ``smem[row, col]``
        (row lane%8 of matrix lane//8) and gets one register per matrix."""
        return _ldmatrix(smem, row, col, False)

    def ldmatrix_x4_trans(smem, row, col):
        """As :func:`ldmatrix_x4`, each matrix transposed."""
        return _ldmatrix(smem, row, col, True)

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.inline_ptx import F32, I32, asm_call, shared_x4_load

    def _make_mma(ptx):
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            regs = (a0, a1, a2, a3, b0, b1)
            accs = (c0, c1, c2, c3)
            if not all(isinstance(r, types.Integer) for r in regs):
                return None
            if not all(isinstance(c, (types.Float, types.Integer)) for c in accs):
                return None
            sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, sig, args):
                ret = ir.LiteralStructType([F32] * 4)
                res = asm_call(builder, ret, [I32] * 6 + [F32] * 4,
                           ptx + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                           "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", list(args))
                vals = [builder.extract_value(res, i) for i in range(4)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return mma

    mma_f16 = _make_mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    mma_bf16 = _make_mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    mma_tf32 = _make_mma("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")

    ldmatrix_x4 = shared_x4_load("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0,$1,$2,$3}, [$4];")
    ldmatrix_x4_trans = shared_x4_load("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0,$1,$2,$3}, [$4];")
