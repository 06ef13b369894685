"""Programmatic dependent launch (``numba_attn.gpu.pdl``).

A producer kernel writes a buffer after a long dependent loop and lets its
dependents launch at its first instruction; the consumer, launched with
:func:`launch_after`, waits with ``griddepcontrol.wait`` and copies the
buffer. On a Hopper GPU the consumer's blocks are resident while the
producer still runs, so a missing or misplaced wait reads stale values (the
buffer is poisoned before every launch pair); in the simulator both device
functions are no-ops and the launch is a plain one, so the test checks the
same kernels and the fallback path. The split-K decode phase is checked with
the dependent combine on and off, on an uneven split.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, float32

from numba_attn import Problem, get_phase
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.pdl import grid_dependency_wait, launch_after, launch_dependents, pdl_available, uses_griddepcontrol
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure

gpu_only = pytest.mark.skipif(IS_SIMULATOR, reason="needs a CUDA GPU (the dependent launch itself)")


@functools.cache
def _kernels():
    @kernel
    def producer(buf, n_iter):
        launch_dependents()  # the consumer may launch now: it must still wait for the values below
        i = cuda.grid(1)
        if i < buf.size:
            x = float32(i)
            for _ in range(n_iter):  # long enough that the consumer is resident before the store
                x = x * float32(0.999999) + float32(1e-6)
            buf[i] = x

    @kernel
    def consumer(buf, out):
        grid_dependency_wait()
        i = cuda.grid(1)
        if i < buf.size:
            out[i] = buf[i]

    return producer, consumer


def _expected(n, n_iter):
    x = np.arange(n, dtype=np.float32)
    for _ in range(n_iter):
        x = x * np.float32(0.999999) + np.float32(1e-6)
    return x


def test_consumer_sees_the_producers_results():
    n, n_iter = (96, 3) if IS_SIMULATOR else (1 << 16, 20000)
    producer, consumer = _kernels()
    buf = cuda.to_device(np.full(n, np.nan, np.float32))
    out = cuda.to_device(np.full(n, np.nan, np.float32))
    expected = _expected(n, n_iter) if IS_SIMULATOR else None
    stream = cuda.stream()
    for rep in range(3):
        buf.copy_to_device(np.full(n, -1.0, np.float32), stream=stream)
        out.copy_to_device(np.full(n, np.nan, np.float32), stream=stream)
        producer[(n + 127) // 128, 128, stream](buf, n_iter)
        used = launch_after(consumer, (n + 127) // 128, 128, stream, 0, buf, out)
        stream.synchronize()
        got = out.copy_to_host()
        assert used == (pdl_available() is None)
        if expected is None:  # the GPU's own results are the reference: the producer's buffer
            expected = buf.copy_to_host()
            assert not np.any(expected == -1.0)
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_availability_is_explained():
    reason = pdl_available()
    if IS_SIMULATOR:
        assert reason == "simulator"
        assert uses_griddepcontrol()
    else:
        assert reason is None or isinstance(reason, str)


@pytest.mark.parametrize("pdl,even,S", [(1, False, 3), (2, True, 3), (3, False, 3), (0, True, 5)],
                         ids=["trigger-at-start", "trigger-after-loop-even", "at-exit", "plain-even-empty"])
def test_decode_mma_dependent_combine(pdl, even, S):
    # 4 query heads on one KV head, 45 keys = 3 tiles of 16. Even splits: 3 splits take one tile
    # each; 5 splits leave two empty. Else 32 keys per split: of 3 splits the last one is empty.
    p = Problem(batch=1, heads=4, kv_heads=1, q_len=1, kv_len=45, head_dim=16, dtype="float16")
    params = dict(warps=1, Bc=16, stages=2, splits=S, pdl=pdl, even=even, fixed_combine=(pdl != 3))
    launch = get_phase("decode_mma").plan(p, **params)
    assert len(launch.kernels) == 2
    if pdl and pdl_available() is None:
        assert "dependent launch" in launch.notes
    row = measure("decode_mma", p, RunConfig(seeds=(21,), time_kernels=False), **params)
    assert row["status"] == "OK", row["reason"]


@gpu_only
def test_dependent_launch_is_used_on_hopper():
    cc = cuda.get_current_device().compute_capability
    if cc < (9, 0):
        pytest.skip(f"compute capability {cc}: no programmatic dependent launch")
    assert pdl_available() is None, pdl_available()
