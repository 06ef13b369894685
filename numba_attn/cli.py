"""The ``numba-attn`` command line (the backend is chosen from the arguments before numba is
imported, which is why this module imports the rest of the package lazily)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

_T0 = time.perf_counter()  # when the command started (this module is imported first)


DESCRIPTION = """\
Prototype GPU attention kernels with Numba, one measurable optimization at a time.

  numba-attn list                      the registered phases in roadmap order
  numba-attn run [options]             check (and on a GPU time) phases on problems; without a
                                       problem: every phase on a small problem set (simulator) or
                                       the roadmap benchmark (GPU)
  numba-attn bench NAME                a declared benchmark (roadmap, long-context, decode, paged, varlen):
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


def _version() -> str:
    from numba_attn import __version__

    return f"numba-attn {__version__}"


def _parser() -> argparse.ArgumentParser:
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
    r.add_argument("--timeout", type=float, default=None,
                   help="seconds per (phase, problem) before it is recorded TIMEOUT "
                        "(default 600 on a GPU, 1800 in the simulator, the roadmap benchmark's 180 without a "
                        "problem on a GPU; 0 = no limit, in-process)")
    r.add_argument("--budget", type=float, default=None,
                   help=f"seconds of timing per row (GPU; default {DEFAULT_BUDGET_S:g})")
    r.add_argument("--timing", choices=["events", "graph", "cupti"], default=None,
                   help="which method gives the time column (GPU): events = CUDA events around back-to-back "
                        "launches (the default); graph = CUDA graph replay; cupti = the kernels' own durations "
                        "from CUPTI through torch.profiler (needs PyTorch; phases and SDPA measured the same "
                        "way: use it for published ratios). The events time is kept and compared")
    r.add_argument("--no-peers", action="store_true", help="do not run PyTorch SDPA as a peer")
    r.add_argument("--peers", default=None, help="comma-separated peer names (default: all)")
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
    b.add_argument("--timeout", type=float, default=None,
                   help="seconds per row before TIMEOUT (default: the benchmark's; 0 = no limit, in-process)")
    b.add_argument("--max-total", type=float, default=None,
                   help="seconds after which remaining rows are SKIP (default: the benchmark's limit)")
    b.add_argument("--timing", choices=["events", "graph", "cupti"], default=None,
                   help="how phases and peers are timed (default: the benchmark's, events; cupti: the kernels' "
                        "own durations, through torch.profiler)")
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
                    help="with --all: exit 1 when the files under --out (default docs/phases/) differ from a regeneration")
    _common(cd)

    nw = sub.add_parser("new", help="your own phase: NAME.py, a copy of PARENT's module registered as NAME, "
                                    "and test_NAME.py")
    nw.add_argument("name", metavar="NAME", help="the new phase's name (a Python identifier)")
    nw.add_argument("--from", dest="parent", required=True, metavar="PARENT", help="the phase to start from")
    nw.add_argument("--dir", default=None, help="where to write NAME.py and test_NAME.py (default: the current "
                                                "directory)")

    _tune_parser(sub)
    _dispatch_parser(sub)

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
    t.add_argument("--timeout", type=float, default=None,
                   help="seconds per candidate before it is recorded TIMEOUT (default 600 on a GPU, 1800 in the "
                        "simulator; 0 = in-process, only with one worker)")
    t.add_argument("--timing-budget", type=float, default=1.0, help="seconds of timing per candidate (GPU)")
    t.add_argument("--timing", choices=["events", "graph", "cupti"], default=None,
                   help="how candidates are timed (default on a GPU: graph, CUDA graph replay for every "
                        "candidate, so all are compared by one method; events switches a row to graph replay "
                        "when it is launch-bound, which mixes methods among short kernels; cupti: the "
                        "kernels' own durations)")
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


def _check_ray(args) -> bool:
    """False (after saying how to install it) when --ray is given and Ray is not installed."""
    if getattr(args, "ray", None) is None:
        return True
    from numba_attn.measure import distributed

    if distributed.available():
        return True
    print(f"numba-attn: {distributed.INSTALL_HINT}", file=sys.stderr)
    return False


def _worker_pool(args, default=None):
    """``(workers, make_worker)`` of --workers / --ray: a Ray pool, or a started
    :class:`~numba_attn.measure.parallel.LocalPool` (one GPU per worker); ``(default, None)`` when
    neither is given (None: one after the other, as without these options)."""
    if args.ray is not None:
        from numba_attn.measure import distributed

        try:
            pool = distributed.RayPool(args.ray, args.workers, allow_mixed=args.allow_mixed, setup=tuple(args.setup))
        except RuntimeError as exc:
            raise SystemExit(f"--ray: {exc}") from None
        print(f"ray: {pool.describe()}", flush=True)
        return pool.size, pool.make_worker
    n = args.workers if args.workers is not None else default
    if n is None:
        return None, None
    if n < 1:
        raise SystemExit(f"--workers must be >= 1, got {n}")
    if args.workers is None and n == 1:
        return 1, None
    from numba_attn.measure.parallel import LocalPool

    try:
        pool = LocalPool(n, tuple(args.setup), oversubscribe=args.oversubscribe, allow_mixed=args.allow_mixed)
        pool.start()
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(str(exc)) from None
    print(f"workers: {pool.describe()}", flush=True)
    return n, pool.make_worker


