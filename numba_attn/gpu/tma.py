"""Hopper's Tensor Memory Accelerator (TMA) from numba: tiled 2-D/3-D loads of a
box of a global tensor into shared memory, completing on an mbarrier. Inline
PTX on the GPU, an exact model in the simulator.

Host side: :func:`tensor_map` ``(array, box, swizzle=None)`` describes a tiled
view of ``array`` (2-D or 3-D, innermost axis contiguous, other strides
multiples of 16 bytes): ``box`` is the shape of one tile in the array's axis
order (e.g. ``(Bc, 64)`` rows × columns), ``swizzle`` None or 32/64/128 (bytes).
On the GPU it encodes a 128-byte ``CUtensorMap`` with
``cuda.bindings.driver.cuTensorMapEncodeTiled`` and returns it as a device array
of 16 ``uint64``: numba cannot declare a ``__grid_constant__`` kernel
parameter, so the map lives in global memory (allocations are 256-byte
aligned; the map needs 64) and kernels take it as an ordinary array argument.
A kernel calls :func:`tensormap_fence_acquire` on it once before its first
load (``fence.proxy.tensormap::generic.acquire.gpu``: the map was written
through the generic proxy, TMA reads it through the tensormap proxy).
In the simulator it returns a :class:`TensorMap` (the array, the box, the
swizzle) that the fallback reads.

Device side, coordinates in the array's axis order (outermost first, like an
index; the PTX operand lists them innermost first), in elements, may be
negative or past the end::

    tma_load_2d(dst, dst_off, tmap, row, col, bars, i)
    tma_load_3d(dst, dst_off, tmap, b, row, col, bars, i)

copy the box starting at that coordinate into shared memory at byte
``dst_off`` of the shared array ``dst`` (``cp.async.bulk.tensor.{2,3}d.shared::
cluster.global.tile.mbarrier::complete_tx::bytes``) and retire the box's bytes
(all of them, out-of-bounds ones included) on barrier ``bars[i]``
(:mod:`numba_attn.gpu.mbarrier`); the issuing thread (usually one) announces
them first with ``mbarrier_arrive_expect_tx(bars, i, box_bytes)``.

Shared-memory layout (what the hardware writes)
-----------------------------------------------
The box is written densely in row-major order (innermost axis contiguous) from
the destination address, which must be 128-byte aligned; elements outside the
tensor are written as zeros (``CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE``). With a
swizzle of S bytes the 16-byte chunk at shared address ``a`` is stored at
``a ^ (((a >> 7) & (S/16 - 1)) << 4)`` — address bits 4.. XOR bits 7.., the
pattern repeating every 8·S bytes (:func:`swizzle_address`). This is the
layout :mod:`numba_attn.gpu.wgmma`'s descriptors read (its ``_swizzle``): a
box of ``(rows, S/2)`` 16-bit elements with swizzle S is one column block of
the wgmma tile layout with ``rb = S``. Swizzled boxes must have an innermost
extent of exactly S bytes (the layout wgmma consumes; the hardware refuses
more than S), and the destination should be 8·S-byte aligned so that the
pattern starts at the tile (the model follows the address bits either way).

Simulator model
---------------
:func:`tma_load_2d`/``3d`` validate the call (coordinates, alignment, room in
the shared array, an initialised barrier) and queue the copy on the barrier;
the first wait on that barrier gathers the box from the array with zero fill,
writes its bytes to the shared buffer at the swizzled addresses and retires
the bytes on the barrier (``mbarrier.complete_tx``). So data that is read
before its barrier's phase completes is stale, as it may be on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

SWIZZLES = (None, 32, 64, 128)
MAX_BOX = 256  # elements per box dimension
TMA_SMEM_ALIGN = 128  # bytes: destination alignment of a tensor copy

__all__ = ["tensor_map", "tensor_map_params", "TensorMap", "swizzle_address", "box_bytes",
           "tma_load_2d", "tma_load_3d", "tensormap_fence_acquire", "SWIZZLES", "TMA_SMEM_ALIGN"]


def swizzle_address(addr, swizzle):
    """Shared address where TMA stores the byte meant for ``addr`` (NumPy-friendly)."""
    if swizzle is None:
        return addr
    return addr ^ (((addr >> 7) & (swizzle // 16 - 1)) << 4)


def _dtype_name(dt: np.dtype) -> str:
    """The CUtensorMapDataType suffix for a NumPy dtype."""
    if dt.name == "bfloat16":
        return "BFLOAT16"
    names = {"uint8": "UINT8", "int8": "UINT8", "uint16": "UINT16", "int16": "UINT16", "float16": "FLOAT16",
             "uint32": "UINT32", "int32": "INT32", "float32": "FLOAT32", "uint64": "UINT64", "int64": "INT64",
             "float64": "FLOAT64"}
    if dt.name not in names:
        raise TypeError(f"tensor_map: no TMA data type for {dt}")
    return names[dt.name]


def tensor_map_params(shape, strides, dtype, box, swizzle=None) -> dict:
    """Check a tiled tensor map as ``cuTensorMapEncodeTiled`` would and return its
    parameters in the driver's order (innermost dimension first): ``dtype`` (the
    CUtensorMapDataType suffix), ``rank``, ``dims``, ``strides`` (bytes, the
    rank-1 outer ones), ``box``, ``swizzle`` (None/32/64/128), ``bytes`` (of one box).
    ``shape``/``strides``/``box`` are in NumPy axis order (strides in bytes)."""
    dt = np.dtype(dtype)
    shape, strides, box = tuple(map(int, shape)), tuple(map(int, strides)), tuple(map(int, box))
    rank = len(shape)
    if rank not in (2, 3):
        raise ValueError(f"tensor_map: 2-D or 3-D arrays only, got {rank}-D")
    if len(box) != rank or len(strides) != rank:
        raise ValueError(f"tensor_map: box {box} does not match the {rank}-D array")
    if swizzle not in SWIZZLES:
        raise ValueError(f"tensor_map: swizzle must be one of {SWIZZLES}, not {swizzle!r}")
    if strides[-1] != dt.itemsize:
        raise ValueError("tensor_map: the innermost axis must be contiguous")
    for s in strides[:-1]:
        if s <= 0 or s % 16:
            raise ValueError(f"tensor_map: strides {strides} (bytes) must be positive multiples of 16")
    for b in box:
        if not 1 <= b <= MAX_BOX:
            raise ValueError(f"tensor_map: box {box}: every extent must be in 1..{MAX_BOX}")
    inner = box[-1] * dt.itemsize
    if inner % 16:
        raise ValueError(f"tensor_map: the box's innermost extent is {inner} bytes, not a multiple of 16")
    if swizzle is not None and inner != swizzle:
        raise ValueError(f"tensor_map: a {swizzle}-byte swizzle needs a box {swizzle} bytes wide "
                         f"(here {inner}: {box[-1]} elements of {dt.itemsize} bytes)")
    nbytes = int(np.prod(box)) * dt.itemsize
    return {"dtype": _dtype_name(dt), "rank": rank, "dims": shape[::-1], "strides": strides[-2::-1],
            "box": box[::-1], "swizzle": swizzle, "bytes": nbytes}


def box_bytes(box, dtype) -> int:
    """Bytes one load of ``box`` brings (what the barrier must expect)."""
    return int(np.prod(box)) * np.dtype(dtype).itemsize


@dataclass
class TensorMap:
    """The simulator's tensor map: the tensor it describes, the box and the swizzle."""
    array: np.ndarray
    box: tuple
    swizzle: int | None

    @property
    def box_bytes(self) -> int:
        return box_bytes(self.box, self.array.dtype)


