"""Registers, spills and PTX of a phase's kernels without a GPU.

``python -m numba_attn.measure.offline PHASE [--head-dim 64 --dtype float32 --causal
--batch 1 --heads 32 --kv-heads 8 --param Br=64 --ptx]`` compiles the phase's kernels for sm_90 with libNVVM
(``cuda.compile_ptx``) and assembles the PTX with ptxas through nvJitLink
(``-verbose``, and the kernel's ``max_registers`` as ``-maxrregcount``), printing what ptxas reports: registers, stack frame, spill
stores/loads, shared memory. No GPU and no driver are needed, so a spill or a
missing instruction can be seen before any device time is spent.

How: the phase's host wrapper is called with NumPy stand-ins for the device
arrays, and kernel launches are intercepted: instead of launching, the
argument types of each launch are recorded and the kernel's Python function is
compiled for exactly those types.
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import argparse  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402


def _link_info(ptx, arch: str = "sm_90", max_registers: int | None = None) -> str:
    """nvJitLink's info log for one kernel: ``ptx`` text, or LTO-IR bytes (linked with ``-lto``, as numba
    links a kernel when nvJitLink is available: whole-program code generation, where a relocatable PTX
    link ignores ``setmaxnreg`` and may serialize wgmma for want of registers)."""
    from cuda.bindings import nvjitlink

    lto = isinstance(ptx, (bytes, bytearray))
    opts = [f"-arch={arch}", "-verbose"] + (["-lto"] if lto else []) + (
        [f"-maxrregcount={max_registers}"] if max_registers else [])
    h = nvjitlink.create(len(opts), opts)
    try:
        data = bytes(ptx) if lto else ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.LTOIR if lto else nvjitlink.InputType.PTX, data, len(data),
                           "kernel")
        nvjitlink.complete(h)
        n = nvjitlink.get_info_log_size(h)
        buf = bytearray(n)
        nvjitlink.get_info_log(h, buf)
        return buf.decode(errors="replace").rstrip("\x00")
    finally:
        nvjitlink.destroy(h)


def parse_ptxas(log: str) -> dict:
    """Registers, stack, spills and shared memory from a ptxas / nvJitLink info log. Two formats:
    ``Used 40 registers, ...`` with a ``N bytes stack frame, N bytes spill stores, N bytes spill
    loads`` line, and (newer) ``used 40 registers, used 1 barriers, 0 stack, 3104 bytes smem, ...,
    0 bytes lmem``, which names no spills: there a kernel's local memory (``lmem``) stands for both
    spill counts, so that a kernel using local memory never reads as spill-free."""
    out = {}
    m = re.search(r"[Uu]sed (\d+) registers", log)
    out["regs"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        out["stack_bytes"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    else:
        m = re.search(r"(\d+) stack\b", log)
        if m:
            out["stack_bytes"] = int(m.group(1))
        m = re.search(r"(\d+) bytes lmem", log)
        if m:
            out["lmem_bytes"] = out["spill_stores"] = out["spill_loads"] = int(m.group(1))
    m = re.search(r"(\d+) bytes smem", log)
    out["smem_bytes"] = int(m.group(1)) if m else 0
    return out


def compile_phase(phase_name: str, problem, params: dict | None = None, cc=(9, 0, "a")) -> list[dict]:
    """Compile every kernel the phase launches for ``problem``; one dict per launch.

    ``cc`` defaults to sm_90a, the target numba-cuda picks for a 9.0 device (the
    wgmma phases need its arch-specific instructions)."""
    from numba import cuda, typeof
    from numba.cuda.dispatcher import CUDADispatcher

    from numba_attn.phases.registry import get_phase

    phase = get_phase(phase_name)
    records = []

    class _Recorder:
        def __init__(self, disp, cfg):
            self.disp, self.cfg = disp, cfg

        def __call__(self, *args):
            sig = tuple(typeof(a) for a in args)
            opts = self.disp.targetoptions
            ptx, _ = cuda.compile_ptx(self.disp.py_func, sig, cc=cc, fastmath=opts.get("fastmath", False),
                                      launch_bounds=opts.get("launch_bounds"))
            arch = f"sm_{cc[0]}{cc[1]}{cc[2] if len(cc) > 2 else ''}"
            lto = opts.get("lto", False)
            if lto:  # what numba links at run time: the kernel's LTO-IR, whole program
                code, _ = cuda.compile(self.disp.py_func, sig, device=False, abi="numba", cc=cc,
                                       fastmath=opts.get("fastmath", False),
                                       launch_bounds=opts.get("launch_bounds"), output="ltoir")
            log = _link_info(code if lto else ptx, arch, opts.get("max_registers"))
            info = parse_ptxas(log)
            info.update(kernel=self.disp.py_func.__name__, launch=str(self.cfg[:2]), ptx=ptx, lto=bool(lto),
                        notes=[ln.split(":", 1)[-1].strip() for ln in log.splitlines() if "Performance Loss" in ln])
            records.append(info)

    import numba.cuda.dispatcher as _disp

    class _FakeDevice:  # device functions ask the current device for its cc
        compute_capability = cc

    from numba_attn.gpu import pdl

    pdl.TARGET_CC = cc[:2]  # compile the sm_90 variants (dependent launch) as a 9.0 device would run them
    orig_dev = _disp.get_current_device
    _disp.get_current_device = lambda: _FakeDevice()
    orig = CUDADispatcher.__getitem__
    CUDADispatcher.__getitem__ = lambda self, cfg: _Recorder(self, cfg)
    _orig_dev_array, _orig_to_device = cuda.device_array, cuda.to_device
    cuda.device_array = lambda shape, dtype=np.float32, **kw: np.empty(shape, dtype)
    cuda.to_device = lambda ary, *a, **kw: np.asarray(ary)
    from numba_attn.gpu import tma

    _orig_tensor_map = tma.tensor_map  # a TMA tensor map: 16 uint64 (only its type matters here)
    tma.tensor_map = lambda array, box, swizzle=None: np.zeros(16, np.uint64)
    try:
        launch = phase.plan(problem, **(params or {}))
        B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
        dt = np.dtype(problem.dtype) if problem.dtype != "bfloat16" else np.dtype("uint16")
        q = np.empty((B * H, problem.q_len, D), dt)
        if getattr(problem, "varlen", False):  # packed sequences: (total_q, H, D), (total_k, Hkv, D)
            lq, lk = problem.seqlens()
            q = np.empty((int(lq.sum()), H, D), dt)
            k = np.empty((int(lk.sum()), Hkv, D), dt)
        elif getattr(problem, "page_size", 0):  # a paged cache: (num_blocks, page_size, Hkv, D)
            nb = int(((problem.seqlens() + problem.page_size - 1) // problem.page_size).sum()) + 1
            k = np.empty((nb, problem.page_size, Hkv, D), np.uint8 if problem.kv_dtype else dt)
        else:
            k = np.empty((B * Hkv, problem.kv_len, D), dt)
        launch(q, k, np.empty_like(k), np.empty_like(q), 0)
    finally:
        CUDADispatcher.__getitem__ = orig
        _disp.get_current_device = orig_dev
        pdl.TARGET_CC = None
        cuda.device_array, cuda.to_device = _orig_dev_array, _orig_to_device
        tma.tensor_map = _orig_tensor_map
    return records


def main(argv=None) -> int:
    from numba_attn.spec.problem import Problem

    ap = argparse.ArgumentParser(prog="python -m numba_attn.measure.offline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phases", nargs="+")
    ap.add_argument("--head-dim", "-D", type=int, default=64)
    ap.add_argument("--q-len", type=int, default=4096)
    ap.add_argument("--kv-len", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="grouped-query attention: KV heads (default: heads)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--ptx", action="store_true", help="print the PTX too")
    ap.add_argument("--page-size", type=int, default=0, help="a paged KV cache with this page size (paged phases)")
    ap.add_argument("--kv-dtype", default="", help="paged: the cache format, float8_e4m3 or int8 (default: --dtype)")
    ap.add_argument("--kv-scale", default="head", help="paged 8-bit cache: tensor, head or token scales")
    ap.add_argument("--varlen", action="store_true", help="a packed ragged batch with cu_seqlens (varlen phases)")
    args = ap.parse_args(argv)
    params = {}
    for p in args.param:
        k, v = p.split("=", 1)
        params[k] = int(v) if v.lstrip("-").isdigit() else v
    prob = Problem(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, q_len=args.q_len, kv_len=args.kv_len,
                   head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)
    if args.page_size:
        from numba_attn.spec.problem import PagedProblem

        prob = PagedProblem(**prob.to_dict(), page_size=args.page_size, kv_dtype=args.kv_dtype,
                            kv_scale=args.kv_scale)
    if args.varlen:
        from numba_attn.spec.problem import VarlenProblem

        prob = VarlenProblem(**{k: v for k, v in prob.to_dict().items()})
    for name in args.phases:
        for rec in compile_phase(name, prob, params if len(args.phases) == 1 else None):
            print(f"{name:18s} {rec['kernel']:24s} regs={rec['regs']} stack={rec.get('stack_bytes')} "
                  f"spill_st={rec.get('spill_stores')} spill_ld={rec.get('spill_loads')} smem={rec['smem_bytes']}"
                  f"{' (LTO link)' if rec.get('lto') else ''}")
            for note in rec.get("notes", []):
                print(f"{'':18s} ptxas: {note}")
            if args.ptx:
                print(rec["ptx"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