SIM_WORKERS_MAX = 4  # simulator rows are CPU-bound: one worker process per core, at most this many


def _simulator_workers(be, phases, problems) -> int | None:
    """The simulator's default --workers: one process per available core (at most ``SIM_WORKERS_MAX``) when the
    run has rows enough to share (every phase, or at least as many rows as workers); None on a GPU, where rows
    run one after another unless --workers says otherwise (they would share one GPU's clock and memory)."""
    if not be.IS_SIMULATOR:
        return None
    from numba_attn.measure.parallel import available_cpus

    n = min(len(available_cpus()), SIM_WORKERS_MAX)
    rows = None if phases is None else len(phases) * max(len(problems), 1)
    if n < 2 or (rows is not None and rows < n):
        return None
    return n


def _common(sp):
    sp.add_argument("--setup", action="append", default=[], metavar="MODULE[:FUNCTION]",
                    help="import MODULE (and call FUNCTION) first, here and in worker processes: "
                         "registers out-of-tree phases (repeatable); MODULE may be a .py file or a "
                         "directory of them (e.g. --setup my_phase.py)")


def _select_backend(args):
    """The backend of ``--simulator`` / ``--gpu`` (else $NUMBA_ATTN_BACKEND or auto). A process chooses its
    backend once, before numba is imported: when ``main()`` runs in a process that has chosen the other one
    already (a test, a notebook), the flag is refused rather than ignored, and the environment is left
    alone (worker processes inherit it and must run the backend of this process)."""
    flag = "--simulator" if getattr(args, "simulator", False) else "--gpu" if getattr(args, "gpu", False) else None
    want = {"--simulator": "simulator", "--gpu": "cuda"}.get(flag)
    if want is not None and "numba_attn.gpu.backend" not in sys.modules:
        os.environ["NUMBA_ATTN_BACKEND"] = want
    from numba_attn.gpu import backend

    if want is not None and backend.BACKEND != want:
        if want == backend.CUDA and not backend.gpu_present():
            raise SystemExit("--gpu: no CUDA GPU is available")
        raise SystemExit(f"{flag}: this process already runs the {backend.BACKEND} backend (chosen once, before "
                         f"numba is imported); leave {flag} out, or run numba-attn in a new process")
    return backend


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def _check_ranges(args):
    """Refuse out-of-range sizes with the argument's name before anything runs."""
    for flag, attr, lo in (("--batch", "batch", 1), ("--heads", "heads", 1), ("--kv-heads", "kv_heads", 1),
                           ("--q-len", "q_len", 1), ("--kv-len", "kv_len", 1), ("--head-dim", "head_dim", 1)):
        val = getattr(args, attr, None)
        if val is not None and val < lo:
            raise SystemExit(f"{flag} must be >= {lo}, got {val}")
    if getattr(args, "budget", None) is not None and args.budget <= 0:
        raise SystemExit(f"--budget must be > 0 seconds, got {args.budget}")
    _check_seconds(args)


def _check_timing(method, be):
    """``--timing graph|cupti`` is refused where it cannot be honoured, before any row runs: in the
    simulator nothing is timed, and kernel time needs PyTorch's profiler and a GPU it sees."""
    if method in (None, "events"):
        return
    if be.IS_SIMULATOR:
        raise SystemExit(f"--timing {method}: the simulator times nothing (rows are checked, not timed); "
                         f"{'kernel time needs a GPU and PyTorch' if method == 'cupti' else 'graph replay needs a GPU'}")
    if method == "cupti":
        from numba_attn.measure.timing import cupti_status

        why = cupti_status()
        if why:
            raise SystemExit(f"--timing cupti: {why}")


def _check_seconds(args):
    """--timeout (0: no limit, in-process) and --max-total: finite numbers of seconds >= 0."""
    from numba_attn.spec.errors import check_positive_float

    for flag, attr in (("--timeout", "timeout"), ("--max-total", "max_total")):
        val = getattr(args, attr, None)
        if val is not None:
            check_positive_float(f"{flag} (seconds; 0: no limit)", val, allow_zero=True)


