"""Result rows as a terminal table (and the meaning of each column)."""
from __future__ import annotations

# The meaning of every column and mark of the run table: the single source of truth for
# `numba-attn run --explain-columns` and the README's column table (`numba-attn readme`).
COLUMNS = [
    ("phase", "phase (or peer, e.g. `torch_sdpa`) name; a peer whose SDPA backend is not in its name shows the "
              "one that ran, read from its kernels' names (`torch_sdpa [cudnn]`; `cudnn`, `flash`, `efficient`, "
              "`math`)"),
    ("problem", "B batch, H heads (`/2kv`: KV heads under GQA), N length (Nq/Nk when they differ), D head_dim, "
                "storage dtype"),
    ("status", "`OK` correct (and timed on a GPU); `FAIL` wrong result or an implausible time — never timed or "
               "ranked; `ERROR` raised; `TIMEOUT` exceeded `--timeout`; `SKIP` problem outside the phase's range "
               "(reason printed below the table)"),
    ("rel_err", "‖out − ref‖/‖ref‖ against the float64 reference, worst of the seeds; tolerance by precision "
                "(fp32 1e-4, tf32 3e-3, fp16 4e-3, bf16 3e-2). The output is poisoned before each run: elements "
                "left unwritten, NaN or Inf fail"),
    ("time", "median kernel time: CUDA events around back-to-back launches, so numba's ~25 µs Python launch cost "
             "is not in it; inputs rotated so small problems are not timed from L2. With `--timing cupti` the "
             "kernels' own durations from CUPTI (a call's kernels summed, median over the calls), with "
             "`--timing graph` CUDA graph replay; phases and peers alike. A problem's phases and peers are "
             "then timed again in interleaved rounds (the order rotated each round) and the time is the median "
             "over the rounds (`--regime`). `sim`: checked in the simulator, not timed"),
    ("±", "spread of the timing samples (of the rounds' times when interleaved), (max − min) / median"),
    ("e2e", "end-to-end time of one Python call plus synchronize (launch overhead included)"),
    ("TFLOP/s", "4·D FLOPs per unmasked (query, key) pair per head (causal pairs counted exactly), over the time"),
    ("GB/s", "the fewest bytes a fused kernel must move (Q, K, V read once, O written once), over the time"),
    ("%ceil", "fraction of the ceiling measured in the same run that applies to the phase; the suffix names it "
              "(`1%F` = 1 % of the FFMA ceiling)"),
    ("speedup", "time of the baseline phase (`naive`) on the same problem in the same run / this time"),
    ("plan", "the speedup over the baseline the roadmap planned for the phase"),
    ("regs", "registers per thread (largest kernel of the phase)"),
    ("smem", "static shared memory per block, bytes"),
    ("local", "local memory per thread, bytes: spills or local arrays (non-zero is a finding)"),
]

# Columns of a simulator run: what the row's first launch did, counted (numba_attn.measure.simcount; the row's
# ``sim_*`` fields, SIM_FIELDS). Shown only where a row has them; not in the README's column table (GPU runs).
SIM_COLUMNS = [
    ("gmem r/w", "simulator counts of one launch: bytes the kernels' global loads requested / their stores wrote "
                 "(elements × size, over every kernel-argument array; cp.async and TMA reads included; no caches: "
                 "requested bytes, not DRAM traffic)"),
    ("sect/req", "32-byte sectors per warp-level global load or store (coalescing: 4 = a warp's 32 consecutive "
                 "4-byte elements, 32 = every lane in its own sector)"),
    ("smem r/w", "bytes read from / written to shared memory (ld/st, ldmatrix, wgmma B operands, cp.async and "
                 "TMA writes)"),
    ("bank cf", "shared-memory bank conflicts: extra wavefronts (per warp instruction and phase of lanes, the most "
                "distinct 4-byte words in one of the 32 banks, minus one), over the launch"),
    ("barriers", "cuda.syncthreads completed, summed over the blocks (+ named barriers, `+N`)"),
    ("mma", "warp-level mma.sync instructions (`+N` wgmma, warpgroup-level)"),
]

# The row fields behind them, with their meaning (`numba-attn run --explain-columns`).
SIM_FIELDS = None  # filled from numba_attn.measure.simcount.FIELDS on first use (no numba import here)

