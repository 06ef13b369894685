"""Summarize run.sh's outputs: wall times and their ratio, rows lost or duplicated, the best configurations of the
three runs of the scale sweep; tuned against default time beside SDPA.

Usage: python3 experiments/2026-11-22-tune-scale/summarize.py OUT
"""
import json
import os
import sys


def rows(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                if r.get("type") == "result":
                    out.append(r)
    return out


def cfg(r):
    return json.dumps(r.get("requested_params") or {}, sort_keys=True)


def best(rs):
    out = {}
    for r in rs:
        if r.get("status") == "OK" and r.get("time_ms") and r.get("kind") == "phase":
            k = (r["phase"], r["label"])
            if k not in out or r["time_ms"] < out[k]["time_ms"]:
                out[k] = r
    return {k: (cfg(r), r["time_ms"]) for k, r in out.items()}


def main(out):
    wall = {}
    if os.path.exists(os.path.join(out, "wall.tsv")):
        for line in open(os.path.join(out, "wall.tsv"), encoding="utf-8"):
            name, s = line.split("\t")
            wall[name] = float(s)
    print("1. the scale sweep (the phases and budget of run.sh's SWEEP_PHASES / SWEEP_BUDGET)")
    ref = None
    for name, f in (("workers1", "scale-w1.jsonl"), ("workers2", "scale-w2.jsonl"), ("ray2", "scale-ray2.jsonl"),
                    ("ray2c", "scale-ray2c.jsonl")):
        rs = rows(os.path.join(out, f))
        if not rs:
            print(f"  {name}: no rows")
            continue
        finals = [r for r in rs if r.get("round")]  # a final round's repeats (tune.final_round), not duplicates
        rs = [r for r in rs if not r.get("round")]
        keys = [(r["phase"], r["label"], cfg(r)) for r in rs]
        dup = len(keys) - len(set(keys))
        statuses = {}
        for r in rs:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        b = best(rs)
        gpus = sorted({(r.get("worker") or {}).get("cuda_visible_devices") or "-" for r in rs})
        ratio = f", {wall['workers1'] / wall[name]:.2f}x workers1" if name in wall and "workers1" in wall else ""
        print(f"  {name}: {wall.get(name, float('nan')):.1f} s{ratio}; {len(rs)} rows, {dup} duplicated, "
              f"statuses {statuses}; workers' devices {gpus}"
              + (f"; {len(finals)} final-round row(s)" if finals else ""))
        cache = os.path.join(out, "cache-" + {"workers1": "w1", "workers2": "w2", "ray2": "ray2", "ray2c": "ray2c"}[name] + ".json")
        picked = None
        if os.path.exists(cache):  # the tuner's choice (its tie rule), per phase and across phases
            picked = {}
            for key, e in json.load(open(cache, encoding="utf-8")).get("entries", {}).items():
                chosen = {ph: json.dumps(v.get("params"), sort_keys=True) for ph, v in e.get("phases", {}).items()}
                picked[key] = (e.get("best_phase"), chosen)
                print(f"    chosen: {e.get('best_phase')}; per phase {chosen}")
        stages = {}
        for r in rs:
            for key, v in (r.get("stage_s") or {}).items():
                stages[key] = stages.get(key, 0.0) + v
        if stages:  # where the rows' time went, summed over rows (seconds)
            print(f"    rows' wall summed {sum(r.get('wall_s', 0) for r in rs):.1f} s; by step: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1])))
        for k, (c, t) in sorted(b.items()):
            print(f"    least time {k[0]} [{k[1]}]: {c} {t:.4g} ms")
        if ref is None:
            ref = (name, set(keys), picked)
        else:
            lost = ref[1] - set(keys)
            same = picked == ref[2] if picked is not None and ref[2] is not None else "n/a (no cache)"
            print(f"    against {ref[0]}: {len(lost)} configuration(s) missing; the tuner's choice the same: {same}")
    print("\n2. tuned against default beside SDPA")
    tuned = rows(os.path.join(out, "tuned.jsonl"))
    sdpa = rows(os.path.join(out, "sdpa.jsonl"))
    for (phase, label), (c, t) in sorted(best(tuned).items()):
        default = [r["time_ms"] for r in tuned if r["phase"] == phase and r["label"] == label
                   and not r.get("requested_params") and r.get("status") == "OK" and r.get("time_ms")]
        peers = {r["phase"]: r["time_ms"] for r in sdpa if r.get("kind") == "peer" and r["label"] == label
                 and r.get("status") == "OK" and r.get("time_ms")}
        d = f"{default[0]:.4g} ms" if default else "n/a"
        print(f"  {phase} [{label}]: default {d}, tuned {t:.4g} ms {c}"
              + (f" ({default[0] / t:.2f}x)" if default else ""))
        for name, ms in sorted(peers.items(), key=lambda x: x[1]):
            print(f"    {name}: {ms:.4g} ms (tuned {ms / t:.2f}x of its speed)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tune-scale")
