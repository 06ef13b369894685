"""The arrays ``attention()``, ``decode_paged()`` and ``attention_varlen()`` take: NumPy arrays, numba
device arrays and PyTorch tensors (torch is never imported here: a tensor is recognised by its type's
module). Which kind an array is, how the checks read it, its device address, the ``out`` and
``stream`` arguments, and the copies between kinds."""
from __future__ import annotations

import functools
import sys

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.spec.errors import AttentionInputError, check_finite  # noqa: E402


def is_device_array(a) -> bool:
    """A numba device array (or, in the simulator, its stand-in)."""
    if hasattr(cuda, "is_cuda_array"):
        return cuda.is_cuda_array(a)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return isinstance(a, FakeCUDAArray)


NUMPY, DEVICE, TORCH, TORCH_CPU, OTHER = "a NumPy array", "a numba device array", "a CUDA tensor", "a CPU tensor", ""


def kind_of(a) -> str:
    """Which kind of array ``a`` is; :data:`OTHER` for anything else (the array checks name it).
    torch is never imported here: a tensor is recognised by its type's module."""
    cls = type(a)
    if cls is np.ndarray:
        return NUMPY
    if cls.__module__.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(a, torch.Tensor):
            return TORCH if a.is_cuda or a.device.type != "cpu" else TORCH_CPU
        return OTHER
    if getattr(cls, "__cuda_ndarray__", False) or is_device_array(a):
        return DEVICE
    return NUMPY if isinstance(a, np.ndarray) else OTHER


def one_kind(q, k, v, out) -> str:
    """The kind of q; k, v and ``out`` must be of the same kind (and tensors on q's device)."""
    kind = kind_of(q)
    if out is not None and kind_of(out) is OTHER and kind is not OTHER:
        raise AttentionInputError(f"out must be {kind} like q (or None); got {type(out).__name__}")
    named = (("k", k), ("v", v)) if out is None else (("k", k), ("v", v), ("out", out))
    for name, a in named:
        ka = kind_of(a)
        if ka != kind and ka is not OTHER and kind is not OTHER:
            raise AttentionInputError(
                f"{name} is {ka} but q is {kind}: q, k, v{' and out' if out is not None else ''} must be of one "
                f"kind (all NumPy arrays, all numba device arrays, or all PyTorch tensors on one device)")
        if kind == TORCH and ka == TORCH and (a.get_device() != q.get_device() or a.is_cuda != q.is_cuda) \
                and a.device != q.device:  # (device objects compared only when the cheap test differs)
            raise AttentionInputError(f"{name} is on {a.device} but q is on {q.device}: the tensors must be on "
                                      f"one device")
    return kind


class Described:
    """The shape and (NumPy) dtype of a tensor: what the checks written for arrays read."""

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = dtype