def tma_box_reference(array: np.ndarray, box, coords) -> np.ndarray:
    """The box of ``array`` at ``coords`` (NumPy axis order), out-of-bounds elements 0."""
    out = np.zeros(box, array.dtype)
    src, dst = [], []
    for c, b, n in zip(coords, box, array.shape):
        lo, hi = max(int(c), 0), min(int(c) + b, n)
        if lo >= hi:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - int(c), hi - int(c)))
    out[tuple(dst)] = array[tuple(src)]
    return out


if IS_SIMULATOR:
    from numba_attn.gpu import mbarrier as _mb

    def _host(a):
        return np.asarray(getattr(a, "_ary", a))

    def tensor_map(array, box, swizzle=None):
        """A :class:`TensorMap` over ``array`` (checked as the driver would)."""
        a = _host(array)
        tensor_map_params(a.shape, a.strides, a.dtype, box, swizzle)
        return TensorMap(a, tuple(int(b) for b in box), swizzle)

    def _tma_load(dst, dst_off, tmap, coords, bars, i):
        from numba_attn.gpu.wgmma import shared_buffer

        if not isinstance(tmap, TensorMap):
            raise TypeError(f"tma_load: expected a tensor map from tensor_map(), got {type(tmap).__name__}")
        if len(coords) != tmap.array.ndim:
            raise ValueError(f"tma_load_{len(coords)}d on a {tmap.array.ndim}-D tensor map")
        buf, base = shared_buffer(_host(dst))
        addr = base + int(dst_off)
        nbytes = tmap.box_bytes
        if addr % TMA_SMEM_ALIGN:
            raise ValueError(f"tma_load: shared destination {addr} is not {TMA_SMEM_ALIGN}-byte aligned")
        if addr < 0 or addr + nbytes > buf.size:
            raise IndexError(f"tma_load: {nbytes} bytes at shared byte {addr} run past the {buf.size}-byte buffer")
        coords = tuple(int(c) for c in coords)

        def do(buf=buf, addr=addr, tmap=tmap, coords=coords, bars=bars, i=i):
            data = np.ascontiguousarray(tma_box_reference(tmap.array, tmap.box, coords)).reshape(-1).view(np.uint8)
            where = swizzle_address(addr + np.arange(data.size), tmap.swizzle)
            buf[where] = data
            _mb.complete_tx(bars, i, data.size)

        _mb.enqueue_copy(bars, i, do)

    def tma_load_2d(dst, dst_off, tmap, row, col, bars, i):
        """Load the box at ``(row, col)`` into ``dst`` at byte ``dst_off``; completes on ``bars[i]``."""
        _tma_load(dst, dst_off, tmap, (row, col), bars, i)

    def tma_load_3d(dst, dst_off, tmap, b, row, col, bars, i):
        """Load the box at ``(b, row, col)`` into ``dst`` at byte ``dst_off``; completes on ``bars[i]``."""
        _tma_load(dst, dst_off, tmap, (b, row, col), bars, i)

    def tensormap_fence_acquire(tmap):
        """No-op in the simulator."""
        return None

