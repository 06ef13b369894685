"""What phase=None picks for issue 42's nine problems on an H100 and an H200, without a GPU (the policy is pure
Python: ``choose_phase(problem, gpu=MODEL)``; the simulator counts as compute capability 9.0), with an empty tuning
cache and nothing measured on first use, beside the best committed time of each problem per GPU (results/*.jsonl,
any phase and parameters) and the configuration phase=None runs there.

    python experiments/2026-11-28-dispatch/picks.py [--json OUT]
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

os.environ["NUMBA_ATTN_TUNING_CACHE"] = os.path.join(tempfile.mkdtemp(), "none.json")  # no tuned entry
os.environ["NUMBA_ATTN_AUTOTUNE"] = "0"
os.environ.setdefault("NUMBA_ATTN_BACKEND", "simulator")

from problems import GPUS, NINE  # noqa: E402

from numba_attn.measure import policy  # noqa: E402
from numba_attn.measure.dispatch import _problem, measured_rows  # noqa: E402


def pick(problem, gpu):
    policy.device_name = lambda: gpu  # (works with choose_phase before its gpu= argument, too)
    ph, why, params = policy.choose_phase(problem)
    if "counts: the entry of " in why:
        source = why.split("counts: the entry of ")[1].split(",")[0].replace("NVIDIA ", "") + "'s table entry"
    elif why.startswith("dispatch table"):
        source = "its own table entry"
    else:
        source = why.split(" (")[0].split(";")[0]
    return ph.name, params, source


def committed_best():
    """(gpu model, label) → (time, phase, requested params, row's params) of the fastest committed row."""
    best = {}
    for _file, _env, r in measured_rows():
        p = r["problem"]
        if p.get("page_size") or p.get("varlen"):
            continue
        try:
            label = _problem(p).label
        except (TypeError, ValueError):
            continue
        key = (r["gpu"], label)
        if key not in best or r["time_ms"] < best[key][0]:
            best[key] = (r["time_ms"], r["phase"], r.get("requested_params") or {}, r.get("params") or {})
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args()
    best = committed_best()
    rows = []
    for p in NINE:
        row = {"problem": p.label}
        for short, gpu in GPUS.items():
            name, params, why = pick(p, gpu)
            b = best.get((gpu, p.label))
            row[short] = {"phase": name, "params": params, "why": why,
                          "best_committed": None if b is None else {"time_ms": b[0], "phase": b[1],
                                                                    "requested": b[2]}}
        rows.append(row)
    head = f"| problem | {' | '.join(f'phase=None {g} | best committed {g}' for g in GPUS)} |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(GPUS)))
    for row in rows:
        cells = [row["problem"]]
        for g in GPUS:
            c = row[g]
            cells.append(f"{c['phase']}{json.dumps(c['params']) if c['params'] else ''} ({c['why']})")
            b = c["best_committed"]
            cells.append("—" if b is None else
                         f"{b['time_ms']:.4g} ms {b['phase']}{json.dumps(b['requested']) if b['requested'] else ''}")
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
