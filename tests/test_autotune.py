"""phase=None on a GPU model the table does not know: measured on first use (a fake timer stands for the GPU's
CUDA events; the candidates' kernels run once each in the simulator, on a tiny problem, and their outputs are
checked), the Hopper rule and another Hopper model's entries when nothing is measured, and the simulator, which
never times."""
import json
import re

import numpy as np
import pytest

from numba_attn import api
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure import autotune, dispatch, policy, timing
from numba_attn.measure import tune as tuning
from numba_attn.phases import registry
from numba_attn.phases.registry import Launch, get_phase
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, reference

SMALL = Problem(batch=1, heads=2, q_len=20, kv_len=23, head_dim=16, dtype="float16", causal=True)
SHORTLIST = ("warp_specialized_tc", "tma_wgmma", "tc_wgmma", "ws_overlap")
FAKE_MS = {"warp_specialized_tc": 0.50, "tma_wgmma": 0.30, "tc_wgmma": 0.40}


@pytest.fixture
def first_use(tmp_path, monkeypatch):
    """A GPU model no table knows, an empty tuning cache, the measurement on, and a fake timer that returns each
    candidate's time from FAKE_MS (1 ms for others); ``calls`` lists the phases timed, in the order first timed."""
    calls = []

    def fake_timer(fn, stream):  # (the candidate ran and was checked before any is timed)
        if fn.phase not in calls:
            calls.append(fn.phase)
        return FAKE_MS.get(fn.phase, 1.0)

    monkeypatch.setattr(policy, "device_name", lambda: "Test GPU")
    monkeypatch.setenv(dispatch.TABLE_ENV, str(tmp_path / "no-table.json"))
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "cache.json"))
    monkeypatch.setenv(autotune.AUTOTUNE_ENV, "1")
    monkeypatch.setattr(autotune, "time_calls", fake_timer)
    monkeypatch.setattr(autotune, "_CHOSEN", {})
    monkeypatch.setattr(autotune, "_FAILED", set())
    return calls


def _cache(tmp_path) -> dict:
    return json.loads((tmp_path / "cache.json").read_text())["entries"]


def test_first_use_times_the_shortlist_keeps_the_fastest_and_later_calls_reuse_it(first_use, tmp_path, capsys):
    ph, why, params = policy.choose_phase(SMALL, measure=True)
    assert first_use == list(SHORTLIST)
    assert ph.name == "tma_wgmma" and params == {} and why.startswith("measured on first use (cache ")
    assert "tc_wgmma 0.4 ms" in why and "warp_specialized_tc 0.5 ms" in why
    group = _cache(tmp_path)[tuning.cache_key("Test GPU", SMALL)]
    assert group["best_phase"] == "tma_wgmma" and sorted(group["phases"]) == sorted(SHORTLIST)
    entry = group["phases"]["tma_wgmma"]
    assert entry["measured"] == "first use" and entry["time_ms"] == 0.3 and entry["params"] == {}
    assert entry["label"] == SMALL.label and entry["resolved"]["Bc"] > 0
    err = capsys.readouterr().err
    assert "timing " + ", ".join(SHORTLIST) in err and "NUMBA_ATTN_AUTOTUNE=0" in err
    # later: the cache decides, nothing is timed again (another problem of the key too)
    ph, why, _ = policy.choose_phase(SMALL.replace(batch=3), measure=True)
    assert ph.name == "tma_wgmma" and why.startswith("measured on first use (cache ") \
        and len(first_use) == len(SHORTLIST)
    q, k, v = SMALL.inputs(1)
    e = api.explain(q, k, v, causal=True)
    assert e.name == "tma_wgmma" and "measured on first use" in e.why and "parameters tuned" not in e.why


