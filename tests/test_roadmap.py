"""What is specific to the CUDA-core roadmap phases (q_smem … causal_skip).

``tests/test_phases.py`` already checks every registered phase with its
``sim_params``; here: the SEG trade-off of ``segmented_out``, the simulator
fallbacks of ``ptx_loads`` (vector loads, dynamic shared tiles), several tile
configurations of the register-blocked kernels on odd shapes, that
``causal_skip`` computes what ``register_blocked`` computes, float16 and GQA,
and the ``supports`` reasons. Shapes are tiny (a few blocks, head_dim ≤ 32).
"""
from __future__ import annotations

import numpy as np
import pytest

from numba_attn.gpu.backend import IS_SIMULATOR  # noqa: I001 - chooses the backend before numba loads
from numba import cuda, float32  # noqa: E402  (module level: the simulator swaps this global)
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, reference
from numba_attn.phases.registry import get_phase
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure

pytestmark = pytest.mark.skipif(not IS_SIMULATOR, reason="simulator tests (run with NUMBA_ATTN_BACKEND=simulator)")

ODD = Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16)
CFG = RunConfig(seeds=(3,))


def _run(name, problem, seed=3, **params):
    """Run a phase once and return its output (host array, the problem's dtype)."""
    launch = get_phase(name).plan(problem, **params)
    q, k, v = problem.inputs(seed)
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    o = np.full(problem.out_shape(), np.nan, dtype=q.dtype)
    qd, kd, vd, od = (cuda.to_device(a) for a in (q, k, v, o))
    launch(qd.reshape(B * H, problem.q_len, D), kd.reshape(B * Hkv, problem.kv_len, D),
           vd.reshape(B * Hkv, problem.kv_len, D), od.reshape(B * H, problem.q_len, D), 0)
    return od.copy_to_host(), (q, k, v)


def _ok(name, problem, **params):
    row = measure(name, problem, CFG, **params)
    assert row["status"] == "OK", f"{name} {problem.label} {params}: {row['status']} {row.get('reason')}"
    return row


# -- segmented_out: the SEG trade-off ----------------------------------------------------


@pytest.mark.parametrize("SEG", [16, 8, 4])
def test_segmented_out_every_segment_width(SEG):
    """SEG = D (one thread per row, the parent's layout), D/2 and D/4 threads per row."""
    _ok("segmented_out", ODD.replace(causal=True), Br=32, Bc=16, SEG=SEG)


def test_segmented_out_supports():
    ph = get_phase("segmented_out")
    assert "divide" in ph.supports(ODD, Br=32, Bc=16, SEG=6)
    assert "1024" in ph.supports(Problem(head_dim=128), Br=256, Bc=16, SEG=16)
    assert ph.supports(ODD, Br=32, Bc=16, SEG=4) is None


# -- ptx_loads: the simulator fallbacks of the vector accesses -------------------------


def test_vector_access_fallbacks():
    from numba_attn.gpu.ptx_loads import dynamic_tile, ldg4, lds4, sts4

    @cuda.jit
    def kern(src, out):
        t = dynamic_tile(8, 2, 8)  # rows of 8 floats, 8 floats past the base
        tid = cuda.threadIdx.x
        a, b, c, d = ldg4(src, 1, tid, 4)  # src[1, tid, 4:8] as float32
        sts4(t, tid, 4, a, b, c, d)
        cuda.syncthreads()
        x = lds4(t, 1 - tid, 4)
        for u in range(4):
            out[tid, u] = x[u] + float32(0.0)

    for dtype in (np.float32, np.float16):
        src = (np.arange(2 * 2 * 8).reshape(2, 2, 8) / 7).astype(dtype)
        out = np.zeros((2, 4), np.float32)
        kern[1, 2, 0, 4 * 32](src, out)
        np.testing.assert_array_equal(out, src[1, ::-1, 4:8].astype(np.float32))
        assert out.dtype == np.float32


def test_vector_access_misaligned_fails():
    """A column that is not a multiple of 4 would fault on the GPU: the fallback raises."""
    from numba_attn.gpu.ptx_loads import ldg4

    @cuda.jit
    def kern(src, out):
        a, b, c, d = ldg4(src, 0, 0, 2)
        out[0] = a

    with pytest.raises(Exception, match="multiple of 4"):
        kern[1, 1](np.zeros((1, 1, 8), np.float32), np.zeros(1, np.float32))


def test_lds2_reads_a_pair_and_refuses_an_odd_column():
    """``lds2``: two neighbouring floats of a shared row by one 8-byte load; an odd column would fault on the GPU
    (misaligned), so the fallback raises."""
    from numba_attn.gpu.loads import lds2
    from numba_attn.gpu.ptx_loads import dynamic_tile

    @cuda.jit
    def kern(src, out, col):
        t = dynamic_tile(0, 2, 8)
        tid = cuda.threadIdx.x
        for c in range(8):
            t[tid, c] = src[tid, c]
        cuda.syncthreads()
        a, b = lds2(t, 1 - tid, col)
        out[tid, 0] = a
        out[tid, 1] = b

    src = (np.arange(16).reshape(2, 8) / 3).astype(np.float32)
    out = np.zeros((2, 2), np.float32)
    kern[1, 2, 0, 16 * 4](src, out, 4)
    np.testing.assert_array_equal(out, src[::-1, 4:6])
    with pytest.raises(Exception, match="even"):
        kern[1, 2, 0, 16 * 4](src, out, 3)


