"""The result tables of the README and of docs/results.md, generated from the committed results files.

Each table sits between markers in README.md or docs/results.md::

    <!-- table:roadmap start -->
    ...generated...
    <!-- table:roadmap end -->

    numba-attn readme            # rewrite every table of both files in place
    numba-attn readme --check    # exit 1 when a table differs from its results file
    python -m numba_attn.report.readme [--check]

A test runs the check, so a table cannot disagree with its results file.
"""
from __future__ import annotations

import re
import sys

from numba_attn.report import records as rec

README = "README.md"
DOCS = (README, "docs/results.md")  # the files whose marked tables are generated

ROADMAP = "results/roadmap-nvidia-h200.jsonl"
TENSOR_CORE = "results/tensor-core-nvidia-h200.jsonl"
DECODE = "results/decode-nvidia-h200.jsonl"
LONG_CONTEXT = "results/long-context-nvidia-h200.jsonl"
HEAD_DIMS = "results/head-dims-nvidia-h100.jsonl"

ROADMAP_SHAPE = "B1 H32 N4096 D64"


def _latest(path):
    from numba_attn.report.table import latest_rows

    env, rows, ceilings = latest_rows(rec.load(rec.repo_path(path)))
    return env, rows, {c.get("name"): c for c in ceilings}


def _find(rows, phase, label):
    for r in rows:
        if r.get("phase") == phase and r.get("label") == label:
            return r
    return None


def _ok(r):
    return r is not None and r.get("status") == "OK" and r.get("time_ms")


def _command(cmd: str) -> str:
    """The recorded command without its output paths (``--results``/``--plots`` name the machine's folders)."""
    return re.sub(r"\s--(results|plots)(=|\s+)\S+", "", cmd or "?")


def _env_line(env, path, extra=""):
    e = env or {}
    clock = f", {e['sm_clock_mhz']} MHz" if e.get("sm_clock_mhz") else ""
    torch = f", torch {e['torch']}" if e.get("torch") else ""
    return (f"{e.get('gpu', '?')} ({e.get('sm_count', '?')} SMs{clock}, driver {e.get('driver', '?')}, "
            f"numba {e.get('numba', '?')}, numba-cuda {e.get('numba_cuda', '?')}{torch}), commit "
            f"{e.get('commit') or 'not recorded'}, {str(e.get('date', '?'))[:10]}{extra}; "
            f"`{path}`, command `{_command(e.get('command'))}`.")


def _x(v):
    """A speedup: one decimal below 100, none above."""
    return "—" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def roadmap_table() -> str:
    """One row per phase at B1 H32 N4096 D64 (fp32, or fp16 where the phase needs it), then SDPA."""
    from numba_attn.phases.registry import get_phase

    env, rows, _ = _latest(ROADMAP)
    out = [_env_line(env, ROADMAP, f", {ROADMAP_SHAPE}, every row checked against float64 before and after timing"),
           "",
           "| # | phase | one change against its parent | time | TFLOP/s | × naive (planned) |",
           "|---:|---|---|---:|---:|---:|"]
    names = []
    for r in rows:
        if r.get("kind") == "phase" and r.get("phase") not in names:
            names.append(r.get("phase"))
    order = {n: (r.get("order") if r.get("order") is not None else 1e9) for r in rows for n in [r.get("phase")]}
    for name in sorted(names, key=lambda n: (order.get(n, 1e9), n)):
        for dt in ("fp32", "fp16"):
            r = _find(rows, name, f"{ROADMAP_SHAPE} {dt}")
            if _ok(r):
                break
        else:
            continue
        try:
            title = get_phase(name).title
        except KeyError:
            title = ""
        tag = "" if dt == "fp32" else f" ({dt})"
        plan = f"{r['planned_speedup']:g}" if r.get("planned_speedup") else "—"
        out.append(f"| {r.get('order', ''):g} | `{name}`{tag} | {title} | {rec.fmt_ms(r['time_ms'])} | "
                   f"{rec.fmt_sig(r.get('tflops'))} | {_x(r.get('speedup'))} ({plan}) |")
    peers = [_find(rows, "torch_sdpa", f"{ROADMAP_SHAPE} {dt}") for dt in ("fp32", "fp16")]
    if all(_ok(p) for p in peers):
        out.append("| | PyTorch SDPA fp32 / fp16 | | "
                   + " / ".join(rec.fmt_ms(p["time_ms"]) for p in peers) + " | "
                   + " / ".join(rec.fmt_sig(p.get("tflops")) for p in peers) + " | "
                   + " / ".join(_x(p.get("speedup")) for p in peers) + " |")
    return "\n".join(out)