@pytest.mark.parametrize("ws_ms,chosen", [(0.305, "warp_specialized_tc"), (0.307, "tma_wgmma")])
def test_first_use_keeps_the_earliest_within_the_margin_and_later_calls_agree(first_use, tmp_path, monkeypatch,
                                                                               ws_ms, chosen):
    """A later candidate wins only by more than autotune.MARGIN (2 %) over every earlier one; the cache's best
    phase is that choice, so the next call (the tuning cache's path) runs the same phase."""
    monkeypatch.setitem(FAKE_MS, "warp_specialized_tc", ws_ms)  # tma_wgmma 0.30: 1.7 % or 2.3 % faster

    def unrun(problem, ph, arrays, poisoned, stream):  # (only the choice is tested: no candidate compiled or run)
        def fn(i, s=stream):
            pytest.fail("launched")
        fn.phase = ph.name
        return fn, ph.resolve(problem, {}), None

    monkeypatch.setattr(autotune, "prepare_candidate", unrun)
    ph, why, _ = policy.choose_phase(SMALL, measure=True)
    assert ph.name == chosen and "the earliest within 2% of the fastest" in why
    assert _cache(tmp_path)[tuning.cache_key("Test GPU", SMALL)]["best_phase"] == chosen
    monkeypatch.setattr(autotune, "_CHOSEN", {})  # a new process: the cache decides
    ph, why, _ = policy.choose_phase(SMALL.replace(batch=2), measure=True)
    assert ph.name == chosen and len(first_use) == len(SHORTLIST)


def test_attention_measures_on_fresh_buffers_and_runs_the_winner(first_use):
    q, k, v = SMALL.inputs(2)
    copies = [a.copy() for a in (q, k, v)]
    out = np.full(q.shape, 7.0, dtype=q.dtype)
    got = api.attention(q, k, v, causal=True, out=out)
    assert first_use == list(SHORTLIST) and got is out
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v), copies))
    assert check(out, reference(q, k, v, causal=True), dtype="float16").ok
    assert api.explain(q, k, v, causal=True).name == "tma_wgmma"


def test_explain_says_what_attention_will_measure_and_measures_nothing(first_use, tmp_path):
    q, k, v = SMALL.inputs(1)
    e = api.explain(q, k, v, causal=True)
    assert e.name == "warp_specialized_tc" and "Hopper rule" in e.why
    assert "attention() times " + ", ".join(SHORTLIST) + " on its first call" in e.why
    assert first_use == [] and not (tmp_path / "cache.json").exists()


@pytest.mark.parametrize("how", [pytest.param("env", marks=pytest.mark.full), "argument"])  # (one in the quick tier)
def test_the_opt_out_is_respected(first_use, tmp_path, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv(autotune.AUTOTUNE_ENV, "0")
        ph, why, _ = policy.choose_phase(SMALL, measure=True)
    else:  # the argument wins over the environment's 1
        ph, why, _ = policy.choose_phase(SMALL, measure=True, autotune=False)
    assert ph.name == "warp_specialized_tc" and "Hopper rule" in why and "attention() times" not in why
    assert first_use == [] and not (tmp_path / "cache.json").exists()
    assert policy.choose_phase(SMALL, measure=True, autotune=True)[0].name == "tma_wgmma"  # asked for


def test_a_failing_candidate_is_skipped(first_use, tmp_path, monkeypatch):
    def broken(problem, **_):
        raise RuntimeError("ptxas: too many resources requested")

    def nan_launch(problem, **_):
        def run(q, k, v, o, stream=0):
            o.copy_to_device(np.full(o.shape, np.nan, dtype=np.float16))
        return Launch(run)

    monkeypatch.setattr(get_phase("warp_specialized_tc"), "plan", broken)
    monkeypatch.setattr(get_phase("tma_wgmma"), "plan", nan_launch)
    ph, why, _ = policy.choose_phase(SMALL, measure=True)
    assert ph.name == "tc_wgmma" and why.startswith("measured on first use")
    assert "warp_specialized_tc: RuntimeError: ptxas: too many resources requested" in why
    assert "tma_wgmma: " in why and "NaN, Inf or never written" in why
    assert sorted(_cache(tmp_path)[tuning.cache_key("Test GPU", SMALL)]["phases"]) == ["tc_wgmma", "ws_overlap"]


def test_when_every_candidate_fails_the_rule_runs_and_the_key_is_not_measured_again(first_use, tmp_path,
                                                                                   monkeypatch, capsys):
    def broken(problem, **_):
        raise RuntimeError("no")

    for name in SHORTLIST:
        monkeypatch.setattr(get_phase(name), "plan", broken)
    ph, why, _ = policy.choose_phase(SMALL, measure=True)
    assert ph.name == "warp_specialized_tc" and "Hopper rule" in why
    assert "no phase measured" in capsys.readouterr().err and not (tmp_path / "cache.json").exists()
    monkeypatch.setattr(autotune, "time_calls", lambda fn, stream: pytest.fail("measured again"))
    assert policy.choose_phase(SMALL, measure=True)[0].name == "warp_specialized_tc"


@pytest.mark.skipif(not IS_SIMULATOR, reason="on a GPU the measurement is on by default")
def test_the_simulator_never_times(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "cache.json"))
    monkeypatch.setenv(dispatch.TABLE_ENV, str(tmp_path / "no-table.json"))
    monkeypatch.setattr(autotune, "_FAILED", set())
    monkeypatch.setattr(timing, "events_batched", lambda *a, **k: pytest.fail("timed in the simulator"))
    monkeypatch.delenv(autotune.AUTOTUNE_ENV, raising=False)
    assert not autotune.enabled()  # off by default in the simulator
    monkeypatch.setenv(autotune.AUTOTUNE_ENV, "1")  # asked for: the simulator's model is still never measured
    ph, why, _ = policy.choose_phase(SMALL, measure=True)
    assert ph.name == "tc_wgmma" and why.startswith("preferred for prefill")
    # a GPU model's name in the simulator: the timer itself refuses before a kernel runs
    monkeypatch.setattr(policy, "device_name", lambda: "NVIDIA H800")
    ph, why, _ = policy.choose_phase(SMALL, measure=True)
    assert ph.name == "warp_specialized_tc" and "Hopper rule" in why
    assert not (tmp_path / "cache.json").exists()
    with pytest.raises(autotune.NotTimed):
        autotune.time_calls(lambda i, s: pytest.fail("launched"), 0)