# Marks appended to a cell, with their meaning.
MARKS = [
    ("`*` (time)", "launch-bound: the kernel is shorter than the host's launch cost; the time is the launch rate"),
    ("`(r)` (time)", "row reused from the results file (`--resume`)"),
    ("`ᶜ` (time)", "kernel time from CUPTI (`--timing cupti`); the events time is kept in the row (`events_ms`)"),
    ("`ᵍ` (time)", "CUDA graph replay time (`--timing graph`); the events time is kept in the row (`events_ms`)"),
    ("`F` `M` `T` `G` `B` (%ceil)", "of the FFMA ceiling (CUDA cores), the fp16 `mma.sync` ceiling, the tf32 "
                                    "`mma.sync` ceiling, the fp16 `wgmma` ceiling, the copy bandwidth (decode)"),
    ("`†` (speedup)", "against the baseline on the same shape in another dtype (e.g. naive fp32 for an fp16 "
                      "tensor-core row)"),
    ("`—`", "not measured or not applicable (in the simulator: every timing column; such columns are not "
            "printed there)"),
]


def explain_columns() -> str:
    """What every column and mark of the run table means (``numba-attn run --explain-columns``)."""
    import textwrap

    w = max(len(n.replace("`", "")) for n, _ in COLUMNS + MARKS)
    out = ["columns:"]
    for name, text in COLUMNS:
        out += textwrap.wrap(text.replace("`", ""), 100, initial_indent=f"  {name:{w}s}  ",
                             subsequent_indent=" " * (w + 4))
    out.append("marks:")
    for name, text in MARKS:
        out += textwrap.wrap(text.replace("`", ""), 100, initial_indent=f"  {name.replace('`', ''):{w}s}  ",
                             subsequent_indent=" " * (w + 4))
    out.append("simulator counts (one launch per row, in the simulator only; the row's sim_* fields):")
    for name, text in SIM_COLUMNS:
        out += textwrap.wrap(text.replace("`", ""), 100, initial_indent=f"  {name:{w}s}  ",
                             subsequent_indent=" " * (w + 4))
    out.append("row fields:")
    wf = max(len(n) for n in sim_fields())
    for name, text in sim_fields().items():
        out += textwrap.wrap(text, 100, initial_indent=f"  {name:{wf}s}  ", subsequent_indent=" " * (wf + 4))
    return "\n".join(out)


def sim_fields() -> dict:
    """The ``sim_*`` row fields and their meaning (:data:`numba_attn.measure.simcount.FIELDS`)."""
    import importlib.util
    import os

    global SIM_FIELDS
    if SIM_FIELDS is None:  # read without importing numba_attn.measure (which selects a backend)
        path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "measure", "simcount.py")
        import ast

        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FIELDS" for t in node.targets):
                SIM_FIELDS = ast.literal_eval(node.value)
                break
        SIM_FIELDS = SIM_FIELDS or {}
    return SIM_FIELDS


def columns_markdown() -> str:
    """The README's column table (between its ``table:columns`` markers)."""
    out = ["| column | meaning |", "| --- | --- |"]
    out += [f"| {name} | {text} |" for name, text in COLUMNS]
    out += ["", "| mark | meaning |", "| --- | --- |"]
    out += [f"| {name} | {text} |" for name, text in MARKS]
    return "\n".join(out)


CEILING_SHORT = {"ffma": "F", "mma_fp16": "M", "mma_tf32": "T", "wgmma_fp16": "G", "copy": "B"}


def _fmt_time(ms):
    if ms is None:
        return "—"
    if ms < 1:
        return f"{ms * 1e3:.1f} µs"
    return f"{ms:.3f} ms"


def _f(x, fmt):
    return "—" if x is None else format(x, fmt)


def ceilings_table(records: list[dict]) -> str:
    rows = [r for r in records if r.get("type") == "ceiling"]
    if not rows:
        return ""
    out = ["measured ceilings:"]
    for r in rows:
        if r.get("status") == "OK" and r.get("value") is not None:
            val = f"{r['value']:.1f} {r.get('unit', '')}"
            sp = f" (±{r['spread']:.1%})" if r.get("spread") is not None else ""
            out.append(f"  {r['name']:9s} {val:>14s}{sp}  {r.get('source', '')}")
        else:
            out.append(f"  {r.get('name', '?'):9s} {r.get('status')}: {r.get('reason', '')}")
    return "\n".join(out)


HEADER = [name for name, _ in COLUMNS] + [name for name, _ in SIM_COLUMNS]
N_MAIN = len(COLUMNS)  # the columns before the simulator counts


