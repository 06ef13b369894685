"""The phase registry. A phase is one step of the optimization roadmap: a host function that, given a
:class:`~numba_attn.spec.problem.Problem` and its tunable parameters, compiles (or fetches from the cache) the
kernel(s) it needs and returns a :class:`Launch` that runs them on device arrays.

Register one with the decorator::

    @register_phase(name="smem_kv", order=2, title="K/V tiles in shared memory", parent="fused_rowwise",
                    description="K and V tiles of Bc rows are staged in shared memory ...",
                    lineage="FlashAttention-1 (Dao et al. 2022), Alg. 1 outer loop over K/V tiles",
                    planned_speedup=3.0)
    def smem_kv(problem, Br=64, Bc=64):
        ...
        return Launch(run, kernels=[kernel])

The keyword arguments of the function are the phase's tunable parameters and their defaults. A default of 0 means
"chosen for the problem": the phase's ``resolve(problem, **params)`` (passed to the decorator) returns every
parameter with a concrete value, once, before ``supports`` and the builder see them; it must return a concrete value
unchanged. :meth:`Phase.plan` puts the parameters that ran in ``Launch.params`` and the runner records those. Tile
sizes must reach the kernel as compile-time constants: build kernels in a factory that closes over them and cache
the factory (``functools.cache``) so each configuration compiles once.

Parameter values are checked before ``resolve`` sees them (:meth:`Phase.resolve_params`); ``requires_cc`` states the
compute capability a phase's kernels need (:data:`SIMULATED_CC`); ``space`` the values a tuning tries per parameter
(:func:`candidate_configs`)."""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import Callable

from numba_attn.gpu import backend  # noqa: F401  (chooses CUDA or the simulator before any phase imports numba)
from numba_attn.spec.errors import AttentionInputError, UnknownPhaseError, check_bool, check_int
from numba_attn.spec.problem import layout_of

_REGISTRY: dict[str, "Phase"] = {}

# Parameters whose range the generic rule (default > 0: >= 1; default 0: >= 0) does not give:
# on/off switches wherever they appear, and the few with a documented range.
_FLAG = (0, 1)
# A parameter whose default is a positive integer takes integers >= 1, one whose default is 0 ("automatic")
# integers >= 0, a bool default True/False (or 0/1); the on/off switches and the few parameters with another range
# are listed here. A wrong value is an AttentionInputError naming the phase, the parameter and the allowed values.
PARAM_RANGES: dict[str, tuple] = {
    "heavy_first": _FLAG, "dynamic_smem": _FLAG, "l2_prefetch": _FLAG, "even": _FLAG, "fixed_combine": _FLAG,
    "pdl": (0, 3),  # 0 plain launch, 1..3 where the combine is released (decode_mma)
    "fuse_max": (0, None),  # 0: always a separate combine kernel
}

# ``requires_cc`` of a phase: ``(major, minor)`` is a minimum (e.g. ``(8, 0)`` for cp.async), a string "sm_90a" an
# architecture-specific target that runs only on exactly that compute capability (wgmma). Phase.supports refuses a
# device without it; the simulator counts as the GPU it emulates, compute capability SIMULATED_CC (9.0, the H200 of
# the committed results).
SIMULATED_CC = (9, 0)


@functools.cache
def device_cc() -> tuple | None:
    """The current device's compute capability; :data:`SIMULATED_CC` in the simulator; None when
    no device can be asked (then no phase is refused for its compute capability)."""
    if backend.IS_SIMULATOR:
        return SIMULATED_CC
    try:
        from numba import cuda

        return tuple(cuda.get_current_device().compute_capability)
    except Exception:  # noqa: BLE001
        return None


def cc_reason(requires_cc, cc) -> str | None:
    """Why a device of compute capability ``cc`` cannot run a phase needing ``requires_cc``."""
    if requires_cc is None or cc is None:
        return None
    have = f"sm_{cc[0]}{cc[1]}"
    if isinstance(requires_cc, str):  # "sm_90a": exactly that compute capability
        digits = requires_cc.removeprefix("sm_").rstrip("a")
        need = (int(digits[:-1]), int(digits[-1]))
        if tuple(cc) != need:
            return f"needs compute capability {need[0]}.{need[1]} exactly ({requires_cc}); the device is {have}"
        return None
    if tuple(cc) < tuple(requires_cc):
        return f"needs compute capability >= {requires_cc[0]}.{requires_cc[1]}; the device is {have}"
    return None


