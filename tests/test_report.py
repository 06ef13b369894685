"""Generated docs: ``numba-attn diff``, the phase cards (docs/phases/) and the
README's result tables. No kernel is compiled or run here."""
import json
import os
import re
import shutil
import sys

import pytest

from numba_attn import cli
from numba_attn.phases.registry import get_phase, list_phases
from numba_attn.report import cards, diff, readme
from numba_attn.report import records as rec


# ---------------------------------------------------------------- diff

def test_diff_names_both_files_and_is_a_unified_diff():
    text = diff.phase_diff("causal_skip")
    assert "numba_attn/phases/cuda_core/p09_register_blocked.py" in text.splitlines()[1]
    assert "numba_attn/phases/cuda_core/p10_causal_skip.py" in text.splitlines()[2]
    assert "--- a/numba_attn/phases/cuda_core/p09_register_blocked.py" in text
    assert "+++ b/numba_attn/phases/cuda_core/p10_causal_skip.py" in text
    assert "\n@@ " in text


def test_diff_across_families():
    text = diff.phase_diff("tc_mma")  # parent smem_kv is a CUDA-core phase
    assert "cuda_core/p02_smem_kv.py" in text and "tensor_core/p20_tc_mma.py" in text


def test_diff_without_parent_says_so():
    assert "has no parent" in diff.phase_diff("naive")
    assert "has no parent" in diff.phase_diff_stat("naive")


