"""Every registered phase against the float64 reference, in the simulator, on
small odd shapes: lengths that are not multiples of any tile, q_len != kv_len,
causal and not, head_dim 16 and 32, several batches and heads, grouped-query
attention, float32 and float16 storage, decode-sized q_len.

A phase may declare a shape out of its range (``supports`` → SKIP with the
reason), but it must run at least two of the shapes, and no shape may FAIL or
ERROR. Phases run with their ``sim_params`` (small tiles, so that several
tiles and a partial last tile are exercised).

A shape is left out for a phase that accepts other shapes covering each of its features (``COVERED_BY``):
a prefill phase runs the decode-sized shapes' q_len 1 and 2 and GQA, and the fp32 non-causal shape, on the
same kernel paths as its causal fp32, GQA and non-causal fp16 and causal q_len 3 shapes."""
import pytest

from numba_attn import Problem, list_phases
from numba_attn.spec.problem import PagedProblem, VarlenProblem
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure

SHAPES = {
    "B1H2-37x53-D16-fp32": Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16),
    "B1H2-37x53-D16-fp32-causal": Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16, causal=True),
    "B2H2/1-29-D32-fp16-causal": Problem(batch=2, heads=2, kv_heads=1, q_len=29, head_dim=32,
                                         dtype="float16", causal=True),
    "B1H2-19x45-D32-fp16": Problem(batch=1, heads=2, q_len=19, kv_len=45, head_dim=32, dtype="float16"),
    "decode-B2H4/2-1x45-D32-fp32": Problem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=45, head_dim=32),
    "decode-B1H2-3x45-D16-fp16-causal": Problem(batch=1, heads=2, q_len=3, kv_len=45, head_dim=16,
                                                dtype="float16", causal=True),
    "decode-B1H4/1-2x45-D16-fp16": Problem(batch=1, heads=4, kv_heads=1, q_len=2, kv_len=45, head_dim=16,
                                           dtype="float16"),
    "paged-B2H4/2-1x45-D16-fp16-P16-ragged": PagedProblem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=45,
                                                          head_dim=16, dtype="float16", page_size=16, ragged=True),
    "paged-B1H2-3x45-D32-fp16-P32-causal": PagedProblem(batch=1, heads=2, q_len=3, kv_len=45, head_dim=32,
                                                        dtype="float16", page_size=32, causal=True),
    # 8-bit caches at head_dim 64 (paged_mma8's fragments need a multiple of 64)
    "paged-B1H2/1-1x40-D64-fp16-P16-fp8": PagedProblem(batch=1, heads=2, kv_heads=1, q_len=1, kv_len=40, head_dim=64,
                                                       dtype="float16", page_size=16, kv_dtype="float8_e4m3",
                                                       kv_scale="head"),
    "paged-B2H2/1-1x40-D64-fp16-P16-int8-token": PagedProblem(batch=2, heads=2, kv_heads=1, q_len=1, kv_len=40,
                                                              head_dim=64, dtype="float16", page_size=16,
                                                              ragged=True, kv_dtype="int8", kv_scale="token"),
    "varlen-B3H4/2-21x25-D16-fp16-causal": VarlenProblem(batch=3, heads=4, kv_heads=2, q_len=21, kv_len=25,
                                                         head_dim=16, dtype="float16", causal=True),
    "varlen-B2H2-19-D32-fp16": VarlenProblem(batch=2, heads=2, q_len=19, head_dim=32, dtype="float16"),
}
# shape -> alternative sets of shapes that together reach its paths: a phase accepting every shape of one set
# (none of them left out itself) leaves the shape out. fp32 and fp16 differ only in their loads and stores, a GQA
# group of 2 or 4 only in the KV head index, q_len 1, 2 or 3 (under one row tile) only in the rows past Nq.
COVERED_BY = {
    # fp32: the causal fp32 shape; GQA: the causal fp16 one; non-causal q_len < kv_len: the fp16 one; a q_len
    # under a row tile: the causal decode shape
    "decode-B2H4/2-1x45-D32-fp32": [("B1H2-37x53-D16-fp32-causal", "B2H2/1-29-D32-fp16-causal",
                                     "B1H2-19x45-D32-fp16", "decode-B1H2-3x45-D16-fp16-causal")],
    # fp32 and q_len < kv_len: its causal twin; non-causal: the fp16 shape (or, fp32 only, the q_len 1 one)
    "B1H2-37x53-D16-fp32": [("B1H2-37x53-D16-fp32-causal", "B1H2-19x45-D32-fp16"),
                            ("B1H2-37x53-D16-fp32-causal", "decode-B2H4/2-1x45-D32-fp32")],
    # GQA: the causal fp16 shape; non-causal q_len < kv_len: the fp16 one; a q_len under a row tile: the causal
    # decode shape
    "decode-B1H4/1-2x45-D16-fp16": [("B2H2/1-29-D32-fp16-causal", "B1H2-19x45-D32-fp16",
                                     "decode-B1H2-3x45-D16-fp16-causal")],
}
PHASES = list_phases()
_ROWS: dict = {}
CFG = RunConfig(seeds=(7,))


def _accepted(phase) -> list[str]:
    params = phase.resolve_params(phase.sim_params)
    return [s for s in SHAPES if phase.supports(SHAPES[s], **params) is None]


