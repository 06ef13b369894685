"""Input validation with messages that name the argument and the allowed range.

Everything here runs before a kernel is compiled or launched.
"""
from __future__ import annotations

import difflib
import math


class AttentionInputError(ValueError):
    """Bad input to ``attention()``, the runner or the CLI."""


class UnknownPhaseError(KeyError):
    def __init__(self, name, known):
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(f"unknown phase {name!r}.{hint} Known phases: {', '.join(known)}")
        self.name = name

    def __str__(self):  # KeyError quotes its message otherwise
        return self.args[0]


def _positive_int(name, value, minimum=1):
    if not isinstance(value, (int,)) or isinstance(value, bool):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise AttentionInputError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if value < minimum:
        raise AttentionInputError(f"{name} must be >= {minimum}, got {value}")


def validate_problem(p) -> None:
    from .problem import DTYPES

    _positive_int("batch", p.batch)
    _positive_int("heads", p.heads)
    _positive_int("q_len", p.q_len, 0)
    _positive_int("kv_len", p.kv_len, 0)
    _positive_int("head_dim", p.head_dim)
    _positive_int("kv_heads", p.kv_heads)
    if p.heads % p.kv_heads:
        raise AttentionInputError(
            f"heads ({p.heads}) must be a multiple of kv_heads ({p.kv_heads}) for grouped-query attention")
    if p.dtype not in DTYPES:
        raise AttentionInputError(f"dtype must be one of {', '.join(DTYPES)}, got {p.dtype!r}")
    if p.scale is not None:
        try:
            s = float(p.scale)
        except (TypeError, ValueError):
            raise AttentionInputError(f"scale must be a positive finite number, got {p.scale!r}") from None
        if not math.isfinite(s) or s <= 0:
            raise AttentionInputError(f"scale must be a positive finite number, got {p.scale!r}")
    if p.causal and p.q_len > p.kv_len:
        raise AttentionInputError(
            f"causal attention needs q_len <= kv_len (bottom-right alignment would leave the first "
            f"{p.q_len - p.kv_len} queries with no key); got q_len={p.q_len}, kv_len={p.kv_len}")
