"""The varlen layout (a packed ragged batch): input checks, the float64 reference, a problem's lengths and inputs.

Layout (FlashAttention's ``flash_attn_varlen_func``): ``q`` (total_q, H, D); ``k``, ``v``
(total_k, Hkv, D); ``cu_seqlens_q``, ``cu_seqlens_k`` int32 (B + 1,), starting at 0,
non-decreasing, the last entry the total: sequence ``b`` has the queries at rows
``cu_seqlens_q[b] … cu_seqlens_q[b + 1] − 1`` of ``q`` and the keys at rows
``cu_seqlens_k[b] … cu_seqlens_k[b + 1] − 1`` of ``k`` and ``v``. The output is (total_q, H, D),
row for row like ``q``. ``Hkv`` < ``H`` is grouped-query attention as in the contiguous layout.

Causal: bottom-right aligned per sequence (FlashAttention ≥ 2.1): query ``i`` of a sequence
with ``Lq`` queries and ``Lk`` keys sees keys ``j <= i + Lk − Lq``; a causal sequence with
more queries than keys is refused (its first queries would see no key; ``attention()``
refuses the same).

**Length 0**: a sequence without queries is allowed, whatever its keys (it has no output
rows; its keys are not read); a sequence with queries and no keys is refused (the softmax
over zero keys is undefined, as in ``attention()``).
"""
from __future__ import annotations

import numpy as np

from numba_attn.spec.errors import SUPPORTED_DTYPES, AttentionInputError
from numba_attn.spec.reference import reference
from numba_attn.spec.rand import normal

# (spec/problem.py imports this module inside VarlenProblem's methods; this module does not import it)


# -- input checks ----------------------------------------------------------------------

