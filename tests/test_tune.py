"""Tuning: parameter spaces, `numba-attn tune`, the tuning cache and attention() reading it.

Backend-neutral: the cache key names the active device (``gpu_info()["gpu"]``: "simulator" or the GPU
model); in the simulator the rows are untimed and the stand-in rule chooses the default, on a GPU the
rows are timed and the fastest OK candidate is chosen."""
import json
import os
import re

import numpy as np
import pytest

import numba_attn as na
from numba_attn.measure import tune as tuning
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure.config import RunConfig
from numba_attn.measure.env import gpu_info
from numba_attn.measure.results import load_results
from numba_attn.phases.registry import Phase, candidate_configs, expand_values, get_phase, list_phases, temporary_phases
from numba_attn.spec.problem import Problem
from numba_attn.testing import _build_buggy

TINY = Problem(batch=1, heads=1, q_len=9, kv_len=17, head_dim=8)
SMALL_SPACE = {"smem_kv": {"Br": [16, 32], "Bc": [16]}}


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    monkeypatch.setenv(tuning.CACHE_ENV, str(path))
    return path


def _cfg(tmp_path, name="r.jsonl", timeout=None):
    return RunConfig(seeds=(1,), timeout_s=timeout, peers=False, results=str(tmp_path / name))


def _device():
    """The device name the cache keys of this process use ("simulator" in the simulator)."""
    return gpu_info()["gpu"]


def assert_chosen_by_the_rule(t):
    """The chosen candidate is OK; in the simulator (untimed rows) it is the default when that is OK, else
    the first OK candidate; on a GPU (timed rows) it is the earliest OK candidate within the noise of the
    least time (tuning.TIE_TOLERANCE or twice the spread)."""
    assert t.best is not None and t.best_row is not None and t.best_row["status"] == "OK"
    assert (t.best, t.best_row) in t.ok
    times = [r.get("time_ms") for _, r in t.ok]
    if IS_SIMULATOR:
        assert all(x is None for x in times)
        default = [p for p, _ in t.ok if not p]
        assert t.best == (default[0] if default else t.ok[0][0])
    else:
        assert all(x is not None and x > 0 for x in times)
        assert t.best_row["time_ms"] <= min(times) * (1 + max(tuning.TIE_TOLERANCE, 2 * max(
            float(r.get("spread_p10_p90") or 0) for _, r in t.ok)))
        earlier = [r for _, r in t.ok[:t.ok.index((t.best, t.best_row))]]
        assert all(r["time_ms"] > min(times) * (1 + tuning.TIE_TOLERANCE) for r in earlier)


def test_ties_within_the_noise_go_to_the_earliest_candidate():
    """One candidate timed twice differs by ~0.7 % (one standard deviation): the choice must not flip on
    that, so candidates within 3 % of the fastest tie."""
    def row(ms, spread=0.002):
        return {"status": "OK", "time_ms": ms, "spread_p10_p90": spread}

    def best(*measured):
        t = tuning.Tuned("x", TINY, len(measured), list(measured))
        tuning.choose_best(t)
        return t

    t = best(({}, row(0.1285)), ({"warps": 4}, row(0.1277)), ({"warps": 2}, row(0.1400)))
    assert t.best == {} and "within the noise" in t.rule  # 0.6 % slower than the fastest: a tie, the default
    t = best(({}, row(0.1300)), ({"warps": 4}, row(0.1277)))
    assert t.best == {} and "within the noise" in t.rule  # 1.8 % slower: still a tie
    t = best(({}, row(0.1320)), ({"warps": 4}, row(0.1277)))
    assert t.best == {"warps": 4} and "within the noise" not in t.rule  # 3.4 % slower: not a tie
    t = best(({}, row(0.1320, spread=0.02)), ({"warps": 4}, row(0.1277)))
    assert t.best == {}  # a noisy row widens the tie (twice its 2 % spread)
    t = best(({}, {"status": "FAIL", "time_ms": None}), ({"warps": 4}, row(0.2)), ({"warps": 8}, row(0.1995)))
    assert t.best == {"warps": 4}  # a failed default is never chosen; the next candidate wins the tie


