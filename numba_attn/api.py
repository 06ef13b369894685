"""``attention()``: run one phase on arrays, the way a notebook or a test calls it.

Every input check happens before anything is compiled, allocated or launched,
and fails with :class:`~numba_attn.spec.errors.AttentionInputError` (a
``ValueError``) naming the argument and the allowed range:

* q, k, v must be 4-D arrays of one kind — NumPy arrays, numba device arrays, or PyTorch
  tensors (CUDA tensors, or CPU tensors handled like NumPy arrays) — and of one dtype among
  float32, float16, bfloat16; k and v of one shape; same batch and head_dim as q; q's heads a
  multiple of k/v's heads; mixing kinds (a tensor q, a NumPy k) is refused naming the argument,
  and tensors must be on one device (numba's current device for CUDA tensors);
* empty problems: ``q_len == 0`` (or batch/heads 0) returns an empty output
  without launching anything; ``kv_len == 0`` with queries is an error (the
  softmax over zero keys is undefined);
* ``causal`` needs ``q_len <= kv_len`` (bottom-right alignment); ``scale``
  must be a positive finite number;
* non-contiguous NumPy inputs (and CPU tensors) are **copied** to contiguous ones;
  non-contiguous device arrays and CUDA tensors are **refused** (copying them would hide a
  device-to-device copy in the call);
* ``causal`` and ``allow_tf32`` must be bools (``"False"`` is refused, not read as True);
* ``phase``: a name (or a registered ``Phase``); anything else is refused; an unknown
  name suggests close names; a phase that cannot run the problem (head_dim, dtype,
  causal, the device's compute capability) names the phases that can; unknown tunable
  parameters are refused with the list of the phase's parameters, and a value of the
  wrong type or range (``Br=-16``, ``Bc=0``, ``Br="abc"``) names the parameter and the
  allowed values;
* ``out`` (optional): of q's kind, shape, dtype and device, C-contiguous, writeable, sharing no
  memory with q, k or v; anything else is refused naming ``out``;
* ``stream`` (optional): None (PyTorch's current stream for CUDA tensors, else the default
  stream), a numba stream or a ``torch.cuda.Stream``; anything else is refused;
* inputs whose contiguous copies and output do not fit in the available host
  memory are refused before anything is copied;
* a problem whose inputs and output do not fit in the free device memory is
  refused up front; a tile configuration the device cannot launch (threads or
  shared memory per block) is reported as such, not as a crash.

Plans are cached (:func:`attention`): the checks above that depend on more than the arrays'
kind, shape, dtype and contiguity (the phase's choice and ``supports()``, the memory queries,
compiling, the phase's scratch buffers) run once per plan; every call still checks the kinds,
shapes, dtypes and contiguity (they are the cache's key) and ``out``, in O(1).

NaN/Inf inputs (``nonfinite``): by default (``"propagate"``) they are computed
like any value and the output has NaN where the float64 reference has NaN
(checked for every phase in the simulator tests, and on an H200 on 2026-11-22
with the kernels' fast-math flags); ``"raise"`` scans the inputs first and
refuses them, naming the array and the first bad element.
"""
from __future__ import annotations

import functools
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.spec.errors import AttentionInputError, check_arrays, check_bool, check_finite  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402
from numba_attn.phases.registry import _REGISTRY, get_phase, list_phases  # noqa: E402


def is_device_array(a) -> bool:
    """A numba device array (or, in the simulator, its stand-in)."""
    if hasattr(cuda, "is_cuda_array"):
        return cuda.is_cuda_array(a)
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return isinstance(a, FakeCUDAArray)


def problem_from_arrays(q, k, v, *, causal=False, scale=None) -> Problem:
    check_arrays(q, k, v)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    return Problem(batch=B, heads=H, q_len=Nq, kv_len=Nk, head_dim=D, causal=bool(causal),
                   dtype=np.dtype(q.dtype).name, scale=scale, kv_heads=Hkv)


# Never chosen by default: measured slower than its parent tc_wgmma on the H200
# (results/tensor-core-overlap-nvidia-h200.jsonl); run it by name.
NEVER_DEFAULT = ("tc_wgmma_overlap",)

# The fixed preference per (kind, dtype) when no committed results exist for this GPU model:
# the first one that supports the problem (device included) is chosen.
PREFERENCE = {
    ("prefill", "float16"): ("tc_wgmma", "tc_pipelined", "tc_mma"),
    ("prefill", "bfloat16"): ("tc_wgmma", "tc_pipelined", "tc_mma"),
    ("prefill", "float32"): ("register_blocked",),
    ("decode", "float16"): ("decode_split_k_lean",),
    ("decode", "float32"): ("decode_split_k_lean",),
}


def _preference(problem: Problem, kind: str, allow_tf32: bool) -> tuple:
    pref = PREFERENCE.get((kind, problem.dtype), ())
    if kind == "prefill" and problem.dtype == "float32":
        if problem.causal:
            pref = ("causal_skip",) + pref
        if allow_tf32:
            pref = ("tc_tf32",) + pref
    if kind == "decode" and problem.dtype == "float16" and problem.heads > problem.kv_heads:
        pref = ("decode_mma",) + pref
    return pref


def _precision_allowed(ph, allow_tf32: bool) -> bool:
    """A phase computing at a coarser precision than its inputs runs by default only with the caller's consent."""
    return ph.precision is None or (ph.precision == "tf32" and allow_tf32)


_DEVICE_NAMES: dict = {}


def device_name() -> str:
    """The GPU model the dispatch table and the tuning cache are keyed by ("simulator": no table
    entry): the current device's name, read once per device (no nvidia-smi: this runs whenever a
    call plans)."""
    if backend.IS_SIMULATOR:
        return "simulator"
    dev = cuda.get_current_device()
    name = _DEVICE_NAMES.get(dev.id)
    if name is None:
        name = _DEVICE_NAMES[dev.id] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return name


def measured_rows(gpu: str) -> list[tuple[str, dict]]:
    """``(file, row)`` for every OK, timed phase row of the committed results files
    (``results/*.jsonl`` of a source checkout) measured on ``gpu`` with the default parameters:
    what the dispatch table (:mod:`numba_attn.measure.dispatch`) is built from; ``phase=None`` reads
    the table, not these files."""
    from numba_attn.measure.dispatch import measured_rows as rows

    return [(f, r) for f, _env, r in rows(gpu=gpu) if not r.get("requested_params")]


