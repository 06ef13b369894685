"""Core: problem definition, reference and gate, registry, warp fallbacks, API, CLI."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import numba_attn
from numba import cuda, float32  # module globals: the simulator swaps `cuda` in a kernel's globals
from numba_attn.gpu.jit import kernel
from numba_attn.gpu.warp import FULL_MASK, quad_sum, shfl_down_sync, shfl_sync, shfl_xor_sync, warp_max, warp_sum
from numba_attn import Problem, attention, get_phase, list_phases, reference
from numba_attn.spec.errors import AttentionInputError, UnknownPhaseError
from numba_attn.spec.reference import check, poison
from numba_attn.phases.registry import Launch, register_phase, unregister
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure


# -- problem -----------------------------------------------------------------

@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 5), (5, 9), (1, 17), (13, 40)])
def test_causal_pair_count_is_exact(nq, nk):
    p = Problem(q_len=nq, kv_len=nk, head_dim=8, causal=True, heads=3, batch=2)
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    visible = int((j <= i + nk - nq).sum())
    assert p.pairs_per_head() == visible
    assert p.flops() == 4 * 2 * 3 * 8 * visible


def test_problem_counts_and_inputs():
    p = Problem(batch=2, heads=4, kv_heads=2, q_len=7, kv_len=11, head_dim=16, dtype="float16")
    assert p.flops() == 4 * 2 * 4 * 16 * 7 * 11
    assert p.min_bytes() == (2 * 4 * 7 * 16 * 2 + 2 * 2 * 2 * 11 * 16) * 2
    q, k, v = p.inputs(3)
    assert q.shape == (2, 4, 7, 16) and k.shape == (2, 2, 11, 16) and q.dtype == np.float16
    assert np.count_nonzero(q) == q.size and np.count_nonzero(v) == v.size
    q2, _, _ = p.inputs(3)
    q3, _, _ = p.inputs(4)
    assert np.array_equal(q, q2) and not np.array_equal(q, q3)
    assert p.sm_scale == pytest.approx(0.25)


@pytest.mark.parametrize("kw,match", [
    (dict(head_dim=0), "head_dim"),
    (dict(heads=3, kv_heads=2), "multiple of kv_heads"),
    (dict(dtype="int8"), "dtype"),
    (dict(scale=-1.0), "scale"),
    (dict(scale=float("nan")), "scale"),
    (dict(q_len=9, kv_len=4, causal=True), "q_len <= kv_len"),
])
def test_problem_validation(kw, match):
    with pytest.raises(AttentionInputError, match=match):
        Problem(**kw)


# -- reference and gate --------------------------------------------------------

def test_reference_matches_textbook_formula_and_lse():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, n, 8)) for n in (5, 9, 9))
    out, lse = reference(q, k, v, causal=True, return_lse=True)
    for h in range(2):
        for i in range(5):
            s = np.array([q[0, h, i] @ k[0, h, j] / math.sqrt(8) if j <= i + 4 else -np.inf for j in range(9)])
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[0, h, i], (p / p.sum()) @ v[0, h], rtol=1e-12)
            np.testing.assert_allclose(lse[0, h, i], np.log(np.exp(s).sum()), rtol=1e-12)


def test_reference_grouped_query_heads_share_kv():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 3, 8))
    k, v = rng.standard_normal((2, 1, 2, 6, 8))
    out = reference(q, k, v)
    full = reference(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1))
    np.testing.assert_allclose(out, full)


def test_check_verdicts():
    p = Problem(heads=2, q_len=6, kv_len=6, head_dim=8)
    q, k, v = p.inputs(0)
    ref = reference(q, k, v)
    good = ref.astype(np.float32)
    assert check(good, ref).ok
    assert not check(good * 1.01, ref).ok
    nan = good.copy()
    nan[0, 0, 0, 0] = np.nan
    c = check(nan, ref)
    assert not c.ok and c.nonfinite == 1
    unwritten = good.copy()
    poison(unwritten[0, 1, 2:4], "float32")
    c = check(unwritten, ref)
    assert not c.ok and c.unwritten == 2 * 8 and "never written" in c.reason
    assert not check(good[:, :, :5], ref).ok
    assert not check(np.zeros_like(good), ref).ok


# -- registry ------------------------------------------------------------------

def test_registry_metadata_is_complete():
    phases = list_phases()
    from numba_attn.phases import BROKEN

    assert not BROKEN, f"phase modules failed to import: {BROKEN}"
    names = [p.name for p in phases]
    assert names[:3] == ["naive", "fused_rowwise", "smem_kv"]
    assert len(set(p.order for p in phases)) == len(phases), "orders must be unique"
    for p in phases:
        assert p.title and p.description and p.lineage, p.name
        assert p.planned_speedup is not None and p.planned_speedup > 0, p.name
        assert p.kind in ("prefill", "decode"), p.name
        assert sys.modules[p.module].__doc__, f"{p.name}: module docstring missing"
        if p.parent is None:
            assert p.name == "naive"
        else:
            parent = get_phase(p.parent)
            assert parent.order < p.order, f"{p.name}: parent {p.parent} comes later"
        assert p.source_file.endswith(".py") and "def " in p.source()


def test_unknown_phase_suggests_close_names():
    with pytest.raises(UnknownPhaseError, match="smem_kv"):
        get_phase("smem_kvv")


# -- a deliberately broken kernel must FAIL ----------------------------------------

@pytest.fixture
def broken_phase():
    from numba_attn.phases.cuda_core.p02_smem_kv import make_kernel

    @register_phase(name="_test_unscaled", order=-1, title="broken", parent=None,
                    description="smem_kv without the softmax scale", lineage="test",
                    planned_speedup=1.0)
    def _test_unscaled(problem, Br=16, Bc=16):
        from numba import float32

        kern = make_kernel(problem.head_dim, Br, Bc, problem.causal)
        grid = ((problem.q_len + Br - 1) // Br, problem.batch * problem.heads)

        def run(q, k, v, o, stream=0):
            kern[grid, Br, stream](q, k, v, o, float32(1.0), problem.heads, problem.group,
                                   problem.q_len, problem.kv_len, ())  # (): no variant arrays

        return Launch(run, kernels=[kern])

    yield get_phase("_test_unscaled")
    unregister("_test_unscaled")


def test_gate_rejects_a_broken_kernel(broken_phase):
    row = measure(broken_phase, Problem(heads=1, q_len=20, kv_len=20, head_dim=16), RunConfig(seeds=(1,)))
    assert row["status"] == "FAIL" and "relative error" in row["reason"]
    assert "time_ms" not in row or row["time_ms"] is None


def test_exception_in_a_phase_is_recorded_not_raised():
    @register_phase(name="_test_raises", order=-2, title="raises", parent=None, description="x",
                    lineage="test", planned_speedup=1.0)
    def _test_raises(problem):
        raise RuntimeError("kaboom")

    try:
        row = measure("_test_raises", Problem(q_len=4, head_dim=8), RunConfig(seeds=(1,)))
    finally:
        unregister("_test_raises")
    assert row["status"] == "ERROR" and "kaboom" in row["reason"]


# -- warp primitives (simulator fallbacks vs NumPy) ---------------------------------

@pytest.mark.simulator
def test_warp_fallbacks_follow_shfl_semantics():
    @kernel
    def k(x, out):
        t = cuda.threadIdx.x
        v = x[t]
        out[0, t] = shfl_xor_sync(FULL_MASK, v, 5)
        out[1, t] = shfl_down_sync(FULL_MASK, v, 3)
        out[2, t] = shfl_sync(FULL_MASK, v, 7)
        out[3, t] = warp_sum(v)
        out[4, t] = warp_max(v)
        out[5, t] = quad_sum(v)
        out[6, t] = float32(0.0)

    x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    out = np.zeros((7, 64), np.float32)
    k[1, 64](x, out)
    lane = np.arange(64) % 32
    base = np.arange(64) - lane
    np.testing.assert_array_equal(out[0], x[base + (lane ^ 5)])
    np.testing.assert_array_equal(out[1], np.where(lane + 3 < 32, x[np.minimum(base + lane + 3, 63)], x))
    np.testing.assert_array_equal(out[2], x[base + 7])
    for w in range(2):
        sl = slice(32 * w, 32 * w + 32)
        np.testing.assert_allclose(out[3, sl], x[sl].sum(), rtol=1e-5)
        assert np.all(out[4, sl] == x[sl].max())
    np.testing.assert_allclose(out[5], x.reshape(16, 4).sum(1).repeat(4), rtol=1e-5)


# -- API -------------------------------------------------------------------------

def test_attention_api_numpy_in_numpy_out():
    p = Problem(batch=1, heads=2, q_len=9, kv_len=13, head_dim=16, causal=True)
    q, k, v = p.inputs(5)
    out = attention(q, k, v, causal=True, phase="smem_kv", Br=16, Bc=8)
    assert isinstance(out, np.ndarray) and out.shape == (1, 2, 9, 16)
    assert check(out, reference(q, k, v, causal=True)).ok


def test_attention_api_device_arrays_and_default_phase():
    p = Problem(batch=1, heads=1, q_len=8, kv_len=8, head_dim=16)
    q, k, v = p.inputs(6)
    out = attention(*(cuda.to_device(a) for a in (q, k, v)))
    from numba_attn.api import is_device_array

    assert is_device_array(out)
    assert check(out.copy_to_host(), reference(q, k, v)).ok


def test_attention_api_rejects_bad_shapes():
    q = np.ones((1, 2, 4, 16), np.float32)
    with pytest.raises(AttentionInputError, match="head_dim"):
        attention(q, np.ones((1, 2, 4, 8), np.float32), np.ones((1, 2, 4, 8), np.float32))
    with pytest.raises(AttentionInputError, match="4-D"):
        attention(q[0], q[0], q[0])


# -- CLI -------------------------------------------------------------------------

def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "numba_attn.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_cli_list_shows_registry():
    r = _cli("list")
    assert r.returncode == 0, r.stderr
    for p in list_phases():
        assert p.name in r.stdout


def test_cli_run_simulator_writes_results(tmp_path):
    res = tmp_path / "r.jsonl"
    r = _cli("run", "--simulator", "--phases", "smem_kv,fused_rowwise", "-H", "1", "-N", "11", "--kv-len", "23",
             "-D", "16", "--causal", "--param", "smem_kv.Br=8", "--param", "smem_kv.Bc=8", "--seeds", "3",
             "--results", str(res))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "simulator" in r.stdout and "smem_kv" in r.stdout and "OK" in r.stdout
    recs = [json.loads(line) for line in res.read_text().splitlines()]
    assert recs[0]["type"] == "env" and recs[0]["backend"] == "simulator"
    rows = [r for r in recs if r["type"] == "result"]
    assert {r["phase"] for r in rows} == {"smem_kv", "fused_rowwise"}
    assert all(r["status"] == "OK" and r["params"] for r in rows)


def test_cli_unknown_phase_is_a_clear_error():
    r = _cli("run", "--simulator", "--phases", "smem_k", "-N", "8", "-D", "16")
    assert r.returncode == 2 and "smem_kv" in r.stderr



# -- the package -------------------------------------------------------------------


def _import_graph():
    """numba_attn module → the numba_attn modules it imports (module- and function-level imports)."""
    import ast
    import pathlib

    root = pathlib.Path(numba_attn.__file__).parent
    mods = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + [node.module or ""]) \
                    if node.level else node.module
                base = base.rstrip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def test_package_has_no_import_cycles():
    graph = _import_graph()
    assert "numba_attn.measure.sweep" in graph["numba_attn.cli"]  # function-level imports count

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    cycles = sorted(m for m in graph if m in reach(m))
    assert not cycles, f"modules on an import cycle: {cycles}"

@pytest.mark.gpu
def test_gpu_run_is_timed_and_reports_resources():
    row = measure("smem_kv", Problem(heads=4, q_len=512, head_dim=64), RunConfig(seeds=(1,)))
    assert row["status"] == "OK" and row["time_ms"] > 0 and row["regs"] > 0
    assert numba_attn.BACKEND == "cuda"