def _size(n) -> str:
    """Bytes in decimal units (B, kB, MB, GB)."""
    if n is None:
        return "—"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{int(n)} B"


def _sim_cells(r: dict) -> list[str]:
    """The simulator-count cells of a row ("—" without counts)."""
    if r.get("sim_gmem_read_bytes") is None:
        return ["—"] * len(SIM_COLUMNS)
    reqs = (r.get("sim_gmem_loads") or 0) + (r.get("sim_gmem_stores") or 0)
    named = r.get("sim_named_barriers") or 0
    wg = r.get("sim_wgmma") or 0
    return [f"{_size(r.get('sim_gmem_read_bytes'))}/{_size(r.get('sim_gmem_write_bytes'))}",
            f"{(r.get('sim_gmem_sectors') or 0) / reqs:.1f}" if reqs else "—",
            f"{_size(r.get('sim_smem_load_bytes'))}/{_size(r.get('sim_smem_store_bytes'))}",
            _f(r.get("sim_bank_conflicts"), "d"),
            _f(r.get("sim_barriers"), "d") + (f"+{named}" if named else ""),
            _f(r.get("sim_mma"), "d") + (f"+{wg}" if wg else "")]


def cells(rows: list[dict]) -> list[list[str]]:
    """One list of cell strings per result row, in the order of :data:`HEADER`."""
    lines = []
    for r in rows:
        if r.get("type") != "result":
            continue
        chk = r.get("check") or {}
        time_s = _fmt_time(r.get("time_ms"))
        if r.get("status") == "OK" and r.get("time_ms") is None:
            time_s = "sim" if r.get("backend") == "simulator" else "—"
        if r.get("launch_bound"):
            time_s += "*"
        if r.get("time_ms") is not None and r.get("time_method") == "cupti":
            time_s += "ᶜ"
        elif r.get("time_ms") is not None and r.get("time_method") == "graph_replay" and not r.get("launch_bound"):
            time_s += "ᵍ"
        if r.get("resumed"):
            time_s += " (r)"
        frac = r.get("frac_ceiling")
        frac_s = "—" if frac is None else f"{frac:.0%}{CEILING_SHORT.get(r.get('ceiling'), '')}"
        lines.append([
            _name(r), r.get("label", ""), r.get("status", "?"),
            _f(chk.get("rel_err"), ".1e"), time_s,
            "—" if r.get("spread") is None or not r.get("time_ms") else f"{r['spread']:.0%}",
            _fmt_time(r.get("e2e_ms")) if r.get("e2e_ms") else "—",
            _f(r.get("tflops"), ".2f"), _f(r.get("gbps"), ".0f"), frac_s,
            _f(r.get("speedup"), ".1f") + ("x" if r.get("speedup") else "") + ("†" if r.get("speedup_vs") else ""),
            _f(r.get("planned_speedup"), "g") + ("x" if r.get("planned_speedup") else ""),
            _f(r.get("regs"), "d"), _f(r.get("smem_static"), "d"),
            _f(r.get("local_bytes"), "d"),
        ] + _sim_cells(r))
    return lines


def _name(r: dict) -> str:
    """The row's name; a peer's with the SDPA backend that ran when its name does not say it."""
    name = r.get("phase", "?")
    ran = r.get("sdpa_backend_ran")
    if r.get("kind") == "peer" and ran and not name.endswith(f"_{ran}"):
        return f"{name} [{ran}]"
    return name