def _shapes(phase) -> list[str]:
    """The shapes a phase runs: those it accepts, less those ``COVERED_BY`` others it runs."""
    ok = _accepted(phase)
    out = set()
    for shape, covers in COVERED_BY.items():
        if shape in ok and any(all(c in ok and c not in out for c in cover) for cover in covers):
            out.add(shape)
    return [s for s in ok if s not in out]


def _quick_shapes(phase) -> list[str]:
    """The quick tier's shape of a phase: the smallest of its own kind it runs (fewest FLOPs, causal first where
    they tie), so that every phase is checked on an odd shape; the full suite runs all of them."""
    ok = _shapes(phase)
    own = [s for s in ok if s.startswith("decode-") == (phase.kind == "decode")] or ok  # a prefill phase: a prefill shape
    return sorted(own, key=lambda s: (SHAPES[s].flops(), not SHAPES[s].causal))[:1]


_RUN = {p.name: _shapes(p) for p in PHASES}
_QUICK = {p.name: _quick_shapes(p) for p in PHASES}
CASES = [pytest.param(p, s, id=f"{p.name}-{s}", marks=() if s in _QUICK[p.name] else pytest.mark.full)
         for p in PHASES for s in SHAPES if s in _RUN[p.name] or s not in _accepted(p)]


def _row(phase, shape):
    key = (phase.name, shape)
    if key not in _ROWS:
        _ROWS[key] = measure(phase, SHAPES[shape], CFG, **phase.sim_params)
    return _ROWS[key]


@pytest.mark.parametrize("phase,shape", CASES)
def test_phase_matches_reference(phase, shape):
    row = _row(phase, shape)
    if row["status"] == "SKIP":
        pytest.skip(f"{phase.name} does not support {SHAPES[shape].label}: {row['reason']}")
    assert row["status"] == "OK", f"{phase.name} on {SHAPES[shape].label}: {row['status']}: {row['reason']}"
    assert row["check"]["rel_err"] <= row["check"]["tol"]
    assert row["check"]["unwritten"] == 0


@pytest.mark.parametrize("phase", PHASES, ids=[p.name for p in PHASES])
def test_phase_runs_enough_shapes(phase):
    """A phase accepts at least two of the test shapes. Each shape it accepts is run by
    test_phase_matches_reference, which fails unless the row is OK (a row is SKIP only where supports()
    refuses), so this reads supports() and runs nothing: under pytest-xdist it need not share a worker, and
    the rows' cache, with those runs."""
    ok = _accepted(phase)
    assert len(ok) >= 2, f"{phase.name} accepts only {ok}; a phase must cover at least two test shapes"
    assert len(_RUN[phase.name]) >= 2, f"{phase.name} runs only {_RUN[phase.name]}"


def test_default_parameters_run_in_simulator():
    """The default (GPU) tile sizes, not only the small simulator tiles, are
    correct: one problem per prefill phase whose tiles fit a single block."""
    prob = Problem(batch=1, heads=1, q_len=21, kv_len=40, head_dim=16, causal=True)
    bad = []
    for phase in PHASES:
        if phase.kind != "prefill" or phase.supports(prob) is not None:
            continue
        row = measure(phase, prob, CFG)
        if row["status"] not in ("OK", "SKIP"):
            bad.append(f"{phase.name}: {row['status']} {row['reason']}")
    assert not bad, bad


def test_register_variant_runs_its_base_with_other_defaults():
    """``register_variant``: the base phase under a new name, its defaults changed, its parent the base, the
    rest the base's; a builder of its own for a keyword the base does not expose; an unknown default refused."""
    import numpy as np

    import numba_attn as na
    from numba_attn.phases.registry import get_phase, register_variant, unregister

    base = get_phase("smem_kv")
    try:
        v = register_variant("smem_kv", "smem_kv_br16", Br=16, Bc=8)
        assert v.parent == "smem_kv" and v.params == {**base.params, "Br": 16, "Bc": 8}
        assert v.title.endswith("(Br=16, Bc=8)") and v.module == __name__ and v.kind == base.kind
        p = na.Problem(batch=1, heads=2, q_len=19, kv_len=23, head_dim=8, causal=True)
        assert v.plan(p).params["Br"] == 16 and v.plan(p, Br=8).params["Br"] == 8  # a default, not a constant
        q, k, v_ = (np.random.default_rng(3).standard_normal((1, 2, n, 8)).astype(np.float32) for n in (19, 23, 23))
        out = na.attention(q, k, v_, causal=True, phase="smem_kv_br16")
        assert np.abs(out - na.reference(q, k, v_, causal=True)).max() < 1e-4

        def own(problem, Br=64, Bc=64):
            return base.build(problem, Br=Br, Bc=Bc)

        w = register_variant("smem_kv", "smem_kv_own", build=own, note="own builder", Bc=16)
        assert w.params == {"Br": 64, "Bc": 16} and w.title.endswith("(own builder)")
        with pytest.raises(ValueError, match="not parameters"):
            register_variant("smem_kv", "smem_kv_bad", stages=3)
    finally:
        for name in ("smem_kv_br16", "smem_kv_own", "smem_kv_bad"):
            unregister(name)
    assert "smem_kv_br16" not in {p.name for p in list_phases()}