def _problems(args):
    from numba_attn.spec.problem import PRESETS, Problem

    _check_ranges(args)

    shape_given = any(getattr(args, a) is not None for a in
                      ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype", "scale")) or args.causal
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
        problems.append(Problem(**kw))
    return problems, False


def _params(args):
    from numba_attn.spec.errors import parse_param_value

    out: dict = {}
    for item in args.param:
        m = re.fullmatch(r"([\w-]+)\.(\w+)=(.+)", item)
        if not m:
            raise SystemExit(f"--param {item!r}: expected PHASE.NAME=VALUE, e.g. smem_kv.Bc=64")
        ph, key, val = m.groups()
        out.setdefault(ph, {})[key] = parse_param_value(val)
    return out


def _phase_file(phase) -> str:
    """The phase's module path relative to numba_attn/phases/ (e.g. ``cuda_core/p02_smem_kv.py``); a phase
    of your own: ``out of tree: <its file>``."""
    parts = phase.module.split(".")
    if parts[:2] == ["numba_attn", "phases"]:
        return "/".join(parts[2:]) + ".py"
    from numba_attn.userphases import shown_path

    try:
        return f"out of tree: {shown_path(phase.source_file) or phase.module}"
    except (TypeError, KeyError, OSError):
        return f"out of tree: {phase.module}"


def cmd_list(args) -> int:
    _select_backend(args)
    _run_setup(args.setup)
    from numba_attn.phases.registry import list_phases

    phases = list_phases(args.kind)
    hdr = ("order", "name", "parent", "kind", "plan", "dtypes", "file (numba_attn/phases/)", "title")
    rows = [(f"{p.order:g}", p.name, p.parent or "—", p.kind,
             f"{p.planned_speedup:g}x" if p.planned_speedup else "—", ",".join(p.dtypes), _phase_file(p), p.title)
            for p in phases]
    w = [max(len(x) for x in col) for col in zip(hdr, *rows)]
    print("  ".join(h.ljust(n) for h, n in zip(hdr, w)))
    print("  ".join("-" * n for n in w))
    for r in rows:
        print("  ".join(x.ljust(n) for x, n in zip(r, w)))
    from numba_attn.phases import BROKEN

    for mod, why in BROKEN.items():
        print(f"BROKEN phase module {mod}: {why}")
    print("\nFor a phase NAME: its lesson `numba-attn diff NAME`, its card `numba-attn card NAME` "
          "(docs/phases/NAME.md), its tests tests/test_phases.py and the family's tests (listed on the card).")
    if args.verbose:
        for p in phases:
            print(f"\n{p.name} (parent: {p.parent or '—'}; {p.lineage})\n  "
                  + p.description.replace("\n", "\n  ") + f"\n  params: {p.params}  source: {p.source_file}")
    return 0


class Progress:
    """One line per finished row (status, time or reason, ETA, the best phase so far); on a terminal
    also a live bar with the row in progress, elapsed time and ETA (through ``rich``)."""

    def __init__(self, stream=None, console=None):
        from numba_attn.report.table import make_console

        self.console = console or make_console(stream or sys.stderr)
        self.t0 = time.perf_counter()
        self.row_t0 = self.t0
        self.counts: dict = {}
        self.best: dict = {}  # problem label → (time_ms, phase)
        self.bar = None
        self.task = None
        self.beat = None  # the running row's heartbeat (a threading.Event that stops it)

    BEAT_FIRST_S, BEAT_EVERY_S = 5.0, 30.0  # a row running longer says so, then again every 30 s

    def _start_beat(self, i, n, name, problem):
        """A row that runs more than BEAT_FIRST_S seconds gets a line ``row i/n NAME PROBLEM: running for
        Ns`` (on a terminal: the live bar's description shows the row's elapsed time instead)."""
        import threading

        self._stop_beat()
        stop = self.beat = threading.Event()
        t0, w = self.row_t0, len(str(n))

        def loop():
            wait = self.BEAT_FIRST_S
            while not stop.wait(wait):
                el = time.perf_counter() - t0
                if self.bar is not None:
                    self.bar.update(self.task, description=f"{name} {problem.label} ({el:.0f}s)")
                    wait = 1.0
                else:
                    self.console.print(f"[{'row':>{w}} {i + 1:>{w}}/{n}] {name} {problem.label}: running for {el:.0f}s",
                                       markup=False, highlight=False, soft_wrap=True)
                    wait = self.BEAT_EVERY_S

        threading.Thread(target=loop, daemon=True, name="numba-attn-row-progress").start()

    def _stop_beat(self):
        if self.beat is not None:
            self.beat.set()
            self.beat = None

    def _start_bar(self, n):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = Bar(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                       TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                       transient=True)
        self.task = self.bar.add_task("", total=n)
        self.bar.start()

    def close(self):
        self._stop_beat()
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def eta(self, done, n) -> str:
        el = time.perf_counter() - self.t0
        if done <= 0 or done >= n:
            return ""
        left = el / done * (n - done)
        return f"ETA {int(left // 60)}:{int(left % 60):02d}"

    def best_text(self, label) -> str:
        if label in self.best:
            ms, name = self.best[label]
            return f"best {name} {ms:.4g} ms"
        return " ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))

    def __call__(self, i, n, row, name, problem):
        el = time.perf_counter() - self.t0
        if problem is None:  # the ceilings
            self.console.print(f"[{el:6.1f}s] ceilings measured in {row.get('wall_s', 0):.1f}s", markup=False)
            return
        if row is None:
            self.row_t0 = time.perf_counter()
            if self.bar is None and self.console.is_terminal:
                self._start_bar(n)
            if self.bar is not None:
                self.bar.update(self.task, description=f"{name} {problem.label}")
            self._start_beat(i, n, name, problem)
            return
        self._stop_beat()
        st = row.get("status", "?")
        self.counts[st] = self.counts.get(st, 0) + 1
        extra = ""
        if row.get("time_ms"):
            extra = f"{row['time_ms']:.4f} ms"
            if st == "OK" and (problem.label not in self.best or row["time_ms"] < self.best[problem.label][0]):
                self.best[problem.label] = (row["time_ms"], name)
        elif row.get("reason") and st != "OK":
            extra = f"({row['reason'] if row.get('sim_estimate_s') else row['reason'][:100]})"  # (the shape that fits)
        if row.get("resumed"):
            extra += " (resumed)"
        w = len(str(n))
        note = " · ".join(x for x in (self.eta(i + 1, n), self.best_text(problem.label)) if x)
        style = {"OK": "green", "SKIP": "yellow"}.get(st, "bold red")
        from rich.markup import escape

        self.console.print(f"[{i + 1:>{w}}/{n} {el:6.1f}s] {escape(name):22s} {escape(problem.label):28s} "
                           f"[{style}]{st:7s}[/] {escape(extra)} [dim]({time.perf_counter() - self.row_t0:.1f}s"
                           f"{' · ' + note if note else ''})[/]", soft_wrap=True, highlight=False)
        if self.bar is not None:
            self.bar.update(self.task, completed=i + 1)


def _nothing_chosen(args) -> bool:
    """No problem, preset or shape on the command line."""
    return not args.preset and not args.causal and all(
        getattr(args, a) is None for a in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype",
                                           "scale"))


