"""Sweeps on several workers: local workers pinned one GPU each, run/bench/tune on them, a dead worker's row
retried once; the device list and its assignment tested on fake nvidia-smi output."""
import json
import os

import pytest

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure import devices as D
from numba_attn.measure import parallel as P
from numba_attn.measure.parallel import LocalPool
from numba_attn.measure.results import load_results
from numba_attn.measure.status import ERROR, OK
from numba_attn.measure.sweep import run
from numba_attn.spec.problem import Problem
from numba_attn.testing import DIE_ONCE_ENV, faulty_phases, temporary_phases

TINY = Problem(batch=1, heads=1, q_len=9, kv_len=17, head_dim=8)
SETUP = ("numba_attn.testing:register_faulty_phases",)
SMI = """\
GPU 0: NVIDIA H200 (UUID: GPU-aaaa1111)
GPU 1: NVIDIA H200 (UUID: GPU-bbbb2222)
  MIG 1g.18gb     Device  0: (UUID: MIG-cccc3333)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-dddd4444)
"""


def test_visible_devices_and_their_assignment():
    listed = D.visible_devices(env={}, smi_text=SMI)
    assert [d.token for d in listed] == ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-dddd4444"]  # UUIDs: no order doubt
    assert [d.model for d in listed] == ["NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    # an existing CUDA_VISIBLE_DEVICES: its entries in its order (the i-th worker gets the i-th entry)
    mine = D.visible_devices(env={"CUDA_VISIBLE_DEVICES": "1, 0"}, smi_text=SMI)
    assert [(d.token, d.uuid) for d in mine] == [("1", "GPU-bbbb2222"), ("0", "GPU-aaaa1111")]
    assert [d.token for d in D.assign_devices(2, mine)] == ["1", "0"]
    by_uuid = D.visible_devices(env={"CUDA_VISIBLE_DEVICES": "GPU-dddd,0"}, smi_text=SMI)
    assert [d.model for d in by_uuid] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]  # a UUID prefix
    assert D.visible_devices(env={"CUDA_VISIBLE_DEVICES": ""}, smi_text=SMI) == []
    assert [d.token for d in D.visible_devices(env={"CUDA_VISIBLE_DEVICES": "2,-1,0"}, smi_text=SMI)] == ["2"]
    # no nvidia-smi: numba counts the GPUs in a child process (never in this one)
    assert [d.token for d in D.visible_devices(env={}, smi_text="", count_in_child=lambda: 2)] == ["0", "1"]
    # more workers than GPUs: refused, or shared round-robin with --oversubscribe
    with pytest.raises(ValueError, match="only 2 GPU.*--oversubscribe"):
        D.assign_devices(3, mine)
    assert [d.token for d in D.assign_devices(3, mine, oversubscribe=True)] == ["1", "0", "1"]
    with pytest.raises(ValueError, match="no visible GPU"):
        D.assign_devices(1, [])
    # different models: refused unless allow_mixed
    with pytest.raises(RuntimeError, match="different GPU models.*--allow-mixed"):
        D.check_same_model([d.model for d in listed])
    assert D.check_same_model([d.model for d in listed], allow_mixed=True)
    with pytest.raises(RuntimeError, match="--allow-mixed"):
        LocalPool(2, devices=[listed[0], listed[2]])  # refused from the listing, before any process starts
    LocalPool(2, devices=[listed[0], listed[2]], allow_mixed=True).close()


def _result_rows(path):
    return [r for r in load_results(path) if r.get("type") == "result"]


def test_two_workers_same_rows_resume_and_pinning(tmp_path):
    import os

    phases = ["naive", "fused_rowwise", "smem_kv"]
    one = run(phases, [TINY], seeds=(1,), peers=False, results=str(tmp_path / "one.jsonl"))
    # two workers, each given its own device (in the simulator a fake one: ignored there, the environment
    # shows it; on a GPU machine the visible GPUs, shared round-robin when there is only one)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if IS_SIMULATOR:
        devices = [D.Device("GPU-fake0"), D.Device("GPU-fake1")]
    else:
        devices = D.assign_devices(2, D.visible_devices(), oversubscribe=True)
    tokens = [d.token for d in devices]
    pool = LocalPool(2, devices=devices)
    ids = pool.start()
    assert [i["cuda_visible_devices"] for i in ids] == tokens
    assert [i["lane"] for i in ids] == [0, 1] and all(i["gpu"] for i in ids)
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before  # this process's environment is left alone
    if hasattr(os, "sched_getaffinity"):  # each worker runs on its own share of this process's CPUs
        shares = P.cpu_shares(2)
        assert [i["affinity"] for i in ids] == [len(c) for c in shares] and [i["cpus"] for i in ids] == [
            len(c) for c in shares]
        assert "NUMBA_ATTN_CPUS" not in os.environ
    two = run(phases, [TINY], seeds=(1,), peers=False, results=str(tmp_path / "two.jsonl"), timeout_s=300,
              workers=2, make_worker=pool.make_worker)
    def key(rows):  # in the simulator the speedup is the model's, equal in both; on a GPU a measured time
        return [(r["phase"], r["label"], r["status"]) + ((r.get("speedup"),) if IS_SIMULATOR else ())
                for r in rows]

    assert key(two) == key(one)  # task order
    rows = _result_rows(str(tmp_path / "two.jsonl"))
    assert sorted(r["phase"] for r in rows) == sorted(phases)  # none lost, none twice
    assert {r["worker"]["cuda_visible_devices"] for r in rows} <= set(tokens)
    assert len({r["run_id"] for r in rows}) == 1
    # resume on two (default local) workers: every row is skipped, none written again
    again = run(phases, [TINY], seeds=(1,), peers=False, results=str(tmp_path / "two.jsonl"), timeout_s=300,
                resume=True, workers=2, oversubscribe=True)
    assert [r["phase"] for r in again] == phases and all(r.get("resumed") for r in again)
    assert len(_result_rows(str(tmp_path / "two.jsonl"))) == len(phases)


