"""Phases of your own, outside the package (numba_attn/userphases.py): ``numba-attn new`` writes a phase file
and its test, which pass as written; the registry finds such files through ``--setup PATH``,
``$NUMBA_ATTN_PHASES``, the ``numba_attn.phases`` entry points and ``numba_attn.load_phases`` (worker
processes included); ``diff`` and ``card`` work on them; bad arguments are refused in one line naming the
argument. Everything runs in the simulator on tiny problems; the checkout is never written to."""
import os
import subprocess
import sys
import textwrap

import pytest

import numba_attn as na
from numba_attn import userphases
from numba_attn.phases import discovery
from numba_attn.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the subprocesses run in other folders: this checkout first on their path, absolute (a relative PYTHONPATH entry
# such as "." would name their folder), whether or not the package is installed
_PATH = os.pathsep.join([ROOT] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
ENV = {**os.environ, "NUMBA_ATTN_BACKEND": "simulator", "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS": "0", "PYTHONPATH": _PATH}
ENV.pop(userphases.ENV_VAR, None)


@pytest.fixture
def clean():
    """The registry and the loader's records as they were (phases loaded by a test do not leak)."""
    files, explicit = dict(discovery.FILES), list(userphases._EXPLICIT)
    with na.temporary_phases():
        yield
    discovery.FILES.clear()
    discovery.FILES.update(files)
    userphases._EXPLICIT[:] = explicit


def _py(code, cwd, env=None, timeout=300):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def test_new_writes_a_phase_file_that_registers_under_the_new_name(tmp_path, clean):
    made = na.new_phase("smem_kv_mine", from_="smem_kv", dir=str(tmp_path))
    assert made.phase_file == str(tmp_path / "smem_kv_mine.py") and made.test_file == str(tmp_path / "test_smem_kv_mine.py")
    src = (tmp_path / "smem_kv_mine.py").read_text()
    for part in ("Change against ``smem_kv``", "Prediction", "Verdict", 'name="smem_kv_mine", order=2.5',
                 'parent="smem_kv"', "title=\"TODO", "TODO: the idea of smem_kv_mine", "def smem_kv_mine(problem",
                 "cuda.syncthreads()"):  # the parent's kernel is there, ready to change
        assert part in src, part
    assert "from ." not in src and made.factory == ""
    (ph,) = na.load_phases(made.phase_file)
    assert (ph.name, ph.parent, ph.order, ph.module) == ("smem_kv_mine", "smem_kv", 2.5, "numba_attn_user.smem_kv_mine")
    assert ph.sim_params == na.get_phase("smem_kv").sim_params and not ph.is_builtin
    assert [p.name for p in na.list_phases()].index("smem_kv_mine") == [p.name for p in na.list_phases()].index("smem_kv") + 1
    text = made.summary()
    for part in ("wrote ", "pytest ", "numba-attn run --setup", "--phases smem_kv,smem_kv_mine", "numba-attn diff smem_kv_mine"):
        assert part in text, part
    # a second one from the same parent goes between the parent and the first
    assert na.new_phase("smem_kv_mine2", from_="smem_kv", dir=str(tmp_path / "more")).order == 2.25


def test_the_generated_test_passes(tmp_path):
    """Every test of the generated file but the parent's rows (tests/test_phases.py has those)."""
    na.new_phase("smem_kv_tested", from_="smem_kv", dir=str(tmp_path))
    shapes = userphases._test_shapes(na.get_phase("smem_kv"))
    assert len(shapes) >= 2
    parent_rows = [f"--deselect=test_smem_kv_tested.py::test_matches_the_reference[smem_kv-{s}]" for s in shapes]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_smem_kv_tested.py",
                        *parent_rows], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"{len(shapes) + 2} passed, {len(shapes)} deselected" in r.stdout, r.stdout[-2000:]


def test_diff_and_card_of_a_user_phase(tmp_path, clean):
    made = na.new_phase("smem_kv_diffed", from_="smem_kv", dir=str(tmp_path))
    path = tmp_path / "smem_kv_diffed.py"
    path.write_text(path.read_text().replace("            cuda.syncthreads()\n        if row_ok:",
                                             "            if j0 + Bc < block_keys:\n"
                                             "                cuda.syncthreads()\n        if row_ok:"))
    na.load_phases(str(path))
    d = na.phase_diff("smem_kv_diffed")
    assert "# parent: numba_attn/phases/cuda_core/p02_smem_kv.py" in d and f"# phase:  {path}" in d
    assert "+            if j0 + Bc < block_keys:" in d and "+def smem_kv_diffed(problem" in d
    from numba_attn.report import cards

    c = cards.card("smem_kv_diffed", files=[])
    assert "out of tree" in c and f"| file | `{path}` |" in c and f"`{made.test_file}`" in c
    assert "smem_kv_diffed.md" not in cards.render_all(files=[])  # the package's cards only


def test_load_phases_reruns_a_changed_file_and_leaves_nothing_of_a_failing_one(tmp_path, clean):
    made = na.new_phase("smem_kv_edit", from_="smem_kv", dir=str(tmp_path / "d"))
    (a,) = na.load_phases(made.phase_file)
    assert na.load_phases(made.phase_file) == [a] and na.get_phase("smem_kv_edit") is a  # unchanged: not re-run
    path = tmp_path / "d" / "smem_kv_edit.py"
    path.write_text(path.read_text().replace("TODO: the title of smem_kv_edit (what changes against smem_kv)", "edited"))
    (b,) = na.load_phases(str(path))
    assert b is not a and na.get_phase("smem_kv_edit").title == "edited"
    assert str(path) in userphases.worker_specs()  # worker processes started now load it too
    assert na.load_phases(str(tmp_path / "d")) == [b]  # a directory: its test_*.py is not a phase file
    bad = tmp_path / "bad_phase.py"
    bad.write_text(path.read_text().replace('name="smem_kv_edit"', 'name="half_done"') + "\nraise RuntimeError('oops')\n")
    with pytest.raises(RuntimeError, match="oops"):
        na.load_phases(str(bad))
    assert "half_done" not in [p.name for p in na.list_phases()] and str(bad) not in userphases.worker_specs()
    with pytest.raises(FileNotFoundError, match="no such phase file"):
        na.load_phases(str(tmp_path / "missing.py"))


def test_a_phase_loaded_inside_temporary_phases_is_gone_after_it(tmp_path, clean):
    made = na.new_phase("smem_kv_temp", from_="smem_kv", dir=str(tmp_path))
    with na.temporary_phases():
        assert [p.name for p in na.load_phases(made.phase_file)] == ["smem_kv_temp"]
    assert "smem_kv_temp" not in [p.name for p in na.list_phases()]
    assert made.phase_file not in userphases.worker_specs()


def test_new_from_a_factory_parent_says_where_the_kernel_is(tmp_path, clean):
    made = na.new_phase("tc_wgmma_mine", from_="tc_wgmma", dir=str(tmp_path))
    assert made.factory.startswith("numba_attn/phases/tensor_core/") and made.factory.endswith(".py")
    assert made.factory_names[0] == "build_wgmma"
    assert "keeps its kernel in" in made.summary() and made.order == 23.5
    (ph,) = na.load_phases(made.phase_file)
    assert ph.parent == "tc_wgmma" and ph.dtypes == ("float16", "bfloat16")
    test = (tmp_path / "test_tc_wgmma_mine.py").read_text()
    assert "fp32" not in test.split("SHAPES = {")[1].split("}")[0]  # only shapes the parent runs


def test_relative_imports_become_absolute():
    from types import SimpleNamespace

    src = textwrap.dedent('''\
        """Doc."""
        from .common import helper
        from .. import registry
        from ..registry import register_phase


        @register_phase(name="x", order=3, title="t", parent="w", description="d", lineage="", planned_speedup=None)
        def x(problem, Br=16):
            return helper(problem)
        ''')
    out, factory = userphases._rewrite(src, SimpleNamespace(name="x"), "y", 3.5, "f.py",
                                       "numba_attn.phases.cuda_core.p03_x")
    assert "from numba_attn.phases.cuda_core.common import helper" in out
    assert "from numba_attn.phases import registry" in out and "from numba_attn.phases.registry import register_phase" in out
    assert 'name="y", order=3.5' in out and 'parent="x"' in out and "def y(problem" in out
    assert factory == (["helper"], "numba_attn.phases.cuda_core.common")  # no kernel: the builder calls helper


@pytest.mark.parametrize("argv, words", [
    (["new", "smem_kv", "--from", "naive"], ["NAME 'smem_kv' is already a phase"]),
    (["new", "2fast", "--from", "naive"], ["NAME '2fast' is not a Python identifier"]),
    (["new", "mine", "--from", "smem_k"], ["--from 'smem_k' is not a phase", "Did you mean 'smem_kv'"]),
    (["new", "json", "--from", "naive"], ["NAME 'json' is the name of an importable module"]),
])
def test_new_refuses_in_one_line_naming_the_argument(argv, words, tmp_path, capsys):
    assert main(argv + ["--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert not os.listdir(tmp_path)


def test_new_refuses_a_parent_it_cannot_copy(tmp_path, clean):
    from numba_attn.phases.registry import register_variant

    register_variant("smem_kv", "smem_kv_b8", Bc=8)  # registered by this test module: no builder of its own
    with pytest.raises(userphases.NewPhaseError, match="--from smem_kv_b8: .*register_variant"):
        na.new_phase("from_variant", from_="smem_kv_b8", dir=str(tmp_path))
    assert not os.listdir(tmp_path)


def test_new_never_overwrites(tmp_path, capsys):
    (tmp_path / "test_mine.py").write_text("# mine\n")
    assert main(["new", "mine", "--from", "naive", "--dir", str(tmp_path)]) == 2
    assert "--dir" in capsys.readouterr().err and not (tmp_path / "mine.py").exists()
    assert (tmp_path / "test_mine.py").read_text() == "# mine\n"


def test_cli_new_prints_the_files_and_the_next_commands(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["new", "naive_mine", "--from", "naive"]) == 0
    out = capsys.readouterr().out
    assert "wrote ./naive_mine.py" in out and "wrote ./test_naive_mine.py" in out
    assert "pytest ./test_naive_mine.py" in out and "numba-attn diff naive_mine --setup ./naive_mine.py" in out
    assert (tmp_path / "naive_mine.py").exists() and (tmp_path / "test_naive_mine.py").exists()


def test_env_var_and_entry_points_reach_list_diff_and_card(tmp_path):
    """$NUMBA_ATTN_PHASES (a directory: its phase files, not its tests; a failing file reported BROKEN, the
    others loaded) and an entry point of the numba_attn.phases group, in a fresh process."""
    phases = tmp_path / "phases"
    na.new_phase("smem_kv_env", from_="smem_kv", dir=str(phases))
    (phases / "broken_one.py").write_text("raise ImportError('not today')\n")
    site = tmp_path / "site"
    na.new_phase("naive_ep", from_="naive", dir=str(site))
    dist = site / "naive_ep_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: naive-ep-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[numba_attn.phases]\nmine = naive_ep\nbad = no_such_module_here\n")
    env = {**ENV, userphases.ENV_VAR: str(phases), "PYTHONPATH": os.pathsep.join([str(site), _PATH])}
    r = _py("""
        from numba_attn.cli import main
        from numba_attn.phases import BROKEN
        import numba_attn as na
        assert main(["list"]) == 0
        assert main(["diff", "smem_kv_env", "--stat"]) == 0
        assert main(["card", "naive_ep"]) == 0
        print("MODULES", na.get_phase("smem_kv_env").module, na.get_phase("naive_ep").module)
        """, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "smem_kv_env" in out and f"out of tree: {phases / 'smem_kv_env.py'}" in out
    assert f"BROKEN phase module {phases / 'broken_one.py'}: ImportError: not today" in out
    assert "BROKEN phase module no_such_module_here (entry point bad)" in out
    assert f"numba_attn/phases/cuda_core/p02_smem_kv.py → {phases / 'smem_kv_env.py'}" in out
    assert "# 0.5 · `naive_ep`" in out and "out of tree (`naive_ep`)" in out
    assert "MODULES numba_attn_user.smem_kv_env naive_ep" in out


def test_setup_path_runs_the_phase_in_a_worker_process(tmp_path):
    """``numba-attn run --setup rel/path.py``: the row runs in a worker process (the simulator's default time
    limit), which loads the file too; list/diff/card take --setup as well."""
    na.new_phase("smem_kv_cli", from_="smem_kv", dir=str(tmp_path / "mine"))
    res = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "numba_attn.cli"]
    r = subprocess.run(cmd + ["run", "--simulator", "--setup", "mine/smem_kv_cli.py", "--phases", "smem_kv_cli",
                              "-N", "9", "--kv-len", "17", "-D", "8", "--causal", "--param", "smem_kv_cli.Br=8",
                              "--param", "smem_kv_cli.Bc=8", "--seeds", "1", "--no-peers", "--results", str(res)],
                       cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    from numba_attn.measure.results import load_results

    (row,) = [x for x in load_results(str(res)) if x.get("type") == "result"]
    assert row["phase"] == "smem_kv_cli" and row["status"] == "OK", row.get("reason")
    r = _py("""
        from numba_attn.cli import main
        assert main(["diff", "smem_kv_cli", "--setup", "mine/smem_kv_cli.py"]) == 0
        assert main(["card", "smem_kv_cli", "--setup", "mine"]) == 0
        assert main(["list", "--setup", "mine/"]) == 0
        """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "+++ mine/smem_kv_cli.py" in r.stdout or "b/mine/smem_kv_cli.py" in r.stdout
    assert "| tests | `mine/test_smem_kv_cli.py` |" in r.stdout and "out of tree: mine" in r.stdout
