"""Host side of the mma.sync phases (tc_mma, tc_pipelined, tc_tf32, tc_mma_varlen, fp8_wgmma's checks):
what they support, the uint32 views of f16/bf16 arrays, and their launches."""
from __future__ import annotations

import numpy as np
from numba import float32

from numba_attn.gpu.arrays import view_as
from numba_attn.gpu.device_functions import LOG2E
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT, launch_dynamic
from numba_attn.phases.registry import Launch
from numba_attn.phases.tensor_core.scheduler import VarlenLayout
from numba_attn.variants.launching import KernelMods

__all__ = ["supports_tc", "u32_views", "launch_mma", "launch_mma_varlen", "mma_smem_bytes", "resolve_mma",
           "supports_mma", "MMA_REGISTRATION"]


def supports_tc(problem, Bc, max_d=128, **_):
    """Shared checks of the f16/bf16 tensor-core phases: head_dim a multiple of 16 up to
    ``max_d`` (``max_d`` None: a multiple of 8 up to 256, padded to whole k-steps)."""
    D = problem.head_dim
    if max_d is None:
        if D % 8 or D > 256:
            return f"head_dim {D} must be a multiple of 8 and at most 256 (16-byte rows; fragments live in registers)"
    elif D % 16 or D > max_d:
        return f"head_dim {D} must be a multiple of 16 and at most {max_d} (fragments live in registers)"
    if Bc % 16:
        return f"Bc={Bc} must be a multiple of 16 (k-steps of P·V)"
    return None


def u32_views(q, k, v, o):
    """Device (BH, N, D) f16/bf16 arrays → (BH, N, D/2) uint32 views."""
    return tuple(view_as(a, np.uint32) for a in (q, k, v, o))


def launch_mma(problem, kern, Br, warps, views=True, dyn_bytes=0, Bc=None):
    """The :class:`Launch` of an mma.sync kernel ``kern(q, k, v, o, sl2, H, G, Nq, Nk, mods)``:
    one block of ``warps`` warps per ``Br`` query rows and (batch, head); q/k/v/o passed
    as uint32 views when ``views`` (f16/bf16), as they are otherwise (fp32); with
    ``dyn_bytes`` the launch takes that much dynamic shared memory (opting in above 48 KiB).
    ``mods``: the variant's arrays and its block mask of (Br × ``Bc``) tiles (``()`` for plain
    attention); ``run(q, k, v, o, stream=0, mods=None)``."""
    H, Nq, Nk = problem.heads, problem.q_len, problem.kv_len
    sl2 = float32(problem.sm_scale * LOG2E)  # scores in base 2: exp2((s - m)·sl2)
    grid = ((Nq + Br - 1) // Br, problem.batch * H)
    block = 32 * warps
    tail = (sl2, H, problem.group, Nq, Nk)
    kernel_mods = KernelMods(problem, Br, Bc)  # a variant's arrays and block mask at (Br, Bc); plain: ()

    def run(q, k, v, o, stream=0, mods=None):
        args = u32_views(q, k, v, o) if views else (q, k, v, o)
        mods = kernel_mods(stream=stream) if mods is None else mods
        if dyn_bytes:
            launch_dynamic(kern, grid, block, stream, dyn_bytes, *args, *tail, mods)
        else:
            kern[grid, block, stream](*args, *tail, mods)

    variant = getattr(problem, "variant", None) is not None
    return Launch(run, kernels=[kern], kernel_mods=kernel_mods if variant else None, replayable=not variant)


def launch_mma_varlen(problem, kern, Br, warps):
    """The :class:`Launch` of the varlen mma.sync kernel: grid (query blocks of the longest
    sequence, heads, sequences); ``run(q, k, v, o, stream, layout=None)`` with q, o (total_q, H, D),
    k, v (total_k, Hkv, D) and ``layout`` the (cu_seqlens_q, cu_seqlens_k) device arrays (else the
    problem's own). ``mods``: a variant's arrays (no block mask: each sequence has its own positions)."""
    H = problem.heads
    sl2 = float32(problem.sm_scale * LOG2E)
    grid = ((problem.q_len + Br - 1) // Br, H, problem.batch)
    own = VarlenLayout(problem)
    kernel_mods = KernelMods(problem, None, None)  # plain: ()

    def run(q, k, v, o, stream=0, layout=None, mods=None):
        cu_q, cu_k = layout or own.own()
        kern[grid, 32 * warps, stream](*u32_views(q, k, v, o), sl2, H, problem.group, cu_q, cu_k,
                                       kernel_mods(stream=stream) if mods is None else mods)

    variant = getattr(problem, "variant", None) is not None
    return Launch(run, kernels=[kern], kernel_mods=kernel_mods if variant else None, replayable=not variant)


def mma_smem_bytes(D, Bc):
    """Static shared memory of the tc_mma kernel: the padded K and V tiles."""
    return Bc * ((D + 15) // 16 * 8 + 4) * 4 + Bc * (D + 8) * 2


def resolve_mma(problem, warps, Bc):
    """The mma.sync kernel's automatic parameters (tc_mma, tc_mma_varlen): Bc=0 is 64 keys, 32 where the two
    64-key tiles exceed the 48 KiB of static shared memory (head_dim above 184)."""
    return {"warps": warps, "Bc": Bc or (64 if mma_smem_bytes(problem.head_dim, 64) <= STATIC_SMEM_LIMIT else 32)}


def supports_mma(problem, warps, Bc):
    """What the mma.sync kernel runs (tc_mma, tc_mma_varlen): supports_tc's head dims and tiles, K/V tiles
    within the static shared memory."""
    reason = supports_tc(problem, Bc, max_d=None)
    if reason:
        return reason
    if mma_smem_bytes(problem.head_dim, Bc) > STATIC_SMEM_LIMIT:
        return f"K/V tiles need {mma_smem_bytes(problem.head_dim, Bc)} B of static shared memory (> 48 KiB)"
    return None


# the register_phase keywords of tc_mma and tc_mma_varlen (one kernel)
MMA_REGISTRATION = dict(space={"warps": [4, 8], "Bc": [0, 32, 64]}, requires_cc=(8, 0),  # cp.async, ldmatrix, mma.sync
                        dtypes=("float16", "bfloat16"), head_dims=None, sim_params={"warps": 2, "Bc": 16},
                        supports=supports_mma, resolve=resolve_mma)
