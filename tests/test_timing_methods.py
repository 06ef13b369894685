"""The timing methods beside events: kernel time from CUPTI (the aggregation of a profile's kernel
events into calls, on fake events), the choice of method (``timed``), the SDPA backend read from
kernel names, ``--timing`` on the command line; on a GPU, phases and SDPA timed by CUPTI."""
import statistics
import time
from types import SimpleNamespace

import pytest

from numba_attn import cli
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure import cupti, timing
from numba_attn.measure.peers import sdpa_backend_from_kernels
from numba_attn.measure.timing import TimingConfig, kernel_events, per_call_kernels


class _Range:
    def __init__(self, start, dur):
        self.start, self._dur = start, dur

    def elapsed_us(self):
        return self._dur


def _ev(name, start, dur, device="DeviceType.CUDA"):
    return SimpleNamespace(name=name, device_type=device, time_range=_Range(start, dur))


def _calls(durations, warmup_durations=(), names=("split", "combine")):
    """Kernel events of back-to-back calls: each call launches ``names`` with the given durations (µs)."""
    evs, t = [], 0.0
    for durs in list(warmup_durations) + list(durations):
        for name, d in zip(names, durs):
            evs.append(_ev(name, t, d))
            t += d + 1.0
    return evs


# -- aggregation (pure) ---------------------------------------------------------------


def test_two_kernels_per_call_warmup_left_out_median_per_call():
    calls = [(100.0, 10.0), (102.0, 10.0), (99.0, 12.0), (300.0, 10.0), (101.0, 9.0)]
    evs = _calls(calls, warmup_durations=[(5000.0, 500.0)])
    agg = per_call_kernels(kernel_events(evs), calls=len(calls), warmup=1)
    assert agg["irregular"] is None and agg["kernels_per_call"] == 2
    assert agg["per_call_ms"] == pytest.approx([(a + b) / 1e3 for a, b in calls])
    assert statistics.median(agg["per_call_ms"]) == pytest.approx(0.111)  # the outlier and the warm-up do not count
    assert [k["name"] for k in agg["kernels"]] == ["split", "combine"]
    assert agg["kernels"][0]["time_ms"] == pytest.approx(0.101)
    assert agg["kernels"][1]["time_ms"] == pytest.approx(0.010)


def test_kernel_events_keep_device_kernels_in_start_order():
    evs = [_ev("k2", 50.0, 5.0), _ev("aten::add", 0.0, 99.0, device="DeviceType.CPU"),
           _ev("Memcpy HtoD (Pageable -> Device)", 10.0, 7.0), _ev("Memset (Device)", 11.0, 1.0),
           _ev("k1", 20.0, 4.0)]
    # a memset is a call's own work (cuDNN's backward zeroes its dQ accumulator so); a copy is the harness's
    assert kernel_events(evs) == [("Memset (Device)", 11.0, 1.0), ("k1", 20.0, 4.0), ("k2", 50.0, 5.0)]


def test_calls_that_differ_are_reported_and_averaged():
    evs = _calls([(100.0, 10.0)] * 3, warmup_durations=[(100.0, 10.0)])
    evs.append(_ev("stray", 1e6, 30.0))  # one more kernel than the calls launch
    agg = per_call_kernels(kernel_events(evs), calls=3, warmup=1)
    assert "not the same number per call" in agg["irregular"]
    assert agg["per_call_ms"] == [pytest.approx((4 * 110.0 + 30.0) / 4 / 1e3)] * 3
    evs = _calls([(100.0, 10.0)] * 2) + _calls([(100.0, 10.0)], names=("other", "combine"))
    agg = per_call_kernels(kernel_events(evs), calls=3)
    assert "same kernels" in agg["irregular"]


def test_no_kernel_is_an_error():
    with pytest.raises(RuntimeError, match="no kernel"):
        per_call_kernels([], calls=3)


