"""The ``numba-attn`` command line's arguments: the parser of every command and the checks of the values
given (sizes, seconds, problems, parameters, seeds, peers), each refused in one line naming the option.
Imported before the backend is chosen: nothing here imports numba."""
from __future__ import annotations

import argparse
import re

DESCRIPTION = """\
Prototype GPU attention kernels with Numba, one measurable optimization at a time.

  numba-attn list                      the registered phases in roadmap order
  numba-attn run [options]             check (and on a GPU time) phases on problems; without a
                                       problem: every phase on a small problem set (simulator) or
                                       the roadmap benchmark (GPU)
  numba-attn bench NAME                a declared benchmark (roadmap, long-context, decode, paged, varlen, backward):
                                       ceilings, phases and SDPA -> results file + plots
  numba-attn compare A B               per-phase ratios between two results files (times, or simulator counts)
  numba-attn compare A --parent        within one file: each phase against its parent (--phases P,Q: Q against P)
  numba-attn plot RESULTS [--out DIR]  roadmap, scaling, roofline and memory-traffic plots; simulator counts
  numba-attn diff PHASE [--code]       the source diff of a phase against its parent (--code: its code only)
  numba-attn card PHASE | --all        a phase's card (docs/phases/<name>.md)
  numba-attn new NAME --from PARENT    your own phase: NAME.py (the parent's module, renamed) and its
                                       test, in the current directory (--dir DIR); load it with --setup
                                       NAME.py or $NUMBA_ATTN_PHASES (docs/DEVELOPING.md, "Your own phase")
  numba-attn readme [--check]          regenerate the tables of README.md and docs/results.md
  numba-attn tune PHASE[,PHASE] [opts] measure a phase's parameter space, keep the best in the
                                       tuning cache (--show prints it)
  numba-attn dispatch --build|--show  the dispatch table phase=None reads, built from the committed
                                       GPU results (and a tuning cache)

run, bench and tune measure rows side by side with --workers N (one worker process per GPU) or on a
Ray cluster with --ray [ADDRESS]; every row goes to the one results file.

`numba-attn COMMAND --help` for a command's options.
"""


DEFAULT_BUDGET_S = 2.0  # run --budget: seconds of timing per row
PEERS_HELP = ("comma-separated peer names (default: SDPA's peers; FlashAttention-4 and FlexAttention only when "
              "named: fa4, torch_flex, fa4_backward, torch_flex_backward)")


