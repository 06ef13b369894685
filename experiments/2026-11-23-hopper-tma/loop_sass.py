"""Steady-loop SASS of a phase, offline: the instructions of one K/V tile by opcode class.

    python experiments/2026-11-23-hopper-tma/loop_sass.py PHASE [PHASE ...] [-D 128] [--dtype float16]
        [--causal] [--varlen] [--param NAME=VALUE ...] [--build NAME=VALUE ...] [--ops] [--listing]

Each phase's kernel is compiled and linked as numba links it at run time (``numba_attn.measure.offline``:
LTO-IR through nvJitLink, no GPU) and disassembled with ``nvdisasm``. A *loop* is the address range from a
backward branch's target to the branch; the loops that hold HGMMA instructions and no smaller such loop
inside them are the kernel's tile loops (a loop unrolled by two holds two tiles' HGMMA: its counts are
divided by the tiles it holds, ``KS + KK`` HGMMA a tile, KS = ceil(D/16) and KK = Bc/16). Inner loops (an
mbarrier try-wait retry) count with the body; code a branch skips in the steady state (the mask of a
tile past the end or on the diagonal) counts too where it lies inside the range: the count is static.

Classes: hgmma, wgsync (WARPGROUP.ARRIVE / DEPBAR), mufu, float (FFMA FMUL FADD FMNMX FSEL FSETP ...),
cvt (F2FP, the packing of P), int (IMAD but its register copies, IADD3, LOP3, ISETP, SHF, LEA, SEL ...),
mov (MOV, IMAD.MOV, CS2R, the register copies), uniform (U* and R2UR: the uniform datapath), sync (BAR,
SYNCS: mbarrier, WARPSYNC), shfl, ctrl (BRA, BSSY, BSYNC, ...), other.

``--build NAME=VALUE`` passes a keyword to ``build_wgmma`` in every phase built on it (all seven wgmma phases),
also those that do not expose it as a parameter: ``--build uniform=1`` compiles any of them with the
option on. ``--varlen``: a packed problem (``tc_wgmma_varlen``).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

from numba_attn.measure.offline import compile_phase, disassemble, parse_params, parse_sass  # noqa: E402

CLASSES = ("hgmma", "wgsync", "mufu", "float", "cvt", "int", "mov", "uniform", "sync", "shfl", "ctrl", "other")
_FLOAT = {"FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FCHK", "FSET", "HADD2", "HMUL2", "HFMA2"}
_CVT = {"F2FP", "F2F", "I2F", "F2I", "I2FP", "F2IP"}
_INT = {"IMAD", "IADD3", "IADD", "VIADD", "LOP3", "LOP", "ISETP", "SHF", "SHL", "SHR", "LEA", "SEL", "IABS",
        "IMNMX", "VIMNMX", "PRMT", "POPC", "FLO", "BREV", "IMUL", "ISCADD", "PLOP3", "P2R", "R2P", "VIADDMNMX"}
_MOV = {"MOV", "CS2R", "S2R", "S2UR"}
_SYNC = {"BAR", "SYNCS", "WARPSYNC", "MEMBAR", "DEPBAR", "ERRBAR", "CCTL", "FENCE"}
_CTRL = {"BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "NOP", "YIELD", "BREAK", "BMOV", "JMP", "JMX", "BRX",
         "NANOSLEEP"}

_GMMA = ("HGMMA", "QGMMA")  # f16/bf16/tf32 wgmma, and e4m3/e5m2 (the FP8 phases: k32 steps)
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def classify(op: str) -> str:
    """The class of one SASS mnemonic (with its modifiers: ``IMAD.MOV.U32`` is a copy)."""
    base = op.split(".")[0]
    if base in _GMMA:
        return "hgmma"
    if base == "WARPGROUP":
        return "wgsync"
    if base == "MUFU":
        return "mufu"
    if base in _FLOAT:
        return "float"
    if base in _CVT:
        return "cvt"
    if op.startswith("IMAD.MOV") or base in _MOV:
        return "mov"
    if base in _INT:
        return "int"
    if base.startswith("U") or base in ("R2UR", "LDC", "ULDC"):
        return "uniform"
    if base in _SYNC:
        return "sync"
    if base == "SHFL":
        return "shfl"
    if base in _CTRL:
        return "ctrl"
    return "other"


def tile_loops(insns, labels, per_tile: int):
    """The smallest disjoint backward-branch ranges holding HGMMA: [(start, end, [insns], tiles)]."""
    loops = []
    for addr, op, rest in insns:
        if not op.startswith("BRA"):
            continue
        m = _TARGET.search(rest)
        if not m or labels.get(m.group(1), addr + 1) > addr:
            continue
        start = labels[m.group(1)]
        body = [i for i in insns if start <= i[0] <= addr]
        if sum(1 for i in body if i[1].startswith(_GMMA)) >= per_tile:  # a whole tile (not a retry branch
            #                                                                    back into the tail's tile)
            loops.append((start, addr, body))
    inner = []  # smallest first, none overlapping an accepted one (an out-of-line retry branch back into
    for lp in sorted(loops, key=lambda lp: lp[1] - lp[0]):  # the loop spans more than the loop)
        if not any(lp[0] <= o[1] and o[0] <= lp[1] for o in inner):
            inner.append(lp)
    inner.sort()
    out = []
    for start, end, body in inner:
        n = sum(1 for i in body if i[1].startswith(_GMMA))
        out.append((start, end, body, max(1, round(n / per_tile))))
    return out


def main(argv=None) -> int:
    from numba_attn.spec.problem import Problem

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phases", nargs="+")
    ap.add_argument("--head-dim", "-D", type=int, default=128)
    ap.add_argument("--q-len", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--build", action="append", default=[], metavar="NAME=VALUE",
                    help="a keyword for build_wgmma in every wgmma phase (e.g. uniform=1)")
    ap.add_argument("--varlen", action="store_true", help="a packed problem (tc_wgmma_varlen)")
    ap.add_argument("--ops", action="store_true", help="also every mnemonic of the loop with its count")
    ap.add_argument("--listing", action="store_true", help="also print the loop's SASS")
    args = ap.parse_args(argv)
    params = parse_params(args.param)
    prob = Problem(batch=1, heads=args.heads, q_len=args.q_len, head_dim=args.head_dim, dtype=args.dtype,
                   causal=args.causal)
    if args.varlen:
        from numba_attn.spec.problem import VarlenProblem

        prob = VarlenProblem(**prob.to_dict())
    if args.build:
        import functools

        import numba_attn.phases.tensor_core as tc
        from numba_attn.phases.tensor_core import kernel as common

        kw = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (b.split("=", 1) for b in args.build)}

        @functools.wraps(common.build_wgmma)
        def build(*a, **k):  # --build wins over the phase's own keyword (its parameter's default)
            return common.build_wgmma(*a, **{**k, **kw})

        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith(tc.__name__ + ".p") and hasattr(mod, "build_wgmma"):
                mod.build_wgmma = build
    print(f"{'phase':20s} {'params':24s} {'regs':>4s} {'spill':>5s} {'loop':>4s} {'tiles':>5s} {'/tile':>5s} "
          + " ".join(f"{c:>7s}" for c in CLASSES))
    for name in args.phases:
        from numba_attn.phases.registry import get_phase

        phase = get_phase(name)
        res = phase.resolve(prob, params)
        Bc = res.get("Bc", 64)
        k = 32 if phase.precision == "e4m3" else 16  # the k of a product step
        per_tile = (max(args.head_dim, k) + k - 1) // k + Bc // k
        for rec in compile_phase(name, prob, params, keep_cubin=True):
            insns, labels = parse_sass(disassemble(rec["cubin"]) or "")
            spill = (rec.get("spill_stores") or 0) + (rec.get("spill_loads") or 0)
            built = {b.split("=", 1)[0] for b in args.build}  # --build overrides a parameter of that name
            label = ",".join([f"{k}={v}" for k, v in sorted(res.items()) if k not in built] + args.build)
            loops = tile_loops(insns, labels, per_tile)
            if not loops:
                print(f"{name:20s} {label:24s} {rec['regs']:>4} {spill:>5} (no loop with HGMMA/QGMMA)")
            for i, (start, end, body, tiles) in enumerate(loops):
                cls = collections.Counter(classify(op) for _, op, _ in body)
                print(f"{name:20s} {label:24s} {rec['regs']:>4} {spill:>5} {i:>4} {tiles:>5} "
                      f"{len(body) / tiles:>5.0f} " + " ".join(f"{cls.get(c, 0) / tiles:>7.1f}" for c in CLASSES))
                if args.ops:
                    ops = collections.Counter(op if op.startswith("IMAD.MOV") else op.split(".")[0]
                                              for _, op, _ in body)
                    print("    " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
                if args.listing:
                    for a, op, rest in body:
                        print(f"    /*{a:05x}*/ {op}{rest}")
            for note in rec.get("notes", []):
                print(f"    ptxas: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
