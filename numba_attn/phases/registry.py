"""The phase registry.

A phase is one step of the optimization roadmap: a host function that, given
a :class:`~numba_attn.spec.problem.Problem` and its tunable parameters, compiles
(or fetches from the cache) the kernel(s) it needs and returns a
:class:`Launch` that runs them on device arrays.

Register one with the decorator::

    @register_phase(
        name="smem_kv", order=2, title="K/V tiles in shared memory",
        parent="fused_rowwise",
        description="K and V tiles of Bc rows are staged in shared memory ...",
        lineage="FlashAttention-1 (Dao et al. 2022), Alg. 1 outer loop over K/V tiles",
        planned_speedup=3.0,
    )
    def smem_kv(problem, Br=64, Bc=64):
        ...
        return Launch(run, kernels=[kernel])

The keyword arguments of the function are the phase's tunable parameters and
their defaults. A default of 0 means "chosen for the problem": the phase's
``resolve(problem, **params)`` (passed to the decorator) returns every
parameter with a concrete value, once, before ``supports`` and the builder
see them; it must return a concrete value unchanged. :meth:`Phase.plan` puts
the parameters that ran in ``Launch.params`` and the runner records those. Tile sizes must reach the kernel as compile-time constants:
build kernels in a factory that closes over them and cache the factory
(``functools.cache``) so each configuration compiles once.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Callable

from numba_attn.gpu import backend  # noqa: F401  (chooses CUDA or the simulator before any phase imports numba)
from numba_attn.spec.errors import UnknownPhaseError

_REGISTRY: dict[str, "Phase"] = {}


@dataclass
class Launch:
    """What a phase returns for one problem: a callable that launches its
    kernel(s) on device arrays ``run(q, k, v, o, stream)``, and the compiled
    dispatchers, so the runner can report their resources."""

    run: Callable
    kernels: list = field(default_factory=list)
    workspace_bytes: int = 0
    notes: str = ""
    params: dict = field(default_factory=dict)  # the parameters that ran (automatic ones resolved)

    def __call__(self, q, k, v, o, stream=0):
        return self.run(q, k, v, o, stream)


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
    kind: str = "prefill"  # or "decode"
    precision: str | None = None  # compute precision when coarser than the storage dtype (e.g. "tf32")
    sim_params: dict = field(default_factory=dict)  # small tiles for simulator tests
    extra_supports: Callable | None = None
    resolver: Callable | None = None  # resolve(problem, **params) -> params with automatic values chosen
    module: str = ""

    def supports(self, problem, **params) -> str | None:
        """None when the phase can run ``problem``; otherwise the reason it cannot."""
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

    def _supports_base(self, problem) -> str | None:
        if problem.dtype not in self.dtypes:
            return f"dtype {problem.dtype} not supported (supports {', '.join(self.dtypes)})"
        if self.head_dims is not None and problem.head_dim not in self.head_dims:
            return (f"head_dim {problem.head_dim} not supported "
                    f"(supports {', '.join(map(str, self.head_dims))})")
        if problem.causal and not self.causal:
            return "causal masking not supported"
        return None

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
                raise ValueError(f"phase {self.name!r} has no parameter {key!r} "
                                 f"(parameters: {', '.join(p) or 'none'})")
            p[key] = type(p[key])(val) if p[key] is not None else val
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


def register_phase(*, name, order, title, parent, description, lineage, planned_speedup,
                   dtypes=("float32", "float16"), head_dims=None, causal=True, kind="prefill",
                   precision=None, sim_params=None, supports=None, resolve=None):
    """Decorator registering a phase builder (see the module docstring)."""

    def deco(fn):
        sig = inspect.signature(fn)
        params = {k: p.default for k, p in list(sig.parameters.items())[1:]
                  if p.default is not inspect.Parameter.empty}
        if name in _REGISTRY and _REGISTRY[name].module != fn.__module__:
            raise ValueError(f"phase {name!r} registered twice ({_REGISTRY[name].module}, {fn.__module__})")
        _REGISTRY[name] = Phase(
            name=name, order=order, title=title, parent=parent, description=inspect.cleandoc(description),
            lineage=lineage, planned_speedup=planned_speedup, build=fn, params=params,
            dtypes=tuple(dtypes), head_dims=tuple(head_dims) if head_dims else None, causal=causal,
            kind=kind, precision=precision, sim_params=dict(sim_params or {}), extra_supports=supports,
            resolver=resolve, module=fn.__module__)
        return fn

    return deco


def _load_all():
    from numba_attn import phases  # noqa: F401  (imports every phase module)


def list_phases(kind: str | None = None) -> list[Phase]:
    """Registered phases in roadmap order (optionally only one ``kind``)."""
    _load_all()
    out = sorted(_REGISTRY.values(), key=lambda p: (p.order, p.name))
    return [p for p in out if kind is None or p.kind == kind]


def get_phase(name: str) -> Phase:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPhaseError(name, [p.name for p in list_phases()]) from None


def unregister(name: str) -> Phase | None:
    """Remove a phase from the registry (returns it, or None if it was not there)."""
    return _REGISTRY.pop(name, None)


@contextlib.contextmanager
def temporary_phases(*phases: Phase):
    """Register ``phases`` for the duration of the block (names must be new);
    used by tests for deliberately broken kernels that must never be listed
    outside them."""
    _load_all()
    added = []
    try:
        for p in phases:
            if p.name in _REGISTRY:
                raise ValueError(f"phase {p.name!r} is already registered")
            _REGISTRY[p.name] = p
            added.append(p.name)
        yield list(phases)
    finally:
        for name in added:
            _REGISTRY.pop(name, None)
