"""Guards for a new user on a CPU-only machine: a row estimated to take more than a minute in the CUDA
simulator is a SKIP row whose one-line reason gives the estimate and a shape that fits (``--allow-slow``,
``NUMBA_ATTN_ALLOW_SLOW=1`` run it anyway, with a warning; ``attention()`` warns and runs); a long row says
it is running; and the commands a new user runs write nothing into the checkout (results go to the per-user
results dir)."""
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import numba_attn as na
from numba_attn.cli import main
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure import simcost
from numba_attn.measure.results import load_results
from numba_attn.measure.sweep import run
from numba_attn.phases.registry import get_phase

pytestmark = pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's guards")

README = na.Problem(batch=2, heads=8, q_len=1000, head_dim=128, causal=True, dtype="float16")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(path):
    return [r for r in load_results(str(path)) if r.get("type") == "result"]


def test_estimate_orders_rows_and_suggests_a_shape_that_fits():
    ph = get_phase("smem_kv")
    tiny = na.Problem(q_len=16, head_dim=8)
    assert simcost.estimate_s(ph, tiny) < 30 < simcost.estimate_s(ph, README) / 100
    assert simcost.thread_steps(README) == README.flops() // 2
    fit = simcost.fitting_problem(ph, README)
    assert fit is not None and fit.batch == fit.heads == 1 and fit.head_dim == 32 and fit.causal
    assert simcost.estimate_s(ph, fit) <= simcost.LIMIT_S
    est, line = simcost.describe(ph, README)
    assert "\n" not in line and line.startswith("smem_kv B2 H8 N1000 D128 fp16 causal: ~")
    assert "in the simulator" in line and "try -B 1 -H 1 -N " in line and line.endswith("pass --allow-slow")


def test_a_slow_row_is_a_recorded_skip_with_its_reason(tmp_path):
    """na.run(): the row is refused in no time, written to the results file as SKIP, its reason one line in
    Python's terms."""
    rows = run(["smem_kv"], [README], results=str(tmp_path / "r.jsonl"), timeout_s=None)
    (row,) = rows
    assert row["status"] == "SKIP" and row["sim_estimate_s"] > 60
    assert "try batch=1, heads=1, q_len=" in row["reason"] and "allow_slow=True (NUMBA_ATTN_ALLOW_SLOW=1)" in row["reason"]
    assert [r["status"] for r in _rows(tmp_path / "r.jsonl")] == ["SKIP"]


@pytest.mark.parametrize("how", ["config", "env"])
def test_allow_slow_runs_the_row_with_a_warning(how, tmp_path, monkeypatch):
    warned = []
    kw = {"allow_slow": True} if how == "config" else {}
    if how == "env":
        monkeypatch.setenv(simcost.ENV_ALLOW, "1")
    p = na.Problem(q_len=4, kv_len=6, head_dim=8)
    rows = run(["naive"], [p], results=str(tmp_path / "r.jsonl"), timeout_s=None, sim_limit_s=1e-3,
               warn=warned.append, **kw)
    assert rows[0]["status"] == "OK" and rows[0]["sim_estimate_s"] > 0
    assert len(warned) == 1 and "running it anyway" in warned[0] and "naive B1 H1 Nq4 Nk6 D8 fp32" in warned[0]


def test_attention_warns_once_per_plan_and_runs(monkeypatch):
    monkeypatch.setenv(simcost.ENV_LIMIT, "0.001")
    na.clear_plans()
    q, k, v = na.Problem(q_len=5, head_dim=8).inputs(1)
    with pytest.warns(na.api.SlowSimulationWarning, match=r"attention\(\): smem_kv B1 H1 N5 D8 fp32: ~.* in the "
                                                          r"simulator .*running it anyway"):
        out = na.attention(q, k, v, phase="smem_kv")
    assert out.shape == q.shape
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        na.attention(q, k, v, phase="smem_kv")  # the cached plan: no second warning
    na.clear_plans()


