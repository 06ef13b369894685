"""Vector loads/stores, dynamic shared tiles and tile loaders for the CUDA-core
roadmap phases, with simulator fallbacks.

numba lowers ``a[i, j]; a[i, j + 1]; ...`` to scalar loads even when the four
elements are adjacent and 16-byte aligned: numba's signed indices go through a
negative-index wrap-around select that hides the alignment from LLVM's
load/store vectorizer, and ``cuda.float32x4`` has no vector load either. These
intrinsics emit the wide instructions directly:

* :func:`ldg_f16x8` — eight consecutive float16 elements of a 3-D global
  array as float32, one 16-byte ``ld.global.nc.v4.b32`` (the decode phases);
* :func:`ldg4` — four consecutive elements of a 3-D *global* array, read
  through the non-coherent (read-only) path with one instruction: inline PTX
  ``ld.global.nc.v4.f32`` (16 bytes) for float32 arrays, ``ld.global.nc.v4.b16``
  (8 bytes) plus four ``cvt.f32.f16`` for float16 arrays. Returns a 4-tuple of
  float32. The first element's address must be 16-byte (float32) or 8-byte
  (float16) aligned: the last index a multiple of 4 and the row length a
  multiple of 4.
* :func:`lds4` / :func:`sts4` — four consecutive float32 of a 2-D *shared*
  array as one ``ld.shared.v4.f32`` / ``st.shared.v4.f32`` (LLVM vector
  load/store in address space 3, alignment 16). The array must start on 16
  bytes (a :func:`dynamic_tile` at an offset that is a multiple of 4) and the
  row length and the column index must be multiples of 4.
* :func:`dynamic_tile` — a 2-D float32 array over the block's *dynamic*
  shared memory (its own 16-byte-aligned extern symbol), at an element offset
  that may be computed at run time (a double-buffer stage) and with a shape
  fixed at compile time. numba's ``cuda.shared.array(0, ...)`` is 1-D, and
  slicing and reshaping it on the device goes through generic addresses and
  a call into the runtime; this is a plain pointer offset.

Arrays are never written through :func:`ldg4` (``.nc`` requires the data to
stay unchanged during the kernel: true for Q, K and V).

In the CUDA simulator inline PTX does not exist; there (``IS_SIMULATOR``) the
same names are plain Python functions that read or write the four elements
one by one, converting to float32 as the GPU does, so kernels run unchanged
(the pattern of :mod:`numba_attn.gpu.warp`). An index that is not a multiple of 4
raises in the fallback, so a kernel that would issue a misaligned vector
access on the GPU fails in the simulator too.

The tile loaders (:func:`load_tile4`, :func:`load_tile4_t`, the
register-staged :func:`fetch4`/:func:`put4` and :func:`fetch4_t`/:func:`put4_t`
of double buffering, the scalar :func:`load_tile_t_scaled`) are the device
functions the roadmap phases share; ``MASKED`` is their (finite) score of a
masked pair.

Host helper :func:`launch_dynamic` launches a kernel with more than 48 KiB of
dynamic shared memory: above 48 KiB CUDA requires the kernel's
``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` to be raised first, which
numba-cuda has no API for; it is set here through the driver binding, as
numba-cuda's own ``set_shared_memory_carveout`` sets its attribute.
"""
from __future__ import annotations

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR  # chooses the backend before numba is imported

from numba import cuda, float32  # noqa: E402

STATIC_SMEM_LIMIT = 48 * 1024  # bytes of shared memory a launch gets without opting in
OPT_IN_SMEM_LIMIT = 227 * 1024  # sm_90: most shared memory one block can opt in to


def _check_aligned(col):
    if int(col) % 4:
        raise IndexError(f"vector access at column {int(col)}: not a multiple of 4 (misaligned on the GPU)")