def test_spaces_declared_and_candidates_pruned():
    tunable = [p for p in list_phases() if p.params and p.is_builtin]
    assert all(p.space for p in tunable), [p.name for p in tunable if not p.space]
    assert expand_values({"pow2": (16, 128)}) == [16, 32, 64, 128]
    ph = get_phase("smem_kv")
    cands = candidate_configs(ph, TINY)
    assert cands[0] == {}  # the default first
    resolved = [tuple(sorted(ph.resolve(TINY, ph.resolve_params(c)).items())) for c in cands]
    assert len(set(resolved)) == len(resolved)  # configurations that resolve alike are measured once
    only16 = candidate_configs(ph, TINY, {"Br": [16], "Bc": [16, 32], "where": lambda pr, p: p["Bc"] == 16})
    assert only16 == [{"Br": 16, "Bc": 16}]  # the constraint removes the default (Bc 32) too


def test_cache_key_buckets():
    k = tuning.cache_key
    assert tuning.length_bucket(17) == 32 and tuning.length_bucket(32) == 32 and tuning.length_bucket(33) == 64
    a = Problem(batch=1, heads=8, kv_heads=2, q_len=1, kv_len=3000, head_dim=64, dtype="float16")
    b = Problem(batch=4, heads=16, kv_heads=4, q_len=1, kv_len=4096, head_dim=64, dtype="float16")
    assert k("H100", a) == k("H100", b)  # same GQA ratio and kv bucket; batch/heads not in the key
    assert k("H100", a) != k("H200", a)
    assert k("H100", a) != k("H100", Problem(batch=1, heads=8, kv_heads=2, q_len=2, kv_len=3000, head_dim=64,
                                                dtype="float16"))  # decode (q_len 1) vs prefill
    assert k("H100", a) != k("H100", Problem(batch=1, heads=8, kv_heads=8, q_len=1, kv_len=3000, head_dim=64,
                                                dtype="float16"))  # GQA ratio
    assert "kv4096" in k("H100", a)


def test_tune_finds_and_caches(tmp_path, cache_env):
    out = tuning.tune(["smem_kv"], [TINY], config=_cfg(tmp_path), space=SMALL_SPACE)
    (t,) = out
    assert len(t.measured) == 3 and len(t.ok) == 3
    assert_chosen_by_the_rule(t)
    if IS_SIMULATOR:
        assert t.best == {}  # the stand-in rule: the default
    rows = [r for r in load_results(str(tmp_path / "r.jsonl")) if r.get("type") == "result"]
    assert len(rows) == 3 and all(r["status"] == "OK" for r in rows)
    assert sorted(json.dumps(r["requested_params"], sort_keys=True) for r in rows) == sorted(
        json.dumps(c, sort_keys=True) for c in ({}, {"Br": 16, "Bc": 16}, {"Br": 32, "Bc": 16}))
    entry = tuning.TuningCache(str(cache_env)).lookup(_device(), TINY, "smem_kv")
    assert entry is not None, tuning.TuningCache(str(cache_env)).format()
    assert entry["params"] == t.best and entry["time_ms"] == t.best_row.get("time_ms")
    assert entry["results"] == str(tmp_path / "r.jsonl")
    if IS_SIMULATOR:
        assert entry["params"] == {} and entry["time_ms"] is None  # no time is invented
    # --resume: the OK candidates are not measured again
    cfg = _cfg(tmp_path)
    cfg.resume = True
    again = tuning.tune(["smem_kv"], [TINY], config=cfg, space=SMALL_SPACE, write_cache=False)
    assert all(r.get("resumed") for _, r in again[0].measured)


def _bug_phase():
    ok, bad = _build_buggy("none"), _build_buggy("zeros")

    def build(problem, threads=32, bug=True):
        return (bad if bug else ok)(problem, threads)

    # the default (bug=True) is the wrong kernel: the stand-in rule must skip it
    return Phase(name="tune_bug", order=990, title="a parameter that selects a bug", parent=None,
                 description="test fixture", lineage="test fixture", planned_speedup=None, build=build,
                 params={"threads": 32, "bug": True}, dtypes=("float32",), module=__name__,
                 space={"bug": [True, False], "threads": [16, 32]})


