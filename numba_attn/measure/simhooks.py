"""The simulator hooks of :mod:`numba_attn.measure.simcount`: what is counted and how. Proxies for global and
shared arrays record each element read or written, the project's intrinsics' fallbacks are replaced by
handlers that record the instruction as the GPU executes it, and barriers, atomics, blocks and launches are
wrapped; :func:`install` puts them in the simulator's way, :func:`uninstall` takes them out. A lane's
records go to the session made current by :func:`activate`."""
from __future__ import annotations

import functools
import importlib
import math
import sys
import threading
import types
from collections import defaultdict

import numpy as np

from numba_attn.measure.simtally import SECTOR_BYTES, WARP

HOOK_NAME = "__numba_attn_simcount__"

_active = None  # the counting session, while a context is open


def activate(sess) -> None:
    """Make ``sess`` the session the lanes record into (None: nothing is recorded)."""
    global _active
    _active = sess


# -- addresses -----------------------------------------------------------------------


def _place(a: np.ndarray):
    """(allocation key, byte offset of ``a``'s first element in its allocation, strides, shape)."""
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    ptr = a.__array_interface__["data"][0]
    root = base.__array_interface__["data"][0]
    return root, ptr - root, a.strides, a.shape


def _offset(place, idx):
    root, off, strides, shape = place
    if type(idx) is tuple:
        if len(idx) == 2:
            i, j = idx
            return root, off + (int(i) % shape[0]) * strides[0] + (int(j) % shape[1]) * strides[1]
        if len(idx) == 3:
            i, j, k = idx
            return root, (off + (int(i) % shape[0]) * strides[0] + (int(j) % shape[1]) * strides[1]
                          + (int(k) % shape[2]) * strides[2])
        for i, s, n in zip(idx, strides, shape):
            off += (int(i) % n) * s  # (a negative index counts from the end, as NumPy's; in range: checked by it)
        return root, off
    return root, off + (int(idx) % shape[0]) * strides[0]


def _scalar_index(idx, ndim) -> bool:
    if type(idx) is tuple:
        return len(idx) == ndim and all(isinstance(i, (int, np.integer)) for i in idx)
    return ndim == 1 and isinstance(idx, (int, np.integer))


def _raw(arr) -> np.ndarray:
    item = getattr(arr, "__dict__", {}).get("_item")
    if item is not None:  # a (counting) FakeWithinKernelCUDAArray
        return item._ary
    return np.asarray(getattr(arr, "_ary", arr))


def _place_of(arr):
    d = getattr(arr, "__dict__", None)
    p = d.get("_scp") if d is not None else None
    if p is None:
        p = _place(_raw(arr))
        if d is not None:
            d["_scp"] = p
    return p


def _addr(arr, idx):
    return _offset(_place_of(arr), idx)


def _flat_addr(arr, i):
    root, off, strides, shape = _place_of(arr)
    return root, off + int(i) * _raw(arr).itemsize


# -- per-thread state ------------------------------------------------------------------


class _Lane:
    __slots__ = ("warp", "lane", "tid", "epoch", "k", "log", "suppress", "syncs", "direct")

    def __init__(self, tid):
        self.tid = tid
        self.warp, self.lane = divmod(tid, WARP)
        self.epoch = 0
        self.k = {}
        self.log = []
        self.suppress = 0
        self.syncs = 0
        self.direct = defaultdict(int)


def _state():
    t = threading.current_thread()
    st = t.__dict__.get("_numba_attn_sc")
    if st is None:
        sess = _active
        tid = t.__dict__.get("thread_id")
        if sess is None or tid is None:
            return None
        st = t.__dict__["_numba_attn_sc"] = _Lane(tid)
        with sess.lock:
            sess.block_lanes.append(st)
    return st


_SITES = {}  # (id(code), f_lasti, kind) -> site number; f_lasti of a specialized instruction moves into its cache
SITE_KIND = []  # site number -> kind ("gl", "gs", "sl", "ss" or an instruction's name)
_CODES = {}  # id(code) -> (code, instruction offsets); the code is kept so that its id is not reused
_SITES_LOCK = threading.Lock()