if IS_SIMULATOR:

    def ldg4(arr, i, j, k):
        """Elements ``arr[i, j, k:k+4]`` as four float32 (simulator fallback)."""
        _check_aligned(k)
        return (float32(arr[i, j, k]), float32(arr[i, j, k + 1]),
                float32(arr[i, j, k + 2]), float32(arr[i, j, k + 3]))

    def ldg_f16x8(arr, i, j, k):
        """Elements ``arr[i, j, k:k+8]`` of a float16 array as eight float32 (simulator fallback)."""
        if int(k) % 8:
            raise IndexError(f"16-byte fp16 access at column {int(k)}: not a multiple of 8 (misaligned on the GPU)")
        return tuple(float32(arr[i, j, k + e]) for e in range(8))

    def lds4(arr, i, j):
        """Elements ``arr[i, j:j+4]`` of a shared float32 array (simulator fallback)."""
        _check_aligned(j)
        return (float32(arr[i, j]), float32(arr[i, j + 1]), float32(arr[i, j + 2]), float32(arr[i, j + 3]))

    def sts4(arr, i, j, a, b, c, d):
        """``arr[i, j:j+4] = a, b, c, d`` into a shared float32 array (simulator fallback)."""
        _check_aligned(j)
        arr[i, j] = a
        arr[i, j + 1] = b
        arr[i, j + 2] = c
        arr[i, j + 3] = d

    def dynamic_tile(offset, rows, cols):
        """A (rows, cols) float32 view of the block's dynamic shared memory starting
        ``offset`` float32 elements in (simulator: a view of the simulator's buffer)."""
        from numba.cuda.simulator.kernel import _get_kernel_context

        if int(offset) % 4:
            raise IndexError(f"dynamic_tile offset {int(offset)} is not a multiple of 4 (16-byte alignment)")
        sm = _get_kernel_context().shared.array(0, float32)
        n = rows * cols
        if offset + n > sm.size:
            raise IndexError(f"dynamic_tile [{offset}, {offset + n}) is past the {sm.size} float32 of "
                             "dynamic shared memory the launch asked for")
        return sm[offset: offset + n].reshape(rows, cols)

else:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda import cgutils
    from numba.cuda.extending import _intrinsic, intrinsic

    _F32 = ir.FloatType()

    def _item_pointer(context, builder, aryty, ary, idxtys, idxs):
        """Pointer to ``ary[idxs]`` (no wrap-around, no bounds check)."""
        intp = context.get_value_type(types.intp)
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(idxs, idxtys)]
        arr = context.make_array(aryty)(context, builder, value=ary)
        shapes = cgutils.unpack_tuple(builder, arr.shape, count=aryty.ndim)
        strides = cgutils.unpack_tuple(builder, arr.strides, count=aryty.ndim)
        inds = [builder.sext(v, intp) if v.type.width < intp.width else v for v in inds]
        return cgutils.get_item_pointer2(context, builder, data=arr.data, shape=shapes, strides=strides,
                                         layout=aryty.layout, inds=inds, wraparound=False)

    def _check(aryty, ndim, idx, what):
        if not isinstance(aryty, types.Array) or aryty.ndim != ndim or aryty.layout != "C":
            raise TypingError(f"{what}: expected a C-contiguous {ndim}-D array, got {aryty}")
        if not all(isinstance(t, types.Integer) for t in idx):
            raise TypingError(f"{what}: indices must be integers, got {idx}")

    _TUPLE4 = types.UniTuple(types.float32, 4)

    @intrinsic
    def ldg4(typingctx, arr, i, j, k):
        """``arr[i, j, k:k+4]`` as four float32, one ``ld.global.nc.v4`` instruction."""
        _check(arr, 3, (i, j, k), "ldg4")
        if arr.dtype not in (types.float32, types.float16):
            raise TypingError(f"ldg4: float32 or float16 arrays only, got {arr.dtype}")
        sig = _TUPLE4(arr, i, j, k)
        is_half = arr.dtype == types.float16

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
            ret = ir.LiteralStructType([_F32] * 4)
            fnty = ir.FunctionType(ret, [ptr.type])
            if is_half:
                asm = ("{\n\t.reg .b16 h0, h1, h2, h3;\n\t"
                       "ld.global.nc.v4.b16 {h0, h1, h2, h3}, [$4];\n\t"
                       "cvt.f32.f16 $0, h0;\n\tcvt.f32.f16 $1, h1;\n\t"
                       "cvt.f32.f16 $2, h2;\n\tcvt.f32.f16 $3, h3;\n\t}")
            else:
                asm = "ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];"
            call = builder.call(ir.InlineAsm(fnty, asm, "=f,=f,=f,=f,l"), [ptr])
            vals = [builder.extract_value(call, n) for n in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    _TUPLE8 = types.UniTuple(types.float32, 8)

    @intrinsic
    def ldg_f16x8(typingctx, arr, i, j, k):
        """``arr[i, j, k:k+8]`` of a float16 array as eight float32: one 16-byte ``ld.global.nc.v4.b32``."""
        _check(arr, 3, (i, j, k), "ldg_f16x8")
        if arr.dtype != types.float16:
            raise TypingError(f"ldg_f16x8: float16 arrays only, got {arr.dtype}")
        sig = _TUPLE8(arr, i, j, k)

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
            fnty = ir.FunctionType(ir.LiteralStructType([_F32] * 8), [ptr.type])
            body = ("{ .reg .b32 vr<4>; .reg .b16 vh<8>; "
                    "ld.global.nc.v4.b32 {vr0, vr1, vr2, vr3}, [$8]; "
                    "mov.b32 {vh0, vh1}, vr0; mov.b32 {vh2, vh3}, vr1; "
                    "mov.b32 {vh4, vh5}, vr2; mov.b32 {vh6, vh7}, vr3; "
                    + " ".join(f"cvt.f32.f16 ${e}, vh{e};" for e in range(8)) + " }")
            call = builder.call(ir.InlineAsm(fnty, body, ",".join(["=f"] * 8) + ",l"), [ptr])
            vals = [builder.extract_value(call, n) for n in range(8)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    def _shared_vec_ptr(builder, ptr):
        vec = ir.VectorType(_F32, 4)
        sptr = builder.addrspacecast(ptr, ir.PointerType(_F32, 3))
        return builder.bitcast(sptr, ir.PointerType(vec, 3))

    @intrinsic
    def lds4(typingctx, arr, i, j):
        """``arr[i, j:j+4]`` of a 16-byte-aligned shared float32 array: one ``ld.shared.v4.f32``."""
        _check(arr, 2, (i, j), "lds4")
        if arr.dtype != types.float32:
            raise TypingError(f"lds4: float32 arrays only, got {arr.dtype}")
        sig = _TUPLE4(arr, i, j)

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, sig.args[0], args[0], sig.args[1:], args[1:])
            v = builder.load(_shared_vec_ptr(builder, ptr), align=16)
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), n)) for n in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def sts4(typingctx, arr, i, j, a, b, c, d):
        """``arr[i, j:j+4] = a, b, c, d`` into a 16-byte-aligned shared float32 array: one ``st.shared.v4.f32``."""
        _check(arr, 2, (i, j), "sts4")
        if arr.dtype != types.float32:
            raise TypingError(f"sts4: float32 arrays only, got {arr.dtype}")
        sig = types.void(arr, i, j, a, b, c, d)

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, sig.args[0], args[0], sig.args[1:3], args[1:3])
            vec = ir.Constant(ir.VectorType(_F32, 4), ir.Undefined)
            for n, (val, ty) in enumerate(zip(args[3:], sig.args[3:])):
                vec = builder.insert_element(vec, context.cast(builder, val, ty, types.float32),
                                             ir.Constant(ir.IntType(32), n))
            builder.store(vec, _shared_vec_ptr(builder, ptr), align=16)
            return context.get_dummy_value()

        return sig, codegen


    _DYN_SYMBOL = "numba_attn_dynamic_smem"

    @_intrinsic(target="cuda", prefer_literal=True)
    def dynamic_tile(typingctx, offset, rows, cols):
        """A (rows, cols) C-contiguous float32 array over the block's dynamic shared
        memory, ``offset`` float32 elements from its 16-byte-aligned base.

        ``rows`` and ``cols`` must be compile-time integers (closure constants);
        ``offset`` may be computed at run time (e.g. a buffer index times a
        tile size) and must be a multiple of 4 to keep 16-byte alignment.
        """
        if not (isinstance(rows, types.IntegerLiteral) and isinstance(cols, types.IntegerLiteral)):
            raise TypingError(f"dynamic_tile: rows and cols must be compile-time integers, got {rows}, {cols}")
        if not isinstance(offset, types.Integer):
            raise TypingError(f"dynamic_tile: offset must be an integer, got {offset}")
        nrows, ncols = rows.literal_value, cols.literal_value
        aryty = types.Array(types.float32, 2, "C")
        sig = aryty(offset, rows, cols)

        def codegen(context, builder, sig, args):
            lmod = builder.module
            gv = lmod.globals.get(_DYN_SYMBOL)
            if gv is None:
                gv = cgutils.add_global_variable(lmod, ir.ArrayType(ir.IntType(8), 0), _DYN_SYMBOL, 3)
                gv.linkage = "external"
                gv.align = 16
            base = builder.addrspacecast(gv, ir.PointerType(ir.IntType(8)), "generic")
            off = context.cast(builder, args[0], sig.args[0], types.intp)
            nbytes = builder.mul(off, ir.Constant(off.type, 4))
            data = builder.bitcast(builder.gep(base, [nbytes]), ir.PointerType(_F32))
            ary = context.make_array(aryty)(context, builder)
            intp = lambda v: context.get_constant(types.intp, v)  # noqa: E731
            context.populate_array(ary, data=data, shape=[intp(nrows), intp(ncols)],
                                   strides=[intp(4 * ncols), intp(4)], itemsize=intp(4), meminfo=None)
            return ary._getvalue()

        return sig, codegen