def test_wrong_configuration_never_chosen(tmp_path, cache_env):
    with temporary_phases(_bug_phase()):
        for strategy in ("grid", "random"):
            (t,) = tuning.tune(["tune_bug"], [TINY], config=_cfg(tmp_path), strategy=strategy, seed=3)
            bad = [p for p, r in t.measured if r["status"] != "OK"]
            assert bad and all(p.get("bug", True) for p in bad)  # every bug=True candidate FAILs
            assert t.best is not None and t.best.get("bug") is False
            assert_chosen_by_the_rule(t)
        entry = tuning.TuningCache(str(cache_env)).lookup(_device(), TINY, "tune_bug")
        assert entry is not None, tuning.TuningCache(str(cache_env)).format()
        assert entry["params"]["bug"] is False


def test_two_workers_same_best_no_lost_rows(tmp_path, cache_env):
    one = tuning.tune(["smem_kv"], [TINY], config=_cfg(tmp_path, "one.jsonl"), space=SMALL_SPACE,
                      write_cache=False)
    two = tuning.tune(["smem_kv"], [TINY], config=_cfg(tmp_path, "two.jsonl", timeout=300), space=SMALL_SPACE,
                      workers=2, write_cache=False, oversubscribe=True)  # one GPU is enough
    for t in (one[0], two[0]):
        assert_chosen_by_the_rule(t)
    if IS_SIMULATOR:  # on a GPU the candidates of a tiny problem are launch-bound: the fastest is a coin toss
        assert one[0].best == two[0].best
    rows = [r for r in load_results(str(tmp_path / "two.jsonl")) if r.get("type") == "result"]
    keys = [json.dumps(r["requested_params"], sort_keys=True) for r in rows]
    assert len(keys) == 3 and len(set(keys)) == 3 and all(r["status"] == "OK" for r in rows)


def test_cli_tune_and_show(tmp_path, cache_env, capsys):
    from numba_attn.cli import main

    rc = main(["tune", "smem_kv", "-B", "1", "-H", "1", "-N", "9", "--kv-len", "17", "-D", "8",
               "--space", "smem_kv.Br=16", "--space", "smem_kv.Bc=16", "--budget", "2", "--timeout", "0",
               "--results", str(tmp_path / "cli.jsonl"), "--seeds", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "2 of 2 candidates measured" in out
    # where the wall time went, stage by stage (the rows took time; every stage is named)
    m = re.search(r"seconds: before tuning ([\d.]+), setup ([\d.]+), rows ([\d.]+), final ([\d.]+), "
                  r"close ([\d.]+), cache ([\d.]+)", out)
    assert m and float(m.group(3)) > 0, out
    assert main(["tune", "--show"]) == 0
    shown = capsys.readouterr().out
    key = f"{_device()}|float32|full|D8|G1|prefill|kv32"
    assert tuning.cache_key(_device(), TINY) == key and f"{key}  best: smem_kv" in shown, shown
    if IS_SIMULATOR:
        assert "simulator|float32|full|D8|G1|prefill|kv32" in shown and "untimed (simulator)" in shown
    else:
        assert " ms  [" in shown  # the chosen configuration's time


def test_ray_missing_says_how_to_install(capsys):
    from numba_attn.cli import main
    from numba_attn.measure import distributed

    if distributed.available():
        pytest.skip("ray is installed")
    assert main(["tune", "smem_kv", "--ray"]) == 2
    assert 'pip install -e ".[ray]"' in capsys.readouterr().err


def test_bayes_without_optuna(capsys):
    try:
        import optuna  # noqa: F401

        pytest.skip("optuna is installed")
    except ImportError:
        pass
    from numba_attn.cli import main

    assert main(["tune", "smem_kv", "--strategy", "bayes"]) == 2
    assert "optuna" in capsys.readouterr().err.lower()


def test_attention_uses_cache(cache_env):
    key = tuning.cache_key(_device(), TINY)  # the key of this device: attention() looks it up
    tuning.TuningCache(str(cache_env)).update([(key, "smem_kv", {"params": {"Br": 16, "Bc": 16}, "time_ms": None},
                                                True)])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 9, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 17, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 17, 8)).astype(np.float32)
    ex = na.explain(q, k, v, phase="smem_kv")
    assert ex.params == {"Br": 16, "Bc": 16} and f"tuned (cache {cache_env})" in ex.why
    assert na.explain(q, k, v, phase="smem_kv", Br=32).params["Br"] == 32  # given parameters win
    auto = na.explain(q, k, v)
    assert auto.name == "smem_kv" and auto.why.startswith("tuned (cache")
    out = na.attention(q, k, v, phase="smem_kv")
    from numba_attn.spec.reference import reference

    ref = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not __import__("numba_attn.measure.distributed", fromlist=["x"]).available(),
                    reason="ray is not installed (optional extra: pip install -e \".[ray]\")")
