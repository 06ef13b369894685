"""``numba-attn`` command line.

    numba-attn list                      the registry as a table
    numba-attn run [options]             phases × problems → table + results file
    numba-attn bench NAME                a declared benchmark (roadmap, long-context, decode):
                                         ceilings, phases and SDPA → results file + plots
    numba-attn compare A B               per-phase time ratios between two results files
    numba-attn plot RESULTS [--out DIR]  roadmap, scaling, roofline and memory-traffic plots
    numba-attn diff PHASE [--stat]       the source diff of a phase against its parent
    numba-attn card PHASE | --all        a phase's card (docs/phases/<name>.md), from the committed results
    numba-attn readme [--check]          regenerate the README's result tables from the committed results

The backend is chosen from the arguments *before* numba is imported, which is
why this module imports the rest of the package lazily.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="numba-attn", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    ls = sub.add_parser("list", help="list the registered phases in roadmap order")
    ls.add_argument("--kind", choices=["prefill", "decode"], default=None)
    ls.add_argument("-v", "--verbose", action="store_true", help="also print each phase's description")

    r = sub.add_parser("run", help="check (and on a GPU time) phases on problems")
    be = r.add_mutually_exclusive_group()
    be.add_argument("--simulator", action="store_true", help="use the Numba CUDA simulator (CPU)")
    be.add_argument("--gpu", action="store_true", help="require a real CUDA GPU")
    r.add_argument("--phases", default=None, help="comma-separated phase names (default: all)")
    r.add_argument("--preset", action="append", default=[],
                   help="named problem set (repeatable); see `numba-attn run --list-presets`")
    r.add_argument("--list-presets", action="store_true")
    r.add_argument("--batch", "-B", type=int)
    r.add_argument("--heads", "-H", type=int)
    r.add_argument("--kv-heads", type=int)
    r.add_argument("--q-len", "-N", type=int, help="query length (and kv length unless --kv-len)")
    r.add_argument("--kv-len", type=int)
    r.add_argument("--head-dim", "-D", type=int)
    r.add_argument("--causal", action="store_true")
    r.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    r.add_argument("--scale", type=float)
    r.add_argument("--param", action="append", default=[], metavar="PHASE.NAME=VALUE",
                   help="override a phase's tunable parameter, e.g. smem_kv.Bc=64 (repeatable)")
    r.add_argument("--seeds", default="1,2", help="comma-separated input seeds for the correctness check")
    r.add_argument("--results", default=None,
                   help="JSON-lines file to append to (default: results/<gpu>.jsonl)")
    r.add_argument("--timeout", type=float, default=None,
                   help="seconds per (phase, problem) before it is recorded TIMEOUT "
                        "(default 600 on a GPU, 1800 in the simulator; 0 = no limit, in-process)")
    r.add_argument("--budget", type=float, default=2.0, help="seconds of timing per row (GPU)")
    r.add_argument("--no-peers", action="store_true", help="do not run PyTorch SDPA as a peer")
    r.add_argument("--peers", default=None, help="comma-separated peer names (default: all)")
    r.add_argument("--no-ceilings", action="store_true",
                   help="do not measure the device's ceilings (FFMA, mma, copy) before the phases")
    r.add_argument("--resume", action="store_true",
                   help="skip rows already in the results file for the same source and environment")
    r.add_argument("--baseline", default="naive")
    _common(r)

    b = sub.add_parser("bench", help="run a declared benchmark (see numba_attn/measure/bench.py) and draw its plots")
    b.add_argument("name", nargs="?", help="benchmark name (omit to list them)")
    b.add_argument("--results", default=None, help="results file (default: results/<name>-<gpu>.jsonl)")
    b.add_argument("--plots", default="plots", help="directory for the plots (default: plots/); '' for none")
    b.add_argument("--phases", default=None, help="only these phases (comma-separated)")
    b.add_argument("--resume", action="store_true", help="skip rows already measured (same source, environment)")
    b.add_argument("--quick", action="store_true", help="short timing budget, one seed: a smoke test")
    b.add_argument("--preset", action="append", default=[], help="replace the benchmark's problems by presets")
    b.add_argument("--timeout", type=float, default=None, help="seconds per row before TIMEOUT")
    b.add_argument("--max-total", type=float, default=None,
                   help="seconds after which remaining rows are SKIP (default: the benchmark's limit)")
    b.add_argument("--simulator", action="store_true", help="use the Numba CUDA simulator (CPU)")
    _common(b)

    c = sub.add_parser("compare", help="per-phase ratios between two results files")
    c.add_argument("a")
    c.add_argument("b")

    p = sub.add_parser("plot", help="draw the plots of a results file")
    p.add_argument("results")
    p.add_argument("--out", default="plots", help="output directory (default: plots/)")
    p.add_argument("--prefix", default="", help="file name prefix")
    p.add_argument("--which", default=None, help="comma-separated subset of roadmap,scaling,roofline,traffic")

    d = sub.add_parser("diff", help="the source diff of a phase's module against its parent's")
    d.add_argument("phase")
    d.add_argument("--stat", action="store_true", help="only the number of lines added and removed")
    d.add_argument("-U", "--context", type=int, default=3, help="lines of context (default 3)")

    cd = sub.add_parser("card", help="a phase's card: parent, idea, parameters, tests, measured rows, plots")
    cd.add_argument("phase", nargs="?", help="phase name (or --all)")
    cd.add_argument("--all", action="store_true", help="every phase's card and the index")
    cd.add_argument("--out", default=None, help="with --all: write <out>/<name>.md and <out>/README.md "
                                                "(e.g. docs/phases/)")
    cd.add_argument("--check", action="store_true",
                    help="with --all: exit 1 when the files under --out (default docs/phases/) differ from a regeneration")

    rd = sub.add_parser("readme", help="regenerate the README's result tables from the committed results files")
    rd.add_argument("--check", action="store_true", help="exit 1 when a table differs from its results file")
    rd.add_argument("--readme", default=None, help="the file to rewrite (default: README.md of the repository)")
    return ap


def _common(sp):
    sp.add_argument("--setup", action="append", default=[], metavar="MODULE[:FUNCTION]",
                    help="import MODULE (and call FUNCTION) first, here and in worker processes: "
                         "registers out-of-tree phases (repeatable)")


def _select_backend(args):
    if getattr(args, "simulator", False):
        os.environ["NUMBA_ATTN_BACKEND"] = "simulator"
    elif getattr(args, "gpu", False):
        os.environ["NUMBA_ATTN_BACKEND"] = "cuda"
    from numba_attn.gpu import backend

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
    out: dict = {}
    for item in args.param:
        m = re.fullmatch(r"([\w-]+)\.(\w+)=(.+)", item)
        if not m:
            raise SystemExit(f"--param {item!r}: expected PHASE.NAME=VALUE, e.g. smem_kv.Bc=64")
        ph, key, val = m.groups()
        try:
            val = int(val)
        except ValueError:
            try:
                val = float(val)
            except ValueError:
                pass
        out.setdefault(ph, {})[key] = val
    return out


def _phase_file(phase) -> str:
    """The phase's module path relative to numba_attn/phases/ (e.g. ``cuda_core/p02_smem_kv.py``)."""
    parts = phase.module.split(".")
    return "/".join(parts[2:]) + ".py" if parts[:2] == ["numba_attn", "phases"] else phase.module