def check_cu_seqlens(name: str, cu, total: int, batch: int | None = None) -> np.ndarray:
    """``cu`` (a host array) as an int64 array of lengths' prefix sums, checked: int32, 1-D with
    ``batch + 1`` entries (when ``batch`` is given), starting at 0, non-decreasing, the last
    entry ``total``. Raises :class:`AttentionInputError` naming ``name``."""
    a = np.asarray(cu)
    if a.dtype != np.int32:
        raise AttentionInputError(f"{name} must be int32 (batch + 1,); got dtype {a.dtype}")
    if a.ndim != 1 or a.shape[0] < 1:
        raise AttentionInputError(f"{name} must be 1-D of length batch + 1 (>= 1); got shape {a.shape}")
    if batch is not None and a.shape[0] != batch + 1:
        raise AttentionInputError(f"{name} has {a.shape[0]} entries; cu_seqlens_q has {batch + 1} "
                                  f"(both must be batch + 1 long)")
    if int(a[0]) != 0:
        raise AttentionInputError(f"{name}[0] must be 0; got {int(a[0])}")
    d = np.diff(a.astype(np.int64))
    if (d < 0).any():
        i = int(np.flatnonzero(d < 0)[0])
        raise AttentionInputError(f"{name} must be non-decreasing; {name}[{i + 1}] = {int(a[i + 1])} < "
                                  f"{name}[{i}] = {int(a[i])}")
    if int(a[-1]) != total:
        raise AttentionInputError(f"{name}[-1] = {int(a[-1])} must be the total number of rows ({total})")
    return a.astype(np.int64)


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, max_seqlen_q=None, max_seqlen_k=None):
    """Check the varlen inputs (q, k, v by shape and dtype; the cu_seqlens as host arrays) before
    anything is launched; returns (lens_q, lens_k, max_seqlen_q, max_seqlen_k) (NumPy int64 lengths;
    a given max_seqlen must be at least the longest sequence). Raises :class:`AttentionInputError`
    naming the argument."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            raise AttentionInputError(f"{name} must be a NumPy array, a numba device array or a PyTorch tensor; "
                                      f"got {type(a).__name__}")
        if len(a.shape) != 3:
            raise AttentionInputError(f"{name} must be 3-D (total_{'q' if name == 'q' else 'k'}, heads, head_dim) "
                                      f"in the varlen layout; got shape {tuple(a.shape)}")
    for name, a in (("q", q), ("k", k), ("v", v)):
        dt = np.dtype(a.dtype).name
        if dt not in SUPPORTED_DTYPES:
            raise AttentionInputError(f"{name} has dtype {dt}; supported dtypes: {', '.join(SUPPORTED_DTYPES)}")
    if len({np.dtype(a.dtype).name for a in (q, k, v)}) != 1:
        raise AttentionInputError(f"q, k and v must share one dtype; got q {np.dtype(q.dtype).name}, "
                                  f"k {np.dtype(k.dtype).name}, v {np.dtype(v.dtype).name}")
    Tq, H, D = q.shape
    Tk, Hkv, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Dk != D:
        raise AttentionInputError(f"q and k must have the same head_dim (dimension 2); got {D} and {Dk}")
    if D < 1:
        raise AttentionInputError(f"head_dim (dimension 2 of q, k, v) must be >= 1; got {D}")
    if H < 1 or Hkv < 1 or H % Hkv:
        raise AttentionInputError(f"q heads ({H}) must be a positive multiple of k/v heads ({Hkv}) "
                                  f"(grouped-query attention: query head h reads k/v head h // (H // Hkv))")
    cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, Tq)
    ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, Tk, batch=len(cq) - 1)
    lq, lk = np.diff(cq), np.diff(ck)
    empty = (lq > 0) & (lk == 0)
    if empty.any():
        b = int(np.flatnonzero(empty)[0])
        raise AttentionInputError(f"sequence {b} has {int(lq[b])} queries and no keys (cu_seqlens_k[{b}] == "
                                  f"cu_seqlens_k[{b + 1}]): the softmax over zero keys is undefined")
    if causal:
        bad = (lq > 0) & (lq > lk)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise AttentionInputError(f"causal: sequence {b} has {int(lq[b])} queries but {int(lk[b])} keys "
                                      f"(cu_seqlens_q / cu_seqlens_k); bottom-right alignment needs queries <= keys")
    longest = []
    for name, given, lens in (("max_seqlen_q", max_seqlen_q, lq), ("max_seqlen_k", max_seqlen_k, lk)):
        top = int(lens.max()) if lens.size else 0
        if given is None:
            longest.append(top)
            continue
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given < top:
            raise AttentionInputError(f"{name} must be an int >= the longest sequence ({top}); got {given!r}")
        longest.append(int(given))
    return lq, lk, longest[0], longest[1]


# -- the reference -----------------------------------------------------------------------

def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, variant=None):
    """float64 attention of each sequence (the contiguous reference on its rows); (total_q, H, D).
    A sequence without queries contributes no rows. ``variant``: its functions see sequence ``b`` as batch
    index ``b`` and positions within the sequence (the sequence is put at index b of a zero batch)."""
    Tq, H, D = q.shape
    out = np.zeros((Tq, H, D), np.float64)
    cq, ck = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        if q1 == q0:
            continue
        qs = np.asarray(q[q0:q1]).astype(np.float64).transpose(1, 0, 2)[None]  # (1, H, Lq, D)
        ks = np.asarray(k[k0:k1]).astype(np.float64).transpose(1, 0, 2)[None]
        vs = np.asarray(v[k0:k1]).astype(np.float64).transpose(1, 0, 2)[None]
        if variant is None:
            out[q0:q1] = reference(qs, ks, vs, causal=causal, scale=scale)[0].transpose(1, 0, 2)
            continue
        pad = [np.concatenate([np.zeros((b,) + x.shape[1:]), x]) for x in (qs, ks, vs)]
        out[q0:q1] = reference(*pad, causal=causal, scale=scale, variant=variant)[b].transpose(1, 0, 2)
    return out


# -- a problem's lengths and inputs ------------------------------------------------------------

def problem_lengths(p):
    """(lens_q, lens_k) of a VarlenProblem: ``ragged`` draws the query lengths uniformly in
    [q_len // 4, q_len] (seeded by ``seed``; at least 1), else every sequence has ``q_len``; a
    sequence's keys are its queries plus the ``kv_len − q_len`` earlier tokens (at least 1)."""
    rng = np.random.default_rng(p.seed + 19)
    if p.ragged:
        lq = rng.integers(max(1, p.q_len // 4), p.q_len + 1, size=p.batch).astype(np.int64)
    else:
        lq = np.full(p.batch, p.q_len, np.int64)
    lk = np.maximum(1, lq + (p.kv_len - p.q_len))
    return lq, lk


def cu_seqlens(lens) -> np.ndarray:
    """Lengths → int32 prefix sums starting at 0 (batch + 1 entries)."""
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def problem_layout(p):
    """(cu_seqlens_q, cu_seqlens_k) of a VarlenProblem (int32 NumPy arrays)."""
    lq, lk = problem_lengths(p)
    return cu_seqlens(lq), cu_seqlens(lk)


def problem_inputs(p, seed: int, dtype):
    """Seeded packed q (total_q, H, D), k, v (total_k, Hkv, D) in ``dtype`` (standard normal)."""
    cq, ck = problem_layout(p)
    rng = np.random.default_rng(seed)
    q = normal(rng, (int(cq[-1]), p.heads, p.head_dim), dtype)
    k = normal(rng, (int(ck[-1]), p.kv_heads, p.head_dim), dtype)
    v = normal(rng, (int(ck[-1]), p.kv_heads, p.head_dim), dtype)
    return q, k, v


def problem_reference(p, q, k, v):
    cq, ck = problem_layout(p)
    return varlen_reference(q, k, v, cq, ck, causal=p.causal, scale=p.sm_scale, variant=getattr(p, "variant", None))