def _version() -> str:
    from numba_attn import __version__

    return f"numba-attn {__version__}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="numba-attn", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd")
    ls = sub.add_parser("list", help="list the registered phases in roadmap order")
    ls.add_argument("--kind", choices=["prefill", "decode"], default=None)
    ls.add_argument("-v", "--verbose", action="store_true", help="also print each phase's description")
    _common(ls)

    r = sub.add_parser("run", help="check (and on a GPU time) phases on problems")
    be = r.add_mutually_exclusive_group()
    be.add_argument("--simulator", action="store_true", help="use the Numba CUDA simulator (CPU)")
    be.add_argument("--gpu", action="store_true", help="require a real CUDA GPU")
    r.add_argument("--phases", default=None, help="comma-separated phase names (default: all)")
    r.add_argument("--preset", action="append", default=[],
                   help="named problem set (repeatable); see `numba-attn run --list-presets`")
    r.add_argument("--list-presets", action="store_true",
                   help="print the named problem sets (for --preset) and their problems, then exit")
    r.add_argument("--explain-columns", action="store_true",
                   help="print what every column and mark of the table means, then exit")
    r.add_argument("--csv", default=None, metavar="PATH", help="also write the table's rows to PATH as CSV")
    r.add_argument("--counts", action=argparse.BooleanOptionalAction, default=True,
                   help="simulator: count what each row's first launch does (global bytes and sectors, shared-memory "
                        "wavefronts and bank conflicts, barriers, mma...) into its sim_* fields (default; the whole "
                        "run ~20%% more CPU time); --no-counts or NUMBA_ATTN_SIM_COUNTS=0: off")
    _shape_options(r)
    r.add_argument("--param", action="append", default=[], metavar="PHASE.NAME=VALUE",
                   help="override a phase's tunable parameter, e.g. smem_kv.Bc=64 (repeatable)")
    r.add_argument("--seeds", default=None, help="comma-separated input seeds for the correctness check (default 1,2)")
    r.add_argument("--results", default=None,
                   help="JSON-lines file to append to (default: <results dir>/<gpu>.jsonl, the results dir "
                        "being $NUMBA_ATTN_RESULTS or ~/.local/share/numba-attn/results)")
    _timeout_and_timing(r, "seconds per (phase, problem) before it is recorded TIMEOUT (default 600 on a GPU, 1800 "
                           "in the simulator, the roadmap benchmark's 180 without a problem on a GPU; 0 = no limit, "
                           "in-process)",
                        "which method gives the time column (GPU): events = CUDA events around back-to-back "
                        "launches (the default); graph = CUDA graph replay; cupti = the kernels' own durations "
                        "from CUPTI through torch.profiler (needs PyTorch; phases and SDPA measured the same "
                        "way: use it for published ratios). The events time is kept and compared")
    r.add_argument("--budget", type=float, default=None,
                   help=f"seconds of timing per row (GPU; default {DEFAULT_BUDGET_S:g})")
    r.add_argument("--no-peers", action="store_true", help="do not run PyTorch SDPA as a peer")
    r.add_argument("--peers", default=None, help=PEERS_HELP)
    _regime_options(r)
    r.add_argument("--no-ceilings", action="store_true",
                   help="do not measure the device's ceilings (FFMA, mma, copy) before the phases")
    r.add_argument("--resume", action="store_true",
                   help="skip rows already in the results file for the same source and environment")
    r.add_argument("--baseline", default=None, help="the phase the speedups are relative to (default naive)")
    _allow_slow_option(r)
    _parallel_options(r, "default: one after the other on a GPU; in the simulator one worker per core, at most 4")
    _common(r)

    b = sub.add_parser("bench", help="run a declared benchmark (see numba_attn/measure/bench.py) and draw its plots")
    b.add_argument("name", nargs="?", help="benchmark name (omit to list them)")
    b.add_argument("--results", default=None,
                   help="results file (default: <results dir>/<name>-<gpu>.jsonl, the results dir being "
                        "$NUMBA_ATTN_RESULTS or ~/.local/share/numba-attn/results; the committed files: "
                        "--results results/<name>-<gpu>.jsonl --plots plots/)")
    b.add_argument("--plots", default=None, help="directory for the plots (default: the results file's); '' for none")
    b.add_argument("--phases", default=None, help="only these phases (comma-separated)")
    b.add_argument("--resume", action="store_true", help="skip rows already measured (same source, environment)")
    b.add_argument("--quick", action="store_true", help="short timing budget, one seed: a smoke test")
    b.add_argument("--preset", action="append", default=[], help="replace the benchmark's problems by presets")
    b.add_argument("--peers", default=None, help="comma-separated peer names, instead of the benchmark's (e.g. "
                                                 "torch_sdpa_cudnn,fa4,torch_flex)")
    _timeout_and_timing(b, "seconds per row before TIMEOUT (default: the benchmark's; 0 = no limit, in-process)",
                        "how phases and peers are timed (default: the benchmark's, events; cupti: the kernels' "
                        "own durations, through torch.profiler)")
    b.add_argument("--max-total", type=float, default=None,
                   help="seconds after which remaining rows are SKIP (default: the benchmark's limit)")
    _regime_options(b)
    b.add_argument("--simulator", action="store_true", help="use the Numba CUDA simulator (CPU)")
    _allow_slow_option(b)
    _parallel_options(b, "default: one after the other in one worker process")
    _common(b)

    c = sub.add_parser("compare", help="per-phase ratios between two results files")
    c.add_argument("a")
    c.add_argument("b", nargs="?", help="the second results file (or --parent / --phases within A)")
    c.add_argument("--parent", action="store_true",
                   help="within A: each phase against its parent on the same problem")
    c.add_argument("--phases", default=None, metavar="P,Q", help="within A: phase Q against phase P on each problem")

    p = sub.add_parser("plot", help="draw the plots of a results file (--headline: the README's headline plot)")
    p.add_argument("results", nargs="?", help="a results file; with --headline the results directory "
                   "(default: the repository's results/)")
    p.add_argument("--headline", action="store_true", help="draw headline.png|svg: per family, the best phase "
                   "against the best SDPA of the same run, from the committed results files")
    p.add_argument("--gpu", default="nvidia-h200", help="with --headline: the GPU of the results files "
                   "(default nvidia-h200)")
    p.add_argument("--out", default=None, help="output directory (default: the results file's directory when it is in "
                                               "the results dir, else the results dir: never a checkout unless named)")
    p.add_argument("--prefix", default="", help="file name prefix")
    p.add_argument("--which", default=None, help="comma-separated subset of roadmap,scaling,roofline,traffic,layouts")

    d = sub.add_parser("diff", help="the source diff of a phase's module against its parent's (--code: the code "
                                     "it compiles, shared functions it calls included, without docstrings)")
    d.add_argument("phase")
    d.add_argument("--code", action="store_true", help="code only: no docstrings, comments, imports or "
                   "registration; the functions it uses from the family's shared modules included")
    d.add_argument("--stat", action="store_true", help="only the number of lines added and removed")
    d.add_argument("-U", "--context", type=int, default=3, help="lines of context (default 3)")
    _common(d)

    cd = sub.add_parser("card", help="a phase's card: parent, idea, parameters, tests, measured rows, plots")
    cd.add_argument("phase", nargs="?", help="phase name (or --all)")
    cd.add_argument("--all", action="store_true", help="every phase's card and the index")
    cd.add_argument("--out", default=None, help="with --all: write <out>/<name>.md and <out>/README.md "
                                                "(e.g. docs/phases/)")
    cd.add_argument("--check", action="store_true",
                    help="with --all: exit 1 when the files under --out (default docs/phases/) differ from a "
                         "regeneration")
    _common(cd)

    nw = sub.add_parser("new", help="your own phase: NAME.py, a copy of PARENT's module registered as NAME, "
                                    "and test_NAME.py")
    nw.add_argument("name", metavar="NAME", help="the new phase's name (a Python identifier)")
    nw.add_argument("--from", dest="parent", required=True, metavar="PARENT", help="the phase to start from")
    nw.add_argument("--dir", default=None, help="where to write NAME.py and test_NAME.py (default: the current "
                                                "directory)")

    _tune_parser(sub)
    _dispatch_parser(sub)
    _trace_parser(sub)

    rd = sub.add_parser("readme", help="regenerate the README's result tables from the committed results files")
    rd.add_argument("--check", action="store_true", help="exit 1 when a table differs from its results file")
    rd.add_argument("--readme", default=None, help="the file to rewrite (default: README.md of the repository)")
    return ap


