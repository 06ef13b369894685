"""The ratios of compare.sh's runs: per run of the runner (its regime, the phase's and cuDNN's times, the ratio,
the rounds' range, NVML's SM clock and power), then the alternating measurement's; written as summary.json too.

Usage: python3 experiments/2026-11-28-regime/summarize.py OUT_DIR
"""
import glob
import json
import os
import sys


def runner_runs(path):
    runs, env = {}, {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "env":
            env[r["run_id"]] = r
        elif r.get("type") == "result":
            runs.setdefault(r["run_id"], []).append(r)
    out = []
    for run_id, rows in runs.items():
        peer = next((r for r in rows if r["kind"] == "peer" and r.get("time_ms")), None)
        phase = next((r for r in rows if r["kind"] == "phase" and r.get("time_ms")), None)
        if not (peer and phase):
            out.append({"run_id": run_id, "missing": [r.get("reason") for r in rows]})
            continue
        item = {"run_id": run_id, "gpu": env.get(run_id, {}).get("gpu"), "regime": phase.get("regime"),
                "phase": phase["phase"], "phase_ms": phase["time_ms"], "peer_ms": peer["time_ms"],
                "ratio": phase["time_ms"] / peer["time_ms"], "phase_standalone_ms": (phase.get("standalone") or {})
                .get("time_ms"), "peer_standalone_ms": (peer.get("standalone") or {}).get("time_ms"),
                "nvml": env.get(run_id, {}).get("nvml") or env.get(run_id, {}).get("nvml_note")}
        if phase.get("regime_times_ms") and peer.get("regime_times_ms"):
            per = [a / b for a, b in zip(phase["regime_times_ms"], peer["regime_times_ms"])]
            item.update(round_ratios=per, ratio_min=min(per), ratio_max=max(per), calls=phase.get("regime_calls"))
        for side, r in (("phase", phase), ("peer", peer)):
            item[f"{side}_sm_mhz"] = [r.get("sm_clock_mhz_start"), r.get("sm_clock_mhz_end")]
            item[f"{side}_power_w"] = [r.get("power_w_start"), r.get("power_w_end")]
            item[f"{side}_clocks_events"] = r.get("clocks_events")
        out.append(item)
    return out


def main(out_dir):
    summary = {"runner": [], "alternate": {}}
    for path in sorted(glob.glob(os.path.join(out_dir, "run-*.jsonl"))):
        summary["runner"] += runner_runs(path)
    for path in sorted(glob.glob(os.path.join(out_dir, "alternate-*.json"))):
        a = json.load(open(path))
        summary["alternate"][os.path.basename(path)] = {k: a[k] for k in ("ratio", "ratio_min", "ratio_max",
                                                                          "time_ms", "calls", "idle_s", "nvml")}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for r in summary["runner"]:
        if "ratio" not in r:
            print(f"runner {r['run_id']}: no ratio ({r['missing']})")
            continue
        rng = f" (rounds {r['ratio_min']:.3f}-{r['ratio_max']:.3f}, {r['calls']} calls)" if "ratio_min" in r else ""
        print(f"runner {r['regime']:11s} {r['phase']} {r['phase_ms']:.4f} ms / cuDNN {r['peer_ms']:.4f} ms = "
              f"{r['ratio']:.3f}{rng}; SM MHz phase {r['phase_sm_mhz']}, cuDNN {r['peer_sm_mhz']}; "
              f"W phase {r['phase_power_w']}, cuDNN {r['peer_power_w']}")
    for name, a in summary["alternate"].items():
        print(f"{name}: {a['ratio']:.3f} ({a['ratio_min']:.3f}-{a['ratio_max']:.3f}); {a['time_ms']}; "
              f"{a['calls']} calls, idle {a['idle_s']} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/regime")
