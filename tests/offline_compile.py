"""Run an offline sm_90a compile script (no GPU needed) in a subprocess with the CUDA backend and read the
JSON it prints on its last line that starts with "JSON"; skip where libNVVM, NVRTC or nvJitLink is missing (the
``cu12``/``cu13`` extras bring them)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def offline_json(script: str, timeout: float = 900):
    env = dict(os.environ, NUMBA_ATTN_BACKEND="cuda", NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode and any(lib in p.stderr.lower() for lib in ("nvvm", "nvjitlink", "libnvrtc")):
        pytest.skip("libNVVM / NVRTC / nvJitLink not available: " + p.stderr.strip().splitlines()[-1])
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("JSON")][-1][4:])