def _shape_options(sp):
    sp.add_argument("--batch", "-B", type=int)
    sp.add_argument("--heads", "-H", type=int)
    sp.add_argument("--kv-heads", type=int)
    sp.add_argument("--q-len", "-N", type=int, help="query length (and kv length unless --kv-len)")
    sp.add_argument("--kv-len", type=int)
    sp.add_argument("--head-dim", "-D", type=int)
    sp.add_argument("--causal", action="store_true")
    sp.add_argument("--dtype", type=_dtype_arg, metavar="DTYPE",
                    help="float32 (fp32), float16 (fp16) or bfloat16 (bf16)")
    sp.add_argument("--scale", type=float)
    sp.add_argument("--e4m3-inputs", action="store_true",
                    help="q, k, v given as e4m3 codes with per-head scales (spec/fp8_inputs.py), --dtype the output's "
                         "(default bfloat16): only the phases that read codes run them (fp8_ws, fp8_overlap)")


def _allow_slow_option(sp):
    sp.add_argument("--allow-slow", action="store_true",
                    help="simulator: run rows estimated to take over a minute (else they are SKIP rows whose "
                         "reason gives the estimate and a shape that fits; also NUMBA_ATTN_ALLOW_SLOW=1)")


def _dtype_arg(text: str) -> str:
    """``--dtype``: a canonical name or the short one the tables print (fp16 → float16)."""
    from numba_attn.spec.errors import AttentionInputError, canonical_dtype

    try:
        return canonical_dtype(text)
    except AttentionInputError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("dtype ")) from None