def test_ray_same_best(tmp_path, cache_env):
    from numba_attn.measure import distributed

    pool = distributed.RayPool("local", 2)
    two = tuning.tune(["smem_kv"], [TINY], config=_cfg(tmp_path, "ray.jsonl", timeout=300), space=SMALL_SPACE,
                      workers=pool.size, make_worker=pool.make_worker, write_cache=False)
    one = tuning.tune(["smem_kv"], [TINY], config=_cfg(tmp_path, "one.jsonl"), space=SMALL_SPACE, write_cache=False)
    for t in (one[0], two[0]):
        assert_chosen_by_the_rule(t)
    if IS_SIMULATOR:  # on a GPU the candidates of a tiny problem are launch-bound: the fastest is a coin toss
        assert one[0].best == two[0].best
    rows = [r for r in load_results(str(tmp_path / "ray.jsonl")) if r.get("type") == "result"]
    assert len({json.dumps(r["requested_params"], sort_keys=True) for r in rows}) == len(rows) == 3
    if os.geteuid() == 0:  # Ray starts its workers at niceness 15; measuring workers run at the normal priority
        assert all(r["worker"].get("niceness") == 0 for r in rows), [r["worker"] for r in rows]


def test_ray_workers_get_the_normal_priority_back(monkeypatch):
    """A process at Ray's worker niceness (15) asks for the normal priority; where that is not allowed it
    keeps its niceness and says which."""
    from numba_attn.measure import distributed

    state = {"nice": 15, "allowed": True}

    def setpriority(which, who, value):
        if not state["allowed"] and value < state["nice"]:
            raise PermissionError("lowering the niceness needs CAP_SYS_NICE")
        state["nice"] = value

    monkeypatch.setattr(distributed.os, "getpriority", lambda which, who: state["nice"])
    monkeypatch.setattr(distributed.os, "setpriority", setpriority)
    assert distributed.normal_priority() == 0 and state["nice"] == 0
    state.update(nice=15, allowed=False)
    assert distributed.normal_priority() == 15


def test_candidates_sharing_kernels_go_to_one_worker():
    """Candidates that differ only in a phase's launch parameters (the split count) form one group,
    measured in a row by one worker (so it compiles their kernels once); other phases' candidates
    stay single; a declared launch parameter must be a parameter of the phase."""
    from numba_attn.measure.parallel import Workers

    mma = get_phase("decode_mma")
    assert mma.launch_params == ("splits",)
    chosen = [{}, {"splits": 8}, {"warps": 2}, {"warps": 2, "splits": 16}, {"splits": 16}, {"Bc": 32}]
    assert tuning.kernel_groups(mma, chosen) == [[0, 1, 4], [2, 3], [5]]
    assert tuning.kernel_groups(get_phase("smem_kv"), [{}, {"Bc": 16}]) == [[0], [1]]
    with pytest.raises(ValueError, match="unknown parameters"):
        na.register_phase(name="bad_launch", order=999, title="t", parent=None, description="d", lineage="l",
                          planned_speedup=None, launch_params=("nope",))(lambda problem, a=1: None)
    assert "bad_launch" not in [p.name for p in list_phases()]  # refused, not registered

    class Lane:
        cfg, writer, worker, rows, progress = RunConfig(), None, None, [], None

        def run_task(self, idx, n, kind, name, prob):
            import time

            time.sleep(0.01 * (idx % 3))
            self.rows.append({"idx": idx, "lane": id(self)})

    class Quiet:
        def close(self):
            pass

    lanes = Workers(Lane(), 3, make_worker=lambda i: Quiet())
    seen = {}
    chunks = [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9], [10]]
    lanes.run(([(i, 11, "phase", "x", None, None) for i in c] for c in chunks),
              lambda job, row: seen.__setitem__(job[0], row["lane"]))
    assert sorted(seen) == list(range(11))
    for c in chunks:
        assert len({seen[i] for i in c}) == 1, c


