"""The plan cache of ``attention()``: what a call needs that does not depend on the data (the checked
problem, the phase, its compiled Launch and scratch buffers, the bound device arrays, the recorded
launches to replay), made by the first call with a (kind, shapes, dtype, contiguity, causal, scale,
phase, parameters, allow_tf32, device, stream) and reused by later calls with the same arguments.
:mod:`numba_attn.api` checks the inputs and decides when to plan; this module keeps, makes and runs plans."""
from __future__ import annotations

import functools
import os
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.array_kinds import DEVICE, OTHER, TORCH, TORCH_CPU, address, is_contiguous  # noqa: E402
from numba_attn.measure import tuning_cache  # noqa: E402
from numba_attn.phases.registry import registered, registered_count  # noqa: E402
from numba_attn.spec.errors import AttentionInputError  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402

#: replay a plan's recorded launches on later calls (:mod:`numba_attn.gpu.replay`); False: numba's
#: launch path on every call (``NUMBA_ATTN_REPLAY=0``)
REPLAY = os.environ.get("NUMBA_ATTN_REPLAY", "1") != "0"
MAX_PLANS = 128  # plans kept (least recently used dropped first)
MAX_PLAN_WORKSPACE = 2 << 30  # bytes of scratch (split-K partials, naive's S) the kept plans may hold

PLANS: OrderedDict = OrderedDict()
_STATS = {"hits": 0, "misses": 0, "workspace": 0}
_TUNING_PATHS: dict = {}


@dataclass(eq=False)
class Plan:
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
    replay_lse: object = None  # the same for calls with the log-sum-exp (None: not yet recorded; False: refused)
    sizes: tuple = ()  # bytes of q, k, v, o


STAMP_NS = 10_000_000  # the tuning cache file is looked at (os.stat) at most every 10 ms
_STAMP = [0, None, None]  # (monotonic ns of the last look, its environment, the stamp)


_ENV_NAMES = ("NUMBA_ATTN_TUNING_CACHE", "NUMBA_ATTN_RESULTS", "XDG_DATA_HOME")  # where the tuning cache is
_ENV_DATA = getattr(os.environ, "_data", None)  # POSIX: os.environ's own dict (bytes keys), kept current by it
_ENV_KEYS = tuple(os.fsencode(n) for n in _ENV_NAMES)


def _stamp_env():
    """The variables that place the tuning cache, as a key: read from ``os.environ``'s dict on POSIX (a
    ``os.environ.get`` encodes its key at each call: microseconds of a call's host time), else by ``get``."""
    if os.name == "posix" and type(_ENV_DATA) is dict:
        return tuple(map(_ENV_DATA.get, _ENV_KEYS))
    return tuple(map(os.environ.get, _ENV_NAMES))


def _tuning_stamp():
    """The tuning cache file and its modification time: a plan made before a tuning is not reused. The file is
    looked at most every ``STAMP_NS`` (a stat is a few microseconds of a call's host time): a tuning written by
    another process counts from the next look; one written by this process (:func:`tuning_changed`) and a
    changed environment at once."""
    env = _stamp_env()
    now = time.monotonic_ns()
    if now - _STAMP[0] < STAMP_NS and _STAMP[1] == env:
        return _STAMP[2]
    path = _TUNING_PATHS.get(env)
    if path is None:
        from numba_attn.measure.tune import default_cache_path

        path = _TUNING_PATHS[env] = default_cache_path()
    try:
        st = os.stat(path)
        stamp = path, st.st_mtime_ns, st.st_size
    except OSError:
        stamp = path, None, None
    _STAMP[:] = now, env, stamp
    return stamp


def tuning_changed() -> None:
    """This process wrote a tuning cache: the next call looks at the file again."""
    _STAMP[0] = 0


tuning_cache.WRITE_HOOKS.append(tuning_changed)


def token():
    return registered_count(), _tuning_stamp()


def clear_plans() -> None:
    """Drop every cached plan (and the scratch buffers they hold). Plans are dropped by themselves
    when the tuning cache file or the number of registered phases changes; call this after changing
    a phase in place or anything else :func:`choose_phase` reads (e.g. ``device_cc``)."""
    PLANS.clear()
    _STATS.update(hits=0, misses=0, workspace=0)
    tuning_changed()


def plan_cache_info() -> dict:
    """``{"hits", "misses", "plans", "workspace"}``: calls served from a cached plan, calls that
    planned, plans kept, bytes of scratch they hold."""
    return {"hits": _STATS["hits"], "misses": _STATS["misses"], "plans": len(PLANS),
            "workspace": _STATS["workspace"]}


def plan_key(kind, q, k, v, causal, scale, phase, allow_tf32, params, stream_key):
    """Everything the plan depends on, hashable; None when an argument cannot be a key (the call
    then plans without the cache and its checks say what is wrong)."""
    if kind is OTHER or kind is TORCH_CPU:
        return None
    try:
        arrays = tuple((tuple(a.shape), a.dtype, is_contiguous(kind, a)) for a in (q, k, v))
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