CEILING_NAMES = {"ffma": "FFMA (numba kernel)", "mma_fp16": "`mma.sync` f16 (numba)", "mma_tf32": "`mma.sync` tf32 (numba)",
                 "wgmma_fp16": "`wgmma` f16 (numba)", "cublas_fp16": "cuBLAS fp16 GEMM", "copy": "device copy"}


def ceilings_table() -> str:
    env, _, ceil = _latest(ROADMAP)
    out = [f"Ceilings measured in the same run (`{ROADMAP}`):", "", "| ceiling | measured |", "|---|---:|"]
    for name, c in ceil.items():
        if c.get("status") != "OK" or c.get("value") is None:
            continue
        unit = c.get("unit") or ""
        val = f"{c['value'] / 1000:.2f} TB/s" if unit == "GB/s" else f"{rec.fmt_sig(c['value'])} {unit}"
        out.append(f"| {CEILING_NAMES.get(name, name)} | {val} |")
    return "\n".join(out)


def _versus_table(path, phases, peer, problems=None, time_fmt=rec.fmt_ms, copy=False, caption=""):
    env, rows, ceil = _latest(path)
    labels = []
    for r in rows:
        if r.get("phase") in phases and _ok(r) and r.get("label") not in labels:
            labels.append(r.get("label"))
    if problems:
        labels = [lb for lb in labels if any(p in lb for p in problems)]
    hdr = ["problem"] + [f"`{p}`" for p in phases] + ["SDPA", "SDPA time / best"]
    if copy:
        hdr.append("best GB/s")
    out = [_env_line(env, path) + (" " + caption if caption else ""), "",
           "| " + " | ".join(hdr) + " |", "|---" + "|---:" * (len(hdr) - 1) + "|"]
    copy_gbps = (ceil.get("copy") or {}).get("value")
    if copy and copy_gbps:
        out[0] += f" Device copy in the same run: {copy_gbps:.0f} GB/s (GB/s: the fewest bytes a kernel must move)."
    for lb in labels:
        cells = [lb]
        best = None
        for p in phases:
            r = _find(rows, p, lb)
            if _ok(r):
                cells.append(time_fmt(r["time_ms"]) + ("" if copy else f" ({rec.fmt_sig(r.get('tflops'))} TFLOP/s)"))
                if best is None or r["time_ms"] < best["time_ms"]:
                    best = r
            else:
                cells.append(r.get("status", "—") if r else "—")
        s = _find(rows, peer, lb)
        cells.append(time_fmt(s["time_ms"]) if _ok(s) else "—")
        cells.append(f"{s['time_ms'] / best['time_ms']:.2f}×" if _ok(s) and best else "—")
        if copy:
            cells.append(f"{best['gbps']:.0f}" if best and best.get("gbps") else "—")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def tensor_core_table() -> str:
    return _versus_table(TENSOR_CORE, ["tc_pipelined", "tc_wgmma"], "torch_sdpa", problems=("fp16", "bf16"),
                         caption="SDPA time / best above 1: faster than SDPA.")


def decode_table() -> str:
    return _versus_table(DECODE, ["decode_split_k_lean", "decode_mma"], "torch_sdpa", time_fmt=rec.fmt_us, copy=True)


def long_context_table() -> str:
    return _versus_table(LONG_CONTEXT, ["tc_wgmma"], "torch_sdpa", problems=("fp16",))