def cmd_list(args) -> int:
    _select_backend(args)
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
    """One line per row: [i/n] phase problem … status (elapsed)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.t0 = time.perf_counter()
        self.row_t0 = self.t0

    def __call__(self, i, n, row, name, problem):
        el = time.perf_counter() - self.t0
        if problem is None:  # the ceilings
            print(f"[{el:6.1f}s] ceilings measured in {row.get('wall_s', 0):.1f}s", file=self.stream, flush=True)
            return
        if row is not None and row.get("resumed"):
            print(f"[{i + 1}/{n} {el:6.1f}s] {name:18s} {problem.label} → {row.get('status')} (resumed)",
                  file=self.stream, flush=True)
            return
        if row is None:
            self.row_t0 = time.perf_counter()
            print(f"[{i + 1}/{n} {el:6.1f}s] {name:18s} {problem.label} …", file=self.stream, flush=True)
        else:
            extra = ""
            if row.get("time_ms"):
                extra = f" {row['time_ms']:.4f} ms"
            elif row.get("reason") and row.get("status") != "OK":
                extra = f" ({row['reason'][:120]})"
            print(f"[{i + 1}/{n} {el:6.1f}s]   → {row.get('status')}{extra} "
                  f"in {time.perf_counter() - self.row_t0:.1f}s", file=self.stream, flush=True)


def cmd_run(args) -> int:
    if args.list_presets:
        from numba_attn.spec.problem import PRESETS

        for name, probs in PRESETS.items():
            print(f"{name:12s} " + "; ".join(p.label for p in probs))
        return 0
    be = _select_backend(args)
    if args.gpu and be.IS_SIMULATOR:
        raise SystemExit("--gpu: no CUDA GPU is available")
    from numba_attn.report import table as report
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.sweep import run
    from numba_attn.measure.timing import TimingConfig

    problems, defaulted = _problems(args)
    _run_setup(args.setup)
    phases = [p.strip() for p in args.phases.split(",")] if args.phases else None
    from numba_attn.phases.registry import get_phase

    if phases:
        for p in phases:
            get_phase(p)  # unknown names fail here, with suggestions
    get_phase(args.baseline)  # --baseline: a phase name
    for name, over in _params(args).items():
        get_phase(name).resolve_params(over)  # unknown phases, parameters and bad values fail here, before any launch
    seeds = _seeds(args.seeds)
    if args.results:
        results = args.results
    else:
        results = os.path.join("results", f"{_slug(gpu_info()['gpu'])}.jsonl")
    timeout = args.timeout if args.timeout is not None else (1800.0 if be.IS_SIMULATOR else 600.0)
    peer_list = None
    if args.peers:
        from numba_attn.measure.peers import PEERS

        peer_list = tuple(x.strip() for x in args.peers.split(",") if x.strip())
        for x in peer_list:
            if x not in PEERS:
                raise SystemExit(f"unknown peer {x!r}; peers: {', '.join(PEERS)}")
    from numba_attn.measure.results import check_writable

    check_writable(results)  # a directory, a path that cannot be created: refused before any row
    cfg = RunConfig(seeds=seeds, params=_params(args),
                    timeout_s=timeout or None, peers=not args.no_peers, results=results,
                    baseline=args.baseline, command="numba-attn " + " ".join(sys.argv[1:]),
                    timing=TimingConfig(budget_s=args.budget), ceilings=not args.no_ceilings and not be.IS_SIMULATOR,
                    resume=args.resume, worker_setup=tuple(args.setup), peer_list=peer_list)
    print(f"backend: {be.describe()}", flush=True)
    if defaulted:
        print("no problem given: running every phase on the small default problem (preset 'tiny')"
              + (" in the simulator" if be.IS_SIMULATOR else ""), flush=True)
    print(f"problems: {'; '.join(p.label for p in problems)}", flush=True)
    rows = run(phases, problems, config=cfg, progress=Progress())
    print()
    print(report.table(rows))
    print(f"\nbackend: {be.describe()}")
    print(f"results appended to {results}")
    bad = [r for r in rows if r.get("status") in ("FAIL", "ERROR", "TIMEOUT")]
    return 1 if bad else 0


def _seeds(text: str) -> tuple:
    from numba_attn.spec.errors import parse_seeds

    return parse_seeds(text)  # integers >= 0, at least one


def _run_setup(specs):
    from numba_attn.measure.isolation import call_setup

    for spec in specs:
        try:
            call_setup(spec)
        except Exception as exc:  # noqa: BLE001
            raise SystemExit(f"--setup {spec!r} failed: {type(exc).__name__}: {exc}") from None


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
    print(f"backend: {be.describe()}", flush=True)
    print(f"benchmark {b.name}: {b.description}", flush=True)
    rows, results, files = bench.run_benchmark(
        b.name, results=args.results, plots_dir=args.plots or None, phases=phases, quick=args.quick,
        resume=args.resume, progress=Progress(), timeout_s=args.timeout, max_total_s=args.max_total,
        command="numba-attn " + " ".join(sys.argv[1:]), setup=args.setup, problems=problems)
    print()
    print(report.table(rows))
    print(f"\nresults appended to {results}")
    for f in files:
        print(f"plot: {f}")
    bad = [r for r in rows if r.get("status") in ("FAIL", "ERROR", "TIMEOUT")]
    return 1 if bad else 0


def cmd_compare(args) -> int:
    from numba_attn.report.compare import compare, format_comparison

    for path in (args.a, args.b):
        if not os.path.exists(path):
            raise SystemExit(f"no such results file: {path}")
    print(format_comparison(compare(args.a, args.b), args.a, args.b))
    return 0


def cmd_plot(args) -> int:
    from numba_attn.report.plots import PLOTS, make_all

    if not os.path.exists(args.results):
        raise SystemExit(f"no such results file: {args.results}")
    which = PLOTS
    if args.which:
        which = tuple(w.strip() for w in args.which.split(","))
        for w in which:
            if w not in PLOTS:
                raise SystemExit(f"unknown plot {w!r}; plots: {', '.join(PLOTS)}")
    files = make_all(args.results, args.out, prefix=args.prefix, which=which)
    if not files:
        print("nothing to plot: the file has no timed rows (a simulator run checks correctness only)")
    for f in files:
        print(f)
    return 0


def cmd_diff(args) -> int:
    _select_backend(args)
    from numba_attn.report.diff import phase_diff, phase_diff_stat

    sys.stdout.write(phase_diff_stat(args.phase) if args.stat else phase_diff(args.phase, args.context))
    return 0


def cmd_card(args) -> int:
    _select_backend(args)
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


def cmd_readme(args) -> int:
    _select_backend(args)
    from numba_attn.report import readme

    return readme.run(args.readme, args.check)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd is None:
        _parser().print_help()
        return 2
    try:
        return {"list": cmd_list, "run": cmd_run, "bench": cmd_bench, "compare": cmd_compare,
                "plot": cmd_plot, "diff": cmd_diff, "card": cmd_card, "readme": cmd_readme}[args.cmd](args)
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
    except SystemExit as exc:  # usage errors raised with a message: exit status 2, like argparse
        if isinstance(exc.code, str):
            msg = exc.code if exc.code.startswith("numba-attn") else f"numba-attn: {exc.code}"
            print(msg, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
