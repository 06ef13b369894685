"""The float64 reference cache of the correctness gate (``measure/check.py``): the inputs are drawn at
once and the reference computed in a thread, so that a row's first launch compiles meanwhile; one
computation per (problem, seed) however many ask; a failure reaches whoever waits; rows still check."""
import threading
import time

import numpy as np
import pytest

import numba_attn.measure.check as C
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import reference


def _problem(**kw):
    return Problem(**{"batch": 1, "heads": 2, "q_len": 19, "head_dim": 16, "dtype": "float16", **kw})


@pytest.fixture(autouse=True)
def _empty_cache():
    C.release_references()
    yield
    C.release_references()


def test_the_reference_is_computed_once_while_the_caller_goes_on(monkeypatch):
    calls, gate = [], threading.Event()
    real = C._compute_reference

    def slow(problem, q, k, v, device="cuda"):
        calls.append(1)
        gate.wait(10)
        return real(problem, q, k, v, device)

    monkeypatch.setattr(C, "_compute_reference", slow)
    p = _problem()
    q, k, v, fut = C.pending_reference(p, 3)
    assert q.shape == (1, 2, 19, 16) and not fut.done()  # the inputs are here, the reference is not yet
    again = C.pending_reference(p, 3)[3]
    assert again is fut  # a second caller waits for the same computation
    got = []
    waiter = threading.Thread(target=lambda: got.append(C.cached_reference(p, 3)))
    waiter.start()
    time.sleep(0.05)
    assert not got  # still waiting
    gate.set()
    waiter.join(10)
    ref = fut.result(10)
    assert len(calls) == 1 and got[0][3] is ref
    expect = reference(q, k, v, causal=False, scale=p.sm_scale)
    assert np.array_equal(ref, expect)
    assert C.cached_reference(p, 3)[3] is ref and len(calls) == 1  # cached


def test_a_failed_reference_reaches_the_caller_and_is_not_cached(monkeypatch):
    def broken(problem, q, k, v, device="cuda"):
        raise MemoryError("no room for the reference")

    monkeypatch.setattr(C, "_compute_reference", broken)
    p = _problem(q_len=7)
    with pytest.raises(MemoryError, match="no room"):
        C.cached_reference(p, 1)
    monkeypatch.undo()
    assert C.cached_reference(p, 1)[3].shape == (1, 2, 7, 16)  # computed afresh


def test_rows_check_against_the_reference_computed_meanwhile():
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure

    p = _problem(q_len=21, kv_len=23, causal=True)
    row = measure("naive", p, RunConfig(seeds=(5, 6), time_kernels=False))
    assert row["status"] == "OK", row["reason"]
    assert row["stage_s"]["reference"] > 0 and row["stage_s"]["reference_compute"] > 0
    from numba_attn.testing import faulty_phases, temporary_phases

    with temporary_phases(*faulty_phases()):  # a wrong result still fails against it
        bad = measure("test_wrong", p.replace(dtype="float32"), RunConfig(seeds=(5,), time_kernels=False))
    assert bad["status"] == "FAIL" and "relative error" in bad["reason"]


def test_no_room_on_the_device_computes_the_reference_first(monkeypatch):
    """A torch reference that would not fit beside the phase's arrays is computed before the launch (the
    future comes back done), as before the overlap; the answer is the same."""
    monkeypatch.setattr(C, "uses_torch_reference", lambda problem: True)
    monkeypatch.setattr(C, "_room_beside", lambda problem: False)
    p = _problem(q_len=9)
    q, k, v, fut = C.pending_reference(p, 2)
    assert fut.done()
    # the torch reference (float64 on the device) and NumPy's (float64 on the host) sum in different orders
    np.testing.assert_allclose(fut.result(), reference(q, k, v, causal=False, scale=p.sm_scale), rtol=1e-12, atol=1e-14)
