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

import numpy as np

from numba_attn.spec.problem import E4M3_MAX, Fp8InputProblem, decode_e4m3 as decode  # noqa: F401  (re-exported)

def quantize_per_head(x):
    """(codes, scales): ``x`` (batch, heads, n, d) as e4m3fn codes of ``x / scale``, ``scale`` = amax/448 of each
    (batch, head) (1 for a head of zeros), float32 (batch, heads): what a caller holding values does first."""
    import ml_dtypes

    amax = np.abs(x).max(axis=(2, 3)) if x.size else np.zeros(x.shape[:2])
    scale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    codes = (x / scale[:, :, None, None]).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale


def reference(problem, q, k, v, scales=None) -> np.ndarray:
    """The float64 attention of the decoded inputs (``spec.reference``'s, bottom-right causal); ``scales``: (q's,
    k's, v's), default the problem's."""
    from numba_attn.spec.reference import reference as attention_reference

    sq, sk, sv = problem.scales() if scales is None else scales
    return attention_reference(decode(q, sq), decode(k, sk), decode(v, sv), causal=problem.causal,
                               scale=problem.sm_scale)
