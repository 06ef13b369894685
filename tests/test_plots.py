"""Plots from a synthetic results file (no kernels): every plot is drawn, in
PNG and SVG, with its title, units and the device/date caption."""
import json
import os

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
    # layouts: paged/varlen files only (below); counts: simulator files only (tests/test_simcounts.py)
    for name in [n for n in plots.PLOTS if n not in ("layouts", "counts")]:
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


def _decode_records(commit="abc1234+wip"):
    from numba_attn import Problem

    env = {"type": "env", "env_key": "k", "gpu": "Test GPU", "date": "2026-01-02", "commit": commit}
    recs = [env, {"type": "ceiling", "name": "copy", "value": 3000.0, "unit": "GB/s", "status": "OK",
                  "env_key": "k"}]
    for n in (4096, 16384):
        p = Problem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=n, head_dim=128, dtype="float16")
        for name, t in (("decode_a", 0.05), ("torch_sdpa", 0.06)):
            t = t * n / 4096
            recs.append({"type": "result", "kind": "peer" if name.startswith("torch") else "phase", "phase": name,
                         "phase_kind": "decode", "problem": p.to_dict(), "label": p.label, "status": "OK",
                         "time_ms": t, "flops": p.flops(), "min_bytes": p.min_bytes(), "env_key": "k",
                         "tflops": p.flops() / (t * 1e-3) / 1e12})
    return recs


def test_decode_roofline_and_traffic_say_what_they_draw(tmp_path):
    path = tmp_path / "decode.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _decode_records()) + "\n")
    files = plots.make_all(str(path), str(tmp_path), prefix="d_", which=("roofline", "traffic"))
    assert {f.rsplit("/", 1)[1] for f in files} == {"d_roofline.png", "d_roofline.svg", "d_traffic.png",
                                                     "d_traffic.svg"}
    roof = open(tmp_path / "d_roofline.svg").read()
    assert "Decode roofline" in roof and "read + write" in roof
    assert "modelled bytes (S, P" not in roof and "ffma" not in roof  # no legend entry for undrawn points
    assert "abc1234 (uncommitted tree)" in roof and "+wip" not in roof
    traffic = open(tmp_path / "d_traffic.svg").read()
    assert "baseline)" not in traffic and "every phase here moves the minimum" in traffic
    from PIL import Image

    w, h = Image.open(tmp_path / "d_traffic.png").size
    assert w < 2000 and h < 2000


def test_roadmap_leaves_out_panels_without_a_baseline(synthetic_file, tmp_path):
    recs = [json.loads(line) for line in synthetic_file.read_text().splitlines()]
    recs = [r for r in recs if not (r.get("phase") == "naive" and (r.get("problem") or {}).get("q_len") == 1024)]
    path = tmp_path / "nobase.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    files = plots.roadmap(str(path), str(tmp_path))
    svg = open(files[1]).read()
    assert "not drawn (no naive time on the shape" in svg and "N1024" in svg


def test_layouts_plot_from_the_committed_paged_and_varlen_results(tmp_path):
    """The serving-layout plot draws each paged / varlen problem beside its contiguous twin from a real
    results file, and draws nothing from a file without such problems."""
    import os

    from numba_attn.report.plots import layouts

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("paged-nvidia-h200.jsonl", "varlen-nvidia-h200.jsonl"):
        files = layouts(os.path.join(root, "results", name), str(tmp_path), stem=name[:6])
        assert sorted(os.path.basename(f) for f in files) == [name[:6] + ".png", name[:6] + ".svg"]
        assert all(os.path.getsize(f) > 10_000 for f in files)
    assert layouts(os.path.join(root, "results", "roadmap-nvidia-h200.jsonl"), str(tmp_path), stem="none") == []
    # a roofline of more problems than it has marker shapes (the paged file's last run: 16) repeats the shapes
    files = plots.roofline(os.path.join(root, "results", "paged-nvidia-h200.jsonl"), str(tmp_path), stem="roof")
    assert sorted(os.path.basename(f) for f in files) == ["roof.png", "roof.svg"]


