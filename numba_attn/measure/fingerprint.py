"""What each phase compiles to, as a fingerprint to compare across a refactor, without a GPU.

``python -m numba_attn.measure.fingerprint [PHASE ...] --out before.json`` compiles every phase's kernels
(:func:`numba_attn.measure.offline.compile_phase`, sm_90a) on each problem of :data:`PROBLEMS` it supports
and records, per launch: the kernel's name, its PTX with the names stripped (a hash, its instruction count),
registers, stack, spills and shared memory. ``--compare before.json after.json`` prints the launches whose
PTX, registers or spills differ (exit 1 when any does): a change of code layout (a kernel moved to its
phase's file, a loop body made a device function) must leave them as they were, or its commit says why.

Names stripped: the mangled names of kernels and device functions (they carry the module path), the
``.file``/``.loc`` debug lines and the parameter names; what is left is the code.
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
os.environ["CUDA_CACHE_DISABLE"] = "1"

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402


def _problems():
    from numba_attn.spec.problem import Problem, PagedProblem, VarlenProblem

    return {
        "prefill-f32-d64": Problem(batch=1, heads=8, q_len=1024, kv_len=1024, head_dim=64),
        "prefill-f32-d128-causal": Problem(batch=1, heads=8, q_len=1024, kv_len=1024, head_dim=128, causal=True),
        "prefill-f16-d64": Problem(batch=1, heads=8, q_len=1024, kv_len=1024, head_dim=64, dtype="float16"),
        "prefill-f16-d128-causal": Problem(batch=1, heads=8, q_len=1024, kv_len=1024, head_dim=128,
                                           dtype="float16", causal=True),
        "prefill-bf16-d128-gqa": Problem(batch=1, heads=8, kv_heads=2, q_len=1024, kv_len=1024, head_dim=128,
                                         dtype="bfloat16"),
        "decode-f16-d128-gqa": Problem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128,
                                       dtype="float16"),
        "decode-f16-d64-q4-causal": Problem(batch=4, heads=16, kv_heads=4, q_len=4, kv_len=2048, head_dim=64,
                                            dtype="float16", causal=True),
        "paged-f16-p16": PagedProblem(batch=4, heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128,
                                      dtype="float16", page_size=16, ragged=True),
        "paged-f16-p64": PagedProblem(batch=4, heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128,
                                      dtype="float16", page_size=64),
        "paged-fp8-head": PagedProblem(batch=4, heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128,
                                       dtype="float16", page_size=64, kv_dtype="float8_e4m3", kv_scale="head"),
        "paged-int8-token": PagedProblem(batch=4, heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128,
                                         dtype="float16", page_size=64, kv_dtype="int8", kv_scale="token"),
        "varlen-f16-d128-causal": VarlenProblem(batch=3, heads=8, kv_heads=2, q_len=700, kv_len=900,
                                                head_dim=128, dtype="float16", causal=True),
    }


# parameter sets compiled beside a phase's defaults: paths a parameter selects that no default reaches
EXTRA_PARAMS = {
    "paged_mma8": [{"stages": 3}, {"prefetch": 1, "step_heads": 1}, {"step_heads": 4}],
    "decode_mma": [{"fuse_max": 64}],
}

FIELDS = ("regs", "stack_bytes", "spill_stores", "spill_loads", "smem_bytes")  # of parse_ptxas
_NAME = re.compile(r"_Z[A-Za-z0-9_$]+")
_DEBUG = re.compile(r"^\s*(\.file|\.loc|//).*$", re.M)
_PARAM = re.compile(r"\b([A-Za-z_$][\w$]*_param_\d+)\b")
_SMEM = re.compile(r"_cudapy_smem_\d+")  # numbered by a counter over the process: depends on what compiled before
# a NumbaEnv slot declared per device function a kernel calls, unused by the code
_ENV = re.compile(r"^\.common \.global \.align 8 \.u64 _ZN08NumbaEnv\S*;\s*$", re.M)


def strip_ptx(ptx: str) -> str:
    """PTX with mangled names numbered in order of appearance, parameter and shared-array names likewise, debug
    lines and the unused NumbaEnv declarations (one per device function called) gone."""
    names: dict[str, str] = {}

    def sub(prefix):
        def f(m):
            return names.setdefault(m.group(0), f"{prefix}{len(names)}")
        return f

    text = _DEBUG.sub("", ptx)
    text = _ENV.sub("", text)
    text = _SMEM.sub(sub("smem"), text)
    text = _PARAM.sub(sub("param"), text)
    text = _NAME.sub(sub("fn"), text)
    return "\n".join(ln.rstrip() for ln in text.splitlines() if ln.strip())


def _instructions(ptx: str) -> int:
    return sum(1 for ln in ptx.splitlines() if ln.strip().endswith(";") and not ln.lstrip().startswith("."))


def fingerprint(phases=None, problems=None, progress=print) -> dict:
    from numba_attn.measure.offline import compile_phase
    from numba_attn.phases.registry import get_phase, list_phases

    probs = _problems()
    if problems:
        probs = {k: v for k, v in probs.items() if k in problems}
    out = {}
    for name in phases or [p.name for p in list_phases("all")]:
        ph = get_phase(name)
        for label, prob in probs.items():
            for extra in [{}] + EXTRA_PARAMS.get(name, []):
                if ph.supports(prob, **extra) is not None:
                    continue
                key = f"{name}|{label}" + "".join(f"|{k}={v}" for k, v in extra.items())
                try:
                    recs = compile_phase(name, prob, extra)
                except Exception as exc:  # noqa: BLE001  (recorded: a compile that fails is a finding)
                    out[key] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                    progress(f"{key}: ERROR {out[key]['error'][:120]}")
                    continue
                launches = []
                for r in recs:
                    ptx = strip_ptx(r["ptx"])
                    launches.append({"kernel": r["kernel"], "ptx_sha": hashlib.sha256(ptx.encode()).hexdigest()[:16],
                                     "ptx_instructions": _instructions(ptx),
                                     **{k: r.get(k) for k in FIELDS}})
                out[key] = {"launches": launches}
                progress(f"{key}: " + "; ".join(f"{x['kernel']} r{x['regs']} {x['ptx_sha'][:8]}"
                                                for x in launches))
    return out


def compare(before: dict, after: dict) -> list[str]:
    """Lines naming each launch whose PTX, registers or spills differ, and the keys only one side has."""
    lines = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only {'after' if a is None else 'before'}")
            continue
        if "error" in a or "error" in b:
            if a.get("error") != b.get("error"):
                lines.append(f"{key}: error {a.get('error')!r} -> {b.get('error')!r}")
            continue
        la, lb = a["launches"], b["launches"]
        if len(la) != len(lb):
            lines.append(f"{key}: {len(la)} launches -> {len(lb)}")
            continue
        for x, y in zip(la, lb):
            diffs = [f"{k} {x.get(k)} -> {y.get(k)}" for k in ("ptx_sha", "ptx_instructions") + FIELDS
                     if x.get(k) != y.get(k)]
            if diffs:
                lines.append(f"{key} [{y['kernel']}]: " + ", ".join(diffs))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m numba_attn.measure.fingerprint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phases", nargs="*", help="phases to compile (default: all)")
    ap.add_argument("--problems", default=None, help="comma-separated problem labels (default: all)")
    ap.add_argument("--out", default=None, help="write the fingerprint here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprints")
    args = ap.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as f:
            before = json.load(f)
        with open(args.compare[1]) as f:
            after = json.load(f)
        if args.phases:
            keep = set(args.phases)
            before = {k: v for k, v in before.items() if k.split("|")[0] in keep}
            after = {k: v for k, v in after.items() if k.split("|")[0] in keep}
        lines = compare(before, after)
        print("\n".join(lines) if lines else f"identical: {len(after)} phase-problem pairs")
        return 1 if lines else 0
    from numba_attn.measure.offline import missing_cuda_library

    try:
        fp = fingerprint(args.phases or None, args.problems.split(",") if args.problems else None,
                         progress=lambda s: print(s, flush=True))
    except Exception as exc:  # noqa: BLE001
        hint = missing_cuda_library(exc)
        if hint:
            print(hint, file=sys.stderr)
            return 2
        raise
    if args.out:
        with open(args.out, "w") as f:
            json.dump(fp, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