@dataclass
class Launch:
    """What a phase returns for one problem: a callable that launches its
    kernel(s) on device arrays ``run(q, k, v, o, stream)``, and the compiled
    dispatchers, so the runner can report their resources.

    ``stream`` is whatever numba's ``kernel[grid, block, stream]`` accepts (0, a numba stream, a
    ``cuda.core`` stream, a graph builder); every kernel of the launch, split-K combines
    included, goes to it. A Launch is reused for many calls (``attention()`` caches it per
    problem and stream), so buffers allocated by the builder (split-K partials, counters) are
    its scratch, shared by the calls on one stream."""

    run: Callable
    kernels: list = field(default_factory=list)
    workspace_bytes: int = 0
    notes: str = ""
    params: dict = field(default_factory=dict)  # the parameters that ran (automatic ones resolved)
    # False: attention() must not replay recorded launches at new addresses (gpu/replay.py), e.g. the
    # kernels reach K/V through TMA tensor maps that hold the arrays' addresses
    replayable: bool = True
    # (addresses of q, k, v, o) -> device pointers the kernels take that are made from those addresses and
    # cached by them (the K/V tensor maps of the TMA phases): a replay substitutes them too (gpu/replay.py)
    derived: Callable | None = None
    # True: run(..., layout, lens=...) takes the host copy of a paged call's sequence lengths (decode_paged
    # passes the lengths it checked on the host), so that a launch planned from them reads nothing back
    host_lengths: bool = False

    # numba_attn.variants.launching.KernelMods of a phase that runs variants: the kernels' ``mods`` for a
    # call's own arrays (attention(aux=..., block_mask=...)); None: the launch has no variant
    kernel_mods: object = None
    # a traced build's device array of its work items' clock stamps (phases/tensor_core/timeline.py); else None
    timeline: object = None

    def __call__(self, q, k, v, o, stream=0, mods=None):
        if mods is None:
            return self.run(q, k, v, o, stream)
        return self.run(q, k, v, o, stream, mods=mods)


