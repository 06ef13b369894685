"""Mask and score functions, written in Python, and the variant a kernel compiles them into.

A **mask function** says whether query ``q_idx`` may see key ``kv_idx``; a **score function** rewrites the
score ``s = q·k·scale`` (natural units, before the softmax)::

    mask_mod(b, h, q_idx, kv_idx, *aux) -> bool
    score_mod(score, b, h, q_idx, kv_idx, *aux) -> score

``b`` is the batch (or varlen sequence) index, ``h`` the query head, ``q_idx``/``kv_idx`` positions in the
sequence with the queries aligned bottom-right (``q_idx = i + Nk - Nq``: the row index when ``Nq == Nk``, the
last positions at decode), so one window function is right in prefill and in decode over a cache. ``aux``
are arrays (document ids, lengths, slopes) that reach the function as extra arguments: their values change
without a recompilation.

A :class:`Mod` is a function with the arrays it reads; a :class:`Variant` is at most one mask and one score
``Mod``. Kernels take the variant's arrays as one tuple argument ``mods`` (``()`` for plain attention, which
compiles to the same code as before) and call :meth:`Variant.device_visible` and
:meth:`Variant.device_score`, generated here with each function's arrays picked out of the tuple at compile
time.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass, field

import numpy as np

_ids = itertools.count()


class VariantError(ValueError):
    """A mask or score function that cannot be used; the message names the function."""


def python_function(fn):
    """The plain Python function behind ``fn`` (a numba device function keeps it in ``py_func``)."""
    return getattr(fn, "py_func", fn)


def fn_name(fn) -> str:
    f = python_function(fn)
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


def _arity(fn, what: str) -> int | None:
    """Positional parameters of ``fn`` (None for ``*args``)."""
    try:
        sig = inspect.signature(python_function(fn))
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    if any(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) and p.default is p.empty for p in params):
        raise VariantError(f"{what} {fn_name(fn)} has keyword-only parameters; it is called with positions only")
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


@dataclass(frozen=True, eq=False)
class Mod:
    """A mask function (``kind="mask"``) or score function (``kind="score"``) and the arrays it reads.

    ``aux``: arrays passed after the index arguments, in order. ``name``: how tables and labels name it
    (``window256``). ``params``: the numbers the name stands for (a built-in's window, cap, ...; of
    :func:`and_masks` / :func:`or_masks`: ``parts``, ``op`` and the part Mods, ``mods``).
    ``derivative``: a score function's d/d score, ``derivative(score, b, h, q_idx, kv_idx, *aux)`` (the
    backward needs it; the built-in score functions carry theirs)."""

    fn: object
    kind: str
    aux: tuple = ()
    name: str = ""
    params: dict = field(default_factory=dict)
    depends: str = "bh"  # which of the batch (b) and head (h) indices it reads: the block mask's dimensions
    # a score function's derivative d fn / d score, called as fn is (the backward's chain rule); None: unknown
    derivative: object = None

    def __post_init__(self):
        if self.kind not in ("mask", "score"):
            raise VariantError(f"Mod kind must be 'mask' or 'score', not {self.kind!r}")
        if not callable(self.fn):
            raise VariantError(f"{self.kind}_mod must be callable, got {type(self.fn).__name__}")
        object.__setattr__(self, "aux", tuple(self.aux))
        if not self.name:
            object.__setattr__(self, "name", fn_name(self.fn))
        n = _arity(self.fn, f"{self.kind}_mod")
        want = (4 if self.kind == "mask" else 5) + len(self.aux)
        if n is not None and n != want:
            head = "b, h, q_idx, kv_idx" if self.kind == "mask" else "score, b, h, q_idx, kv_idx"
            raise VariantError(
                f"{self.kind}_mod {fn_name(self.fn)} takes {n} arguments; with {len(self.aux)} aux array(s) it is "
                f"called as {self.kind}_mod({head}{', aux...' if self.aux else ''}) ({want} arguments)")

    def with_aux(self, aux) -> "Mod":
        return Mod(self.fn, self.kind, tuple(aux), self.name, self.params, self.depends, self.derivative)


def as_mod(obj, kind: str, aux=()) -> Mod | None:
    """``obj`` (None, a :class:`Mod`, or a function) as a Mod of ``kind``; a plain function reads ``aux``."""
    if obj is None:
        return None
    if isinstance(obj, Mod):
        if obj.kind != kind:
            raise VariantError(f"{obj.name} is a {obj.kind} function, passed as {kind}_mod")
        return obj
    return Mod(obj, kind, tuple(aux))


def _combine(mods, op: str, name: str) -> Mod:
    mods = [as_mod(m, "mask") for m in mods]
    if not mods:
        raise VariantError(f"{name}() needs at least one mask function")
    args, calls, k = [], [], 0
    for i, m in enumerate(mods):
        mine = [f"a{k + j}" for j in range(len(m.aux))]
        k += len(m.aux)
        args += mine
        calls.append(f"bool(m{i}(b, h, q_idx, kv_idx{''.join(', ' + a for a in mine)}))")
    src = f"def combined(b, h, q_idx, kv_idx{''.join(', ' + a for a in args)}):\n    return {f' {op} '.join(calls)}\n"
    combined = _generated(src, "combined", {f"m{i}": python_function(m.fn) for i, m in enumerate(mods)})
    combined.__qualname__ = f"{name}({', '.join(m.name for m in mods)})"
    aux = tuple(a for m in mods for a in m.aux)
    depends = "".join(c for c in "bh" if any(c in m.depends for m in mods))
    # the parts themselves (with the arrays they had), for readers of a combination (library.builtin)
    params = {"parts": [m.name for m in mods], "op": op, "mods": tuple(mods)}
    return Mod(combined, "mask", aux, combined.__qualname__, params, depends)


def and_masks(*mods) -> Mod:
    """A key is visible when every mask says so."""
    return _combine(mods, "and", "and_masks")


def or_masks(*mods) -> Mod:
    """A key is visible when any mask says so."""
    return _combine(mods, "or", "or_masks")


def _generated(src: str, name: str, parts: dict):
    """The function ``name`` defined by ``src`` calling the functions ``parts``. It remembers its source, so
    that :func:`device_version` and :func:`host_version` rebuild it over compiled parts."""
    scope = dict(parts)
    exec(compile(src, f"<{name}>", "exec"), scope)
    fn = scope[name]
    fn._numba_attn_source = (src, name, dict(parts))
    return fn


def _rebuilt(fn, compile_part, compile_whole):
    rec = getattr(fn, "_numba_attn_source", None)
    if rec is None:
        return compile_whole(fn)
    src, name, parts = rec
    scope = {k: compile_part(v) if inspect.isfunction(python_function(v)) else v for k, v in parts.items()}
    exec(compile(src, f"<{name}>", "exec"), scope)
    return compile_whole(scope[name])


@functools.cache
def device_version(fn):
    """``fn`` (a plain function, or one generated here) as a device function, its parts compiled too."""
    from numba_attn.gpu.jit import device

    def whole(f):
        try:
            return device(f)
        except Exception as e:  # noqa: BLE001 - numba raises many kinds
            raise VariantError(f"cannot compile {fn_name(fn)} as a device function: {e}") from e

    return _rebuilt(python_function(fn), device_version, whole)


@functools.cache
def host_version(fn):
    """``fn`` compiled for the CPU (``numba.njit``) for the reference and the block mask; the plain
    function where numba cannot compile it (it still gives the same answers, slower)."""
    import numba

    def whole(f):
        try:
            return numba.njit(f)
        except Exception:  # noqa: BLE001
            return f

    return _rebuilt(python_function(fn), host_version, whole)


@dataclass(frozen=True, eq=False)
class Variant:
    """At most one mask and one score function: what a kernel compiles in. ``aux`` is the tuple kernels
    receive (the mask's arrays, then the score's)."""

    mask: Mod | None = None
    score: Mod | None = None
    key: int = field(default_factory=lambda: next(_ids))

    @property
    def aux(self) -> tuple:
        return (self.mask.aux if self.mask else ()) + (self.score.aux if self.score else ())

    @property
    def has_mask(self) -> bool:
        return self.mask is not None

    @property
    def name(self) -> str:
        return "+".join(m.name for m in (self.mask, self.score) if m is not None)

    def signature(self) -> tuple:
        """What compiled code depends on: the functions and how many arrays each reads (not their values)."""
        return tuple((python_function(m.fn), len(m.aux)) if m else None for m in (self.mask, self.score))

    def device_visible(self):
        return visible_stage(self.signature()[0])

    def device_score(self):
        return score_stage(self.signature()[1], len(self.mask.aux) if self.mask else 0)


def _stage(name: str, params: str, call: str, fn, first: int, n: int):
    """The device function ``name(params)`` returning ``call`` with the user's function ``fn`` reading the
    kernel's ``mods[first:first + n]``."""
    from numba import float32

    args = "".join(f", mods[{first + j}]" for j in range(n))
    src = f"def {name}({params}, mods):\n    return {call.replace('ARRAYS', args)}\n"
    return device_version(_generated(src, name, {"user": fn, "float32": float32}))