def _trace_parser(sub):
    tr = sub.add_parser("trace", help="where a warp-specialized Hopper phase's time goes between its tiles: its work "
                                      "items' steps stamped in one call (Q, first K, tile loop, epilogue, gaps), a summary "
                                      "and a picture")
    tr.add_argument("phase", help="a phase with a producer warpgroup (warp_specialized_tc, ws_intra and children)")
    be = tr.add_mutually_exclusive_group()
    be.add_argument("--simulator", action="store_true", help="use the Numba CUDA simulator (CPU)")
    be.add_argument("--gpu", action="store_true", help="require a real CUDA GPU")
    _shape_options(tr)
    tr.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="override one of the phase's parameters, e.g. Bc=64 (repeatable)")
    tr.add_argument("--preset", action="append", default=[], help="named problem set (repeatable), as for run")
    tr.add_argument("--out", default=".", help="directory for <phase>-<problem>.png and .json.gz (default: here)")
    tr.add_argument("--sms", type=int, default=8, help="SMs drawn (default 8)")
    _common(tr)


def _tune_parser(sub):
    t = sub.add_parser("tune", help="measure a phase's parameter space on problems; keep the best in the tuning cache")
    t.add_argument("phases", nargs="?", help="comma-separated phase names")
    t.add_argument("--show", action="store_true", help="print the tuning cache and exit")
    be = t.add_mutually_exclusive_group()
    be.add_argument("--simulator", action="store_true", help="use the Numba CUDA simulator (CPU)")
    be.add_argument("--gpu", action="store_true", help="require a real CUDA GPU")
    t.add_argument("--preset", action="append", default=[], help="named problem set (repeatable), as for run")
    _shape_options(t)
    t.add_argument("--budget", default=None, dest="tune_budget",
                   help="configurations per (phase, problem), e.g. 40, or seconds in all, e.g. 30s (default: all)")
    t.add_argument("--strategy", choices=["grid", "random", "bayes"], default="grid",
                   help="grid: declared order; random: seeded shuffle; bayes: Optuna TPE (extra 'tune')")
    _parallel_options(t, "default: one per visible GPU; 1 in the simulator")
    t.add_argument("--cache", default=None, help="tuning cache (default: $NUMBA_ATTN_TUNING_CACHE or "
                                                 "<results dir>/tuning-cache.json)")
    t.add_argument("--results", default=None, help="JSON-lines results file (default: <results dir>/tune-<gpu>.jsonl)")
    t.add_argument("--seed", type=int, default=0, help="seed of the random and bayes strategies")
    t.add_argument("--space", action="append", default=[], metavar="PHASE.NAME=V1,V2",
                   help="replace the declared values of one parameter (repeatable)")
    t.add_argument("--param", action="append", default=[], metavar="PHASE.NAME=VALUE",
                   help="pin a parameter (not tuned; repeatable)")
    t.add_argument("--seeds", default="1,2", help="comma-separated input seeds for the correctness check")
    _timeout_and_timing(t, "seconds per candidate before it is recorded TIMEOUT (default 600 on a GPU, 1800 in "
                           "the simulator; 0 = in-process, only with one worker)",
                        "how candidates are timed (default on a GPU: graph, CUDA graph replay for every "
                        "candidate, so all are compared by one method; events switches a row to graph replay "
                        "when it is launch-bound, which mixes methods among short kernels; cupti: the "
                        "kernels' own durations)")
    t.add_argument("--timing-budget", type=float, default=1.0, help="seconds of timing per candidate (GPU)")
    t.add_argument("--resume", action="store_true", help="skip candidates already measured in the results file")
    _common(t)


def _dispatch_parser(sub):
    dp = sub.add_parser("dispatch", help="build or show the dispatch table phase=None reads "
                                         "(numba_attn/data/dispatch.json)")
    what = dp.add_mutually_exclusive_group(required=True)
    what.add_argument("--build", action="store_true",
                      help="build it from results files (and a tuning cache), write it to --out, print it")
    what.add_argument("--show", action="store_true", help="print it")
    what.add_argument("--check", action="store_true",
                      help="exit 1 when the package's table differs from a build from the committed results")
    dp.add_argument("--results", nargs="+", default=None, metavar="FILE",
                    help="results files (JSON lines; glob patterns allowed; default: the committed results/*.jsonl)")
    dp.add_argument("--cache", default=None, metavar="PATH",
                    help="also the timed entries of this tuning cache (default: none, so the committed table "
                         "depends on committed files only)")
    dp.add_argument("--out", default=None, metavar="PATH",
                    help="the table to write (default: numba_attn/data/dispatch.json of the package)")
    dp.add_argument("--table", default=None, metavar="PATH",
                    help="with --show: the table to print (default: $NUMBA_ATTN_DISPATCH_TABLE, else the package's)")


