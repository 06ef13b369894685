"""The ``numba-attn`` command line (the backend is chosen from the arguments before numba is
imported, which is why this module imports the rest of the package lazily)."""
from __future__ import annotations

import os
import re
import sys
import time

_T0 = time.perf_counter()  # when the command started (this module is imported first)

from numba_attn.cli_args import (DEFAULT_BUDGET_S, build_parser, check_ranges, check_seconds,  # noqa: E402
                                 check_timing, nothing_chosen, params_of, peers_of, problems_of, refuse_for_roadmap,
                                 seeds_of)
from numba_attn.cli_report import cmd_card, cmd_compare, cmd_diff, cmd_plot, cmd_readme, plots_default  # noqa: E402
from numba_attn.cli_setup import check_cuda, nvvm_message, run_setup, select_backend  # noqa: E402
from numba_attn.report.progress import Progress, TuneProgress  # noqa: E402

_parser = build_parser  # (the names older callers use)
_plots_default = plots_default


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


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
    select_backend(args)
    run_setup(args.setup)
    from numba_attn.phases.registry import list_phases

    phases = list_phases(args.kind or "all")  # the backward family too (kind "backward")
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
    be = select_backend(args)
    if args.gpu:
        check_cuda(be)
    from numba_attn.report import table as report
    from numba_attn.measure import bench, pools
    from numba_attn.measure.config import RunConfig, default_results_dir
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.sweep import run
    from numba_attn.measure.timing import TimingConfig

    want_default = "default" in args.preset
    args.preset = [p for p in args.preset if p != "default"]
    nothing = nothing_chosen(args)
    roadmap = nothing and not want_default and not be.IS_SIMULATOR
    # every argument is checked here, before either path (the roadmap benchmark or the rows) runs anything
    check_ranges(args)
    problems, _ = problems_of(args) if args.preset or not nothing else ([], True)
    if want_default or (nothing and be.IS_SIMULATOR):
        problems = list(bench.DEFAULT_PROBLEMS) + problems
    run_setup(args.setup)
    phases = [p.strip() for p in args.phases.split(",")] if args.phases else None
    from numba_attn.phases.registry import get_phase

    for p in phases or ():
        get_phase(p)  # unknown names fail here, with suggestions
    backward = backward_run(phases)
    if backward and nothing and not want_default:
        problems, roadmap = backward_problems(be), False
    baseline = args.baseline if args.baseline is not None else ("bwd_naive" if backward else "naive")
    get_phase(baseline)  # --baseline: a phase name
    params = params_of(args)
    for name, over in params.items():
        get_phase(name).resolve_params(over)  # unknown phases, parameters and bad values fail here, before any launch
    seeds = seeds_of(args.seeds if args.seeds is not None else "1,2")
    peer_list = peers_of(args.peers)
    if backward:
        from numba_attn.measure.peers import BACKWARD_PEERS

        peer_list = BACKWARD_PEERS if peer_list is None else peer_list
        if be.IS_SIMULATOR:  # the simulator's small tiles, under what --param asks
            params = {p: {**get_phase(p).sim_params, **params.get(p, {})} for p in phases}
    default_set = want_default or (nothing and be.IS_SIMULATOR and not backward)
    check_timing(args.timing, be)
    if args.csv and os.path.isdir(args.csv):
        raise SystemExit(f"--csv {args.csv}: is a directory; give a file (e.g. table.csv)")
    if not pools.check_ray(args):
        return 2
    console = report.make_console()
    if roadmap:
        refuse_for_roadmap(args)
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
                    allow_slow=args.allow_slow, regime=args.regime, rounds=args.rounds,
                    # the default set's problems are the simulator's smallest that cover every phase's tiles
                    sim_limit_s=300.0 if default_set else None)
    print(f"backend: {be.describe()}", flush=True)
    select = None
    if backward:
        print("backward phases: dq, dk, dv checked against the float64 gradients"
              + (", then timed beside SDPA's backward" if not be.IS_SIMULATOR else ""), flush=True)
    if default_set:
        select = bench.select_by_kind(problems)
        print("no problem given: every phase on the problems of its kind and dtype (preset 'default': fp32 "
              "prefill, fp16 prefill for the tensor cores, decode at q_len 1 with GQA)"
              + (" in the simulator" if be.IS_SIMULATOR else ""), flush=True)
    print(f"problems: {'; '.join(p.label for p in problems)}", flush=True)
    workers, make_worker = pools.worker_pool(args, pools.simulator_workers(be, phases, problems))
    prog = Progress()
    try:
        rows = run(phases, problems, config=cfg, progress=prog, select=select, workers=workers,
                   make_worker=make_worker)
    finally:
        prog.close()
    return _finish(rows, results, be, console, args.csv)