def _site(code, lasti, kind):
    import bisect
    import dis

    with _SITES_LOCK:
        entry = _CODES.get(id(code))
        if entry is None:
            entry = _CODES[id(code)] = (code, [i.offset for i in dis.get_instructions(code)])
        offs = entry[1]
        start = offs[max(bisect.bisect_right(offs, lasti) - 1, 0)]
        site = _SITES.get((id(code), start, kind))
        if site is None:
            site = len(SITE_KIND)
            SITE_KIND.append(kind)
            _SITES[(id(code), start, kind)] = site
        _SITES[(id(code), lasti, kind)] = site
    return site


def _log(st, frame, kind, root, off, nbytes):
    key = (id(frame.f_code), frame.f_lasti, kind)
    site = _SITES.get(key)
    if site is None:
        site = _site(frame.f_code, frame.f_lasti, kind)
    k = st.k.get(site, 0)
    st.k[site] = k + 1
    st.log.append((site, st.epoch, k, root, off, nbytes))


# -- the proxies -----------------------------------------------------------------------


class _SharedArray(np.ndarray):
    """A shared array (or a view of one) whose element reads and writes are recorded."""

    def __getitem__(self, idx):
        ret = np.ndarray.__getitem__(self, idx)
        if isinstance(ret, np.ndarray):
            return ret
        st = _state()
        if st is not None and not st.suppress:
            p = self.__dict__.get("_scp") or _place_of(self)
            root, off = _offset(p, idx)
            _log(st, sys._getframe(1), "sl", root, off, self.itemsize)
        return ret

    def __setitem__(self, idx, val):
        np.ndarray.__setitem__(self, idx, val)
        if _scalar_index(idx, self.ndim):
            st = _state()
            if st is not None and not st.suppress:
                root, off = _addr(self, idx)
                _log(st, sys._getframe(1), "ss", root, off, self.itemsize)


def _global_class():
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray

    class _GlobalArray(FakeWithinKernelCUDAArray):
        """A kernel's global array (or a view of it) whose element reads and writes are recorded."""

        def _FakeWithinKernelCUDAArray__wrap_if_fake(self, item):
            return _GlobalArray(item) if isinstance(item, FakeCUDAArray) else item

        def __getitem__(self, idx):
            item = self.__dict__["_item"]
            ret = item._ary[idx]
            t = type(ret)
            if t is np.ndarray or t is np.void:
                return _GlobalArray(FakeCUDAArray(ret, stream=item.stream))
            st = _state()
            if st is not None and not st.suppress:
                root, off = _addr(self, idx)
                _log(st, sys._getframe(1), "gl", root, off, item._ary.itemsize)
            return ret

        def __setitem__(self, idx, val):
            item = self.__dict__["_item"]
            item._ary[idx] = val
            if _scalar_index(idx, item._ary.ndim):
                st = _state()
                if st is not None and not st.suppress:
                    root, off = _addr(self, idx)
                    _log(st, sys._getframe(1), "gs", root, off, item._ary.itemsize)

    return _GlobalArray, FakeCUDAArray


# -- the intrinsics' fallbacks -----------------------------------------------------------


def _run(orig, args, kwargs, st):
    st.suppress += 1
    try:
        return orig(*args, **kwargs)
    finally:
        st.suppress -= 1


def _op(name, mult=None):
    def handler(orig, args, kwargs, st, frame):
        _log(st, frame, name, 0, 0, mult(*args) if mult else 1)
        return _run(orig, args, kwargs, st)

    return handler


def _mem(*accesses, op=None):
    """A handler recording ``accesses``: (kind, address(args) -> (root, off), nbytes(args), when(args))."""
    def handler(orig, args, kwargs, st, frame):
        for kind, where, size, when in accesses:
            if when is None or when(*args):
                root, off = where(*args)
                _log(st, frame, kind, root, off, size(*args))
        if op:
            _log(st, frame, op, 0, 0, 1)
        return _run(orig, args, kwargs, st)

    return handler


