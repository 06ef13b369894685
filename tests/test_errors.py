"""Bad input gets a clear error naming the argument and the allowed range,
before anything is compiled or launched (``attention()`` and the CLI)."""
import os

import numpy as np
import pytest
from numba import cuda

from numba_attn import Problem, attention, check, reference
from numba_attn.cli import main
from numba_attn.spec.errors import AttentionInputError, UnknownPhaseError
from numba_attn.phases.registry import Launch, Phase
from numba_attn.testing import temporary_phases

P = Problem(batch=1, heads=2, q_len=5, kv_len=9, head_dim=8)
Q, K, V = P.inputs(1)


def _never_built(problem, **_):
    raise AssertionError("a phase was built although the input is invalid")


TRAP = Phase(name="trap", order=999, title="fails if planned", parent=None, description="", lineage="",
             planned_speedup=None, build=_never_built, params={}, module=__name__)


BAD_INPUTS = [
    ("float64", dict(q=Q.astype(np.float64)), "q has dtype float64; supported dtypes: float32, float16, bfloat16"),
    ("int", dict(q=Q.astype(np.int32), k=K.astype(np.int32), v=V.astype(np.int32)), "q has dtype int32"),
    ("mixed", dict(k=K.astype(np.float16), v=V.astype(np.float16)), "must share one dtype"),
    ("rank", dict(q=Q[0]), "q must be a 4-D array"),
    ("list", dict(v=[[1.0]]), "v must be a NumPy array or a numba device array"),
    ("kv shapes", dict(v=V[:, :, :4]), "k and v must have the same shape"),
    ("batch", dict(k=np.concatenate([K, K]), v=np.concatenate([V, V])), "same batch size"),
    ("head_dim", dict(k=K[..., :4].copy(), v=V[..., :4].copy()), "same head_dim"),
    ("heads", dict(q=np.concatenate([Q, Q[:, :1]], axis=1)), "must be a multiple of k/v heads"),
    ("kv_len 0", dict(k=K[:, :, :0], v=V[:, :, :0]), "kv_len (dimension 2 of k and v) must be >= 1"),
    ("causal", dict(q=np.concatenate([Q, Q], axis=2), causal=True), "causal attention needs q_len <= kv_len"),
    ("scale 0", dict(scale=0.0), "scale must be a positive finite number"),
    ("scale inf", dict(scale=float("inf")), "scale must be a positive finite number"),
    ("nonfinite", dict(nonfinite="ignore"), "nonfinite must be 'propagate' or 'raise'"),
]


@pytest.mark.parametrize("case,kw,msg", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_refused_before_any_launch(case, kw, msg):
    args = {"q": Q, "k": K, "v": V, **kw}
    with temporary_phases(TRAP):
        with pytest.raises(AttentionInputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            attention(args.pop("q"), args.pop("k"), args.pop("v"), phase="trap", **args)


def test_unsupported_head_dim_names_the_phases_that_can():
    import dataclasses

    only64 = dataclasses.replace(TRAP, name="trap_d64", head_dims=(64,))
    q = np.ones((1, 1, 4, 8), np.float32)
    with temporary_phases(only64):
        with pytest.raises(AttentionInputError, match=r"head_dim 8 not supported.*Phases that can: "):
            attention(q, q, q, phase="trap_d64")


def test_unknown_phase_and_parameter():
    with pytest.raises(UnknownPhaseError, match="Did you mean 'smem_kv'"):
        attention(Q, K, V, phase="smem_k")
    with pytest.raises(AttentionInputError, match=r"no parameter 'Bx' \(parameters: Br, Bc\)"):
        attention(Q, K, V, phase="smem_kv", Bx=4)


def test_empty_queries_give_an_empty_output_without_a_launch():
    with temporary_phases(TRAP):
        out = attention(Q[:, :, :0], K, V, phase="trap")
        assert isinstance(out, np.ndarray) and out.shape == (1, 2, 0, 8) and out.dtype == np.float32
        out = attention(Q[:0], K[:0], V[:0], phase="trap")
        assert out.shape == (0, 2, 5, 8)
        dev = attention(cuda.to_device(np.ascontiguousarray(Q[:, :, :0])), cuda.to_device(K), cuda.to_device(V),
                        phase="trap")
        assert dev.shape == (1, 2, 0, 8)
    with pytest.raises(AttentionInputError, match="scale"):
        attention(Q[:, :, :0], K, V, scale=-1.0)


def test_non_contiguous_numpy_is_copied_and_device_is_refused():
    q_nc = np.swapaxes(np.swapaxes(Q, 2, 3).copy(), 2, 3)
    assert not q_nc.flags.c_contiguous
    out = attention(q_nc, K, V, phase="fused_rowwise")
    assert check(out, reference(Q, K, V)).ok
    big = cuda.to_device(np.concatenate([Q, Q], axis=3))
    strided = big[:, :, :, ::2]
    assert not strided.is_c_contiguous()
    with pytest.raises(AttentionInputError, match="q is a non-contiguous device array"):
        attention(strided, cuda.to_device(K), cuda.to_device(V), phase="fused_rowwise")


def test_problem_larger_than_free_memory_is_refused_up_front(monkeypatch):
    import numba_attn.measure.limits as R  # where attention() looks the free memory up

    monkeypatch.setattr(R, "free_device_memory", lambda: 1024)
    with temporary_phases(TRAP):
        with pytest.raises(AttentionInputError, match=r"needs 0\.00 GiB of device memory.*GiB free"):
            attention(Q, K, V, phase="trap")


def test_tile_configuration_over_device_limits_is_an_error_not_a_crash():
    # the simulator names the limit ("a block of 2048 threads exceeds the device limit of 1024 ..."),
    # a GPU refuses the launch (CUDA_ERROR_INVALID_VALUE): both are reported as a device limit
    with pytest.raises(AttentionInputError, match=r"phase 'smem_kv' with .*Br.: 2048.* cannot run .* on this "
                                                  r"device: device limit"):
        attention(Q, K, V, phase="smem_kv", Br=2048)
    from numba_attn.measure.row import measure

    row = measure("smem_kv", P, Br=2048)
    assert row["status"] == "SKIP" and "device limit" in row["reason"]


def test_nonfinite_policy():
    q = Q.copy()
    q[0, 1, 2, 3] = np.inf
    with pytest.raises(AttentionInputError, match=r"q contains 1 NaN/Inf value\(s\), the first at \(0, 1, 2, 3\)"):
        attention(q, K, V, phase="fused_rowwise", nonfinite="raise")
    with np.errstate(all="ignore"):
        out = attention(q, K, V, phase="fused_rowwise")  # propagate (the default)
    ref = reference(q, K, V)
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.isnan(out[0, 1, 2]).all()


@pytest.mark.parametrize("phase,leaks", [("smem_kv", False), ("tc_mma", True)])
def test_a_nan_at_a_hidden_key_of_a_shared_tile(phase, leaks):
    """A NaN in V at causal key 20 of 40 (docs/input-checks.md): smem_kv skips a masked key's product, so rows 0-19
    stay finite and right; tc_mma multiplies the key's zero weight in its tile, so some of those rows are NaN, and
    the check fails them (the reference leaves the key out: a NaN it does not have never passes)."""
    from numba_attn import get_phase

    p = Problem(batch=1, heads=1, q_len=40, kv_len=40, head_dim=16, dtype="float16", causal=True)
    q, k, v = p.inputs()
    v = v.copy()
    v[0, 0, 20, 3] = np.nan
    with np.errstate(all="ignore"):
        out = attention(q, k, v, causal=True, phase=phase, **get_phase(phase).sim_params)
    ref = reference(q, k, v, causal=True)
    assert np.isnan(ref[0, 0, 20:, 3]).all() and np.isfinite(ref[0, 0, :20]).all()
    assert np.isnan(np.asarray(out, np.float64)[0, 0, :20]).any() == leaks
    assert check(out, ref, dtype="float16").ok != leaks


def test_launch_goes_through_a_phase_that_validates_nothing_itself():
    """The checks live in attention(), so a phase without its own checks is safe."""
    calls = []

    def build(problem):
        def run(q, k, v, o, stream=0):
            calls.append(q.shape)
            o.copy_to_device(np.zeros(o.shape, o.dtype))  # device arrays take no o[...] = 0 on a GPU

        return Launch(run)

    ph = Phase(name="recorder", order=998, title="", parent=None, description="", lineage="",
               planned_speedup=None, build=build, params={}, module=__name__)
    with temporary_phases(ph):
        with pytest.raises(AttentionInputError):
            attention(Q, K[:, :, :0], V[:, :, :0], phase="recorder")
        attention(Q, K, V, phase="recorder")
    assert calls == [(2, 5, 8)]


CLI_ERRORS = [
    (["-N", "0"], "--q-len must be >= 1, got 0"),
    (["-D", "0"], "--head-dim must be >= 1, got 0"),
    (["-N", "8", "--kv-len", "4", "--causal"], "causal attention needs q_len <= kv_len"),
    (["-N", "8", "--scale", "-2"], "scale must be a positive finite number"),
    (["-N", "8", "-H", "3", "--kv-heads", "2"], "heads (3) must be a multiple of kv_heads (2)"),
    (["--phases", "smem_k"], "unknown phase 'smem_k'. Did you mean 'smem_kv'"),
    (["--param", "smem_kv.Bx=3"], "phase 'smem_kv' has no parameter 'Bx'"),
    (["--param", "Bc=3"], "expected PHASE.NAME=VALUE"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--seeds", "a"], "--seeds 'a': expected comma-separated integers"),
    (["--peers", "torch_sdpa_fast"], "unknown peer 'torch_sdpa_fast'"),
]


def _nothing_may_run(monkeypatch):
    """Neither the roadmap benchmark nor a sweep may start: each fails the test."""
    from numba_attn.measure import bench, sweep

    def refuse(*a, **kw):
        raise AssertionError("the run started although an argument is invalid")

    monkeypatch.setattr(bench, "run_benchmark", refuse)
    monkeypatch.setattr(sweep, "run", refuse)


@pytest.fixture(params=["active backend", "roadmap path"])
def run_path(request, monkeypatch):
    """``run`` in this process's backend, and as on a GPU, where ``run`` without a problem is the roadmap
    benchmark: every argument is checked before either path starts anything."""
    if request.param == "roadmap path":
        from numba_attn.gpu import backend

        monkeypatch.setattr(backend, "IS_SIMULATOR", False)
        _nothing_may_run(monkeypatch)
    return request.param


@pytest.mark.parametrize("args,msg", CLI_ERRORS, ids=[" ".join(a) for a, _ in CLI_ERRORS])
def test_cli_refuses_bad_arguments_with_exit_status_2(args, msg, capsys, tmp_path, run_path):
    rc = main(["run", "--results", str(tmp_path / "r.jsonl"), *args])  # the backend of this process
    err = capsys.readouterr().err
    assert rc == 2 and msg in err, err
    assert not (tmp_path / "r.jsonl").exists()  # nothing ran


ROADMAP_REFUSED = [["--param", "smem_kv.Bc=16"], ["--peers", "torch_sdpa"], ["--no-peers"], ["--seeds", "3"],
                   ["--budget", "1"], ["--no-ceilings"], ["--baseline", "smem_kv"]]


@pytest.mark.parametrize("args", ROADMAP_REFUSED, ids=[" ".join(a) for a in ROADMAP_REFUSED])
def test_roadmap_run_refuses_the_options_it_would_ignore(args, capsys, tmp_path, monkeypatch):
    from numba_attn.gpu import backend

    monkeypatch.setattr(backend, "IS_SIMULATOR", False)  # as on a GPU: no problem given is the roadmap benchmark
    _nothing_may_run(monkeypatch)
    rc = main(["run", "--results", str(tmp_path / "r.jsonl"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and f"{args[0]}: without a problem, run on a GPU is the roadmap benchmark" in err, err
    assert not (tmp_path / "r.jsonl").exists()


def test_roadmap_run_passes_the_options_it_takes(capsys, tmp_path, monkeypatch):
    from numba_attn.gpu import backend
    from numba_attn.measure import bench

    monkeypatch.setattr(backend, "IS_SIMULATOR", False)
    calls = []

    def run_benchmark(name, **kw):
        calls.append((name, kw))
        return [], kw["results"], []

    monkeypatch.setattr(bench, "run_benchmark", run_benchmark)
    path = tmp_path / "out" / "r.jsonl"
    assert main(["run", "--results", str(path), "--phases", "naive,smem_kv", "--timeout", "0", "--resume",
                 "--setup", "numba_attn.testing"]) == 0
    ((name, kw),) = calls
    assert name == "roadmap" and kw["results"] == str(path) and kw["plots_dir"] == str(path.parent)
    assert kw["phases"] == ["naive", "smem_kv"] and kw["timeout_s"] == 0 and kw["resume"] is True
    assert kw["setup"] == ["numba_attn.testing"]
    assert main(["run", "--results", str(tmp_path), "--phases", "naive"]) == 2  # a directory: refused up front
    assert "is a directory" in capsys.readouterr().err and len(calls) == 1


def test_benchmark_timeout_zero_is_no_limit(monkeypatch, tmp_path):
    from numba_attn.measure import bench, sweep

    seen = []
    monkeypatch.setattr(sweep, "run", lambda phases, problems, config, **kw: seen.append(config.timeout_s) or [])
    for timeout, want in ((None, 180.0), (0, None), (5.0, 5.0)):
        bench.run_benchmark("roadmap", results=str(tmp_path / "r.jsonl"), plots_dir=None, phases=["naive"],
                            timeout_s=timeout)
        assert seen.pop() == want, timeout


def test_cli_backend_flag_of_the_other_backend_is_refused_in_process(capsys, monkeypatch):
    from numba_attn.gpu import backend

    flag = "--gpu" if backend.IS_SIMULATOR else "--simulator"
    monkeypatch.setattr(backend, "gpu_present", lambda: True)
    before = os.environ.get("NUMBA_ATTN_BACKEND")
    assert main(["run", flag, "--phases", "naive"]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: this process already runs the {backend.BACKEND} backend" in err, err
    assert os.environ.get("NUMBA_ATTN_BACKEND") == before  # worker processes would inherit it


def test_cli_other_commands_refuse_bad_names(capsys, tmp_path):
    assert main(["bench", "roadmp"]) == 2
    assert "Did you mean 'roadmap'" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such results file" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 2
