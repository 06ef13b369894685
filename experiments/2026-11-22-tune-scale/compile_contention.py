"""Is compiling slower when two processes compile at once? (the fifth run: 29% slower per candidate
with two tuning workers than with one, each worker on its own half of the CPUs).

Compiles the first ``--kernels`` distinct kernels of a phase's tuning grid (one per kernel group: the
candidates that differ only in launch parameters share one), offline (numba's PTX and the LTO link
ptxas does at run time, for sm_90a: no GPU needed), in 1 process, then in ``--procs`` processes at
once with the same list each, pinned to disjoint CPU shares (as ``tune --workers`` pins them) and
unpinned, then in 1 process again (the first alone run also warms the file system's caches). Every
process compiles the same kernels, so the seconds compare directly. On a 2-core laptop (AMD EPYC,
3 kernels): 6.6-7.7 s alone, 6.5-7.1 s two at once.

    PYTHONPATH=. python3 experiments/2026-11-22-tune-scale/compile_contention.py [--phase decode_mma] [--kernels 8]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DECODE = dict(batch=16, heads=32, kv_heads=8, q_len=1, kv_len=8192, head_dim=128, dtype="float16")


def child(phase_name: str, n: int) -> None:
    cpus = os.environ.get("NUMBA_ATTN_CPUS")
    if cpus:
        os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
    t_import = time.perf_counter()
    from numba_attn.measure.offline import compile_phase
    from numba_attn.measure.tune import kernel_groups
    from numba_attn.phases.registry import candidate_configs, get_phase
    from numba_attn.spec.problem import Problem

    prob = Problem(**DECODE)
    ph = get_phase(phase_name)
    cands = candidate_configs(ph, prob, None, None)
    firsts = [cands[g[0]] for g in kernel_groups(ph, cands)][:n]
    t_import = time.perf_counter() - t_import
    secs = []
    for params in firsts:
        t0 = time.perf_counter()
        compile_phase(phase_name, prob, params)
        secs.append(time.perf_counter() - t0)
    print("JSON" + json.dumps({"import_s": t_import, "compile_s": secs, "cpus": cpus or "all",
                               "affinity": len(os.sched_getaffinity(0))}))


def run(procs: int, pinned: bool, phase_name: str, n: int) -> dict:
    from numba_attn.measure.parallel import cpu_shares, share_env

    shares = cpu_shares(procs) if pinned else [None] * procs
    ps = []
    t0 = time.perf_counter()
    for share in shares:
        env = dict(os.environ, NUMBA_ATTN_BACKEND="cuda", NUMBA_ENABLE_CUDASIM="0")
        if share:
            env.update(share_env(share))
        ps.append(subprocess.Popen([sys.executable, __file__, "--child", "--phase", phase_name, "--kernels", str(n)],
                                   env=env, stdout=subprocess.PIPE, text=True))
    outs = []
    for p in ps:
        out, _ = p.communicate()
        outs += [json.loads(ln[4:]) for ln in out.splitlines() if ln.startswith("JSON")]
    wall = time.perf_counter() - t0
    return {"procs": procs, "pinned": pinned, "wall_s": round(wall, 2), "workers": outs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", default="decode_mma")
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.phase, a.kernels)
        return
    print(f"CPUs: {len(os.sched_getaffinity(0))}; {a.kernels} kernels of {a.phase} per process")
    base = None
    for procs, pinned in ((1, False), (a.procs, True), (a.procs, False), (1, False)):
        r = run(procs, pinned, a.phase, a.kernels)
        per = [sum(w["compile_s"]) for w in r["workers"]]
        if base is None:
            base = per[0]
        print(json.dumps(r))
        print(f"  {procs} process(es), {'pinned' if pinned else 'unpinned'}: compile "
              + ", ".join(f"{s:.1f} s" for s in per) + f" (x{max(per) / base:.2f} of one alone); wall {r['wall_s']} s")


if __name__ == "__main__":
    main()