def head_dims_table() -> str:
    """What ``phase=None`` runs at fp16 B1 H32 N4096 for every head dim in the file (one run per head
    dim), beside SDPA in the same run; TFLOP/s relative to the phase's own at D=128."""
    rows = rec.load(rec.repo_path(HEAD_DIMS))
    env = next((r for r in rows if r.get("type") == "env"), {})
    found = {}
    for r in rows:
        if r.get("type") != "env" and _ok(r):
            found.setdefault(r["problem"]["head_dim"], {})["sdpa" if r["phase"].startswith("torch_sdpa") else "phase"] = r
    ref = (found.get(128) or {}).get("phase")
    out = [_env_line(env, HEAD_DIMS).replace(f", command `{_command(env.get('command'))}`", "")
           + " One run per head dim (`numba-attn run --phases <the phase phase=None picked at that commit> -B 1 -H 32 -N 4096 "
           "-D <head_dim> --dtype float16 --peers torch_sdpa`).", "",
           "| head_dim | phase (picked then) | time | TFLOP/s | per FLOP vs D=128 | SDPA | SDPA time / phase |",
           "|---:|---|---:|---:|---:|---:|---:|"]
    for D in sorted(found):
        ph, sd = found[D].get("phase"), found[D].get("sdpa")
        if not ph:
            continue
        rel = f"{ph['tflops'] / ref['tflops']:.2f}" if ref and ph.get("tflops") else "—"
        out.append(f"| {D} | `{ph['phase']}` | {rec.fmt_ms(ph['time_ms'])} | {rec.fmt_sig(ph.get('tflops'))} | {rel} | "
                   + (f"{rec.fmt_ms(sd['time_ms'])} | {sd['time_ms'] / ph['time_ms']:.2f}× |" if sd else "— | — |"))
    return "\n".join(out)


def headline_table() -> str:
    """The README's headline: per family, the fastest phase against the fastest SDPA of the same run (the pairs
    ``plots/headline.png`` draws, from the same function)."""
    from numba_attn.report.plots import headline_pairs

    out = ["| family | problem | fastest phase | its time | SDPA, same run | speed vs SDPA | run |",
           "|---|---|---|---:|---:|---:|---|"]
    for p in headline_pairs():
        fmt = rec.fmt_us if p["phase_ms"] < 1 and p["family"].lower().find("decode") >= 0 else rec.fmt_ms
        peer = p["peer_backend"] or p["peer"].replace("torch_sdpa", "").strip("_") or "auto"
        where = "" if p["peer_label"] == p["label"] else ", contiguous cache"
        out.append(f"| {p['family']} | {p['label']} | `{p['phase']}` | {fmt(p['phase_ms'])} | "
                   f"{fmt(p['peer_ms'])} ({peer}{where}) | {p['ratio']:.2f}× | {p['gpu']}, `results/{p['file']}`, "
                   f"{p['commit']}, {p['time_method']} |")
    return "\n".join(out)


def columns_table() -> str:
    """What each column and mark of the run table means (also ``numba-attn run --explain-columns``)."""
    from numba_attn.report.table import columns_markdown

    return columns_markdown()


TABLES = {
    "headline": headline_table,
    "columns": columns_table,
    "roadmap": roadmap_table,
    "ceilings": ceilings_table,
    "tensor-core": tensor_core_table,
    "long-context": long_context_table,
    "decode": decode_table,
    "head-dims": head_dims_table,
}

_BLOCK = re.compile(r"(<!-- table:([\w-]+) start -->\n)(.*?)(<!-- table:\2 end -->)", re.S)


def render(text: str) -> str:
    """``text`` with every marked table regenerated (unknown table names are an error)."""
    def sub(m):
        name = m.group(2)
        if name not in TABLES:
            raise KeyError(f"README marker names an unknown table {name!r}; tables: {', '.join(TABLES)}")
        return m.group(1) + TABLES[name]() + "\n" + m.group(4)

    return _BLOCK.sub(sub, text)


def stale(path: str | None = None) -> list[str]:
    """Names of the marked tables in ``path`` that differ from their regeneration."""
    path = path or rec.repo_path(README)
    text = open(path).read()
    return [m.group(2) for m in _BLOCK.finditer(text)
            if m.group(3) != TABLES.get(m.group(2), lambda: None)() + "\n"]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="numba-attn readme",
                                 description="regenerate the result tables of README.md and docs/results.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when a table differs from its results file")
    ap.add_argument("--readme", default=None,
                    help="the one file to rewrite (default: README.md and docs/results.md of the repository)")
    args = ap.parse_args(argv)
    return run(args.readme, args.check)


def run(path=None, check=False) -> int:
    paths = [path] if path else [rec.repo_path(p) for p in DOCS]
    if check:
        bad = [(p, name) for p in paths for name in stale(p)]
        for p, name in bad:
            print(f"{rec.rel(p)}: table {name!r} differs from its results file "
                  "(regenerate: numba-attn readme)", file=sys.stderr)
        return 1 if bad else 0
    for p in paths:
        text = open(p).read()
        new = render(text)
        if new != text:
            with open(p, "w") as f:
                f.write(new)
            print(f"{rec.rel(p)}: tables rewritten")
        else:
            print(f"{rec.rel(p)}: tables up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