def test_first_use_measures_the_persistent_kernels_from_d128():
    """ws_tma_q_early is the rule's first and measured first from D80, ws_tma_q second in both (where its grandchild
    was never measured the rule's order reaches it); ws_intra_persistent is the rule's never; neither at D64."""
    cands = [p for p in registry.list_phases() if p.is_builtin]
    long_causal = Problem(batch=2, heads=16, q_len=8192, head_dim=128, dtype="float16", causal=True)
    assert [p.name for p in autotune.shortlist(long_causal, "prefill", cands)] == [
        "ws_tma_q_early", "ws_tma_q", "ws_intra_kv", "ws_intra"]
    assert policy.hopper_order(long_causal)[:2] == ("ws_tma_q_early", "ws_tma_q")
    assert policy.hopper_order(long_causal.replace(causal=False))[:3] == ("ws_tma_q_early", "ws_tma_q", "ws_intra_kv")
    assert "ws_intra_persistent" not in policy.hopper_order(long_causal)
    d64 = [p.name for p in autotune.shortlist(long_causal.replace(head_dim=64), "prefill", cands)]
    assert "ws_tma_q_early" not in d64 and "ws_tma_q" not in d64


def test_no_measurement_for_fp32_decode_or_a_variant():
    cands = [p for p in registry.list_phases() if p.is_builtin]
    assert autotune.shortlist(SMALL.replace(dtype="float32"), "prefill", cands) == []
    assert autotune.shortlist(SMALL.replace(q_len=1, causal=False), "decode", cands) == []
    assert [p.name for p in autotune.shortlist(SMALL, "prefill", cands)] == list(SHORTLIST)
    assert [p.name for p in autotune.shortlist(SMALL, "prefill", [get_phase("tc_mma"), get_phase("tc_pipelined")])] \
        == ["tc_pipelined", "tc_mma"]  # a GPU without sm_90a: the mma.sync phases


# -- with nothing measured: another Hopper model's entry, the Hopper rule ---------------------------------------

NINE = {  # issue 42's table: the problems phase=None must pick right on H100 and H200
    "B1 H32 N4096 D128 fp16": Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float16"),
    "B4 H32 N2048 D64 fp16": Problem(batch=4, heads=32, q_len=2048, head_dim=64, dtype="float16"),
    "B1 H32/8kv N8192 D128 bf16 causal": Problem(batch=1, heads=32, kv_heads=8, q_len=8192, head_dim=128,
                                                 dtype="bfloat16", causal=True),
    "B16 H16 N512 D64 fp16": Problem(batch=16, heads=16, q_len=512, head_dim=64, dtype="float16"),
    "B1 H16 N4096 D256 fp16": Problem(batch=1, heads=16, q_len=4096, head_dim=256, dtype="float16"),
    "B1 H32 N16384 D128 fp16 causal": Problem(batch=1, heads=32, q_len=16384, head_dim=128, dtype="float16",
                                              causal=True),
}