def test_candidates_timed_on_several_devices_get_a_final_round_on_one(tmp_path, cache_env, monkeypatch):
    """Two GPUs of one model differ by 1-2 % on the same kernel: candidates near the fastest that ran on
    different devices are timed again on one (rows with round "final"), and the rule is applied there."""
    def row(ms, dev, spread=0.002):
        return {"status": "OK", "time_ms": ms, "spread_p10_p90": spread, "worker": {"gpu_uuid": dev}}

    measured = [({}, row(0.1297, "GPU-a")), ({"warps": 2}, row(0.1286, "GPU-b")),
                ({"warps": 4}, row(0.1276, "GPU-b")), ({"warps": 8}, row(0.1500, "GPU-a"))]
    t = tuning.Tuned("x", TINY, 4, measured)
    assert tuning.final_round(t) == [(0, {}), (1, {"warps": 2}), (2, {"warps": 4})]  # within 5 %, strategy order
    # more than FINAL_MAX near the fastest: the fastest four, and the earliest in strategy order (the default,
    # which the tie rule prefers) although it is the slowest of them
    crowded = tuning.Tuned("x", TINY, 6, [({}, row(0.1295, "GPU-b"))]
                           + [({"warps": w}, row(0.1263 + 0.0003 * k, "GPU-a")) for k, w in enumerate((2, 4, 8, 16, 32))])
    assert [i for i, _ in tuning.final_round(crowded)] == [0, 1, 2, 3, 4]
    one_device = tuning.Tuned("x", TINY, 2, [({}, row(0.13, "GPU-a")), ({"warps": 2}, row(0.128, "GPU-a"))])
    assert tuning.final_round(one_device) == []  # one device: the rule compares the rows directly
    # the default within TIE_TOLERANCE - DEVICE_SPREAD (1 %) of the fastest ties on any one device: no final round
    close = tuning.Tuned("x", TINY, 3, [({}, row(0.1290, "GPU-a")), ({"warps": 2}, row(0.1280, "GPU-b")),
                                        ({"warps": 4}, row(0.1300, "GPU-b"))])
    assert tuning.final_round(close) == []
    tuning.choose_best(close)
    assert close.best == {}
    t.final = [({}, row(0.1281, "GPU-a")), ({"warps": 2}, row(0.1290, "GPU-a")), ({"warps": 4}, row(0.1279, "GPU-a"))]
    tuning.choose_best(t)
    assert t.best == {} and "final round" in t.rule and "GPU-a" in t.rule  # the default ties on one device
    t.final[1] = ({"warps": 2}, {"status": "FAIL", "time_ms": None})
    tuning.choose_best(t)
    assert "final round" not in t.rule  # a final round with a failure is not used: the first round's rows are

    # the final round through tune(): its rows are written apart (round "final"), not as duplicates
    monkeypatch.setattr(tuning, "final_round", lambda tuned: [(0, {}), (1, tuned.measured[1][0])])
    out = tuning.tune(["smem_kv"], [TINY], config=_cfg(tmp_path, "final.jsonl"), space=SMALL_SPACE,
                      write_cache=False)
    rows = [r for r in load_results(str(tmp_path / "final.jsonl")) if r.get("type") == "result"]
    first = [r for r in rows if not r.get("round")]
    final = [r for r in rows if r.get("round") == "final"]
    assert len(first) == 3 and len({json.dumps(r["requested_params"], sort_keys=True) for r in first}) == 3
    assert [r["requested_params"] for r in final] == [{}, out[0].measured[1][0]]
    assert len(out[0].final) == 2 and all(r["status"] == "OK" for _, r in out[0].final)