def choose_phase(problem: Problem, kind: str | None = None, allow_tf32: bool = False):
    """``(phase, why, params)``: the phase ``attention(..., phase=None)`` runs, why, and the
    parameters it runs with when the caller gives none (``{}``: the phase's defaults). The rule:

    * only the package's own phases (``numba_attn.phases``; a user-registered phase runs only
      when named), never ``tc_wgmma_overlap`` (:data:`NEVER_DEFAULT`), never a phase the device
      cannot run (``supports()``, compute capability included), and never one that computes at a
      lower precision than the inputs (``tc_tf32``) unless ``allow_tf32=True``;
    * of the kind the problem needs: decode when q_len <= 8, else prefill;
    * the phase the tuning cache (``numba-attn tune``, :mod:`numba_attn.measure.tune`) chose for
      this GPU model and the problem's key (dtype, causal, head_dim, GQA group, decode or prefill,
      kv_len bucket), when it is among the candidates, with the cache's parameters
      (``explain()`` says "tuned (cache PATH)");
    * else the dispatch table (``numba_attn/data/dispatch.json``, built from the committed GPU
      results by ``numba-attn dispatch --build``; :mod:`numba_attn.measure.dispatch`) for this GPU
      model and the same key: the best-ranked measured configuration whose phase is among the
      candidates and supports the problem with its parameters, with those parameters
      (``explain()`` says "dispatch table (numba_attn/data/dispatch.json: ...)" and names the row);
    * otherwise the first supporting phase of the fixed preference per (kind, dtype): fp16/bf16
      prefill ``tc_wgmma`` (sm_90a only), ``tc_pipelined``, ``tc_mma``; fp32 prefill
      ``register_blocked`` (causal: ``causal_skip`` first; with allow_tf32 ``tc_tf32`` first);
      decode ``decode_split_k_lean`` (fp16 with GQA: ``decode_mma`` first); otherwise the most
      optimized supporting phase (roadmap order).

    The simulator matches no table entry (its GPU model is "simulator") and counts as compute
    capability 9.0.
    """
    if kind is None:
        kind = "decode" if problem.q_len <= 8 else "prefill"
    allowed = [p for p in list_phases() if p.is_builtin and p.name not in NEVER_DEFAULT
               and _precision_allowed(p, allow_tf32)]
    candidates = [p for p in allowed if p.kind == kind and p.supports(problem) is None]
    if not candidates:
        candidates = [p for p in allowed if p.supports(problem) is None]
    if not candidates:
        hint = ("; tf32 phases run only with allow_tf32=True"
                if problem.dtype == "float32" and not allow_tf32 else "")
        raise AttentionInputError(f"no phase of the package supports {problem.label}{hint} "
                                  f"(name a phase with phase=... to run another one)")
    gpu = device_name()
    hit = _tuned(problem, None, candidates, gpu)
    if hit:
        return hit[0], f"tuned (cache {hit[2]})", hit[1]
    from numba_attn.measure.dispatch import choose

    found = choose(problem, candidates, gpu)
    if found:
        return found[0], found[2], found[1]
    for name in _preference(problem, kind, allow_tf32):
        for p in candidates:
            if p.name == name:
                return p, (f"preferred for {kind} {problem.dtype}"
                           f"{' causal' if problem.causal else ''} (no configuration of the dispatch table "
                           f"for {gpu} runs this problem)"), {}
    return candidates[-1], "the most optimized phase that supports the problem (roadmap order)", {}


def _tuned(problem: Problem, phase, candidates=None, gpu=None):
    """``(phase, params, cache path)`` from the tuning cache (:mod:`numba_attn.measure.tune`) for
    ``problem`` on this GPU model: of ``phase``, or when None the key's best phase if it is among
    ``candidates``; None when no entry matches or its parameters no longer run the problem."""
    from numba_attn.measure.tune import cached_params

    try:
        hit = cached_params(problem, phase.name if phase is not None else None, gpu or device_name())
        if hit is None:
            return None
        name, params, path = hit
        ph = phase if phase is not None else next((p for p in candidates if p.name == name), None)
        if ph is None or ph.supports(problem, **ph.resolve_params(params)) is not None:
            return None
        return ph, params, path
    except (ValueError, TypeError, OSError):
        return None


def pick_phase(problem: Problem, kind: str | None = None, allow_tf32: bool = False):
    """The phase ``phase=None`` runs (see :func:`choose_phase`)."""
    return choose_phase(problem, kind, allow_tf32)[0]


def _phase_arg(phase):
    """``phase`` as a registered Phase: a name, or a Phase object registered under its name."""
    from numba_attn.phases.registry import Phase

    if isinstance(phase, str):
        return get_phase(phase)
    if isinstance(phase, Phase):
        try:
            registered = get_phase(phase.name)
        except KeyError:
            registered = None
        if registered is not phase:
            raise AttentionInputError(f"phase: the Phase object {phase.name!r} is not the registered phase of "
                                      f"that name; register it (register_phase / temporary_phases) and pass "
                                      f"its name")
        return phase
    raise AttentionInputError(f"phase must be a phase name (str, see numba_attn.list_phases()), a registered "
                              f"Phase or None (chosen for the problem); got {type(phase).__name__} {phase!r}")


def _contiguous(name, a):
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


def _empty_output(q, shape):
    if _kind(q) == TORCH:
        return sys.modules["torch"].empty(shape, dtype=q.dtype, device=q.device)
    if is_device_array(q):
        return cuda.device_array(shape, dtype=q.dtype)
    return np.empty(shape, dtype=q.dtype)


def _check_host_memory(problem: Problem, arrays) -> None:
    """Refuse before copying: non-contiguous NumPy inputs are copied, the output is copied back."""
    from numba_attn.measure import limits

    need = sum(int(a.size) * a.dtype.itemsize for a in arrays
               if not is_device_array(a) and not a.flags.c_contiguous)
    if not is_device_array(arrays[0]):
        need += int(np.prod(problem.out_shape())) * problem.itemsize
    free = limits.free_host_memory()
    if free is not None and need > free:
        raise AttentionInputError(f"{problem.label} needs {need / 2**30:.2f} GiB of host memory (contiguous copies "
                                  f"of non-contiguous inputs and the output); {free / 2**30:.2f} GiB available")


def _plan(q, k, v, causal, scale, phase, allow_tf32, params):
    """Everything checked before a launch: ``(problem, phase, resolved params, why)``; problem is
    None for an empty problem (nothing to launch)."""
    causal = check_bool("causal", causal)
    allow_tf32 = check_bool("allow_tf32", allow_tf32)
    ph = _phase_arg(phase) if phase is not None else None
    check_arrays(q, k, v)
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if B == 0 or H == 0 or Nq == 0:  # nothing to compute; still validate the scalar arguments
        if causal and Nq > Nk:
            problem_from_arrays(q, k, v, causal=causal, scale=scale)  # raises the causal error
        if scale is not None:
            Problem(q_len=1, kv_len=1, head_dim=max(D, 1), scale=scale)
        if ph is not None:
            ph.resolve_params(params)
        return None, ph, None, "empty problem: nothing to compute"
    problem = problem_from_arrays(q, k, v, causal=causal, scale=scale)
    chosen = {}
    if ph is None:
        ph, why, chosen = choose_phase(problem, allow_tf32=allow_tf32)
    else:
        why = "named by the caller"
    if not params:  # no parameters given: the tuning cache's, when it has an entry for this problem
        hit = _tuned(problem, ph)
        if hit:
            params.update(hit[1])  # the caller's (empty) keyword dict: attention() plans with it
            why += f"; parameters tuned (cache {hit[2]})"
        else:
            params.update(chosen)  # the dispatch table's parameters ({} otherwise)
    resolved = ph.resolve_params(params)  # AttentionInputError naming the parameter
    reason = ph.supports(problem, **resolved)
    if reason:
        supporting = [p.name for p in list_phases() if p.supports(problem) is None]
        raise AttentionInputError(f"phase {ph.name!r} cannot run {problem.label}: {reason}. "
                                  f"Phases that can: {', '.join(supporting) or 'none'}")
    return problem, ph, ph.resolve(problem, resolved), why


