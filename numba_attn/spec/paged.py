"""The paged KV cache: layout, 8-bit formats, input checks and the float64 reference.

Layout (FlashAttention's ``flash_attn_with_kvcache``): ``q`` (B, q_len, H, D) and the
output of the same shape; ``k_cache``, ``v_cache`` (num_blocks, page_size, Hkv, D); ``block_table``
(B, max_blocks) int32: key ``j`` of sequence ``b`` is row ``j % page_size`` of
page ``block_table[b, j // page_size]``; ``cache_seqlens`` (B,) int32: sequence
``b`` holds keys ``0 … cache_seqlens[b] − 1``. Pages may repeat and come in any
order; table entries past a sequence's last page are not read. (The kernels and a
:class:`~numba_attn.spec.problem.PagedProblem`'s inputs hold q as (B, H, q_len, D), one
row per (sequence, head); ``decode_paged`` transposes a q of q_len > 1 and H > 1 to it and its
output back, and :func:`paged_reference` takes the public layout.)

Causal with ``q_len > 1``: the q_len queries are the last positions of each
sequence (query ``i`` sees keys ``j <= i + len − q_len``); a causal sequence
shorter than ``q_len`` (but not empty) is refused. **A sequence of length 0**
(an idle slot of a batch) has output zeros.

8-bit caches: ``float8_e4m3`` (``ml_dtypes.float8_e4m3fn`` / ``torch.float8_e4m3fn``;
scale per tensor (a scalar) or per KV head, shape (Hkv,)) and ``int8`` (scale per
KV head (Hkv,) or per token (num_blocks, page_size, Hkv)); the cache holds
``value / scale``: the dequantized value is ``code · scale``; every scale must be finite and
positive (a NaN, infinite, zero or negative scale is refused, naming the argument). The reference
attends over the dequantized cache in float64.
"""
from __future__ import annotations

import numpy as np

from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.reference import reference
from numba_attn.spec.rand import normal

# (spec/problem.py imports this module inside PagedProblem's methods; this module does not import it)
PAGE_SIZES = (16, 32, 64, 128, 256)
PAGED_KV_DTYPES = ("", "float8_e4m3", "int8")  # "": the cache in the query's dtype
PAGED_SCALES = ("tensor", "head", "token")
SCALES_OF = {"float8_e4m3": ("tensor", "head"), "int8": ("tensor", "head", "token")}


# -- 8-bit formats ---------------------------------------------------------------------

def fp8_e4m3_decode(codes) -> np.ndarray:
    """float8 e4m3fn bytes → float32, bit-exact (the model of the kernel's device
    function): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
    subnormal (m · 2⁻⁹); 0x7F/0xFF are NaN (no infinities)."""
    b = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    e = (b >> 3) & 15
    m = b & 7
    mant = np.where(e > 0, m + 8, m).astype(np.float32)
    val = mant * (np.left_shift(1, np.maximum(e, 1))).astype(np.float32) * np.float32(2.0 ** -10)
    val = np.where((e == 15) & (m == 7), np.float32(np.nan), val).astype(np.float32)
    return np.where(b >= 128, -val, val).astype(np.float32)


def numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def cache_itemsize(dtype: str) -> int:
    return 1 if dtype in ("float8_e4m3", "int8") else numpy_dtype(dtype).itemsize


def cache_codes(a) -> np.ndarray:
    """An 8-bit cache as its bytes (uint8) whatever NumPy type holds it."""
    return np.asarray(a).view(np.uint8)


_E4M3_VALUES = fp8_e4m3_decode(np.arange(256)).astype(np.float64)


def dequantize(cache, kv_dtype: str, scale) -> np.ndarray:
    """An 8-bit cache (num_blocks, page_size, Hkv, D) as float64 values ``code · scale``;
    a 16-bit cache is upcast."""
    if kv_dtype == "float8_e4m3":  # the model's 256 values, looked up (a cache holds ~10⁹ codes)
        vals = _E4M3_VALUES[cache_codes(cache)]
    elif kv_dtype == "int8":
        vals = cache_codes(cache).view(np.int8).astype(np.float64)
    else:
        return np.asarray(cache).astype(np.float64)
    s = np.asarray(scale, dtype=np.float64)
    if s.ndim == 1:  # per head
        s = s[None, None, :, None]
    elif s.ndim == 3:  # per token
        s = s[..., None]
    return vals * s