def test_diff_stat_counts_the_diff():
    text = diff.phase_diff("q_smem")
    added = sum(1 for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---"))
    assert f"{added} insertion" in diff.phase_diff_stat("q_smem")
    assert f"{removed} deletion" in diff.phase_diff_stat("q_smem")


def test_cli_diff_and_unknown_phase(capsys):
    assert cli.main(["diff", "smem_kv", "--stat"]) == 0
    assert "fused_rowwise → smem_kv" in capsys.readouterr().out
    assert cli.main(["diff", "no_such_phase"]) == 2


# ---------------------------------------------------------------- cards

def test_card_fields():
    text = cards.card("register_blocked")
    assert "`double_buffer`" in text and "p08_double_buffer.py" in text
    assert "numba_attn/phases/cuda_core/p09_register_blocked.py" in text
    assert "`tests/test_phases.py`, `tests/test_roadmap.py`" in text
    assert "| `TN` | automatic (0) |" in text
    assert "## Idea" in text and "## Measured" in text and "## Plots" in text
    # its row in the roadmap results file, and the plots drawn from that file
    assert "| `results/roadmap-nvidia-h200.jsonl` | OK | B1 H32 N4096 D64 fp32 | 4.29 ms |" in text
    assert "plots/roadmap_roadmap.png" in text


@pytest.mark.parametrize("name, tests", [
    ("tc_wgmma", ["tests/test_phases.py", "tests/test_tensor_core.py", "tests/test_wgmma.py"]),
    ("decode_mma", ["tests/test_phases.py", "tests/test_decode.py", "tests/test_pdl.py"]),
    ("smem_kv", ["tests/test_phases.py", "tests/test_roadmap.py"]),
])
def test_card_test_files_by_family(name, tests):
    assert cards.test_files(get_phase(name)) == tests
    for t in tests:
        assert os.path.exists(rec.repo_path(t))


def test_card_without_rows_says_so(tmp_path):
    text = cards.card("smem_kv", files=[])
    assert "No row in the committed results files" in text


def test_card_handles_missing_fields(tmp_path):
    f = tmp_path / "x-nvidia-h200.jsonl"
    f.write_text('{"type": "env", "run_id": "r", "gpu": "NVIDIA H200"}\n'
                 '{"type": "result", "phase": "smem_kv", "run_id": "r", "status": "OK", "time_ms": 1.5}\n'
                 '{"type": "result", "phase": "smem_kv", "status": "SKIP", "reason": "too big"}\n')
    text = cards.card("smem_kv", files=[str(f)])
    assert "| OK | ? | 1.50 ms | — | — | — | not recorded | NVIDIA H200 |" in text
    assert "SKIP ×1" in text and "too big" in text


def test_committed_cards_match_a_regeneration():
    """docs/phases/ is generated: regenerate with `numba-attn card --all --out docs/phases/`."""
    bad = cards.check_all(rec.repo_path("docs", "phases"))
    assert not bad, f"stale phase cards {bad}: run `numba-attn card --all --out docs/phases/`"


def test_index_lists_every_phase():
    text = cards.index()
    for p in list_phases():
        assert f"[`{p.name}`]({p.name}.md)" in text


def test_readme_roadmap_names_every_registered_phase():
    """A newcomer finds every phase from the README: its roadmap table names each registered phase."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("## The roadmap")
    section = text[start:text.index("\n## ", start + 1)]
    named = set(re.findall(r"`([a-z0-9_]+)`", section))
    assert [p.name for p in list_phases() if p.name not in named] == []


# ---------------------------------------------------------------- README tables

def test_readme_tables_match_their_results_files():
    """The tables of README.md and docs/results.md are generated: regenerate with `numba-attn readme`."""
    for doc in readme.DOCS:
        assert readme.stale(rec.repo_path(doc)) == [], f"{doc}: tables differ from the results files: run `numba-attn readme`"


def test_roadmap_table_figures_come_from_the_results_file():
    t = readme.roadmap_table()
    for figure in ("| `naive` |", "191.6 ms", "| `register_blocked` |", "4.29 ms", "| `tc_wgmma` (fp16) |",
                   "0.392 ms", "1.36 ms", "4.04 ms / 0.295 ms"):
        assert figure in t


def test_readme_check_fails_on_a_disagreeing_table(tmp_path):
    path = tmp_path / "results.md"
    shutil.copy(rec.repo_path("docs", "results.md"), path)
    text = path.read_text()
    assert "| 4.29 ms |" in text
    path.write_text(text.replace("| 4.29 ms |", "| 4.20 ms |", 1))
    assert readme.stale(str(path)) == ["roadmap"]
    assert cli.main(["readme", "--check", "--readme", str(path)]) == 1
    assert cli.main(["readme", "--readme", str(path)]) == 0  # rewrites in place
    assert readme.stale(str(path)) == []
    assert path.read_text() == open(rec.repo_path("docs", "results.md")).read()


def test_unknown_table_marker(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("<!-- table:nope start -->\n<!-- table:nope end -->\n")
    with pytest.raises(KeyError):
        readme.render(path.read_text())


def test_formatting():
    assert [rec.fmt_ms(x) for x in (191.5234, 30.98, 4.2378, 0.3912)] == ["191.5 ms", "31.0 ms", "4.24 ms", "0.391 ms"]
    assert rec.plot_stem(rec.repo_path("results", "tensor-core-nvidia-h200.jsonl")) == "tensor_core"


# --- docstring verdicts cannot drift from the committed results ----------------------------------

_VERDICT_MS = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ms\b")
# "[results/F.jsonl]", or "[results/F.jsonl, rows of NAME]" for the rows of an out-of-tree variant of the phase
# (an experiment's setup module registers it under its own name, e.g. a parameter set on)
_VERDICT_FILE = re.compile(r"\[(results/[\w./-]+\.jsonl)(?:, rows of ([\w, ]+))?\]")


def _verdict_lines(phase):
    """Each verdict paragraph as one line: a line starting "Verdict" and the lines that continue it (lines of a
    docstring stay within 120 characters, so a verdict and its citation may wrap)."""
    doc = sys.modules[phase.module].__doc__ or ""
    out = []
    for line in doc.splitlines():
        line = line.strip()
        if re.match(r"Verdict(:| \()", line):
            out.append(line)
        elif out and out[-1] is not None and line:
            out[-1] += " " + line
        elif not line and out:
            out.append(None)
    return [v for v in out if v]


def _matches(figure: str, time_ms: float) -> bool:
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    return abs(time_ms - float(figure)) <= 0.5 * 10 ** -decimals + 1e-12


@pytest.mark.parametrize("phase", list_phases(), ids=lambda p: p.name)
def test_verdict_figures_are_rows_of_the_cited_results_file(phase):
    """Every phase states a one-line verdict; every "N ms" in it is the time of an OK row of
    that phase in the committed results file the line cites (rounded as printed)."""
    lines = _verdict_lines(phase)
    assert lines, f"{phase.name}: its docstring has no 'Verdict:' line"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for line in lines:
        figures = _VERDICT_MS.findall(line)
        if not figures:
            continue
        cited = _VERDICT_FILE.findall(line)
        assert cited, f"{phase.name}: a verdict with a figure must cite its results file: {line}"
        times = []
        for path, variants in cited:
            names = {phase.name} | {v.strip() for v in variants.split(",") if v.strip()}
            with open(os.path.join(root, path)) as f:
                rows = [json.loads(x) for x in f if x.strip()]
            times += [r["time_ms"] for r in rows if r.get("phase") in names and r.get("status") == "OK"
                      and isinstance(r.get("time_ms"), (int, float))]
        for fig in figures:
            assert any(_matches(fig, t) for t in times), \
                f"{phase.name}: {fig} ms is no OK row of {phase.name} in {', '.join(p for p, _ in cited)}: {line}"


def test_rows_without_run_id_take_the_env_written_before_them():
    # scripts that append their own rows write an env record and then rows without a run id
    records = [{"type": "env", "commit": "aaa"}, {"type": "result", "phase": "p", "time_ms": 1.0},
               {"type": "env", "run_id": "r1", "commit": "bbb"}, {"type": "env", "commit": "ccc"},
               {"type": "result", "phase": "p", "time_ms": 2.0, "run_id": "r1"},
               {"type": "result", "phase": "p", "time_ms": 3.0}]
    commits = [rec.commit_of(row, env) for env, row in rec.with_env(records)]
    assert commits == ["aaa", "bbb", "ccc"]


def test_card_keeps_its_hand_written_history(tmp_path):
    """A card's ``## History`` section is written by hand: a regeneration keeps it, check_all accepts it."""
    path = tmp_path / "smem_kv.md"  # (one card: render_all makes every card this way, card() by card())
    history = "\n## History\n\nAn earlier attempt, kept verbatim.\n"
    path.write_text(cards.card("smem_kv", out_dir=str(tmp_path)) + history)
    again = cards.card("smem_kv", out_dir=str(tmp_path))
    assert again == path.read_text()  # what check_all compares: a regeneration is the file, history and all
    assert again.endswith("## History\n\nAn earlier attempt, kept verbatim.\n")
