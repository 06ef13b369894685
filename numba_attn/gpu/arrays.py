"""Device arrays made cheaply, for the host side of a launch.

numba types every array argument of a launch from the array object (``_numba_type_``, computed
once per object), and every new ``DeviceNDArray`` (a ``reshape``, a ``view``, one made from a
tensor's CUDA array interface) is a new object: typing it again costs several microseconds per
argument and call. Here an array of a given shape, strides and dtype is built and typed once (a
template); later arrays of that layout copy the template's attributes and get their own memory
pointer. The result is an ordinary ``DeviceNDArray`` with the same numba type, so the kernels
compiled for it are the same.

* :class:`BoundArrays`: arrays of fixed shapes at any device address, not owning the memory
  (the caller's arrays or tensors do): ``attention()`` binds each call's q, k, v, o to the
  kernels' (B·H, N, D) shapes this way;
* :func:`view_as`: ``a.view(dtype)`` of a C-contiguous device array (the uint32 views of the
  16-bit tensor-core inputs), sharing ``a``'s memory pointer like ``view`` does.

In the simulator both fall back to the plain numba calls (``view``; ``BoundArrays`` is not used).
"""
from __future__ import annotations

import functools

import numpy as np

from numba_attn.gpu.backend import IS_SIMULATOR

_TEMPLATES: dict = {}  # (shape, dtype) -> attributes of a typed C-contiguous DeviceNDArray
_MAX_TEMPLATES = 1024


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _template(shape, dtype, gpu_data) -> dict:
    """The attributes of a typed C-contiguous ``DeviceNDArray`` of ``shape`` and ``dtype`` (minus its
    memory and the launch's cached pointer view, which belong to each array)."""
    key = (shape, dtype)
    state = _TEMPLATES.get(key)
    if state is None:
        t = _device_ndarray()(shape, _c_strides(shape, dtype.itemsize), dtype, gpu_data=gpu_data)
        t._numba_type_  # noqa: B018  (typed once; every array made from the template keeps the type)
        state = {k: v for k, v in t.__dict__.items() if k not in ("gpu_data", "_strided_memory_view_shim")}
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.clear()
        _TEMPLATES[key] = state
    return state


@functools.cache
def _device_ndarray():
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray


def _from_template(state, gpu_data):
    a = object.__new__(_device_ndarray())
    a.__dict__.update(state)
    a.gpu_data = gpu_data
    return a


def view_as(a, dtype):
    """``a.view(dtype)`` for a C-contiguous device array, without typing the view again (its
    numba type is the template's: same shape, C layout, dtype). Anything else: ``a.view(dtype)``."""
    dtype = np.dtype(dtype)
    if IS_SIMULATOR or type(a) is not _device_ndarray() or a.ndim == 0 or not a.is_c_contiguous():
        return a.view(dtype)  # NumPy arrays (offline compilation), the simulator, other layouts
    row = a.shape[-1] * a.dtype.itemsize
    if row % dtype.itemsize:
        return a.view(dtype)  # numba raises its own error
    shape = a.shape[:-1] + (row // dtype.itemsize,)
    return _from_template(_template(shape, dtype, a.gpu_data), a.gpu_data)


class BoundArrays:
    """C-contiguous device arrays of the given ``shapes`` and ``dtype`` at any address:
    ``bound(i, address)`` is the i-th shape at ``address``. The arrays do not own their memory:
    whoever passes the address keeps it alive while the kernels use it (so a cached plan holding
    these arrays keeps no caller's memory alive)."""

    def __init__(self, shapes, dtype):
        from numba.cuda.cudadrv import devices, driver

        dtype = np.dtype(dtype)
        self._pointer, self._memory = driver.binding.CUdeviceptr, driver.MemoryPointer
        self._context = devices.get_context()
        self._states = []
        for shape in shapes:
            shape = tuple(int(n) for n in shape)
            nbytes = int(np.prod(shape)) * dtype.itemsize
            state = _template(shape, dtype, self._memory(self._context, self._pointer(0), nbytes))
            self._states.append((state, nbytes))

    def __call__(self, i, address):
        state, nbytes = self._states[i]
        return _from_template(state, self._memory(self._context, self._pointer(address), nbytes))
