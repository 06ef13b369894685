"""Result rows as a terminal table (and the meaning of each column)."""
from __future__ import annotations

COLUMNS = [
    ("phase", "phase (or peer) name"),
    ("problem", "B batch, H heads, N length (Nq/Nk when they differ), D head_dim, storage dtype"),
    ("status", "OK: correct (and timed on a GPU); FAIL: wrong or implausible; ERROR: raised; "
               "TIMEOUT: exceeded the time limit; SKIP: problem out of the phase's range"),
    ("rel_err", "‖out − ref‖/‖ref‖ against the float64 reference (worst seed)"),
    ("time", "median kernel time (events around back-to-back launches, host launch cost excluded)"),
    ("TFLOP/s", "4·D per unmasked (query, key) pair per head, over the median time"),
    ("GB/s", "fewest bytes a fused kernel must move (Q, K, V read once, O written once) over the time"),
    ("speedup", "baseline phase time / this time, same problem, same run"),
    ("plan", "planned speedup against the baseline from the roadmap"),
    ("regs", "registers per thread (largest kernel of the phase)"),
    ("smem", "static shared memory per block, bytes"),
    ("local", "local memory per thread, bytes: spills and local arrays (non-zero is a finding)"),
]


def _fmt_time(ms):
    if ms is None:
        return "—"
    if ms < 1:
        return f"{ms * 1e3:.1f} µs"
    return f"{ms:.3f} ms"


def _f(x, fmt):
    return "—" if x is None else format(x, fmt)


def table(rows: list[dict]) -> str:
    hdr = ["phase", "problem", "status", "rel_err", "time", "TFLOP/s", "GB/s", "speedup", "plan",
           "regs", "smem", "local"]
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
        lines.append([
            r.get("phase", "?"), r.get("label", ""), r.get("status", "?"),
            _f(chk.get("rel_err"), ".1e"), time_s, _f(r.get("tflops"), ".2f"), _f(r.get("gbps"), ".0f"),
            _f(r.get("speedup"), ".1f") + ("x" if r.get("speedup") else ""),
            _f(r.get("planned_speedup"), "g") + ("x" if r.get("planned_speedup") else ""),
            _f(r.get("regs"), "d"), _f(r.get("smem_static"), "d"),
            _f(r.get("local_bytes"), "d"),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
    out = ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
    reasons = [(r.get("phase"), r.get("label"), r.get("status"), r.get("reason")) for r in rows
               if r.get("type") == "result" and r.get("status") not in ("OK",) and r.get("reason")]
    if reasons:
        out.append("")
        out += [f"{p} [{lab}] {st}: {why}" for p, lab, st, why in reasons]
    if any(r.get("launch_bound") for r in rows):
        out.append("* launch-bound: the kernel is shorter than the host's launch cost; the time is the launch rate")
    return "\n".join(out)


def legend() -> str:
    return "\n".join(f"  {name:8s} {text}" for name, text in COLUMNS)
