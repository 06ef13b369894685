"""Readability of the phases: every lesson shows code, docstrings stay short, lines stay ≤ 120 characters.

The limits ratchet: a file listed in an allowlist below may keep at most the figure recorded there (lower it
when you shorten the file; remove the entry once the file is within the limit); a file not listed must be
within the limit. The lists only shrink.
"""
from __future__ import annotations

import ast
import glob
import os

import pytest

from numba_attn.phases.registry import get_phase, list_phases
from numba_attn.report import diff

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- diff --code shows the idea

# Phases whose ``numba-attn diff NAME --code`` adds no code line against the parent, with the reason. Empty:
# every phase with a parent adds code. A phase may leave this set, never join it.
EXPECTED_EMPTY: dict[str, str] = {}

PHASES_WITH_PARENT = [p for p in list_phases() if p.is_builtin and p.parent]


@pytest.mark.parametrize("phase", PHASES_WITH_PARENT, ids=lambda p: p.name)
def test_code_diff_adds_code(phase):
    """``numba-attn diff NAME --code`` of every phase with a parent adds at least one line of code."""
    added, _ = diff.code_diff_counts(phase.name)
    if phase.name in EXPECTED_EMPTY:
        assert added == 0, f"{phase.name}: its code diff adds {added} lines now: remove it from EXPECTED_EMPTY"
    else:
        assert added > 0, (f"{phase.name}: `numba-attn diff {phase.name} --code` adds no code line against "
                           f"{phase.parent}: its idea is not in its file nor in a function it calls")


def test_code_diff_drops_docstrings_comments_imports_and_registration():
    text = diff.phase_diff("smem_kv", code=True)
    body = text.split("\n--- ", 1)[1]
    for gone in ('"""', "Prediction:", "import ", 'name="smem_kv"', "lineage=", "# "):
        assert gone not in body, gone
    assert "+        K_j = cuda.shared.array((Bc, D), float32)" in body  # the author's lines, as written
    assert "@register_phase(...)" in body


def test_code_diff_follows_shared_functions():
    """A phase whose kernel lives in a shared module shows that function; functions both sides use
    unchanged are named in the header only."""
    text = diff.phase_diff("register_blocked", code=True)
    assert "+++ b/numba_attn/phases/cuda_core/common.py:make_register_blocked[skip=False]" in text
    assert "geometry" in diff.phase_diff("causal_skip", code=True).split("\n--- ", 1)[0]  # shared, unchanged


def test_code_diff_resolves_compile_time_options():
    """``causal_skip`` is ``register_blocked``'s factory with ``skip=True``: its diff is the branch that
    option selects (the masking moved under ``if needs_mask:``), not the call alone."""
    text = diff.phase_diff("causal_skip", code=True)
    assert ("+                                 skip=True, heavy_first=bool(heavy_first), "
            "stage=stages_of(problem.variant))") in text
    assert "--- a/numba_attn/phases/cuda_core/common.py:make_register_blocked[skip=False]" in text
    assert "+++ b/numba_attn/phases/cuda_core/common.py:make_register_blocked[skip=True]" in text
    assert "+                if needs_mask:" in text
    assert "if skip" not in text


def test_pruning_keeps_the_branch_taken():
    src = ("def f(a, flag=False, mode='x'):\n"
           "    if flag:\n        a += 1\n    else:\n        a -= 1\n"
           "    if mode == 'y':\n        a *= 2\n    elif a > 0:\n        a *= 3\n    else:\n        a = 0\n"
           "    ws = mode == 'x'\n    if not ws:\n        a = -a\n    return a\n")
    assert diff.strip_to_code(src, {"flag": True, "mode": "x"}) == (
        "def f(a, flag=False, mode='x'):\n    a += 1\n    if a > 0:\n        a *= 3\n    else:\n        a = 0\n"
        "    ws = mode == 'x'\n    return a\n")
    assert diff.strip_to_code(src, {"flag": False}) == (
        "def f(a, flag=False, mode='x'):\n    a -= 1\n    if mode == 'y':\n        a *= 2\n    elif a > 0:\n"
        "        a *= 3\n    else:\n        a = 0\n    ws = mode == 'x'\n    if not ws:\n        a = -a\n"
        "    return a\n")