def test_f32x4_loads_and_stores_16_bytes_and_refuses_a_misaligned_column():
    """``ld_f32x4`` / ``st_f32x4``: four floats of a global row by one 16-byte access (dQ's finishing kernel reads its
    accumulator and zeroes it so); a column that is not a multiple of 4 would fault on the GPU, so the fallback
    raises."""
    from numba_attn.gpu.loads import ld_f32x4, st_f32x4

    @cuda.jit
    def kern(acc, out, col):
        tid = cuda.threadIdx.x
        a, b, c, d = ld_f32x4(acc, tid, col)
        out[tid, 0], out[tid, 1], out[tid, 2], out[tid, 3] = a, b, c, d
        z = np.float32(0.0)
        st_f32x4(acc, tid, col, z, z, z, z)

    src = (np.arange(24).reshape(2, 12) / 3 + 1).astype(np.float32)
    acc, out = src.copy(), np.zeros((2, 4), np.float32)
    kern[1, 2](acc, out, 8)
    np.testing.assert_array_equal(out, src[:, 8:12])
    np.testing.assert_array_equal(acc[:, 8:], 0.0)
    np.testing.assert_array_equal(acc[:, :8], src[:, :8])
    with pytest.raises(Exception, match="16-byte aligned"):
        kern[1, 2](src.copy(), out, 6)


def test_dynamic_tile_past_the_allocation_fails():
    from numba_attn.gpu.ptx_loads import dynamic_tile

    @cuda.jit
    def kern(out):
        t = dynamic_tile(0, 4, 8)  # 32 floats: more than the 16 the launch asks for
        out[0] = t[0, 0]

    with pytest.raises(Exception, match="past the"):
        kern[1, 1, 0, 16 * 4](np.zeros(1, np.float32))


# -- register-blocked kernels: tile configurations, causal skipping --------------------


@pytest.mark.parametrize("cfg", [
    dict(Br=32, Bc=16, TM=4, TN=4),   # 1 warp, KG = 4
    dict(Br=32, Bc=32, TM=4, TN=8),   # two 16-byte K chunks per thread
    dict(Br=64, Bc=16, TM=8, TN=4),   # two 16-byte Q chunks per thread
])
def test_register_blocked_tile_configurations(cfg):
    _ok("register_blocked", ODD.replace(head_dim=32, causal=True), **cfg)


def test_register_blocked_supports():
    ph = get_phase("register_blocked")
    assert "multiples of 4" in ph.supports(ODD, Br=32, Bc=16, TM=2, TN=4)
    assert "warp size" in ph.supports(ODD, Br=32, Bc=192, TM=4, TN=4)
    assert "multiple of 32" in ph.supports(ODD, Br=16, Bc=16, TM=4, TN=4)
    assert "shared memory" in ph.supports(Problem(head_dim=128), Br=256, Bc=64, TM=8, TN=4)
    assert ph.supports(ODD, Br=32, Bc=16, TM=4, TN=4) is None


@pytest.mark.parametrize("problem", [
    ODD.replace(causal=True),                                   # q_len < kv_len: bottom-right diagonal
    Problem(batch=1, heads=1, q_len=45, kv_len=45, head_dim=16, causal=True),
])
def test_causal_skip_matches_register_blocked(problem):
    """Skipping the mask on interior tiles and reordering blocks changes nothing."""
    params = dict(Br=32, Bc=16, TM=4, TN=4)
    ref_out, (q, k, v) = _run("register_blocked", problem, **params)
    for heavy_first in (0, 1):
        out, _ = _run("causal_skip", problem, heavy_first=heavy_first, **params)
        np.testing.assert_allclose(out, ref_out, rtol=1e-6, atol=1e-7)
    assert check(ref_out, reference(q, k, v, causal=True), dtype=problem.dtype).ok


def test_causal_skip_float16_gqa():
    _ok("causal_skip", Problem(batch=2, heads=2, kv_heads=1, q_len=33, kv_len=40, head_dim=32,
                               causal=True, dtype="float16"), Br=32, Bc=16, TM=4, TN=4)  # (group 2, one KV head)


@pytest.mark.parametrize("name", ["q_smem", "warp_specialized", "double_buffer"])
def test_row_phases_float16_gqa(name):
    _ok(name, Problem(batch=1, heads=4, kv_heads=1, q_len=29, kv_len=35, head_dim=16, causal=True,
                      dtype="float16"), **get_phase(name).sim_params)