def test_cli_readme_example_is_one_line_and_quick(tmp_path, capsys):
    rc = main(["run", "--phases", "smem_kv", "-B", "2", "-H", "8", "-N", "1000", "-D", "128", "--causal",
               "--dtype", "float16", "--results", str(tmp_path / "r.jsonl")])
    out = capsys.readouterr()
    assert rc == 0
    lines = [ln for ln in (out.out + out.err).splitlines() if "in the simulator (" in ln and "[1/1" in ln]
    assert len(lines) == 1 and "try -B 1 -H 1 -N " in lines[0] and "--allow-slow" in lines[0], out
    (row,) = _rows(tmp_path / "r.jsonl")
    assert row["status"] == "SKIP" and "~" in row["reason"]


def test_a_long_row_says_it_is_running(tmp_path, capsys, monkeypatch):
    from numba_attn.cli import Progress

    monkeypatch.setattr(Progress, "BEAT_FIRST_S", 0.05)
    monkeypatch.setattr(Progress, "BEAT_EVERY_S", 0.05)
    assert main(["run", "--phases", "naive", "-N", "9", "--kv-len", "17", "-D", "8", "--timeout", "0",
                 "--results", str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "row 1/1] naive B1 H1 Nq9 Nk17 D8 fp32: running for " in err, err


# -- nothing is written into the checkout -----------------------------------------------------------------

NEW_USER = [
    ["list"],
    ["run", "--phases", "naive,smem_kv", "-N", "9", "--kv-len", "17", "-D", "8"],
    ["run", "--phases", "smem_kv", "-B", "2", "-H", "8", "-N", "1000", "-D", "128", "--causal", "--dtype", "float16"],
    ["bench", "roadmap", "--simulator", "--quick"],
    ["card", "smem_kv"],
    ["diff", "smem_kv", "--stat"],
    ["tune", "--show"],
    ["dispatch", "--show"],
]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A clone of this repository's committed tree (its own work tree, so that other edits of this one do
    not disturb the comparison)."""
    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        pytest.skip("needs git and a git checkout")
    dst = tmp_path_factory.mktemp("checkout") / "numba-attn"
    subprocess.run(["git", "clone", "-q", "--local", "--no-hardlinks", REPO, str(dst)], check=True)
    return dst


def _status(path):
    return subprocess.run(["git", "status", "--porcelain", "--ignored=no"], cwd=path, capture_output=True,
                          text=True, check=True).stdout


def test_new_user_commands_write_nothing_into_the_checkout(checkout, tmp_path):
    # this package (not the clone's copy: PYTHONSAFEPATH keeps the working directory off sys.path)
    env = {**os.environ, "NUMBA_ATTN_RESULTS": str(tmp_path / "results"), "NUMBA_ATTN_BACKEND": "simulator",
           "NUMBA_ATTN_TUNING_CACHE": str(tmp_path / "tuning-cache.json"), "PYTHONSAFEPATH": "1",
           "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    before = _status(checkout)
    for args in NEW_USER:
        res = subprocess.run([sys.executable, "-m", "numba_attn.cli", *args], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode in (0, 1), (args, res.stderr[-2000:])
        assert _status(checkout) == before, (args, _status(checkout))
    written = sorted(os.listdir(tmp_path / "results"))
    assert "simulator.jsonl" in written and "roadmap-simulator.jsonl" in written
    rows = _rows(tmp_path / "results" / "roadmap-simulator.jsonl")
    assert rows and all(r["status"] == "SKIP" for r in rows)  # every roadmap row is beyond the simulator


def test_plot_of_a_committed_results_file_writes_to_the_results_dir(tmp_path, monkeypatch):
    from numba_attn.cli import _plots_default

    monkeypatch.setenv("NUMBA_ATTN_RESULTS", str(tmp_path / "res"))
    assert _plots_default(os.path.join(REPO, "results", "roadmap-h100.jsonl")) == os.path.realpath(tmp_path / "res")
    (tmp_path / "res" / "sub").mkdir(parents=True)
    assert _plots_default(str(tmp_path / "res" / "sub" / "r.jsonl")) == os.path.realpath(tmp_path / "res" / "sub")
