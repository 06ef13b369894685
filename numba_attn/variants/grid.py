"""A variant evaluated on the host over whole score matrices: the mask and the modified scores of one
(batch, head), for the float64 reference and the block mask's host twin. The functions are compiled for
the CPU (``numba.njit``) where numba can, small matrices (``SMALL`` scores) run the plain functions; the
loops are generated per number of arrays."""
from __future__ import annotations

import functools

import numpy as np

from numba_attn.variants.mods import Variant, host_arrays, host_version, python_function


@functools.cache
def _grid_loop(fn, n_aux: int, kind: str, use_numba: bool = True):
    """A loop calling ``fn`` at every (row, key) of ``out``: a mask into a bool array, a score function
    rewriting the scores in place."""
    args = "".join(f", a{j}" for j in range(n_aux))
    call = f"bool(fn(b, h, q0 + i, j{args}))" if kind == "mask" else f"fn(out[i, j], b, h, q0 + i, j{args})"
    src = (f"def grid(out, b, h, q0{args}):\n"
           f"    for i in range(out.shape[0]):\n"
           f"        for j in range(out.shape[1]):\n"
           f"            out[i, j] = {call}\n")
    return _loop(src, fn, use_numba)


SMALL = 4096  # scores of a (batch, head) up to which the plain Python loop beats compiling one


def _loop(src, fn, use_numba=True):
    import numba

    compiled = host_version(fn) if use_numba else python_function(fn)
    scope = {"fn": compiled}
    exec(compile(src, "<grid>", "exec"), scope)
    if isinstance(compiled, numba.core.registry.CPUDispatcher):
        return numba.njit(scope["grid"])
    return scope["grid"]


class HostVariant:
    """A variant with its arrays on the host, evaluated one (batch, head) at a time."""

    def __init__(self, variant: Variant):
        self.variant = variant
        aux = host_arrays(variant.aux)
        n_mask = len(variant.mask.aux) if variant.mask else 0
        self.mask_aux, self.score_aux = aux[:n_mask], aux[n_mask:]

    def visible(self, b: int, h: int, nq: int, nk: int) -> np.ndarray | None:
        """Which keys each query row sees, (nq, nk) bool; None without a mask function."""
        m = self.variant.mask
        if m is None:
            return None
        out = np.zeros((nq, nk), np.bool_)
        _grid_loop(python_function(m.fn), len(m.aux), "mask", nq * nk > SMALL)(
            out, b, h, nk - nq, *self.mask_aux)
        return out

    def modify(self, s: np.ndarray, b: int, h: int) -> np.ndarray:
        """The scores ``s`` (nq, nk, float64, natural units) after the score function, in place."""
        m = self.variant.score
        if m is not None:
            nq, nk = s.shape
            _grid_loop(python_function(m.fn), len(m.aux), "score", nq * nk > SMALL)(
                s, b, h, nk - nq, *self.score_aux)
        return s

    def derivative(self, s: np.ndarray, b: int, h: int) -> np.ndarray:
        """d score_mod / d score at the scores ``s`` (nq, nk, float64), in place (1 without a score function)."""
        m = self.variant.score
        if m is None:
            s[...] = 1.0
            return s
        nq, nk = s.shape
        _grid_loop(python_function(m.derivative), len(m.aux), "score", nq * nk > SMALL)(
            s, b, h, nk - nq, *self.score_aux)
        return s