@functools.cache
def visible_stage(mask_sig):
    """``visible(b, h, q_idx, kv_idx, mods) -> bool``: the mask function on its arrays (the first in ``mods``)."""
    fn, n = mask_sig
    return _stage("visible", "b, h, q_idx, kv_idx", "bool(user(b, h, q_idx, kv_idx ARRAYS))", fn, 0, n)


@functools.cache
def score_stage(score_sig, offset: int):
    """``modified(s, b, h, q_idx, kv_idx, mods) -> s``: the score function on its arrays (after the mask's)."""
    fn, n = score_sig
    call = "float32(user(s, b, h, q_idx, kv_idx ARRAYS))"
    return _stage("modified", "s, b, h, q_idx, kv_idx", call, fn, offset, n)


def make_variant(mask_mod=None, score_mod=None, aux=()) -> Variant | None:
    """The variant of ``attention(mask_mod=, score_mod=, aux=)``: None for plain attention. A plain function
    reads ``aux``; a :class:`Mod` (a built-in) brings its own arrays."""
    if mask_mod is None and score_mod is None:
        if aux:
            raise VariantError("aux= given without a mask_mod or score_mod to read it")
        return None
    aux = tuple(aux) if aux is not None else ()
    return Variant(as_mod(mask_mod, "mask", aux), as_mod(score_mod, "score", aux))


