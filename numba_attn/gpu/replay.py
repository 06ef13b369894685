"""Launch replay: a phase's launches recorded once, replayed at each call's addresses.

A numba launch ``kernel[grid, block, stream](*args)`` costs tens of microseconds of Python before
the driver sees it: the launch configuration is built (and checked for a small grid), every
argument is typed, the compiled overload is looked up, every array is flattened into the
kernel's parameters (meminfo, parent, size, itemsize, data pointer, shape, strides). For one
problem, a phase's :class:`~numba_attn.phases.registry.Launch` always makes the same launches with
the same parameters, except the data pointers of q, k, v and o. So ``attention()`` records the
launches of a plan's first call (:func:`recording`: what numba hands to ``cuda.core.launch``) and
later calls replay them (:class:`Replay`): the recorded parameters with the new addresses
substituted, straight to ``cuda.core.launch``, on the recorded stream.

A recording is refused (the plan keeps numba's launch path) when the Launch did anything else
on the device while recording: allocated memory (a buffer made per call would be freed after
it), copied or set memory (a memset per call would not be replayed), or when two of the four
arrays overlap (a parameter would not say which array it points into). The scratch buffers of a
Launch are allocated when it is built, so their pointers stay valid for the plan's lifetime.
Work done under :func:`setup` is not a reason: it is made once per address and found again by
the Launch's ``derived`` function at each replay (the K/V tensor maps of the TMA phases, which
hold K's and V's addresses: ``derived(addresses)`` returns their device pointers for the call's
addresses, and the replay substitutes them as it substitutes the arrays').

Recording patches module attributes of numba-cuda and cuda.core for the duration of one call: it
is not thread-safe (``attention()`` records only on a plan's first call). The simulator has no
``cuda.core`` launch: it never records.
"""
from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, field


@dataclass
class Recording:
    """What one call of a Launch did: its launches ``(stream, config, kernel, args)`` and the
    reasons it cannot be replayed (empty when it can)."""

    launches: list = field(default_factory=list)
    refusals: list = field(default_factory=list)


_SETUP = [0]  # > 0: inside setup(): device work that a recording does not count


@contextlib.contextmanager
def setup():
    """Device work (allocations, copies) that is made once and cached by its caller, not per call: a
    recording around it is not refused for it."""
    _SETUP[0] += 1
    try:
        yield
    finally:
        _SETUP[0] -= 1


def refusal(rec, name, fn):
    """``fn`` noting ``name`` among ``rec``'s reasons not to replay whenever it is called outside :func:`setup`."""
    def wrapper(*a, **kw):
        if not _SETUP[0]:
            rec.refusals.append(name)
        return fn(*a, **kw)

    return wrapper


@contextlib.contextmanager
def recording():
    """Record every kernel launch made through numba (and :mod:`numba_attn.gpu.pdl`) while the
    block runs; the launches still run. Device allocations, copies and memsets are noted as
    reasons not to replay."""
    import cuda.core as core
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda.cudadrv import driver

    rec = Recording()
    launch = dispatcher.launch

    def spy(stream, config, kernel, *args):
        rec.launches.append((stream, config, kernel, args))
        return launch(stream, config, kernel, *args)

    def refusing(name, fn):
        return refusal(rec, name, fn)

    saved = [(dispatcher, "launch", dispatcher.launch), (core, "launch", core.launch)]
    for name in ("host_to_device", "device_to_device", "device_to_host", "device_memset"):
        saved.append((driver, name, getattr(driver, name)))
    saved.append((driver.Context, "memalloc", driver.Context.memalloc))
    try:
        dispatcher.launch = spy
        core.launch = spy
        for name in ("host_to_device", "device_to_device", "device_to_host", "device_memset"):
            setattr(driver, name, refusing(name, getattr(driver, name)))
        driver.Context.memalloc = refusing("memalloc", driver.Context.memalloc)
        yield rec
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


