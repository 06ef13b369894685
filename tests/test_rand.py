"""Seeded inputs of large problems (numba_attn.spec.rand): the same values for any number of threads,
the small problems' inputs unchanged, never a zero array."""
import numpy as np

from numba_attn.spec import rand


def test_small_arrays_are_the_sequential_draw():
    a = rand.normal(np.random.default_rng(5), (3, 4, 5), np.float16)
    b = np.random.default_rng(5).standard_normal((3, 4, 5), dtype=np.float32).astype(np.float16)
    assert a.dtype == np.float16 and np.array_equal(a, b)


def test_large_arrays_do_not_depend_on_the_threads(monkeypatch):
    monkeypatch.setattr(rand, "PARALLEL_MIN", 1000)
    monkeypatch.setattr(rand, "CHUNK", 333)
    draws = [rand.normal(np.random.default_rng(7), (7, 1001), np.float32, threads=t) for t in (1, 2, 5)]
    assert all(np.array_equal(draws[0], d) for d in draws[1:])
    x = draws[0]
    assert x.shape == (7, 1001) and np.isfinite(x).all() and np.count_nonzero(x) == x.size
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05
    # chunks differ from each other (one generator per chunk, not one seed repeated)
    flat = x.ravel()
    assert not np.array_equal(flat[:333], flat[333:666])
    # the next draw from the same generator continues after the one seed taken
    rng = np.random.default_rng(7)
    rand.normal(rng, (7, 1001), np.float32)
    rng2 = np.random.default_rng(7)
    rng2.integers(0, 2**63 - 1)
    assert rng.integers(0, 1 << 30) == rng2.integers(0, 1 << 30)


def test_an_array_of_exactly_parallel_min_elements_is_drawn_in_parallel(monkeypatch):
    """The threshold is exclusive: PARALLEL_MIN elements already take the parallel draw (not one thread)."""
    monkeypatch.setattr(rand, "PARALLEL_MIN", 1000)
    monkeypatch.setattr(rand, "CHUNK", 300)
    a = rand.normal(np.random.default_rng(3), (1000,), np.float32, threads=1)
    seq = np.random.default_rng(3).standard_normal(1000, dtype=np.float32)
    assert not np.array_equal(a, seq)  # not the sequential draw
    assert np.array_equal(a, rand.normal(np.random.default_rng(3), (1000,), np.float32, threads=4))
    assert np.array_equal(rand.normal(np.random.default_rng(3), (999,), np.float32),
                          np.random.default_rng(3).standard_normal(999, dtype=np.float32))