@dataclass
class Phase:
    name: str
    order: float
    title: str
    parent: str | None
    description: str
    lineage: str
    planned_speedup: float | None
    build: Callable
    params: dict
    dtypes: tuple = ("float32", "float16")
    head_dims: tuple | None = None  # None: any head_dim
    causal: bool = True  # supports causal masking
    # runs mask_mod/score_mod variants (problem.variant) through its family's variant stage; False or a
    # string (why not): refused
    variants: bool | str = False
    # writes the log-sum-exp of each row (attention(return_lse=True)); False or a string (why not): refused
    lse: bool | str = False
    # reads q, k, v given as e4m3 codes with per-head scales (attention_fp8, spec/fp8_inputs.py); False: refused
    e4m3_inputs: bool = False
    kind: str = "prefill"  # or "decode", or "backward" (gradients: attention_backward(), never a forward launch)
    precision: str | None = None  # compute precision when coarser than the storage dtype (e.g. "tf32")
    sim_params: dict = field(default_factory=dict)  # small tiles for simulator tests
    extra_supports: Callable | None = None
    resolver: Callable | None = None  # resolve(problem, **params) -> params with automatic values chosen
    module: str = ""
    requires_cc: tuple | str | None = None  # (major, minor) minimum, or "sm_90a": exactly that target
    space: dict = field(default_factory=dict)  # tunable parameter → values to try (see expand_space)
    layout: str = "contiguous"  # the layout it reads: "contiguous" (Problem), "paged" (PagedProblem) or "varlen"
    # parameters read at launch (grid, kernel arguments): candidates that differ only in these mostly share
    # their compiled kernels, so a tuning worker measures them in a row (measure/tune.py kernel_groups)
    launch_params: tuple = ()

    def supports(self, problem, **params) -> str | None:
        """None when the phase can run ``problem``; otherwise the reason it cannot. A ``supports``
        or ``resolve`` that raises anything but ``ValueError`` is a bug of this phase alone: the
        answer is ``"unsupported: bug in supports(): ..."``, never an exception."""
        try:
            reason = self._supports_base(problem)
            if reason:
                return reason
            try:
                params = self.resolve(problem, params)
            except ValueError as exc:
                return str(exc)
            if self.extra_supports is not None:
                return self.extra_supports(problem, **params)
            return None
        except Exception as exc:  # noqa: BLE001
            return f"unsupported: bug in supports(): {type(exc).__name__}: {exc}"

    @property
    def is_builtin(self) -> bool:
        """A phase of the package itself (not registered from a user's module or the test fixtures)."""
        return self.module.startswith("numba_attn.phases.")

    def _supports_base(self, problem) -> str | None:
        layout = layout_of(problem)
        if layout != self.layout:
            if "varlen" in (layout, self.layout):
                return f"the {layout} layout: {self.name} reads the {self.layout} one"
            cache = "a paged" if layout == "paged" else "a contiguous"
            return f"{cache} KV cache: {self.name} reads a {self.layout} one"
        if problem.dtype not in self.dtypes:
            return f"dtype {problem.dtype} not supported (supports {', '.join(self.dtypes)})"
        if self.head_dims is not None and problem.head_dim not in self.head_dims:
            return (f"head_dim {problem.head_dim} not supported "
                    f"(supports {', '.join(map(str, self.head_dims))})")
        if problem.causal and not self.causal:
            return "causal masking not supported"
        if getattr(problem, "variant", None) is not None and self.variants is not True:
            if isinstance(self.variants, str):
                return f"mask_mod/score_mod variants: {self.variants}"
            return (f"mask_mod/score_mod variants do not reach {self.name}'s kernels (it is registered without "
                    f"variants=True: its kernels have no variant stage)")
        if getattr(problem, "lse", False) and self.lse is not True:
            return f"log-sum-exp output: {self.lse if isinstance(self.lse, str) else 'no log-sum-exp output yet'}"
        if getattr(problem, "e4m3_inputs", False) and not self.e4m3_inputs:
            return (f"e4m3 inputs: {self.name} reads float16/bfloat16 q, k, v (fp8_ws, fp8_overlap, fp8_exp_fma "
                    "and fp8_lazy read e4m3 codes)")
        return cc_reason(self.requires_cc, device_cc())

    def resolve(self, problem, overrides: dict | None = None) -> dict:
        """Every parameter with the value that runs ``problem``: the defaults, the
        ``overrides``, then the phase's own choice for the automatic (0) ones."""
        params = self.resolve_params(overrides)
        if self.resolver is not None:
            params = {**params, **self.resolver(problem, **params)}
        return params

    def resolve_params(self, overrides: dict | None = None) -> dict:
        """The defaults with ``overrides`` applied (names checked, values typed like the defaults)."""
        p = dict(self.params)
        for key, val in (overrides or {}).items():
            if key not in p:
                raise AttentionInputError(f"phase {self.name!r} has no parameter {key!r} "
                                          f"(parameters: {', '.join(p) or 'none'})")
            p[key] = check_param(self.name, key, p[key], val)
        return p

    def plan(self, problem, **overrides) -> Launch:
        """Compile (cached) and return the :class:`Launch` for ``problem``."""
        params = self.resolve_params(overrides)
        reason = self.supports(problem, **params)
        if reason:
            raise ValueError(f"phase {self.name!r} cannot run {problem.label}: {reason}")
        params = self.resolve(problem, params)
        launch = self.build(problem, **params)
        launch.params = params
        return launch

    @property
    def source_file(self) -> str:
        return inspect.getsourcefile(sys.modules[self.module]) if self.module else ""

    def source(self) -> str:
        """The source of the phase's module (kernel, factory and host wrapper)."""
        return inspect.getsource(sys.modules[self.module]) if self.module else ""

    def __repr__(self):
        return f"<Phase {self.order:g} {self.name!r}: {self.title}>"


def check_param(phase: str, key: str, default, value):
    """``value`` for the parameter ``key`` of ``phase`` (default ``default``), typed like the
    default and in its range (see the module docstring); else an ``AttentionInputError``."""
    name = f"parameter {key} of phase {phase!r}"
    if default is None:
        return value
    if key in PARAM_RANGES:
        lo, hi = PARAM_RANGES[key]
        out = check_int(name, value, lo, hi)
        return bool(out) if isinstance(default, bool) else out
    if isinstance(default, bool):
        return check_bool(name, value)
    if isinstance(default, int):
        return check_int(name, value, 1 if default > 0 else 0)
    if isinstance(default, float):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise AttentionInputError(f"{name} must be a number; got {value!r}") from None
    if isinstance(default, str) and not isinstance(value, str):
        raise AttentionInputError(f"{name} must be a string; got {value!r}")
    return value


