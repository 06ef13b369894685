"""Plots from a synthetic results file (no kernels): every plot is drawn, in
PNG and SVG, with its title, units and the device/date caption."""
import json

import pytest

from numba_attn.report import plots
from numba_attn.cli import main


@pytest.fixture()
def synthetic_file(tmp_path):
    path = tmp_path / "synthetic.jsonl"
    recs = plots.synthetic_records(device="Test GPU 9000")
    # a fp16 tensor-core row on the fp32 shape, a failed phase and a skipped peer: all must be drawn sensibly
    base = next(r for r in recs if r.get("phase") == "naive" and r["problem"]["q_len"] == 4096)
    tc = dict(base, phase="tc_fp16", order=5, planned_speedup=50.0, time_ms=base["time_ms"] / 40,
              problem={**base["problem"], "dtype": "float16"}, label=base["label"].replace("fp32", "fp16"),
              precision="float16")
    bad = dict(base, phase="broken", order=6, status="FAIL", time_ms=None, reason="wrong result")
    skip = {"type": "result", "kind": "peer", "phase": "torch_sdpa_math", "problem": base["problem"],
            "label": base["label"], "status": "SKIP", "reason": "math backend needs 9 GiB", "env_key": "synthetic"}
    recs += [tc, bad, skip]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


def test_plot_command_draws_all_plots(synthetic_file, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", str(synthetic_file), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    for name in plots.PLOTS:
        png, svg = out / f"{name}.png", out / f"{name}.svg"
        assert str(png) in printed and str(svg) in printed
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
        text = svg.read_text()
        assert "Test GPU 9000" in text and "1970-01-01" in text and "SYNTHETIC" in text  # caption + watermark


def test_plot_titles_and_units(synthetic_file, tmp_path):
    files = plots.make_all(str(synthetic_file), str(tmp_path), prefix="x_", which=("roadmap", "roofline"))
    svg = {f.split("/")[-1]: open(f).read() for f in files if f.endswith(".svg")}
    road = svg["x_roadmap.svg"]
    for words in ("Roadmap: measured vs planned speedup per phase", "speedup over naive", "tc_fp16 (fp16)",
                  "FAIL", "SDPA", "planned"):
        assert words in road, words
    roof = svg["x_roofline.svg"]
    for words in ("Roofline", "arithmetic intensity", "achieved TFLOP/s", "ffma 50 TFLOP/s", "copy 3.00 TB/s"):
        assert words in roof, words


def test_plots_of_a_file_without_timings(tmp_path):
    from numba_attn import Problem

    p = Problem(batch=1, heads=1, q_len=8, head_dim=8)
    recs = [{"type": "env", "env_key": "k", "gpu": "simulator", "date": "2026-01-01"},
            {"type": "result", "kind": "phase", "phase": "naive", "problem": p.to_dict(), "label": p.label,
             "status": "OK", "flops": p.flops(), "min_bytes": p.min_bytes(), "env_key": "k"}]
    path = tmp_path / "sim.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert plots.make_all(str(path), str(tmp_path / "out")) == []  # nothing timed: nothing drawn, no crash


def test_scaling_needs_problems_that_differ_only_in_length(synthetic_file, tmp_path):
    files = plots.scaling(str(synthetic_file), str(tmp_path))
    assert len(files) == 2
    text = open(files[1]).read()
    assert "context length N" in text and "N² guide" in text and "median kernel time (ms, log)" in text