def _check_cuda(be):
    """Refuse a GPU run without a GPU or without the CUDA toolkit's NVVM, in one line each."""
    if not be.gpu_present():
        raise SystemExit("--gpu: no CUDA GPU is available")
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as exc:  # noqa: BLE001  (NvvmSupportError and friends)
        raise SystemExit(_nvvm_message(exc)) from None


def _nvvm_message(exc) -> str:
    return (f"the CUDA toolkit's NVVM (the compiler numba-cuda needs) was not found ({type(exc).__name__}). "
            "Install it with numba-cuda's extra matching the driver: pip install \"numba-cuda[cu12]>=0.30,<0.31\" "
            "(or [cu13]; or this package's extras: pip install -e \".[cu12]\").")


def _write_csv(path, rows):
    import csv

    from numba_attn.report.table import HEADER, cells

    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER + ["reason"])
        res = [r for r in rows if r.get("type") == "result"]
        for cells, r in zip(cells(res), res):
            w.writerow(cells + [r.get("reason", "") if r.get("status") != "OK" else ""])


def _list_presets():
    from numba_attn.measure.bench import DEFAULT_PROBLEMS
    from numba_attn.spec.problem import PRESETS

    print(f"{'default':17s} {'; '.join(p.label for p in DEFAULT_PROBLEMS)}  (numba-attn run without a problem in "
          "the simulator: each phase on the problems of its kind and dtype)")
    for name, probs in PRESETS.items():
        labels = "; ".join(p.label for p in probs)
        print(f"{name:17s} " + (labels if len(labels) < 160 else f"{len(probs)} problems: {labels[:150]} …"))
    return 0


def cmd_run(args) -> int:
    """``_cmd_run`` with the simulator counts asked for (``NUMBA_ATTN_SIM_COUNTS``, which worker processes inherit;
    an explicit ``NUMBA_ATTN_SIM_COUNTS=0`` wins over the default) for this run only."""
    before = os.environ.get("NUMBA_ATTN_SIM_COUNTS")
    if getattr(args, "counts", True):
        os.environ.setdefault("NUMBA_ATTN_SIM_COUNTS", "1")
    else:
        os.environ["NUMBA_ATTN_SIM_COUNTS"] = "0"
    try:
        return _cmd_run(args)
    finally:
        if before is None:
            os.environ.pop("NUMBA_ATTN_SIM_COUNTS", None)
        else:
            os.environ["NUMBA_ATTN_SIM_COUNTS"] = before