def test_code_diff_stat_counts_the_code_diff():
    text = diff.phase_diff("q_smem", code=True)
    added = sum(1 for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---"))
    assert diff.code_diff_counts("q_smem") == (added, removed)
    assert f"{added} insertion" in diff.phase_diff_stat("q_smem", code=True)
    assert "has no parent" in diff.phase_diff("naive", code=True)


def test_cli_diff_code(capsys):
    from numba_attn import cli

    assert cli.main(["diff", "causal_skip", "--code"]) == 0
    out = capsys.readouterr().out
    assert "code only" in out and "skip=True" in out and '"""' not in out
    assert cli.main(["diff", "causal_skip", "--code", "--stat"]) == 0
    assert "register_blocked → causal_skip (code)" in capsys.readouterr().out


def test_strip_to_code_keeps_the_authors_lines():
    src = ('"""Module."""\nimport os  # why\n\n\n@register_phase(\n    name="x",\n    order=1,\n)\n'
           'def f(a,  b):   # keep the spacing\n    """Doc."""\n    # a comment\n    return a+b\n')
    assert diff.strip_to_code(src) == "@register_phase(...)\ndef f(a,  b):\n    return a+b\n"


# ---------------------------------------------------------------- short docstrings, short lines

MODULE_DOCSTRING_LINES = 20
LINE_CHARS = 120

# Phase files whose module docstring is longer than MODULE_DOCSTRING_LINES: file → its most lines
LONG_DOCSTRINGS = {
    "numba_attn/phases/tensor_core/p20_tc_mma.py": 45,
    "numba_attn/phases/tensor_core/p21_tc_pipelined.py": 44,
    "numba_attn/phases/tensor_core/p22_tc_tf32.py": 37,
    "numba_attn/phases/tensor_core/p23_tc_wgmma.py": 43,
    "numba_attn/phases/tensor_core/p24_tc_wgmma_overlap.py": 32,
    "numba_attn/phases/tensor_core/p25_tma_wgmma.py": 49,
    "numba_attn/phases/tensor_core/p26_warp_specialized_tc.py": 52,
    "numba_attn/phases/tensor_core/p27_pingpong.py": 47,
    "numba_attn/phases/tensor_core/p29_tc_wgmma_varlen.py": 28,
    "numba_attn/phases/tensor_core/p37_ws_overlap.py": 45,
    "numba_attn/phases/tensor_core/p38_fp8_wgmma.py": 62,
    "numba_attn/phases/tensor_core/p40_ws_persistent.py": 33,
}

# Files under numba_attn/phases/ with lines over LINE_CHARS characters: file → their most such lines
LONG_LINES = {
    "numba_attn/phases/decode/p33_decode_split_k_lean.py": 1,
    "numba_attn/phases/tensor_core/common.py": 2,
    "numba_attn/phases/tensor_core/consumer.py": 1,
    "numba_attn/phases/tensor_core/producer.py": 1,
    "numba_attn/phases/tensor_core/p20_tc_mma.py": 1,
    "numba_attn/phases/tensor_core/p21_tc_pipelined.py": 1,
    "numba_attn/phases/tensor_core/p22_tc_tf32.py": 1,
    "numba_attn/phases/tensor_core/p23_tc_wgmma.py": 1,
    "numba_attn/phases/tensor_core/p24_tc_wgmma_overlap.py": 1,
    "numba_attn/phases/tensor_core/p25_tma_wgmma.py": 1,
    "numba_attn/phases/tensor_core/p26_warp_specialized_tc.py": 5,
    "numba_attn/phases/tensor_core/p27_pingpong.py": 3,
    "numba_attn/phases/tensor_core/p28_tc_mma_varlen.py": 1,
    "numba_attn/phases/tensor_core/p29_tc_wgmma_varlen.py": 1,
    "numba_attn/phases/tensor_core/p37_ws_overlap.py": 5,
    "numba_attn/phases/tensor_core/p38_fp8_wgmma.py": 4,
    "numba_attn/phases/tensor_core/p40_ws_persistent.py": 2,
}


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def _phase_files() -> list[str]:
    return sorted({os.path.realpath(get_phase(p.name).source_file) for p in list_phases() if p.is_builtin})


def _package_files() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "numba_attn", "phases", "**", "*.py"), recursive=True))


def test_phase_docstrings_are_short():
    """A phase's module docstring: the idea, the prediction, one verdict line (the history goes to its card)."""
    over = []
    for path in _phase_files():
        with open(path, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read()), clean=False) or ""
        lines = len(doc.strip("\n").splitlines())
        allowed = max(MODULE_DOCSTRING_LINES, LONG_DOCSTRINGS.get(_rel(path), 0))
        if lines > allowed:
            over.append(f"{_rel(path)}: {lines} lines (at most {allowed})")
    assert not over, "module docstrings too long:\n" + "\n".join(over)


def test_phase_lines_are_at_most_120_characters():
    over = []
    for path in _package_files():
        with open(path, encoding="utf-8") as f:
            long = [i for i, line in enumerate(f.read().splitlines(), 1) if len(line) > LINE_CHARS]
        allowed = LONG_LINES.get(_rel(path), 0)
        if len(long) > allowed:
            over.append(f"{_rel(path)}: {len(long)} lines over {LINE_CHARS} characters (at most {allowed}), "
                        f"line {', '.join(map(str, long[:5]))}")
    assert not over, "\n".join(over)
