"""float64 NumPy reference and the correctness gate.

The reference upcasts the *stored* inputs (already rounded to the problem's
dtype) to float64, so a phase is only charged for its own arithmetic and the
rounding of its output, not for the rounding of its inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Relative-error tolerance ‖out − ref‖ / ‖ref‖ by the precision a phase
# computes in (its storage dtype or its tensor-core input type, whichever is
# coarser). float32 arithmetic with fast exp lands near 1e-6; an fp16 output
# alone costs ~3e-4; P rounded to fp16/bf16 before PV costs more.
TOLERANCE = {
    "float32": 1e-4,
    "tf32": 3e-3,
    "float16": 4e-3,
    "bfloat16": 3e-2,
    "e4m3": 1e-1,  # FP8 (e4m3) inputs and P, 3 mantissa bits: 3.6-5.0e-2 measured on normal inputs (fp8_wgmma)
}

# Bit patterns written into the output before every run. A kernel that forgets
# an element leaves this exact NaN payload behind, which the check counts
# separately from NaNs a kernel computes.
POISON_BITS = {
    "float32": (np.uint32, 0x7FA5A5A5),
    "float16": (np.uint16, 0x7D5A),
    "bfloat16": (np.uint16, 0x7FA5),
}


def tolerance(dtype: str, precision: str | None = None) -> float:
    return max(TOLERANCE[dtype], TOLERANCE.get(precision or dtype, 0.0))


def poison(out: np.ndarray, dtype: str) -> np.ndarray:
    """Fill ``out`` (host array) with the poison pattern; returns it."""
    ut, bits = POISON_BITS[dtype]
    out.view(ut)[...] = bits
    return out


def poisoned_mask(out: np.ndarray, dtype: str) -> np.ndarray:
    ut, bits = POISON_BITS[dtype]
    return out.view(ut) == bits


def reference(q, k, v, *, causal=False, scale=None, return_lse=False, variant=None, sinks=None):
    """Attention in float64. q: (B, H, Nq, D); k, v: (B, Hkv, Nk, D).

    Causal masking is bottom-right aligned (query i sees keys j <= i + Nk - Nq).
    Rows that see no key (only possible without the causal check) are NaN.
    Computed one (batch, head) at a time so the score matrix stays small.

    ``variant`` (:class:`numba_attn.variants.Variant`): its score function rewrites the scaled scores, its
    mask function hides keys (with ``causal``, both apply); a row that sees no key is 0 (log-sum-exp -inf),
    as FlexAttention defines it.

    ``sinks`` (H,): per-head sink logits (gpt-oss, transformers' ``s_aux``): one more key of score ``sinks[h]``
    and value 0 in each row's softmax, so the output is scaled by ``1 / (1 + exp(sinks[h] - lse))`` (0 for a
    row that sees no key); the log-sum-exp returned is the keys' own, without the sink.
    """
    if sinks is not None:
        out, lse = reference(q, k, v, causal=causal, scale=scale, return_lse=True, variant=variant)
        sink = np.asarray(sinks, np.float64).reshape(1, -1, 1)
        with np.errstate(over="ignore", invalid="ignore"):
            factor = np.where(np.isneginf(lse), 0.0, 1.0 / (1.0 + np.exp(sink - lse)))
        out = np.where(factor[..., None] == 0.0, 0.0, out * factor[..., None])
        return (out, lse) if return_lse else out
    if variant is not None:
        return _variant_reference(q, k, v, causal, scale, return_lse, variant)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    out = np.empty((B, H, Nq, D), np.float64)
    lse = np.empty((B, H, Nq), np.float64)
    if causal:
        i = np.arange(Nq)[:, None]
        j = np.arange(Nk)[None, :]
        masked = j > i + (Nk - Nq)
    for b in range(B):
        for h in range(H):
            qh = q[b, h].astype(np.float64)
            kh = k[b, h // G].astype(np.float64)
            vh = v[b, h // G].astype(np.float64)
            s = (qh @ kh.T) * scale
            if causal:
                s[masked] = -np.inf
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                m = np.max(s, axis=1, keepdims=True) if Nk else np.full((Nq, 1), -np.inf)
                p = np.exp(s - m)
                l = p.sum(axis=1, keepdims=True)
                out[b, h] = _pv(p, vh, masked if causal else None) / l
                lse[b, h] = (m + np.log(l))[:, 0]
    return (out, lse) if return_lse else out


def _variant_reference(q, k, v, causal, scale, return_lse, variant):
    from numba_attn.variants.grid import HostVariant

    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    host = HostVariant(variant)
    out = np.empty((B, H, Nq, D), np.float64)
    lse = np.empty((B, H, Nq), np.float64)
    causal_hidden = (np.arange(Nk)[None, :] > np.arange(Nq)[:, None] + (Nk - Nq)) if causal else None
    for b in range(B):
        for h in range(H):
            qh = q[b, h].astype(np.float64)
            kh = k[b, h // G].astype(np.float64)
            vh = v[b, h // G].astype(np.float64)
            s = host.modify((qh @ kh.T) * scale, b, h)
            seen = host.visible(b, h, Nq, Nk)
            hidden = None if seen is None else ~seen
            if causal_hidden is not None:
                hidden = causal_hidden if hidden is None else hidden | causal_hidden
            if hidden is not None:
                s[hidden] = -np.inf
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                m = np.max(s, axis=1, keepdims=True) if Nk else np.full((Nq, 1), -np.inf)
                empty = ~np.isfinite(m) & (m < 0)  # rows that see no key
                m = np.where(empty, 0.0, m)
                p = np.exp(s - m)
                l = p.sum(axis=1, keepdims=True)
                o = _pv(p, vh, hidden) / np.where(empty, 1.0, l)
                out[b, h] = np.where(empty, 0.0, o)
                lse[b, h] = np.where(empty[:, 0], -np.inf, (m + np.log(l))[:, 0])
    return (out, lse) if return_lse else out


def _pv(p, vh, masked):
    """P V where a masked key contributes nothing, even a NaN/Inf value row.

    ``p @ v`` would multiply a masked key's zero weight by a NaN there (0 · NaN = NaN). Unmasked keys are
    multiplied as a kernel does, so a NaN/Inf value a query sees still propagates. (Kernels that multiply a
    masked key's zero weight inside a tile do put that NaN in the row: the check then fails, never passes;
    docs/input-checks.md lists them.)
    """
    bad = ~np.isfinite(vh)
    if masked is None or not bad.any():
        return p @ vh
    out = p @ np.where(bad, 0.0, vh)
    cols = np.flatnonzero(bad.any(axis=0))
    w = np.where(masked, 0.0, p)
    for d in cols:  # only columns holding a NaN/Inf: exact products over visible keys
        terms = np.where(masked, 0.0, w * vh[None, :, d])
        out[:, d] = terms.sum(axis=1)
    return out


@dataclass
class Check:
    """Verdict of comparing one output with the reference."""

    ok: bool
    rel_err: float
    max_abs_err: float
    tol: float
    unwritten: int = 0
    nonfinite: int = 0
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self):
        return {"ok": self.ok, "rel_err": self.rel_err, "max_abs_err": self.max_abs_err,
                "tol": self.tol, "unwritten": self.unwritten, "nonfinite": self.nonfinite,
                "reason": self.reason}


def usable_torch(device="cuda"):
    """torch, when it is importable and can compute on ``device`` (a CUDA device needs its CUDA); else None."""
    try:
        import torch

        if str(device).startswith("cuda") and not torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001
        return None
    return torch


def check(out, ref, *, dtype="float32", precision=None, tol=None) -> Check:
    """‖out − ref‖ / ‖ref‖ under the tolerance; NaN/Inf never pass; every element
    must have been written (the poison pattern must be gone). ``dtype``: a canonical or short name (fp16)."""
    from numba_attn.spec.errors import canonical_dtype

    if dtype not in TOLERANCE:
        dtype = canonical_dtype(dtype)
    tol = tolerance(dtype, precision) if tol is None else tol
    out = np.asarray(out)
    if out.shape != ref.shape:
        return Check(False, float("inf"), float("inf"), tol,
                     reason=f"output shape {out.shape} != expected {ref.shape}")
    unwritten = int(poisoned_mask(out, dtype).sum()) if dtype in POISON_BITS and out.dtype.itemsize in (2, 4) else 0
    with np.errstate(invalid="ignore", over="ignore"):
        o64 = out.astype(np.float64)
    ref_finite = np.isfinite(ref)
    bad = ~np.isfinite(o64) & ref_finite
    nonfinite = int(bad.sum()) - unwritten
    # where the reference itself is NaN/Inf (NaN inputs), the output must match it
    mismatch_special = int((~ref_finite & ~(np.isnan(o64) & np.isnan(ref)) & ~(o64 == ref)).sum())
    diff = np.where(ref_finite, o64 - ref, 0.0)
    denom = float(np.linalg.norm(np.where(ref_finite, ref, 0.0)))
    with np.errstate(invalid="ignore"):
        num = float(np.linalg.norm(np.where(np.isfinite(diff), diff, np.inf)))
    rel = num / denom if denom > 0 else (0.0 if num == 0 else float("inf"))
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    if not np.isfinite(max_abs):
        max_abs = float("inf")
    reasons = []
    if unwritten:
        reasons.append(f"{unwritten} of {out.size} output elements never written")
    if nonfinite > 0:
        reasons.append(f"{nonfinite} output elements NaN/Inf where the reference is finite")
    if mismatch_special:
        reasons.append(f"{mismatch_special} elements differ where the reference is NaN/Inf")
    if not (rel <= tol):
        reasons.append(f"relative error {rel:.3g} > tolerance {tol:.1g}")
    return Check(not reasons, rel, max_abs, tol, unwritten, max(nonfinite, 0), "; ".join(reasons))