def register_phase(*, name, order, title, parent, description, lineage, planned_speedup,
                   dtypes=("float32", "float16"), head_dims=None, causal=True, kind="prefill",
                   precision=None, sim_params=None, supports=None, resolve=None, requires_cc=None, space=None,
                   layout="contiguous", launch_params=(), variants=False, lse=False, e4m3_inputs=False):
    """Decorator registering a phase builder (see the module docstring)."""

    def deco(fn):
        sig = inspect.signature(fn)
        params = {k: p.default for k, p in list(sig.parameters.items())[1:]
                  if p.default is not inspect.Parameter.empty}
        if name in _REGISTRY and _REGISTRY[name].module != fn.__module__:
            raise ValueError(f"phase {name!r} registered twice ({_REGISTRY[name].module}, {fn.__module__})")
        phase = Phase(
            name=name, order=order, title=title, parent=parent, description=inspect.cleandoc(description),
            lineage=lineage, planned_speedup=planned_speedup, build=fn, params=params,
            dtypes=tuple(dtypes), head_dims=tuple(head_dims) if head_dims else None, causal=causal,
            kind=kind, precision=precision, sim_params=dict(sim_params or {}), extra_supports=supports,
            resolver=resolve, module=fn.__module__, requires_cc=requires_cc,
            space=dict(space or {}), layout=layout, launch_params=tuple(launch_params),
            variants=variants if isinstance(variants, str) else bool(variants),
            lse=lse if isinstance(lse, str) else bool(lse), e4m3_inputs=bool(e4m3_inputs))
        unknown = [k for k in phase.space if k != "where" and k not in params]
        unknown += [k for k in phase.launch_params if k not in params]
        if unknown:
            raise ValueError(f"phase {name!r}: space names unknown parameters {unknown}")
        _REGISTRY[name] = phase  # (a phase refused above is not registered)
        return fn

    return deco


def register_variant(base: str, name: str, *, order: float | None = None, build: Callable | None = None,
                     note: str | None = None, **defaults) -> Phase:
    """Register ``name``: phase ``base`` under another name with other defaults (``defaults``, parameters
    of ``base``), so that a run times both side by side (``--param`` sets one value per phase name). Its
    parent is ``base``; everything else (supports, resolve, space, metadata) is ``base``'s. ``build``: a
    builder to use instead of ``base``'s (its keyword arguments become the parameters), for a keyword
    ``base`` does not expose; ``note``: what differs, for the title (default: the defaults given). Registered
    from an out-of-tree module given to ``--setup``::

        register_variant("paged_split_k", "paged_split_k_bal", balance=True)
    """
    ph = get_phase(base)
    fn = build or ph.build
    sig = inspect.signature(fn)
    unknown = [k for k in defaults if k not in sig.parameters]
    if unknown:
        raise ValueError(f"variant {name!r} of {base!r}: {unknown} are not parameters of its builder "
                         f"({', '.join(list(sig.parameters)[1:])})")

    def variant(problem, **params):
        return fn(problem, **{**defaults, **params})

    variant.__signature__ = sig.replace(parameters=[p.replace(default=defaults.get(p.name, p.default))
                                                    for p in sig.parameters.values()])
    variant.__module__ = sys._getframe(1).f_globals.get("__name__", __name__)  # the module that registered it
    variant.__name__ = variant.__qualname__ = name
    note = note or ", ".join(f"{k}={v}" for k, v in defaults.items()) or f"builder {fn.__name__}"
    register_phase(name=name, order=ph.order + 0.5 if order is None else order, title=f"{ph.title} ({note})",
                   parent=base, description=f"{ph.description}\n\nA variant of {base}: {note}.",
                   lineage=ph.lineage, planned_speedup=ph.planned_speedup, dtypes=ph.dtypes, head_dims=ph.head_dims,
                   causal=ph.causal, kind=ph.kind, precision=ph.precision, sim_params=ph.sim_params,
                   supports=ph.extra_supports, resolve=ph.resolver, requires_cc=ph.requires_cc,
                   space={k: v for k, v in ph.space.items() if k == "where" or k in sig.parameters},
                   layout=ph.layout, launch_params=ph.launch_params, lse=ph.lse,
                   e4m3_inputs=ph.e4m3_inputs)(variant)
    return get_phase(name)


def expand_values(spec) -> list:
    """The values of one parameter's space: a list/tuple of values, a ``range``, or
    ``{"pow2": (lo, hi)}`` (the powers of two from lo to hi)."""
    if isinstance(spec, dict) and set(spec) == {"pow2"}:
        lo, hi = spec["pow2"]
        out, v = [], 1
        while v <= hi:
            if v >= lo:
                out.append(v)
            v *= 2
        return out
    if isinstance(spec, (list, tuple, range)):
        return list(spec)
    raise ValueError(f"a parameter space is a list of values, a range or {{'pow2': (lo, hi)}}; got {spec!r}")