def scale_kind(scale) -> str:
    s = np.asarray(scale)
    return {0: "tensor", 1: "head", 3: "token"}.get(s.ndim, f"{s.ndim}-d")


# -- input checks ----------------------------------------------------------------------

def validate_paged_problem(p) -> None:
    if p.page_size not in PAGE_SIZES:
        raise AttentionInputError(f"page_size must be one of {', '.join(map(str, PAGE_SIZES))}, got {p.page_size}")
    if p.kv_dtype not in PAGED_KV_DTYPES:
        raise AttentionInputError(f"kv_dtype must be \"\" (the cache in the query's dtype), float8_e4m3 (fp8) or "
                                  f"int8, got {p.kv_dtype!r}")
    if p.kv_scale not in PAGED_SCALES:
        raise AttentionInputError(f"kv_scale must be one of {PAGED_SCALES}, got {p.kv_scale!r}")
    if p.kv_dtype and p.kv_scale not in SCALES_OF[p.kv_dtype]:
        raise AttentionInputError(f"kv_scale {p.kv_scale!r} not supported for {p.kv_dtype} "
                                  f"(supports {', '.join(SCALES_OF[p.kv_dtype])})")
    if p.kv_dtype and p.dtype == "float32":
        raise AttentionInputError("an 8-bit cache takes a float16 or bfloat16 query")


