"""The dispatch table: built from results files (and a tuning cache), read by ``phase=None``.

Nothing here launches a kernel: the table is built from fixture rows, and ``choose_phase`` /
``explain()`` only plan."""
import json

import numpy as np
import pytest

from numba_attn import api
from numba_attn.api import explain
from numba_attn.cli import main
from numba_attn.measure import dispatch, policy
from numba_attn.measure import tune as tuning
from numba_attn.measure.results import ResultsWriter
from numba_attn.spec.problem import Problem

GPU = "Test GPU"
P128 = Problem(batch=1, heads=4, q_len=256, head_dim=128, dtype="float16")  # key ...|D128|G1|prefill|kv256
P128_SMALL = P128.replace(batch=8, q_len=200)  # the same key (kv_len bucket 256), another problem
TINY = Problem(batch=1, heads=1, q_len=9, kv_len=17, head_dim=32)  # float32, key ...|D32|G1|prefill|kv32


def _row(phase, problem, ms, params=None, requested=None, run_id="r1", gpu=GPU, status="OK"):
    return {"type": "result", "kind": "phase", "phase": phase, "status": status, "label": problem.label,
            "problem": {"batch": problem.batch, "heads": problem.heads, "q_len": problem.q_len,
                        "kv_len": problem.kv_len, "head_dim": problem.head_dim, "causal": problem.causal,
                        "dtype": problem.dtype, "scale": None, "kv_heads": problem.kv_heads, "seed": 0},
            "params": params or {}, "requested_params": requested or {}, "time_ms": ms, "run_id": run_id,
            "commit": "abc1234", "gpu": gpu}


def _results(tmp_path, rows, name="r.jsonl"):
    path = tmp_path / name
    if path.exists():
        path.unlink()
    path = str(path)
    w = ResultsWriter(path)
    w.write({"type": "env", "run_id": "r1", "gpu": GPU, "commit": "abc1234"})
    for r in rows:
        w.write(r)
    return path


FIXTURE = [
    # three runs of tc_wgmma on one problem: the median row (1.0 ms) stands for it
    _row("tc_wgmma", P128, 0.9, {"warpgroups": 3, "Bc": 64, "stages": 2}, run_id="a"),
    _row("tc_wgmma", P128, 1.0, {"WG": 3, "Bc": 64, "STAGES": 2}, run_id="b"),  # names before the renames
    _row("tc_wgmma", P128, 1.2, {"warpgroups": 3, "Bc": 64, "stages": 2}, run_id="c"),
    _row("tc_wgmma_overlap", P128, 0.5, {"warpgroups": 2, "Bc": 64, "stages": 3}),  # fastest, never a default
    _row("tc_pipelined", P128, 1.5),
    _row("tc_mma", P128, 3.0),
    # a smaller problem of the same key: tc_mma is measured only there, beside tc_pipelined
    _row("tc_pipelined", P128_SMALL, 0.2),
    _row("tc_mma", P128_SMALL, 0.25),
    # a tuning row: requested parameters the problem cannot run on this device (too much shared memory)
    _row("tc_wgmma", P128, 0.1, {"warpgroups": 3, "Bc": 128, "stages": 4}, requested={"Bc": 128, "stages": 4}),
    # not counted: not OK, untimed, another phase name, a parameter the phase does not have
    _row("tc_pipelined", P128, 0.01, status="FAIL"),
    _row("tc_pipelined", P128, None),
    _row("no_such_phase", P128, 0.01),
    _row("tc_mma", P128, 0.01, {"nope": 1}),
    # float32: tc_tf32 fastest (below the input precision), then smem_kv with tuned tiles
    _row("tc_tf32", TINY, 0.1),
    _row("smem_kv", TINY, 0.2, {"Br": 16, "Bc": 16}, requested={"Br": 16, "Bc": 16}),
    _row("smem_kv", TINY, 0.4, {"Br": 128, "Bc": 32}, requested={"Bc": 32}),  # Bc=32 is the default
    _row("register_blocked", TINY, 0.3),
]


def _build(tmp_path, rows=FIXTURE, cache=None):
    skipped = {}
    table = dispatch.build([_results(tmp_path, rows)], cache, never_default=api.NEVER_DEFAULT, skipped=skipped)
    return table, skipped