def _cmd_run(args) -> int:
    if args.list_presets:
        return _list_presets()
    if args.explain_columns:
        from numba_attn.report.table import explain_columns

        print(explain_columns())
        return 0
    be = _select_backend(args)
    if args.gpu:
        _check_cuda(be)
    from numba_attn.report import table as report
    from numba_attn.measure import bench
    from numba_attn.measure.config import RunConfig, default_results_dir
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.sweep import run
    from numba_attn.measure.timing import TimingConfig

    want_default = "default" in args.preset
    args.preset = [p for p in args.preset if p != "default"]
    nothing = _nothing_chosen(args)
    roadmap = nothing and not want_default and not be.IS_SIMULATOR
    # every argument is checked here, before either path (the roadmap benchmark or the rows) runs anything
    _check_ranges(args)
    problems, _ = _problems(args) if args.preset or not nothing else ([], True)
    if want_default or (nothing and be.IS_SIMULATOR):
        problems = list(bench.DEFAULT_PROBLEMS) + problems
    _run_setup(args.setup)
    phases = [p.strip() for p in args.phases.split(",")] if args.phases else None
    from numba_attn.phases.registry import get_phase

    if phases:
        for p in phases:
            get_phase(p)  # unknown names fail here, with suggestions
    baseline = args.baseline if args.baseline is not None else "naive"
    get_phase(baseline)  # --baseline: a phase name
    params = _params(args)
    for name, over in params.items():
        get_phase(name).resolve_params(over)  # unknown phases, parameters and bad values fail here, before any launch
    seeds = _seeds(args.seeds if args.seeds is not None else "1,2")
    peer_list = _peer_list(args.peers)
    _check_timing(args.timing, be)
    if args.csv and os.path.isdir(args.csv):
        raise SystemExit(f"--csv {args.csv}: is a directory; give a file (e.g. table.csv)")
    if not _check_ray(args):
        return 2
    console = report.make_console()
    if roadmap:
        _refuse_for_roadmap(args)
        return _run_roadmap(args, be, phases, console)
    results = args.results or os.path.join(default_results_dir(), f"{_slug(gpu_info()['gpu'])}.jsonl")
    timeout = args.timeout if args.timeout is not None else (1800.0 if be.IS_SIMULATOR else 600.0)
    from numba_attn.measure.results import check_writable

    check_writable(results)  # a directory, a path that cannot be created: refused before any row
    cfg = RunConfig(seeds=seeds, params=params,
                    timeout_s=timeout or None, peers=not args.no_peers, results=results,
                    baseline=baseline, command="numba-attn " + " ".join(sys.argv[1:]),
                    timing=TimingConfig(budget_s=args.budget if args.budget is not None else DEFAULT_BUDGET_S,
                                        method=args.timing or "events"),
                    ceilings=not args.no_ceilings and not be.IS_SIMULATOR,
                    resume=args.resume, worker_setup=tuple(args.setup), peer_list=peer_list,
                    allow_slow=args.allow_slow,
                    # the default set's problems are the simulator's smallest that cover every phase's tiles
                    sim_limit_s=300.0 if want_default or (nothing and be.IS_SIMULATOR) else None)
    print(f"backend: {be.describe()}", flush=True)
    select = None
    if want_default or (nothing and be.IS_SIMULATOR):
        select = bench.select_by_kind(problems)
        print("no problem given: every phase on the problems of its kind and dtype (preset 'default': fp32 "
              "prefill, fp16 prefill for the tensor cores, decode at q_len 1 with GQA)"
              + (" in the simulator" if be.IS_SIMULATOR else ""), flush=True)
    print(f"problems: {'; '.join(p.label for p in problems)}", flush=True)
    workers, make_worker = _worker_pool(args, _simulator_workers(be, phases, problems))
    prog = Progress()
    try:
        rows = run(phases, problems, config=cfg, progress=prog, select=select, workers=workers,
                   make_worker=make_worker)
    finally:
        prog.close()
    return _finish(rows, results, be, console, args.csv)


def _finish(rows, results, be, console, csv_path=None, plots=()) -> int:
    from numba_attn.report import table as report

    console.print()
    report.print_table(rows, console)
    console.print(f"\nbackend: {be.describe()}", markup=False, soft_wrap=True)
    console.print(f"results appended to {results}", markup=False, soft_wrap=True)
    for f in plots:
        console.print(f"plot: {f}", markup=False, soft_wrap=True)
    if csv_path:
        _write_csv(csv_path, rows)
        console.print(f"table written to {csv_path}", markup=False, soft_wrap=True)
    bad = [r for r in rows if r.get("status") in ("FAIL", "ERROR", "TIMEOUT")]
    return 1 if bad else 0


def _peer_list(text):
    """``--peers``: comma-separated names of measure.peers.PEERS (None: all)."""
    if not text:
        return None
    from numba_attn.measure.peers import PEERS

    peer_list = tuple(x.strip() for x in text.split(",") if x.strip())
    for x in peer_list:
        if x not in PEERS:
            raise SystemExit(f"unknown peer {x!r}; peers: {', '.join(PEERS)}")
    return peer_list


# ``run`` options that the roadmap benchmark (``run`` on a GPU without a problem) does not take: it
# measures the default parameters with every peer, the ceilings, its own seeds, timing budget and baseline
ROADMAP_REFUSES = (("--param", "param", []), ("--peers", "peers", None), ("--no-peers", "no_peers", False),
                   ("--seeds", "seeds", None), ("--budget", "budget", None), ("--no-ceilings", "no_ceilings", False),
                   ("--baseline", "baseline", None), ("--timing", "timing", None))


def _refuse_for_roadmap(args):
    """Refuse the options the roadmap path would otherwise ignore (it takes --phases, --results, --timeout,
    --resume, --csv and --setup)."""
    given = [flag for flag, attr, unset in ROADMAP_REFUSES if getattr(args, attr) != unset]
    if given:
        raise SystemExit(f"{', '.join(given)}: without a problem, run on a GPU is the roadmap benchmark "
                         f"(numba-attn bench roadmap), which measures the default parameters with its own seeds, "
                         f"timing, baseline, peers and ceilings; give a problem (-N ..., --preset ...) to use "
                         f"{'them' if len(given) > 1 else 'it'}")


