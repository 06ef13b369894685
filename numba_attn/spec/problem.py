"""The attention problem: shapes, inputs, operation and byte counts.

Kept apart from the reference and from the kernels (problem definition,
reference, implementation and evaluation are four different things).

Layout: ``q`` is (batch, heads, q_len, head_dim); ``k`` and ``v`` are
(batch, kv_heads, kv_len, head_dim); the output is (batch, heads, q_len,
head_dim). ``kv_heads`` < ``heads`` is grouped-query attention: query head
``h`` reads key/value head ``h // (heads // kv_heads)``.

Causal masking with ``q_len < kv_len`` is aligned bottom-right: the last query
sees every key, query ``i`` sees keys ``j <= i + (kv_len - q_len)``. This is
what a decoder does when ``q_len`` new tokens attend to a KV cache holding
``kv_len - q_len`` earlier tokens plus themselves. ``causal`` with
``q_len > kv_len`` would leave the first queries with no key at all and is
refused.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from numba_attn.spec.errors import SHORT_DTYPE, SUPPORTED_DTYPES as DTYPES, canonical_dtype, validate_problem
from numba_attn.spec.rand import normal


def numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # optional: only bf16 problems need it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass(frozen=True)
class Problem:
    batch: int = 1
    heads: int = 1
    q_len: int = 128
    kv_len: int | None = None
    head_dim: int = 64
    causal: bool = False
    dtype: str = "float32"
    scale: float | None = None
    kv_heads: int | None = None
    seed: int = 0
    # an attention variant (numba_attn.variants.Variant: mask and score functions and their arrays), or None
    variant: object = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))  # fp16 → float16 (the tables' short names)
        if self.kv_len is None:
            object.__setattr__(self, "kv_len", self.q_len)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        validate_problem(self)

    # -- derived quantities -------------------------------------------------
    @property
    def sm_scale(self) -> float:
        """Softmax scale: ``scale`` or 1/sqrt(head_dim)."""
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.heads // self.kv_heads

    @property
    def causal_offset(self) -> int:
        """Query ``i`` sees keys ``j <= i + causal_offset`` (bottom-right alignment)."""
        return self.kv_len - self.q_len

    @property
    def itemsize(self) -> int:
        return numpy_dtype(self.dtype).itemsize

    def pairs_per_head(self) -> int:
        """Exact number of unmasked (query, key) pairs of one head."""
        nq, nk = self.q_len, self.kv_len
        if not self.causal:
            return nq * nk
        return _causal_pairs(nq, nk)

    def flops(self) -> int:
        """4·D per unmasked pair (2·D for QKᵀ, 2·D for PV), times batch·heads."""
        return 4 * self.batch * self.heads * self.head_dim * self.pairs_per_head()

    def min_bytes(self) -> int:
        """Fewest bytes a fused kernel moves: read Q, K, V once, write O once."""
        q = o = self.batch * self.heads * self.q_len * self.head_dim
        kv = 2 * self.batch * self.kv_heads * self.kv_len * self.head_dim
        return (q + o + kv) * self.itemsize

    def materialized_bytes(self) -> int:
        """Bytes an unfused pipeline moves in addition: S written and read,
        P written and read (float32), as the ``naive`` phase does."""
        s = self.batch * self.heads * self.q_len * self.kv_len * 4
        return self.min_bytes() + 4 * s

    # -- inputs ----------------------------------------------------------------
    def inputs(self, seed: int | None = None):
        """Seeded random q, k, v (standard normal, never zeros) in the storage dtype."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        dt = numpy_dtype(self.dtype)
        shape_q = (self.batch, self.heads, self.q_len, self.head_dim)
        shape_kv = (self.batch, self.kv_heads, self.kv_len, self.head_dim)
        q = normal(rng, shape_q, dt)
        k = normal(rng, shape_kv, dt)
        v = normal(rng, shape_kv, dt)
        return q, k, v

    def out_shape(self):
        return (self.batch, self.heads, self.q_len, self.head_dim)

    # -- presentation ----------------------------------------------------------
    @property
    def label(self) -> str:
        s = f"B{self.batch} H{self.heads}"
        if self.kv_heads != self.heads:
            s += f"/{self.kv_heads}kv"
        if self.q_len == self.kv_len:
            s += f" N{self.q_len}"
        else:
            s += f" Nq{self.q_len} Nk{self.kv_len}"
        s += f" D{self.head_dim} {SHORT_DTYPE.get(self.dtype, self.dtype)}"
        if self.causal:
            s += " causal"
        if self.variant is not None:
            s += f" {self.variant.name}"
        return s

    def to_dict(self) -> dict:
        """The fields as JSON values; a variant by its name (its functions are not data)."""
        d = dataclasses.asdict(self.replace(variant=None)) if self.variant is not None else dataclasses.asdict(self)
        d.pop("variant", None)
        if self.variant is not None:
            d["variant"] = self.variant.name
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Problem":
        """The problem of ``to_dict`` (a :class:`PagedProblem` when ``d`` has a page size, a
        :class:`VarlenProblem` when it is marked ``varlen``, an :class:`Fp8InputProblem` when it has an
        ``input_dtype``)."""
        if cls is Problem and d.get("page_size"):
            cls = PagedProblem
        elif cls is Problem and d.get("varlen"):
            cls = VarlenProblem
        elif cls is Problem and d.get("input_dtype"):
            cls = Fp8InputProblem
        fields = {f.name for f in dataclasses.fields(cls)} - {"variant"}  # a variant's name is not its functions
        return cls(**{k: v for k, v in d.items() if k in fields})

    def replace(self, **kw) -> "Problem":
        return dataclasses.replace(self, **kw)