def cached(key):
    """The kept plan of ``key`` (None: no key, none kept, or made before the registry or the tuning cache
    changed or for a phase no longer registered), counted as a hit and made the most recently used."""
    plan = PLANS.get(key) if key is not None else None
    if plan is None or plan.token != token() or plan.phase is not registered(plan.phase.name):
        return None
    PLANS.move_to_end(key)
    _STATS["hits"] += 1
    return plan


def keep(key, plan) -> None:
    PLANS[key] = plan
    _STATS["workspace"] += plan.launch.workspace_bytes or 0
    while len(PLANS) > 1 and (len(PLANS) > MAX_PLANS or _STATS["workspace"] > MAX_PLAN_WORKSPACE):
        _, old = PLANS.popitem(last=False)
        _STATS["workspace"] -= old.launch.workspace_bytes or 0


def launch(plan, qd, kd, vd, od, mods=None, lse=None, sinks=None) -> None:
    """Run the plan's Launch (``mods``: a variant's kernel arguments for this call's arrays, None: the
    launch's own); a launch the device refuses is an :class:`AttentionInputError`. ``lse``: a float32
    (B·H, Nq) device array the phase writes each row's log-sum-exp to (a plan of a problem asking for it);
    ``sinks``: (H,) sink logits, applied to the output from that log-sum-exp (:mod:`numba_attn.variants.sinks`)."""
    extra = {} if mods is None else {"mods": mods}  # (a varlen or paged call's launch takes no mods)
    run = plan.launch
    if lse is not None:  # (Launch.__call__ passes no lse: the run of a phase that writes it takes it)
        extra["lse"] = lse
        run = plan.launch.run
    try:
        if backend.IS_SIMULATOR:
            from numba_attn.measure import limits

            with limits.simulated_device_limits():
                run(qd, kd, vd, od, plan.launch_stream, **extra)
        else:
            run(qd, kd, vd, od, plan.launch_stream, **extra)
        if sinks is not None:
            from numba_attn.variants.sinks import apply_sinks

            apply_sinks(od, lse, sinks, plan.problem.heads, plan.launch_stream or 0,
                        bf16=plan.problem.dtype == "bfloat16")
    except Exception as exc:  # noqa: BLE001
        from numba_attn.measure import limits
        from numba_attn.measure.status import classify_exception

        status, why, _ = classify_exception(exc)
        if status == "SKIP" or isinstance(exc, limits.DeviceLimitError):
            raise AttentionInputError(f"phase {plan.phase.name!r} with {plan.params} cannot run "
                                      f"{plan.problem.label} on this device: {why}. Try smaller tiles or "
                                      f"another phase.") from exc
        raise


@functools.lru_cache(maxsize=16)
def lse_rows(rows, Nq):
    """The (B·H, Nq) float32 log-sum-exp at any address (a tensor's, typed once: see ``Plan.bind``)."""
    from numba_attn.gpu.arrays import BoundArrays

    return BoundArrays([(rows, Nq)], np.float32)


def _run_lse_replayed(plan, q, k, v, out):
    """``(out, lse)`` of a tensor call: the first such call of the plan records its launches, later ones replay
    them at their five addresses (q, k, v, o, lse), as :func:`first_run` does for calls without lse."""
    torch = sys.modules["torch"]
    B, H, Nq = plan.problem.batch, plan.problem.heads, plan.problem.q_len
    o = out if out is not None else torch.empty_like(q)  # (q is C-contiguous: the plan's key says so)
    lse_out = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    addresses = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse_out.data_ptr())
    if plan.replay_lse is not None:
        plan.replay_lse(addresses)
        return o, lse_out
    from numba_attn.gpu.replay import Replay, recording

    b = plan.bind
    with recording() as rec:
        launch(plan, *(b(i, a) for i, a in enumerate(addresses[:4])), mods=None,
               lse=lse_rows(B * H, Nq)(0, addresses[4]), sinks=None)
    plan.replay_lse = Replay.make(rec, addresses, plan.sizes + (B * H * Nq * 4,),
                                  getattr(plan.launch, "derived", None)) or False
    return o, lse_out