@dataclass
class Explanation:
    """What ``attention()`` would run: the phase, its parameters resolved for the problem, and why."""

    phase: object  # the Phase (None for an empty problem)
    params: dict
    why: str
    problem: Problem | None = None

    @property
    def name(self) -> str | None:
        return self.phase.name if self.phase is not None else None

    def __str__(self):
        label = self.problem.label if self.problem is not None else "empty problem"
        return f"{self.name} {self.params} on {label}: {self.why}"


# -- array kinds: NumPy arrays, numba device arrays, PyTorch tensors ---------------------------

NUMPY, DEVICE, TORCH, TORCH_CPU, OTHER = "a NumPy array", "a numba device array", "a CUDA tensor", "a CPU tensor", ""


def _kind(a) -> str:
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


def _one_kind(q, k, v, out) -> str:
    """The kind of q; k, v and ``out`` must be of the same kind (and tensors on q's device)."""
    kind = _kind(q)
    if out is not None and _kind(out) is OTHER and kind is not OTHER:
        raise AttentionInputError(f"out must be {kind} like q (or None); got {type(out).__name__}")
    named = (("k", k), ("v", v)) if out is None else (("k", k), ("v", v), ("out", out))
    for name, a in named:
        ka = _kind(a)
        if ka != kind and ka is not OTHER and kind is not OTHER:
            raise AttentionInputError(
                f"{name} is {ka} but q is {kind}: q, k, v{' and out' if out is not None else ''} must be of one "
                f"kind (all NumPy arrays, all numba device arrays, or all PyTorch tensors on one device)")
        if kind == TORCH and ka == TORCH and (a.get_device() != q.get_device() or a.is_cuda != q.is_cuda) \
                and a.device != q.device:  # (device objects compared only when the cheap test differs)
            raise AttentionInputError(f"{name} is on {a.device} but q is on {q.device}: the tensors must be on "
                                      f"one device")
    return kind


class _Described:
    """The shape and (NumPy) dtype of a tensor: what the checks written for arrays read."""

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = dtype


def _numpy_dtype_of(name, t):
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


def _described(name, t) -> _Described:
    return _Described(t.shape, _numpy_dtype_of(name, t))


def _tensor_as_numpy(name, t):
    """A CPU tensor as a NumPy array sharing its memory (no copy); bfloat16 through its 16-bit
    pattern, reinterpreted as ml_dtypes' bfloat16."""
    dtype = _numpy_dtype_of(name, t)
    t = t.detach()
    if dtype.name == "bfloat16":
        torch = sys.modules["torch"]
        return t.view(torch.int16).numpy().view(dtype)
    return t.numpy()