class Replay:
    """The launches of a :class:`Recording`, replayable at new addresses of the four arrays.

    ``Replay.make(rec, addresses, sizes, derived=None)`` finds, in every recorded launch, the parameters
    that point into one of the arrays (``addresses[i] <= p < addresses[i] + sizes[i]``) and keeps
    their array and offset, and those equal to one of ``derived(addresses)`` (pointers made from the
    addresses, e.g. tensor maps); it returns None (replay refused) when the recording says so, the
    arrays overlap, or a derived pointer is in no launch. ``replay(addresses)`` launches again with
    those parameters moved to the new addresses and to ``derived`` of them."""

    def __init__(self, launches, slots, derived=None, context=None):
        self._context = context  # the CUcontext the launches were recorded in (None: unknown, as off a GPU)
        self._launches = launches  # [(stream, config, kernel, list of parameters)]
        self._slots = slots  # per launch: [(parameter index, value index, byte offset)]
        self._derived = derived  # addresses -> more values (indexes 4, 5, ... of the slots)
        self._packed = None  # per launch: a DriverLaunch, made at the first replay (None: not yet; False: none)
        import cuda.core as core

        self._launch = core.launch

    @classmethod
    def make(cls, rec: Recording, addresses, sizes, derived=None):
        if rec.refusals or not rec.launches:
            return None
        spans = sorted(zip(addresses, sizes))
        if any(a + n > b for (a, n), (b, _) in zip(spans, spans[1:])):
            return None  # two arrays overlap (k is v, say): a pointer would not name one array
        extra = tuple(derived(tuple(addresses))) if derived is not None else ()
        if len(set(extra)) != len(extra) or any(a <= x < a + n for x in extra for a, n in spans):
            return None  # a derived pointer would not name one value
        found = set()
        launches, slots = [], []
        for stream, config, kernel, args in rec.launches:
            mine = []
            for p, value in enumerate(args):
                if type(value) is int and value:
                    for i, (a, n) in enumerate(zip(addresses, sizes)):
                        if a <= value < a + n:
                            mine.append((p, i, value - a))
                            break
                    else:
                        if value in extra:
                            j = extra.index(value)
                            mine.append((p, len(addresses) + j, 0))
                            found.add(j)
            launches.append((stream, config, kernel, list(args)))
            slots.append(mine)
        if len(found) != len(extra):
            return None  # a derived pointer the launches do not take: the recording is not understood
        return cls(launches, slots, derived if extra else None, _current_context())

    def __call__(self, addresses) -> None:
        context = self._context
        if context and _current_context() != context:
            # another thread than the recording's, with no context or another one current (autograd runs a
            # backward on a thread of its own): the recorded kernels belong to the recorded context
            from cuda.bindings import driver

            driver.cuCtxPushCurrent(driver.CUcontext(context))
            try:
                self._replay(addresses)
            finally:
                driver.cuCtxPopCurrent()
            return
        self._replay(addresses)

    def _replay(self, addresses) -> None:
        if self._derived is not None:
            addresses = tuple(addresses) + tuple(self._derived(addresses))
        packed = self._packed
        if packed:  # the driver's launch on parameters packed once: only the moved pointers are written
            for launch, mine in zip(packed, self._slots):
                values = launch.values
                for p, i, offset in mine:
                    values[p].value = addresses[i] + offset
                launch()
            return
        launch = self._launch
        for (stream, config, kernel, args), mine in zip(self._launches, self._slots):
            for p, i, offset in mine:
                args[p] = addresses[i] + offset
            launch(stream, config, kernel, *args)
        if packed is None:  # packed after one replay through cuda.core (the reference way) has run
            self._packed = DriverLaunch.pack_all(self._launches)

    @property
    def launches(self) -> int:
        return len(self._launches)


def _current_context():
    """The address of the CUcontext current on this thread (0: none), or None where there is no CUDA driver."""
    try:
        from cuda.bindings import driver

        err, context = driver.cuCtxGetCurrent()
    except Exception:  # no driver (the simulator, a CPU-only machine)
        return None
    return int(context) if err == driver.CUresult.CUDA_SUCCESS else None


def _stream_handle(stream) -> int:
    """The CUstream address of a recorded launch's stream (a cuda.core Stream, a numba stream or 0)."""
    if stream is None or type(stream) is int:
        return int(stream or 0)
    handle = getattr(stream, "handle", None)
    if handle is not None:
        return int(handle.value if isinstance(handle, ctypes.c_void_p) else handle or 0)
    return int(stream.__cuda_stream__()[1])


class DriverLaunch:
    """One recorded launch as ``cuLaunchKernel`` takes it: each parameter a ctypes value (a Python int as
    ``intptr_t`` and a bool as ``bool``, as ``cuda.core.launch`` passes them; ctypes scalars as they are), their
    addresses in one ``void*`` array, all made once. ``cuda.core.launch`` builds its parameter array at every call
    (~10 µs of a replayed call's host time); here a replay writes the moved pointers into ``values`` and calls the
    driver. :meth:`pack_all` returns False (replays keep ``cuda.core.launch``) for a launch it cannot pack: a
    cluster, a cooperative or programmatic launch, a parameter of another type, or no ``cuda.bindings``."""

    def __init__(self, stream, config, kernel, args):
        from cuda.bindings import driver

        values = []
        for a in args:
            if type(a) is bool:
                values.append(ctypes.c_bool(a))
            elif type(a) is int:
                values.append(ctypes.c_int64(a))
            elif isinstance(a, ctypes._SimpleCData):
                values.append(type(a)(a.value))
            else:
                raise TypeError(f"parameter of type {type(a).__name__}")
        if getattr(config, "cluster", None) or getattr(config, "is_cooperative", False) or getattr(
                config, "cooperative_launch", False) or getattr(config, "programmatic_stream_serialization", False):
            raise TypeError("a cluster, cooperative or programmatic launch")
        self.values = values
        self._array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        dims = [tuple(d) if isinstance(d, tuple) else (int(d),) for d in (config.grid, config.block)]
        self._dims = tuple(int(x) for d in dims for x in (d + (1, 1, 1))[:3])
        self._shmem = int(config.shmem_size or 0)
        self._function = driver.CUfunction(int(kernel.handle))
        self._stream = driver.CUstream(_stream_handle(stream))
        self._launch = driver.cuLaunchKernel
        self._ok = driver.CUresult.CUDA_SUCCESS

    def __call__(self) -> None:
        err, = self._launch(self._function, *self._dims, self._shmem, self._stream, ctypes.addressof(self._array), 0)
        if err != self._ok:
            raise RuntimeError(f"cuLaunchKernel failed: {err!r}")

    @classmethod
    def pack_all(cls, launches):
        try:
            return [cls(*launch[:3], launch[3]) for launch in launches]
        except (ImportError, TypeError, AttributeError, ValueError):
            return False