def run(plan, kind, q, k, v, out, seen=None, mods=None, lse=False, sinks=None):
    """Launch a checked plan on this call's arrays; the output (``out`` when given). ``seen``: a
    list that receives the four device addresses launched on (tensors and device arrays). ``lse``: also
    the rows' log-sum-exp, ``(out, lse)`` with lse (B, H, Nq) float32 of the call's kind; ``sinks``: a host
    (H,) array of sink logits applied to the output (needs ``lse``)."""
    s_q, s_kv, _, _ = plan.shapes
    B, H, Nq = plan.problem.batch, plan.problem.heads, plan.problem.q_len
    if (lse and kind == TORCH and mods is None and sinks is None and seen is None and plan.bind is not None
            and plan.replay_lse is not False and REPLAY and getattr(plan.launch, "replayable", True)):
        return _run_lse_replayed(plan, q, k, v, out)
    lse_out = lse_d = None
    if lse:
        if kind == TORCH:
            lse_out = sys.modules["torch"].empty((B, H, Nq), dtype=sys.modules["torch"].float32, device=q.device)
            lse_d = lse_rows(B * H, Nq)(0, lse_out.data_ptr()) if plan.bind is not None else \
                cuda.as_cuda_array(lse_out).reshape(B * H, Nq)
        else:
            lse_out = cuda.device_array((B, H, Nq), dtype=np.float32)
            lse_d = lse_out.reshape(B * H, Nq)
        if sinks is not None:
            sinks = cuda.to_device(np.ascontiguousarray(sinks, dtype=np.float32), stream=plan.numba_stream or 0)
    extra = {"mods": mods, "lse": lse_d, "sinks": sinks}

    def done(o):
        if not lse:
            return o
        if kind in (TORCH, DEVICE):
            return o, lse_out
        return o, lse_out.copy_to_host()

    if kind == TORCH:
        o = out if out is not None else sys.modules["torch"].empty(q.shape, dtype=q.dtype, device=q.device)
        b = plan.bind
        addresses = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
        if seen is not None:
            seen.extend(addresses)
        launch(plan, *(b(i, a) for i, a in enumerate(addresses)), **extra)
        return done(o)
    if kind == DEVICE:
        o = out if out is not None else cuda.device_array(q.shape, dtype=q.dtype)
        b = plan.bind
        if b is None:  # the simulator
            launch(plan, q.reshape(s_q), k.reshape(s_kv), v.reshape(s_kv), o.reshape(s_q), **extra)
        else:
            addresses = tuple(address(DEVICE, a) for a in (q, k, v, o))
            if seen is not None:
                seen.extend(addresses)
            launch(plan, *(b(i, a) for i, a in enumerate(addresses)), **extra)
        return done(o)
    # NumPy: copied to the device (contiguous copies of non-contiguous inputs), computed, copied back
    from numba_attn.measure.check import to_device

    s = plan.numba_stream
    qd, kd, vd = (to_device(np.ascontiguousarray(a), stream=s) for a in (q, k, v))
    od = cuda.device_array(qd.shape, dtype=qd.dtype)
    b = plan.bind
    if b is None:
        launch(plan, qd.reshape(s_q), kd.reshape(s_kv), vd.reshape(s_kv), od.reshape(s_q), **extra)
    else:  # views that do not own the copies, so the plan keeps none of them alive
        launch(plan, *(b(i, address(DEVICE, a)) for i, a in enumerate((qd, kd, vd, od))), **extra)
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    od.copy_to_host(out.view(od.dtype), stream=s)
    if s:
        s.synchronize()
    return done(out)


def make(problem, ph, resolved, why, params, stamp, numba_stream, launch_stream) -> Plan:
    """A new plan of a checked call: the phase's Launch (compiled with ``params``, the caller's or the
    tuning cache's) and, on a GPU, the four arrays bound once per layout; a tile configuration the device
    cannot launch is an :class:`AttentionInputError`. ``stamp``: :func:`token` before the call's checks."""
    from numba_attn.measure import limits

    B, H, Nq, D = problem.batch, problem.heads, problem.q_len, problem.head_dim
    Hkv, Nk = problem.kv_heads, problem.kv_len
    shapes = ((B * H, Nq, D), (B * Hkv, Nk, D), (B * Hkv, Nk, D), (B * H, Nq, D))
    try:
        with limits.simulated_device_limits():
            built = ph.plan(problem, **params)
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
    plan = Plan(problem=problem, phase=ph, params=resolved, why=why, launch=built, token=stamp,
                numba_stream=numba_stream, launch_stream=launch_stream, shapes=shapes, bind=bind, sizes=sizes)
    _STATS["misses"] += 1
    return plan


def first_run(plan, key, kind, q, k, v, out):
    """The first call of a new plan: run (on a GPU, recording its launches for later calls to replay), then
    keep the plan under ``key`` (None: not kept)."""
    replayable = getattr(plan.launch, "replayable", True)  # False: e.g. a variant's arrays of the call
    if plan.bind is not None and kind in (TORCH, DEVICE) and key is not None and REPLAY and replayable:
        from numba_attn.gpu.replay import Replay, recording

        seen = []
        with recording() as rec:
            result = run(plan, kind, q, k, v, out, seen)
        plan.replay = (Replay.make(rec, seen, plan.sizes, getattr(plan.launch, "derived", None))
                       if len(seen) == 4 else None)
    else:
        result = run(plan, kind, q, k, v, out)
    if key is not None:
        keep(key, plan)
    return result