def layout_of(problem) -> str:
    """The layout of ``problem``'s arrays: "paged" (a PagedProblem), "varlen" (a VarlenProblem:
    packed sequences with cu_seqlens) or "contiguous"."""
    if getattr(problem, "page_size", 0):
        return "paged"
    if getattr(problem, "varlen", False):
        return "varlen"
    return "contiguous"


def contiguous_twin(problem) -> "Problem":
    """The contiguous fp16 problem a paged one is held against: its shape and lengths (a ragged batch:
    every sequence at the mean length, the same bytes of K/V)."""
    n = int(round(float(problem.seqlens().mean()))) if problem.ragged else problem.kv_len
    return Problem(batch=problem.batch, heads=problem.heads, kv_heads=problem.kv_heads, q_len=problem.q_len,
                   kv_len=max(n, problem.q_len), head_dim=problem.head_dim, causal=problem.causal, dtype="float16",
                   scale=problem.scale)


def padded_twin(problem) -> "Problem":
    """The contiguous problem a varlen one is held against: the same batch, every sequence at the longest length."""
    return problem.padded()


def twin_of(problem):
    """The contiguous twin of a paged or varlen problem (None for a contiguous one)."""
    kind = layout_of(problem)
    return contiguous_twin(problem) if kind == "paged" else padded_twin(problem) if kind == "varlen" else None


def _causal_pairs(nq: int, nk: int) -> int:
    """Closed form of sum_i min(nk, max(0, i + nk - nq + 1)) for nq <= nk."""
    off = nk - nq
    # every i in [0, nq) sees i + off + 1 keys (<= nk because i <= nq - 1)
    return nq * (off + 1) + nq * (nq - 1) // 2


# Named presets. ``tiny`` is the simulator default: odd lengths that are not
# multiples of any tile, q_len != kv_len, two heads, head_dim 16.
PRESETS: dict[str, list[Problem]] = {
    "tiny": [Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16)],
    "tiny-causal": [Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16, causal=True)],
    "small": [Problem(batch=2, heads=4, q_len=257, kv_len=257, head_dim=64)],
    "bench": [Problem(batch=1, heads=32, q_len=4096, head_dim=64)],
    "bench-d128": [Problem(batch=1, heads=32, q_len=4096, head_dim=128)],
    "short": [Problem(batch=16, heads=16, q_len=512, head_dim=64)],
    "roadmap": [Problem(batch=1, heads=32, q_len=4096, head_dim=64),
                Problem(batch=1, heads=32, q_len=4096, head_dim=128),
                Problem(batch=16, heads=16, q_len=512, head_dim=64)],
}