def test_dead_worker_replaced_and_row_retried_once(tmp_path, monkeypatch):
    monkeypatch.setenv(DIE_ONCE_ENV, str(tmp_path / "died-once"))
    path = str(tmp_path / "die.jsonl")
    with temporary_phases(*faulty_phases()):
        rows = run(["test_die_once", "test_die", "fused_rowwise"], [TINY], seeds=(1,), peers=False,
                   timeout_s=300, worker_setup=SETUP, results=path, workers=2, oversubscribe=True)
    by = {r["phase"]: r for r in rows}
    assert by["test_die_once"]["status"] == OK and "retried once" in by["test_die_once"]["retried"]
    assert by["test_die"]["status"] == ERROR and "died" in by["test_die"]["reason"]
    assert "twice" in by["test_die"]["reason"] and "worker" in by["test_die"]
    assert by["fused_rowwise"]["status"] == OK
    assert sorted(r["phase"] for r in _result_rows(path)) == sorted(by)


@pytest.mark.parametrize("cmd", [["run", "-N", "9", "--phases", "naive"], ["bench", "decode"]])
def test_ray_missing_says_how_to_install(cmd, capsys):
    from numba_attn.cli import main
    from numba_attn.measure import distributed

    if distributed.available():
        pytest.skip("ray is installed")
    assert main(cmd + ["--ray"]) == 2
    assert 'pip install -e ".[ray]"' in capsys.readouterr().err


def test_cli_run_workers(tmp_path, capsys):
    from numba_attn.cli import main

    path = str(tmp_path / "cli.jsonl")
    rc = main(["run", "--phases", "naive,smem_kv", "-B", "1", "-H", "1", "-N", "9", "--kv-len", "17", "-D", "8",
               "--seeds", "1", "--no-peers", "--workers", "2", "--oversubscribe", "--results", path])
    out = capsys.readouterr().out
    assert rc == 0 and "workers: 2 local worker(s)" in out
    rows = _result_rows(path)
    assert sorted(r["phase"] for r in rows) == ["naive", "smem_kv"] and all(r["status"] == OK for r in rows)
    assert {r["worker"]["lane"] for r in rows} <= {0, 1}
    json.dumps(rows)  # plain data


def test_cli_tune_workers(tmp_path, capsys, monkeypatch):
    from numba_attn.cli import main
    from numba_attn.measure import tune as tuning

    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "cache.json"))
    rc = main(["tune", "smem_kv", "-B", "1", "-H", "1", "-N", "9", "--kv-len", "17", "-D", "8", "--space",
               "smem_kv.Br=16,32", "--space", "smem_kv.Bc=16", "--workers", "2", "--oversubscribe", "--results",
               str(tmp_path / "t.jsonl"), "--seeds", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "workers: 2 local worker(s)" in out and "3 of 3 candidates measured, 3 OK" in out
    rows = _result_rows(str(tmp_path / "t.jsonl"))
    assert len({cfg for cfg in (json.dumps(r["requested_params"], sort_keys=True) for r in rows)}) == len(rows) == 3
    assert all("worker" in r for r in rows)


def test_cpu_shares_split_the_host_between_workers(monkeypatch):
    """Workers sharing a host get disjoint, even CPU shares, and thread pools sized to them (unless
    the environment already sizes them); a worker pins itself to its share when it starts."""
    flat = lambda c: (0, c)  # noqa: E731 - one thread per core
    assert P.cpu_shares(2, range(32), flat) == [list(range(16)), list(range(16, 32))]
    assert P.cpu_shares(3, range(8), flat) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert P.cpu_shares(3, [5], flat) == [[5], [5], [5]] and P.cpu_shares(0, range(4), flat) == []
    assert P.cpu_shares(2, range(8), lambda c: None) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # topology unknown
    # two threads per core numbered n and n + 8 (cores 0-7): each share holds whole cores, not one
    # thread of every core
    smt = lambda c: (0, c % 8)  # noqa: E731
    assert P.cpu_shares(2, range(16), smt) == [[0, 8, 1, 9, 2, 10, 3, 11], [4, 12, 5, 13, 6, 14, 7, 15]]
    assert P.cpu_shares(2, range(4), lambda c: (c // 2, 0)) == [[0, 1], [2, 3]]  # two packages, one core each
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    env = P.share_env([4, 5, 6])
    assert env["OMP_NUM_THREADS"] == "3" and env["NUMBA_ATTN_THREADS"] == "3" and "MKL_NUM_THREADS" not in env
    assert env["NUMBA_ATTN_CPUS"] == "4,5,6"
    if hasattr(os, "sched_setaffinity"):
        from numba_attn.measure.isolation import apply_cpu_share

        seen = []
        monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: seen.append(cpus))
        monkeypatch.setenv("NUMBA_ATTN_CPUS", "4,5,6")
        apply_cpu_share()
        monkeypatch.delenv("NUMBA_ATTN_CPUS")
        apply_cpu_share()
        assert seen == [{4, 5, 6}]