def check_paged(q_shape, q_dtype, k_cache, v_cache, block_table, cache_seqlens, *, causal, k_scale, v_scale):
    """Check the paged inputs (host arrays for the table and lengths; the caches by
    shape and dtype name) before anything is launched; returns the cache's kv_dtype
    ("" for a 16-bit cache) and the scale kind. Raises :class:`AttentionInputError`
    naming the argument."""
    if len(q_shape) != 4:
        raise AttentionInputError(f"q must be 4-d (batch, q_len, heads, head_dim), flash_attn_with_kvcache's layout, "
                                  f"got shape {tuple(q_shape)}")
    B, Nq, H, D = q_shape
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if len(c.shape) != 4:
            raise AttentionInputError(f"{name} must be 4-d (num_blocks, page_size, kv_heads, head_dim), "
                                      f"got shape {tuple(c.shape)}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise AttentionInputError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    NB, P, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise AttentionInputError(f"k_cache head_dim {Dk} != q head_dim {D}")
    if Hkv < 1 or H % Hkv:
        raise AttentionInputError(f"q heads ({H}, q.shape[2] of q (batch, q_len, heads, head_dim)) must be a multiple "
                                  f"of the caches' kv_heads ({Hkv})")
    if P not in PAGE_SIZES:
        raise AttentionInputError(f"page_size (k_cache.shape[1]) must be one of {', '.join(map(str, PAGE_SIZES))}, "
                                  f"got {P}")
    kd, vd = _dtype_name(k_cache), _dtype_name(v_cache)
    if kd != vd:
        raise AttentionInputError(f"k_cache dtype {kd} != v_cache dtype {vd}")
    if q_dtype not in ("float16", "bfloat16"):
        raise AttentionInputError(f"q must be float16 or bfloat16 for decode_paged, got {q_dtype}")
    if kd in ("float8_e4m3", "int8"):
        kv_dtype = kd
    elif kd == q_dtype:
        kv_dtype = ""
    else:
        raise AttentionInputError(f"k_cache dtype {kd}: must be q's dtype ({q_dtype}), float8_e4m3fn or int8")
    bt = np.asarray(block_table)
    sl = np.asarray(cache_seqlens)
    if bt.ndim != 2 or bt.shape[0] != B or bt.dtype != np.int32:
        raise AttentionInputError(f"block_table must be int32 of shape ({B}, max_blocks_per_seq), "
                                  f"got {bt.dtype} {bt.shape}")
    if sl.shape != (B,) or sl.dtype != np.int32:
        raise AttentionInputError(f"cache_seqlens must be int32 of shape ({B},), got {sl.dtype} {sl.shape}")
    if (sl < 0).any():
        b = int(np.flatnonzero(sl < 0)[0])
        raise AttentionInputError(f"cache_seqlens[{b}] = {int(sl[b])} is negative")
    cap = bt.shape[1] * P
    if (sl > cap).any():
        b = int(np.flatnonzero(sl > cap)[0])
        raise AttentionInputError(f"cache_seqlens[{b}] = {int(sl[b])} is beyond the block table "
                                  f"({bt.shape[1]} pages of {P} = {cap} keys)")
    used = np.arange(bt.shape[1])[None, :] < ((sl + P - 1) // P)[:, None]
    bad = used & ((bt < 0) | (bt >= NB))
    if bad.any():
        b, j = map(int, np.argwhere(bad)[0])
        raise AttentionInputError(f"block_table[{b}, {j}] = {int(bt[b, j])}: page index out of range 0..{NB - 1}")
    if causal and Nq > 1 and ((sl > 0) & (sl < Nq)).any():
        b = int(np.flatnonzero((sl > 0) & (sl < Nq))[0])
        raise AttentionInputError(f"causal: cache_seqlens[{b}] = {int(sl[b])} < q_len {Nq} "
                                  "(the queries are the last positions of the sequence)")
    kind = ""
    if kv_dtype:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None:
                raise AttentionInputError(f"{name} is required for a {kv_dtype} cache "
                                          f"(a scalar, ({Hkv},) per head" +
                                          (f" or ({NB}, {P}, {Hkv}) per token)" if kv_dtype == "int8" else ")"))
        kinds = {scale_kind(k_scale), scale_kind(v_scale)}
        if len(kinds) != 1:
            raise AttentionInputError(f"k_scale and v_scale must have the same shape, got {sorted(kinds)}")
        kind = kinds.pop()
        if kind not in SCALES_OF[kv_dtype]:
            raise AttentionInputError(f"k_scale: a {kind} scale is not supported for {kv_dtype} "
                                      f"(supports {', '.join(SCALES_OF[kv_dtype])})")
        want = {"tensor": (), "head": (Hkv,), "token": (NB, P, Hkv)}[kind]
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if np.shape(s) != want:
                raise AttentionInputError(f"{name} shape {np.shape(s)} != {want} ({kind} scale)")
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            check_scale(name, s)
    elif k_scale is not None or v_scale is not None:
        raise AttentionInputError(f"k_scale/v_scale are for 8-bit caches; this cache is {kd}")
    return kv_dtype, kind


def check_scale(name, s) -> None:
    """Refuse a scale (a scalar or an array of them) that is not a finite positive number, naming the
    argument and the first bad entry: a NaN, infinite, zero or negative scale would turn every value of
    the cache into NaN, infinity or zero without an error."""
    try:
        a = np.asarray(s, dtype=np.float64)
    except (TypeError, ValueError):
        raise AttentionInputError(f"{name} must be a finite positive number or an array of them, "
                                  f"got {type(s).__name__}") from None
    bad = ~(np.isfinite(a) & (a > 0))
    if bad.any():
        if a.ndim == 0:
            raise AttentionInputError(f"{name} must be finite and > 0, got {float(a)!r}")
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        idx = ", ".join(map(str, at))
        raise AttentionInputError(f"{name}[{idx}] = {float(a[at])!r}: every scale must be finite and > 0 "
                                  f"({int(bad.sum())} of {a.size} are not)")


def _dtype_name(a) -> str:
    name = str(getattr(a, "dtype", ""))
    name = name.replace("torch.", "")
    return {"float8_e4m3fn": "float8_e4m3", "uint16": "bfloat16"}.get(name, name)


# -- the reference -----------------------------------------------------------------------

def paged_reference(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None, kv_dtype="",
                    k_scale=None, v_scale=None):
    """float64 attention over each sequence's keys, gathered from the pages and
    dequantized, in ``decode_paged``'s layout: q (B, q_len, H, D) → (B, q_len, H, D). A length-0
    sequence gives zeros."""
    qt = np.swapaxes(np.asarray(q), 1, 2)
    out = paged_reference_heads_first(qt, k_cache, v_cache, block_table, cache_seqlens, causal=causal, scale=scale,
                                      kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale)
    return np.ascontiguousarray(np.swapaxes(out, 1, 2))


def paged_reference_heads_first(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None,
                                kv_dtype="", k_scale=None, v_scale=None):
    """:func:`paged_reference` in the kernels' layout: q (B, H, q_len, D) → (B, H, q_len, D)."""
    B, H, Nq, D = q.shape
    P = k_cache.shape[1]
    out = np.zeros((B, H, Nq, D), np.float64)
    for b in range(B):  # one sequence at a time: its pages gathered, then dequantized (memory: one sequence)
        n = int(cache_seqlens[b])
        if n == 0:
            continue
        pages = np.asarray(block_table[b, : (n + P - 1) // P])
        kv = []
        for cache, s in ((k_cache, k_scale), (v_cache, v_scale)):
            if s is not None and np.ndim(s) == 3:  # per token: the scales of these pages
                s = np.asarray(s)[pages]
            x = dequantize(np.asarray(cache)[pages], kv_dtype, s)  # (pages, P, Hkv, D)
            kv.append(x.reshape(-1, x.shape[2], D)[:n].transpose(1, 0, 2)[None])  # (1, Hkv, n, D)
        out[b] = reference(q[b:b + 1].astype(np.float64), kv[0], kv[1], causal=causal, scale=scale)[0]
    return out


# -- a problem's layout and inputs -----------------------------------------------------------

def problem_layout(p):
    """(block_table, seqlens, k_scale, v_scale): lengths (ragged or all ``kv_len``), the
    pages of all sequences shuffled over the cache (one spare page), scales."""
    rng = np.random.default_rng(p.seed + 18)
    P = p.page_size
    if p.ragged:
        seqlens = rng.integers(max(1, p.kv_len // 32), p.kv_len + 1, size=p.batch).astype(np.int32)
    else:
        seqlens = np.full(p.batch, p.kv_len, np.int32)
    max_blocks = max(1, -(-p.kv_len // P))
    npages = (seqlens + P - 1) // P
    perm = rng.permutation(int(npages.sum()) + 1).astype(np.int32)
    table = np.zeros((p.batch, max_blocks), np.int32)
    at = 0
    for b in range(p.batch):
        table[b, : npages[b]] = perm[at: at + npages[b]]
        at += npages[b]
    ks = vs = None
    if p.kv_dtype:
        shape = {"tensor": (), "head": (p.kv_heads,), "token": (len(perm), P, p.kv_heads)}[p.kv_scale]
        top = 448.0 if p.kv_dtype == "float8_e4m3" else 127.0
        # the scale that puts |x| <= 4 at the top of the format, varied ±50% per head / token
        ks = (4.0 / top * rng.uniform(0.5, 1.5, size=shape)).astype(np.float32)
        vs = (4.0 / top * rng.uniform(0.5, 1.5, size=shape)).astype(np.float32)
    return table, seqlens, ks, vs


def problem_inputs(p, seed: int):
    """Seeded q (B, H, q_len, D) in ``dtype`` and the caches (num_blocks, page_size,
    Hkv, D) in ``cache_dtype`` (8-bit: standard-normal values divided by the scale,
    rounded to the format)."""
    table, seqlens, ks, vs = problem_layout(p)
    rng = np.random.default_rng(seed)
    nb = int(((seqlens + p.page_size - 1) // p.page_size).sum()) + 1
    q = normal(rng, (p.batch, p.heads, p.q_len, p.head_dim), numpy_dtype(p.dtype))
    shape = (nb, p.page_size, p.kv_heads, p.head_dim)
    out = [q]
    for s in (ks, vs):
        if not p.kv_dtype:  # (the same values as float32 samples rounded, without the float32 copy)
            out.append(normal(rng, shape, numpy_dtype(p.dtype)))
            continue
        x = normal(rng, shape, np.float32)
        s = np.asarray(s, np.float32)
        s = s[None, None, :, None] if s.ndim == 1 else (s[..., None] if s.ndim == 3 else s)
        y = x / s
        if p.kv_dtype == "int8":
            out.append(np.clip(np.rint(y), -127, 127).astype(np.int8))
        else:
            import ml_dtypes

            out.append(np.clip(y, -448, 448).astype(ml_dtypes.float8_e4m3fn))
    return tuple(out)


def problem_reference(p, q, k_cache, v_cache):
    table, seqlens, ks, vs = problem_layout(p)
    return paged_reference_heads_first(q, k_cache, v_cache, table, seqlens, causal=p.causal, scale=p.sm_scale,
                                       kv_dtype=p.kv_dtype, k_scale=ks, v_scale=vs)