def candidate_configs(phase: "Phase", problem, space: dict | None = None, fixed: dict | None = None) -> list[dict]:
    """The configurations of ``phase`` worth measuring on ``problem``, the default first.

    ``space`` (default: the phase's declared :attr:`Phase.space`) maps a tunable parameter to its
    values (:func:`expand_values`); the optional key ``"where"`` is a constraint
    ``where(problem, params) -> bool`` on the requested values. Parameters outside the space keep
    their defaults (or the ``fixed`` values). Every combination is resolved (``resolve``: a
    ``ValueError`` drops it) and pruned by ``supports()``; combinations that resolve to the same
    concrete parameters are measured once (the first, in declaration order, is kept). Each returned
    dict holds the requested values (what a row records as ``requested_params``)."""
    import itertools

    space = dict(phase.space if space is None else space)
    where = space.pop("where", None)
    fixed = dict(fixed or {})
    names = [k for k in space if k not in fixed]
    grids = [expand_values(space[k]) for k in names]
    out, seen = [], set()
    combos = [dict(fixed)] + [{**fixed, **dict(zip(names, vals))} for vals in itertools.product(*grids)]
    for req in combos:
        try:
            checked = phase.resolve_params(req)
            if where is not None and not where(problem, checked):
                continue
            if phase.supports(problem, **checked) is not None:
                continue
            concrete = phase.resolve(problem, checked)
        except (ValueError, TypeError):
            continue
        key = tuple(sorted((k, repr(v)) for k, v in concrete.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(req)
    return out


_DISCOVERED = False


def load_all():
    """Import every phase module of the package (the backward family too), then (once) the phases found outside
    it (:mod:`numba_attn.phases.discovery`: ``$NUMBA_ATTN_PHASES``, the ``numba_attn.phases`` entry points)."""
    global _DISCOVERED
    from numba_attn import phases  # (imports every phase module)

    if not _DISCOVERED and getattr(phases, "LOADED", False):
        _DISCOVERED = True
        import numba_attn.phases.backward  # noqa: F401  (its modules; a failure goes to phases.BROKEN)
        from numba_attn.phases import discovery

        discovery.load_discovered(phases.BROKEN, _REGISTRY)


BACKWARD = "backward"  # the kind of the phases that compute gradients (numba_attn.attention_backward)


def list_phases(kind: str | None = None) -> list[Phase]:
    """Registered phases in roadmap order: the forward ones (every kind but ``"backward"``, whose launches
    take other arrays) when ``kind`` is None, one ``kind`` (``"backward"`` included), or ``"all"``."""
    load_all()
    out = sorted(_REGISTRY.values(), key=lambda p: (p.order, p.name))
    if kind == "all":
        return out
    return [p for p in out if p.kind == kind or (kind is None and p.kind != BACKWARD)]


def get_phase(name: str) -> Phase:
    load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPhaseError(name, [p.name for p in list_phases("all")]) from None


def registered(name: str) -> Phase | None:
    """The phase registered under ``name`` now, or None (nothing is loaded: a cheap test for callers that
    keep a phase, e.g. a cached plan)."""
    return _REGISTRY.get(name)


def registered_count() -> int:
    """How many phases are registered now (nothing is loaded)."""
    return len(_REGISTRY)


def register_if_absent(phase: Phase) -> Phase:
    """Register ``phase`` unless its name is taken; the phase registered under that name."""
    return _REGISTRY.setdefault(phase.name, phase)


def load_spec(spec: str, given: str | None = None):
    """``(module or None, phases)`` of a ``.py`` file, a directory of them or a module name, loaded into the
    registry (:func:`numba_attn.phases.discovery.load_spec`)."""
    load_all()
    from numba_attn.phases import discovery

    return discovery.load_spec(spec, _REGISTRY, given)


def unregister(name: str) -> Phase | None:
    """Remove a phase from the registry (returns it, or None if it was not there)."""
    return _REGISTRY.pop(name, None)


@contextlib.contextmanager
def temporary_phases(*phases: Phase):
    """Register ``phases`` for the duration of the block (names must be new); at its end the registry is
    as it was before, so phases registered inside the block (``numba_attn.load_phases``, ``register_phase``,
    ``register_variant``) are gone again too. For deliberately broken kernels that must never be listed
    outside a test or a notebook cell::

        with numba_attn.temporary_phases():
            bad = numba_attn.load_phases("wrong_variant.py")
            rows = numba_attn.run([p.name for p in bad], problems)
    """
    load_all()
    before = dict(_REGISTRY)
    try:
        for p in phases:
            if p.name in _REGISTRY:
                raise ValueError(f"phase {p.name!r} is already registered")
            _REGISTRY[p.name] = p
        yield list(phases)
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(before)
