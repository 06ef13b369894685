"""The notebooks execute top to bottom (in the simulator on CI), through the
nbmake pytest plugin: ``python -m pytest --nbmake notebooks/``."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["01_walkthrough.ipynb", "02_roadmap_report.ipynb", "03_write_your_own_phase.ipynb",
                                           "04_write_your_own_variant.ipynb"]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(nb, tmp_path):
    pytest.importorskip("nbmake", reason="nbmake is in the project's test extra: pip install -e '.[test]'")
    pytest.importorskip("ipykernel", reason="ipykernel is in the project's test extra")
    env = dict(os.environ)
    env.setdefault("NUMBA_ATTN_BACKEND", "simulator")
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake",
                        "--nbmake-timeout=300", str(nb)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "1 passed" in r.stdout
