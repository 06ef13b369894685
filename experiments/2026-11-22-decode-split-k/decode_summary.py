"""Summary table of a decode_bench.py results file: per decode shape, SDPA and
every decode phase in the file (default parameters), the best phase's fraction
of the copy bandwidth measured in the same run, and its speed against SDPA.

    python3 experiments/2026-11-22-decode-split-k/decode_summary.py results/archive/decode_final_h200.jsonl
"""
import json
import sys

ORDER = ("decode_chunked", "decode_split_k", "decode_split_k_fused", "decode_split_k_lean", "decode_mma")
SHORT = {"decode_chunked": "chunked", "decode_split_k": "split_k", "decode_split_k_fused": "fused",
         "decode_split_k_lean": "lean", "decode_mma": "mma"}


def main(path):
    rows = [json.loads(line) for line in open(path)]
    copy = next((r["gbps"] for r in rows if r.get("type") == "ceiling"), None)
    by, order = {}, []
    for r in rows:
        if r.get("type") != "result" or r["problem"]["q_len"] > 8:
            continue
        lab = r["label"]
        if lab not in by:
            by[lab] = {}
            order.append(lab)
        if "phase" not in r:
            by[lab]["skip"] = r
            continue
        by[lab][r["phase"] + ("*" if r.get("params") else "")] = r
    present = {k for d in by.values() for k in d}
    PHASES = [p for p in ORDER if p in present]
    print(f"copy bandwidth {copy:.0f} GB/s (read + write)")
    print(f"{'shape':36s} {'SDPA µs':>9s} " + " ".join(f"{SHORT[p]:>9s}" for p in PHASES)
          + f" {'best GB/s':>9s} {'%copy':>6s} {'vs SDPA':>7s}  best")
    for lab in order:
        d = by[lab]
        if "skip" in d:
            print(f"{lab:36s} SKIP {d['skip'].get('reason')}")
            continue
        t = lambda k: d.get(k, {}).get("time_ms") if d.get(k, {}).get("status") == "OK" else None  # noqa: E731
        f = lambda x: f"{x * 1e3:9.1f}" if x else "        -"  # noqa: E731
        ok = [d[k] for k in PHASES if t(k)]
        best = min(ok, key=lambda r: r["time_ms"])
        sd = t("torch_sdpa")
        print(f"{lab:36s} {f(sd)} " + " ".join(f(t(p)) for p in PHASES) + " "
              f"{best['gbps']:9.0f} {100 * best['gbps'] / copy:5.1f}% {sd / best['time_ms'] if sd else 0:6.2f}x  "
              f"{best['phase']}")


if __name__ == "__main__":
    main(sys.argv[1])