def _numpy_as_tensor(a):
    """The NumPy result as a CPU tensor sharing its memory (bfloat16 through its 16-bit pattern)."""
    torch = sys.modules["torch"]
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _arrays_for_checks(kind, q, k, v):
    """q, k, v as the checks read them: tensors described by shape and NumPy dtype."""
    if kind == TORCH:
        return tuple(_described(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    if kind == TORCH_CPU:
        return tuple(_tensor_as_numpy(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    return q, k, v


def _address(kind, a) -> int:
    """The device address of a tensor's or numba device array's first element."""
    if kind == TORCH:
        return a.data_ptr()
    try:
        return a.device_ctypes_pointer.value or 0
    except AttributeError:  # another CUDA array interface object
        return a.__cuda_array_interface__["data"][0]


def _check_out(out, kind, q, k, v):
    """``out`` must be of q's kind, shape, dtype (and device), C-contiguous, writeable and share no
    memory with q, k or v (the kernels read them while they write it). O(1)."""
    if tuple(out.shape) != tuple(q.shape):
        raise AttentionInputError(f"out has shape {tuple(out.shape)}; it must have q's shape {tuple(q.shape)}")
    if out.dtype != q.dtype:
        raise AttentionInputError(f"out has dtype {out.dtype}; it must have q's dtype {q.dtype}")
    if kind == TORCH:
        contiguous, overlap, strides = out.is_contiguous(), None, out.stride()
        lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        for name, a in (("q", q), ("k", k), ("v", v)):
            alo = a.data_ptr()
            if alo < hi and lo < alo + a.numel() * a.element_size():
                overlap = name
                break
    elif kind == DEVICE:
        contiguous, overlap, strides = out.is_c_contiguous(), None, out.strides
        if contiguous and not backend.IS_SIMULATOR:
            lo = _address(DEVICE, out)
            hi = lo + out.nbytes
            for name, a in (("q", q), ("k", k), ("v", v)):
                alo = _address(DEVICE, a)
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


# -- streams -------------------------------------------------------------------------------------

_STREAMS: dict = {}  # stream handle -> (numba stream, the stream kernels are launched on)


def _stream_of(kind, q, stream):
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


# -- the plan cache ------------------------------------------------------------------------------

#: replay a plan's recorded launches on later calls (:mod:`numba_attn.gpu.replay`); False: numba's
#: launch path on every call (``NUMBA_ATTN_REPLAY=0``)
REPLAY = os.environ.get("NUMBA_ATTN_REPLAY", "1") != "0"
MAX_PLANS = 128  # plans kept (least recently used dropped first)
MAX_PLAN_WORKSPACE = 2 << 30  # bytes of scratch (split-K partials, naive's S) the kept plans may hold

_PLANS: OrderedDict = OrderedDict()
_PLAN_STATS = {"hits": 0, "misses": 0, "workspace": 0}
_TUNING_PATHS: dict = {}


@dataclass(eq=False)
class _Plan:
    """What a call needs that does not depend on the data: the checked problem, the phase and its
    parameters, the Launch (compiled kernels, grid and block, scratch buffers), the kernels'
    (B·H, N, D) shapes and, on a GPU, the device arrays the kernels get, bound to each call's
    addresses without typing them again (:class:`~numba_attn.gpu.arrays.BoundArrays`): they do not
    own the memory, so a cached plan keeps no caller's array alive."""

    problem: Problem
    phase: object
    params: dict
    why: str
    launch: object
    token: tuple
    numba_stream: object
    launch_stream: object
    shapes: tuple  # (B·H, Nq, D), (B·Hkv, Nk, D), (B·Hkv, Nk, D), (B·H, Nq, D)
    bind: object = None  # on a GPU: gpu.arrays.BoundArrays of the four shapes; None: reshape (simulator)
    replay: object = None  # on a GPU: gpu.replay.Replay of the first call's launches (None: numba's launch)
    sizes: tuple = ()  # bytes of q, k, v, o


def _tuning_stamp():
    """The tuning cache file and its modification time: a plan made before a tuning is not reused."""
    env = (os.environ.get("NUMBA_ATTN_TUNING_CACHE"), os.environ.get("NUMBA_ATTN_RESULTS"),
           os.environ.get("XDG_DATA_HOME"))
    path = _TUNING_PATHS.get(env)
    if path is None:
        from numba_attn.measure.tune import default_cache_path

        path = _TUNING_PATHS[env] = default_cache_path()
    try:
        st = os.stat(path)
        return path, st.st_mtime_ns, st.st_size
    except OSError:
        return path, None, None


def _token():
    return len(_REGISTRY), _tuning_stamp()


def clear_plans() -> None:
    """Drop every cached plan (and the scratch buffers they hold). Plans are dropped by themselves
    when the tuning cache file or the number of registered phases changes; call this after changing
    a phase in place or anything else :func:`choose_phase` reads (e.g. ``device_cc``)."""
    _PLANS.clear()
    _PLAN_STATS.update(hits=0, misses=0, workspace=0)


def plan_cache_info() -> dict:
    """``{"hits", "misses", "plans", "workspace"}``: calls served from a cached plan, calls that
    planned, plans kept, bytes of scratch they hold."""
    return {"hits": _PLAN_STATS["hits"], "misses": _PLAN_STATS["misses"], "plans": len(_PLANS),
            "workspace": _PLAN_STATS["workspace"]}


def _contiguity(kind, a) -> bool:
    if kind == TORCH:
        return a.is_contiguous()
    if kind == NUMPY:
        return a.flags.c_contiguous
    return a.is_c_contiguous()


def _plan_key(kind, q, k, v, causal, scale, phase, allow_tf32, params, stream_key):
    """Everything the plan depends on, hashable; None when an argument cannot be a key (the call
    then plans without the cache and its checks say what is wrong)."""
    if kind is OTHER or kind is TORCH_CPU:
        return None
    try:
        arrays = tuple((tuple(a.shape), a.dtype, _contiguity(kind, a)) for a in (q, k, v))
        if kind == TORCH:
            arrays += (q.get_device(),)
        key = (kind, stream_key, arrays, type(causal), causal, type(scale), scale,
               phase if phase is None or isinstance(phase, str) else ("object", id(phase)),
               type(allow_tf32), allow_tf32,
               tuple(sorted((name, type(val), val) for name, val in params.items())))
        hash(key)
        return key
    except (TypeError, AttributeError, ValueError):
        return None


def _keep(key, plan) -> None:
    _PLANS[key] = plan
    _PLAN_STATS["workspace"] += plan.launch.workspace_bytes or 0
    while len(_PLANS) > 1 and (len(_PLANS) > MAX_PLANS or _PLAN_STATS["workspace"] > MAX_PLAN_WORKSPACE):
        _, old = _PLANS.popitem(last=False)
        _PLAN_STATS["workspace"] -= old.launch.workspace_bytes or 0


def _launch(plan, qd, kd, vd, od) -> None:
    """Run the plan's Launch; a launch the device refuses is an :class:`AttentionInputError`."""
    try:
        if backend.IS_SIMULATOR:
            from numba_attn.measure import limits

            with limits.simulated_device_limits():
                plan.launch(qd, kd, vd, od, plan.launch_stream)
        else:
            plan.launch(qd, kd, vd, od, plan.launch_stream)
    except Exception as exc:  # noqa: BLE001
        from numba_attn.measure import limits
        from numba_attn.measure.status import classify_exception

        status, why, _ = classify_exception(exc)
        if status == "SKIP" or isinstance(exc, limits.DeviceLimitError):
            raise AttentionInputError(f"phase {plan.phase.name!r} with {plan.params} cannot run "
                                      f"{plan.problem.label} on this device: {why}. Try smaller tiles or "
                                      f"another phase.") from exc
        raise


def _check_finite(kind, name, a) -> None:
    if kind == TORCH:
        a = _tensor_as_numpy(name, a.detach().cpu())
    check_finite(name, a)


# -- the public calls ----------------------------------------------------------------------------


def explain(q, k, v, *, causal=False, scale=None, phase=None, allow_tf32=False, nonfinite="propagate",
            **params) -> Explanation:
    """The phase ``attention(q, k, v, ...)`` with the same arguments would run, its resolved
    parameters (:meth:`Phase.resolve`) and why it was chosen; checks the same inputs (NumPy
    arrays, numba device arrays or tensors), launches nothing and uses no cached plan."""
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    kind = _one_kind(q, k, v, None)
    q, k, v = _arrays_for_checks(kind, q, k, v)
    problem, ph, resolved, why = _plan(q, k, v, causal, scale, phase, allow_tf32, params)
    if problem is not None and kind != TORCH:
        _check_host_memory(problem, (q, k, v))
    return Explanation(ph, dict(resolved or {}), why, problem)


def attention(q, k, v, *, causal=False, scale=None, phase=None, allow_tf32=False, nonfinite="propagate",
              out=None, stream=None, **params):
    """Softmax attention of q (B, H, Nq, D) over k, v (B, Hkv, Nk, D).

    ``phase`` names a registered phase (a registered ``Phase`` object is taken by its name);
    ``None`` chooses one by the documented rule of :func:`choose_phase` (see
    :func:`explain` for what it chose and why): never a phase computing below the input precision
    unless ``allow_tf32=True`` (as PyTorch's flag: float32 inputs may then run on tf32 tensor
    cores); a phase named explicitly runs at its own precision. Extra keyword arguments override
    its tunable parameters (positive integers for tile sizes, see the registry's rules). A forced
    ``splits`` is taken as given: splits beyond the key tiles get no keys and are combined
    correctly (checked in the simulator for every split-K phase), but they are still launched, so
    leave ``splits=0`` (planned from the keys and the SM count) unless measuring.

    Inputs and output, of one kind:

    * NumPy arrays → NumPy array (copied to the device and back);
    * numba device arrays → numba device array (no copy);
    * PyTorch CUDA tensors → a CUDA tensor on the same device (no copy: the kernels read the
      tensors' memory); PyTorch CPU tensors → a CPU tensor (like NumPy arrays: in the simulator
      that is the whole computation; float32/float16 are read without a copy, bfloat16 through
      ``ml_dtypes``). Mixing kinds (a tensor q with a NumPy k) is refused naming the argument.
      torch is never imported by numba-attn: a tensor is recognised by its type. CUDA tensors
      must be on numba's current device (checked when the call plans) and C-contiguous (call
      ``.contiguous()``). Forward only: no gradient flows back through the result.

    ``out``: a preallocated output of q's kind, shape, dtype (and device), C-contiguous and
    sharing no memory with q, k, v; written in place and returned. Without it every call allocates
    its output: ``torch.empty`` (PyTorch's caching allocator) for tensors, one
    ``cuda.device_array`` for numba arrays (numba's allocator may free earlier arrays, which
    synchronizes, then) — pass ``out=`` where that matters.

    ``stream``: CUDA tensors are computed on PyTorch's current stream
    (``torch.cuda.current_stream()``), other inputs on the default stream; ``stream=`` (a numba
    stream or a ``torch.cuda.Stream``) overrides either. The call does not synchronize (except for
    NumPy inputs, whose result is copied back, and ``nonfinite="raise"``, which reads the inputs).

    Plans are cached: the first call with a (kind, shapes, dtype, contiguity, causal, scale, phase,
    parameters, allow_tf32, device, stream) plans (checks, chooses, compiles, allocates the
    phase's scratch buffers, queries memory); later calls with the same arguments only check the
    output and launch (:func:`plan_cache_info`, :func:`clear_plans`). Input rules and errors: see
    the module docstring.
    """
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    kind = _one_kind(q, k, v, out)
    if kind == TORCH_CPU:  # the NumPy path on views of the tensors' memory
        res = attention(*_arrays_for_checks(kind, q, k, v), causal=causal, scale=scale, phase=phase,
                        allow_tf32=allow_tf32, nonfinite=nonfinite,
                        out=None if out is None else _tensor_as_numpy("out", out), stream=stream, **params)
        return out if out is not None else _numpy_as_tensor(res)
    if kind == TORCH and backend.IS_SIMULATOR:
        raise AttentionInputError(f"q is a tensor on {q.device} but numba-attn runs in the CUDA simulator "
                                  f"(NUMBA_ATTN_BACKEND=simulator): pass CPU tensors")
    stream_key, numba_stream, launch_stream = _stream_of(kind, q, stream)
    key = _plan_key(kind, q, k, v, causal, scale, phase, allow_tf32, params, stream_key)
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None and (plan.token != _token()
                             or plan.phase is not _REGISTRY.get(plan.phase.name)):
        plan = None
    if plan is None:
        return _plan_and_launch(kind, key, q, k, v, causal, scale, phase, allow_tf32, nonfinite, out,
                                numba_stream, launch_stream, params)
    _PLANS.move_to_end(key)
    _PLAN_STATS["hits"] += 1
    if out is not None:
        _check_out(out, kind, q, k, v)
    if nonfinite == "raise":
        for name, a in (("q", q), ("k", k), ("v", v)):
            _check_finite(kind, name, a)
    if plan.replay is not None:  # the first call's launches at this call's addresses
        if kind == TORCH:
            o = out if out is not None else sys.modules["torch"].empty(q.shape, dtype=q.dtype, device=q.device)
            plan.replay((q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()))
        else:
            o = out if out is not None else cuda.device_array(q.shape, dtype=q.dtype)
            plan.replay(tuple(_address(DEVICE, a) for a in (q, k, v, o)))
        return o
    return _run(plan, kind, q, k, v, out)


def _run(plan, kind, q, k, v, out, seen=None):
    """Launch a checked plan on this call's arrays; the output (``out`` when given). ``seen``: a
    list that receives the four device addresses launched on (tensors and device arrays)."""
    s_q, s_kv, _, _ = plan.shapes
    if kind == TORCH:
        o = out if out is not None else sys.modules["torch"].empty(q.shape, dtype=q.dtype, device=q.device)
        b = plan.bind
        addresses = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
        if seen is not None:
            seen.extend(addresses)
        _launch(plan, *(b(i, a) for i, a in enumerate(addresses)))
        return o
    if kind == DEVICE:
        o = out if out is not None else cuda.device_array(q.shape, dtype=q.dtype)
        b = plan.bind
        if b is None:  # the simulator
            _launch(plan, q.reshape(s_q), k.reshape(s_kv), v.reshape(s_kv), o.reshape(s_q))
        else:
            addresses = tuple(_address(DEVICE, a) for a in (q, k, v, o))
            if seen is not None:
                seen.extend(addresses)
            _launch(plan, *(b(i, a) for i, a in enumerate(addresses)))
        return o
    # NumPy: copied to the device (contiguous copies of non-contiguous inputs), computed, copied back
    from numba_attn.measure.check import to_device

    s = plan.numba_stream
    qd, kd, vd = (to_device(np.ascontiguousarray(a), stream=s) for a in (q, k, v))
    od = cuda.device_array(qd.shape, dtype=qd.dtype)
    b = plan.bind
    if b is None:
        _launch(plan, qd.reshape(s_q), kd.reshape(s_kv), vd.reshape(s_kv), od.reshape(s_q))
    else:  # views that do not own the copies, so the plan keeps none of them alive
        _launch(plan, *(b(i, _address(DEVICE, a)) for i, a in enumerate((qd, kd, vd, od))))
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    od.copy_to_host(out.view(od.dtype), stream=s)
    if s:
        s.synchronize()
    return out


class SlowSimulationWarning(UserWarning):
    """``attention()`` in the CUDA simulator on a problem estimated to take over a minute (it still runs:
    ``warnings.simplefilter("error", SlowSimulationWarning)`` makes it an error instead)."""


def _warn_if_slow(ph, problem):
    """One line naming the phase, the shape, the estimate and a shape that fits, when a simulator call is
    estimated over the limit (:mod:`numba_attn.measure.simcost`); the call then goes on. A library call
    warns rather than refuses: the same code runs unchanged on a GPU, where it is fast."""
    from numba_attn.measure import simcost

    if simcost.allow_slow_env() or simcost.estimate_s(ph, problem, 1) <= simcost.limit_s():
        return
    import warnings

    line = simcost.describe(ph, problem, 1, cli=False)[1].replace(", or pass allow_slow=True", "")
    line = line.replace("allow_slow=True", "").replace(" (NUMBA_ATTN_ALLOW_SLOW=1)", "")
    warnings.warn(f"attention(): {line.rstrip('; ')}; running it anyway ({simcost.ENV_ALLOW}=1 silences this)",
                  SlowSimulationWarning, stacklevel=4)


def _plan_and_launch(kind, key, q, k, v, causal, scale, phase, allow_tf32, nonfinite, out, numba_stream,
                     launch_stream, params):
    """A call without a cached plan: every check, the phase's choice and plan, the first launch;
    the plan is kept when the launch succeeds."""
    token = _token()
    checked = _arrays_for_checks(kind, q, k, v)
    problem, ph, resolved, why = _plan(*checked, causal, scale, phase, allow_tf32, params)
    if out is not None:
        _check_out(out, kind, q, k, v)
    if problem is None:
        return out if out is not None else _empty_output(q, tuple(q.shape))
    if kind == TORCH and not q.is_cuda:
        raise AttentionInputError(f"q is a tensor on {q.device}: numba-attn computes on CUDA tensors (or CPU "
                                  f"tensors, copied like NumPy arrays)")
    if nonfinite == "raise":
        for name, a in (("q", q), ("k", k), ("v", v)):
            _check_finite(kind, name, a)
    if backend.IS_SIMULATOR:
        _warn_if_slow(ph, problem)
    B, H, Nq, D = problem.batch, problem.heads, problem.q_len, problem.head_dim
    Hkv, Nk = problem.kv_heads, problem.kv_len
    shapes = ((B * H, Nq, D), (B * Hkv, Nk, D), (B * Hkv, Nk, D), (B * H, Nq, D))
    if kind == TORCH:
        for name, a in (("q", q), ("k", k), ("v", v)):
            if not a.is_contiguous():
                raise AttentionInputError(
                    f"{name} is a non-contiguous tensor (strides {tuple(a.stride())}); pass {name}.contiguous() "
                    f"(tensors are not copied implicitly)")
        device = q.get_device()
        current = cuda.get_current_device().id
        if device != current:
            raise AttentionInputError(f"q is on cuda:{device} but numba's current device is {current}: call "
                                      f"numba.cuda.select_device({device}) first (or move the tensors)")
    else:
        _check_host_memory(problem, (q, k, v))
        if kind == DEVICE:
            for name, a in (("q", q), ("k", k), ("v", v)):
                _contiguous(name, a)  # refuses a non-contiguous device array
    on_device = kind in (DEVICE, TORCH)
    from numba_attn.measure import limits

    free = limits.free_device_memory()
    need = problem.min_bytes() if not on_device else (0 if out is not None else
                                                       int(np.prod(problem.out_shape())) * problem.itemsize)
    if free is not None and need > free:
        raise AttentionInputError(f"{problem.label} needs {need / 2**30:.2f} GiB of device memory for its "
                                  f"inputs and output; {free / 2**30:.2f} GiB free")
    try:
        with limits.simulated_device_limits():
            launch = ph.plan(problem, **params)  # the caller's parameters, or the tuning cache's (_plan)
    except Exception as exc:  # noqa: BLE001
        from numba_attn.measure.status import classify_exception

        status, reason, _ = classify_exception(exc)
        if status == "SKIP" or isinstance(exc, limits.DeviceLimitError):
            raise AttentionInputError(f"phase {ph.name!r} with {resolved} cannot run {problem.label} on this "
                                      f"device: {reason}. Try smaller tiles or another phase.") from exc
        raise
    bind = None
    if not backend.IS_SIMULATOR:
        kernel_dtype = np.dtype(np.uint16) if problem.dtype == "bfloat16" else np.dtype(problem.dtype)
        from numba_attn.gpu.arrays import BoundArrays

        bind = BoundArrays(shapes, kernel_dtype)
    sizes = tuple(int(np.prod(s)) * problem.itemsize for s in shapes)
    plan = _Plan(problem=problem, phase=ph, params=resolved, why=why, launch=launch, token=token,
                 numba_stream=numba_stream, launch_stream=launch_stream, shapes=shapes, bind=bind, sizes=sizes)
    _PLAN_STATS["misses"] += 1
    replayable = getattr(launch, "replayable", True)  # False: e.g. TMA tensor maps hold K/V's addresses
    if bind is not None and kind in (TORCH, DEVICE) and key is not None and REPLAY and replayable:
        from numba_attn.gpu.replay import Replay, recording

        seen = []
        with recording() as rec:
            result = _run(plan, kind, q, k, v, out, seen)
        plan.replay = Replay.make(rec, seen, sizes) if len(seen) == 4 else None
    else:
        result = _run(plan, kind, q, k, v, out)
    if key is not None:
        _keep(key, plan)
    return result


# -- decode over a paged KV cache ---------------------------------------------------------

_PAGED_PLANS: OrderedDict = OrderedDict()
PAGED_DEFAULT = ("paged_mma", "paged_split_k")  # phase=None: the first that supports the problem ...
PAGED_DEFAULT_ONE_ROW = ("paged_split_k", "paged_mma")  # ... or these when a KV head has one query row
PAGED_DEFAULT_RAGGED = ("paged_worklist", "paged_split_k", "paged_mma")  # ... and its lengths differ (16-bit cache)


def _layout_plan(names, layout: str, refusal: str, defaults, problem, params: dict, plans):
    """(phase, Launch) of the first of ``names`` (phases of ``layout``) that supports ``problem``, from the
    bounded plan cache ``plans`` (16 plans); a phase of another layout or none that runs the problem is
    refused with the reasons."""
    reasons = []
    for name in names:
        ph = get_phase(name)
        if ph.layout != layout:
            raise AttentionInputError(f"phase {name!r} {refusal} (use {' or '.join(defaults)})")
        reason = ph.supports(problem, **ph.resolve_params(params))
        if reason is None:
            break
        reasons.append(f"{name}: {reason}")
    else:
        raise AttentionInputError(f"no {layout} phase runs {problem.label}: " + "; ".join(reasons))
    key = (ph.name, problem, tuple(sorted(params.items())))
    launch = plans.get(key)
    if launch is None:
        launch = plans[key] = ph.plan(problem, **params)
        while len(plans) > 16:
            plans.popitem(last=False)
    return ph, launch


def paged_default(problem) -> tuple:
    """The paged phases ``decode_paged(phase=None)`` tries, in order: the tensor-core one first when a
    KV head serves several query rows (GQA group x q_len > 1: its m16 tile is then partly filled);
    the split-K one first for one row per KV head (the m16 tile would be 15/16 padding; H200, fp16,
    B1 H32 KV 4k ragged P64: 0.0198 ms against 0.0295 ms, results/paged-nvidia-h200.jsonl), and for an
    8-bit cache its ``mma`` path can read (up to 8 rows per KV head: H200, fp8, B8 H32/8kv KV 32k D128 P64,
    0.1493 ms against paged_mma's 0.3242 ms, results/paged-8bit-mma-nvidia-h200.jsonl). With one row per KV head,
    a 16-bit cache and unequal lengths (``mean_len`` set), the work-list phase comes first: it reads a ragged
    batch 3-6 % faster than the split-K one (H200, CUPTI, B8 H32 D128 P64 fp16: KV <= 4k 0.0690 against 0.0733 ms,
    KV <= 32k 0.4687 against 0.4951, B32 KV <= 4k 0.2967 against 0.3069; the H100 alike,
    results/paged-nvidia-h200.jsonl and results/paged-nvidia-h100.jsonl), and 1.5 % slower at equal lengths,
    where the split-K one stays first."""
    from numba_attn.phases.decode.p35_paged_split_k import mma_path

    if mma_path(problem, None):
        return PAGED_DEFAULT_ONE_ROW
    if (problem.heads // problem.kv_heads) * problem.q_len > 1:
        return PAGED_DEFAULT
    return PAGED_DEFAULT_RAGGED if problem.mean_len and not problem.kv_dtype else PAGED_DEFAULT_ONE_ROW


PAGED_MEAN_STEPS = 16  # a ragged batch's mean length is rounded up to 1/16 of its bucket for the split plan


def paged_mean_bucket(seqlens, bucket: int) -> int:
    """``PagedProblem.mean_len`` of a call: 0 when every sequence has one length (the one-wave
    split plan), else the mean length rounded up to a multiple of ``bucket / PAGED_MEAN_STEPS``
    (the plan is cached per rounded mean: lengths that grow by one per decode step change it
    every ``bucket / 16`` steps; the split count it gives is a power of two, so few kernels compile).
    ``seqlens`` is the host copy the input checks read."""
    if seqlens.size == 0 or seqlens.min() == seqlens.max():
        return 0
    step = max(1, bucket // PAGED_MEAN_STEPS)
    return min(bucket, -(-int(seqlens.sum()) // (seqlens.size * step)) * step)


def _paged_host(a):
    """A block table, lengths or scale as a host NumPy array (or scalar) for the checks."""
    if a is None or isinstance(a, (int, float, np.floating, np.integer)):
        return a
    k = _kind(a)
    if k == TORCH:
        return a.detach().cpu().numpy()
    if k == TORCH_CPU:
        return a.detach().numpy()
    if k == DEVICE:
        return a.copy_to_host()
    return np.asarray(a)


def _paged_dtype(name, a) -> str:
    text = str(a.dtype).removeprefix("torch.")
    return {"float8_e4m3fn": "float8_e4m3"}.get(text, text)


def _paged_device(kind, a):
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
    a = _tensor_as_numpy("array", a) if kind == TORCH_CPU and "float8" not in str(a.dtype) else a
    if kind == TORCH_CPU and "float8" in str(a.dtype):
        a = a.detach().view(sys.modules["torch"].uint8).numpy()
    a = np.ascontiguousarray(a)
    if a.dtype.name in ("float8_e4m3fn", "bfloat16"):
        a = a.view(np.uint8 if a.dtype.itemsize == 1 else np.uint16)
    return cuda.to_device(a)


def decode_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None, k_scale=None,
                 v_scale=None, phase=None, **params):
    """Decode attention over a paged KV cache, FlashAttention's ``flash_attn_with_kvcache`` layout:
    ``q`` (B, q_len, H, D) float16 or bfloat16; ``k_cache``, ``v_cache`` (num_blocks, page_size, Hkv, D) in q's
    dtype, ``float8_e4m3fn`` (ml_dtypes / torch) or ``int8``; ``block_table`` (B, max_blocks) int32;
    ``cache_seqlens`` (B,) int32. Returns (B, q_len, H, D) like ``q`` (NumPy arrays, numba device
    arrays or PyTorch tensors, as ``attention()``). (``attention()`` takes (B, H, N, D); this function
    takes flash-attn's order, the heads after the query positions. The kernels read one row per
    (sequence, head): a q with q_len > 1 and H > 1 is transposed to (B, H, q_len, D) on the device and
    the output back, one copy each; with q_len 1 or one head the two orders are the same memory.)

    8-bit caches need ``k_scale`` and ``v_scale``: a scalar or (Hkv,) per head (fp8, int8), or
    (num_blocks, page_size, Hkv) per token (int8), finite and > 0; the value is ``code · scale``. With ``causal`` the
    queries are the last q_len positions of each sequence. A sequence of length 0 gives zeros. The
    input checks (page indices, lengths against the table, page size 16..256, scales, dtypes, shapes)
    run before anything is launched; ``spec/paged.py`` states the layout and holds the reference.
    The split-K plan is made for the power-of-two bucket of the longest sequence and, when the lengths
    differ, for their mean rounded up to 1/16 of that bucket (``paged_mean_bucket``: the splits are
    sized from the batch's total keys, so that a long sequence gets proportionally more blocks); it is
    cached per (bucket, rounded mean): calls that fall in one reuse it, and another plan reuses the
    compiled kernels except for a new power-of-two split count. The lengths the plan reads are the
    host copy that the input checks make (device lengths are copied to the host for the checks on
    every call; the plan adds no transfer).
    ``phase``: ``paged_mma``, ``paged_split_k`` or ``paged_worklist`` (None: the first of them that supports the
    problem, in the order of :func:`paged_default`: the work list for a ragged batch of one query row per KV head
    on a 16-bit cache; it plans each call's list on the host from the lengths the checks copied).
    """
    from numba_attn.phases.decode.common import paged_scales
    from numba_attn.spec.paged import check_paged
    from numba_attn.spec.problem import PagedProblem

    kind = _kind(q)
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
        if _kind(a) != kind:
            raise AttentionInputError(f"{name} is {_kind(a)} but q is {kind}: q and the caches must be of one kind")
    bt, sl = _paged_host(block_table), _paged_host(cache_seqlens)
    ks, vs = _paged_host(k_scale), _paged_host(v_scale)
    qdt = _paged_dtype("q", q)
    kv_dtype, skind = check_paged(tuple(q.shape), qdt, k_cache, v_cache, bt, sl, causal=causal, k_scale=ks,
                                  v_scale=vs)
    B, Nq, H, D = map(int, q.shape)
    NB, P, Hkv, _ = map(int, k_cache.shape)
    longest = int(sl.max()) if sl.size else 0
    bucket = 1 << max(0, longest - 1).bit_length()  # splits planned for the longest sequence's power-of-two bucket
    problem = PagedProblem(batch=B, heads=H, kv_heads=Hkv, q_len=Nq, kv_len=max(Nq, bucket),
                           head_dim=D, dtype=qdt, causal=bool(causal), scale=scale, page_size=P, kv_dtype=kv_dtype,
                           kv_scale=skind or "head", mean_len=paged_mean_bucket(sl, bucket))
    names = paged_default(problem) if phase is None else (phase if isinstance(phase, str) else phase.name,)
    ph, launch = _layout_plan(names, "paged", "does not read a paged KV cache", PAGED_DEFAULT, problem, params,
                              _PAGED_PLANS)
    swap = Nq > 1 and H > 1  # (B, q_len, H, D) and the kernels' (B, H, q_len, D) differ in memory
    qk = q
    if swap and kind in (TORCH, TORCH_CPU):
        qk = q.transpose(1, 2).contiguous()
    elif swap and kind == NUMPY:
        qk = np.ascontiguousarray(np.swapaxes(q, 1, 2))
    qd, kd, vd = (_paged_device(kind, a) for a in (qk, k_cache, v_cache))
    if swap and kind == DEVICE:
        qd = _swap_axes_1_2(qd)
    layout = (cuda.to_device(np.ascontiguousarray(bt)), cuda.to_device(np.ascontiguousarray(sl))) + \
        paged_scales(problem, ks, vs)
    od = cuda.device_array((B, H, Nq, D), dtype=qd.dtype)
    launch.run(qd.reshape(B * H, Nq, D), kd, vd, od.reshape(B * H, Nq, D), 0, layout,
               **({"lens": sl} if launch.host_lengths else {}))
    if kind == DEVICE:
        return _swap_axes_1_2(od) if swap else od.reshape(B, Nq, H, D)
    if kind == TORCH:
        torch = sys.modules["torch"]
        out = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
        cuda.as_cuda_array(out.view(torch.int16) if out.dtype == torch.bfloat16 else out).copy_to_device(od)
        return out.transpose(1, 2).contiguous() if swap else out.view(B, Nq, H, D)
    host = od.copy_to_host()
    host = host.view(np.asarray(q).dtype) if kind == NUMPY else host
    host = np.ascontiguousarray(np.swapaxes(host, 1, 2)) if swap else host.reshape(B, Nq, H, D)
    return _numpy_as_tensor(host.view(_numpy_dtype_of("q", q))) if kind == TORCH_CPU else host


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


def _swap_axes_1_2(src):
    """A device array (A, X, Y, D) copied to a new one (A, Y, X, D) on the device."""
    n0, n1, n2, n3 = map(int, src.shape)
    dst = cuda.device_array((n0, n2, n1, n3), dtype=src.dtype)
    n = n0 * n1 * n2 * n3
    if n:
        _swap_kernel()[(n + 127) // 128, 128](src, dst)
    return dst


# -- prefill of a packed ragged batch (varlen) -----------------------------------------------

_VARLEN_PLANS: OrderedDict = OrderedDict()
VARLEN_DEFAULT = ("tc_wgmma_varlen", "tc_mma_varlen")  # phase=None: the first that supports the problem


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, causal=False,
                     scale=None, phase=None, params=None, out=None, stream=None):
    """Attention over a packed ragged batch, FlashAttention's ``flash_attn_varlen_func`` layout:
    ``q`` (total_q, H, D); ``k``, ``v`` (total_k, Hkv, D); ``cu_seqlens_q``, ``cu_seqlens_k`` int32
    (B + 1,), starting at 0, non-decreasing, the last entry the total (sequence b: rows
    ``cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1`` of q and ``cu_seqlens_k[b] …`` of k, v). Returns
    (total_q, H, D) of q's kind (NumPy arrays, numba device arrays or PyTorch tensors, as
    ``attention()``: the same kind, ``out`` and ``stream`` rules and errors); float16 or bfloat16.

    ``causal``: bottom-right aligned per sequence (query i of a sequence with Lq queries and Lk
    keys sees keys j <= i + Lk − Lq; needs Lq <= Lk). A sequence without queries is allowed (no
    output rows); one with queries and no keys is refused. ``max_seqlen_q``/``max_seqlen_k``: the
    longest sequences (default: read from the cu_seqlens; a given value must not be smaller); the
    grid covers ``max_seqlen_q`` query rows per sequence. The input checks (spec/varlen.py) run
    before anything is launched; the cu_seqlens are read on the host for them (device ones are
    copied back once per call, then launched on as they are).

    ``phase``: ``tc_wgmma_varlen`` (sm_90a) or ``tc_mma_varlen`` (None: the first of them that
    supports the problem and the device); ``params``: a dict of the phase's tunable parameters.
    """
    from numba_attn.spec.problem import VarlenProblem
    from numba_attn.spec.varlen import check_varlen

    params = dict(params or {})
    causal = check_bool("causal", causal)
    kind = _one_kind(q, k, v, out)
    if kind == TORCH_CPU:  # the NumPy path on views of the tensors' memory
        res = attention_varlen(*_arrays_for_checks(kind, q, k, v), _paged_host(cu_seqlens_q), _paged_host(cu_seqlens_k),
                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                               phase=phase, params=params,
                               out=None if out is None else _tensor_as_numpy("out", out), stream=stream)
        return out if out is not None else _numpy_as_tensor(res)
    if kind == TORCH and backend.IS_SIMULATOR:
        raise AttentionInputError(f"q is a tensor on {q.device} but numba-attn runs in the CUDA simulator "
                                  f"(NUMBA_ATTN_BACKEND=simulator): pass CPU tensors")
    checked = _arrays_for_checks(kind, q, k, v)
    cu_q_host, cu_k_host = _paged_host(cu_seqlens_q), _paged_host(cu_seqlens_k)
    lq, lk, max_q, max_k = check_varlen(*checked, cu_q_host, cu_k_host, causal=causal, max_seqlen_q=max_seqlen_q,
                                        max_seqlen_k=max_seqlen_k)
    if out is not None:
        _check_out(out, kind, q, k, v)
    Tq, H, D = map(int, q.shape)
    Hkv = int(k.shape[1])
    dtype = np.dtype(checked[0].dtype).name
    if dtype not in ("float16", "bfloat16"):
        raise AttentionInputError(f"q must be float16 or bfloat16 for attention_varlen, got {dtype}")
    stream_key, numba_stream, launch_stream = _stream_of(kind, q, stream)
    if Tq == 0 or max_q == 0:  # no queries: nothing to compute; still validate the scalar arguments
        if scale is not None:
            Problem(q_len=1, kv_len=1, head_dim=max(D, 1), scale=scale)
        return out if out is not None else _empty_output(q, tuple(q.shape))
    problem = VarlenProblem(batch=len(lq), heads=H, kv_heads=Hkv, q_len=max_q, kv_len=max_k, head_dim=D, dtype=dtype,
                            causal=causal, scale=scale)
    names = VARLEN_DEFAULT if phase is None else (_phase_arg(phase).name,)
    ph, launch = _layout_plan(names, "varlen", "does not read the varlen layout", VARLEN_DEFAULT, problem,
                              params, _VARLEN_PLANS)
    if kind == DEVICE:
        for name, a in (("q", q), ("k", k), ("v", v)):
            _contiguous(name, a)  # refuses a non-contiguous device array
    elif kind == TORCH:
        for name, a in (("q", q), ("k", k), ("v", v)):
            if not a.is_contiguous():
                raise AttentionInputError(f"{name} is a non-contiguous tensor (strides {tuple(a.stride())}); pass "
                                          f"{name}.contiguous() (tensors are not copied implicitly)")
    qd, kd, vd = (_paged_device(kind, a) for a in (q, k, v))
    layout = tuple(a if _kind(a) == DEVICE else (_paged_device(TORCH, a) if _kind(a) == TORCH else
                                                  cuda.to_device(np.ascontiguousarray(h), stream=numba_stream))
                   for a, h in ((cu_seqlens_q, cu_q_host), (cu_seqlens_k, cu_k_host)))
    if kind == TORCH:
        o = out if out is not None else sys.modules["torch"].empty(tuple(q.shape), dtype=q.dtype, device=q.device)
        od = _paged_device(TORCH, o)
    elif kind == DEVICE:
        o = od = out if out is not None else cuda.device_array(tuple(q.shape), dtype=q.dtype)
    else:
        o, od = None, cuda.device_array(tuple(q.shape), dtype=qd.dtype)
    call = _VarlenCall(problem, ph, launch.params, lambda a, b, c, d, s: launch.run(a, b, c, d, s, layout),
                       launch_stream)
    _launch(call, qd, kd, vd, od)
    if o is not None:
        return o
    host = out if out is not None else np.empty(tuple(q.shape), dtype=np.asarray(q).dtype)
    od.copy_to_host(host.view(od.dtype), stream=numba_stream)
    if numba_stream:
        numba_stream.synchronize()
    return host


@dataclass
class _VarlenCall:
    """What :func:`_launch` reads of a plan, for one varlen call (its cu_seqlens bound in ``launch``)."""

    problem: object
    phase: object
    params: dict
    launch: object
    launch_stream: object
