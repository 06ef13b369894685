"""Tests run in the CUDA simulator unless a GPU is present (NUMBA_ATTN_BACKEND
overrides). GPU-only tests carry ``@pytest.mark.gpu`` and are skipped, with
the reason shown, in the simulator; simulator-only ones carry
``@pytest.mark.simulator``."""
import os
import random

import pytest

import numba_attn.gpu.backend as backend


def pytest_configure(config):
    # The head-dim sample (tests/test_head_dims.py) changes from run to run; parallel workers
    # (pytest-xdist) inherit the controller's draw so that they collect the same tests.
    if not hasattr(config, "workerinput"):
        os.environ.setdefault("NUMBA_ATTN_HEAD_DIM_SEED", str(random.randrange(1 << 30)))


def pytest_report_header(config):
    return f"numba-attn backend: {backend.describe()}"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (running in the Numba CUDA simulator)")
    skip_sim = pytest.mark.skip(reason="simulator-only test (a real GPU is active)")
    for item in items:
        if "gpu" in item.keywords and backend.IS_SIMULATOR:
            item.add_marker(skip_gpu)
        if "simulator" in item.keywords and not backend.IS_SIMULATOR:
            item.add_marker(skip_sim)