def _parallel_options(sp, default):
    sp.add_argument("--workers", type=int, default=None,
                    help=f"worker processes measuring rows side by side, each pinned to its own GPU "
                         f"(CUDA_VISIBLE_DEVICES: the i-th worker the i-th visible GPU; {default})")
    sp.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                    help="measure the rows on a Ray cluster, one actor per GPU (extra 'ray': pip install -e "
                         "\".[ray]\"); ADDRESS: the cluster's (default: auto, a local one when none runs); "
                         "--workers: how many actors (default: one per GPU of the cluster)")
    sp.add_argument("--allow-mixed", action="store_true",
                    help="allow workers (or Ray actors) on different GPU models in one sweep")
    sp.add_argument("--oversubscribe", action="store_true",
                    help="allow more local workers than visible GPUs (they share GPUs round-robin)")


def _timeout_and_timing(sp, timeout_help: str, timing_help: str):
    """``--timeout`` (seconds per row) and ``--timing`` (events, graph or cupti)."""
    sp.add_argument("--timeout", type=float, default=None, help=timeout_help)
    sp.add_argument("--timing", choices=["events", "graph", "cupti"], default=None, help=timing_help)


def _regime_options(sp):
    """``--regime`` and ``--rounds``: how a problem's phases and peers share one regime (measure/regime.py)."""
    sp.add_argument("--regime", choices=["interleaved", "standalone"], default="interleaved",
                    help="interleaved (default): each problem's timed phases and peers are timed again in "
                         "interleaved rounds (every one once a round, the order rotated, the same warm-up, calls "
                         "and method), a row's time the median over its rounds; standalone: each row's own "
                         "timing only, one row after the other (the runner before 2026-11-28)")
    sp.add_argument("--rounds", type=int, default=5, help="interleaved rounds per problem (default 5)")


def _common(sp):
    sp.add_argument("--setup", action="append", default=[], metavar="MODULE[:FUNCTION]",
                    help="import MODULE (and call FUNCTION) first, here and in worker processes: "
                         "registers out-of-tree phases (repeatable); MODULE may be a .py file or a "
                         "directory of them (e.g. --setup my_phase.py)")


def check_ranges(args):
    """Refuse out-of-range sizes with the argument's name before anything runs."""
    for flag, attr, lo in (("--batch", "batch", 1), ("--heads", "heads", 1), ("--kv-heads", "kv_heads", 1),
                           ("--q-len", "q_len", 1), ("--kv-len", "kv_len", 1), ("--head-dim", "head_dim", 1)):
        val = getattr(args, attr, None)
        if val is not None and val < lo:
            raise SystemExit(f"{flag} must be >= {lo}, got {val}")
    if getattr(args, "budget", None) is not None and args.budget <= 0:
        raise SystemExit(f"--budget must be > 0 seconds, got {args.budget}")
    check_seconds(args)


def check_timing(method, be):
    """``--timing graph|cupti`` is refused where it cannot be honoured, before any row runs: in the
    simulator nothing is timed, and kernel time needs PyTorch's profiler and a GPU it sees."""
    if method in (None, "events"):
        return
    if be.IS_SIMULATOR:
        needs = "kernel time needs a GPU and PyTorch" if method == "cupti" else "graph replay needs a GPU"
        raise SystemExit(f"--timing {method}: the simulator times nothing (rows are checked, not timed); {needs}")
    if method == "cupti":
        from numba_attn.measure.timing import cupti_status

        why = cupti_status()
        if why:
            raise SystemExit(f"--timing cupti: {why}")


def check_seconds(args):
    """--timeout (0: no limit, in-process) and --max-total: finite numbers of seconds >= 0."""
    from numba_attn.spec.errors import check_positive_float

    for flag, attr in (("--timeout", "timeout"), ("--max-total", "max_total")):
        val = getattr(args, attr, None)
        if val is not None:
            check_positive_float(f"{flag} (seconds; 0: no limit)", val, allow_zero=True)
    if getattr(args, "rounds", None) is not None and args.rounds < 1:  # (run and bench)
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")