def numpy_dtype_of(name, t):
    """The NumPy dtype (ml_dtypes' bfloat16 for torch.bfloat16) of the tensor ``t``."""
    text = str(t.dtype).removeprefix("torch.")
    if text == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise AttentionInputError(f"{name} is a bfloat16 tensor: numba-attn reads bfloat16 through "
                                      f"ml_dtypes (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(text)
    except TypeError:
        from numba_attn.spec.errors import SUPPORTED_DTYPES

        raise AttentionInputError(f"{name} has dtype {t.dtype}; supported dtypes: "
                                  f"{', '.join(SUPPORTED_DTYPES)}") from None


def described(name, t) -> Described:
    return Described(t.shape, numpy_dtype_of(name, t))


def tensor_as_numpy(name, t):
    """A CPU tensor as a NumPy array sharing its memory (no copy); bfloat16 through its 16-bit
    pattern, reinterpreted as ml_dtypes' bfloat16."""
    dtype = numpy_dtype_of(name, t)
    t = t.detach()
    if dtype.name == "bfloat16":
        torch = sys.modules["torch"]
        return t.view(torch.int16).numpy().view(dtype)
    return t.numpy()


def numpy_as_tensor(a):
    """The NumPy result as a CPU tensor sharing its memory (bfloat16 through its 16-bit pattern)."""
    torch = sys.modules["torch"]
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def arrays_for_checks(kind, q, k, v):
    """q, k, v as the checks read them: tensors described by shape and NumPy dtype."""
    if kind == TORCH:
        return tuple(described(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    if kind == TORCH_CPU:
        return tuple(tensor_as_numpy(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    return q, k, v


def address(kind, a) -> int:
    """The device address of a tensor's or numba device array's first element."""
    if kind == TORCH:
        return a.data_ptr()
    try:
        return a.device_ctypes_pointer.value or 0
    except AttributeError:  # another CUDA array interface object
        return a.__cuda_array_interface__["data"][0]


def check_out(out, kind, q, k, v):
    """``out`` must be of q's kind, shape, dtype (and device), C-contiguous, writeable and share no
    memory with q, k or v (the kernels read them while they write it). O(1)."""
    if (out.shape != q.shape) if kind == TORCH else (tuple(out.shape) != tuple(q.shape)):  # (torch.Size: no copy)
        raise AttentionInputError(f"out has shape {tuple(out.shape)}; it must have q's shape {tuple(q.shape)}")
    if out.dtype != q.dtype:
        raise AttentionInputError(f"out has dtype {out.dtype}; it must have q's dtype {q.dtype}")
    if kind == TORCH:  # (the fewest tensor attribute reads: this runs at every call with out=)
        contiguous, overlap, strides = out.is_contiguous(), None, None
        lo = out.data_ptr()
        hi = lo + out.nbytes
        for name, a in (("q", q), ("k", k), ("v", v)):
            alo = a.data_ptr()
            if alo < hi and lo < alo + a.nbytes:
                overlap = name
                break
        if not contiguous:
            strides = out.stride()
    elif kind == DEVICE:
        contiguous, overlap, strides = out.is_c_contiguous(), None, out.strides
        if contiguous and not backend.IS_SIMULATOR:
            lo = address(DEVICE, out)
            hi = lo + out.nbytes
            for name, a in (("q", q), ("k", k), ("v", v)):
                alo = address(DEVICE, a)
                if alo < hi and lo < alo + a.nbytes:
                    overlap = name
                    break
        elif contiguous:
            overlap = next((n for n, a in (("q", q), ("k", k), ("v", v))
                            if np.may_share_memory(out._ary, a._ary)), None)
    else:
        if not out.flags.writeable:
            raise AttentionInputError("out is read-only; pass a writeable array")
        contiguous, strides = out.flags.c_contiguous, out.strides
        overlap = next((n for n, a in (("q", q), ("k", k), ("v", v)) if np.may_share_memory(out, a)), None)
    if not contiguous:
        raise AttentionInputError(f"out is not C-contiguous (strides {tuple(strides)}); pass a contiguous output")
    if overlap:
        raise AttentionInputError(f"out shares memory with {overlap}: the kernels read {overlap} while they "
                                  f"write out; pass a separate output")



def contiguous(name, a):
    """A NumPy input as a C-contiguous array (copied when it is not one); a device array as it
    is, refused when it is not C-contiguous (copying it would hide a device-to-device copy)."""
    if is_device_array(a):
        ok = a.is_c_contiguous() if hasattr(a, "is_c_contiguous") else True
        if not ok:
            raise AttentionInputError(
                f"{name} is a non-contiguous device array (strides {tuple(a.strides)}); pass a C-contiguous "
                f"one, e.g. cuda.to_device(np.ascontiguousarray(...)) (device arrays are not copied implicitly)")
        return a
    return np.ascontiguousarray(a)


def empty_output(q, shape):
    if kind_of(q) == TORCH:
        return sys.modules["torch"].empty(shape, dtype=q.dtype, device=q.device)
    if is_device_array(q):
        return cuda.device_array(shape, dtype=q.dtype)
    return np.empty(shape, dtype=q.dtype)



def is_contiguous(kind, a) -> bool:
    if kind == TORCH:
        return a.is_contiguous()
    if kind == NUMPY:
        return a.flags.c_contiguous
    return a.is_c_contiguous()


def check_finite_input(kind, name, a) -> None:
    if kind == TORCH:
        a = tensor_as_numpy(name, a.detach().cpu())
    check_finite(name, a)


# -- streams -------------------------------------------------------------------------------------

_STREAMS: dict = {}  # stream handle -> (numba stream, the stream kernels are launched on)


def stream_of(kind, q, stream):
    """``(key, numba stream, launch stream)`` for the call. On a GPU the key is the stream's handle:
    PyTorch's current stream for CUDA tensors, else ``stream=``'s, else the default stream (0)."""
    if backend.IS_SIMULATOR:
        if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
            return None, 0, 0
        if isinstance(stream, cuda.stream):
            return id(stream), stream, stream
        raise AttentionInputError(f"stream must be None, 0 or a numba stream (numba.cuda.stream()); got "
                                  f"{type(stream).__name__} {stream!r} (the simulator has no other streams)")
    if stream is None:
        if kind == TORCH:  # the raw handle where torch has it: no Stream object made per call
            torch = sys.modules["torch"]
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            handle = raw(q.get_device()) if raw is not None and q.is_cuda else \
                torch.cuda.current_stream(q.device).cuda_stream
        else:
            handle = 0
    elif isinstance(stream, int) and not isinstance(stream, bool) and stream == 0:
        handle = 0
    elif type(stream).__module__.startswith("torch") and hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    elif type(stream).__module__.startswith("numba") and hasattr(stream, "handle"):
        handle = int(stream.handle or 0)
    else:
        raise AttentionInputError(f"stream must be None, a numba stream (numba.cuda.stream(), "
                                  f"cuda.external_stream(handle)) or a torch.cuda.Stream; got "
                                  f"{type(stream).__name__} {stream!r}")
    hit = _STREAMS.get(handle)
    if hit is None:
        numba_stream = cuda.external_stream(handle) if handle else 0
        try:
            from numba.cuda.cudadrv.driver import _to_core_stream

            launch_stream = _to_core_stream(numba_stream)  # what numba converts every launch's stream to
        except (ImportError, TypeError):
            launch_stream = numba_stream
        hit = _STREAMS[handle] = (numba_stream, launch_stream)
    return handle, hit[0], hit[1]



# -- the paged and varlen layouts: inputs on the host for the checks, on the device for the kernels ---------

def host_array(a):
    """A block table, lengths or scale as a host NumPy array (or scalar) for the checks."""
    if a is None or isinstance(a, (int, float, np.floating, np.integer)):
        return a
    k = kind_of(a)
    if k == TORCH:
        return a.detach().cpu().numpy()
    if k == TORCH_CPU:
        return a.detach().numpy()
    if k == DEVICE:
        return a.copy_to_host()
    return np.asarray(a)


def dtype_name(name, a) -> str:
    text = str(a.dtype).removeprefix("torch.")
    return {"float8_e4m3fn": "float8_e4m3"}.get(text, text)


def as_device_array(kind, a):
    """An input as a numba device array (8-bit floats as their bytes)."""
    if kind == TORCH:
        torch = sys.modules["torch"]
        if a.dtype in (torch.float8_e4m3fn, torch.int8):
            a = a.view(torch.uint8)
        elif a.dtype == torch.bfloat16:
            a = a.view(torch.int16)
        return cuda.as_cuda_array(a.detach())
    if kind == DEVICE:
        return a
    a = tensor_as_numpy("array", a) if kind == TORCH_CPU and "float8" not in str(a.dtype) else a
    if kind == TORCH_CPU and "float8" in str(a.dtype):
        a = a.detach().view(sys.modules["torch"].uint8).numpy()
    a = np.ascontiguousarray(a)
    if a.dtype.name in ("float8_e4m3fn", "bfloat16"):
        a = a.view(np.uint8 if a.dtype.itemsize == 1 else np.uint16)
    return cuda.to_device(a)


@functools.cache
def _swap_kernel():
    from numba_attn.gpu.jit import kernel

    @kernel
    def swap(src, dst):  # dst[a, c, b, d] = src[a, b, c, d]
        i = cuda.grid(1)
        n1, n2, n3 = src.shape[1], src.shape[2], src.shape[3]
        if i < src.shape[0] * n1 * n2 * n3:
            d = i % n3
            r = i // n3
            c = r % n2
            r = r // n2
            b = r % n1
            a = r // n1
            dst[a, c, b, d] = src[a, b, c, d]

    return swap


def swap_axes_1_2(src):
    """A device array (A, X, Y, D) copied to a new one (A, Y, X, D) on the device."""
    n0, n1, n2, n3 = map(int, src.shape)
    dst = cuda.device_array((n0, n2, n1, n3), dtype=src.dtype)
    n = n0 * n1 * n2 * n3
    if n:
        _swap_kernel()[(n + 127) // 128, 128](src, dst)
    return dst