# Decode: one new token per sequence against a KV cache (memory-bound: judge
# by GB/s of K/V read against the copy bandwidth). The full list is large:
# B=32 at 131072 keys is 68.7 GB of fp16 K/V (137 GB in fp32, more than one
# GPU holds) and its float64 reference is slow; ``decode-small`` is a subset
# for quick runs.
PRESETS["decode"] = [
    Problem(batch=b, heads=32, q_len=1, kv_len=n, head_dim=128, dtype=dt)
    for dt in ("float16", "float32") for b in (1, 8, 32) for n in (4096, 16384, 32768, 131072)
] + [
    Problem(batch=1, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
    Problem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
]
PRESETS["decode-small"] = [
    Problem(batch=1, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16"),
    Problem(batch=8, heads=32, q_len=1, kv_len=4096, head_dim=128, dtype="float32"),
    Problem(batch=32, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16"),
    Problem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
]
# GQA (8 KV heads for 32 query heads) and speculative decoding (q_len 4, causal), fp16.
PRESETS["decode-gqa"] = [
    Problem(batch=1, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
    Problem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
    Problem(batch=8, heads=32, q_len=4, kv_len=16384, head_dim=128, dtype="float16", causal=True),
]
# Tensor-core phases: fp16/bf16 at D=64/128 and the short shape; fp32 for tf32.
PRESETS["tc-bench"] = [Problem(batch=1, heads=32, q_len=4096, head_dim=d, dtype=dt)
                       for dt in ("float16", "bfloat16") for d in (64, 128)] + [
    Problem(batch=1, heads=32, q_len=4096, head_dim=64, dtype="float16", causal=True),
    Problem(batch=16, heads=16, q_len=512, head_dim=64, dtype="float16"),
    Problem(batch=1, heads=32, q_len=4096, head_dim=64, dtype="float32"),
    Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float32"),
]
# Long-context prefill: how the cost grows with N (B=1, H=32, D=128).
PRESETS["long-context"] = [Problem(batch=1, heads=32, q_len=n, head_dim=128) for n in (4096, 8192, 16384, 32768)]
PRESETS["long-context-fp16"] = [Problem(batch=1, heads=32, q_len=n, head_dim=128, dtype="float16")
                                for n in (4096, 8192, 16384, 32768)]


# -- paged KV cache (FlashAttention's ``flash_attn_with_kvcache`` layout) ----------------

@dataclass(frozen=True)
class PagedProblem(Problem):
    """Decode against a paged KV cache: ``k_cache``/``v_cache`` (num_blocks,
    page_size, kv_heads, head_dim), a block table (batch, max_blocks) of page
    indices and per-sequence lengths. ``kv_len`` is the longest sequence;
    ``ragged`` draws the lengths uniformly between ``kv_len // 32`` and
    ``kv_len`` (else every sequence holds ``kv_len`` keys). ``kv_dtype``: ""
    (the cache in ``dtype``), ``"float8_e4m3"`` or ``"int8"``, with scales
    per ``kv_scale`` (``tensor``, ``head`` or ``token``). The layout (lengths,
    a shuffled block table, scales) depends on ``seed`` only, the values on
    the seed of :meth:`inputs`. ``mean_len`` (0: unset) stands for the lengths
    in the split plan only: the sequences have unequal lengths of this mean
    (``decode_paged`` sets it from a call's lengths; phases/decode/common.py,
    ``ragged_mean``); a row's problem leaves it out while it is 0."""

    page_size: int = 16
    kv_dtype: str = ""
    kv_scale: str = "head"
    ragged: bool = False
    mean_len: int = 0

    def __post_init__(self):
        super().__post_init__()
        from numba_attn.spec.errors import KV_DTYPE_ALIASES

        if isinstance(self.kv_dtype, str) and self.kv_dtype.strip().lower() in KV_DTYPE_ALIASES:
            object.__setattr__(self, "kv_dtype", KV_DTYPE_ALIASES[self.kv_dtype.strip().lower()])  # fp8 → float8_e4m3
        from numba_attn.spec.paged import validate_paged_problem  # (spec/paged.py: NumPy only, not this module)

        validate_paged_problem(self)

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    def layout(self):
        """(block_table, seqlens, k_scale, v_scale) of this problem (NumPy; scales None
        for a 16-bit cache)."""
        from numba_attn.spec.paged import problem_layout

        return problem_layout(self)

    def inputs(self, seed: int | None = None):
        from numba_attn.spec.paged import problem_inputs

        return problem_inputs(self, self.seed if seed is None else seed)

    def seqlens(self):
        return self.layout()[1]

    def to_dict(self) -> dict:
        d = super().to_dict()
        if not d["mean_len"]:
            del d["mean_len"]  # (the rows of problems without it stay as they were)
        return d

    def pairs_per_head(self) -> int:
        return sum(_causal_pairs(self.q_len, n) if self.causal and n >= self.q_len else self.q_len * n
                   for n in map(int, self.seqlens())) // self.batch

    def flops(self) -> int:
        return 4 * self.batch * self.heads * self.head_dim * self.pairs_per_head()

    def kv_bytes(self) -> int:
        """Bytes of K and V a kernel reads: the keys of every sequence, once, and their
        float32 scales when there is one per token."""
        from numba_attn.spec.paged import cache_itemsize

        n = int(self.seqlens().sum()) * self.kv_heads
        scales = 2 * n * 4 if self.kv_dtype and self.kv_scale == "token" else 0
        return 2 * n * self.head_dim * cache_itemsize(self.cache_dtype) + scales

    def min_bytes(self) -> int:
        q = o = self.batch * self.heads * self.q_len * self.head_dim * self.itemsize
        return q + o + self.kv_bytes()

    @property
    def label(self) -> str:
        s = super().label + f" paged P{self.page_size}"
        if self.kv_dtype:
            s += f" {SHORT_KV.get(self.kv_dtype, self.kv_dtype)}/{self.kv_scale}"
        if self.ragged:
            s += " ragged"
        return s


# -- inputs given as e4m3 codes (spec/fp8_inputs.py: what they are, their reference; attention_fp8) --------------

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
        return tuple(decode_e4m3(a, s) for a, s in zip((q, k, v), self.scales()))


def decode_e4m3(codes, scale) -> np.ndarray:
    """float64 values ``code · scale`` of e4m3fn ``codes`` (batch, heads, n, d) and ``scale`` (batch, heads)."""
    return np.asarray(codes).astype(np.float64) * np.asarray(scale, np.float64)[:, :, None, None]


SHORT_KV = {"float8_e4m3": "fp8", "int8": "int8"}

# Paged decode (issue 18): page sizes, 8-bit caches and ragged lengths at the
# decode shapes of the contiguous presets (B ∈ {1, 8, 32}, KV ∈ {4k, 32k}).
PRESETS["paged"] = [
    PagedProblem(batch=b, heads=32, q_len=1, kv_len=n, head_dim=128, dtype="float16", page_size=p, ragged=r)
    for b in (1, 8, 32) for n in (4096, 32768) for p in (16, 64, 256) for r in (False, True)
] + [
    PagedProblem(batch=b, heads=32, kv_heads=8, q_len=1, kv_len=n, head_dim=128, dtype="float16", page_size=64)
    for b in (1, 8) for n in (4096, 32768)
]
PRESETS["paged-8bit"] = [
    PagedProblem(batch=b, heads=32, q_len=1, kv_len=n, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype=kd, kv_scale=sc)
    for b in (1, 8) for n in (16384, 32768) for kd, sc in (("float8_e4m3", "tensor"), ("float8_e4m3", "head"),
                                                              ("int8", "head"), ("int8", "token"))
] + [  # GQA (group 4): paged_mma's 8-bit tiles, and bfloat16 queries on an fp8 and a bf16 cache
    PagedProblem(batch=b, heads=32, kv_heads=8, q_len=1, kv_len=n, head_dim=128, dtype=dt, page_size=64,
                 kv_dtype=kd, kv_scale=sc)
    for b in (1, 8) for n in (16384, 32768) for dt, kd, sc in (("float16", "float8_e4m3", "head"),
                                                                 ("float16", "int8", "token"),
                                                                 ("bfloat16", "float8_e4m3", "head"),
                                                                 ("bfloat16", "", "head"))
]
# The 8-bit caches of paged-targets-short alone (B8 KV 16k/32k fp8 per head and int8 per token, GQA fp8 at 32k):
# the decoders' variants side by side in a run of a minute or two.
_PAGED_8BIT_TARGETS = [  # the 8-bit target: B8 KV 16k/32k, fp8 per head and int8 per token
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=n, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype=kd, kv_scale=sc)
    for n in (16384, 32768) for kd, sc in (("float8_e4m3", "head"), ("int8", "token"))
]
PRESETS["paged-8bit-short"] = _PAGED_8BIT_TARGETS + [
    PagedProblem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype="float8_e4m3", kv_scale="head"),
]
# The targets at a cost one GPU run can afford: page size 64 over B ∈ {1, 8, 32} × KV ∈ {4k, 32k}
# (ragged), the page-size effect at B8 32k, GQA, and the 8-bit caches at KV 16k and 32k.
PRESETS["paged-targets"] = [
    PagedProblem(batch=b, heads=32, q_len=1, kv_len=n, head_dim=128, dtype="float16", page_size=64, ragged=True)
    for b in (1, 8, 32) for n in (4096, 32768)
] + [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=p, ragged=r)
    for p, r in ((64, False), (16, True), (256, True))
] + [
    PagedProblem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64),
] + _PAGED_8BIT_TARGETS
# The targets where a split plan or the 8-bit dequantization decides (ragged B8/B32, 8-bit at 16k/32k), without
# paged-targets' largest caches: one GPU run of a few minutes.
PRESETS["paged-ragged"] = [  # the ragged fp16 targets alone (the split plan decides them)
    PagedProblem(batch=b, heads=32, q_len=1, kv_len=n, head_dim=128, dtype="float16", page_size=64, ragged=True)
    for b, n in ((8, 4096), (8, 32768), (32, 4096))
]
PRESETS["paged-targets-short"] = PRESETS["paged-ragged"] + PRESETS["paged-8bit-short"]
PRESETS["paged-small"] = [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64, ragged=True),
    PagedProblem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64),
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype="float8_e4m3", kv_scale="head"),
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype="int8", kv_scale="token"),
]