def _run_roadmap(args, be, phases, console) -> int:
    """``numba-attn run`` on a GPU without a problem: the roadmap benchmark, into the results dir."""
    from numba_attn.measure import bench
    from numba_attn.measure.config import default_results_dir
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.results import check_writable

    out_dir = os.path.dirname(args.results) if args.results else default_results_dir()
    results = args.results or os.path.join(out_dir, f"roadmap-{_slug(gpu_info()['gpu'])}.jsonl")
    check_writable(results)  # a directory, a path that cannot be created: refused before any row
    print(f"backend: {be.describe()}", flush=True)
    print("no problem given: the roadmap benchmark (numba-attn bench roadmap: every prefill phase and SDPA, "
          "fp32 and fp16, a few minutes)", flush=True)
    workers, make_worker = _worker_pool(args)
    prog = Progress()
    try:
        rows, results, files = bench.run_benchmark(
            "roadmap", results=results, plots_dir=out_dir or ".", phases=phases, progress=prog,
            timeout_s=args.timeout, resume=args.resume, command="numba-attn " + " ".join(sys.argv[1:]),
            setup=args.setup, workers=workers, make_worker=make_worker, allow_slow=args.allow_slow)
    finally:
        prog.close()
    return _finish(rows, results, be, console, args.csv, files)


def _seeds(text: str) -> tuple:
    from numba_attn.spec.errors import parse_seeds

    return parse_seeds(text)  # integers >= 0, at least one


def _run_setup(specs):
    """Run the --setup specs here; a relative file or directory becomes absolute in ``specs`` (worker
    processes, Ray actors, may start in another directory)."""
    from numba_attn.measure.isolation import call_setup
    from numba_attn.userphases import absolute_setup

    for i, spec in enumerate(specs):
        try:
            call_setup(spec)
        except Exception as exc:  # noqa: BLE001
            raise SystemExit(f"--setup {spec!r} failed: {type(exc).__name__}: {exc}") from None
        specs[i] = absolute_setup(spec)


