"""Benchmark declarations, in one place (in the spirit of ``triton.testing.Benchmark``).

A :class:`Benchmark` names its x axis and values, the lines (phases of a kind,
plus the SDPA peers), the problems for each x value, which (phase, problem)
pairs to run, the time limits, and the plots to draw. ``numba-attn bench NAME``
runs one (ceilings first), writes the results file and the plots::

    numba-attn bench roadmap                 # <results dir>/roadmap-<gpu>.jsonl and its plots beside it
    numba-attn bench roadmap --results results/roadmap-h100.jsonl --plots plots/   # the committed files
    numba-attn bench decode

The results file and the plots go to the per-user results directory (``$NUMBA_ATTN_RESULTS``, else
``~/.local/share/numba-attn/results``: :func:`~numba_attn.measure.config.default_results_dir`) unless
``--results`` / ``--plots`` name other places: a benchmark writes into a checkout (``results/``,
``plots/``) only when asked to.

Declared benchmarks:

``roadmap``
    every prefill phase and SDPA on the ``roadmap`` preset (B1 H32 N4096 D64,
    B1 H32 N4096 D128, B16 H16 N512 D64; fp32), plus the same shapes in fp16
    for the phases that compute on tensor cores (and the peers).
``long-context``
    contexts 4k–32k at B1 H32 D128: fp32 for the CUDA-core phases, fp16 for
    tensor-core phases; a phase whose time predicted from its previous length
    (scaled by FLOPs) exceeds the row limit is skipped with that reason.
``decode``
    the decode phases and SDPA on the ``decode`` preset (declared by the
    decode work in ``problem.PRESETS``).
``paged``
    the paged decode phases on the ``paged`` and ``paged-8bit`` presets (page
    sizes 16/64/256, ragged lengths, fp8/int8 caches), each beside its
    contiguous fp16 twin (same batch, heads and lengths; a ragged batch's twin
    holds the mean length, the same bytes), on which the contiguous decode
    phases and SDPA run: bandwidth of the bytes actually read (``min_bytes``:
    each sequence's keys once, at the cache's element size) against the copy
    ceiling, time against SDPA on the twin.
``backward``
    the backward phases (``attention_backward``: dq, dk, dv checked against the float64 gradients) beside SDPA's
    backward (``torch.autograd.grad`` through its output; auto, cuDNN and flash backends) at fp16 B1 H32,
    N 1024 and 4096, D64 and D128, causal and not; TFLOP/s of the backward's FLOPs (2.5× the forward's).
``varlen``
    the varlen prefill phases on the ``varlen`` preset (packed ragged batches,
    B 8 and 32, lengths uniform in [N/4, N] for N 1024 and 4096, H32 D128 fp16,
    causal and not), each beside its padded twin (the same batch with every
    sequence at the longest length, contiguous layout) run by the varlen
    phases' parents and SDPA: ``flops`` of a varlen row counts only the real
    (query, key) pairs, so TFLOP/s is time per useful FLOP for both.

Time limits keep ``roadmap`` within ~8 minutes on an H100: per-row timing
budget, per-row timeout (a hung phase is killed and recorded ``TIMEOUT``), a
per-row predicted-time limit, and a limit on the whole run after which the
remaining rows are recorded ``SKIP`` with that reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from numba_attn.spec.problem import (PRESETS, PagedProblem, Problem, VarlenProblem, contiguous_twin, layout_of,
                                      padded_twin)
from numba_attn.measure.timing import TimingConfig


@dataclass
class Benchmark:
    name: str
    description: str
    x_names: tuple  # what varies along the x axis
    x_vals: list  # one entry per x position (a label or a length)
    problems_for: Callable  # x value → list[Problem]
    line_kind: str = "prefill"  # the phases of this kind are the lines
    peers: tuple | None = None  # None: every peer in peers.PEERS
    select: Callable | None = None  # (phase, problem) → bool
    plots: tuple = ("roadmap", "roofline", "traffic")
    plot_name: str = ""
    seeds: tuple = (1, 2)
    timing: TimingConfig = field(default_factory=lambda: TimingConfig(
        warmup=2, min_reps=5, max_reps=100, budget_s=0.4, batch_ms=20.0, target_spread=0.02))
    timeout_s: float = 180.0
    max_row_ms: float | None = None
    max_total_s: float | None = None
    expand: Callable | None = None  # problems given instead of the declared ones (--preset) → the rows' problems
    baseline: str = "naive"  # the phase the speedups are against

    def problems(self) -> list[Problem]:
        out = []
        for x in self.x_vals:
            for p in self.problems_for(x):
                if p not in out:
                    out.append(p)
        return out


def _tensor_core(phase) -> bool:
    from numba_attn.measure.ceilings import uses_tensor_cores

    return uses_tensor_cores(phase.name, phase.precision)


def _fp16_only_for_tensor_cores(phase, problem) -> bool:
    """fp32 problems: every phase that takes fp32; fp16/bf16 problems: the tensor-core phases that
    take that dtype (no row only to say "dtype not supported")."""
    if problem.dtype not in phase.dtypes:
        return False
    if problem.dtype == "float32":
        return True
    return _tensor_core(phase)


def _roadmap_problems(x):
    p = x
    out = [p]
    if p.dtype == "float32":
        out.append(p.replace(dtype="float16"))
    return out


def _long_problems(n):
    return [Problem(batch=1, heads=32, q_len=n, head_dim=128),
            Problem(batch=1, heads=32, q_len=n, head_dim=128, dtype="float16")]


def _long_select(phase, problem) -> bool:
    if phase.name == "naive":  # S and P for N ≥ 16k need > 30 GiB and minutes; the roadmap covers it
        return problem.q_len <= 8192 and problem.dtype == "float32"
    return _fp16_only_for_tensor_cores(phase, problem)


def _decode_presets() -> list[str]:
    """The ``decode`` preset, or every preset named decode* when there is none of that name."""
    if "decode" in PRESETS:
        return ["decode"]
    return [name for name in PRESETS if name.startswith("decode")]


def _decode_problems(name):
    return list(PRESETS[name])


def is_paged(problem) -> bool:
    return bool(getattr(problem, "page_size", 0))


def is_varlen(problem) -> bool:
    return layout_of(problem) == "varlen"


def with_twins(problems) -> list:
    """Each paged problem followed by its contiguous twin, each varlen problem by its padded twin
    (duplicates kept once)."""
    out = []
    for p in problems:
        twin = contiguous_twin(p) if is_paged(p) else (padded_twin(p) if is_varlen(p) else None)
        for x in ([p, twin] if twin is not None else [p]):
            if x not in out:
                out.append(x)
    return out


def _paged_problems(name):
    return with_twins(PRESETS[name])


PAGED_PEERS_OF = ("decode_split_k_lean", "decode_mma")  # the contiguous phases a paged one is held against


def _paged_select(phase, problem) -> bool:
    """Paged phases on the paged problems; the contiguous phases they are held against on the twins."""
    if is_paged(problem):
        return phase.layout == "paged"
    return phase.name in PAGED_PEERS_OF


VARLEN_PEERS_OF = ("tc_wgmma", "tc_mma")  # the padded-layout parents a varlen phase is held against


def _varlen_problems(name):
    return with_twins(PRESETS[name])


def _varlen_select(phase, problem) -> bool:
    """Varlen phases on the varlen problems; their parents on the padded twins."""
    if is_varlen(problem):
        return phase.layout == "varlen"
    return phase.name in VARLEN_PEERS_OF


def _layout_select(phase, problem) -> bool:
    """A phase only on problems of the layout it reads (no SKIP row saying so)."""
    return phase.layout == layout_of(problem)


# ``numba-attn run`` without a problem in the simulator: one tiny problem per family, so that every
# phase runs (several full and partial tiles, a few seconds each) on a problem of its kind and dtype.
DEFAULT_PROBLEMS = [
    Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16),  # fp32 prefill: CUDA cores, tf32
    Problem(batch=1, heads=1, q_len=37, kv_len=53, head_dim=16, dtype="float16"),  # fp16 prefill: tensor cores
    Problem(batch=1, heads=2, kv_heads=1, q_len=1, kv_len=70, head_dim=16, dtype="float16"),  # decode, GQA 2:1
    PagedProblem(batch=2, heads=2, kv_heads=1, q_len=1, kv_len=70, head_dim=16, dtype="float16", page_size=16,
                 ragged=True),  # paged decode
    PagedProblem(batch=1, heads=2, kv_heads=1, q_len=1, kv_len=40, head_dim=64, dtype="float16", page_size=16,
                 kv_dtype="float8_e4m3", kv_scale="head"),  # paged decode over an 8-bit cache (paged_mma8)
    VarlenProblem(batch=3, heads=2, kv_heads=1, q_len=37, kv_len=41, head_dim=16, dtype="float16"),  # varlen prefill
]


def problem_kind(problem) -> str:
    """``decode`` for a few new tokens against a cache (q_len ≤ 16), else ``prefill``."""
    return "decode" if problem.q_len <= 16 else "prefill"


def select_by_kind(problems):
    """A ``select(phase, problem)`` that runs each phase only on the problems of its kind (prefill or
    decode) in a dtype it supports, in its first-listed dtype when there is one; a phase with no such
    problem runs on the first problem of its kind (its SKIP row then says why). Of those, the first it
    supports (an 8-bit cache for a phase that reads only those)."""
    problems = list(problems)

    def select(phase, problem) -> bool:
        mine = [p for p in problems if problem_kind(p) == phase.kind and layout_of(p) == phase.layout]
        fits = [p for p in mine if p.dtype in phase.dtypes]
        first = [p for p in fits if p.dtype == phase.dtypes[0]]
        pool = first or fits or mine
        runs = [p for p in pool if phase.supports(p) is None]
        return problem in (runs or pool)[:1]

    return select


BENCHMARKS: dict[str, Benchmark] = {}
SDPA_PEERS = ("torch_sdpa", "torch_sdpa_flash", "torch_sdpa_efficient", "torch_sdpa_cudnn")  # the fp32 SDPA peers


def register(b: Benchmark) -> Benchmark:
    BENCHMARKS[b.name] = b
    return b


register(Benchmark(
    name="roadmap",
    description="every prefill phase and SDPA on the roadmap preset (fp32), plus fp16 for tensor-core phases",
    x_names=("problem",),
    x_vals=list(PRESETS["roadmap"]),
    problems_for=_roadmap_problems,
    select=_fp16_only_for_tensor_cores,
    plots=("roadmap", "roofline", "traffic"),
    plot_name="roadmap",
    max_row_ms=3000.0,
    max_total_s=420.0,
))

register(Benchmark(
    name="long-context",
    description="contexts 4k-32k at B1 H32 D128 (fp32; fp16 for tensor-core phases) and SDPA",
    x_names=("q_len", "kv_len"),
    x_vals=[4096, 8192, 16384, 32768],
    problems_for=_long_problems,
    select=_long_select,
    peers=SDPA_PEERS,
    plots=("scaling", "roofline"),
    plot_name="long_context",
    seeds=(1,),
    max_row_ms=1500.0,
    max_total_s=540.0,
))

register(Benchmark(
    name="decode",
    description="decode phases and SDPA on the decode presets",
    x_names=("problem",),
    x_vals=[],  # filled from PRESETS when run (presets named decode*)
    problems_for=_decode_problems,
    line_kind="decode",
    peers=SDPA_PEERS,
    plots=("roadmap", "roofline", "traffic"),
    plot_name="decode",
    select=_layout_select,
    max_row_ms=1000.0,
    max_total_s=420.0,
))



def _backward_problems(x):
    n, d = x
    return [Problem(batch=1, heads=32, q_len=n, kv_len=n, head_dim=d, causal=c, dtype="float16") for c in (False, True)]


register(Benchmark(
    name="backward",
    description="the backward phases and SDPA's backward (auto, cuDNN, flash): fp16 B1 H32, N 1024 and 4096, "
                "D64 and D128, causal and not",
    x_names=("q_len", "head_dim"),
    x_vals=[(1024, 64), (1024, 128), (4096, 64), (4096, 128)],
    problems_for=_backward_problems,
    line_kind="backward",
    peers=("torch_sdpa_backward", "torch_sdpa_cudnn_backward", "torch_sdpa_flash_backward"),
    plots=("roadmap",),
    plot_name="backward",
    seeds=(1,),
    baseline="bwd_naive",
    max_row_ms=3000.0,
    max_total_s=540.0,
))


def layout_benchmark(name: str, description: str, presets: list, problems_for, select, line_kind: str) -> Benchmark:
    """A benchmark of a memory layout (paged, varlen): its phases on the ``presets`` beside the contiguous
    twins (:func:`with_twins`) on which their parents and SDPA run; the ``layouts`` plot."""
    return Benchmark(name=name, description=description, x_names=("problem",), x_vals=presets,
                     problems_for=problems_for, line_kind=line_kind, select=select, peers=SDPA_PEERS,
                     plots=("layouts",), plot_name=name, expand=with_twins, max_row_ms=1000.0, max_total_s=540.0)


register(layout_benchmark(
    "paged", "paged decode phases (fp16, fp8, int8 caches; page sizes 16-256; ragged lengths) against the "
             "contiguous decode phases and SDPA on the contiguous fp16 cache of the same lengths",
    ["paged", "paged-8bit"], _paged_problems, _paged_select, line_kind="decode"))

register(layout_benchmark(
    "varlen", "varlen prefill phases (packed ragged batches, cu_seqlens) against their parents on the padded "
              "batch (every sequence at the longest length) and SDPA on it: time per useful FLOP",
    ["varlen"], _varlen_problems, _varlen_select, line_kind="prefill"))


def get(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        import difflib

        close = difflib.get_close_matches(name, list(BENCHMARKS), n=2, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown benchmark {name!r}.{hint} Benchmarks: {', '.join(BENCHMARKS)}")
    b = BENCHMARKS[name]
    if b.name == "decode":
        names = _decode_presets()
        if not names:
            raise KeyError("benchmark 'decode' needs presets named decode* in numba_attn.spec.problem.PRESETS; "
                           f"there are none (presets: {', '.join(PRESETS)})")
        b.x_vals = names
    return b


BESIDE_RESULTS = "<beside the results file>"  # run_benchmark(plots_dir=...): the results file's directory


def run_benchmark(name: str, *, results: str | None = None, plots_dir: str | None = BESIDE_RESULTS,
                  phases=None, quick: bool = False, resume: bool = False, progress=None,
                  timeout_s: float | None = None, max_total_s: float | None = None, command: str | None = None,
                  setup=(), problems=None, workers=None, make_worker=None, timing_method: str | None = None,
                  allow_slow: bool = False, peers=None, regime: str = "interleaved", rounds: int = 5):
    """Run a declared benchmark; returns (rows, results path, plot files).

    ``results`` None: ``<results dir>/<name>-<gpu>.jsonl`` (never the current directory); ``plots_dir``:
    the plots' directory (default: the results file's; None or "": no plots).

    ``quick`` cuts the timing budget and uses one seed (for a smoke test of the
    command); ``phases`` restricts the lines; ``problems`` replaces the
    benchmark's problems (e.g. smaller shapes for a smoke test); ``workers`` / ``make_worker``:
    the rows on several workers (see :func:`numba_attn.measure.sweep.run`); ``timing_method``
    (``events``, ``graph`` or ``cupti``) replaces the benchmark's timing method, for phases and peers alike;
    ``peers`` (names, :func:`numba_attn.measure.peers.known_peer_names`) replaces the benchmark's peers;
    ``regime`` and ``rounds``: :class:`~numba_attn.measure.config.RunConfig`'s (interleaved rounds per problem).
    """
    import os

    from numba_attn.report.plots import make_all
    from numba_attn.phases.registry import get_phase, list_phases
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.sweep import run

    b = get(name)
    if phases:
        plist = [get_phase(p) for p in phases]
    else:
        plist = list_phases(b.line_kind)
    timing = b.timing
    seeds = b.seeds
    if quick:
        timing = TimingConfig(warmup=1, min_reps=3, max_reps=20, budget_s=0.1, batch_ms=10.0)
        seeds = (1,)
    if timing_method:
        import dataclasses

        timing = dataclasses.replace(timing, method=timing_method)
    if results is None:
        from numba_attn.measure.env import gpu_info

        slug = "".join(c if c.isalnum() else "-" for c in gpu_info()["gpu"].lower()).strip("-")
        from numba_attn.measure.config import default_results_dir

        results = os.path.join(default_results_dir(), f"{b.name}-{slug}.jsonl")
    if plots_dir == BESIDE_RESULTS:
        plots_dir = os.path.dirname(os.path.abspath(results))
    # timeout_s None: the benchmark's limit; 0: no limit (rows in-process), as for numba-attn run
    cfg = RunConfig(seeds=seeds, timing=timing, timeout_s=b.timeout_s if timeout_s is None else timeout_s or None,
                    results=results, ceilings=True, resume=resume, max_row_ms=b.max_row_ms,
                    max_total_s=max_total_s if max_total_s is not None else b.max_total_s,
                    peer_list=tuple(peers) if peers is not None else b.peers,
                    command=command or f"numba-attn bench {name}", baseline=b.baseline,
                    worker_setup=tuple(setup), allow_slow=allow_slow, regime=regime, rounds=rounds)
    probs = list(problems) if problems is not None else b.problems()
    if problems is not None and b.expand is not None:
        probs = b.expand(probs)
    rows = run(plist, probs, config=cfg, select=b.select, progress=progress, workers=workers,
               make_worker=make_worker)
    files = []
    if plots_dir:
        files = make_all(results, plots_dir, prefix=f"{b.plot_name or b.name}_", which=b.plots)
    return rows, results, files