def test_cupti_kernel_time_on_a_fake_profiler(monkeypatch):
    """The whole method with the profiler replaced: warm-up outside it, one profiled call left out."""
    torch = pytest.importorskip("torch")
    import torch.profiler as tp

    launched = []

    class FakeProfile:
        def __init__(self, activities):
            self.start = len(launched)

        def __enter__(self):
            self.start = len(launched)
            return self

        def __exit__(self, *exc):
            self.stop = len(launched)

        def events(self):
            out = []
            for j, i in enumerate(launched[self.start:self.stop]):
                dur = 1000.0 if j == 0 else 100.0 + (i % 3)  # the first profiled call is slow (left out)
                out += [_ev("attn", 1000.0 * j, dur), _ev("combine", 1000.0 * j + 500, 20.0)]
            return out

    monkeypatch.setattr(cupti, "cupti_status", lambda: None)
    monkeypatch.setattr(tp, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    stream = SimpleNamespace(synchronize=lambda: None)
    out = cupti.cupti_kernel_time(lambda i: launched.append(i), stream,
                                  TimingConfig(warmup=2, min_reps=5, max_reps=5), calls=6)
    assert len(launched) == 2 + 1 + 1 + 6  # warm-up, sizing call, one left out, the calls
    assert out["method"] == "cupti" and out["calls"] == 6 and out["kernels_per_call"] == 2
    assert out["time_ms"] == pytest.approx(0.121)
    assert [k["name"] for k in out["kernels"]] == ["attn", "combine"]


def test_cupti_status_says_why_not_here():
    why = timing.cupti_status()
    if IS_SIMULATOR:
        assert "needs a GPU" in why and "simulator" in why


# -- the method chosen for the row ----------------------------------------------------


def _fake_methods(monkeypatch, events_ms, cupti_ms, launch_bound=False):
    def events(fn, stream, cfg=None, **kw):
        return {"method": "events_batched", "time_ms": events_ms, "time_min_ms": events_ms, "time_max_ms": events_ms,
                "spread": 0.01, "spread_p10_p90": 0.01, "reps": 10, "inner": 20, "launch_bound": launch_bound}

    def cupti(fn, stream, cfg=None, calls=None):
        return {"method": "cupti", "time_ms": cupti_ms, "time_min_ms": cupti_ms, "time_max_ms": cupti_ms,
                "spread": 0.01, "spread_p10_p90": 0.01, "reps": 50, "calls": 50, "kernels_per_call": 1,
                "kernels": [{"name": "k", "time_ms": cupti_ms}]}

    monkeypatch.setattr(timing, "events_batched", events)
    monkeypatch.setattr(timing, "cupti_kernel_time", cupti)


def test_timed_cupti_row_keeps_events_and_warns_beyond_the_spread(monkeypatch):
    _fake_methods(monkeypatch, events_ms=1.065, cupti_ms=0.930)
    t = timing.timed(None, None, TimingConfig(method="cupti"))
    assert t["time_method"] == "cupti" and t["time_ms"] == t["time_cupti_ms"] == 0.930
    assert t["events_ms"] == 1.065 and "inner" not in t and t["events_inner"] == 20
    assert t["cupti_kernels"] == [{"name": "k", "time_ms": 0.930}]
    assert t["timing_check"]["disagree"] and "cupti" in t["timing_check"]["warning"]
    _fake_methods(monkeypatch, events_ms=0.935, cupti_ms=0.930, launch_bound=True)
    t = timing.timed(None, None, TimingConfig(method="cupti"))
    assert not t["timing_check"]["disagree"] and "launch_bound" not in t and t["events_launch_bound"]


def test_timed_events_is_unchanged_and_cupti_failure_falls_back(monkeypatch):
    _fake_methods(monkeypatch, events_ms=1.0, cupti_ms=0.5)
    t = timing.timed(None, None, TimingConfig())
    assert t["time_method"] == "events_batched" and t["time_ms"] == 1.0 and "timing_check" not in t

    def broken(*a, **k):
        raise RuntimeError("kernel time (--timing cupti) needs PyTorch's profiler")

    monkeypatch.setattr(timing, "cupti_kernel_time", broken)
    t = timing.timed(None, None, TimingConfig(method="cupti"))
    assert t["time_method"] == "events_batched" and "needs PyTorch" in t["timing_fallback"]


def test_timed_graph_adopts_the_replay_or_says_why_not(monkeypatch):
    _fake_methods(monkeypatch, events_ms=1.0, cupti_ms=0.5)
    replay = {"method": "graph_replay", "time_ms": 0.99, "spread": 0.01, "inner": 20, "reps": 10}
    t = timing.timed(None, None, TimingConfig(method="graph"), graph=lambda: replay)
    assert t["time_method"] == "graph_replay" and t["time_ms"] == 0.99 and t["events_ms"] == 1.0
    assert not t["timing_check"]["disagree"]
    t = timing.timed(None, None, TimingConfig(method="graph"),
                     graph=lambda: {"method": None, "graph_error": "CaptureError: no"})
    assert t["time_method"] == "events_batched" and "CaptureError" in t["timing_fallback"]


def test_unknown_method_is_refused(monkeypatch):
    _fake_methods(monkeypatch, events_ms=1.0, cupti_ms=0.5)
    with pytest.raises(ValueError, match="events, graph, cupti"):
        timing.timed(None, None, TimingConfig(method="clock"))


# -- the SDPA backend that ran --------------------------------------------------------


@pytest.mark.parametrize("names, backend", [
    (["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0"], "cudnn"),
    (["sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0"], "cudnn"),
    (["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
      "cutlass::half_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t> >, false, true, false, false, "
      "true, true, false, false>(pytorch_flash::Flash_fwd_params)"], "flash"),
    (["void pytorch_flash::flash_fwd_splitkv_kernel<...>(pytorch_flash::Flash_fwd_params)",
      "void pytorch_flash::flash_fwd_splitkv_combine_kernel<...>(pytorch_flash::Flash_fwd_params)"], "flash"),
    (["fmha_cutlassF_f16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
      "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)"], "efficient"),
    (["sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
      "void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 10, false, false>(...)",
      "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn"], "math"),
    (["void at::native::elementwise_kernel<128, 2, ...>"], "unknown"),
    ([], None),
])
def test_sdpa_backend_from_kernel_names(names, backend):
    assert sdpa_backend_from_kernels(names) == backend


def test_table_shows_the_method_and_the_backend_that_ran():
    from numba_attn.report.table import _notes, cells as table_cells

    rows = [{"type": "result", "phase": "torch_sdpa", "kind": "peer", "label": "B2 H16 N8192 D128 fp16 causal",
             "status": "OK", "time_ms": 0.93, "time_method": "cupti", "sdpa_backend_ran": "cudnn"},
            {"type": "result", "phase": "torch_sdpa_flash", "kind": "peer", "label": "x", "status": "OK",
             "time_ms": 1.0, "time_method": "cupti", "sdpa_backend_ran": "flash",
             "timing_fallback": None}]
    cells = table_cells(rows)
    assert cells[0][0] == "torch_sdpa [cudnn]" and cells[0][4].endswith("ᶜ")
    assert cells[1][0] == "torch_sdpa_flash"
    assert any("CUPTI" in line for line in _notes(rows))


# -- the command line -----------------------------------------------------------------


def test_timing_flag_accepted_and_refused(capsys):
    ap = cli._parser()
    for m in ("events", "graph", "cupti"):
        assert ap.parse_args(["run", "--timing", m, "-N", "8"]).timing == m
    assert ap.parse_args(["run", "-N", "8"]).timing is None  # default: events
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["run", "--timing", "clock"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.simulator
def test_timing_cupti_in_the_simulator_says_it_needs_a_gpu(capsys):
    """Refused before any row runs (nothing is timed in the simulator), with the reason."""
    for m, why in (("cupti", "kernel time needs a GPU and PyTorch"), ("graph", "graph replay needs a GPU")):
        assert cli.main(["run", "--simulator", "--phases", "naive", "-N", "8", "-D", "8", "--timing", m]) == 2
        err = capsys.readouterr().err
        assert f"--timing {m}: the simulator times nothing" in err and why in err
    # bench takes the same option, refused the same way before any row
    assert cli.main(["bench", "decode", "--simulator", "--timing", "cupti", "--plots", ""]) == 2
    assert "--timing cupti: the simulator times nothing" in capsys.readouterr().err


# -- on a GPU -------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.serial  # timing: not while other tests share the GPU
def test_gpu_cupti_times_phases_and_sdpa_the_same_way():
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.peer_rows import measure_peer
    from numba_attn.measure.peers import torch_status
    from numba_attn.measure.row import measure
    from numba_attn.spec.problem import Problem

    if timing.cupti_status() or torch_status():
        pytest.skip(timing.cupti_status() or torch_status())
    cfg = RunConfig(seeds=(1,), timing=TimingConfig(method="cupti", budget_s=0.5))
    prob = Problem(batch=1, heads=8, q_len=1024, head_dim=64, dtype="float16")
    row = measure("split_k_prefill", prob, cfg, splits=2)
    assert row["status"] == "OK", row.get("reason")
    assert row["time_method"] == "cupti" and row["time_ms"] == row["time_cupti_ms"]
    assert row["cupti_kernels_per_call"] == 2 and len(row["cupti_kernels"]) == 2  # split + combine
    assert 0.5 < row["time_ms"] / row["events_ms"] < 1.1
    peer = measure_peer("torch_sdpa", prob, cfg)
    assert peer["status"] == "OK", peer.get("reason")
    assert peer["time_method"] == "cupti" and peer["cupti_kernels"]
    assert peer["sdpa_backend_ran"] in ("cudnn", "flash", "efficient", "math")
    events_peer = measure_peer("torch_sdpa_math", prob, RunConfig(seeds=(1,), timing=TimingConfig(budget_s=0.3)))
    if events_peer["status"] == "OK":
        # events, or graph replay where the launches outran the kernels (the math backend's many small ones)
        assert events_peer["sdpa_backend_ran"] == "math"
        assert events_peer["time_method"] in ("events_batched", "graph_replay")


def test_launch_bound_events_stop_at_the_minimum_when_another_method_times_the_row(monkeypatch, host_clock_events):
    """Events samples of a launch-bound launch measure the host: with ``stop_when_launch_bound``
    they stop at ``min_reps`` (flagged) instead of running to the time budget on the host's jitter."""

    class Stream:
        def synchronize(self):
            pass

    def fn(i):
        time.sleep(0.0005)

    cfg = TimingConfig(warmup=1, min_reps=4, max_reps=200, budget_s=0.3, batch_ms=2, target_spread=0.0)
    t = timing.events_batched(fn, Stream(), cfg, stop_when_launch_bound=True)
    assert t["launch_bound"] and t["stopped_launch_bound"] and t["reps"] == cfg.min_reps
    t = timing.events_batched(fn, Stream(), cfg)  # no early stop: to the budget (the spread never converges)
    assert t["launch_bound"] and "stopped_launch_bound" not in t and t["reps"] > cfg.min_reps