def _itemsize(a):
    return _raw(a).itemsize


def _log2(n):
    return int(round(math.log2(int(n)))) if int(n) >= 1 else 0


def _rows_head_major(orig, args, kwargs, st, frame):
    res = _run(orig, args, kwargs, st)
    a = args[0]
    if getattr(a, "__dict__", {}).get("_item") is not None and isinstance(res, np.ndarray):
        G, F = _active.global_cls
        return G(F(res))
    return res


def _wgmma_reference(orig, args, kwargs, st, frame):
    if st.tid % 128 == 0:  # one count per warpgroup: every thread of it calls the host model
        from numba_attn.gpu.wgmma import ELEMENT_BYTES, b_addresses

        kind, N, _a, _c, _buf, start, offsets, lbo, sbo, trans_b, rb = args[:11]
        esize = ELEMENT_BYTES[kind]
        st.direct["sim_wgmma"] += 1
        st.direct["sim_smem_load_bytes"] += int(np.size(b_addresses(start, N, offsets, lbo, sbo, trans_b, rb,
                                                                     esize))) * esize
    return _run(orig, args, kwargs, st)


def _tma(orig, args, kwargs, st, frame):
    tmap = args[2]
    coords = args[3:-2]
    a = tmap.array
    src = []
    for c, b, n in zip(coords, tmap.box, a.shape):
        lo, hi = max(int(c), 0), min(int(c) + int(b), n)
        if lo >= hi:
            src = None
            break
        src.append(slice(lo, hi))
    st.direct["sim_tma"] += 1
    st.direct["sim_smem_store_bytes"] += int(tmap.box_bytes)  # the whole box is written (zeros out of bounds)
    if src is not None:
        region = a[tuple(src)]
        root, off0, strides, shape = _place(region)
        st.direct["sim_gmem_read_bytes"] += int(region.nbytes)
        row = shape[-1] * region.itemsize
        sectors = set()
        for outer in np.ndindex(*shape[:-1]):
            o = off0 + sum(i * s for i, s in zip(outer, strides[:-1]))
            sectors.update(range(o // SECTOR_BYTES, (o + row - 1) // SECTOR_BYTES + 1))
        st.direct["sim_gmem_read_sectors"] += len(sectors)
    return _run(orig, args, kwargs, st)


def _handlers():
    """{(module, function name): handler(orig, args, kwargs, lane state, calling frame)}."""
    g3 = lambda a, i, j, k, *_: _addr(a, (i, j, k))  # noqa: E731
    s2 = lambda a, i, j, *_: _addr(a, (i, j))  # noqa: E731
    c16 = lambda *_: 16  # noqa: E731
    h = {}
    I = "numba_attn.gpu.intrinsics"  # noqa: E741
    for name in ("mma_f16", "mma_bf16", "mma_tf32"):
        h[(I, name)] = _op("mma")
    for name in ("ldmatrix_x4", "ldmatrix_x4_trans"):
        h[(I, name)] = _mem(("sl", s2, c16, None), op="ldmatrix")
    h[(I, "cp_async16")] = _mem(("ss", lambda d, r, c, *_: _addr(d, (r, c)), c16, None),
                                ("gl", lambda d, r, c, s, b, sr, sc, *_: _addr(s, (b, sr, sc)), c16,
                                 lambda *a: bool(a[7])), op="cp_async")
    h[(I, "cp_async16_flat")] = _mem(("ss", lambda d, do, *_: _flat_addr(d, do), c16, None),
                                     ("gl", lambda d, do, s, so, *_: _flat_addr(s, so), c16, lambda *a: bool(a[4])),
                                     op="cp_async")
    h[(I, "cp_async16_at_ca")] = _mem(
        ("ss", lambda d, do, *_: _flat_addr(d, do), c16, None),
        ("gl", lambda d, do, s, row, n, col, off, v: _flat_addr(s, int(row) * int(n) + int(col) + int(off)), c16,
         lambda *a: bool(a[7])), op="cp_async")
    h[(I, "cp_async4_at")] = _mem(("ss", lambda d, do, *_: _flat_addr(d, do), lambda *_: 4, None),
                                  ("gl", lambda d, do, s, i, v: _flat_addr(s, i), lambda *_: 4, lambda *a: bool(a[4])),
                                  op="cp_async")
    h[(I, "ld_global_v4")] = _mem(("gl", g3, c16, None))
    h[(I, "ld_global_v2")] = _mem(("gl", g3, lambda *_: 8, None))
    flat_at = lambda a, row, n, col, off: _flat_addr(a, int(row) * int(n) + int(col) + int(off))  # noqa: E731
    h[(I, "ld_global_v4_at")] = _mem(("gl", flat_at, c16, None))
    h[(I, "ld_global_v2_at")] = _mem(("gl", flat_at, lambda *_: 8, None))
    h[(I, "ld_at")] = _mem(("gl", lambda a, i: _flat_addr(a, i), lambda a, i: _itemsize(a), None))
    h[(I, "st_shared_v4")] = _mem(("ss", s2, c16, None))
    h[(I, "ld_shared_v4")] = _mem(("sl", s2, c16, None))
    h[(I, "lds")] = _mem(("sl", s2, lambda a, *_: _itemsize(a), None))
    h[(I, "rows_head_major")] = _rows_head_major
    P = "numba_attn.gpu.ptx_loads"
    h[(P, "ldg4")] = _mem(("gl", g3, lambda a, *_: 4 * _itemsize(a), None))
    h[(P, "ldg_f16x8")] = _mem(("gl", g3, lambda a, *_: 8 * _itemsize(a), None))
    h[(P, "lds4")] = _mem(("sl", s2, lambda a, *_: 4 * _itemsize(a), None))
    h[(P, "sts4")] = _mem(("ss", s2, lambda a, *_: 4 * _itemsize(a), None))
    W = "numba_attn.gpu.warp"
    for name in ("shfl_sync", "shfl_xor_sync", "shfl_down_sync", "shfl_up_sync"):
        h[(W, name)] = _op("shfl")
    for name in ("warp_max", "warp_sum"):
        h[(W, name)] = _op("shfl", lambda *a: 5)
    for name in ("quad_max", "quad_sum"):
        h[(W, name)] = _op("shfl", lambda *a: 2)
    for name in ("group_sum", "group_max"):
        h[(W, name)] = _op("shfl", lambda x, width: _log2(width))
    for name in ("strided_sum", "strided_max"):
        h[(W, name)] = _op("shfl", lambda x, width: _log2(WARP // int(width)) if int(width) < WARP else 0)
    h[(W, "syncwarp")] = _op("syncwarp")
    h[("numba_attn.gpu.wgmma", "wgmma_reference")] = _wgmma_reference
    for name in ("tma_load_2d", "tma_load_3d"):
        h[("numba_attn.gpu.tma", name)] = _tma
    return h


def _dispatch(key, args, kwargs):
    sess = _active
    orig, handler = sess.hooks[key]
    st = _state()
    if st is None or st.suppress:
        return orig(*args, **kwargs)
    return handler(orig, args, kwargs, st, sys._getframe(2))


def _hook_code(key: str, name: str):
    src = f"def {name}(*args, **kwargs):\n    return {HOOK_NAME}({key!r}, args, kwargs)\n"
    ns = {}
    exec(compile(src, f"<simcount {key}>", "exec"), ns)
    return ns[name].__code__


@functools.lru_cache(maxsize=None)
def _trampoline(filename: str, line: int):
    """A function whose frame has ``filename`` and ``line``: the simulator identifies a static shared array
    by its caller's source line, and this wrapper must not become that caller."""
    def call(prev, alloc, shape, dtype, alignment):
        return prev(alloc, shape, dtype, alignment)

    code = call.__code__.replace(co_filename=filename, co_firstlineno=max(int(line) - 1, 1))
    return types.FunctionType(code, call.__globals__, "shared_array")


def install(sess, undo: list, codes: list) -> None:
    """Put the counting hooks of ``sess`` in the simulator's way; what to put back is appended to ``undo``
    ((object, attribute, previous value)) and ``codes`` ((function, previous ``__code__``)) as it goes."""
    from numba.cuda.simulator import kernel as simk
    from numba.cuda.simulator import kernelapi as sima

    G, F = _global_class()
    sess.global_cls = (G, F)
    undo.append((simk, "FakeWithinKernelCUDAArray", simk.FakeWithinKernelCUDAArray))
    simk.FakeWithinKernelCUDAArray = G

    prev_array = sima.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            res = prev_array(self, shape, dtype, alignment)
        else:
            f = sys._getframe(1)
            res = _trampoline(f.f_code.co_filename, f.f_lineno)(prev_array, self, shape, dtype, alignment)
        return res.view(_SharedArray) if isinstance(res, np.ndarray) else res

    undo.append((sima.FakeCUDAShared, "array", prev_array))
    sima.FakeCUDAShared.array = array

    def barrier(prev):
        def sync(self, *args):
            st = _state()
            if st is not None:
                st.syncs += 1
                st.epoch += 1
                st.k = {}
            return prev(self, *args)
        return sync

    for name in ("syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or"):
        prev = getattr(sima.FakeCUDAModule, name)
        undo.append((sima.FakeCUDAModule, name, prev))
        setattr(sima.FakeCUDAModule, name, barrier(prev))

    def atomic(prev):
        def op(self, array, *args):
            st = _state()
            if st is None:
                return prev(self, array, *args)
            st.direct["sim_smem_atomics" if isinstance(array, np.ndarray) else "sim_gmem_atomics"] += 1
            st.suppress += 1
            try:
                return prev(self, array, *args)
            finally:
                st.suppress -= 1
        return op

    for name, prev in list(vars(sima.FakeCUDAAtomic).items()):
        if callable(prev) and not name.startswith("_"):
            undo.append((sima.FakeCUDAAtomic, name, prev))
            setattr(sima.FakeCUDAAtomic, name, atomic(prev))

    prev_run = simk.BlockManager.run

    def run(self, grid_point, *args):
        try:
            return prev_run(self, grid_point, *args)
        finally:
            sess.block_done(self)

    undo.append((simk.BlockManager, "run", prev_run))
    simk.BlockManager.run = run

    prev_call = simk.FakeCUDAKernel.__call__

    def call(self, *args):
        if not self._device and not simk._kernel_context:
            sess.totals["sim_launches"] += 1
        return prev_call(self, *args)

    undo.append((simk.FakeCUDAKernel, "__call__", prev_call))
    simk.FakeCUDAKernel.__call__ = call

    for (modname, name), handler in _handlers().items():
        mod = sys.modules.get(modname) or importlib.import_module(modname)
        fn = getattr(mod, name, None)
        if fn is None or not hasattr(fn, "__code__") or fn.__closure__ or fn in {c[0] for c in codes}:
            continue
        key = f"{modname}:{name}"
        orig = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, None)
        orig.__kwdefaults__ = fn.__kwdefaults__
        sess.hooks[key] = (orig, handler)
        codes.append((fn, fn.__code__))
        fn.__globals__[HOOK_NAME] = _dispatch
        fn.__code__ = _hook_code(key, name)


def uninstall(undo: list, codes: list) -> None:
    """Take out what :func:`install` put in."""
    for fn, code in codes:
        fn.__code__ = code
        fn.__globals__.pop(HOOK_NAME, None)
    for obj, name, prev in reversed(undo):
        setattr(obj, name, prev)