def problems_of(args):
    from numba_attn.spec.problem import PRESETS, Problem

    check_ranges(args)

    shape_given = any(getattr(args, a) is not None for a in
                      ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype", "scale")) or args.causal \
        or getattr(args, "e4m3_inputs", False)
    problems = []
    for name in args.preset:
        if name not in PRESETS:
            raise SystemExit(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        problems += PRESETS[name]
    if shape_given or not problems:
        base = Problem() if shape_given else None
        if base is None:
            return problems or PRESETS["tiny"], not problems
        kw = {}
        for a in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype", "scale"):
            if getattr(args, a) is not None:
                kw[a] = getattr(args, a)
        kw.setdefault("q_len", 128)
        if args.causal:
            kw["causal"] = True
        if getattr(args, "e4m3_inputs", False):
            kw.setdefault("dtype", "bfloat16")
        problems.append(Problem(**kw))
    if getattr(args, "e4m3_inputs", False):
        if getattr(args, "cmd", "run") != "run":
            raise SystemExit(f"--e4m3-inputs: `numba-attn run` takes it ({args.cmd} does not yet)")
        problems = [e4m3_twin(p) for p in problems]
    return problems, False


def e4m3_twin(p):
    """``--e4m3-inputs``: the problem with its q, k, v as e4m3 codes (its dtype the output's)."""
    import dataclasses

    from numba_attn.spec.fp8_inputs import Fp8InputProblem
    from numba_attn.spec.problem import Problem

    if type(p) is not Problem or p.variant is not None:
        raise SystemExit(f"--e4m3-inputs: {p.label} is not a plain contiguous problem")
    if p.dtype == "float32":
        raise SystemExit(f"--e4m3-inputs: {p.label}: the output's dtype must be float16 or bfloat16")
    return Fp8InputProblem(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})


def params_of(args):
    from numba_attn.spec.errors import parse_param_value

    out: dict = {}
    for item in args.param:
        m = re.fullmatch(r"([\w-]+)\.(\w+)=(.+)", item)
        if not m:
            raise SystemExit(f"--param {item!r}: expected PHASE.NAME=VALUE, e.g. smem_kv.Bc=64")
        ph, key, val = m.groups()
        out.setdefault(ph, {})[key] = parse_param_value(val)
    return out


def seeds_of(text: str) -> tuple:
    from numba_attn.spec.errors import parse_seeds

    return parse_seeds(text)  # integers >= 0, at least one


def nothing_chosen(args) -> bool:
    """No problem, preset or shape on the command line."""
    return not args.preset and not args.causal and all(
        getattr(args, a) is None for a in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype",
                                           "scale"))


def peers_of(text):
    """``--peers``: comma-separated names of measure.peers.ALL_PEERS and ALL_BACKWARD_PEERS (None: the default
    set, SDPA's)."""
    if not text:
        return None
    from numba_attn.measure.peers import ALL_BACKWARD_PEERS, ALL_PEERS

    peer_list = tuple(x.strip() for x in text.split(",") if x.strip())
    for x in peer_list:
        if x not in ALL_PEERS + ALL_BACKWARD_PEERS:
            raise SystemExit(f"unknown peer {x!r}; peers: {', '.join(ALL_PEERS)}; of a backward run: "
                             f"{', '.join(ALL_BACKWARD_PEERS)}")
    return peer_list


# ``run`` options that the roadmap benchmark (``run`` on a GPU without a problem) does not take: it
# measures the default parameters with every peer, the ceilings, its own seeds, timing budget and baseline
ROADMAP_REFUSES = (("--param", "param", []), ("--peers", "peers", None), ("--no-peers", "no_peers", False),
                   ("--seeds", "seeds", None), ("--budget", "budget", None), ("--no-ceilings", "no_ceilings", False),
                   ("--baseline", "baseline", None), ("--timing", "timing", None))


def refuse_for_roadmap(args):
    """Refuse the options the roadmap path would otherwise ignore (it takes --phases, --results, --timeout,
    --resume, --csv and --setup)."""
    given = [flag for flag, attr, unset in ROADMAP_REFUSES if getattr(args, attr) != unset]
    if given:
        raise SystemExit(f"{', '.join(given)}: without a problem, run on a GPU is the roadmap benchmark "
                         f"(numba-attn bench roadmap), which measures the default parameters with its own seeds, "
                         f"timing, baseline, peers and ceilings; give a problem (-N ..., --preset ...) to use "
                         f"{'them' if len(given) > 1 else 'it'}")
