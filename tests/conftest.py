"""Tests run in the CUDA simulator unless a GPU is present (NUMBA_ATTN_BACKEND
overrides). GPU-only tests carry ``@pytest.mark.gpu`` and are skipped in the
simulator; simulator-only ones carry ``@pytest.mark.simulator``.

Two tiers. By default pytest runs the quick tier (a few minutes on two cores):
every registered phase on odd shapes against float64, and every module's
checks, without the tests marked ``full`` (longer simulator runs of the same
code paths: more shapes per phase, sweeps, notebooks, worker pools), listed
in tests/full_tier.txt or marked in place. The full
suite is ``pytest --full`` (or ``NUMBA_ATTN_TESTS=full``); CI runs it. Skipped
tests are summed up by reason at the end, a line per reason (``-rs`` lists
them one by one)."""
import collections
import os
import random
import re

# The simulator runs a block's threads as Python threads, each calling NumPy's matrix products (the wgmma model):
# OpenBLAS's own thread pool under a hundred of them aborted a worker (Fatal Python error: Aborted, in
# wgmma_reference, a persistent kernel's P·V). One BLAS thread a simulated thread; set before NumPy loads OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

import numba_attn.gpu.backend as backend  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="numba-attn: run the full suite (tests marked `full` too); default: the quick tier")


def full_tier(config) -> bool:
    return bool(config.getoption("--full")) or os.environ.get("NUMBA_ATTN_TESTS", "").lower() == "full"


def pytest_configure(config):
    # The head-dim sample (tests/test_head_dims.py) changes from run to run; parallel workers
    # (pytest-xdist) inherit the controller's draw so that they collect the same tests.
    if not hasattr(config, "workerinput"):
        os.environ.setdefault("NUMBA_ATTN_HEAD_DIM_SEED", str(random.randrange(1 << 30)))
    # phase=None times nothing on first use in the tests (tests/test_autotune.py turns it on with a fake timer):
    # on a GPU the choices stay the rule's and no tuning cache of the user's is written
    os.environ.setdefault("NUMBA_ATTN_AUTOTUNE", "0")


def pytest_report_header(config):
    tier = "full suite" if full_tier(config) else "quick tier (pytest --full: the full suite)"
    return [f"numba-attn backend: {backend.describe()}", f"numba-attn tests: {tier}"]


def _full_tier_list() -> set[str]:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "full_tier.txt")
    with open(path) as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}


def pytest_collection_modifyitems(config, items):
    listed = _full_tier_list()
    for item in items:  # tests/full_tier.txt: the full tier's own tests, by function
        if item.nodeid.split("[", 1)[0] in listed:
            item.add_marker(pytest.mark.full)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (running in the Numba CUDA simulator)")
    skip_sim = pytest.mark.skip(reason="simulator-only test (a real GPU is active)")
    if not full_tier(config):
        full_only = [it for it in items if it.get_closest_marker("full")]
        if full_only:
            config.hook.pytest_deselected(items=full_only)
            items[:] = [it for it in items if not it.get_closest_marker("full")]
    for item in items:
        if "gpu" in item.keywords and backend.IS_SIMULATOR:
            item.add_marker(skip_gpu)
        if "simulator" in item.keywords and not backend.IS_SIMULATOR:
            item.add_marker(skip_sim)


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    # one line per cause: "PHASE does not support SHAPE: why" counts under "why"
    reason = re.sub(r"^\S+ does not support .*?: ", "a phase's supports() refuses the shape: ", reason)
    return reason.strip().splitlines()[0] if reason.strip() else "(no reason given)"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped or config.getoption("reportchars", "") and "s" in config.getoption("reportchars"):
        return
    by_reason = collections.Counter(_skip_reason(r) for r in skipped)
    tw = terminalreporter
    tw.write_sep("-", f"{len(skipped)} skipped, by reason (pytest -rs lists each)")
    shown = by_reason.most_common(8)
    for reason, n in shown:
        tw.write_line(f"{n:5d}  {reason[:150]}")
    rest = sum(by_reason.values()) - sum(n for _, n in shown)
    if rest:
        tw.write_line(f"{rest:5d}  for {len(by_reason) - len(shown)} other reasons")


@pytest.fixture
def host_clock_events(monkeypatch):
    """numba's CUDA events replaced by events of the host clock (the simulator has no device timer): a timed
    launch measures host time only."""
    import time

    from numba import cuda

    class Event:
        def record(self, stream=None):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    monkeypatch.setattr(cuda, "event", lambda timing=True: Event(), raising=False)
    monkeypatch.setattr(cuda, "event_elapsed_time", lambda a, b: (b.t - a.t) * 1e3, raising=False)