def host_arrays(aux) -> tuple:
    """``aux`` as NumPy arrays (from NumPy, device arrays or tensors) for the reference and the checks."""
    out = []
    for a in aux:
        if hasattr(a, "copy_to_host"):
            a = a.copy_to_host()
        elif hasattr(a, "detach"):
            a = a.detach().cpu().numpy()
        out.append(np.asarray(a))
    return tuple(out)


def probe(variant: Variant, batch: int, heads: int, nq: int, nk: int) -> None:
    """Call each function once on the host at the first position of each batch and head; raises
    :class:`VariantError` naming the function when it raises or when a mask returns a non-bool."""
    aux_all = host_arrays(variant.aux)
    off = 0
    for m in (variant.mask, variant.score):
        if m is None:
            continue
        aux = aux_all[off:off + len(m.aux)]
        off += len(m.aux)
        fn = python_function(m.fn)
        for b, h in {(0, 0), (batch - 1, heads - 1)}:
            q, kv = nk - 1, 0
            try:
                r = fn(b, h, q, kv, *aux) if m.kind == "mask" else fn(np.float32(0.5), b, h, q, kv, *aux)
            except Exception as e:  # noqa: BLE001 - the user's function
                raise VariantError(f"{m.kind}_mod {m.name} raised {type(e).__name__} at b={b}, h={h}, "
                                   f"q_idx={q}, kv_idx={kv}: {e}") from e
            if m.kind == "mask" and not isinstance(r, (bool, np.bool_)):
                raise VariantError(f"mask_mod {m.name} returned {type(r).__name__} ({r!r}), not a bool, at "
                                   f"b={b}, h={h}, q_idx={q}, kv_idx={kv}")
            if m.kind == "score" and not isinstance(r, (float, int, np.floating, np.integer)):
                raise VariantError(f"score_mod {m.name} returned {type(r).__name__}, not a number")
