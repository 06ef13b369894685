"""Seeded standard-normal inputs, fast for large problems.

``normal(rng, shape, dtype)`` draws from ``rng`` (a NumPy Generator) exactly as
``rng.standard_normal(shape, dtype=float32).astype(dtype)`` does for arrays of fewer than
``PARALLEL_MIN`` elements, so the inputs of every small problem (the tests', the presets' up to
a few hundred MB) stay what they were. (An array of exactly ``PARALLEL_MIN`` elements, e.g. the K
and V of B16 H32/8kv N8192 D128, was drawn sequentially until 2026-11-23 and is drawn in parallel
since, so its values changed then.) A larger array takes one 63-bit seed from ``rng`` and fills
fixed chunks of ``CHUNK`` elements, chunk ``i`` from its own generator
(``SeedSequence(seed).spawn``), in a thread pool: NumPy's generators release the GIL while they
fill, so a 5 GB cache takes seconds on a many-core host instead of minutes. The values depend
only on the seed and the shape, never on the number of threads.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

PARALLEL_MIN = 1 << 27  # 134M elements (512 MB of float32): below, one sequential draw as always
CHUNK = 1 << 24  # 16M elements per chunk generator


def _threads() -> int:
    """Threads for a large draw: ``NUMBA_ATTN_THREADS`` (a worker's share of the host), else this
    process's CPUs, at most 32."""
    env = os.environ.get("NUMBA_ATTN_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return min(32, n)


def normal(rng: np.random.Generator, shape, dtype, *, threads: int | None = None) -> np.ndarray:
    """Standard-normal float32 samples of ``shape`` converted to ``dtype`` (see the module docstring)."""
    n = int(np.prod(shape, dtype=np.int64))
    if n < PARALLEL_MIN:
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    seed = int(rng.integers(0, 2**63 - 1))
    out = np.empty(n, dtype=dtype)
    chunks = [(i, min(n, i + CHUNK)) for i in range(0, n, CHUNK)]
    children = np.random.SeedSequence(seed).spawn(len(chunks))

    def fill(k):
        lo, hi = chunks[k]
        g = np.random.Generator(np.random.PCG64(children[k]))
        out[lo:hi] = g.standard_normal(hi - lo, dtype=np.float32).astype(dtype, copy=False)

    workers = threads or _threads()
    if workers <= 1:
        for k in range(len(chunks)):
            fill(k)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fill, range(len(chunks))))
    return out.reshape(shape)
