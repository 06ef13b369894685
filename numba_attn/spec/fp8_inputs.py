"""Attention whose inputs arrive as e4m3 codes: the problem, its inputs and its reference.

``q`` (batch, heads, q_len, head_dim) and ``k``, ``v`` (batch, kv_heads, kv_len, head_dim) are ``float8_e4m3fn``
codes; each (batch, head) has a float32 scale, the value being ``code · scale`` (FlashAttention-3's
``descale_q/k/v``). The output is in the problem's ``dtype`` (float16 or bfloat16). A model that produces its
Q, K and V in FP8 (an FP8 projection, an FP8 KV cache) hands them over like this, so no quantization pass runs
before the attention kernel (:func:`numba_attn.attention_fp8`).

A problem's scales depend on its ``seed`` only (as a layer's scales are fixed while its inputs change), the codes
on the seed of :meth:`Fp8InputProblem.inputs`: each head has its own magnitude, and its codes use e4m3's range.
The reference is exact on the given codes: they are decoded to float64 and attended in float64, so what the check
measures is the kernel's own rounding (P in e4m3, the float32 accumulations, the output's rounding), not the
rounding of the inputs to e4m3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numba_attn.spec.problem import Problem
from numba_attn.spec.rand import normal

E4M3_MAX = 448.0  # the largest e4m3fn value
TYPICAL_MAX = 4.5  # about the largest |x| of a head's standard-normal values: the scale maps it near 448


@dataclass(frozen=True)
class Fp8InputProblem(Problem):
    """A :class:`Problem` whose q, k, v are e4m3 codes with one scale a (batch, head); ``dtype`` is the output's.
    ``input_dtype`` marks it in a row's problem (``Problem.from_dict`` gives this class back)."""

    input_dtype: str = "float8_e4m3"

    def __post_init__(self):
        super().__post_init__()
        from numba_attn.spec.errors import AttentionInputError

        if self.dtype not in ("float16", "bfloat16"):
            raise AttentionInputError(f"out_dtype must be float16 or bfloat16 for e4m3 inputs, got {self.dtype}")
        if self.input_dtype != "float8_e4m3":
            raise AttentionInputError(f"input_dtype must be float8_e4m3, got {self.input_dtype!r}")

    e4m3_inputs = True  # (a class attribute, not a field: what the phases' supports() read)

    @property
    def label(self) -> str:
        return super().label + " e4m3-in"

    def min_bytes(self) -> int:
        """Q, K, V read once as one-byte codes, O written once in ``dtype``."""
        q = self.batch * self.heads * self.q_len * self.head_dim
        kv = 2 * self.batch * self.kv_heads * self.kv_len * self.head_dim
        return q + kv + q * self.itemsize

    def scales(self):
        """(q_scale (batch, heads), k_scale, v_scale (batch, kv_heads)) float32, from ``seed``: a head of magnitude
        g (e^u, u uniform in [-1, 1]) has scale g·4.5/448."""
        rng = np.random.default_rng([self.seed, 0xE4])
        return tuple((np.exp(rng.uniform(-1.0, 1.0, (self.batch, n))) * (TYPICAL_MAX / E4M3_MAX)).astype(np.float32)
                     for n in (self.heads, self.kv_heads, self.kv_heads))

    def inputs(self, seed: int | None = None):
        """Seeded q, k, v codes (ml_dtypes float8_e4m3fn): standard normal values times 448/4.5, saturated at ±448,
        rounded to e4m3 (so ``code · scale`` is a head of magnitude g)."""
        import ml_dtypes

        rng = np.random.default_rng(self.seed if seed is None else seed)
        shapes = [(self.batch, self.heads, self.q_len, self.head_dim)] + \
            [(self.batch, self.kv_heads, self.kv_len, self.head_dim)] * 2
        return tuple(np.clip(normal(rng, s, np.float32) * np.float32(E4M3_MAX / TYPICAL_MAX), -E4M3_MAX, E4M3_MAX)
                     .astype(ml_dtypes.float8_e4m3fn) for s in shapes)

    def decoded(self, q, k, v):
        """The float64 values of the codes q, k, v under this problem's scales."""
        return tuple(decode(a, s) for a, s in zip((q, k, v), self.scales()))


def quantize_per_head(x):
    """(codes, scales): ``x`` (batch, heads, n, d) as e4m3fn codes of ``x / scale``, ``scale`` = amax/448 of each
    (batch, head) (1 for a head of zeros), float32 (batch, heads): what a caller holding values does first."""
    import ml_dtypes

    amax = np.abs(x).max(axis=(2, 3)) if x.size else np.zeros(x.shape[:2])
    scale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    codes = (x / scale[:, :, None, None]).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale


def decode(codes, scale) -> np.ndarray:
    """float64 values ``code · scale`` of e4m3fn ``codes`` (batch, heads, n, d) and ``scale`` (batch, heads)."""
    return np.asarray(codes).astype(np.float64) * np.asarray(scale, np.float64)[:, :, None, None]


def reference(problem, q, k, v, scales=None) -> np.ndarray:
    """The float64 attention of the decoded inputs (``spec.reference``'s, bottom-right causal); ``scales``: (q's,
    k's, v's), default the problem's."""
    from numba_attn.spec.reference import reference as attention_reference

    sq, sk, sv = problem.scales() if scales is None else scales
    return attention_reference(decode(q, sq), decode(k, sk), decode(v, sv), causal=problem.causal,
                               scale=problem.sm_scale)