@pytest.fixture
def table_env(tmp_path, monkeypatch):
    """The fixture table as the one phase=None reads, on a GPU named GPU, with an empty tuning cache."""
    table, _ = _build(tmp_path)
    path = dispatch.write(table, str(tmp_path / "dispatch.json"))
    monkeypatch.setenv(dispatch.TABLE_ENV, path)
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "no-cache.json"))
    monkeypatch.setattr(policy, "device_name", lambda: GPU)
    monkeypatch.setattr(policy, "hopper_rule", lambda *a: None)  # a model the Hopper rule does not cover
    return path


def test_build_ranks_by_time_on_the_same_problems(tmp_path):
    table, skipped = _build(tmp_path)
    e = table["entries"][tuning.cache_key(GPU, P128)]
    assert tuning.cache_key(GPU, P128) == tuning.cache_key(GPU, P128_SMALL)
    order = [(it["phase"], it["requested"]) for it in e["ranking"]]
    assert order == [("tc_wgmma", {"Bc": 128, "stages": 4}), ("tc_wgmma_overlap", {}), ("tc_wgmma", {}),
                     ("tc_pipelined", {}), ("tc_mma", {})]
    # tc_mma is slower than tc_pipelined on both problems it shares with it; its 0.25 ms on the small
    # problem is never compared with the others' times on the large one
    mma, pipe = e["ranking"][4], e["ranking"][3]
    assert mma["score"] == round((3.0 / 0.1 * 0.25 / 0.2) ** 0.5, 4) and pipe["shared_problems"] == 2
    wg = e["ranking"][2]
    assert wg["time_ms"] == 1.0 and wg["rows"] == 3 and wg["source"]["run_id"] == "b"  # the median row
    assert wg["params"] == {"warpgroups": 3, "Bc": 64, "stages": 2}  # recorded names read as today's
    assert e["ranking"][1]["excluded"].startswith("never a default")
    # the entry's phase: the first configuration phase=None may run (the overlap phase is never a default)
    assert e["rank"] == 0 and e["phase"] == "tc_wgmma" and e["requested"] == {"Bc": 128, "stages": 4}
    assert e["source"] == {"file": dispatch._shown_file(str(tmp_path / "r.jsonl")), "label": P128.label,
                           "commit": "abc1234", "run_id": "r1"}
    f32 = table["entries"][tuning.cache_key(GPU, TINY)]
    assert [(it["phase"], it["requested"]) for it in f32["ranking"]] == [
        ("tc_tf32", {}), ("smem_kv", {"Br": 16, "Bc": 16}), ("register_blocked", {}), ("smem_kv", {})]
    assert "below the input precision" in f32["ranking"][0]["excluded"]
    assert f32["phase"] == "smem_kv" and f32["rank"] == 1
    assert skipped == {"phase 'no_such_phase' is not registered": 1, "tc_mma: a parameter the phase no longer has": 1}


def test_a_row_of_a_former_default_is_its_own_configuration(tmp_path):
    """A row is the configuration that ran: where it recorded a resolved value today's defaults no longer give
    (two warpgroups, where tc_wgmma's automatic choice at D=128 is three today), that value is part of its
    configuration; a requested value today's defaults give anyway (Bc=64) is not."""
    rows = [_row("tc_wgmma", P128, 0.8, {"warpgroups": 2, "Bc": 64, "stages": 2}, run_id="old"),
            _row("tc_wgmma", P128, 1.0, {"warpgroups": 3, "Bc": 64, "stages": 2}, requested={"Bc": 64}),
            _row("tc_pipelined", P128, 1.5)]
    e = _build(tmp_path, rows)[0]["entries"][tuning.cache_key(GPU, P128)]
    assert [(it["phase"], it["requested"]) for it in e["ranking"]] == [
        ("tc_wgmma", {"warpgroups": 2}), ("tc_wgmma", {}), ("tc_pipelined", {})]
    assert dispatch.measured_default(e, "tc_wgmma") and not dispatch.measured_default(e, "tc_mma")


def test_choose_skips_parameters_the_problem_cannot_run(table_env):
    ph, why, params = api.choose_phase(P128)
    # the tuned tc_wgmma (Bc=128, stages=4) needs too much shared memory at D128; tc_wgmma_overlap is
    # never a default: the next configuration, tc_wgmma with its defaults, is chosen
    assert ph.name == "tc_wgmma" and params == {}
    assert why.startswith("dispatch table (") and table_env in why and "shared memory" in why
    assert "tc_wgmma_overlap: never a default" in why and "@abc1234" in why
    # where the tuned parameters run (D64), they are chosen with the entry's own time
    p64 = P128.replace(head_dim=64)
    table = json.loads(json.dumps(dispatch.load(table_env)))
    key = tuning.cache_key(GPU, P128)
    table["entries"][tuning.cache_key(GPU, p64)] = json.loads(json.dumps(table["entries"][key]))
    dispatch.write(table, table_env)
    ph, why, params = api.choose_phase(p64)
    assert ph.name == "tc_wgmma" and params == {"Bc": 128, "stages": 4} and "the fastest of 5" in why


