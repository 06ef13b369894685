"""Input validation with messages that name the argument and the allowed range.

Everything here runs before a kernel is compiled or launched.
"""
from __future__ import annotations

import difflib
import math

# The element types of q, k and v (``Problem.dtype``): defined here, where inputs are validated.
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
# The short names the tables print (fp32, fp16, bf16) and a few common spellings, accepted wherever a
# dtype is named (``--dtype``, ``Problem(dtype=...)``, ``check(dtype=...)``) and mapped to the canonical names.
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32",
                 "fp16": "float16", "f16": "float16", "half": "float16",
                 "bf16": "bfloat16"}
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# The 8-bit formats of a paged KV cache (``PagedProblem.kv_dtype``) and their short names
KV_DTYPE_ALIASES = {"fp8": "float8_e4m3", "e4m3": "float8_e4m3", "fp8_e4m3": "float8_e4m3",
                    "float8_e4m3fn": "float8_e4m3", "i8": "int8"}


def dtype_choices() -> str:
    """The accepted dtype names, each with its short name: ``float32 (fp32), float16 (fp16), bfloat16 (bf16)``."""
    return ", ".join(f"{d} ({SHORT_DTYPE[d]})" for d in SUPPORTED_DTYPES)


def canonical_dtype(name, what: str = "dtype") -> str:
    """``name`` (a canonical name, a short one such as ``fp16``, any case, or a NumPy dtype / type such as
    ``np.float16``) as its canonical name (``float16``); anything else raises :class:`AttentionInputError`
    naming ``what`` and listing both spellings."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key in SUPPORTED_DTYPES:
            return key
        if key in DTYPE_ALIASES:
            return DTYPE_ALIASES[key]
    elif name is not None:
        try:
            import numpy as np

            key = np.dtype(name).name
        except (TypeError, ValueError):
            key = None
        if key in SUPPORTED_DTYPES:
            return key
    raise AttentionInputError(f"{what} must be one of {dtype_choices()}, got {name!r}")


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
    _positive_int("batch", p.batch)
    _positive_int("heads", p.heads)
    _positive_int("q_len", p.q_len, 0)
    _positive_int("kv_len", p.kv_len, 0)
    _positive_int("head_dim", p.head_dim)
    _positive_int("kv_heads", p.kv_heads)
    if p.heads % p.kv_heads:
        raise AttentionInputError(
            f"heads ({p.heads}) must be a multiple of kv_heads ({p.kv_heads}) for grouped-query attention")
    if p.dtype not in SUPPORTED_DTYPES:
        raise AttentionInputError(f"dtype must be one of {dtype_choices()}, got {p.dtype!r}")
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



def _describe(a) -> str:
    if hasattr(a, "shape"):
        return f"shape {tuple(a.shape)}"
    return type(a).__name__


def check_arrays(q, k, v) -> None:
    """Everything about q, k, v that can be wrong before a Problem exists:
    array-ness, rank, dtype, matching shapes. Raises :class:`AttentionInputError`
    naming the argument and what is allowed."""
    import numpy as np

    for name, a in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            raise AttentionInputError(
                f"{name} must be a NumPy array or a numba device array (or a PyTorch tensor); got {type(a).__name__}")
        if len(a.shape) != 4:
            raise AttentionInputError(
                f"{name} must be a 4-D array (batch, heads, length, head_dim); got {_describe(a)}")
    names = [np.dtype(a.dtype).name for a in (q, k, v)]  # (once each: a dtype's name is not free)
    for name, dt in zip("qkv", names):
        if dt not in SUPPORTED_DTYPES:
            hint = " (convert with .astype(np.float32))" if dt in ("float64", "int32", "int64") else ""
            raise AttentionInputError(f"{name} has dtype {dt}; supported dtypes: {', '.join(SUPPORTED_DTYPES)}{hint}")
    if len(set(names)) != 1:
        raise AttentionInputError(f"q, k and v must share one dtype; got q {names[0]}, k {names[1]}, v {names[2]}")
    B, H, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Bk != B:
        raise AttentionInputError(f"q and k must have the same batch size (dimension 0); got {B} and {Bk}")
    if Dk != D:
        raise AttentionInputError(f"q and k must have the same head_dim (dimension 3); got {D} and {Dk}")
    if D < 1:
        raise AttentionInputError(f"head_dim (dimension 3 of q, k, v) must be >= 1; got {D}")
    if Hkv == 0 and H > 0:
        raise AttentionInputError(f"k and v have 0 heads but q has {H}: every query head needs a key/value head")
    if Hkv > 0 and H % Hkv:
        raise AttentionInputError(f"q heads ({H}) must be a multiple of k/v heads ({Hkv}) "
                                  f"(grouped-query attention: query head h reads k/v head h // (H // Hkv))")
    if Nk == 0 and B * H * Nq > 0:
        raise AttentionInputError("kv_len (dimension 2 of k and v) must be >= 1 when there are queries: "
                                  "the softmax over zero keys is undefined")


def check_finite(name, a) -> None:
    """Raise naming the array and the first NaN/Inf element (``nonfinite='raise'``)."""
    import numpy as np

    host = a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(host.astype(np.float32))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AttentionInputError(f"{name} contains {int(bad.sum())} NaN/Inf value(s), the first at {idx} "
                                  f"({host[idx]}); nonfinite='raise' refuses them (the default 'propagate' "
                                  f"returns NaN where the float64 reference does)")


# -- scalar arguments: one rule each, shared by attention(), the registry and the CLI ------------


def check_bool(name, value) -> bool:
    """``value`` as a bool: True/False (NumPy's bool too) or the integers 0 and 1. Strings such as
    ``"False"`` are refused (``bool("False")`` is True: a silent causal mask)."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise AttentionInputError(f"{name} must be a bool (True or False); got {value!r}")


def check_int(name, value, minimum=None, maximum=None) -> int:
    """``value`` as an int in [minimum, maximum]; integral floats are accepted, anything else
    (strings, None, 16.5, bools) is refused naming ``name`` and the allowed range."""
    import numpy as np

    allowed = "an integer" + (f" >= {minimum}" if minimum is not None and maximum is None else "") + \
        (f" in [{minimum}, {maximum}]" if minimum is not None and maximum is not None else "")
    if isinstance(value, (bool, np.bool_)) and not (minimum == 0 and maximum == 1):
        raise AttentionInputError(f"{name} must be {allowed}; got {value!r}")
    if isinstance(value, (int, np.integer)):
        out = int(value)
    elif isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        out = int(value)
    else:
        raise AttentionInputError(f"{name} must be {allowed}; got {value!r}")
    if (minimum is not None and out < minimum) or (maximum is not None and out > maximum):
        raise AttentionInputError(f"{name} must be {allowed}; got {out}")
    return out


def check_positive_float(name, value, allow_zero=False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``allow_zero``)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = float("nan")
    if isinstance(value, bool) or not math.isfinite(out) or out < 0 or (out == 0 and not allow_zero):
        raise AttentionInputError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0; got {value!r}")
    return out


def parse_param_value(text: str):
    """A phase parameter's value as given on a command line (``--param``, ``--space``): ``True``/``False``
    (any case) as a bool, an integer, a float, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_seeds(text: str) -> tuple:
    """``--seeds``: comma-separated integers >= 0 (NumPy seeds), at least one."""
    try:
        seeds = tuple(int(s) for s in str(text).split(",") if s.strip())
    except ValueError:
        raise AttentionInputError(f"--seeds {text!r}: expected comma-separated integers >= 0, e.g. 1,2") from None
    if not seeds:
        raise AttentionInputError("--seeds: give at least one seed (integers >= 0, e.g. 1,2)")
    bad = [s for s in seeds if s < 0]
    if bad:
        raise AttentionInputError(f"--seeds {text!r}: seeds must be integers >= 0; got {bad[0]}")
    return seeds


class ResultsFileError(ValueError):
    """A results file that cannot be read or written: the message names the file (and the line)."""

    def __init__(self, path, why, line: int | None = None):
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {why}")
        self.path, self.line = path, line