def test_a_finished_pairs_final_round_is_handed_out_before_the_next_groups():
    """A lane asking for work after a pair's rows are all in gets that pair's final round (one group, tagged
    "final") before the remaining groups; the last pair's final round is left to _final_rounds."""
    class LazyPool:  # pulls one item at a time and reports its rows before pulling the next, like one lane
        def __init__(self):
            self.items = []

        def run(self, jobs, on_row, stop=None, lanes=None):
            for item in jobs:
                self.items.append(item)
                for job in item:
                    dev = "GPU-a" if job[0] % 2 else "GPU-b"
                    on_row(job, {"status": "OK", "time_ms": 1.02 if job[0] == 0 else 1.001, "worker": {"gpu_uuid": dev},
                                 "phase": job[3]})

    def phase(name):
        return Phase(name=name, order=0, title=name, parent=None, description="", lineage="", planned_speedup=None,
                     build=None, params={"warps": 4})

    pairs = [(phase(x), TINY, tuning.Tuned(x, TINY, 2, []), [{}, {"warps": 8}], 2) for x in ("x", "y")]
    pool = LazyPool()
    tuning._run_pipelined(pool, pairs, lambda: False)
    assert [[(j[3], j[0], j[6] if len(j) > 6 else "") for j in g] for g in pool.items] == [
        [("x", 0, "")], [("x", 1, "")], [("x", 0, "final"), ("x", 1, "final")], [("y", 0, "")], [("y", 1, "")]]
    x, y = pairs[0][2], pairs[1][2]
    assert x.final_done and len(x.final) == 2 and not y.final_done and not y.final
    tuning._final_rounds(pool, pairs, lambda: False)
    assert [[(j[3], j[6]) for j in g] for g in pool.items[5:]] == [[("y", "final"), ("y", "final")]]
    assert y.final_done and len(y.final) == 2


def test_phases_are_pipelined_through_one_run_of_the_lanes():
    """grid/random: every (phase, problem)'s kernel groups go through one run of the lanes, in order, so a
    free lane starts the next phase's groups instead of waiting at each phase's end; then the final rounds
    of all pairs in one more run, one pair's candidates on one lane; rows come back to their own pair."""
    class Pool:
        def __init__(self):
            self.runs = []

        def run(self, jobs, on_row, stop=None, lanes=None):
            items = list(jobs)
            self.runs.append(items)
            for item in items:
                for job in item:
                    dev = "GPU-a" if job[0] % 2 else "GPU-b"  # two devices: a final round follows
                    ms = 1.02 if job[0] == 0 else 1.0 + 0.001 * job[0]  # the default 2 % behind: a final round
                    on_row(job, {"status": "OK", "time_ms": ms + (0.005 if job[3] == "y" else 0),
                                 "worker": {"gpu_uuid": dev}, "phase": job[3]})

    def phase(name, params, launch=()):
        return Phase(name=name, order=0, title=name, parent=None, description="", lineage="", planned_speedup=None,
                     build=None, params=params, launch_params=launch)

    ph_x, ph_y = phase("x", {"warps": 4, "splits": 0}, ("splits",)), phase("y", {"warps": 4})
    pairs = [(ph_x, TINY, tuning.Tuned("x", TINY, 4, []),
              [{}, {"splits": 2}, {"warps": 8}, {"warps": 8, "splits": 2}], 4),
             (ph_y, TINY, tuning.Tuned("y", TINY, 2, []), [{}, {"warps": 8}], 2)]
    pool = Pool()
    tuning._run_pipelined(pool, pairs, lambda: False)
    assert len(pool.runs) == 1
    assert [[(j[3], j[0]) for j in g] for g in pool.runs[0]] == [[("x", 0), ("x", 1)], [("x", 2), ("x", 3)],
                                                                  [("y", 0)], [("y", 1)]]
    assert [p for p, _ in pairs[0][2].measured] == pairs[0][3] and [p for p, _ in pairs[1][2].measured] == pairs[1][3]
    assert all(r["phase"] == t.phase for _, _, t, _, _ in pairs for _, r in t.measured)
    tuning._final_rounds(pool, pairs, lambda: False)
    assert len(pool.runs) == 2 and [[j[3] for j in g] for g in pool.runs[1]] == [["x"] * 4, ["y", "y"]]
    assert all(j[6] == "final" for g in pool.runs[1] for j in g)
    assert [p for p, _ in pairs[0][2].final] == pairs[0][3]
