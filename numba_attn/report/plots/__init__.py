"""Plots of a results file (matplotlib, Agg backend; PNG and SVG).

* ``roadmap`` — per problem, each phase's speedup against the baseline beside its planned speedup, SDPA as
  reference lines (the latest run that timed the baseline);
* ``scaling`` — time and TFLOP/s over context length (log-log) per phase, SDPA dashed, an N² guide line;
* ``roofline`` — each phase at its arithmetic intensity under the measured ceilings (copy bandwidth, FFMA, mma);
  a hollow marker where a phase moves more than the minimum bytes;
* ``traffic`` — the bytes each phase moves by construction beside the bandwidth it reached on them;
* ``layouts`` — paged-cache or packed ragged problems beside their contiguous twins;
* ``steps`` — each phase against its parent in the same run beside the planned step, from every run of the file;
* ``counts`` — simulator files: what one launch did (global bytes, shared-memory wavefronts, barriers) against
  the parent's.

Every figure's caption gives the device, date and commit of the results. ``make_all(path, out_dir)`` draws what
the file supports and returns the files written; ``numba-attn plot RESULTS --out plots/`` calls it. The figures
by family: :mod:`.roadmap_plots` (roadmap, scaling, steps), :mod:`.roofline_plots` (roofline, traffic),
:mod:`.layout_plots`, :mod:`.count_plots`, :mod:`.headline_plot`; what they share: :mod:`.style`.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

from numba_attn.report.plots.count_plots import COUNT_METRICS, count_pairs, counts  # noqa: E402, F401
from numba_attn.report.plots.headline_plot import HEADLINE, headline, headline_pairs  # noqa: E402, F401
from numba_attn.report.plots.layout_plots import layouts  # noqa: E402, F401
from numba_attn.report.plots.roadmap_plots import roadmap, scaling, step_pairs, steps  # noqa: E402, F401
from numba_attn.report.plots.roofline_plots import ROOFLINE_PEERS, roofline, traffic  # noqa: E402, F401
from numba_attn.report.plots.style import (PEER_COLORS, PEER_MARKERS, PEER_STYLE, SHORT_DT,  # noqa: E402, F401
                                           NamedRecords)

PLOTS = ("roadmap", "scaling", "roofline", "traffic", "layouts", "steps", "counts")


def make_all(records, out_dir="plots", prefix="", which=PLOTS) -> list[str]:
    """Draw every plot the results support; returns the files written."""
    if isinstance(records, (str, os.PathLike)):
        from numba_attn.measure.results import load_results

        source = os.path.basename(str(records))
        records = load_results(str(records))
    else:
        source = None
    files = []
    fns = {"roadmap": roadmap, "scaling": scaling, "roofline": roofline, "traffic": traffic, "layouts": layouts,
           "steps": steps, "counts": counts}
    for name in which:
        stem = f"{prefix}{name}"
        recs = NamedRecords(records, source) if source else records
        files += fns[name](recs, out_dir, stem=stem)
    return files


def synthetic_records(device="synthetic device") -> list[dict]:
    """A small, clearly labelled synthetic results set for tests and for the
    report notebook when no measured file exists. Not a measurement."""
    from numba_attn.spec.problem import Problem

    env = {"type": "env", "env_key": "synthetic", "synthetic": True, "gpu": device, "date": "1970-01-01",
           "commit": "synthetic", "backend": "synthetic"}
    recs = [env]
    for name, val, unit in (("ffma", 50.0, "TFLOP/s"), ("mma_fp16", 400.0, "TFLOP/s"), ("copy", 3000.0, "GB/s")):
        recs.append({"type": "ceiling", "kind": "ceiling", "name": name, "value": val, "unit": unit,
                     "status": "OK", "env_key": "synthetic"})
    phases = [("naive", 0, 1.0, 1.0, True), ("fused_rowwise", 1, 4.0, 3.0, False),
              ("smem_kv", 2, 6.0, 7.5, False), ("tc_mma", 3, 30.0, 22.0, False)]
    for n in (1024, 2048, 4096):
        p = Problem(batch=1, heads=32, q_len=n, head_dim=64)
        base = 20.0 * (n / 4096) ** 2
        for k, (name, order, plan, sp, mat) in enumerate(phases):
            t = base / sp
            r = {"type": "result", "kind": "phase", "phase": name, "order": order, "planned_speedup": plan,
                 "parent": phases[k - 1][0] if k else None, "run_id": f"synthetic-{n}",
                 "problem": p.to_dict(), "label": p.label, "status": "OK", "time_ms": t, "speedup": sp,
                 "flops": p.flops(), "min_bytes": p.min_bytes(), "env_key": "synthetic",
                 "model_bytes": p.materialized_bytes() if mat else p.min_bytes(), "phase_kind": "prefill"}
            r["tflops"] = p.flops() / (t * 1e-3) / 1e12
            r["gbps"] = p.min_bytes() / (t * 1e-3) / 1e9
            recs.append(r)
        for peer, sp in (("torch_sdpa", 18.0), ("torch_sdpa_flash", 40.0)):
            t = base / sp
            recs.append({"type": "result", "kind": "peer", "phase": peer, "problem": p.to_dict(), "label": p.label,
                         "status": "OK", "time_ms": t, "flops": p.flops(), "min_bytes": p.min_bytes(),
                         "tflops": p.flops() / (t * 1e-3) / 1e12, "env_key": "synthetic"})
    return recs