def test_explain_plans_with_the_tables_parameters(table_env):
    q, k, v = TINY.inputs(1)
    e = explain(q, k, v)
    assert e.name == "smem_kv" and e.params == {"Br": 16, "Bc": 16}
    assert e.why.startswith(f"dispatch table ({table_env}: smem_kv")
    assert "tc_tf32: computes in tf32" in e.why  # faster, skipped
    assert explain(q, k, v, allow_tf32=True).name == "tc_tf32"
    assert explain(q, k, v, Br=32).params == {"Br": 32, "Bc": 32}  # parameters given win
    assert explain(q, k, v, phase="smem_kv").params == {"Br": 128, "Bc": 32}  # a named phase: its defaults


def test_a_tuning_cache_entry_wins_over_the_table(table_env, tmp_path, monkeypatch):
    cache = tmp_path / "cache.json"
    monkeypatch.setenv(tuning.CACHE_ENV, str(cache))
    tuning.TuningCache(str(cache)).update([(tuning.cache_key(GPU, TINY), "register_blocked",
                                            {"params": {"Br": 64}, "time_ms": 0.05}, True)])
    q, k, v = TINY.inputs(1)
    e = explain(q, k, v)
    assert e.name == "register_blocked" and e.params["Br"] == 64 and e.why.startswith("tuned (cache")


def test_another_gpu_model_falls_back_to_the_preference(table_env, monkeypatch):
    monkeypatch.setattr(policy, "device_name", lambda: "Another GPU")
    ph, why, params = api.choose_phase(TINY)
    assert ph.name == "register_blocked" and params == {} and why.startswith("preferred for prefill float32")
    # a problem of another key on the table's GPU: the preference too
    monkeypatch.setattr(policy, "device_name", lambda: GPU)
    ph, why, _ = api.choose_phase(TINY.replace(kv_len=100))
    assert ph.name == "register_blocked" and "no configuration" in why


def test_a_table_that_cannot_be_read_counts_as_none(table_env):
    with open(table_env, "w") as f:
        f.write("{not json")
    assert api.choose_phase(TINY)[0].name == "register_blocked"
    with pytest.raises(ValueError, match="not a dispatch table"):
        dispatch.load(table_env)


def test_tuning_cache_entries_count_once_and_untimed_ones_not(tmp_path):
    path = _results(tmp_path, FIXTURE)
    cache = str(tmp_path / "cache.json")
    key = tuning.cache_key(GPU, TINY)
    tuning.TuningCache(cache).update([
        (key, "register_blocked", {"params": {"Br": 64}, "resolved": {"Br": 64, "Bc": 32, "TM": 4, "TN": 4,
                                   "maxreg": 0}, "time_ms": 0.15, "label": TINY.label, "results": path,
                                   "commit": "def5678", "run_id": "t1"}, True),
        (key, "smem_kv", {"params": {"Br": 16, "Bc": 16}, "time_ms": 0.2, "label": TINY.label, "results": path,
                          "run_id": "r1"}, False),  # the fixture's row, read again from the cache
        (tuning.cache_key("simulator", TINY), "smem_kv", {"params": {}, "time_ms": None}, True)])
    table = dispatch.build([path], cache, never_default=api.NEVER_DEFAULT)
    e = table["entries"][key]
    assert e["phase"] == "register_blocked" and e["requested"] == {"Br": 64}
    assert e["source"]["file"].endswith("(tuning cache)") and e["source"]["commit"] == "def5678"
    assert sum(it["phase"] == "smem_kv" and it["requested"] == {"Br": 16, "Bc": 16} for it in e["ranking"]) == 1
    assert next(it for it in e["ranking"] if it["requested"] == {"Br": 16, "Bc": 16})["rows"] == 1
    assert not any(k.startswith("simulator|") for k in table["entries"])
    assert table["command"] == f"numba-attn dispatch --build --cache {cache}"


