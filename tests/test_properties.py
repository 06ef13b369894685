"""Property-based tests (hypothesis), in the simulator.

1. Every registered phase computes attention: random small shapes (odd
   lengths, q_len != kv_len, grouped-query heads, causal or not), fresh random
   inputs each example, output checked against the float64 reference by the
   same gate the runner uses.
2. The gate rejects deliberately wrong kernels (``numba_attn.testing.BUGS``)
   on every shape where the bug changes the result, and passes the same
   kernel without the bug.

Example counts are small (the simulator runs every CUDA thread as a Python
thread); ``HYPOTHESIS_PROFILE=thorough`` raises them.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from numba_attn import Problem, list_phases
from numba_attn.spec.problem import PagedProblem, VarlenProblem
from numba_attn.spec.reference import check
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure
from numba_attn.testing import BUGGY_BC, BUGS, buggy_phase

settings.register_profile("ci", max_examples=3, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PHASES = list_phases()


def _dtype(phase):
    for dt in ("float32", "float16"):
        if dt in phase.dtypes:
            return dt
    return None


def _reads_8bit_caches_only(phase) -> bool:
    params = phase.resolve_params(phase.sim_params)
    shape = dict(batch=1, heads=2, kv_heads=1, q_len=1, kv_len=40, head_dim=64, dtype="float16", page_size=16)
    return (phase.supports(PagedProblem(**shape), **params) is not None
            and phase.supports(PagedProblem(**shape, kv_dtype="int8"), **params) is None)


@st.composite
def problems_for(draw, phase):
    """A small problem the phase supports (decode phases get a handful of queries)."""
    if phase.kind == "decode":
        q_len = draw(st.integers(1, 4))
    else:
        q_len = draw(st.integers(1, 19))
    causal = draw(st.booleans()) if phase.causal else False
    kv_len = draw(st.integers(q_len if causal else 1, 33))
    # one head, two (MHA) or a GQA group of 2 on one KV head (a larger group or more heads only change the KV head
    # index and multiply the simulated blocks)
    heads = draw(st.sampled_from([1, 2]))
    kv_heads = draw(st.sampled_from([1, heads]))
    head_dim = draw(st.sampled_from([16, 8] if phase.supports(Problem(head_dim=8, q_len=q_len, kv_len=kv_len,
                                                                      dtype=_dtype(phase)),
                                                              **phase.resolve_params(phase.sim_params)) is None
                                     else [16, 32]))
    p = Problem(batch=draw(st.integers(1, 2)), heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len,
                head_dim=head_dim, causal=causal, dtype=_dtype(phase))
    if phase.layout == "paged":  # the same shape over a paged cache (shuffled pages, maybe ragged lengths)
        cache = {}
        if _reads_8bit_caches_only(phase):  # (paged_mma8: 8-bit caches, head_dim a multiple of 64)
            cache = draw(st.sampled_from([{"kv_dtype": "float8_e4m3", "kv_scale": "head"},
                                          {"kv_dtype": "int8", "kv_scale": "token"}]))
            cache["head_dim"] = 64
        p = PagedProblem(**{**p.to_dict(), **cache}, page_size=draw(st.sampled_from([16, 32])),
                         ragged=draw(st.booleans()))
    if phase.layout == "varlen":  # the same shape as a packed batch (ragged lengths or not)
        p = VarlenProblem(**p.to_dict(), ragged=draw(st.booleans()))
    assume(phase.supports(p, **phase.resolve_params(phase.sim_params)) is None)
    return p, draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("phase", [p for p in PHASES if _dtype(p)], ids=lambda p: p.name)
def test_phase_matches_reference_on_random_shapes(phase):
    @given(case=problems_for(phase))
    def prop(case):
        problem, seed = case
        row = measure(phase, problem, RunConfig(seeds=(seed,)), **phase.sim_params)
        assert row["status"] == "OK", f"{phase.name} on {problem.label} (seed {seed}): {row['reason']}"
        assert row["check"]["rel_err"] <= row["check"]["tol"]

    prop()


# -- the gate rejects wrong kernels ---------------------------------------------------


@st.composite
def shapes_where(draw, bug):
    """Shapes on which ``bug`` changes the output (e.g. a partial last key tile)."""
    causal = draw(st.booleans())
    q_len = draw(st.integers(1, 11))
    kv_len = draw(st.integers(max(q_len, BUGGY_BC + 1), 29))
    if bug == "tile_edge":
        assume(kv_len % BUGGY_BC != 0)
    p = Problem(batch=1, heads=draw(st.sampled_from([1, 2])), q_len=q_len, kv_len=kv_len,
                head_dim=draw(st.sampled_from([4, 8, 16])), causal=causal)
    return p, draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("bug", list(BUGS))
def test_gate_rejects_deliberately_wrong_kernels(bug):
    phase = buggy_phase(bug)

    @given(case=shapes_where(bug))
    def prop(case):
        problem, seed = case
        row = measure(phase, problem, RunConfig(seeds=(seed,)))
        if bug == "none":
            assert row["status"] == "OK", row["reason"]
        else:
            assert row["status"] == "FAIL", f"the gate let {bug!r} through on {problem.label}: {row.get('check')}"
            assert "wrong result" in row["reason"]

    prop()


def test_gate_counts_unwritten_elements_separately():
    problem = Problem(batch=1, heads=1, q_len=5, kv_len=9, head_dim=8)
    row = measure(buggy_phase("unwritten"), problem, RunConfig(seeds=(3,)))
    assert row["status"] == "FAIL"
    assert row["check"]["unwritten"] == 5  # the last column of 5 rows
    assert "never written" in row["reason"]


def _small_supported(phase, causal, heads=2):
    dt = _dtype(phase)
    q_len = 3 if phase.kind == "decode" else 9
    for D in (16, 32, 8):
        p = Problem(batch=1, heads=heads, q_len=q_len, kv_len=13, head_dim=D, causal=causal, dtype=dt)
        if phase.supports(p, **phase.resolve_params(phase.sim_params)) is None:
            return p
    return None


def _run_phase(phase, problem, q, k, v):
    from numba import cuda

    from numba_attn.spec.reference import poison
    from numba_attn.measure.check import kernel_views

    launch = phase.plan(problem, **phase.sim_params)
    qd, kd, vd = (cuda.to_device(a) for a in (q, k, v))
    od = cuda.to_device(poison(np.empty(problem.out_shape(), q.dtype), problem.dtype))
    launch(*kernel_views(problem, qd, kd, vd, od), 0)
    return od.copy_to_host()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("phase", [p for p in PHASES if _dtype(p)], ids=lambda p: p.name)
def test_nan_and_inf_inputs_propagate_like_the_reference(phase):
    """Defined behaviour: NaN/Inf in q, or in a key/value that a query attends
    to, give NaN exactly where the float64 reference does."""
    from numba_attn.spec.reference import reference

    problem = _small_supported(phase, phase.causal)
    if problem is None:
        pytest.skip(f"{phase.name} supports none of the small test shapes")
    q, k, v = problem.inputs(4)
    off = problem.kv_len - problem.q_len  # keys 0..off are visible to every query, causal or not
    q[0, 0, 1, 2] = np.nan  # one query row of head 0
    k[0, 1, off - 1, 0] = np.inf  # one key of head 1: +inf scores make NaN rows, -inf scores drop the key
    v[0, 0, off - 2, 1] = np.nan  # one value element of head 0: column 1 of every row
    ref = reference(q, k, v, causal=problem.causal, scale=problem.sm_scale)
    assert np.isnan(ref).any() and np.isfinite(ref).any()
    out = _run_phase(phase, problem, q, k, v)
    c = check(out, ref, dtype=problem.dtype, precision=phase.precision)
    assert c.ok, c.reason
    assert np.array_equal(np.isnan(out.astype(np.float64)), np.isnan(ref))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("phase", [p for p in PHASES if _dtype(p) and p.causal], ids=lambda p: p.name)
def test_nan_in_a_masked_key_does_not_leak(phase):
    """A causal query never reads keys after its position: NaN there leaves its
    output finite (only the last query sees the last key). One head (that a NaN stays in its head is
    test_nan_and_inf_inputs_propagate_like_the_reference's)."""
    from numba_attn.spec.reference import reference

    problem = _small_supported(phase, True, heads=1)
    if problem is None:
        pytest.skip(f"{phase.name} supports none of the small test shapes")
    q, k, v = problem.inputs(5)
    expected = reference(q, k, v, causal=True, scale=problem.sm_scale)
    k[0, 0, -1, :] = np.nan
    expected[0, 0, -1, :] = np.nan  # the last query sees the NaN key: its row is NaN
    out = _run_phase(phase, problem, q, k, v)
    c = check(out, expected, dtype=problem.dtype, precision=phase.precision)
    assert c.ok, c.reason