def backward_run(phases) -> bool:
    """Whether ``run --phases`` names backward phases (their rows: gradients checked against float64, timed
    beside SDPA's backward); forward and backward phases run apart."""
    from numba_attn.phases.registry import BACKWARD, get_phase

    kinds = {get_phase(p).kind == BACKWARD for p in phases or ()}
    if len(kinds) > 1:
        forward = [p for p in phases if get_phase(p).kind != BACKWARD]
        raise SystemExit(f"--phases: backward phases run apart from forward ones; leave out {', '.join(forward)}")
    return kinds == {True}


def backward_problems(be) -> list:
    """A backward run's problems when none is given: two small odd shapes in the simulator (GQA and causal, fp32
    and fp16); on a GPU fp16 B1 H32 N4096 at D64 and D128, causal and not."""
    from numba_attn.spec.problem import Problem

    if be.IS_SIMULATOR:
        return [Problem(batch=1, heads=2, kv_heads=1, q_len=19, kv_len=37, head_dim=16, causal=True),
                Problem(batch=1, heads=2, q_len=37, kv_len=21, head_dim=16, dtype="float16")]
    return [Problem(batch=1, heads=32, q_len=4096, kv_len=4096, head_dim=d, causal=c, dtype="float16")
            for d in (64, 128) for c in (False, True)]


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


def _run_roadmap(args, be, phases, console) -> int:
    """``numba-attn run`` on a GPU without a problem: the roadmap benchmark, into the results dir."""
    from numba_attn.measure import bench, pools
    from numba_attn.measure.config import default_results_dir
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.results import check_writable

    out_dir = os.path.dirname(args.results) if args.results else default_results_dir()
    results = args.results or os.path.join(out_dir, f"roadmap-{_slug(gpu_info()['gpu'])}.jsonl")
    check_writable(results)  # a directory, a path that cannot be created: refused before any row
    print(f"backend: {be.describe()}", flush=True)
    print("no problem given: the roadmap benchmark (numba-attn bench roadmap: every prefill phase and SDPA, "
          "fp32 and fp16, a few minutes)", flush=True)
    workers, make_worker = pools.worker_pool(args)
    prog = Progress()
    try:
        rows, results, files = bench.run_benchmark(
            "roadmap", results=results, plots_dir=out_dir or ".", phases=phases, progress=prog,
            timeout_s=args.timeout, resume=args.resume, command="numba-attn " + " ".join(sys.argv[1:]),
            setup=args.setup, workers=workers, make_worker=make_worker, allow_slow=args.allow_slow,
            regime=args.regime, rounds=args.rounds)
    finally:
        prog.close()
    return _finish(rows, results, be, console, args.csv, files)


def cmd_bench(args) -> int:
    from numba_attn.measure import bench

    if not args.name:
        for b in bench.BENCHMARKS.values():
            print(f"{b.name:13s} {b.description}")
        return 0
    be = select_backend(args)
    from numba_attn.measure import pools

    from numba_attn.report import table as report

    check_seconds(args)
    run_setup(args.setup)
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
    peer_list = peers_of(args.peers)  # unknown names fail here
    check_timing(args.timing, be)
    if not pools.check_ray(args):
        return 2
    print(f"backend: {be.describe()}", flush=True)
    print(f"benchmark {b.name}: {b.description}", flush=True)
    workers, make_worker = pools.worker_pool(args)
    prog = Progress()
    try:
        rows, results, files = bench.run_benchmark(
            b.name, results=args.results, phases=phases, quick=args.quick,
            plots_dir=bench.BESIDE_RESULTS if args.plots is None else (args.plots or None),
            resume=args.resume, progress=prog, timeout_s=args.timeout, max_total_s=args.max_total,
            command="numba-attn " + " ".join(sys.argv[1:]), setup=args.setup, problems=problems,
            workers=workers, make_worker=make_worker, timing_method=args.timing, allow_slow=args.allow_slow,
            peers=peer_list, regime=args.regime, rounds=args.rounds)
    finally:
        prog.close()
    return _finish(rows, results, be, report.make_console(), plots=files)


