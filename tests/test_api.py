"""attention() without PyTorch: out= for NumPy and numba device arrays, the plan cache (a second
call plans nothing; a changed shape, parameter type, registry or clear_plans() plans again; the
cache is bounded), stream=, and that importing numba-attn imports no torch."""
import ctypes
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

import numba_attn.api as api
from numba_attn import plans
from numba_attn import Problem, attention, check, reference
from numba_attn.phases.registry import Phase
from numba_attn.spec.errors import AttentionInputError
from numba_attn.testing import temporary_phases

P = Problem(batch=1, heads=2, q_len=5, kv_len=9, head_dim=8)
Q, K, V = P.inputs(1)
SMEM = dict(phase="smem_kv", Br=16, Bc=16)  # small tiles: quick in the simulator


@pytest.fixture(autouse=True)
def _no_plans():
    api.clear_plans()
    yield
    api.clear_plans()


@pytest.fixture
def planned(monkeypatch):
    """Counts of the planning steps: ``_plan`` (checks, choice) and ``Phase.plan`` (build)."""
    counts = {"checks": 0, "builds": 0}
    real_plan, real_build = api._plan, Phase.plan

    def checks(*a, **k):
        counts["checks"] += 1
        return real_plan(*a, **k)

    def builds(self, *a, **k):
        counts["builds"] += 1
        return real_build(self, *a, **k)

    monkeypatch.setattr(api, "_plan", checks)
    monkeypatch.setattr(Phase, "plan", builds)
    return counts


def test_numpy_out_is_written_in_place_and_returned():
    out = np.full(Q.shape, np.nan, np.float32)
    got = attention(Q, K, V, out=out, **SMEM)
    assert got is out and check(out, reference(Q, K, V)).ok
    again = attention(Q, K, V, out=out, **SMEM)  # from the cached plan
    assert again is out and check(out, reference(Q, K, V)).ok


def test_device_array_out_is_written_in_place_and_returned():
    q, k, v = (cuda.to_device(a) for a in (Q, K, V))
    out = cuda.device_array(Q.shape, np.float32)
    for _ in range(2):  # planned, then cached
        got = attention(q, k, v, causal=True, out=out, **SMEM)
        assert got is out and check(out.copy_to_host(), reference(Q, K, V, causal=True)).ok


BAD_OUT = [
    ("shape", lambda: np.empty((1, 2, 5, 4), np.float32), "out has shape (1, 2, 5, 4); it must have q's shape"),
    ("dtype", lambda: np.empty(Q.shape, np.float16), "out has dtype float16; it must have q's dtype float32"),
    ("strided", lambda: np.empty((1, 2, 8, 5), np.float32).swapaxes(2, 3), "out is not C-contiguous"),
    ("read-only", lambda: np.broadcast_to(np.zeros(8, np.float32), Q.shape), "out is read-only"),
    ("kind", lambda: cuda.device_array(Q.shape, np.float32), "out is a numba device array but q is a NumPy array"),
    ("not an array", lambda: [0.0], "out must be a NumPy array like q (or None); got list"),
    ("aliases q", lambda: Q, "out shares memory with q"),
]


@pytest.mark.parametrize("case,make,msg", BAD_OUT, ids=[c[0] for c in BAD_OUT])
def test_bad_out_is_refused_naming_out(case, make, msg):
    q = Q.copy()
    out = q if case == "aliases q" else make()
    for _ in range(2):  # refused when planning and when the plan is cached
        with pytest.raises(AttentionInputError) as exc:
            attention(q, K, V, out=out, **SMEM)
        assert msg in str(exc.value)
        attention(q, K, V, **SMEM)