def cmd_bench(args) -> int:
    from numba_attn.measure import bench

    if not args.name:
        for b in bench.BENCHMARKS.values():
            print(f"{b.name:13s} {b.description}")
        return 0
    be = _select_backend(args)
    from numba_attn.report import table as report

    _check_seconds(args)
    _run_setup(args.setup)
    b = bench.get(args.name)  # unknown names fail here
    problems = None
    if args.preset:
        from numba_attn.spec.problem import PRESETS

        problems = []
        for name in args.preset:
            if name not in PRESETS:
                raise SystemExit(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
            problems += PRESETS[name]
    phases = [p.strip() for p in args.phases.split(",")] if args.phases else None
    _check_timing(args.timing, be)
    if not _check_ray(args):
        return 2
    print(f"backend: {be.describe()}", flush=True)
    print(f"benchmark {b.name}: {b.description}", flush=True)
    workers, make_worker = _worker_pool(args)
    prog = Progress()
    try:
        rows, results, files = bench.run_benchmark(
            b.name, results=args.results, phases=phases, quick=args.quick,
            plots_dir=bench.BESIDE_RESULTS if args.plots is None else (args.plots or None),
            resume=args.resume, progress=prog, timeout_s=args.timeout, max_total_s=args.max_total,
            command="numba-attn " + " ".join(sys.argv[1:]), setup=args.setup, problems=problems,
            workers=workers, make_worker=make_worker, timing_method=args.timing, allow_slow=args.allow_slow)
    finally:
        prog.close()
    return _finish(rows, results, be, report.make_console(), plots=files)


def cmd_compare(args) -> int:
    from numba_attn.report.compare import compare, compare_within, format_comparison

    within = args.parent or args.phases
    if bool(within) == bool(args.b):
        raise SystemExit("compare A B (two files), or compare FILE --parent / --phases P,Q (within one file)")
    for path in (args.a, args.b) if args.b else (args.a,):
        if not os.path.exists(path):
            raise SystemExit(f"no such results file: {path}")
    if within:
        pair = None
        if args.phases:
            pair = tuple(x.strip() for x in args.phases.split(","))
            if len(pair) != 2 or not all(pair):
                raise SystemExit(f"--phases takes two phase names, P,Q (got {args.phases!r})")
        print(format_comparison(compare_within(args.a, pair), args.a))
        return 0
    print(format_comparison(compare(args.a, args.b), args.a, args.b))
    return 0


def cmd_plot(args) -> int:
    from numba_attn.report.plots import PLOTS, headline, make_all

    if args.headline:
        files = headline(args.out or "plots", results_dir=args.results, gpu=args.gpu)
        if not files:
            print(f"nothing to plot: no results files for {args.gpu} with a phase and SDPA in the same run")
        for f in files:
            print(f)
        return 0 if files else 1
    if not args.results:
        raise SystemExit("numba-attn plot RESULTS: a results file (or --headline)")
    if not os.path.exists(args.results):
        raise SystemExit(f"no such results file: {args.results}")
    which = PLOTS
    if args.which:
        which = tuple(w.strip() for w in args.which.split(","))
        for w in which:
            if w not in PLOTS:
                raise SystemExit(f"unknown plot {w!r}; plots: {', '.join(PLOTS)}")
    out = args.out if args.out is not None else _plots_default(args.results)
    files = make_all(args.results, out, prefix=args.prefix, which=which)
    if not files:
        print("nothing to plot: the file has no timed rows, nor a phase counted beside its parent (a simulator "
              "run counts each row's launch: the counts plot)")
    for f in files:
        print(f)
    return 0


def _plots_default(results: str) -> str:
    """Where ``plot`` writes without --out: beside the results file, unless that file lies in this checkout
    (a committed results/*.jsonl): then in the per-user results dir, so that no command writes into the checkout."""
    from numba_attn.measure.config import default_results_dir
    from numba_attn.report.records import ROOT

    here, root = os.path.dirname(os.path.realpath(results)), os.path.realpath(ROOT)
    inside = here == root or here.startswith(root + os.sep)
    return os.path.realpath(default_results_dir()) if inside else here


def cmd_diff(args) -> int:
    _select_backend(args)
    _run_setup(args.setup)
    from numba_attn.report.diff import phase_diff, phase_diff_stat

    sys.stdout.write(phase_diff_stat(args.phase, code=args.code) if args.stat
                     else phase_diff(args.phase, args.context, code=args.code))
    return 0


def cmd_card(args) -> int:
    _select_backend(args)
    _run_setup(args.setup)
    from numba_attn.report import cards

    if args.all:
        out = args.out or cards.OUT_DIR
        if args.check:
            bad = cards.check_all(out)
            for path in bad:
                print(f"{path}: differs from its regeneration (numba-attn card --all --out {out})", file=sys.stderr)
            return 1 if bad else 0
        for path in cards.write_all(out):
            print(path)
        return 0
    if not args.phase:
        raise SystemExit("card: give a phase name, or --all")
    sys.stdout.write(cards.card(args.phase))
    return 0


def cmd_new(args) -> int:
    _select_backend(args)
    from numba_attn.userphases import new_phase

    sys.stdout.write(new_phase(args.name, from_=args.parent, dir=args.dir).summary())
    return 0


def cmd_readme(args) -> int:
    _select_backend(args)
    from numba_attn.report import readme

    return readme.run(args.readme, args.check)


def cmd_tune(args) -> int:
    if args.show:
        from numba_attn.measure.tune import TuningCache

        print(TuningCache(args.cache).format())
        return 0
    if not args.phases:
        raise SystemExit("tune: give phase names (PHASE[,PHASE...]), or --show")
    be = _select_backend(args)
    if args.gpu:
        _check_cuda(be)
    from numba_attn.measure import tune as tuning
    from numba_attn.measure.config import RunConfig, default_results_dir
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.results import check_writable
    from numba_attn.measure.timing import TimingConfig
    from numba_attn.phases.registry import get_phase

    if not _check_ray(args):
        return 2
    _run_setup(args.setup)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    for p in phases:
        get_phase(p)
    from numba_attn.spec.errors import parse_param_value

    fixed = _params(args)
    space = {}
    for item in args.space:
        m = re.fullmatch(r"([\w-]+)\.(\w+)=(.+)", item)
        if not m:
            raise SystemExit(f"--space {item!r}: expected PHASE.NAME=V1,V2, e.g. smem_kv.Bc=16,32")
        ph, key, vals = m.groups()
        space.setdefault(ph, {})[key] = [parse_param_value(v) for v in vals.split(",")]
    for name, sp in space.items():  # the named phase's other parameters keep their declared values
        space[name] = {**{k: v for k, v in get_phase(name).space.items()}, **sp}
    tuning.parse_budget(args.tune_budget)  # a bad --budget fails here
    if args.strategy == "bayes":
        try:
            import optuna  # noqa: F401
        except ImportError:
            print(f"numba-attn: {tuning.OPTUNA_HINT}", file=sys.stderr)
            return 2
    problems, _ = _problems(args)
    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    _check_timing(args.timing, be)
    results = args.results or os.path.join(default_results_dir(), f"tune-{_slug(gpu_info()['gpu'])}.jsonl")
    check_writable(results)
    timeout = args.timeout if args.timeout is not None else (1800.0 if be.IS_SIMULATOR else 600.0)
    workers, make_worker = _worker_pool(args, 1 if be.IS_SIMULATOR or args.ray is not None else _visible_gpus())
    cfg = RunConfig(seeds=_seeds(args.seeds), timeout_s=timeout or None, peers=False, results=results,
                    command="numba-attn " + " ".join(sys.argv[1:]),
                    timing=TimingConfig(budget_s=args.timing_budget, method=args.timing or tuning.default_timing()),
                    resume=args.resume, worker_setup=tuple(args.setup))
    print(f"backend: {be.describe()}", flush=True)
    print(f"problems: {'; '.join(p.label for p in problems)}", flush=True)
    prog = TuneProgress()
    stages: dict = {}
    t_tune = time.perf_counter()
    try:
        out = tuning.tune(phases, problems, config=cfg, budget=args.tune_budget, strategy=args.strategy,
                          workers=workers, cache=args.cache, seed=args.seed, space=space, fixed=fixed,
                          progress=prog, make_worker=make_worker, timings=stages)
    finally:
        prog.close()
    cache = tuning.TuningCache(args.cache)
    for t in out:
        ok = len(t.ok)
        best = f"{t.best} ({t.rule})" if t.best is not None else f"none ({t.rule})"
        print(f"{t.phase} [{t.problem.label}]: {len(t.measured)} of {t.candidates} candidates measured, {ok} OK; "
              f"best {best}")
    print(f"results appended to {results}")
    print(f"tuning cache: {cache.path}")
    # where the wall time went: the command's start (imports, problems) before the tuning, then its stages
    print("seconds: " + ", ".join([f"before tuning {t_tune - _T0:.1f}"]
                                   + [f"{k} {v:.1f}" for k, v in stages.items()]))
    return 0 if out and all(t.best is not None for t in out) else 1


def cmd_dispatch(args) -> int:
    _select_backend(args)
    from numba_attn.api import NEVER_DEFAULT
    from numba_attn.measure import dispatch
    from numba_attn.report.table import make_console

    if args.show:
        path = args.table or dispatch.table_path()
        if not os.path.exists(path):
            raise SystemExit(f"dispatch: no table at {path} (build one with `numba-attn dispatch --build`)")
        dispatch.show(dispatch.load(path), make_console(), path)
        return 0
    if args.check:
        if dispatch.stale(never_default=NEVER_DEFAULT):
            print(f"numba-attn: {dispatch.SHOWN_PACKAGE_TABLE} differs from a build from the committed results: "
                  f"run `{dispatch.BUILD_COMMAND}`", file=sys.stderr)
            return 1
        print(f"{dispatch.SHOWN_PACKAGE_TABLE} matches the committed results")
        return 0
    files = dispatch.expand(args.results) if args.results else None
    if files is None and not dispatch.results_files():
        raise SystemExit("dispatch: no committed results files (results/*.jsonl of a source checkout); "
                         "pass --results FILE ...")
    skipped: dict = {}
    table = dispatch.build(files, args.cache, never_default=NEVER_DEFAULT, skipped=skipped)
    path = dispatch.write(table, args.out)
    dispatch.show(table, make_console(), path)
    n = sum(len(e["ranking"]) for e in table["entries"].values())
    print(f"{len(table['entries'])} key(s), {n} configuration(s) from {len(table['sources'])} file(s); "
          f"written to {dispatch.shown_path(path)}")
    for why, count in sorted(skipped.items()):
        print(f"  left out: {count} row(s): {why}")
    return 0


def _visible_gpus() -> int:
    """The GPUs local workers may use, counted without initialising CUDA here (``CUDA_VISIBLE_DEVICES``,
    else ``nvidia-smi -L``, else numba in a child process: :mod:`numba_attn.measure.devices`); at least 1."""
    from numba_attn.measure.devices import visible_devices

    return max(1, len(visible_devices()))


class TuneProgress(Progress):
    """Progress of a tuning: each row named by its phase and requested parameters; the best so far
    (least time; untimed in the simulator: the first OK configuration, the default when it is OK)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.best_cfg: dict = {}  # problem label → (time_ms or None, text)

    def best_text(self, label) -> str:
        if label in self.best_cfg:
            ms, text = self.best_cfg[label]
            return f"best {text}" + (f" {ms:.4g} ms" if ms else "")
        return super().best_text(label)

    def __call__(self, i, n, row, name, problem):
        if row is not None and problem is not None:
            req = row.get("requested_params") or {}
            text = f"{name} {req}" if req else f"{name} (default)"
            if row.get("status") == "OK":
                ms = row.get("time_ms")
                cur = self.best_cfg.get(problem.label)
                if cur is None or (ms and (cur[0] is None or ms < cur[0])) or (not req and not ms):
                    self.best_cfg[problem.label] = (ms, text)
            name = text
        return super().__call__(i, n, row, name, problem)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd is None:
        _parser().print_help()
        return 2
    try:
        return {"list": cmd_list, "run": cmd_run, "bench": cmd_bench, "compare": cmd_compare,
                "plot": cmd_plot, "diff": cmd_diff, "card": cmd_card, "readme": cmd_readme, "tune": cmd_tune,
                "dispatch": cmd_dispatch, "new": cmd_new}[args.cmd](args)
    except KeyError as exc:  # unknown phase or benchmark names
        msg = exc.args[0] if exc.args else str(exc)
        print(f"numba-attn: {msg}", file=sys.stderr)
        return 2
    except ValueError as exc:  # bad problem parameters (AttentionInputError), bad --param, a bad results file
        print(f"numba-attn: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path that cannot be read or written (plots, cards, README)
        print(f"numba-attn: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a missing GPU or CUDA toolkit: one line, no traceback
        name = type(exc).__name__
        if name == "NvvmSupportError":
            print(f"numba-attn: {_nvvm_message(exc)}", file=sys.stderr)
            return 2
        if name in ("CudaSupportError", "CudaDriverError"):
            print(f"numba-attn: no usable CUDA GPU ({name}: {str(exc).strip().splitlines()[0][:200]})",
                  file=sys.stderr)
            return 2
        raise
    except SystemExit as exc:  # usage errors raised with a message: exit status 2, like argparse
        if isinstance(exc.code, str):
            msg = exc.code if exc.code.startswith("numba-attn") else f"numba-attn: {exc.code}"
            print(msg, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
