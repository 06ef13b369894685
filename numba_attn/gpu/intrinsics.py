"""Tensor-core and asynchronous-copy intrinsics: inline PTX on the GPU, exact per-lane fallbacks in the
simulator. This module is the index; each group lives in its own module, and every name is importable
from here.

numba-cuda has no API for ``mma.sync``, ``ldmatrix`` or ``cp.async``. On the GPU each function is a
``numba.cuda.extending.intrinsic`` that emits one PTX instruction through an llvmlite ``ir.InlineAsm``;
in the CUDA simulator (``numba_attn.gpu.backend.IS_SIMULATOR``) the same name is a pure-Python function
with the same per-lane semantics. Each module keeps that pattern: an ``if IS_SIMULATOR:`` branch with the
fallbacks, an ``else`` branch with the intrinsics.

* :mod:`numba_attn.gpu.mma_sync` — ``mma_f16``, ``mma_bf16``, ``mma_tf32`` (``mma.sync``),
  ``ldmatrix_x4[_trans]``; the fragment layouts and their host models
* :mod:`numba_attn.gpu.cp_async` — ``cp_async16[_flat[_l2_256]]``, ``cp_async16_at_ca``, ``cp_async4_at``,
  ``cp_async_commit``, ``cp_async_wait``
* :mod:`numba_attn.gpu.loads` — ``ld_global_v4``, ``ld_global_v2``, ``ld_global_v{4,2}_at``, ``ld_at``,
  ``st_shared_v4``, ``ld_shared_v4``, ``lds``, ``rows_head_major``
* :mod:`numba_attn.gpu.convert` — ``pack_f16x2``, ``pack_bf16x2``, ``pack_b16x2``, ``unpack_f16x2``,
  ``unpack_bf16x2``, ``to_tf32``, ``cvt_e4m3x4_f16x2``, ``pack_e4m3x4``, ``sub_f16x2``, ``byte_perm``,
  ``u32_as_f32``, ``f32_as_u32``, ``add_rm_f32``, ``mad_u32``, ``add_u32``
* :mod:`numba_attn.gpu.bits` — the host bit models: ``f16_bits``, ``bf16_bits``, ``tf32_bits``,
  ``e4m3_bits_reference``, ``e4m3_f16_bits_reference``, ``byte_perm_reference``
* :mod:`numba_attn.gpu.inline_ptx` — ``asm_call``, ``shared_addr``, ``global_ptr``, ``flat_ptr`` (GPU); the
  checked element access of the fallbacks (simulator); ``SMEM_ALIGN``

Hopper's warpgroup MMA (``wgmma.mma_async``, B operands by shared-memory descriptor) lives in
:mod:`numba_attn.gpu.wgmma`, with its own warpgroup fallback.

Array arguments are indexed like the arrays themselves (2-D shared tiles, 3-D ``(bh, row, col)`` global
tensors); the address is that element's. ``ldmatrix``/``cp.async``/128-bit accesses need 16-byte aligned
addresses: declare shared tiles with ``alignment=SMEM_ALIGN`` and keep column indices multiples of 16
bytes. The fallbacks check that alignment.
"""
from __future__ import annotations

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.bits import (  # noqa: F401  (the host models, importable from here as before)
    E4M3_MAX, E4M3_NAN_F16, MASK32, bf16_bits, byte_perm_reference, checked_u32, e4m3_bits_reference,
    e4m3_f16_bits_reference, f16_bits, half_lo_hi, tf32_bits, tf32_value)
from numba_attn.gpu.convert import (add_rm_f32, add_u32, byte_perm, cvt_e4m3x4_f16x2, f32_as_u32, mad_u32, pack_b16x2,
                                    pack_bf16x2, pack_e4m3x4, pack_f16x2, sub_f16x2, to_tf32, u32_as_f32,
                                    unpack_bf16x2, unpack_f16x2)
from numba_attn.gpu.cp_async import (cp_async4_at, cp_async16, cp_async16_at_ca, cp_async16_flat,
                                     cp_async16_flat_l2_256, cp_async_commit, cp_async_wait)
from numba_attn.gpu.inline_ptx import SMEM_ALIGN
from numba_attn.gpu.loads import (ld_at, ld_global_v2, ld_global_v2_at, ld_global_v4, ld_global_v4_at,
                                  ld_shared_v4, lds, rows_head_major, st_shared_v4)
from numba_attn.gpu.mma_sync import (  # noqa: F401  (ldmatrix_reference, mma_k*_reference)
    ldmatrix_reference, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16, mma_f16, mma_k8_tf32_reference,
    mma_k16_reference, mma_tf32)

if not IS_SIMULATOR:
    from numba_attn.gpu.inline_ptx import asm_call, flat_ptr, global_ptr, shared_addr  # noqa: F401

__all__ = [
    "SMEM_ALIGN", "mma_f16", "mma_bf16", "mma_tf32", "ldmatrix_x4", "ldmatrix_x4_trans",
    "cp_async16", "cp_async16_flat", "cp_async16_flat_l2_256", "cp_async16_at_ca", "cp_async4_at",
    "cp_async_commit", "cp_async_wait", "ld_global_v4",
    "st_shared_v4", "ld_shared_v4", "unpack_bf16x2", "ld_global_v2", "byte_perm", "unpack_f16x2", "u32_as_f32",
    "f32_as_u32", "add_rm_f32",
    "pack_f16x2", "pack_bf16x2", "pack_b16x2", "to_tf32", "lds", "rows_head_major", "cvt_e4m3x4_f16x2",
    "pack_e4m3x4", "e4m3_bits_reference",
    "sub_f16x2", "mad_u32", "add_u32", "ld_global_v4_at", "ld_global_v2_at", "ld_at",
]