# -- packed ragged prefill (FlashAttention's ``flash_attn_varlen_func`` layout) --------------

@dataclass(frozen=True)
class VarlenProblem(Problem):
    """Prefill of a packed ragged batch: ``q`` (total_q, heads, head_dim), ``k``/``v``
    (total_k, kv_heads, head_dim) and the cu_seqlens of both (spec/varlen.py). ``q_len`` and
    ``kv_len`` are the longest sequence (max_seqlen); ``ragged`` draws the query lengths
    uniformly in [q_len // 4, q_len] (else all are ``q_len``), each sequence's keys are its
    queries plus ``kv_len − q_len`` earlier tokens. The lengths depend on ``seed`` only, the
    values on the seed of :meth:`inputs`. ``varlen`` marks the layout (always True)."""

    ragged: bool = True
    varlen: bool = True

    def layout(self):
        """(cu_seqlens_q, cu_seqlens_k) of this problem (int32 NumPy arrays)."""
        from numba_attn.spec.varlen import problem_layout  # (spec/varlen.py does not import this module)

        return problem_layout(self)

    def seqlens(self):
        """(lens_q, lens_k): the sequences' lengths."""
        from numba_attn.spec.varlen import problem_lengths

        return problem_lengths(self)

    def inputs(self, seed: int | None = None):
        from numba_attn.spec.varlen import problem_inputs

        return problem_inputs(self, self.seed if seed is None else seed, numpy_dtype(self.dtype))

    def out_shape(self):
        return (int(self.seqlens()[0].sum()), self.heads, self.head_dim)

    def _pairs(self) -> int:
        lq, lk = self.seqlens()
        return sum(_causal_pairs(int(a), int(b)) if self.causal else int(a) * int(b) for a, b in zip(lq, lk))

    def pairs_per_head(self) -> int:
        """Unmasked (query, key) pairs of one head, averaged over the sequences (rounded down)."""
        return self._pairs() // self.batch

    def flops(self) -> int:
        """4·D per unmasked pair of the real sequences (no padding), times heads."""
        return 4 * self.heads * self.head_dim * self._pairs()

    def min_bytes(self) -> int:
        lq, lk = self.seqlens()
        q = o = int(lq.sum()) * self.heads * self.head_dim
        kv = 2 * int(lk.sum()) * self.kv_heads * self.head_dim
        return (q + o + kv) * self.itemsize

    def padded(self) -> Problem:
        """The padded twin: the same batch with every sequence at the longest length, contiguous layout."""
        return Problem(batch=self.batch, heads=self.heads, kv_heads=self.kv_heads, q_len=self.q_len,
                       kv_len=self.kv_len, head_dim=self.head_dim, causal=self.causal, dtype=self.dtype,
                       scale=self.scale, seed=self.seed)

    @property
    def label(self) -> str:
        return super().label + " varlen" + (" ragged" if self.ragged else "")


# Ragged prefill (issue 18): packed batches of 8 and 32 sequences, lengths uniform in [N/4, N].
PRESETS["varlen"] = [
    VarlenProblem(batch=b, heads=32, q_len=n, head_dim=128, dtype="float16", causal=c)
    for b in (8, 32) for n in (1024, 4096) for c in (False, True)
]
