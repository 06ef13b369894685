"""``numba-attn compare A B``: per-phase time ratios between two results files.

Rows are matched by (phase or peer name, problem). For each pair measured in
both files the table shows both median times, ``B/A`` (below 1: B is faster)
and whether the difference exceeds the two rows' own min–max spreads
(``~`` = within the noise). Ceilings are compared the same way, and the
header names each file's device, date and commit, so a ratio between two
different GPUs or two different commits is never mistaken for another.
When a file holds several runs, the rows of its last environment are used
(the last row for each key).

Without times (a simulator run) the rows' counts are compared instead — what
one launch did, counted by :mod:`numba_attn.measure.simcount`: global bytes,
sectors, shared-memory wavefronts, bank conflicts and barriers, each as ``B/A``.
:func:`compare_within` puts rows of one file beside each other: every phase
beside its parent on the same problem (``--parent``), or one named phase beside
another (``--phases A,B``); GPU files get their time ratios the same way.
"""
from __future__ import annotations

import json

from numba_attn.report.table import env_summary, latest_rows
from numba_attn.measure.results import load_results


def _latest(records: list[dict]):
    env, rows, ceil = latest_rows(records)
    return (env, {(r.get("phase"), json.dumps(r.get("problem"), sort_keys=True)): r for r in rows},
            {c.get("name"): c for c in ceil})


# What the counts comparison shows: (column, row fields summed); B/A of each.
COUNTS = [("gmem bytes", ("sim_gmem_read_bytes", "sim_gmem_write_bytes")),
          ("sectors", ("sim_gmem_sectors",)),
          ("smem wavefronts", ("sim_smem_wavefronts",)),
          ("bank conflicts", ("sim_bank_conflicts",)),
          ("barriers", ("sim_barriers", "sim_named_barriers"))]


def count_value(row: dict, fields) -> int | None:
    """The sum of ``fields`` of a row, None when the row was not counted."""
    vals = [row.get(f) for f in fields]
    if any(v is None for v in vals):
        return None
    return int(sum(vals))


def count_ratio(a, b):
    """B/A of two counts: None when either is missing; 1 when both are 0; inf when only A is 0."""
    if a is None or b is None:
        return None
    if a == 0:
        return 1.0 if b == 0 else float("inf")
    return b / a


def _pair(ra: dict, rb: dict) -> dict:
    ta, tb = ra.get("time_ms"), rb.get("time_ms")
    p = {"phase": ra.get("phase"), "label": ra.get("label"), "status_a": ra.get("status"),
         "status_b": rb.get("status"), "time_a_ms": ta, "time_b_ms": tb, "order": ra.get("order", 1e9),
         "kind": ra.get("kind")}
    if ta and tb:
        p["ratio"] = tb / ta
        noise = max(ra.get("spread") or 0.0, rb.get("spread") or 0.0, 0.02)
        p["significant"] = abs(p["ratio"] - 1) > noise
    counts = {}
    for name, fields in COUNTS:
        a, b = count_value(ra, fields), count_value(rb, fields)
        if a is not None and b is not None:
            counts[name] = {"a": a, "b": b, "ratio": count_ratio(a, b)}
    if counts:
        p["counts"] = counts
    return p


def compare(path_a: str, path_b: str) -> dict:
    """Matched rows of two results files: {"env_a", "env_b", "pairs": [...], "ceilings": [...]}."""
    env_a, rows_a, ceil_a = _latest(load_results(path_a))
    env_b, rows_b, ceil_b = _latest(load_results(path_b))
    pairs = []
    for key, ra in rows_a.items():
        rb = rows_b.get(key)
        if rb is None:
            continue
        pairs.append(_pair(ra, rb))
    pairs.sort(key=lambda p: (p["label"] or "", p["kind"] != "phase", p["order"] if p["order"] is not None else 1e9,
                              p["phase"] or ""))
    only_a = sorted(f"{r.get('phase')} [{r.get('label')}]" for k, r in rows_a.items() if k not in rows_b)
    only_b = sorted(f"{r.get('phase')} [{r.get('label')}]" for k, r in rows_b.items() if k not in rows_a)
    ceilings = []
    for name in sorted(set(ceil_a) | set(ceil_b)):
        va = (ceil_a.get(name) or {}).get("value")
        vb = (ceil_b.get(name) or {}).get("value")
        ceilings.append({"name": name, "a": va, "b": vb, "unit": (ceil_a.get(name) or ceil_b.get(name)).get("unit"),
                         "ratio": (vb / va) if va and vb else None})
    return {"env_a": env_a, "env_b": env_b, "pairs": pairs, "ceilings": ceilings, "only_a": only_a,
            "only_b": only_b}


def compare_within(path: str, phases: tuple | None = None) -> dict:
    """Rows of one results file side by side on the same problem: ``phases=(A, B)`` puts phase B beside phase A;
    without it every phase is put beside its parent (A = the parent, B = the phase). The same structure as
    :func:`compare` (``pairs`` with ``parent``, the A side's name); no ceilings."""
    env, rows, _ = _latest(load_results(path))
    by_problem = {}
    for (name, prob), r in rows.items():
        by_problem.setdefault(prob, {})[name] = r
    pairs = []
    for prob, named in by_problem.items():
        if phases:
            a, b = phases
            if a in named and b in named:
                pairs.append({**_pair(named[a], named[b]), "phase": b, "parent": a,
                              "order": named[b].get("order", 1e9)})
            continue
        for name, r in named.items():
            parent = r.get("parent")
            if r.get("kind") == "phase" and parent and parent in named:
                pairs.append({**_pair(named[parent], r), "phase": name, "parent": parent,
                              "order": r.get("order", 1e9)})
    pairs.sort(key=lambda p: (p["label"] or "", p["order"] if p["order"] is not None else 1e9, p["phase"] or ""))
    return {"env_a": env, "env_b": env, "pairs": pairs, "ceilings": [], "only_a": [], "only_b": [],
            "within": tuple(phases) if phases else "parent"}