def test_bad_device_out_is_refused_naming_out():
    q, k, v = (cuda.to_device(a) for a in (Q, K, V))
    with pytest.raises(AttentionInputError, match="out has dtype float16"):
        attention(q, k, v, out=cuda.device_array(Q.shape, np.float16), **SMEM)
    inside_k = k.reshape(-1)[: Q.size].reshape(Q.shape)  # q's shape, in k's memory
    with pytest.raises(AttentionInputError, match="out shares memory with k"):
        attention(q, k, v, out=inside_k, **SMEM)
    with pytest.raises(AttentionInputError, match="out is a NumPy array but q is a numba device array"):
        attention(q, k, v, out=np.empty(Q.shape, np.float32), **SMEM)


def test_a_second_call_plans_nothing_and_a_new_shape_plans_again(planned):
    out = attention(Q, K, V, **SMEM)
    assert planned == {"checks": 1, "builds": 1}
    again = attention(Q, K, V, **SMEM)
    assert planned == {"checks": 1, "builds": 1} and np.array_equal(out, again)
    assert api.plan_cache_info()["hits"] == 1
    attention(Q[:, :, :3], K, V, **SMEM)  # another q_len
    assert planned == {"checks": 2, "builds": 2}
    attention(Q, K, V, phase="smem_kv", Br=16, Bc=32)  # another parameter
    attention(Q, K, V, causal=True, **SMEM)  # causal
    attention(Q, K, V, scale=0.5, **SMEM)  # scale
    assert planned["builds"] == 5
    attention(Q, K, V, scale=0.5, **SMEM)
    assert planned["builds"] == 5