def cmd_new(args) -> int:
    select_backend(args)
    from numba_attn.userphases import new_phase

    sys.stdout.write(new_phase(args.name, from_=args.parent, dir=args.dir).summary())
    return 0


def cmd_tune(args) -> int:
    if args.show:
        from numba_attn.measure.tune import TuningCache

        print(TuningCache(args.cache).format())
        return 0
    if not args.phases:
        raise SystemExit("tune: give phase names (PHASE[,PHASE...]), or --show")
    be = select_backend(args)
    if args.gpu:
        check_cuda(be)
    from numba_attn.measure import pools
    from numba_attn.measure import tune as tuning
    from numba_attn.measure.config import RunConfig, default_results_dir
    from numba_attn.measure.env import gpu_info
    from numba_attn.measure.results import check_writable
    from numba_attn.measure.timing import TimingConfig
    from numba_attn.phases.registry import get_phase

    if not pools.check_ray(args):
        return 2
    run_setup(args.setup)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    for p in phases:
        get_phase(p)
    from numba_attn.spec.errors import parse_param_value

    fixed = params_of(args)
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
    problems, _ = problems_of(args)
    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    check_timing(args.timing, be)
    results = args.results or os.path.join(default_results_dir(), f"tune-{_slug(gpu_info()['gpu'])}.jsonl")
    check_writable(results)
    timeout = args.timeout if args.timeout is not None else (1800.0 if be.IS_SIMULATOR else 600.0)
    default_workers = 1 if be.IS_SIMULATOR or args.ray is not None else pools.visible_gpus()
    workers, make_worker = pools.worker_pool(args, default_workers)
    cfg = RunConfig(seeds=seeds_of(args.seeds), timeout_s=timeout or None, peers=False, results=results,
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
    # (milliseconds shown: a tiny problem's rows take well under 0.1 s in the simulator)
    print("seconds: " + ", ".join([f"before tuning {t_tune - _T0:.1f}"]
                                   + [f"{k} {v:.3f}" for k, v in stages.items()]))
    return 0 if out and all(t.best is not None for t in out) else 1


def cmd_trace(args) -> int:
    """``numba-attn trace PHASE``: one traced call (:mod:`numba_attn.measure.timeline`), its summary printed, its
    picture and stamps written."""
    import gzip
    import json

    from numba_attn.spec.errors import parse_param_value

    select_backend(args)
    run_setup(args.setup)
    from numba_attn.measure.timeline import trace_phase

    problems, _ = problems_of(args)
    params = {}
    for item in args.param:
        key, sep, val = item.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"--param {item!r}: expected NAME=VALUE, e.g. Bc=64")
        params[key] = parse_param_value(val)
    os.makedirs(args.out, exist_ok=True)
    for p in problems:
        try:
            tl = trace_phase(args.phase, p, params)
        except ValueError as exc:
            raise SystemExit(f"trace: {exc}") from None
        s = tl.summary()
        stem = os.path.join(args.out, f"{args.phase}-{_slug(p.label)}")
        tl.plot(stem + ".png", sms=args.sms)
        with gzip.open(stem + ".json.gz", "wt") as f:
            json.dump(tl.to_dict(), f)
        print(f"{args.phase} on {p.label} {s['params']}: {s['items']} items on {s['sms']} SMs, span "
              f"{s['span_us']:.1f} µs")
        for key in ("gap", "setup", "q", "k0", "loop", "epilogue"):
            v = s[f"{key}_us"]
            print(f"  {key:<9} {'—' if v is None else f'{v:8.3f} µs'} (median an item)")
        print(f"  a tile {s['tile_us']:.3f} µs, the loop's fixed part {s['loop_fixed_us']:.3f} µs; an item beside its "
              f"tiles {s['item_beside_tiles_us']:.3f} µs")
        print(f"  written: {stem}.png, {stem}.json.gz")
    return 0


def cmd_dispatch(args) -> int:
    select_backend(args)
    from numba_attn.measure import dispatch
    from numba_attn.measure.policy import NEVER_DEFAULT
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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd is None:
        build_parser().print_help()
        return 2
    try:
        return {"list": cmd_list, "run": cmd_run, "bench": cmd_bench, "compare": cmd_compare,
                "plot": cmd_plot, "diff": cmd_diff, "card": cmd_card, "readme": cmd_readme, "tune": cmd_tune,
                "dispatch": cmd_dispatch, "new": cmd_new,
                "trace": cmd_trace}[args.cmd](args)
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
            print(f"numba-attn: {nvvm_message(exc)}", file=sys.stderr)
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
