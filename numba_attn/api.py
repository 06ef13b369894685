"""``attention()``: run one phase on arrays, the way a notebook or a test calls it.

Every input check happens before anything is compiled, allocated or launched,
and fails with :class:`~numba_attn.spec.errors.AttentionInputError` (a
``ValueError``) naming the argument and the allowed range:

* q, k, v must be 4-D NumPy or numba device arrays of one dtype among
  float32, float16, bfloat16; k and v of one shape; same batch and head_dim
  as q; q's heads a multiple of k/v's heads;
* empty problems: ``q_len == 0`` (or batch/heads 0) returns an empty output
  without launching anything; ``kv_len == 0`` with queries is an error (the
  softmax over zero keys is undefined);
* ``causal`` needs ``q_len <= kv_len`` (bottom-right alignment); ``scale``
  must be a positive finite number;
* non-contiguous NumPy inputs are **copied** to contiguous ones;
  non-contiguous device arrays are **refused** (copying them would hide a
  device-to-device copy in the call);
* ``causal`` and ``allow_tf32`` must be bools (``"False"`` is refused, not read as True);
* ``phase``: a name (or a registered ``Phase``); anything else is refused; an unknown
  name suggests close names; a phase that cannot run the problem (head_dim, dtype,
  causal, the device's compute capability) names the phases that can; unknown tunable
  parameters are refused with the list of the phase's parameters, and a value of the
  wrong type or range (``Br=-16``, ``Bc=0``, ``Br="abc"``) names the parameter and the
  allowed values;
* inputs whose contiguous copies and output do not fit in the available host
  memory are refused before anything is copied;
* a problem whose inputs and output do not fit in the free device memory is
  refused up front; a tile configuration the device cannot launch (threads or
  shared memory per block) is reported as such, not as a crash.

NaN/Inf inputs (``nonfinite``): by default (``"propagate"``) they are computed
like any value and the output has NaN where the float64 reference has NaN
(checked for every phase in the simulator tests, and on an H200 on 2026-11-22
with the kernels' fast-math flags); ``"raise"`` scans the inputs first and
refuses them, naming the array and the first bad element.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.spec.errors import AttentionInputError, check_arrays, check_bool, check_finite  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402
from numba_attn.phases.registry import get_phase, list_phases  # noqa: E402


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


def device_name() -> str:
    """The GPU model the dispatch table and the tuning cache are keyed by ("simulator": no table entry)."""
    from numba_attn.measure.env import gpu_info

    return gpu_info()["gpu"]


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
        hit = cached_params(problem, phase.name if phase is not None else None, gpu)
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
    if is_device_array(a):
        ok = a.is_c_contiguous() if hasattr(a, "is_c_contiguous") else True
        if not ok:
            raise AttentionInputError(
                f"{name} is a non-contiguous device array (strides {tuple(a.strides)}); pass a C-contiguous "
                f"one, e.g. cuda.to_device(np.ascontiguousarray(...)) (device arrays are not copied implicitly)")
        return a
    return np.ascontiguousarray(a)


def _empty_output(q, shape):
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


def explain(q, k, v, *, causal=False, scale=None, phase=None, allow_tf32=False, nonfinite="propagate",
            **params) -> Explanation:
    """The phase ``attention(q, k, v, ...)`` with the same arguments would run, its resolved
    parameters (:meth:`Phase.resolve`) and why it was chosen; checks the same inputs, launches nothing."""
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    problem, ph, resolved, why = _plan(q, k, v, causal, scale, phase, allow_tf32, params)
    if problem is not None:
        _check_host_memory(problem, (q, k, v))
    return Explanation(ph, dict(resolved or {}), why, problem)


def attention(q, k, v, *, causal=False, scale=None, phase=None, allow_tf32=False, nonfinite="propagate",
              **params):
    """Softmax attention of q (B, H, Nq, D) over k, v (B, Hkv, Nk, D).

    ``phase`` names a registered phase (a registered ``Phase`` object is taken by its name);
    ``None`` chooses one by the documented rule of :func:`choose_phase` (see
    :func:`explain` for what it chose and why): never a phase computing below the input precision
    unless ``allow_tf32=True`` (as PyTorch's flag: float32 inputs may then run on tf32 tensor
    cores); a phase named explicitly runs at its own precision. Extra keyword arguments override
    its tunable parameters (positive integers for tile sizes, see the registry's rules). A forced
    ``splits`` is taken as given: splits beyond the key tiles get no keys and are combined
    correctly (checked in the simulator for every split-K phase), but they are still launched, so
    leave ``splits=0`` (planned from the keys and the SM count) unless measuring. NumPy arrays in →
    NumPy array out; numba device arrays in → device array out. Input rules and errors: see the
    module docstring.
    """
    if nonfinite not in ("propagate", "raise"):
        raise AttentionInputError(f"nonfinite must be 'propagate' or 'raise'; got {nonfinite!r}")
    problem, ph, resolved, _why = _plan(q, k, v, causal, scale, phase, allow_tf32, params)
    if problem is None:
        return _empty_output(q, tuple(q.shape))
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if nonfinite == "raise":
        for name, a in (("q", q), ("k", k), ("v", v)):
            check_finite(name, a)
    _check_host_memory(problem, (q, k, v))
    q, k, v = (_contiguous(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    on_device = is_device_array(q)
    from numba_attn.measure import limits
    from numba_attn.measure.check import to_device, to_host
    from numba_attn.measure.status import classify_exception

    free = limits.free_device_memory()
    need = problem.min_bytes() if not on_device else int(np.prod(problem.out_shape())) * problem.itemsize
    if free is not None and need > free:
        raise AttentionInputError(f"{problem.label} needs {need / 2**30:.2f} GiB of device memory for its "
                                  f"inputs and output; {free / 2**30:.2f} GiB free")
    try:
        with limits.simulated_device_limits():
            launch = ph.plan(problem, **params)  # the caller's parameters, or the tuning cache's (_plan)
            if on_device:
                qd, kd, vd = q, k, v
            else:
                qd, kd, vd = (to_device(a) for a in (q, k, v))
            od = cuda.device_array((B, H, Nq, D), dtype=qd.dtype)
            launch(qd.reshape(B * H, Nq, D), kd.reshape(B * Hkv, Nk, D), vd.reshape(B * Hkv, Nk, D),
                   od.reshape(B * H, Nq, D))
            if not on_device:
                return to_host(od, q.dtype)
            return od
    except Exception as exc:  # noqa: BLE001
        status, why, _ = classify_exception(exc)
        if status == "SKIP" or isinstance(exc, limits.DeviceLimitError):
            raise AttentionInputError(f"phase {ph.name!r} with {resolved} cannot run {problem.label} on this "
                                      f"device: {why}. Try smaller tiles or another phase.") from exc
        raise
