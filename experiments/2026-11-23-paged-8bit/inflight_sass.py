"""Offline: the key loop of paged_split_k's 8-bit ``mma`` path against the fp16 phases' (``paged_split_k`` on an
fp16 paged cache, ``decode_split_k_lean`` on the contiguous twin), at B8 H32 D128 P64 KV 16k, fp16 query:

    python experiments/2026-11-23-paged-8bit/inflight_sass.py [--param kstages=2 ...] [--dump DIR]

Per variant: registers, local memory (spill bytes), the key loop's body (the shortest loop around the cache
loads: ``LDG.E.128`` or ``LDG.E.64``), its loads by width, its instructions per key, the cache bytes one warp
requests per loop iteration (loads × width × 32 lanes), the resident warps per SM (the launch's blocks per SM
× warps, or fewer where the registers allow fewer) and so the bytes one SM has requested when every warp sits at
its loop's loads (Little's law: at ~4.4 TB/s over 132 SMs and ~1 µs of DRAM latency under load, an SM needs
~33 KB in flight), and the first wave: the loads issued before the first instruction that reads a loaded
register (the warp waits there, so only that wave is in flight per round trip). Static counts: each loop
iteration runs its body once.
"""
import argparse
import collections
import os
import re
import sys

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from numba_attn.measure.offline import compile_phase, disassemble, parse_sass  # noqa: E402
from numba_attn.spec.problem import PagedProblem, Problem  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import loop_sass  # noqa: E402  (this directory's key-loop finder)

WIDTH = {"LDG.E.128": 16, "LDG.E.64": 8, "LDG.E": 4, "LDG.E.U16": 2, "LDG.E.U8": 1}


def width(op):
    base = re.sub(r"\.(CONSTANT|STRONG\.\w+|EF|EL|LU|NA|SYS|GPU|LTC\w*|ZFILL|BYPASS)", "", op)
    return WIDTH.get(base, 0)


def main_loop(ins, labels):
    """The shortest loop (a backward branch and its target) holding 16- or 8-byte global loads."""
    return loop_sass.main_loop(ins, labels, holds=lambda op: width(op) >= 8)


def first_wave(body):
    """(instructions from the first 16/8-byte load to the first instruction that reads a register such a load
    wrote, the bytes per lane of the loads issued before that instruction): a warp stalls there until its
    first load lands, so only that first wave of loads is in flight during the wait; the loads after it
    make a second round trip."""
    loaded, first, nbytes = set(), None, 0
    for i, (_, op, rest) in enumerate(body):
        regs = re.findall(r"\bR(\d+)\b", rest)
        if loaded and not op.startswith("LDG") and any(r in loaded for r in regs[1:]):
            return i - first, nbytes
        if op.startswith("LDG") and width(op) >= 8:
            first = i if first is None else first
            nbytes += width(op)
            if regs:
                loaded.update(str(int(regs[0]) + k) for k in range(width(op) // 4))
    return None, nbytes


def report(label, phase, prob, params, keys_per_iter, warps_per_sm, dump):
    rec = compile_phase(phase, prob, params, keep_cubin=True)[0]
    text = disassemble(rec["cubin"])
    if text is None:
        raise SystemExit("no nvdisasm found")
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, label.replace("/", "-").replace(" ", "_") + ".sass"), "w") as f:
            f.write(text)
    ins, labels = parse_sass(text)
    body = main_loop(ins, labels)
    loads = collections.Counter(op for _, op, _ in body if op.startswith("LDG"))
    wide = {op: n for op, n in loads.items() if width(op) >= 8}
    narrow = {op: n for op, n in loads.items() if width(op) < 8}
    req = sum(width(op) * n for op, n in wide.items()) * 32
    regs = rec["regs"]
    by_regs = 65536 // (((regs + 7) // 8 * 8) * 32)
    wps = min(warps_per_sm, by_regs)
    print(f"{label}: regs {regs}, local {rec.get('spill_stores')} B stored / {rec.get('spill_loads')} B loaded "
          f"(stack {rec.get('stack')}); loop {len(body)} instructions for {keys_per_iter} keys = "
          f"{len(body) / keys_per_iter:.1f} per key; cache loads {wide}, narrow loads {narrow}; "
          f"{req} B per warp-iteration ({req / keys_per_iter:.0f} B per key per warp); {wps} warps/SM -> "
          f"{req * wps / 1024:.0f} KiB requested per SM when all sit at the loads"
          + "")
    gap, wave = first_wave(body)
    print(f"    first wave: the loads issued before the first use of a loaded register ({gap} instructions after "
          f"the first load): {wave * 32} of the warp's {req} B, {wave * 32 * wps / 1024:.0f} KiB per SM in flight "
          f"while the warps wait for it" + ("" if wave * 32 >= req else
                                            f"; the other {req - wave * 32} B make a second round trip"))
    hist = collections.Counter(op.split(".")[0] for _, op, _ in body)
    print("    " + ", ".join(f"{k} {v}" for k, v in hist.most_common(14)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv-len", type=int, default=16384)
    ap.add_argument("--param", action="append", default=[], help="NAME=VALUE for the 8-bit variants")
    ap.add_argument("--dump", default="")
    ap.add_argument("--only8", action="store_true")
    a = ap.parse_args()
    extra = {k: int(v) for k, v in (p.split("=", 1) for p in a.param)}
    common = dict(batch=8, heads=32, kv_heads=32, q_len=1, kv_len=a.kv_len, head_dim=128, dtype="float16")
    if not a.only8:
        from numba_attn.phases.registry import get_phase
        for phase, prob in (("paged_split_k", PagedProblem(**common, page_size=64)),
                            ("decode_split_k_lean", Problem(**common))):
            ph = get_phase(phase)
            p = ph.resolve(prob, {})
            L = p["lanes"]
            KS = (32 // L) * p["keys"]
            report(f"{phase} fp16 {p}", phase, prob, {}, KS, p["warps"] * p["blocks_per_sm"], a.dump)
    for kv, sc in (("float8_e4m3", "head"), ("int8", "token")):
        prob = PagedProblem(**common, page_size=64, kv_dtype=kv, kv_scale=sc)
        params = {"mma": True, **extra}
        keys = 16 * params.get("kstages", 1)
        warps = params.get("warps", 8) * params.get("blocks_per_sm", 2)
        report(f"paged_split_k {kv}/{sc} {params}", "paged_split_k", prob, params, keys, warps, a.dump)


if __name__ == "__main__":
    main()