@pytest.fixture
def package_table(tmp_path, monkeypatch):
    monkeypatch.delenv(dispatch.TABLE_ENV, raising=False)
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "no-cache.json"))
    monkeypatch.setenv(autotune.AUTOTUNE_ENV, "0")


def test_an_unknown_hopper_model_takes_another_hopper_models_entry_or_the_rule(package_table):
    ph, why, params = policy.choose_phase(NINE["B4 H32 N2048 D64 fp16"], gpu="NVIDIA H800")
    # the H100's entry never measured ws_tma_q_wide, the rule's phase at D64, so it does not count; the H200's does
    assert ph.name == "ws_tma_q_wide" and params == {}
    assert "the entry of NVIDIA H200, of the same compute capability" in why
    ph, why, params = policy.choose_phase(NINE["B16 H16 N512 D64 fp16"], gpu="NVIDIA H800")
    # (the H200's entry measured the rule's phase there, ws_tma_q_wide, the fastest: 1.05x tma_wgmma)
    assert ph.name == "ws_tma_q_wide" and params == {} and "the entry of NVIDIA H200" in why
    ph, why, params = policy.choose_phase(NINE["B1 H16 N4096 D256 fp16"], gpu="NVIDIA H800")
    assert ph.name == "ws_intra_qs" and params == {} and "the entry of NVIDIA H200" in why  # (measured beside tma)
    ph, why, params = policy.choose_phase(NINE["B1 H32/8kv N8192 D128 bf16 causal"], gpu="NVIDIA H800")
    # (the H200's entry there never measured ws_tma_q_early, the rule's phase: the rule decides)
    assert ph.name == "ws_tma_q_early" and params == {} and why.startswith("the Hopper rule")
    assert dispatch.other_models("NVIDIA H800", (9, 0)) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]


def _rules_phase(p):
    """The first phase of the Hopper rule's order for ``p`` that supports it (ws_tma_q above D64, ws_intra_qs above
    D128)."""
    return next(n for n in policy.hopper_order(p) if get_phase(n).supports(p) is None)


def test_the_known_models_pick_the_rules_phase_on_the_issues_problems(package_table):
    """On the nine problems phase=None runs the rule's phase, or where the H200's measurements name a faster one
    (RULE_EXCEPTIONS) that one, from the dispatch table; or a phase the table measured level with the rule's (its
    entry ranks the rule's phase within RULE_TOLERANCE: ws_tma_q and ws_tma_q_early at N4096)."""
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        for label, p in NINE.items():
            ph, why, _ = policy.choose_phase(p, gpu=gpu)
            if ph.name == RULE_EXCEPTIONS.get(("NVIDIA H200", label)):
                assert why.startswith("dispatch table") and "on NVIDIA H200" in why, (gpu, label, why)
            elif ph.name != _rules_phase(p):
                assert why.startswith("dispatch table"), (gpu, label, why)
                model = "NVIDIA H200" if "on NVIDIA H200" in why else gpu
                entry = dispatch.lookup(model, p, dispatch.PACKAGE_TABLE)
                rule = [it for it in entry["ranking"] if it["phase"] == _rules_phase(p) and not it["requested"]]
                assert rule and rule[0]["score"] <= RULE_TOLERANCE, (gpu, label, why)
    assert {_rules_phase(p) for p in NINE.values()} == {"ws_tma_q_early", "ws_tma_q_wide", "ws_intra_qs"}


def test_off_hopper_no_rule_and_no_other_models_entry(package_table, monkeypatch):
    monkeypatch.setattr(registry, "device_cc", lambda: (8, 0))
    ph, why, _ = policy.choose_phase(NINE["B4 H32 N2048 D64 fp16"], gpu="NVIDIA A100-SXM4-80GB")
    assert ph.name == "tc_pipelined" and why.startswith("preferred for prefill")


def test_an_entry_that_never_measured_the_rules_phase_does_not_count(package_table):
    p = Problem(batch=1, heads=32, q_len=4096, head_dim=64, dtype="float16")  # H200: the tc_wgmma family only
    entry = dispatch.lookup("NVIDIA H200", p, dispatch.PACKAGE_TABLE)
    assert entry["phase"] == "tc_wgmma" and not dispatch.measured_default(entry, "ws_tma_q_wide")
    ph, why, _ = policy.choose_phase(p, gpu="NVIDIA H200")
    assert ph.name == "ws_tma_q_wide" and why.startswith("the Hopper rule")