def test_steps_pairs_a_phase_with_its_parent_in_the_same_run_only(tmp_path):
    """A step is parent time / phase time of two OK rows of one run on one problem; a phase whose parent ran
    in another run, or failed, makes no step; the planned step is the ratio of the planned speedups."""
    from numba_attn import Problem

    p = Problem(batch=1, heads=2, q_len=64, head_dim=16)

    def row(phase, parent, run, t, status="OK", planned=2.0, params=None):
        return {"type": "result", "kind": "phase", "phase": phase, "parent": parent, "order": len(phase),
                "run_id": run, "problem": p.to_dict(), "label": p.label, "status": status, "time_ms": t,
                "planned_speedup": planned, "requested_params": params or {}}

    recs = [{"type": "env", "env_key": "k", "gpu": "Test GPU", "date": "2026-01-01", "commit": "abc"},
            row("a", None, "r1", 2.0, planned=1.0), row("bb", "a", "r1", 1.6, planned=1.5),
            row("ccc", "bb", "r2", 1.0),  # its parent ran in another run: no step
            row("a", None, "r3", 2.2, planned=1.0), row("bb", "a", "r3", 2.0, status="FAIL"),  # failed: no step
            row("a", None, "r4", 2.4, planned=1.0), row("bb", "a", "r4", 2.0, params={"Bc": 128})]
    pairs = plots.step_pairs(recs)
    assert [(q["phase"], q["parent"], q["run_id"]) for q in pairs] == [("bb", "a", "r1"), ("bb", "a", "r4")]
    assert pairs[0]["measured"] == pytest.approx(1.25) and pairs[0]["planned"] == pytest.approx(1.5)
    assert pairs[1]["measured"] == pytest.approx(1.2) and pairs[1]["params"] == {"Bc": 128}
    # registered phases: the plans they register now, not a row's (bwd_atomic_dq's rows of c91d059 hold 1.3, its
    # step against bwd_two_kernels, from before every backward plan was taken against bwd_naive)
    from numba_attn.phases.registry import get_phase

    old = [row("bwd_two_kernels", None, "r5", 4.0, planned=4.0), row("bwd_atomic_dq", "bwd_two_kernels", "r5", 2.0,
                                                                      planned=1.3)]
    (step,) = plots.step_pairs(old)
    want = get_phase("bwd_atomic_dq").planned_speedup / get_phase("bwd_two_kernels").planned_speedup
    assert step["planned"] == pytest.approx(want) and want > 1
    files = plots.steps(recs, str(tmp_path), stem="s")
    assert [f.rsplit(".", 1)[1] for f in files] == ["png", "svg"]
    svg = open(files[1]).read()
    assert "Each step against its parent" in svg and "parent time / phase time" in svg and "Test GPU" in svg
    assert plots.steps(recs[:2], str(tmp_path), stem="none") == []  # no pair: nothing drawn


def test_headline_draws_from_the_committed_results(tmp_path):
    """The README's headline: per family the best phase beside the best SDPA of the same run (one run_id: one
    env record, one commit), from the committed H200 files; `numba-attn plot --headline` draws it."""
    from numba_attn.measure.results import load_results
    from numba_attn.report import records as rec

    pairs = plots.headline_pairs()
    assert [p["family"].split(",")[0] for p in pairs] == ["CUDA-core prefill", "Tensor-core prefill", "Decode",
                                                          "Paged decode"]
    for p in pairs:
        rows = [r for r in load_results(rec.repo_path("results", p["file"])) if r.get("run_id") == p["run_id"]]
        env = [r for r in rows if r.get("type") == "env"]
        assert len(env) == 1 and str(env[0]["commit"]).startswith(p["commit"]) and p["gpu"] == "NVIDIA H200"
        phase = [r for r in rows if r.get("phase") == p["phase"] and r.get("label") == p["label"]]
        peer = [r for r in rows if r.get("phase") == p["peer"] and r.get("label") == p["peer_label"]]
        # the last row of each (a problem measured twice in one run: the later rows, as latest_rows keeps them)
        assert phase and peer and p["ratio"] == pytest.approx(peer[-1]["time_ms"] / phase[-1]["time_ms"])
        assert 0.3 < p["ratio"] < 3
    assert main(["plot", "--headline", "--out", str(tmp_path)]) == 0
    svg = (tmp_path / "headline.svg").read_text()
    for words in ("NVIDIA H200", "PyTorch SDPA", "register_blocked", "ws_tma_q",
                  "results/paged-nvidia-h200.jsonl", "B1 H32 N4096 D128 fp16"):
        assert words in svg, words
    assert (tmp_path / "headline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_roadmap_draws_the_latest_run_that_timed_its_baseline(tmp_path):
    """A later run of a few phases without the baseline leaves the roadmap nothing to measure against: the roadmap
    takes the latest run that timed it (one run's rows, never a mix), and says so; latest_rows(need=) picks it."""
    from numba_attn.report.plots import roadmap, synthetic_records
    from numba_attn.report.table import latest_rows

    first = synthetic_records()
    later = [dict(r, env_key="later", commit="later") for r in first
             if r.get("type") == "env" or (r.get("type") == "result" and r.get("phase") not in ("naive",))]
    records = first + later
    env, rows, _ = latest_rows(records)
    assert env["env_key"] == "later" and not any(r["phase"] == "naive" for r in rows)
    env, rows, _ = latest_rows(records, need="naive")
    assert env["env_key"] == "synthetic" and any(r["phase"] == "naive" for r in rows)
    assert {r.get("env_key") for r in rows} == {"synthetic"}
    files = roadmap(records, str(tmp_path), stem="r")
    assert files and all(os.path.exists(f) for f in files)