def _notes(rows: list[dict]) -> list[str]:
    """The lines under the table: reasons of the rows not OK, the timing cross-check, the marks used."""
    out = []
    reasons = [(r.get("phase"), r.get("label"), r.get("status"), r.get("reason")) for r in rows
               if r.get("type") == "result" and r.get("status") not in ("OK",) and r.get("reason")]
    if reasons:
        out.append("")
        out += [f"{p} [{lab}] {st}: {why}" for p, lab, st, why in reasons]
    checks = [r for r in rows if r.get("timing_check")]
    for r in checks:
        tc = r["timing_check"]
        line = (f"timing cross-check on {r['phase']} [{r.get('label')}]: events {tc['events_ms'] * 1e3:.2f} µs, "
                f"{tc.get('second_method')} {tc['second_ms'] * 1e3:.2f} µs ({tc['rel_diff']:+.1%}, "
                f"noise ±{tc['tolerance']:.1%})")
        if tc.get("graph_error"):
            line += f"; graph capture failed: {tc['graph_error']}"
        out.append("")
        out.append(line + (f"\nWARNING: {tc['warning']}" if tc.get("warning") else " — agree"))
    for r in rows:
        for key in ("timing_fallback", "cupti_irregular"):
            if r.get(key):
                out.append(f"{r.get('phase')} [{r.get('label')}] timing: {r[key]}")
    out += regime_lines(rows)
    if any(r.get("launch_bound") for r in rows):
        out.append("* launch-bound: the kernel is shorter than the host's launch cost; the time is the launch rate")
    if any(r.get("frac_ceiling") is not None for r in rows):
        out.append("%ceil: F = of the FFMA ceiling, M = of the fp16 mma ceiling, T = of the tf32 mma ceiling, "
                   "G = of the fp16 wgmma ceiling, B = of copy bandwidth")
    if any(r.get("speedup_vs") for r in rows):
        out.append("† speedup against the baseline on the same shape in another dtype (e.g. naive fp32 for an "
                   "fp16 tensor-core row)")
    if any(r.get("time_method") == "cupti" and r.get("time_ms") is not None for r in rows):
        out.append("ᶜ kernel time from CUPTI (torch.profiler): the durations of a call's kernels summed, "
                   "median over the calls; phases and peers measured the same way")
    if any(r.get("time_method") == "graph_replay" and not r.get("launch_bound") for r in rows):
        out.append("ᵍ CUDA graph replay time (--timing graph)")
    if any(r.get("resumed") for r in rows):
        out.append("(r) = row reused from the results file (--resume)")
    return out


def regime_lines(rows: list[dict]) -> list[str]:
    """How the times were taken together (measure/regime.py): the interleaved rounds, the rows timed alone and
    why, and each timed row's GPU state from NVML (SM clock, power, temperature before → after its timed calls,
    the mean over its rounds; the clock-event reasons seen), or why there is none."""
    timed = [r for r in rows if r.get("type") == "result" and r.get("time_ms") is not None]
    inter = [r for r in timed if r.get("regime") == "interleaved"]
    out = []
    if inter:
        r0 = inter[0]
        out.append(f"time: median over {r0.get('regime_rounds')} interleaved rounds per problem (its phases and "
                   f"peers once a round, the order rotated; {r0.get('regime_warmup')} warm-up and "
                   f"{r0.get('regime_calls')} timed calls each, {r0.get('regime_method')}); each row's standalone "
                   "time is kept in its `standalone` field")
        out += [f"{r.get('phase')} [{r.get('label')}] timed alone: {r['regime_note']}" for r in timed
                if r.get("regime") == "standalone" and r.get("regime_note")]
    states = [r for r in timed if r.get("sm_clock_mhz_end") is not None or r.get("power_w_end") is not None]
    if states:
        out.append("GPU state (NVML; before → after the timed calls" + (", mean over the rounds" if inter else "")
                   + "; power averaged over ~1 s by the driver):")
    for r in states:
        parts = []
        for key, unit in (("sm_clock_mhz", "MHz"), ("power_w", "W"), ("temperature_c", "°C")):
            a, b = r.get(f"{key}_start"), r.get(f"{key}_end")
            if a is not None or b is not None:
                parts.append(f"{_f(a, '.0f')}→{_f(b, '.0f')} {unit}")
        events = [e for e in r.get("clocks_events") or () if e != "gpu_idle"]
        if events:
            parts.append("clock events: " + ", ".join(events))
        out.append(f"  {r.get('phase')} [{r.get('label')}]: " + "; ".join(parts))
    notes = {r["nvml_note"] for r in timed if r.get("nvml_note")}
    out += [f"GPU state: {n}" for n in sorted(notes)]
    return out


def _shown_columns(lines: list[list[str]]) -> list[int]:
    """Indices of the columns with at least one value (a simulator run leaves the timing columns empty)."""
    if not lines:
        return list(range(len(HEADER)))
    return [i for i in range(len(HEADER)) if any(line[i] != "—" for line in lines)]


def table(rows: list[dict], drop_empty: bool = False) -> str:
    """The run table as plain text (``drop_empty``: leave out the columns without a value)."""
    lines = cells(rows)
    keep = _shown_columns(lines)
    if not drop_empty:  # every column of a run, the simulator counts where a row has them
        keep = list(range(N_MAIN)) + [i for i in keep if i >= N_MAIN]
    hdr = [HEADER[i] for i in keep]
    lines = [[line[i] for i in keep] for line in lines]
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
    out = []
    ct = ceilings_table(rows)
    if ct:
        out += [ct, ""]
    out += ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)),
            "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
    return "\n".join(out + _notes(rows))


