"""Offline SASS of a phase's kernel (no GPU): PTX from numba_attn.measure.offline,
cubin from nvJitLink, disassembly by nvdisasm (pip package
nvidia-cuda-nvdisasm). Prints the opcode histogram of the whole kernel and
of its largest loop body (the main K/V tile loop).

    python experiments/2026-11-22-tensor-core-mma/tc_sass.py tc_pipelined -D 64 --dtype float16 [--param W=8] [--dump FILE]
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

os.environ["NUMBA_ATTN_BACKEND"] = "cuda"
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
sys.path.insert(0, os.getcwd())

from numba_attn.measure.offline import compile_phase  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402


def cubin(ptx: str, arch="sm_90a", maxreg=None) -> bytes:
    from cuda.bindings import nvjitlink

    opts = [f"-arch={arch}", "-O3"] + ([f"-maxrregcount={maxreg}"] if maxreg else [])
    h = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "k")
        nvjitlink.complete(h)
        n = nvjitlink.get_linked_cubin_size(h)
        buf = bytearray(n)
        nvjitlink.get_linked_cubin(h, buf)
        return bytes(buf)
    finally:
        nvjitlink.destroy(h)


def nvdisasm() -> str:
    import nvidia

    for base in nvidia.__path__:
        hits = glob.glob(os.path.join(base, "**", "bin", "nvdisasm"), recursive=True)
        if hits:
            return hits[0]
    return "nvdisasm"


def sass_of(ptx: str, maxreg=None) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin(ptx, maxreg=maxreg))
        path = f.name
    try:
        return subprocess.run([nvdisasm(), "-c", "-g", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def histogram(lines):
    c = collections.Counter()
    for line in lines:
        m = OP.search(line)
        if m:
            c[m.group(1).split(".")[0]] += 1
    return c


def total_stl(sass):
    return sum(1 for line in sass.splitlines() if re.search(r"\b(STL|LDL)\b", line))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("phase")
    ap.add_argument("-D", type=int, default=64)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--dump", default=None)
    ap.add_argument("--maxreg", type=int, default=None, help="ptxas register cap (spills show as STL/LDL)")
    a = ap.parse_args()
    params = {k: int(v) for k, v in (p.split("=") for p in a.param)}
    prob = Problem(batch=1, heads=32, q_len=4096, head_dim=a.D, dtype=a.dtype, causal=a.causal)
    for rec in compile_phase(a.phase, prob, params):
        sass = sass_of(rec["ptx"], a.maxreg)
        if a.dump:
            open(a.dump, "w").write(sass)
        lines = sass.splitlines()
        # the main loop: the longest run of code between a label and a backward branch to it
        labels = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"\.(L_x_\d+):", l.strip()))}
        best = (0, 0, 0)
        for i, l in enumerate(lines):
            m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", l)
            if m and m.group(1) in labels and labels[m.group(1)] < i:
                n = sum(1 for x in lines[labels[m.group(1)]:i] if OP.search(x))
                if n > best[0]:
                    best = (n, labels[m.group(1)], i)
        total = histogram(lines)
        loop = histogram(lines[best[1]:best[2] + 1])
        if a.maxreg:
            regs = max(int(x) for x in re.findall(r"\bR(\d+)\b", sass)) + 1
            rec = {**rec, "regs": f"{regs}(cap {a.maxreg})", "spill_stores": f"STL={total_stl(sass)}"}
        print(f"{a.phase} D={a.D} {a.dtype} {params} regs={rec['regs']} spills={rec.get('spill_stores')} "
              f"instructions={sum(total.values())} main loop={best[0]}")
        print("  loop:", ", ".join(f"{k}={v}" for k, v in loop.most_common(40)))


if __name__ == "__main__":
    main()
