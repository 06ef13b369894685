"""Attention whose inputs arrive as e4m3 codes: the problem, its inputs and its reference.

``q`` (batch, heads, q_len, head_dim) and ``k``, ``v`` (batch, kv_heads, kv_len, head_dim) are ``float8_e4m3fn``
codes; each (batch, head) has a float32 scale, the value being ``code · scale`` (FlashAttention-3's
``descale_q/k/v``). The output is in the problem's ``dtype`` (float16 or bfloat16). A model that produces its
Q, K and V in FP8 (an FP8 projection, an FP8 KV cache) hands them over like this, so no quantization pass runs
before the attention kernel (:func:`numba_attn.attention_fp8`).

The reference is exact on the given codes: the inputs are decoded to float64 and attended in float64, so what
the check measures is the kernel's own rounding (P in e4m3, the float32 accumulations, the output's rounding),
not the rounding of the inputs to e4m3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numba_attn.spec.problem import Problem

E4M3_MAX = 448.0  # the largest e4m3fn value


@dataclass(frozen=True)
class Fp8InputProblem(Problem):
    """A :class:`Problem` whose q, k, v are e4m3 codes with one scale a (batch, head); ``dtype`` is the output's."""

    e4m3_inputs = True  # (a class attribute, not a field: the phases' supports() read it)

    def __post_init__(self):
        super().__post_init__()
        from numba_attn.spec.errors import AttentionInputError

        if self.dtype not in ("float16", "bfloat16"):
            raise AttentionInputError(f"out_dtype must be float16 or bfloat16 for e4m3 inputs, got {self.dtype}")

    @property
    def label(self) -> str:
        return super().label + " e4m3-in"

    def inputs(self, seed: int | None = None):
        """Seeded ``(q, k, v, q_scale, k_scale, v_scale)``: standard normal values quantized per (batch, head) to
        e4m3 codes (ml_dtypes), the scales amax/448, float32 of shape (batch, heads) and (batch, kv_heads)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        out = []
        for heads, n in ((self.heads, self.q_len), (self.kv_heads, self.kv_len), (self.kv_heads, self.kv_len)):
            out.append(quantize_per_head(rng.standard_normal((self.batch, heads, n, self.head_dim))))
        (q, sq), (k, sk), (v, sv) = out
        return q, k, v, sq, sk, sv


def quantize_per_head(x):
    """(codes, scales): ``x`` (batch, heads, n, d) as e4m3fn codes of ``x / scale``, ``scale`` = amax/448 of each
    (batch, head) (1 for a head of zeros), float32 (batch, heads)."""
    import ml_dtypes

    amax = np.abs(x).max(axis=(2, 3)) if x.size else np.zeros(x.shape[:2])
    scale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    codes = (x / scale[:, :, None, None]).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale


def decode(codes, scale) -> np.ndarray:
    """float64 values ``code · scale`` of e4m3fn ``codes`` (batch, heads, n, d) and ``scale`` (batch, heads)."""
    return np.asarray(codes).astype(np.float64) * np.asarray(scale, np.float64)[:, :, None, None]


def reference(problem, q, k, v, sq, sk, sv) -> np.ndarray:
    """The float64 attention of the decoded inputs (``spec.reference``'s, bottom-right causal)."""
    from numba_attn.spec.reference import reference as attention_reference

    return attention_reference(decode(q, sq), decode(k, sk), decode(v, sv), causal=problem.causal,
                               scale=problem.sm_scale)
