"""The work items' timeline (numba_attn/phases/tensor_core/timeline.py, numba_attn/measure/timeline.py): a traced
build stamps every item once, in order, and computes the right answer; the clocks and their analysis."""
import numpy as np
import pytest

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.phases.registry import get_phase
from numba_attn.phases.tensor_core.timeline import CONSUMER_STEPS, PRODUCER_SLOTS, trace_width, tracing, traced
from numba_attn.spec.problem import Problem

pytestmark = pytest.mark.skipif(not IS_SIMULATOR, reason="simulator test (the GPU run: experiments/2026-11-28-timeline)")


def _problem(causal=False, heads=2, n=40):
    return Problem(batch=1, heads=heads, q_len=n, kv_len=n, head_dim=16, causal=causal, dtype="float16")


def test_tracing_is_off_outside_its_context():
    assert not traced()
    with tracing():
        assert traced()
    assert not traced()


@pytest.mark.parametrize("name,causal", [("ws_intra_kv", True), ("ws_intra_persistent", False)])
def test_a_traced_call_stamps_every_item_in_order(name, causal):
    from numba_attn.measure.timeline import trace_phase

    ph = get_phase(name)
    p = _problem(causal)
    tl = trace_phase(name, p, ph.sim_params)  # (raises when the traced kernel's output is wrong)
    W = tl.params["warpgroups"]
    assert tl.raw.shape == (2, trace_width(W))  # one query block a head, two heads
    assert np.all(tl.raw[:, PRODUCER_SLOTS:] > 1)  # every stamp written (1: Q's guard value)
    t = tl.t
    for a, b in zip(CONSUMER_STEPS, CONSUMER_STEPS[1:]):  # each warpgroup's steps in order
        assert np.all(t[b] >= t[a]), (a, b)
    assert np.all(t["loaded"] >= t["producer"])
    assert np.all(t["start"] >= t["block"][:, None])
    seg = tl.segments()
    assert set(seg) == {"gap", "setup", "q", "k0", "loop", "epilogue"}
    s = tl.summary()
    assert s["items"] == 2 and s["loop_us"] > 0 and s["tile_us"] > 0
    assert list(tl.tiles) == [3, 3]  # 40 keys in 16-key tiles


def test_phases_without_a_producer_refuse_to_trace():
    with tracing(), pytest.raises(ValueError, match="loads='ws'"):
        get_phase("tma_wgmma").plan(_problem(), **get_phase("tma_wgmma").sim_params)


def test_the_analysis_places_sms_on_one_clock_and_fits_the_loop():
    """Synthetic stamps of two SMs whose cycle counters differ by a large offset: the parts come out in ns of one
    clock, and the tile loop's fit recovers the tile and the fixed cost."""
    from numba_attn.measure.timeline import Timeline

    p = Problem(batch=1, heads=1, q_len=256, kv_len=256, head_dim=64, causal=True, dtype="float16")
    tiles = np.array([1, 2])  # two query blocks of 128 rows, 128-key tiles
    W, S = 2, len(CONSUMER_STEPS)
    raw = np.zeros((2, trace_width(W)), np.uint64)
    ns0 = 1_795_870_122_803_393_632  # (globaltimer since boot: beyond float64's exact integers)
    for i, (sm, cyc0) in enumerate([(3, 47_920_893_794), (7, 9_000_000)]):  # 2 cycles a ns
        loop = 2 * (1000 * int(tiles[i]) + 300)  # a tile 1 µs, 0.5 µs fixed (0.2 of it the first K's wait)
        raw[i, 0] = (sm << 32) | i
        raw[i, 1] = ns0 + 100 * i  # the producer's start, global ns
        raw[i, 2] = cyc0 - 200  # block start
        raw[i, 3], raw[i, 4] = cyc0, cyc0 + 10
        for w in range(W):
            steps = np.cumsum([cyc0 + 400, 600, 400, loop, 800])  # start, Q, first K, loop, stored
            raw[i, PRODUCER_SLOTS + S * w:PRODUCER_SLOTS + S * (w + 1)] = steps
        raw[i, -1] = ns0 + 100 * i + (int(raw[i, PRODUCER_SLOTS + S - 1]) - cyc0) // 2
    tl = Timeline("synthetic", p, {}, raw, W, tiles)
    assert tl.ns_per_cycle == pytest.approx(0.5)
    assert tl.t["producer"][1] - tl.t["producer"][0] == pytest.approx(100)  # placed by the global clock
    seg = tl.segments()
    assert seg["q"] == pytest.approx([300, 300]) and seg["epilogue"] == pytest.approx([400, 400])
    assert seg["k0"] == pytest.approx([200, 200]) and seg["loop"] == pytest.approx([1300, 2300])
    assert seg["setup"] == pytest.approx([300, 300])
    s = tl.summary()
    assert s["tile_us"] == pytest.approx(1.0) and s["loop_fixed_us"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="never written"):
        Timeline("synthetic", p, {}, np.zeros_like(raw), W, tiles)


def test_the_trace_command_names_what_it_cannot_trace(capsys):
    from numba_attn import cli

    assert cli.main(["trace", "tma_wgmma", "--simulator", "-B", "1", "-H", "1", "-N", "40", "-D", "16", "--dtype",
                     "fp16"]) != 0
    assert "needs loads='ws'" in capsys.readouterr().err
    assert cli.main(["trace", "ws_intra_kv", "--simulator", "--param", "Bc"]) != 0
    assert "--param 'Bc'" in capsys.readouterr().err


@pytest.mark.full
def test_the_trace_command_writes_its_picture_and_stamps(tmp_path, capsys):
    import gzip
    import json

    from numba_attn import cli

    assert cli.main(["trace", "ws_intra_kv", "--simulator", "-B", "1", "-H", "2", "-N", "40", "-D", "16", "--dtype",
                     "fp16", "--param", "warpgroups=2", "--param", "Bc=16", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "a tile" in out and "epilogue" in out
    stem = tmp_path / "ws_intra_kv-b1-h2-n40-d16-fp16"
    assert stem.with_suffix(".png").stat().st_size > 1000
    d = json.load(gzip.open(str(stem) + ".json.gz", "rt"))
    assert d["items"] == 2 and len(d["raw"]) == 2
