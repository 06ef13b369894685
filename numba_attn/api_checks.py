"""The checks of arguments that ``attention()``, ``explain()``, ``decode_paged()`` and ``attention_varlen()``
share, before anything is compiled, allocated or launched (:mod:`numba_attn.api`)."""
from __future__ import annotations

import numpy as np

from numba_attn.array_kinds import is_device_array
from numba_attn.phases.registry import get_phase
from numba_attn.spec.errors import AttentionInputError, check_arrays
from numba_attn.spec.problem import Problem


def problem_from_arrays(q, k, v, *, causal=False, scale=None, checked: bool = False) -> Problem:
    """The Problem of q, k, v (``checked``: :func:`check_arrays` has already passed them)."""
    if not checked:
        check_arrays(q, k, v)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    return Problem(batch=B, heads=H, q_len=Nq, kv_len=Nk, head_dim=D, causal=bool(causal),
                   dtype=np.dtype(q.dtype).name, scale=scale, kv_heads=Hkv)


def phase_arg(phase):
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


def check_host_memory(problem: Problem, arrays) -> None:
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


def variant_arg(mask_mod, score_mod, aux):
    """The call's variant (:func:`numba_attn.variants.mods.make_variant`); None without mask_mod and score_mod."""
    from numba_attn.variants.mods import VariantError, make_variant

    try:
        return make_variant(mask_mod, score_mod, () if aux is None else aux)
    except VariantError as e:
        raise AttentionInputError(str(e)) from e


def probe_variant(variant, batch, heads, q_len, kv_len) -> None:
    """Call the variant's functions once on the problem's indices: one that raises or returns no bool is named."""
    from numba_attn.variants.mods import VariantError, probe

    try:
        probe(variant, batch, heads, q_len, kv_len)
    except VariantError as e:
        raise AttentionInputError(str(e)) from e


def sinks_arg(sinks, heads: int):
    """The call's sink logits (not None) as a float32 host array (H,), checked."""
    from numba_attn.variants.sinks import check_sinks

    try:
        return check_sinks(sinks, heads)
    except ValueError as e:
        raise AttentionInputError(str(e)) from e


class SlowSimulationWarning(UserWarning):
    """``attention()`` in the CUDA simulator on a problem estimated to take over a minute (it still runs:
    ``warnings.simplefilter("error", SlowSimulationWarning)`` makes it an error instead)."""


def warn_if_slow(ph, problem):
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


def layout_plan(names, layout: str, refusal: str, defaults, problem, params: dict, cache):
    """(phase, Launch) of the first of ``names`` (phases of ``layout``) that supports ``problem``, from the
    bounded plan cache ``cache`` (16 plans); a phase of another layout or none that runs the problem is
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
    variant = getattr(problem, "variant", None)  # (a variant by its functions: its arrays come per call)
    key = (ph.name, problem if variant is None else (problem.replace(variant=None), variant.signature()),
           tuple(sorted(params.items())))
    launch = cache.get(key)
    if launch is None:
        launch = cache[key] = ph.plan(problem, **params)
        while len(cache) > 16:
            cache.popitem(last=False)
    return ph, launch
