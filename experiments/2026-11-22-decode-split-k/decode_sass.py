"""Offline registers and SASS instruction mix of a decode phase's kernels (no GPU).

    python experiments/2026-11-22-decode-split-k/decode_sass.py PHASE [--kvh 8] [--batch 1] [--kv-len 32768] [--dtype float16] \
        [--param name=value ...] [--dump FILE]

Compiles with libNVVM, assembles with nvJitLink for sm_90 (``numba_attn.measure.offline``),
disassembles the cubin with nvdisasm and prints, per kernel, the registers,
spills and a histogram of SASS opcodes (whole kernel and the longest loop body:
the instructions between the last backward branch's target and the branch).
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
sys.path.insert(0, os.getcwd())

from numba_attn.measure.offline import compile_phase  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402


def cubin(ptx, arch="sm_90"):
    from cuda.bindings import nvjitlink

    opts = [f"-arch={arch}"]
    h = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(h)
        n = nvjitlink.get_linked_cubin_size(h)
        buf = bytearray(n)
        nvjitlink.get_linked_cubin(h, buf)
        return bytes(buf)
    finally:
        nvjitlink.destroy(h)


def nvdisasm_path():
    import nvidia.cu13 as m
    return os.path.join(list(m.__path__)[0], "bin", "nvdisasm")


def sass(ptx, arch="sm_90"):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin(ptx, arch))
        path = f.name
    try:
        return subprocess.run([nvdisasm_path(), "-c", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def parse(text):
    ins = []
    for line in text.splitlines():
        m = INS.search(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), line.strip()))
    return ins


def loops(ins):
    """(start, end) address pairs of backward branches."""
    out = []
    for addr, op, line in ins:
        if op.startswith("BRA"):
            m = re.search(r"BRA\s+(?:\S+\s+)?`?\(?\.?L_x_\d+\)?|0x([0-9a-f]+)", line)
            t = re.search(r"0x([0-9a-f]+)", line.split("BRA", 1)[1])
            if t and int(t.group(1), 16) < addr:
                out.append((int(t.group(1), 16), addr))
    return out


def hist(ins):
    c = collections.Counter(op.split(".")[0] for _, op, _ in ins)
    return ", ".join(f"{k}:{v}" for k, v in c.most_common(18)) + f"  (total {sum(c.values())})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("phase")
    ap.add_argument("--kvh", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--kv-len", type=int, default=32768)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--dump", default="")
    a = ap.parse_args()
    params = {}
    for p in a.param:
        k, v = p.split("=", 1)
        params[k] = int(v) if v.lstrip("-").isdigit() else v
    prob = Problem(batch=a.batch, heads=32, kv_heads=a.kvh, q_len=a.q_len, kv_len=a.kv_len, head_dim=128,
                   dtype=a.dtype)
    for rec in compile_phase(a.phase, prob, params):
        text = sass(rec["ptx"], "sm_90a" if ".target sm_90a" in rec["ptx"] else "sm_90")
        ins = parse(text)
        print(f"{rec['kernel']} {rec['launch']} regs={rec['regs']} spill_st={rec.get('spill_stores')} "
              f"spill_ld={rec.get('spill_loads')} smem={rec['smem_bytes']}")
        print("  kernel:", hist(ins))
        lp = sorted(loops(ins), key=lambda se: se[1] - se[0], reverse=True)
        for s, e in lp[:2]:
            body = [x for x in ins if s <= x[0] <= e]
            print(f"  loop {s:#x}-{e:#x}:", hist(body))
        if a.dump:
            with open(f"{a.dump}.{rec['kernel']}.sass", "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
