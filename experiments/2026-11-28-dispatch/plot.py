"""Issue 42's nine prefill problems beside the peers, from check.py's JSON: the speed of numba-attn's fastest phase
and of phase=None relative to SDPA cuDNN (1 = cuDNN's speed), with FlashAttention-4's beside them, all timed in the
same interleaved rounds of one process (CUPTI kernel time).

    python experiments/2026-11-28-dispatch/plot.py RESULTS.json [FIX.json] [--fa4-from OLDER.json] --out plots/prefill_peers

``--fa4-from``: FlashAttention-4's bars from another run's JSON where RESULTS has none (each bar its speed against the
cuDNN of its own run; the title names both commits).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("fix", nargs="?", help="a later run of some problems (its phase=None replaces the first's)")
    ap.add_argument("--out", required=True, help="path without extension: .png and .svg are written")
    ap.add_argument("--fa4-from", help="a check.py JSON whose FA4 times (against its own cuDNN) are drawn")
    a = ap.parse_args()
    other = json.load(open(a.fa4_from)) if a.fa4_from else None
    fa4_old = {p["problem"]: p["median_ms"] for p in other["problems"]} if other else {}
    d = json.load(open(a.results))
    fix = {p["problem"]: p for p in json.load(open(a.fix))["problems"]} if a.fix else {}
    labels, best, none, fa4 = [], [], [], []
    for p in d["problems"]:
        m = p["median_ms"]
        cudnn = m["peer cudnn"]
        q = fix.get(p["problem"], p)
        labels.append(p["problem"].replace(" D", "\nD"))
        best.append(cudnn / p["fastest_ms"])
        none.append(q["median_ms"].get("peer cudnn", cudnn) / q["median_ms"]["phase=None"])
        o = fa4_old.get(p["problem"], {})
        fa4.append(cudnn / m["peer fa4"] if "peer fa4" in m else
                   o["peer cudnn"] / o["peer fa4"] if "peer fa4" in o else float("nan"))
    x = range(len(labels))
    fig, ax = plt.subplots(figsize=(12, 4.6))
    w = 0.27
    ax.bar([i - w for i in x], best, w, label="numba-attn, fastest phase", color="#2b7bba")
    ax.bar(list(x), none, w, label="numba-attn, phase=None (measured on first use)", color="#8cc0e8")
    ax.bar([i + w for i in x], fa4, w, color="#e0803a",
           label="FlashAttention-4" + (f" (commit {other['commit']}'s run)" if other else ""))
    ax.axhline(1.0, color="k", lw=1)
    ax.text(len(labels) - 0.5, 1.01, "SDPA cuDNN", ha="right", va="bottom", fontsize=9)
    ax.axhline(0.95, color="k", lw=0.8, ls=":")
    ax.text(-0.5, 0.955, "target 0.95", ha="left", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("speed relative to SDPA cuDNN")
    ax.set_ylim(0.5, 1.25)
    gpu = d["gpu"]["gpu"]
    later = f"; phase=None at {', '.join(p.split(' D')[0] for p in fix)}: {json.load(open(a.fix))['commit']}" \
        if fix else ""
    ax.set_title(f"Prefill, issue 42's nine problems: {gpu}, CUPTI kernel time, one process, interleaved rounds\n"
                 f"(commit {d['commit']}{later})", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{a.out}.{ext}", dpi=130)


if __name__ == "__main__":
    main()