WIDTH = 100  # the header lines and the only-in lists wrap at this width (the table's rows do not)


def _t(ms):
    if ms is None:
        return "—"
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.3f} ms"


def _wrapped_list(head: str, names, limit: int = 40, width: int = WIDTH) -> str:
    """``names`` as indented lines of at most ``width`` characters; past ``limit`` names, a count."""
    import textwrap

    names = list(names)
    shown = names[:limit] + ([f"… and {len(names) - limit} more"] if len(names) > limit else [])
    return head + "\n" + textwrap.fill("; ".join(shown), width, initial_indent="  ", subsequent_indent="  ",
                                       break_on_hyphens=False)


def _file_line(side: str, name: str, env) -> str:
    """``A = PATH: device · date · commit``; the summary on its own line when a long path would widen it."""
    one = f"{side} = {name}: {env_summary(env)}"
    return one if len(one) <= WIDTH else f"{side} = {name}:\n    {env_summary(env)}"


def _x(ratio) -> str:
    if ratio is None:
        return "—"
    if ratio == float("inf"):
        return "new"
    return f"{ratio:.3g}"


def _counts_lines(res: dict) -> list[str]:
    """The counts table: per pair B/A of each count (and the A → B values of bank conflicts and barriers)."""
    within = "within" in res
    hdr = ["phase"] + (["vs"] if within else []) + ["problem"] + [f"{n} B/A" for n, _ in COUNTS[:3]] + \
          ["bank conflicts A→B", "barriers A→B"]
    lines = []
    for p in res["pairs"]:
        c = p.get("counts")
        if not c:
            continue
        cells = [p["phase"]] + ([p.get("parent") or "—"] if within else []) + [p["label"]]
        cells += [_x((c.get(n) or {}).get("ratio")) for n, _ in COUNTS[:3]]
        for n in ("bank conflicts", "barriers"):
            v = c.get(n)
            cells.append("—" if v is None else f"{v['a']}→{v['b']}")
        lines.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
    out = ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
    if not lines:
        out.append("(no pair with counts)")
    return out


def format_comparison(res: dict, name_a="A", name_b="B") -> str:
    within = res.get("within")
    if within:
        head = ("each phase (B) against its parent (A) on the same problem" if within == "parent"
                else f"A = {within[0]}, B = {within[1]}, on the same problem")
        out = [f"{name_a}: {env_summary(res['env_a'])}", head]
    else:
        out = [_file_line("A", name_a, res["env_a"]), _file_line("B", name_b, res["env_b"])]
    ea, eb = res["env_a"] or {}, res["env_b"] or {}
    if ea.get("gpu") != eb.get("gpu"):
        out.append(f"note: different devices ({ea.get('gpu')} vs {eb.get('gpu')})")
    out.append("")
    timed = any(p.get("ratio") is not None for p in res["pairs"])
    if not timed and any(p.get("counts") for p in res["pairs"]):
        out += _counts_lines(res)
        out.append("\nno times (simulator rows): B/A of what one launch did, counted in the simulator — global bytes "
                   "read + written, 32-byte sectors, shared-memory wavefronts (numba-attn run --explain-columns); "
                   "new = A counted none")
        return "\n".join(out)
    hdr = ["phase"] + (["vs"] if within else []) + ["problem", "A", "B", "B/A", ""]
    lines = []
    for p in res["pairs"]:
        if p.get("ratio") is not None:
            r = f"{p['ratio']:.3f}"
            mark = ("faster" if p["ratio"] < 1 else "slower") if p["significant"] else "~"
        else:
            r, mark = "—", f"{p['status_a']} / {p['status_b']}"
        lines.append([p["phase"]] + ([p.get("parent") or "—"] if within else [])
                     + [p["label"], _t(p["time_a_ms"]), _t(p["time_b_ms"]), r, mark])
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
    out.append("  ".join(h.ljust(w) for h, w in zip(hdr, widths)))
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
    if not lines:
        out.append("(no pair of rows on the same problem)" if within else "(no row is in both files)")
    if res["ceilings"]:
        out.append("")
        out.append("ceilings:")
        for c in res["ceilings"]:
            fa = "—" if c["a"] is None else f"{c['a']:.1f}"
            fb = "—" if c["b"] is None else f"{c['b']:.1f}"
            rr = "" if c["ratio"] is None else f"  B/A {c['ratio']:.3f}"
            out.append(f"  {c['name']:9s} A {fa:>9s}  B {fb:>9s} {c['unit'] or ''}{rr}")
    for side, names in (("A", res["only_a"]), ("B", res["only_b"])):
        if names:
            out.append("")
            one = f"only in {side}: {', '.join(names)}"
            out.append(one if len(one) <= WIDTH else _wrapped_list(f"only in {side} ({len(names)} rows):", names))
    out.append("\nB/A < 1: B is faster; ~ = within the larger of the two rows' min–max spreads (or 2%)")
    return "\n".join(out)