# -- tile loaders (device functions) ---------------------------------------------
#
# Shared by the CUDA-core roadmap phases (q_smem ... causal_skip). ``R`` and
# ``C`` (rows and columns of the tile) are passed as compile-time constants
# from the kernel factories; after inlining the loops over them have constant
# trip counts, so the staging arrays stay in registers.

from numba import float32 as _f32  # noqa: E402

from numba_attn.gpu.jit import device  # noqa: E402

_ZERO = np.float32(0.0)

# Score of a masked (query, key) pair and the initial running maximum. Finite on
# purpose: kernels compile with fastmath, whose no-infs flag lets the compiler
# assume no operand is infinite. exp2(MASKED - m) is 0 for any reachable m; a
# row's first tile always holds a key it sees (key 0), so m is a real score
# from then on.
MASKED = np.float32(-1e30)


@device
def load_tile_t_scaled(tile_t, src, bh, row0, n_rows, scale, tid, nthreads, R, C):
    """Scalar, transposed and scaled::

        tile_t[:C, :R] = (src[bh, row0:row0+R, :C] * scale).T   (rows past n_rows: 0)

    Consecutive threads take consecutive rows, so the shared-memory stores of
    a warp hit 32 different banks (the global reads are strided; the tile is
    read once per block).
    """
    for e in range(tid, R * C, nthreads):
        c = e // R
        r = e - c * R
        if row0 + r < n_rows:
            tile_t[c, r] = _f32(src[bh, row0 + r, c]) * scale
        else:
            tile_t[c, r] = _f32(0.0)


@device
def load_tile4(tile, src, bh, row0, n_rows, scale, tid, nthreads, R, C):
    """16-byte loads, row-major::

        tile[:R, :C] = src[bh, row0:row0+R, :C] * scale   (rows past n_rows: 0)

    one :func:`ldg4` and one :func:`sts4` per 4 elements; consecutive threads
    take consecutive 16-byte pieces of a row (coalesced). ``tile`` may be
    wider than ``C`` (padding columns are not touched).
    """
    n4 = C // 4
    for e in range(tid, R * n4, nthreads):
        r = e // n4
        c = (e - r * n4) * 4
        if row0 + r < n_rows:
            x0, x1, x2, x3 = ldg4(src, bh, row0 + r, c)
            sts4(tile, r, c, x0 * scale, x1 * scale, x2 * scale, x3 * scale)
        else:
            sts4(tile, r, c, _ZERO, _ZERO, _ZERO, _ZERO)