STATUS_STYLE = {"OK": "green", "FAIL": "bold red", "ERROR": "bold red", "TIMEOUT": "red", "SKIP": "yellow"}


def make_console(file=None):
    """A ``rich`` console; wide when the output is not a terminal (a log file keeps whole lines)."""
    from rich.console import Console

    con = Console(file=file, highlight=False)
    if not con.is_terminal:
        con = Console(file=file, highlight=False, width=200)
    return con


def print_table(rows: list[dict], console=None) -> None:
    """The run table through ``rich`` (columns without a value left out), then its notes."""
    from rich.table import Table

    console = console or make_console()
    ct = ceilings_table(rows)
    if ct:
        console.print(ct, highlight=False, markup=False)
        console.print()
    lines = cells(rows)
    keep = _shown_columns(lines)
    tab = Table(box=None, header_style="bold", pad_edge=False)
    for i in keep:
        right = HEADER[i] not in ("phase", "problem", "status")
        tab.add_column(HEADER[i], justify="right" if right else "left", no_wrap=HEADER[i] in ("phase", "problem"))
    for line in lines:
        shown = [line[i] for i in keep]
        st = line[2]
        shown = [f"[{STATUS_STYLE[st]}]{c}[/]" if HEADER[i] == "status" and st in STATUS_STYLE
                 else c.replace("[", "\\[") for i, c in zip(keep, shown)]
        tab.add_row(*shown)
    console.print(tab)
    dropped = [HEADER[i] for i in range(N_MAIN) if i not in keep]  # (the simulator counts: only where counted)
    if dropped and lines:
        console.print(f"(columns without a value left out: {', '.join(dropped)}; "
                      "numba-attn run --explain-columns says what each means)", style="dim", markup=False,
                      soft_wrap=True)
    for note in _notes(rows):
        console.print(note, markup=False, soft_wrap=True)


def legend() -> str:
    return "\n".join(f"  {name:8s} {text}" for name, text in COLUMNS)


def env_summary(env: dict | None) -> str:
    """One line: device, date, commit — for captions and headers."""
    if not env:
        return "environment unknown"
    gpu = env.get("gpu") or env.get("backend") or "?"
    commit = env.get("commit") or (f"source {env['source_hash']}" if env.get("source_hash") else "commit unknown")
    if commit and len(commit) > 20 and "-dirty" not in commit:
        commit = commit[:12]
    elif commit and "-dirty" in commit:
        commit = commit[:12] + "-dirty"
    return f"{gpu} · {str(env.get('date', '?'))[:10]} · {commit}"


def latest_rows(records: list[dict], need: str | None = None) -> tuple[dict | None, list[dict], list[dict]]:
    """(env, result rows, ceiling rows) of the latest environment in a results
    file: rows carrying the last ``env`` record's ``env_key`` (rows of earlier
    runs with the same key, e.g. reused by ``--resume``, included), the last
    row for each (phase, problem). Files without keys: every row, last wins.
    ``need``: a phase that must have a timed row (a roadmap's baseline): the latest
    environment that has one, else the latest (one run's rows either way)."""
    envs = [r for r in records if r.get("type") == "env"]
    if need is not None:
        for env in reversed(envs):
            got = _rows_of_env(records, env)
            if any(r.get("phase") == need and r.get("status") == "OK" and isinstance(r.get("time_ms"), (int, float))
                   for r in got[0]):
                return (env,) + got
    env = envs[-1] if envs else None
    return (env,) + _rows_of_env(records, env)


def _rows_of_env(records: list[dict], env: dict | None) -> tuple[list[dict], list[dict]]:
    """(result rows, ceiling rows) carrying ``env``'s ``env_key`` (every row when it has none), the last row for
    each (phase, problem)."""
    import json

    key = (env or {}).get("env_key")
    res, ceil = {}, {}
    for r in records:
        if key is not None and r.get("env_key") not in (None, key):
            continue
        if r.get("type") == "result":
            res[(r.get("phase"), json.dumps(r.get("problem"), sort_keys=True))] = r
        elif r.get("type") == "ceiling":
            ceil[r.get("name")] = r
    return list(res.values()), list(ceil.values())
