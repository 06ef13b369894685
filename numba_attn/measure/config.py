"""What a run is asked to do: seeds, timing, limits, parameters, where rows go (``RunConfig``).

A config travels to worker processes as a plain dict (``config_to_dict`` / ``config_from_dict``).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from numba_attn.measure.timing import TimingConfig


@dataclass
class RunConfig:
    seeds: tuple = (1, 2)
    timing: TimingConfig = field(default_factory=TimingConfig)  # .method: events (default), graph or cupti
    time_kernels: bool = True  # only on the GPU
    timeout_s: float | None = None  # per row; None: in-process, no limit
    params: dict = field(default_factory=dict)  # {phase_name: {param: value}}
    baseline: str = "naive"
    peers: bool = True
    results: str | None = None
    command: str | None = None
    ceilings: bool = False  # measure the device's ceilings first (run() only)
    compare_timing: bool | None = None  # graph-replay cross-check: None = once per run() (never in measure())
    resume: bool = False  # skip rows already in ``results`` for the same source and environment
    max_row_ms: float | None = None  # skip a phase whose predicted time per launch exceeds this
    max_total_s: float | None = None  # rows not started by then are SKIP
    worker_setup: tuple = ()  # "module:function" called in each worker process before its first row
    peer_list: tuple | None = None  # peer names (None: all of peers.PEERS)
    allow_slow: bool = False  # simulator: run rows estimated over sim_limit_s (else SKIP; also NUMBA_ATTN_ALLOW_SLOW=1)
    sim_limit_s: float | None = None  # simulator: the estimated seconds a row may take (None: 60, NUMBA_ATTN_SIM_LIMIT_S)
    # a problem's phases and peers timed again in interleaved rounds ("interleaved"; measure/regime.py), or each
    # row's own standalone time only ("standalone": before 2026-11-28)
    regime: str = "interleaved"
    rounds: int = 5  # interleaved rounds per problem (every implementation once a round)
    hold: bool = False  # (set by the sweep) keep this row's timed function for its problem's rounds


def config_to_dict(cfg: RunConfig) -> dict:
    return asdict(cfg)


def config_from_dict(d: dict) -> RunConfig:
    d = dict(d)
    d["timing"] = TimingConfig(**d["timing"])
    d["seeds"] = tuple(d["seeds"])
    d["worker_setup"] = tuple(d.get("worker_setup") or ())
    if d.get("peer_list") is not None:
        d["peer_list"] = tuple(d["peer_list"])
    return RunConfig(**d)


def default_results_dir() -> str:
    """Where ``numba-attn run`` writes when no ``--results`` is given: ``$NUMBA_ATTN_RESULTS``, else a
    per-user data directory (``platformdirs`` when installed, else ``$XDG_DATA_HOME`` or
    ``~/.local/share``, then ``numba-attn/results``) — never the checkout."""
    env = os.environ.get("NUMBA_ATTN_RESULTS")
    if env:
        return os.path.expanduser(env)
    try:
        import platformdirs
    except ImportError:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        return os.path.join(base, "numba-attn", "results")
    return os.path.join(platformdirs.user_data_dir("numba-attn", appauthor=False), "results")