@device
def load_tile4_t(tile_t, src, bh, row0, n_rows, scale, tid, nthreads, R, C):
    """16-byte loads, transposed::

        tile_t[:C, :R] = (src[bh, row0:row0+R, :C] * scale).T   (rows past n_rows: 0)

    Consecutive threads take consecutive rows (same 4 columns), so each of
    the four scalar shared stores of a warp is conflict-free.
    """
    n4 = C // 4
    for e in range(tid, R * n4, nthreads):
        c = (e // R) * 4
        r = e - (c // 4) * R
        x0 = x1 = x2 = x3 = _f32(0.0)
        if row0 + r < n_rows:
            x0, x1, x2, x3 = ldg4(src, bh, row0 + r, c)
        tile_t[c, r] = x0 * scale
        tile_t[c + 1, r] = x1 * scale
        tile_t[c + 2, r] = x2 * scale
        tile_t[c + 3, r] = x3 * scale


@device
def set4(a, i, x0, x1, x2, x3):
    """``a[i:i+4] = x0, x1, x2, x3``: four values into a local array (the words of one 16-byte load)."""
    a[i] = x0
    a[i + 1] = x1
    a[i + 2] = x2
    a[i + 3] = x3


@device
def fetch4(stage, src, bh, row0, n_rows, tid, nthreads, R, C):
    """First half of a register-staged load (row-major order): this thread's
    share of ``src[bh, row0:row0+R, :C]`` into the local array ``stage``
    (4 floats per 16-byte load; rows past n_rows and units past the tile: 0).
    :func:`put4` later writes it to shared memory, so the global loads are in
    flight while the thread computes."""
    n4 = C // 4
    for u in range(stage.shape[0] // 4):
        e = tid + u * nthreads
        r = e // n4
        c = (e - r * n4) * 4
        x0 = x1 = x2 = x3 = _f32(0.0)
        if e < R * n4 and row0 + r < n_rows:
            x0, x1, x2, x3 = ldg4(src, bh, row0 + r, c)
        set4(stage, 4 * u, x0, x1, x2, x3)


@device
def put4(tile, stage, tid, nthreads, R, C):
    """Second half of :func:`fetch4`: ``tile[r, c:c+4] = stage[4u:4u+4]`` (16-byte stores)."""
    n4 = C // 4
    for u in range(stage.shape[0] // 4):
        e = tid + u * nthreads
        r = e // n4
        c = (e - r * n4) * 4
        if e < R * n4:
            sts4(tile, r, c, stage[4 * u], stage[4 * u + 1], stage[4 * u + 2], stage[4 * u + 3])


@device
def fetch4_t(stage, src, bh, row0, n_rows, tid, nthreads, R, C):
    """Like :func:`fetch4`, in the order :func:`put4_t` stores transposed
    (consecutive threads take consecutive rows)."""
    n4 = C // 4
    for u in range(stage.shape[0] // 4):
        e = tid + u * nthreads
        c4 = e // R
        r = e - c4 * R
        x0 = x1 = x2 = x3 = _f32(0.0)
        if e < R * n4 and row0 + r < n_rows:
            x0, x1, x2, x3 = ldg4(src, bh, row0 + r, c4 * 4)
        set4(stage, 4 * u, x0, x1, x2, x3)


@device
def put4_t(tile_t, stage, tid, nthreads, R, C):
    """Second half of :func:`fetch4_t`: ``tile_t[c:c+4, r] = stage[4u:4u+4]``
    (scalar stores, conflict-free across a warp's consecutive rows)."""
    n4 = C // 4
    for u in range(stage.shape[0] // 4):
        e = tid + u * nthreads
        c4 = e // R
        r = e - c4 * R
        if e < R * n4:
            c = c4 * 4
            tile_t[c, r] = stage[4 * u]
            tile_t[c + 1, r] = stage[4 * u + 1]
            tile_t[c + 2, r] = stage[4 * u + 2]
            tile_t[c + 3, r] = stage[4 * u + 3]


# -- host side -------------------------------------------------------------------

_OPTED_IN: dict = {}


def _set_max_dynamic_shared(kern, args, nbytes):
    """Compile ``kern`` for ``args`` and raise its dynamic shared-memory limit to ``nbytes``."""
    from numba.cuda.cudadrv.driver import binding, driver  # the Driver object, not the module

    argtypes = tuple(kern.typeof_pyval(a) for a in args)
    key = (id(kern), argtypes)
    if _OPTED_IN.get(key, 0) >= nbytes:
        return
    compiled = kern.compile(argtypes)
    cufunc = compiled._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)
    _OPTED_IN[key] = nbytes


def launch_dynamic(kern, grid, block, stream, nbytes, *args, static_bytes=0):
    """``kern[grid, block, stream, nbytes](*args)``, opting in to more than 48 KiB
    of dynamic shared memory first when ``nbytes`` needs it (GPU only); ``static_bytes``: the
    kernel's static shared memory, which counts towards the same 48 KiB (an upper bound will do)."""
    if nbytes and nbytes + static_bytes > STATIC_SMEM_LIMIT and not IS_SIMULATOR and cuda.is_available():
        _set_max_dynamic_shared(kern, args, nbytes)
    kern[grid, block, stream, nbytes](*args)


def swizzle_row_chunks(D: int) -> int:
    """16-byte chunks per shared row of a tile of ``D`` 16-bit columns (D a multiple of 8)
    stored with the XOR swizzle ``c ^ (r & (min(8, chunks) - 1))`` of the mma.sync phases:
    D/8 rounded up to whole k-steps (2 chunks), then to a power of two up to 8 chunks and to
    a multiple of 8 above, so that the swizzle is a permutation of a row's chunks
    (D = 16, 32, 64, 128, 192, 256: D/8 itself)."""
    c = (D + 15) // 16 * 2
    if c <= 8:
        return 1 << (c - 1).bit_length()
    return (c + 7) // 8 * 8


def smem_reason(nbytes: int) -> str | None:
    """Why a block needing ``nbytes`` of shared memory cannot run (None when it can)."""
    if nbytes > OPT_IN_SMEM_LIMIT:
        return f"needs {nbytes} B of shared memory per block (> {OPT_IN_SMEM_LIMIT} B on sm_90); use smaller tiles"
    return None


__all__ = ["MASKED", "ldg4", "lds4", "sts4", "dynamic_tile", "load_tile_t_scaled", "load_tile4", "load_tile4_t",
           "fetch4", "put4", "fetch4_t", "put4_t", "launch_dynamic", "smem_reason", "swizzle_row_chunks",
           "STATIC_SMEM_LIMIT", "OPT_IN_SMEM_LIMIT"]
