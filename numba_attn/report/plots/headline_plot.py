"""The README's headline (``headline``): per family, the best phase beside the best SDPA of the same run."""
from __future__ import annotations

import json
import os
from collections import OrderedDict

import matplotlib.pyplot as plt

from numba_attn.report.plots.style import fastest_peer, ok_time, save_figure

# (family, results file stem, phase family test, problem label, label of the peer's problem (None: the same))
HEADLINE = (
    ("CUDA-core prefill, fp32", "roadmap", "cuda_core", "B1 H32 N4096 D128 fp32", None),
    ("Tensor-core prefill, fp16", "tensor-core-tma", "tensor_core", "B1 H32 N4096 D128 fp16", None),
    ("Decode, fp16 (GQA 32/8)", "decode", "decode", "B8 H32/8kv Nq1 Nk32768 D128 fp16", None),
    ("Paged decode, fp16, 64-token pages", "paged", "paged", "B8 H32 Nq1 Nk16384 D128 fp16 paged P64",
     "B8 H32 Nq1 Nk16384 D128 fp16"),
)


def _family_of(name: str) -> str | None:
    """cuda_core, tensor_core, decode (contiguous cache) or paged for a registered phase; None otherwise (peers,
    variants defined only in an experiment's setup)."""
    try:
        from numba_attn.api import get_phase

        ph = get_phase(name)
    except Exception:  # noqa: BLE001 - not a registered phase
        return None
    fam = ph.module.split(".")[-2] if ph.module.count(".") >= 2 else None
    if fam == "decode" and getattr(ph, "layout", "contiguous") == "paged":
        return "paged"
    return fam


def headline_pairs(results_dir=None, gpu="nvidia-h200", spec=HEADLINE) -> list[dict]:
    """Per family of ``spec``: the fastest registered phase of the family (default parameters) on the problem,
    and the fastest SDPA peer in the problem's dtype, both from the same run (``run_id``: one env record, one
    commit) of ``results/<stem>-<gpu>.jsonl``; the latest run of the file that has both. A family whose file or
    run is missing is left out."""
    from numba_attn.measure.results import load_results
    from numba_attn.report import records as rec

    results_dir = results_dir or rec.repo_path("results")
    out = []
    for family, stem, fam, label, peer_label in spec:
        path = os.path.join(results_dir, f"{stem}-{gpu}.jsonl")
        if not os.path.exists(path):
            continue
        records = load_results(path)
        envs = {r.get("run_id"): r for r in records if r.get("type") == "env"}
        # a problem measured twice in one run (overlapping presets): its last rows, as latest_rows keeps them
        last = OrderedDict()
        for r in records:
            if r.get("type") == "result":
                last[(r.get("run_id"), r.get("phase"), json.dumps(r.get("problem"), sort_keys=True))] = r
        rows = [r for r in last.values() if ok_time(r)]
        best = None
        for run_id in reversed(list(OrderedDict.fromkeys(r.get("run_id") for r in rows if r.get("run_id")))):
            mine = [r for r in rows if r.get("run_id") == run_id and r.get("kind") == "phase"
                    and r.get("label") == label and not r.get("requested_params") and _family_of(r["phase"]) == fam]
            if not mine:
                continue
            ph = min(mine, key=lambda r: r["time_ms"])
            pr = fastest_peer(rows, ph, peer_label or label)
            if pr is not None:
                best = (ph, pr, envs.get(run_id) or {})
                break
        if best is None:
            continue
        ph, pr, env = best
        out.append({"family": family, "file": os.path.basename(path), "label": label,
                    "peer_label": peer_label or label, "phase": ph["phase"], "phase_ms": ph["time_ms"],
                    "peer": pr["phase"], "peer_ms": pr["time_ms"],
                    "peer_backend": pr.get("sdpa_backend_ran") or "", "ratio": pr["time_ms"] / ph["time_ms"],
                    "run_id": ph["run_id"], "commit": str(env.get("commit") or "")[:7],
                    "date": str(env.get("date") or "")[:10], "gpu": env.get("gpu") or gpu,
                    "time_method": ph.get("time_method") or "events"})
    return out


def headline(out_dir="plots", results_dir=None, gpu="nvidia-h200", stem="headline") -> list[str]:
    """One picture for the README: per family, the best phase's speed against the best PyTorch SDPA measured in
    the same run (SDPA time / phase time, so that 1 is SDPA's speed), the problem and both times named."""
    pairs = headline_pairs(results_dir, gpu)
    if not pairs:
        return []
    fig, ax = plt.subplots(figsize=(9.0, 1.05 * len(pairs) + 1.9))
    ys = list(range(len(pairs)))[::-1]
    for y, p in zip(ys, pairs):
        col = "#2ca02c" if p["ratio"] >= 1 else "#1f77b4"
        ax.barh(y, p["ratio"], 0.5, color=col)
        ax.annotate(f"{p['ratio']:.2f}×", (p["ratio"], y), xytext=(-5, 0), textcoords="offset points", va="center",
                    ha="right", fontsize=11, fontweight="bold", color="white")
        backend = p["peer_backend"] or p["peer"].replace("torch_sdpa", "").strip("_") or "auto"
        peer = f"SDPA ({backend})"
        where = "" if p["peer_label"] == p["label"] else " on the contiguous cache"
        ax.annotate(f"{p['phase']} {_fmt_ms(p['phase_ms'])}  vs  {peer}{where} {_fmt_ms(p['peer_ms'])}",
                    (0.0, y), xytext=(2, -21), textcoords="offset points", va="top", ha="left", fontsize=8,
                    color="#333333")
    ax.axvline(1.0, color="black", linewidth=1.3, linestyle="--")
    ax.annotate("PyTorch SDPA = 1", (1.0, ys[0] + 0.45), ha="center", va="bottom", fontsize=8.5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0}, zorder=5)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{p['family']}\n{p['label']}" for p in pairs], fontsize=9)
    ax.set_ylim(-0.9, len(pairs) - 0.3)
    ax.set_xlim(0, max(1.25, max(p["ratio"] for p in pairs) * 1.18))
    ax.set_xlabel("speed against PyTorch SDPA in the same run (SDPA time / our time; above 1: faster)")
    ax.grid(axis="x", alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    gpus = sorted({p["gpu"] for p in pairs})
    ax.set_title(f"numba-attn's fastest kernel per family against PyTorch SDPA, {' / '.join(gpus)}",
                 fontsize=11, loc="left")
    cites = [f"{p['family'].split(',')[0]}: results/{p['file']} (commit {p['commit']}, {p['date']}, "
             f"{p['time_method']} time)" for p in pairs]
    text = "\n".join(["each pair measured in one run (one command, one commit); SDPA: the fastest of its backends "
                      "timed in that run, in the problem's dtype"] + cites)
    fig.tight_layout(rect=(0, (0.25 + 0.13 * len(cites)) / fig.get_figheight(), 1, 1))
    fig.text(0.01, 0.005, text, fontsize=7, color="#444444", ha="left", va="bottom")
    return save_figure(fig, out_dir, stem)


def _fmt_ms(ms: float) -> str:
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms" if ms >= 1 else (f"{ms:.3f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} µs")
