"""Offline (no GPU): registers, spills and the SASS of paged_split_k's main loop for the 8-bit target
problems (B8 H32 D128 P64 KV 16k, fp16 query), per variant:

    python experiments/2026-11-23-paged-8bit/loop_sass.py [--param mma=1 ...] [--dump DIR]
        [--cases float8_e4m3/head,int8/token,int8/head] [--kv-heads 8 (GQA 32/8)] [--variants wide,mma]

Compiles the kernel as numba links it at run time (``numba_attn.measure.offline.compile_phase``:
LTO-IR, nvJitLink, sm_90a), disassembles it with nvdisasm and prints, per variant, the registers,
the resident warps per SM the registers allow, and the instruction mix of the key loop's body (the
shortest loop holding the 16-byte cache loads), with its instructions per key (body / keys
per warp step). Static counts: each loop iteration runs its body once (the rescale branch excepted,
which the body includes).
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
from numba_attn.spec.problem import PagedProblem  # noqa: E402

VARIANTS = {"wide": {"wide": True}, "mma": {"mma": True}}


def main_loop(ins, labels, holds=lambda op: "LDG.E.128" in op):
    """The body of the key loop: the shortest loop (a backward branch and its target) that holds the
    16-byte cache loads (``LDG.E.128``, or the instructions ``holds`` picks); the longer loops around it
    are the split and combine loops."""
    best = None
    for addr, op, rest in ins:
        if op.startswith("BRA"):
            t = re.search(r"(\.L_x_\d+)", rest)
            target = labels.get(t.group(1)) if t else None
            if target is None or target >= addr or (best and addr - target >= best[1] - best[0]):
                continue
            if any(holds(o) for a_, o, _ in ins if target <= a_ <= addr):
                best = (target, addr)
    return [x for x in ins if best and best[0] <= x[0] <= best[1]]


def hist(ins):
    c = collections.Counter(op.split(".")[0] for _, op, _ in ins)
    return ", ".join(f"{k} {v}" for k, v in c.most_common(16))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="wide,mma")
    ap.add_argument("--kv-len", type=int, default=16384)
    ap.add_argument("--param", action="append", default=[], help="extra NAME=VALUE for every variant")
    ap.add_argument("--dump", default="")
    ap.add_argument("--cases", default="float8_e4m3/head,int8/token", help="KV_DTYPE/SCALE, comma-separated")
    ap.add_argument("--kv-heads", type=int, default=32, help="KV heads of the 32 query heads (8: GQA 32/8)")
    a = ap.parse_args()
    extra = {k: int(v) for k, v in (p.split("=", 1) for p in a.param)}
    for case in a.cases.split(","):
        kv_dtype, scale = case.split("/")
        prob = PagedProblem(batch=8, heads=32, kv_heads=a.kv_heads, q_len=1, kv_len=a.kv_len, head_dim=128,
                            dtype="float16", page_size=64, kv_dtype=kv_dtype, kv_scale=scale)
        for name in a.variants.split(","):
            params = {**VARIANTS[name], **extra}
            rec = compile_phase("paged_split_k", prob, params, keep_cubin=True)[0]
            text = disassemble(rec["cubin"])
            if text is None:
                raise SystemExit("no nvdisasm found (PATH, $CUDA_HOME/bin or Triton's copy)")
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                gqa = f"-kvh{a.kv_heads}" if a.kv_heads != 32 else ""
                with open(os.path.join(a.dump, f"{kv_dtype}-{scale}{gqa}-{name}.sass"), "w") as out:
                    out.write(text)
            ins, labels = parse_sass(text)
            body = main_loop(ins, labels)
            regs = rec["regs"]
            warps = min(64, 65536 // (((regs + 7) // 8 * 8) * 32) // 8 * 8)  # 8-warp blocks per SM by registers
            keys = 16 if params.get("mma") else 8  # keys per warp step (wide, D128: 8 groups of 4 lanes, 1 key)
            print(f"{kv_dtype}/{scale} H32/{a.kv_heads} {name:5s} {params}: regs {regs}, "
                  f"spills {rec.get('spill_stores')}/"
                  f"{rec.get('spill_loads')} B, {warps} warps/SM by registers; kernel {len(ins)} instructions; "
                  f"loop {len(body)} for {keys} keys = {len(body) / keys:.1f} per key")
            print(f"    loop: {hist(body)}")
            rescale = sum(1 for _, o, _ in body if o == "FMUL")
            print(f"    (of which FMUL {rescale}: mostly the accumulators' rescale, run only when a row maximum moves)")


if __name__ == "__main__":
    main()