def test_cli_build_show_and_check(tmp_path, capsys):
    path = _results(tmp_path, FIXTURE)
    out = str(tmp_path / "t.json")
    assert main(["dispatch", "--build", "--results", path, "--out", out]) == 0
    text = capsys.readouterr().out
    assert "Test GPU" in text and "smem_kv" in text and "left out: 1 row(s)" in text
    assert json.load(open(out)) == json.loads(dispatch.dumps(_build(tmp_path)[0]))
    assert main(["dispatch", "--show", "--table", out]) == 0
    assert "float32 full D32 G1 prefill kv32" in capsys.readouterr().out
    assert main(["dispatch", "--show", "--table", str(tmp_path / "none.json")]) == 2
    assert main(["dispatch", "--build", "--results", str(tmp_path / "*.nothing")]) == 1
    (tmp_path / "bad.jsonl").write_text('{"type": "result", "kind": "phase", "time_ms": "fast"}\n')
    assert main(["dispatch", "--build", "--results", str(tmp_path / "bad.jsonl"), "--out", out]) == 2
    assert "bad.jsonl" in capsys.readouterr().err


def test_the_committed_table_is_a_build_of_the_committed_results(capsys):
    """numba_attn/data/dispatch.json is generated: rebuild with `numba-attn dispatch --build`."""
    assert not dispatch.stale(never_default=api.NEVER_DEFAULT), \
        "numba_attn/data/dispatch.json differs from the committed results: run `numba-attn dispatch --build`"
    assert main(["dispatch", "--check"]) == 0
    table = dispatch.load(dispatch.PACKAGE_TABLE)
    assert table["sources"] and all(s.startswith("results/") for s in table["sources"])


@pytest.mark.parametrize("head_dim,causal", [(64, False), (128, False), (64, True)])
def test_on_an_h200_fp16_prefill_runs_the_fastest_measured_phase(monkeypatch, tmp_path, head_dim, causal):
    monkeypatch.delenv(dispatch.TABLE_ENV, raising=False)
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "no-cache.json"))
    monkeypatch.setattr(policy, "device_name", lambda: "NVIDIA H200")
    p = Problem(batch=1, heads=32, q_len=4096, head_dim=head_dim, causal=causal, dtype="float16")
    ph, why, params = api.choose_phase(p)
    entry = dispatch.lookup("NVIDIA H200", p, dispatch.PACKAGE_TABLE)
    first = entry["ranking"][0]
    overlap = [it["time_ms"] for it in entry["ranking"] if it["phase"] == "tc_wgmma_overlap"]
    assert overlap and min(overlap) > first["time_ms"]  # measured, slower, never chosen
    rule = policy.hopper_order(p)[0]
    if not dispatch.measured_default(entry, rule):
        # the D64 entries timed the tc_wgmma family only: no evidence against the Hopper rule's phase
        assert ph.name == rule and params == {} and why.startswith("the Hopper rule")
        return
    # the fastest measured (ws_tma_q at D128, with the parameters that measured fastest), never
    # tc_wgmma_overlap, which the fixed preference chose before there was a table
    assert ph.name in ("tc_wgmma", "tma_wgmma", "warp_specialized_tc", "ws_intra", "ws_intra_kv", "ws_tma_q")
    assert params == entry["requested"]
    assert (first["phase"], first["requested"]) == (ph.name, params)
    assert why.startswith(f"dispatch table (numba_attn/data/dispatch.json: {ph.name}") and "results/" in why


def test_simulator_rows_and_arrays_stay_out(tmp_path):
    sim = _row("smem_kv", TINY, None, gpu="simulator")
    table, _ = _build(tmp_path, [sim, _row("smem_kv", TINY, float("nan"))])
    assert table["entries"] == {}
    assert np.isfinite([it["time_ms"] for e in _build(tmp_path)[0]["entries"].values() for it in e["ranking"]]).all()


def test_the_table_names_only_phases_of_the_contiguous_layout():
    """attention() reads contiguous arrays: a paged or varlen phase (or a row measured on such a layout)
    never enters its dispatch table, even where it was the fastest row of a committed results file."""
    from numba_attn.measure import dispatch as dsp
    from numba_attn.phases.registry import get_phase

    table = dsp.load()
    names = {item["phase"] for e in table["entries"].values() for item in e["ranking"]} if "entries" in table \
        else {item["phase"] for e in table.values() if isinstance(e, dict) and "ranking" in e for item in e["ranking"]}
    assert names and all(get_phase(n).layout == "contiguous" for n in names), names
