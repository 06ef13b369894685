"""The ``numba-attn`` commands that read results files and phases and write what people read: compare, plot,
diff, card and readme (dispatched by :func:`numba_attn.cli.main`)."""
from __future__ import annotations

import os
import sys

from numba_attn.cli_setup import run_setup, select_backend


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
    out = args.out if args.out is not None else plots_default(args.results)
    files = make_all(args.results, out, prefix=args.prefix, which=which)
    if not files:
        print("nothing to plot: the file has no timed rows, nor a phase counted beside its parent (a simulator "
              "run counts each row's launch: the counts plot)")
    for f in files:
        print(f)
    return 0


def plots_default(results: str) -> str:
    """Where ``plot`` writes without --out: beside the results file, unless that file lies in this checkout
    (a committed results/*.jsonl): then in the per-user results dir, so that no command writes into the checkout."""
    from numba_attn.measure.config import default_results_dir
    from numba_attn.report.records import ROOT

    here, root = os.path.dirname(os.path.realpath(results)), os.path.realpath(ROOT)
    inside = here == root or here.startswith(root + os.sep)
    return os.path.realpath(default_results_dir()) if inside else here


def cmd_diff(args) -> int:
    select_backend(args)
    run_setup(args.setup)
    from numba_attn.report.diff import phase_diff, phase_diff_stat

    sys.stdout.write(phase_diff_stat(args.phase, code=args.code) if args.stat
                     else phase_diff(args.phase, args.context, code=args.code))
    return 0


def cmd_card(args) -> int:
    select_backend(args)
    run_setup(args.setup)
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
    select_backend(args)
    from numba_attn.report import readme

    return readme.run(args.readme, args.check)
