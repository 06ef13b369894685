"""The command line as a new user meets it: the default problem set, help, version, column
explanations, CSV, clear messages without a GPU or NVVM, the per-user results directory (no kernels
run here: every test is fast)."""
import csv
import json

import pytest

from numba_attn import cli
from numba_attn.cli_args import build_parser
from numba_attn.report.progress import Progress
from numba_attn.report import table


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    from numba_attn import __version__

    assert capsys.readouterr().out.strip() == f"numba-attn {__version__}"


def test_help_has_no_markup_and_every_run_flag_is_explained(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":mod:" not in out and "lazily" not in out
    for cmd in ("list", "run", "bench", "compare", "plot", "diff", "card", "readme"):
        assert f"numba-attn {cmd}" in out
    helped = build_parser()._subparsers._group_actions[0].choices["run"]._actions
    assert all(a.help for a in helped if a.dest in ("list_presets", "explain_columns", "csv"))


def test_explain_columns_covers_every_column_and_mark(capsys):
    assert cli.main(["run", "--explain-columns"]) == 0
    out = capsys.readouterr().out
    for name in table.HEADER:
        assert f"  {name} " in out, name
    for mark in ("1%F", "†", "(r)", "sim", "*"):
        assert mark in out, mark


def test_readme_column_table_is_generated_from_the_same_source():
    from numba_attn.report import readme

    text = readme.columns_table()
    for name, meaning in table.COLUMNS:
        assert f"| {name} | {meaning} |" in text
    assert "columns" in readme.TABLES


def test_list_presets_includes_the_default(capsys):
    assert cli.main(["run", "--list-presets"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("default ") and "tiny " in out
    assert max(len(line) for line in out.splitlines()) < 400  # long presets are abbreviated


def test_default_problems_let_every_phase_run():
    """Each registered phase is selected on a default problem of its kind and dtype, and supports it:
    the default run shows every phase OK or FAIL, never SKIP for the wrong dtype or kind."""
    from numba_attn.measure.bench import DEFAULT_PROBLEMS, select_by_kind
    from numba_attn.phases.registry import list_phases

    select = select_by_kind(DEFAULT_PROBLEMS)
    kinds = {("decode" if p.q_len <= 16 else "prefill", p.dtype) for p in DEFAULT_PROBLEMS}
    assert {("prefill", "float32"), ("prefill", "float16"), ("decode", "float16")} <= kinds
    assert any(p.kv_heads < p.heads for p in DEFAULT_PROBLEMS if p.q_len == 1)  # GQA decode
    for ph in list_phases():
        chosen = [p for p in DEFAULT_PROBLEMS if select(ph, p)]
        assert len(chosen) == 1, (ph.name, chosen)
        assert ph.supports(chosen[0]) is None, (ph.name, ph.supports(chosen[0]))


def test_results_go_to_a_per_user_directory(monkeypatch, tmp_path):
    from numba_attn.measure.config import default_results_dir

    monkeypatch.setenv("NUMBA_ATTN_RESULTS", str(tmp_path / "r"))
    assert default_results_dir() == str(tmp_path / "r")
    monkeypatch.delenv("NUMBA_ATTN_RESULTS")
    d = default_results_dir()
    assert "numba-attn" in d and not d.startswith(str(cli.__file__).rsplit("/numba_attn/", 1)[0] + "/results")


def test_gpu_without_a_gpu_is_one_line(monkeypatch, capsys):
    from numba_attn.gpu import backend

    monkeypatch.setenv("NUMBA_ATTN_BACKEND", backend.BACKEND)  # _select_backend sets it; restored after
    monkeypatch.setattr(backend, "gpu_present", lambda: False)
    assert cli.main(["run", "--gpu", "--phases", "naive"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "numba-attn: --gpu: no CUDA GPU is available"


def test_missing_nvvm_and_cuda_errors_are_one_line(monkeypatch, capsys):
    class NvvmSupportError(Exception):
        pass

    class CudaSupportError(Exception):
        pass

    def raise_(exc):
        def f(args):
            raise exc
        return f

    monkeypatch.setattr(cli, "cmd_list", raise_(NvvmSupportError("libNVVM cannot be found")))
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert "NVVM" in err and "numba-cuda[cu12]" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(cli, "cmd_list", raise_(CudaSupportError("Error at driver init: no driver\nmore")))
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert "no usable CUDA GPU" in err and len(err.strip().splitlines()) == 1


def _rows():
    base = {"type": "result", "kind": "phase", "backend": "simulator", "label": "B1 H2 N8 D16 fp32"}
    return [dict(base, phase="naive", status="OK", check={"rel_err": 1e-7}, planned_speedup=1.0),
            dict(base, phase="smem_kv", status="SKIP", reason="head_dim 16 not supported", planned_speedup=6.0)]


def test_rich_table_leaves_out_empty_columns(capsys):
    from rich.console import Console

    con = Console(width=200, force_terminal=False)
    table.print_table(_rows(), con)
    out = capsys.readouterr().out
    hdr = out.splitlines()[0].split()
    assert hdr == ["phase", "problem", "status", "rel_err", "time", "plan"]
    assert "columns without a value left out" in out and "head_dim 16 not supported" in out
    assert "GB/s" in table.table(_rows())  # the plain table keeps every column


def test_csv(tmp_path):
    path = tmp_path / "sub" / "t.csv"
    cli._write_csv(str(path), _rows())
    rows = list(csv.reader(path.open()))
    assert rows[0][:3] == ["phase", "problem", "status"] and rows[0][-1] == "reason"
    assert rows[1][0] == "naive" and rows[1][4] == "sim" and rows[2][-1] == "head_dim 16 not supported"


def test_progress_prints_eta_and_counts():
    import io

    from numba_attn import Problem
    from numba_attn.report.table import make_console

    buf = io.StringIO()
    prog = Progress(console=make_console(buf))
    p = Problem(batch=1, heads=1, q_len=8, head_dim=16)
    for i, (name, row) in enumerate([("naive", {"status": "OK", "time_ms": 2.0}),
                                     ("smem_kv", {"status": "OK", "time_ms": 0.5}),
                                     ("q_smem", {"status": "SKIP", "reason": "no"})]):
        prog(i, 4, None, name, p)
        prog(i, 4, row, name, p)
    prog.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3 and all("ETA" in ln for ln in lines)
    assert "best smem_kv 0.5 ms" in lines[-1] and "(no)" in lines[-1]


def test_compare_wraps_only_in_lists(tmp_path, capsys, monkeypatch):
    from numba_attn import Problem

    def write(path, names):
        recs = [{"type": "env", "env_key": "k", "gpu": "G", "date": "2026-01-01"}]
        for n in names:
            p = Problem(batch=1, heads=1, q_len=8 + n, head_dim=16)
            recs.append({"type": "result", "kind": "phase", "phase": f"phase_{n}", "problem": p.to_dict(),
                         "label": p.label, "status": "OK", "time_ms": 1.0, "env_key": "k"})
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")

    # a long directory name: the lines naming a file are as long as its path, every other line is wrapped
    d = tmp_path / ("long-directory-name-" * 4)
    d.mkdir()
    a, b = d / "a.jsonl", d / "b.jsonl"
    write(a, range(200))
    write(b, range(1))
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "only in A (199 rows):" in out and "and 159 more" in out
    assert f"A = {a}:" in out.splitlines() and f"B = {b}:" in out.splitlines()  # the device on the next line
    assert max(len(line) for line in out.splitlines() if str(d) not in line) <= 110
    monkeypatch.chdir(d)  # short paths: every line within the width, each file and its device on one line
    assert cli.main(["compare", "a.jsonl", "b.jsonl"]) == 0
    out = capsys.readouterr().out
    assert "A = a.jsonl: G · 2026-01-01" in out and max(len(line) for line in out.splitlines()) <= 110


def test_plot_writes_next_to_its_input(tmp_path, capsys):
    from numba_attn.report import plots

    path = tmp_path / "data" / "synthetic.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(json.dumps(r) for r in plots.synthetic_records()) + "\n")
    assert cli.main(["plot", str(path), "--which", "roadmap"]) == 0
    assert (tmp_path / "data" / "roadmap.png").exists()