def test_a_configuration_of_another_problem_of_the_key_does_not_overrule_the_rule(package_table):
    """The H200's N16384 causal D128 entry holds B1 H16 rows (warp_specialized_tc with 64-key tiles, 2.13 ms) and
    B1 H32 ones (ws_tma_q, ws_tma_q_early, 3.7 ms): the H16 configuration, never timed beside the rule's phase,
    is skipped (it ran 1.17x the fastest on the H32 problem, check.py at ebc6ae6)."""
    ph, why, params = policy.choose_phase(NINE["B1 H32 N16384 D128 fp16 causal"], gpu="NVIDIA H200")
    assert ph.name in ("ws_tma_q", "ws_tma_q_early") and params == {}, why
    assert "not timed beside ws_tma_q_early" in why

# Two phases level on a problem swap places between runs: ws_intra_kv's rows at B2 H16 N8192 D128 fp16 causal read
# 1.027 and 0.968 ms (H200, experiments/2026-11-28-ws-intra). "Slower" in the rule's test is beyond this.
RULE_TOLERANCE = 1.02
# Where a phase outside the rule is the faster one, named, with the reason the rule stays: first use measures it
# (autotune.MEASURED), so phase=None still runs the fastest there. None since ws_tma_q: ws_intra_persistent's
# long causal cells (1.04x ws_intra before) now go to ws_tma_q, 1.07x ws_intra_lpt and 1.08x ws_intra_persistent
# at B2 H16 N8192 D128 fp16 causal in one run (H200, experiments/2026-11-28-schedule/tma-q.sh). At B16 H16 N512 D64
# tma_wgmma (one warpgroup issuing its own loads) is 1.10x warp_specialized_tc in two runs (0.0574 against 0.0634
# and 0.0578 against 0.0640 ms; H200, 0406a7b, experiments/2026-11-28-dispatch/check.py and tma-q's d64 run), the
# one exception until ws_tma_q_wide, the rule's at D64, ran 1.05x tma_wgmma there (H200, ebc6ae6).
RULE_EXCEPTIONS = {}


def test_the_hopper_rule_holds_on_the_committed_rows():
    """Of the Hopper rule's phases (policy.hopper_order, each at its default parameters), the first one measured on
    a committed problem beside another 16-bit prefill phase is the fastest there (the median of its rows, within
    RULE_TOLERANCE), on an H100 and on an H200 (docs/DEVELOPING.md lists them): the rule never puts a slower phase
    first, but where RULE_EXCEPTIONS names the faster phase and first use measures it."""
    cells: dict = {}
    for m in dispatch.measurements():
        gpu, dtype, *_ = m["key"].split("|")
        if dtype in ("float16", "bfloat16") and "|prefill|" in m["key"] and not m["requested"] \
                and m["phase"] not in policy.NEVER_DEFAULT and get_phase(m["phase"]).precision is None:
            cells.setdefault((gpu, m["label"]), {}).setdefault(m["phase"], []).append(m["time_ms"])
    checked, excepted = {}, set()
    for (gpu, label), by in cells.items():
        head_dim = int(re.search(r"\bD(\d+)\b", label).group(1))
        shape = Problem(head_dim=head_dim, causal=" causal" in label)
        rule = next((n for n in policy.hopper_order(shape) if n in by), None)
        if rule is None or len(by) < 2:
            continue
        med = {ph: sorted(ts)[(len(ts) - 1) // 2] for ph, ts in by.items()}
        fastest = min(med, key=med.get)
        if med[rule] > med[fastest] * RULE_TOLERANCE and RULE_EXCEPTIONS.get((gpu, label)) == fastest:
            assert fastest in autotune.MEASURED["prefill16"], fastest  # (first use measures it)
            excepted.add((gpu, label))
            continue
        assert med[rule] <= med[fastest] * RULE_TOLERANCE, (gpu, label, med)
        checked.setdefault(gpu, []).append(label)
    assert excepted == set(RULE_EXCEPTIONS), (excepted, RULE_EXCEPTIONS)  # each exception still measured so
    assert len(checked.get("NVIDIA H100 80GB HBM3", [])) >= 4 and len(checked.get("NVIDIA H200", [])) >= 10, checked