else:  # -------------------------------------------------------------- GPU
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    from numba_attn.gpu.intrinsics import asm_call, shared_addr
    from numba_attn.gpu.mbarrier import bar_addr

    _i32 = ir.IntType(32)
    _i64 = ir.IntType(64)

    def tensor_map(array, box, swizzle=None):
        """Encode a tiled tensor map of the device array ``array`` and copy it to the
        device: a 16-element ``uint64`` device array (128 bytes) for the kernels."""
        from cuda.bindings import driver as drv
        from numba import cuda

        cai = array.__cuda_array_interface__
        dt = np.dtype(cai["typestr"]) if not hasattr(array, "dtype") else np.dtype(array.dtype)
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or tuple(int(np.prod(shape[k + 1:])) * dt.itemsize for k in range(len(shape)))
        p = tensor_map_params(shape, strides, dt, box, swizzle)
        ptr = int(cai["data"][0])
        if ptr % 16:
            raise ValueError("tensor_map: the tensor's address is not 16-byte aligned")
        sw = {None: "NONE", 32: "32B", 64: "64B", 128: "128B"}[swizzle]
        err, tmap = drv.cuTensorMapEncodeTiled(
            getattr(drv.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + p["dtype"]), p["rank"], ptr,
            [drv.cuuint64_t(int(v)) for v in p["dims"]], [drv.cuuint64_t(int(v)) for v in p["strides"]],
            [drv.cuuint32_t(int(v)) for v in p["box"]], [drv.cuuint32_t(1)] * p["rank"],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(drv.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_" + sw),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if int(err) != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed: {err!r} for {p}")
        words = np.array([int(w) for w in tmap.opaque], np.uint64)
        if words.size != 16:
            raise RuntimeError(f"CUtensorMap has {words.size} words, expected 16")
        return cuda.to_device(words)

    def _check_map(tmap, what):
        if not (isinstance(tmap, types.Array) and tmap.ndim == 1 and tmap.dtype in (types.uint64, types.int64)):
            raise TypingError(f"{what}: the tensor map is the uint64[16] device array tensor_map() returns, "
                              f"got {tmap}")

    def _load_codegen(rank):
        coords = ", ".join(f"${3 + k}" for k in range(rank))
        text = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                f"[$0], [$1, {{{coords}}}], [$2];")
        cons = "r,l,r," + ",".join(["r"] * rank) + ",~{memory}"

        def codegen(context, builder, sig, args):
            d = context.make_array(sig.args[0])(context, builder, value=args[0])
            off = context.cast(builder, args[1], sig.args[1], types.int64)
            dptr = builder.gep(builder.bitcast(d.data, ir.PointerType(ir.IntType(8))), [off])
            m = context.make_array(sig.args[2])(context, builder, value=args[2])
            # the innermost coordinate first, as the PTX operand lists them
            cs = [builder.trunc(context.cast(builder, v, t, types.int64), _i32)
                  for v, t in zip(args[3:3 + rank], sig.args[3:3 + rank])][::-1]
            mb = bar_addr(context, builder, sig.args[-2], args[-2], sig.args[-1], args[-1])
            # the tensor map operand is its generic address
            asm_call(builder, ir.VoidType(), [_i32, _i64, _i32] + [_i32] * rank, text, cons,
                 [shared_addr(builder, dptr), builder.ptrtoint(m.data, _i64), mb] + cs, side_effect=True)
            return context.get_dummy_value()

        return codegen

    def _load_sig(rank, dst, dst_off, tmap, coords, bars, bi):
        what = f"tma_load_{rank}d"
        if not isinstance(dst, types.Array):
            raise TypingError(f"{what}: the destination is a shared array, got {dst}")
        if not all(isinstance(c, types.Integer) for c in (dst_off, *coords, bi)):
            raise TypingError(f"{what}: offset, coordinates and barrier index must be integers")
        _check_map(tmap, what)
        return types.void(dst, dst_off, tmap, *coords, bars, bi)

    _CG2, _CG3 = _load_codegen(2), _load_codegen(3)

    @intrinsic
    def tma_load_2d(typingctx, dst, dst_off, tmap, row, col, bars, i):
        return _load_sig(2, dst, dst_off, tmap, (row, col), bars, i), _CG2

    @intrinsic
    def tma_load_3d(typingctx, dst, dst_off, tmap, b, row, col, bars, i):
        return _load_sig(3, dst, dst_off, tmap, (b, row, col), bars, i), _CG3

    @intrinsic
    def tensormap_fence_acquire(typingctx, tmap):
        _check_map(tmap, "tensormap_fence_acquire")
        sig = types.void(tmap)

        def codegen(context, builder, sig, args):
            m = context.make_array(sig.args[0])(context, builder, value=args[0])
            asm_call(builder, ir.VoidType(), [_i64], "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;",
                 "l,~{memory}", [builder.ptrtoint(m.data, _i64)], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen
