"""Bad input, table-driven: every case is refused before a launch with a message naming the
argument and the allowed values (``attention()``, the CLI, corrupted results files); the default
phase choice (``allow_tf32``, ``explain()``, compute capability, a raising ``supports()``); resume
(only OK rows reused, keyed by seeds and the phase module's source) and the results-file lock."""
import importlib
import json
import sys
import threading
import time

import numpy as np
import pytest

import numba_attn.api as api
import numba_attn.phases.registry as registry
from numba_attn.measure import policy
from numba_attn import Problem, attention, explain
from numba_attn.cli import main
from numba_attn.measure.results import load_results, results_lock
from numba_attn.measure.sweep import run
from numba_attn.phases.registry import Launch, Phase, get_phase
from numba_attn.spec.errors import AttentionInputError, ResultsFileError
from numba_attn.testing import temporary_phases

P = Problem(batch=1, heads=2, q_len=5, kv_len=9, head_dim=8)
Q, K, V = P.inputs(1)
PD = Problem(batch=1, heads=2, q_len=1, kv_len=40, head_dim=8)
QD, KD, VD = PD.inputs(1)
HUGE = np.broadcast_to(np.zeros((1, 1, 1, 64), np.float32), (4096, 64, 65536, 64))  # 4 TiB once copied


def _never_built(problem, **_):
    raise AssertionError("a phase was built although the input is invalid")


def _trap(name="trap_bad", **params):
    return Phase(name=name, order=999, title="fails if planned", parent=None, description="", lineage="",
                 planned_speedup=None, build=_never_built, params=params, module=__name__)


GHOST = _trap("ghost")  # never registered

# (case, keyword arguments of attention(), what the message must contain)
API_CASES = [
    ("Br negative", dict(phase="smem_kv", Br=-16), "parameter Br of phase 'smem_kv' must be an integer >= 1; got -16"),
    ("Bc zero", dict(phase="smem_kv", Bc=0), "parameter Bc of phase 'smem_kv' must be an integer >= 1; got 0"),
    ("Br zero q_smem", dict(phase="q_smem", Br=0), "parameter Br of phase 'q_smem' must be an integer >= 1"),
    ("TN negative (0 = automatic)", dict(phase="register_blocked", TN=-1), "TN of phase 'register_blocked' must be an integer >= 0"),
    ("TM zero", dict(phase="register_blocked", TM=0), "TM of phase 'register_blocked' must be an integer >= 1"),
    ("Br a string", dict(phase="smem_kv", Br="abc"), "parameter Br of phase 'smem_kv' must be an integer >= 1; got 'abc'"),
    ("Br fractional", dict(phase="smem_kv", Br=16.5), "got 16.5"),
    ("Br None", dict(phase="smem_kv", Br=None), "got None"),
    ("Br a bool", dict(phase="smem_kv", Br=True), "got True"),
    ("flag out of range", dict(phase="causal_skip", heavy_first=2), "heavy_first of phase 'causal_skip' must be an integer in [0, 1]"),
    ("pdl out of range", dict(q=QD, k=KD, v=VD, phase="decode_mma", pdl=4), "pdl of phase 'decode_mma' must be an integer in [0, 3]"),
    ("splits negative", dict(q=QD, k=KD, v=VD, phase="decode_split_k_lean", splits=-1), "splits of phase 'decode_split_k_lean' must be an integer >= 0"),
    ("warps zero", dict(phase="tc_mma", warps=0), "warps of phase 'tc_mma' must be an integer >= 1"),
    ("unknown parameter", dict(phase="smem_kv", Bx=4), "no parameter 'Bx' (parameters: Br, Bc)"),
    ("causal 'False'", dict(phase="trap_bad", causal="False"), "causal must be a bool (True or False); got 'False'"),
    ("causal None", dict(phase="trap_bad", causal=None), "causal must be a bool"),
    ("causal 2", dict(phase="trap_bad", causal=2), "causal must be a bool"),
    ("allow_tf32 'yes'", dict(allow_tf32="yes"), "allow_tf32 must be a bool"),
    ("phase an int", dict(phase=123), "phase must be a phase name (str"),
    ("phase a list", dict(phase=["smem_kv"]), "phase must be a phase name (str"),
    ("phase an unregistered Phase", dict(phase=GHOST), "the Phase object 'ghost' is not the registered phase"),
    ("inputs over host memory", dict(q=HUGE, k=HUGE, v=HUGE, phase="trap_bad"), "GiB of host memory"),
    ("nonfinite", dict(nonfinite="ignore"), "nonfinite must be 'propagate' or 'raise'"),
]


@pytest.mark.parametrize("case,kw,msg", API_CASES, ids=[c[0] for c in API_CASES])
def test_attention_refuses_bad_input_before_a_launch(case, kw, msg, monkeypatch):
    args = {"q": Q, "k": K, "v": V, **kw}
    monkeypatch.setattr(registry.Phase, "plan", lambda *a, **k: pytest.fail("planned despite bad input"))
    with temporary_phases(_trap()):
        with pytest.raises(AttentionInputError) as exc:
            attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
        assert msg in str(exc.value)
        with pytest.raises(AttentionInputError):  # explain() checks the same
            args = {"q": Q, "k": K, "v": V, **kw}
            explain(args.pop("q"), args.pop("k"), args.pop("v"), **args)


# attention_varlen: q (total_q, H, D), k/v (total_k, Hkv, D), cu_seqlens int32 (B + 1,)
VQ = np.zeros((22, 2, 16), np.float16)
VK = np.zeros((30, 1, 16), np.float16)
CUQ = np.array([0, 5, 5, 22], np.int32)
CUK = np.array([0, 9, 9, 30], np.int32)

# (case, keyword arguments of attention_varlen(), what the message must contain)
VARLEN_CASES = [
    ("cu_seqlens_q int64", dict(cu_seqlens_q=CUQ.astype(np.int64)), "cu_seqlens_q must be int32"),
    ("cu_seqlens_k 2-d", dict(cu_seqlens_k=CUK[None]), "cu_seqlens_k must be 1-D"),
    ("cu_seqlens_q not from 0", dict(cu_seqlens_q=np.array([1, 5, 5, 22], np.int32)), "cu_seqlens_q[0] must be 0"),
    ("cu_seqlens_q decreasing", dict(cu_seqlens_q=np.array([0, 6, 5, 22], np.int32)),
     "cu_seqlens_q must be non-decreasing; cu_seqlens_q[2] = 5 < cu_seqlens_q[1] = 6"),
    ("cu_seqlens_q last != total", dict(cu_seqlens_q=np.array([0, 5, 5, 21], np.int32)),
     "cu_seqlens_q[-1] = 21 must be the total number of rows (22)"),
    ("cu_seqlens_k last != total", dict(cu_seqlens_k=np.array([0, 9, 9, 31], np.int32)), "cu_seqlens_k[-1] = 31"),
    ("cu_seqlens of two lengths", dict(cu_seqlens_k=np.array([0, 30], np.int32)), "cu_seqlens_k has 2 entries"),
    ("queries without keys", dict(cu_seqlens_k=np.array([0, 0, 9, 30], np.int32)),
     "sequence 0 has 5 queries and no keys"),
    ("causal more queries than keys", dict(causal=True, cu_seqlens_k=np.array([0, 4, 13, 30], np.int32)),
     "causal: sequence 0 has 5 queries but 4 keys"),
    ("max_seqlen_q too small", dict(max_seqlen_q=16), "max_seqlen_q must be an int >= the longest sequence (17)"),
    ("q 4-d", dict(q=VQ[None]), "q must be 3-D (total_q, heads, head_dim)"),
    ("float32", dict(q=VQ.astype(np.float32), k=VK.astype(np.float32), v=VK.astype(np.float32)),
     "q must be float16 or bfloat16 for attention_varlen"),
    ("dtypes differ", dict(k=VK.astype(np.float32)), "q, k and v must share one dtype"),
    ("heads not a multiple", dict(k=np.zeros((30, 3, 16), np.float16), v=np.zeros((30, 3, 16), np.float16)),
     "q heads (2) must be a positive multiple of k/v heads (3)"),
    ("head_dim differs", dict(k=np.zeros((30, 1, 8), np.float16), v=np.zeros((30, 1, 8), np.float16)),
     "q and k must have the same head_dim"),
    ("k and v differ", dict(v=np.zeros((29, 1, 16), np.float16)), "k and v must have the same shape"),
    ("contiguous phase", dict(phase="tc_mma"), "phase 'tc_mma' does not read the varlen layout"),
    ("unknown parameter", dict(phase="tc_mma_varlen", params={"Bx": 4}), "no parameter 'Bx'"),
    ("out of another shape", dict(out=np.zeros((21, 2, 16), np.float16)), "out has shape (21, 2, 16)"),
    ("causal 'yes'", dict(causal="yes"), "causal must be a bool"),
]


@pytest.mark.parametrize("case,kw,msg", VARLEN_CASES, ids=[c[0] for c in VARLEN_CASES])
def test_attention_varlen_refuses_bad_input_before_a_launch(case, kw, msg, monkeypatch):
    args = {"q": VQ, "k": VK, "v": VK, "cu_seqlens_q": CUQ, "cu_seqlens_k": CUK, **kw}
    monkeypatch.setattr(registry.Phase, "plan", lambda *a, **k: pytest.fail("planned despite bad input"))
    with pytest.raises(AttentionInputError) as exc:
        arrays = [args.pop(n) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
        api.attention_varlen(*arrays, **args)
    assert msg in str(exc.value)


def test_command_line_parameter_values_are_typed():
    """--param and --space (run, tune, the offline compiler): True/False are bools (a string "True" is refused by
    the boolean parameters), numbers are numbers, anything else stays text for the phase to refuse."""
    from numba_attn.measure.offline import parse_params
    from numba_attn.spec.errors import parse_param_value

    assert [parse_param_value(v) for v in ("True", "false", "64", "-1", "0.5", "auto")] == [True, False, 64, -1, 0.5,
                                                                                            "auto"]
    assert parse_params(["uniform=True", "Bc=128"]) == {"uniform": True, "Bc": 128}
    assert get_phase("warp_specialized_tc").resolve_params(parse_params(["uniform=true"]))["uniform"] is True


def test_valid_values_of_the_same_parameters_still_pass():
    ph = get_phase("causal_skip")
    assert ph.resolve_params({"heavy_first": 0, "TN": 0, "Br": 64.0})["Br"] == 64
    assert get_phase("decode_mma").resolve_params({"pdl": 0, "even": 1, "fuse_max": 0})["even"] is True
    assert attention(Q, K, V, phase="smem_kv", Br=np.int64(4), Bc=4, causal=np.bool_(True)).shape == Q.shape


def test_a_registered_phase_object_is_taken_by_its_name():
    out = attention(Q, K, V, phase=get_phase("fused_rowwise"))
    from numba_attn import check, reference

    assert check(out, reference(Q, K, V)).ok


# -- the CLI and corrupted results files -----------------------------------------------------

# in this process's backend (a --simulator or --gpu flag for the other one would be refused)
RUN = ["run", "--phases", "fused_rowwise", "-B", "1", "-H", "1", "-N", "4", "-D", "8", "--timeout", "0",
       "--no-peers"]
CLI_CASES = [
    (["--param", "smem_kv.Br=abc"], "parameter Br of phase 'smem_kv' must be an integer >= 1; got 'abc'"),
    (["--param", "smem_kv.Br=-16"], "parameter Br of phase 'smem_kv' must be an integer >= 1; got -16"),
    (["--param", "smem_kv.Bc=0"], "parameter Bc of phase 'smem_kv' must be an integer >= 1; got 0"),
    (["--seeds", "-1"], "--seeds '-1': seeds must be integers >= 0"),
    (["--seeds", ","], "--seeds: give at least one seed"),
    (["--timeout", "-1"], "--timeout (seconds; 0: no limit) must be a finite number >= 0"),
    (["--timeout", "nan"], "--timeout (seconds; 0: no limit) must be a finite number >= 0"),
    (["--baseline", "nope"], "unknown phase 'nope'"),
]


@pytest.mark.parametrize("args,msg", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_refuses_bad_arguments(args, msg, capsys, tmp_path):
    rc = main([*RUN, "--results", str(tmp_path / "r.jsonl"), *args])
    err = capsys.readouterr().err
    assert rc != 0 and msg in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.jsonl").exists()


ENV = {"type": "env", "run_id": "r1", "env_key": "e1", "backend": "simulator"}
ROW = {"type": "result", "kind": "phase", "phase": "naive", "status": "OK", "time_ms": 1.0, "run_id": "r1",
       "env_key": "e1", "label": "B1 H1 N4 D8 fp32", "gpu": "simulator",
       "problem": {"batch": 1, "heads": 1, "kv_heads": 1, "q_len": 4, "kv_len": 4, "head_dim": 8,
                   "causal": False, "dtype": "float32", "scale": None}}
CORRUPT = [
    ("a list", "[1, 2]", "a JSON list, not an object"),
    ("a string", '"abc"', "a JSON str, not an object"),
    ("null", "null", "a JSON NoneType, not an object"),
    ("deep nesting", "[" * 100000 + "]" * 100000, "nested too deeply"),
    ("time_ms a string", json.dumps({**ROW, "time_ms": "abc"}), "field 'time_ms' must be a number"),
    ("status a number", json.dumps({**ROW, "status": 3}), "field 'status' must be a string"),
    ("no problem", json.dumps({k: v for k, v in ROW.items() if k != "problem"}), "a result row without its problem"),
    ("problem a list", json.dumps({**ROW, "problem": [1]}), "field 'problem' must be an object"),
    ("q_len a string", json.dumps({**ROW, "problem": {**ROW["problem"], "q_len": "4"}}), "problem field 'q_len'"),
    ("params a list", json.dumps({**ROW, "params": [1]}), "field 'params' must be an object"),
    ("non-UTF-8", b"\xff\xfe{}", "not UTF-8 text"),
]


def _write(path, line):
    data = json.dumps(ENV).encode() + b"\n" + (line if isinstance(line, bytes) else line.encode()) + b"\n"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case,line,msg", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_a_corrupted_results_file_names_the_file_and_line(case, line, msg, tmp_path):
    path = _write(tmp_path / "bad.jsonl", line)
    with pytest.raises(ResultsFileError) as exc:
        load_results(str(path))
    assert str(exc.value).startswith(f"{path}:2: ") and msg in str(exc.value)


@pytest.mark.parametrize("cmd", ["plot", "compare", "resume"])
def test_cli_on_a_corrupted_file_or_a_directory_is_one_line(cmd, capsys, tmp_path):
    good = _write(tmp_path / "good.jsonl", json.dumps(ROW))
    for target, where in ((_write(tmp_path / "bad.jsonl", "[1, 2]"), f"{tmp_path / 'bad.jsonl'}:2: "),
                          (tmp_path, f"{tmp_path}: is a directory")):
        argv = {"plot": ["plot", str(target), "--out", str(tmp_path / "plots")],
                "compare": ["compare", str(target), str(good)],
                "resume": [*RUN, "--results", str(target), "--resume"]}[cmd]
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc != 0 and where in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("path,msg", [("/proc/nope/r.jsonl", "cannot write the results file"),
                                      ("/dev/full", "No space left on device")])
def test_cli_results_on_an_unwritable_path_or_a_full_disk(path, msg, capsys):
    import os

    if not os.path.isdir("/proc") or not os.path.exists("/dev/full"):
        pytest.skip("needs Linux's /proc and /dev/full")
    rc = main([*RUN, "--results", path])
    err = capsys.readouterr().err
    assert rc != 0 and path in err and msg in err and "Traceback" not in err, err
    if os.path.exists(path + ".lock"):
        os.remove(path + ".lock")


def test_the_committed_results_files_load():
    from numba_attn.report.records import results_files

    for f in results_files():
        assert load_results(f)


# -- the default phase -----------------------------------------------------------------------

P32 = Problem(batch=1, heads=1, q_len=64, kv_len=64, head_dim=32)
P16 = P32.replace(dtype="float16")


def _arrays(p):
    return p.inputs(1)


def test_float32_never_runs_tf32_unless_allowed(monkeypatch):
    monkeypatch.setattr(policy, "device_name", lambda: "simulator")
    q, k, v = _arrays(P32)
    for causal in (False, True):
        e = explain(q, k, v, causal=causal)
        assert e.phase.precision is None and e.name != "tc_tf32", e
        assert e.name == ("causal_skip" if causal else "register_blocked")
        assert explain(q, k, v, causal=causal, allow_tf32=True).name == "tc_tf32"
    # naming a tf32 phase is asking for it
    assert explain(q, k, v, phase="tc_tf32").name == "tc_tf32"


def test_explain_gives_the_phase_its_resolved_parameters_and_why(monkeypatch):
    monkeypatch.setattr(policy, "device_name", lambda: "simulator")
    q, k, v = _arrays(P32)
    e = explain(q, k, v, TN=0)
    assert e.name == "register_blocked" and "preferred for prefill float32" in e.why
    assert e.params == get_phase("register_blocked").resolve(P32, {"TN": 0}) and e.params["TN"] > 0
    assert e.problem == P32 and "register_blocked" in str(e)
    assert explain(q, k, v, phase="smem_kv", Br=16).params == {"Br": 16, "Bc": 32}
    assert explain(q[:, :, :0], k, v).phase is None


def test_measured_results_decide_on_their_gpu_and_tc_wgmma_overlap_is_never_the_default(monkeypatch):
    monkeypatch.setattr(policy, "device_name", lambda: "NVIDIA H200")
    p = Problem(batch=4, heads=32, q_len=2048, kv_len=2048, head_dim=64, dtype="float16")
    ph, why, _params = api.choose_phase(p)
    assert ph.name == "ws_tma_q_wide" and "fastest" in why and "results/" in why
    rows = [r for _, r in api.measured_rows("NVIDIA H200") if r["phase"] == "tc_wgmma_overlap"]
    assert rows  # it was measured, and is still not chosen
    for d in (64, 128):
        for causal in (False, True):
            assert api.choose_phase(p.replace(head_dim=d, causal=causal))[0].name != "tc_wgmma_overlap"


def test_wgmma_phases_need_sm_90a(monkeypatch):
    monkeypatch.setattr(policy, "device_name", lambda: "simulator")
    p = Problem(batch=1, heads=1, q_len=256, kv_len=256, head_dim=64, dtype="float16")
    assert api.choose_phase(p)[0].name == "tc_wgmma"  # the simulator counts as 9.0
    monkeypatch.setattr(registry, "device_cc", lambda: (8, 0))
    for name in ("tc_wgmma", "tc_wgmma_overlap"):
        assert "needs compute capability 9.0 exactly (sm_90a); the device is sm_80" in get_phase(name).supports(p)
    assert api.choose_phase(p)[0].name == "tc_pipelined"
    monkeypatch.setattr(registry, "device_cc", lambda: (10, 0))
    assert get_phase("tc_wgmma").supports(p) is not None
    assert registry.cc_reason((8, 0), (9, 0)) is None and "sm_75" in registry.cc_reason((8, 0), (7, 5))


def test_a_raising_supports_is_that_phases_reason_only():
    def boom(problem, **_):
        raise RuntimeError("boom")

    bad = Phase(name="raiser", order=5000, title="", parent=None, description="", lineage="",
                planned_speedup=None, build=_never_built, params={}, extra_supports=boom, module=__name__)
    with temporary_phases(bad):
        assert bad.supports(P) == "unsupported: bug in supports(): RuntimeError: boom"
        assert explain(Q, K, V).name != "raiser"  # phase=None still works
        with pytest.raises(AttentionInputError, match=r"bug in supports\(\): RuntimeError: boom.*Phases that can"):
            attention(Q, K, V, phase="raiser")


def test_a_user_phase_is_not_the_default_even_when_later_in_the_roadmap():
    def build(problem):
        return Launch(lambda q, k, v, o, stream=0: None)

    user = Phase(name="user_fast", order=10_000, title="", parent=None, description="", lineage="",
                 planned_speedup=None, build=build, params={}, module="my_module")
    with temporary_phases(user):
        assert explain(Q, K, V).phase.is_builtin
        assert explain(Q, K, V, phase="user_fast").name == "user_fast"


# -- resume and the lock ------------------------------------------------------------------------

TINY = Problem(batch=1, heads=1, q_len=5, kv_len=9, head_dim=8)
USER_MODULE = '''
from numba_attn.testing import Phase, _build_buggy

BUG = {bug!r}
PHASE = Phase(name="user_resume", order=950, title="user phase", parent=None, description="", lineage="",
              planned_speedup=None, build=_build_buggy(BUG), params={{"threads": 32}}, dtypes=("float32",),
              module=__name__)
'''


def _user_phase(tmp_path, bug, monkeypatch):
    (tmp_path / "user_phase_mod.py").write_text(USER_MODULE.format(bug=bug))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_phase_mod", None)
    importlib.invalidate_caches()
    return importlib.import_module("user_phase_mod").PHASE


def test_resume_retries_failed_rows_and_keys_by_seeds_and_source(tmp_path, monkeypatch):
    path = str(tmp_path / "r.jsonl")
    kw = dict(results=path, peers=False, resume=True)
    ph = _user_phase(tmp_path, "unscaled", monkeypatch)
    with temporary_phases(ph):
        assert run(["user_resume"], [TINY], seeds=(1,), **kw)[0]["status"] == "FAIL"
        again = run(["user_resume"], [TINY], seeds=(1,), **kw)[0]
        assert again["status"] == "FAIL" and not again.get("resumed")  # a FAIL row is measured again
    ph = _user_phase(tmp_path, "none", monkeypatch)  # the user fixes the module
    with temporary_phases(ph):
        row = run(["user_resume"], [TINY], seeds=(1,), **kw)[0]
        assert row["status"] == "OK" and not row.get("resumed") and row["phase_source_hash"]
        assert run(["user_resume"], [TINY], seeds=(1,), **kw)[0].get("resumed")
        assert not run(["user_resume"], [TINY], seeds=(1, 2), **kw)[0].get("resumed")  # other seeds
    ph = _user_phase(tmp_path, "zeros", monkeypatch)  # broken again after an OK row
    with temporary_phases(ph):
        row = run(["user_resume"], [TINY], seeds=(1,), **kw)[0]
        assert row["status"] == "FAIL" and not row.get("resumed")
    statuses = [r["status"] for r in load_results(path) if r["type"] == "result"]
    assert statuses == ["FAIL", "FAIL", "OK", "OK", "FAIL"]  # every measured row recorded once


def test_the_lock_serializes_writers_of_one_file(tmp_path):
    path = str(tmp_path / "r.jsonl")
    waited, acquired = [], threading.Event()

    def second():
        with results_lock(path, warn=waited.append):
            acquired.set()

    with results_lock(path):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        assert not acquired.is_set() and waited and "another run is writing" in waited[0]
    t.join(10)
    assert acquired.is_set()


# -- dtype names: the short names the tables print are accepted wherever a dtype is named ----------------------

ALIASES = [("fp32", "float32"), ("FP16", "float16"), ("f16", "float16"), ("half", "float16"), ("bf16", "bfloat16"),
           ("float16", "float16"), ("bfloat16", "bfloat16")]


@pytest.mark.parametrize("short,canonical", ALIASES)
def test_short_dtype_names_map_to_the_canonical_ones(short, canonical):
    from numba_attn import check
    from numba_attn.cli_args import build_parser

    p = Problem(q_len=4, head_dim=8, dtype=short)
    assert p.dtype == canonical and p == Problem(q_len=4, head_dim=8, dtype=canonical)
    assert hash(p) == hash(Problem(q_len=4, head_dim=8, dtype=canonical))
    assert Problem.from_dict(p.to_dict()) == p and p.to_dict()["dtype"] == canonical
    assert P.replace(dtype=short).dtype == canonical
    assert build_parser().parse_args(["run", "--dtype", short]).dtype == canonical
    assert build_parser().parse_args(["tune", "smem_kv", "--dtype", short]).dtype == canonical
    ref = np.ones((1, 1, 2, 4))
    assert check(ref.astype(np.float32), ref, dtype=short).ok


def test_numpy_dtypes_and_fp8_cache_names():
    from numba_attn.spec.problem import PagedProblem

    assert Problem(q_len=4, head_dim=8, dtype=np.float16).dtype == "float16"
    assert Problem(q_len=4, head_dim=8, dtype=np.dtype("float32")).dtype == "float32"
    pp = PagedProblem(q_len=1, kv_len=32, head_dim=16, dtype="fp16", kv_dtype="fp8", kv_scale="head")
    assert pp.kv_dtype == "float8_e4m3" and pp.dtype == "float16"
    with pytest.raises(AttentionInputError, match=r"kv_dtype must be .*float8_e4m3 \(fp8\) or int8, got 'fp4'"):
        PagedProblem(q_len=1, kv_len=32, head_dim=16, dtype="fp16", kv_dtype="fp4")


@pytest.mark.parametrize("bad", ["fp64", "float64", "int8", "", None, 3])
def test_unknown_dtypes_list_both_spellings(bad):
    with pytest.raises(AttentionInputError, match=r"dtype must be one of float32 \(fp32\), float16 \(fp16\), "
                                                  r"bfloat16 \(bf16\), got"):
        Problem(q_len=4, head_dim=8, dtype=bad)


def test_cli_dtype_short_name_runs_and_a_bad_one_is_one_line(capsys, tmp_path):
    rc = main(["run", "--phases", "naive", "-B", "1", "-H", "1", "-N", "4", "-D", "8", "--dtype", "fp16",
               "--timeout", "0", "--no-peers", "--results", str(tmp_path / "r.jsonl")])
    assert rc == 0
    rows = [r for r in load_results(str(tmp_path / "r.jsonl")) if r.get("type") == "result"]
    assert [r["problem"]["dtype"] for r in rows] == ["float16"] and "fp16" in rows[0]["label"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["run", "--phases", "naive", "-N", "4", "--dtype", "fp64", "--results", str(tmp_path / "x.jsonl")])
    err = capsys.readouterr().err
    assert "argument --dtype: must be one of float32 (fp32), float16 (fp16), bfloat16 (bf16), got 'fp64'" in err
    assert "Traceback" not in err and not (tmp_path / "x.jsonl").exists()