def test_the_choice_of_phase_none_is_cached(monkeypatch, planned):
    calls = []
    real = api.choose_phase
    monkeypatch.setattr(api, "choose_phase", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = Problem(batch=1, heads=1, q_len=1, kv_len=16, head_dim=8)  # decode: quick in the simulator
    q, k, v = p.inputs(2)
    first = attention(q, k, v)
    assert attention(q, k, v) is not None and len(calls) == 1 and planned["builds"] == 1
    assert check(first, reference(q, k, v)).ok


def test_the_key_keeps_argument_types_apart():
    attention(Q, K, V, **SMEM)
    with pytest.raises(AttentionInputError, match="parameter Br of phase 'smem_kv' must be an integer >= 1; got True"):
        attention(Q, K, V, phase="smem_kv", Br=True, Bc=16)  # True == 1 but is not an integer here
    attention(Q, K, V, causal=False, phase="smem_kv", Br=16, Bc=16)
    with pytest.raises(AttentionInputError, match="causal must be a bool"):
        attention(Q, K, V, causal=0.0, **SMEM)  # 0.0 == False but is not a bool


def test_registry_changes_and_clear_plans_drop_the_plans(planned):
    attention(Q, K, V, **SMEM)
    extra = Phase(name="unused_extra", order=997, title="", parent=None, description="", lineage="",
                  planned_speedup=None, build=lambda problem: None, params={}, module=__name__)
    with temporary_phases(extra):
        attention(Q, K, V, **SMEM)  # one more phase: choices may differ, planned again
    assert planned["builds"] == 2
    attention(Q, K, V, **SMEM)  # and back: planned again
    assert planned["builds"] == 3
    api.clear_plans()
    assert api.plan_cache_info() == {"hits": 0, "misses": 0, "plans": 0, "workspace": 0}
    attention(Q, K, V, **SMEM)
    assert api.plan_cache_info()["misses"] == 1


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    for n in (2, 3, 4, 5):
        attention(Q[:, :, :n], K, V, **SMEM)
    assert api.plan_cache_info()["plans"] == 2


def test_stream_argument():
    s = cuda.stream()
    out = attention(Q, K, V, stream=s, **SMEM)
    assert check(out, reference(Q, K, V)).ok
    assert np.array_equal(attention(Q, K, V, stream=s, **SMEM), out)
    assert np.array_equal(attention(Q, K, V, stream=0, **SMEM), out)
    with pytest.raises(AttentionInputError, match="stream must be None, (0 or )?a numba stream"):
        attention(Q, K, V, stream="default", **SMEM)


def test_importing_numba_attn_imports_no_torch():
    code = ("import sys, numba_attn, numba_attn.api, numba_attn.integrations, numba_attn.cli; "
            "numba_attn.list_phases(); assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_tuning_written_after_a_plan_replaces_it(monkeypatch, tmp_path, planned):
    from numba_attn.measure import tune as tuning

    path = tmp_path / "cache.json"
    monkeypatch.setenv(tuning.CACHE_ENV, str(path))
    attention(Q, K, V, phase="smem_kv")  # no entry: the default parameters
    attention(Q, K, V, phase="smem_kv")
    assert planned["builds"] == 1 and next(iter(plans.PLANS.values())).params["Br"] == 128
    key = tuning.cache_key(api.device_name(), P)
    tuning.TuningCache(str(path)).update([(key, "smem_kv", {"params": {"Br": 16, "Bc": 16}, "time_ms": None}, True)])
    out = attention(Q, K, V, phase="smem_kv")  # the file changed: planned again, with the tuned tiles
    assert planned["builds"] == 2 and next(iter(plans.PLANS.values())).params == {"Br": 16, "Bc": 16}
    assert check(out, reference(Q, K, V)).ok


def _replay_problems(phase):
    """A small problem of the phase's kind with odd lengths and GQA, in its first dtype."""
    dtype = phase.dtypes[0]
    if phase.kind == "decode":
        return Problem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=301, head_dim=64, dtype=dtype)
    return Problem(batch=1, heads=4, kv_heads=2, q_len=77, kv_len=131, head_dim=64, dtype=dtype, causal=True)


@pytest.mark.gpu
def test_replayed_calls_are_correct_for_every_phase():
    """On a GPU a plan's later calls replay the first call's recorded launches at new addresses
    (gpu/replay.py): for every built-in phase, three calls on fresh inputs and poisoned outputs
    (the last two replayed) all match the float64 reference."""
    from numba_attn.phases.registry import list_phases

    failures, replayed = [], []
    for phase in list_phases():
        if not phase.is_builtin:
            continue
        prob = _replay_problems(phase)
        if phase.supports(prob) is not None:
            continue
        api.clear_plans()
        for seed in (11, 12, 13):
            q, k, v = prob.inputs(seed)
            qd, kd, vd = (cuda.to_device(a) for a in (q, k, v))
            od = cuda.to_device(np.full(q.shape, np.nan, dtype=q.dtype))
            attention(qd, kd, vd, causal=prob.causal, phase=phase.name, out=od)
            c = check(od.copy_to_host(), reference(q, k, v, causal=prob.causal), dtype=prob.dtype,
                      precision=phase.precision)
            if not c.ok:
                failures.append(f"{phase.name} {prob.label} seed {seed}: {c.reason}")
        plan = next(iter(plans.PLANS.values()))
        if plan.replay is not None:
            replayed.append(phase.name)
        assert api.plan_cache_info()["hits"] == 2, phase.name
    assert not failures, "\n".join(failures)
    assert {"tc_wgmma", "tma_wgmma", "warp_specialized_tc", "decode_mma"} <= set(replayed), replayed
    print("replayed:", ", ".join(replayed))


def test_replay_moves_only_the_pointers_into_the_four_arrays(monkeypatch):
    """gpu/replay.py without a GPU: the parameters that point into q, k, v or o move with the
    arrays (at their offsets); everything else (sizes, scratch pointers, scalars) stays; a
    recording with an allocation, a copy or overlapping arrays is not replayed."""
    pytest.importorskip("cuda.core", reason="cuda.core comes with numba-cuda's CUDA extras")
    import cuda.core as core

    from numba_attn.gpu.replay import Recording, Replay

    calls = []
    monkeypatch.setattr(core, "launch", lambda stream, config, kernel, *args: calls.append((kernel, args)))
    base = [0x7000_0000, 0x7100_0000, 0x7200_0000, 0x7300_0000]
    sizes = [4096] * 4
    scratch = 0x7f00_0000
    rec = Recording(launches=[("s", "cfg", "split", (0, 0, 64, 2, base[0], 4, 16, 32, 2, 0, 0, 64, 2, base[1] + 256,
                                                     scratch, 7)),
                              ("s", "cfg", "combine", (scratch, base[3], 3))])
    replay = Replay.make(rec, base, sizes)
    new = [0x9000_0000, 0x9100_0000, 0x9200_0000, 0x9300_0000]
    replay(new)
    assert calls[0] == ("split", (0, 0, 64, 2, new[0], 4, 16, 32, 2, 0, 0, 64, 2, new[1] + 256, scratch, 7))
    assert calls[1] == ("combine", (scratch, new[3], 3))
    assert Replay.make(Recording(launches=rec.launches, refusals=["memalloc"]), base, sizes) is None
    assert Replay.make(rec, [base[0], base[1], base[1] + 100, base[3]], sizes) is None  # k and v overlap


def test_replay_substitutes_the_pointers_derived_from_the_addresses(monkeypatch):
    """A Launch's ``derived`` pointers (the TMA phases' K/V tensor maps, made from K's and V's addresses): a
    replay launches with ``derived`` of the new addresses; a derived pointer no launch takes, or one inside an
    array, refuses the replay; work under ``setup()`` does not refuse a recording."""
    pytest.importorskip("cuda.core", reason="cuda.core comes with numba-cuda's CUDA extras")
    import cuda.core as core

    from numba_attn.gpu import replay as R

    calls = []
    monkeypatch.setattr(core, "launch", lambda stream, config, kernel, *args: calls.append(args))
    base = [0x7000_0000, 0x7100_0000, 0x7200_0000, 0x7300_0000]
    sizes = [4096] * 4

    def maps(addresses):  # a tensor map per K and V address, far from the arrays
        return (0x5000_0000 + (addresses[1] >> 12), 0x5000_0000 + (addresses[2] >> 12) + 1)

    m = maps(base)
    rec = R.Recording(launches=[("s", "cfg", "fwd", (base[0], 0, m[0], 0, m[1], base[3], 9))])
    replay = R.Replay.make(rec, base, sizes, maps)
    new = [0x9000_0000, 0x9100_0000, 0x9200_0000, 0x9300_0000]
    replay(new)
    n = maps(new)
    assert n != m and calls[-1] == (new[0], 0, n[0], 0, n[1], new[3], 9)
    assert R.Replay.make(rec, base, sizes, lambda a: (*maps(a), 0x4444_0000)) is None  # not in the launch
    assert R.Replay.make(rec, base, sizes, lambda a: (a[1] + 64,)) is None  # inside K: ambiguous

    rec2 = R.Recording()
    copy = R.refusal(rec2, "host_to_device", lambda: "copied")
    with R.setup():
        assert copy() == "copied"
    assert rec2.refusals == []
    assert copy() == "copied" and rec2.refusals == ["host_to_device"]


def test_decode_paged_tries_paged_mma8_first_for_8bit_caches():
    """phase=None on an 8-bit cache that paged_mma8 reads (GQA up to 8 rows per KV head): paged_mma8 first
    (measured faster than paged_mma there); otherwise the order by rows per KV head."""
    from numba_attn.api import PAGED_DEFAULT, paged_default
    from numba_attn.measure.policy import PAGED_DEFAULT_MMA8
    from numba_attn.spec.problem import PagedProblem

    def prob(kv_dtype="float8_e4m3", q_len=1, D=64, dtype="float16"):
        return PagedProblem(batch=2, heads=4, kv_heads=1, q_len=q_len, kv_len=64, head_dim=D, dtype=dtype,
                            page_size=16, kv_dtype=kv_dtype, kv_scale="head" if kv_dtype else "tensor")

    assert paged_default(prob()) == PAGED_DEFAULT_MMA8  # 4 rows per KV head, fp8: paged_mma8
    assert paged_default(prob(q_len=2)) == PAGED_DEFAULT_MMA8  # 8 rows: still paged_mma8
    assert paged_default(prob(q_len=3)) == PAGED_DEFAULT  # 12 rows: beyond the mma's 8 columns
    assert paged_default(prob(D=32)) == PAGED_DEFAULT  # head_dim not a multiple of 64
    assert paged_default(prob(dtype="bfloat16")) == PAGED_DEFAULT  # an f16 query only
    assert paged_default(prob(kv_dtype="int8")) == PAGED_DEFAULT_MMA8  # int8: paged_mma8 too
    assert paged_default(prob(kv_dtype="int8", q_len=3)) == PAGED_DEFAULT
    assert paged_default(prob(kv_dtype="")) == PAGED_DEFAULT


def test_driver_launch_packs_the_parameters_once_as_cuda_core_passes_them(monkeypatch):
    """A replay's DriverLaunch (gpu/replay.py, no GPU needed): Python ints go to the driver as 64-bit values, bools
    as one byte, ctypes scalars as they are; a replay writes only the moved pointers; the grid, block and dynamic
    shared memory are the recorded configuration's; a cluster launch is not packed (cuda.core keeps it)."""
    driver = pytest.importorskip("cuda.bindings.driver", reason="cuda.bindings comes with numba-cuda's CUDA extras")
    from cuda.core import LaunchConfig

    from numba_attn.gpu import replay as R

    seen = []

    def fake(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        arr = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        vals = (ctypes.cast(arr[0], ctypes.POINTER(ctypes.c_int64))[0],
                ctypes.cast(arr[1], ctypes.POINTER(ctypes.c_float))[0],
                ctypes.cast(arr[2], ctypes.POINTER(ctypes.c_bool))[0],
                ctypes.cast(arr[3], ctypes.POINTER(ctypes.c_int32))[0])
        seen.append((int(f), (gx, gy, gz, bx, by, bz, shmem), int(stream), vals, extra))
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(driver, "cuLaunchKernel", fake)

    class Kernel:
        handle = 0x1234

    cfg = LaunchConfig(grid=(3, 2), block=128, shmem_size=100)
    launch = R.DriverLaunch(0, cfg, Kernel(), [0x7000_0000, ctypes.c_float(1.5), True, ctypes.c_int32(-7)])
    launch()
    launch.values[0].value = 0x9000_0040
    launch()
    assert seen[0] == (0x1234, (3, 2, 1, 128, 1, 1, 100), 0, (0x7000_0000, 1.5, True, -7), 0)
    assert seen[1][3] == (0x9000_0040, 1.5, True, -7)
    assert R.DriverLaunch.pack_all([(0, cfg, Kernel(), [object()])]) is False  # a parameter it cannot pack

    class ClusterConfig:  # (a LaunchConfig with a cluster queries the device)
        grid, block, shmem_size, cluster = (2, 1, 1), (64, 1, 1), 0, (2, 1, 1)

    assert R.DriverLaunch.pack_all([(0, ClusterConfig(), Kernel(), [1])]) is False


def test_the_tuning_stamp_follows_the_environment_and_this_process_at_once(monkeypatch, tmp_path):
    """The tuning cache file is looked at most every 10 ms (plans.STAMP_NS), but a changed place of the cache (its
    environment variables, read from os.environ's own dict) and this process's own writes count at once."""
    first = plans.token()
    monkeypatch.setenv("NUMBA_ATTN_TUNING_CACHE", str(tmp_path / "a.json"))
    second = plans.token()
    assert second != first and second[1][0] == str(tmp_path / "a.json")
    (tmp_path / "a.json").write_text("{}")
    plans.tuning_changed()
    third = plans.token()
    assert third != second and third[1][1] is not None  # the file's stamp, seen without waiting
    monkeypatch.delenv("NUMBA_ATTN_TUNING_CACHE")
    assert plans.token()[1][0] == first[1][0] != str(tmp_path / "a.json")
