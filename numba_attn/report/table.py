"""Result rows as a terminal table (and the meaning of each column)."""
from __future__ import annotations

COLUMNS = [
    ("phase", "phase (or peer) name"),
    ("problem", "B batch, H heads, N length (Nq/Nk when they differ), D head_dim, storage dtype"),
    ("status", "OK: correct (and timed on a GPU); FAIL: wrong or implausible; ERROR: raised; "
               "TIMEOUT: exceeded the time limit; SKIP: problem out of the phase's range (reason below)"),
    ("rel_err", "‖out − ref‖/‖ref‖ against the float64 reference (worst seed)"),
    ("time", "median kernel time (events around back-to-back launches, host launch cost excluded); "
             "* = launch-bound"),
    ("±", "(max − min)/median of the timing samples"),
    ("e2e", "end-to-end time of one Python call plus synchronize (launch overhead included)"),
    ("TFLOP/s", "4·D per unmasked (query, key) pair per head, over the median time"),
    ("GB/s", "fewest bytes a fused kernel must move (Q, K, V read once, O written once) over the time"),
    ("%ceil", "fraction of the measured ceiling that applies: FFMA (CUDA cores), mma (tensor cores) "
              "or copy bandwidth (decode)"),
    ("speedup", "baseline phase time / this time, same problem, same run"),
    ("plan", "planned speedup against the baseline from the roadmap"),
    ("regs", "registers per thread (largest kernel of the phase)"),
    ("smem", "static shared memory per block, bytes"),
    ("local", "local memory per thread, bytes: spills and local arrays (non-zero is a finding)"),
]

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


def table(rows: list[dict]) -> str:
    hdr = ["phase", "problem", "status", "rel_err", "time", "±", "e2e", "TFLOP/s", "GB/s", "%ceil", "speedup",
           "plan", "regs", "smem", "local"]
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
        if r.get("resumed"):
            time_s += " (r)"
        frac = r.get("frac_ceiling")
        frac_s = "—" if frac is None else f"{frac:.0%}{CEILING_SHORT.get(r.get('ceiling'), '')}"
        lines.append([
            r.get("phase", "?"), r.get("label", ""), r.get("status", "?"),
            _f(chk.get("rel_err"), ".1e"), time_s,
            "—" if r.get("spread") is None or not r.get("time_ms") else f"{r['spread']:.0%}",
            _fmt_time(r.get("e2e_ms")) if r.get("e2e_ms") else "—",
            _f(r.get("tflops"), ".2f"), _f(r.get("gbps"), ".0f"), frac_s,
            _f(r.get("speedup"), ".1f") + ("x" if r.get("speedup") else "") + ("†" if r.get("speedup_vs") else ""),
            _f(r.get("planned_speedup"), "g") + ("x" if r.get("planned_speedup") else ""),
            _f(r.get("regs"), "d"), _f(r.get("smem_static"), "d"),
            _f(r.get("local_bytes"), "d"),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
    out = []
    ct = ceilings_table(rows)
    if ct:
        out += [ct, ""]
    out += ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)),
            "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
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
    if any(r.get("launch_bound") for r in rows):
        out.append("* launch-bound: the kernel is shorter than the host's launch cost; the time is the launch rate")
    if any(r.get("frac_ceiling") is not None for r in rows):
        out.append("%ceil: F = of the FFMA ceiling, M = of the fp16 mma ceiling, T = of the tf32 mma ceiling, "
                   "B = of copy bandwidth")
    if any(r.get("speedup_vs") for r in rows):
        out.append("† speedup against the baseline on the same shape in another dtype (e.g. naive fp32 for an "
                   "fp16 tensor-core row)")
    if any(r.get("resumed") for r in rows):
        out.append("(r) = row reused from the results file (--resume)")
    return "\n".join(out)


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


def latest_rows(records: list[dict]) -> tuple[dict | None, list[dict], list[dict]]:
    """(env, result rows, ceiling rows) of the latest environment in a results
    file: rows carrying the last ``env`` record's ``env_key`` (rows of earlier
    runs with the same key, e.g. reused by ``--resume``, included), the last
    row for each (phase, problem). Files without keys: every row, last wins."""
    import json

    envs = [r for r in records if r.get("type") == "env"]
    env = envs[-1] if envs else None
    key = (env or {}).get("env_key")
    res, ceil = {}, {}
    for r in records:
        if key is not None and r.get("env_key") not in (None, key):
            continue
        if r.get("type") == "result":
            res[(r.get("phase"), json.dumps(r.get("problem"), sort_keys=True))] = r
        elif r.get("type") == "ceiling":
            ceil[r.get("name")] = r
    return env, list(res.values()), list(ceil.values())
