"""Registers, spills and PTX of a phase's kernels without a GPU.

``python -m numba_attn.measure.offline PHASE [--head-dim 64 --dtype float32 --causal
--batch 1 --heads 32 --kv-heads 8 --param Br=64 --ptx --sass]`` compiles the phase's kernels for sm_90 with libNVVM
(``cuda.compile_ptx``) and links the kernel as numba does at run time (its LTO-IR through nvJitLink with
``-lto`` when nvJitLink is present, else the PTX; ``-verbose``, and the kernel's ``max_registers`` as
``-maxrregcount``), printing what ptxas reports: registers, stack frame, spill stores/loads, shared memory,
its performance notes (a serialized wgmma, an ignored ``setmaxnreg``), and with ``--sass`` the static SASS
instruction counts (``nvdisasm``). No GPU and no driver are needed, so a spill, a register copy or a
missing instruction can be seen before any device time is spent.

How: the phase's host wrapper is called with NumPy stand-ins for the device
arrays, and kernel launches are intercepted: instead of launching, the
argument types of each launch are recorded and the kernel's Python function is
compiled for exactly those types.
"""
from __future__ import annotations

import os

if __name__ == "__main__":  # python -m numba_attn.measure.offline: compiled for the GPU whatever the shell selects
    os.environ["NUMBA_ATTN_BACKEND"] = "cuda"  # (no device is used)
else:  # imported: the process keeps its backend (and so do the processes it starts)
    os.environ.setdefault("NUMBA_ATTN_BACKEND", "cuda")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
# nvJitLink (CUDA 13) serves a link it has seen before from the compute cache (~/.nv/ComputeCache) and then
# writes no ptxas log: no registers, no spills. Every link here runs ptxas.
os.environ["CUDA_CACHE_DISABLE"] = "1"

import argparse  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402


def _link_info(ptx, arch: str = "sm_90", max_registers: int | None = None, cubin_out: list | None = None) -> str:
    """nvJitLink's info log for one kernel: ``ptx`` text, or LTO-IR bytes (linked with ``-lto``, as numba
    links a kernel when nvJitLink is available: whole-program code generation, where a relocatable PTX
    link ignores ``setmaxnreg`` and may serialize wgmma for want of registers). ``cubin_out``: a list that
    receives the linked cubin."""
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
        if cubin_out is not None:
            c = bytearray(nvjitlink.get_linked_cubin_size(h))
            nvjitlink.get_linked_cubin(h, c)
            cubin_out.append(bytes(c))
        return buf.decode(errors="replace").rstrip("\x00")
    finally:
        nvjitlink.destroy(h)


def nvdisasm_path() -> str | None:
    """``nvdisasm`` from PATH, ``$CUDA_HOME/bin``, or the copy Triton ships; None when none is found."""
    import shutil

    found = shutil.which("nvdisasm")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvdisasm")):
            return os.path.join(root, "bin", "nvdisasm")
    try:
        import triton

        cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
        return cand if os.path.exists(cand) else None
    except Exception:  # noqa: BLE001 - Triton is optional
        return None


def disassemble(cubin: bytes) -> str | None:
    """The SASS text of a cubin (``nvdisasm -c``); None when no nvdisasm is found."""
    import subprocess
    import tempfile

    tool = nvdisasm_path()
    if not tool:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout


_SASS_INSN = re.compile(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)")
_SASS_LABEL = re.compile(r"^(\.L_x_\d+):")


def parse_sass(text: str):
    """``nvdisasm`` text → [(address, opcode, operands)] in order, and {label: address of the next
    instruction} (what a branch's target resolves to)."""
    insns, labels, pending = [], {}, []
    for ln in text.splitlines():
        m = _SASS_LABEL.match(ln.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _SASS_INSN.match(ln)
        if m:
            addr = int(m.group(1), 16)
            for lb in pending:
                labels[lb] = addr
            pending = []
            insns.append((addr, m.group(2), m.group(3)))
    return insns, labels


def sass_counts(cubin: bytes) -> dict:
    """Static SASS instruction counts of a cubin by mnemonic (``IMAD``, ``HGMMA``, ...; ``IMAD.MOV``, a
    register copy, also on its own), through ``nvdisasm``; {} when no nvdisasm is found."""
    import collections

    text = disassemble(cubin)
    if text is None:
        return {}
    ops = collections.Counter()
    for _, op, _ in parse_sass(text)[0]:
        ops[op.split(".")[0]] += 1
        if op.startswith("IMAD.MOV"):
            ops["IMAD.MOV"] += 1
    return dict(ops)


def parse_params(items) -> dict:
    """``["NAME=VALUE", ...]`` (repeated ``--param``) → {NAME: VALUE as a bool, int or float where it reads as one}."""
    from numba_attn.spec.errors import parse_param_value

    return {k: parse_param_value(v) for k, v in (p.split("=", 1) for p in items)}


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


def compile_phase(phase_name: str, problem, params: dict | None = None, cc=(9, 0, "a"),
                  keep_cubin: bool = False) -> list[dict]:
    """Compile every kernel the phase launches for ``problem``; one dict per launch (with ``keep_cubin``
    its linked cubin too, for :func:`sass_counts`).

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
            cubin = []
            log = _link_info(code if lto else ptx, arch, opts.get("max_registers"), cubin)
            info = parse_ptxas(log)
            if keep_cubin:
                info["cubin"] = cubin[0] if cubin else None
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
        if phase.kind == "backward":  # run(q, k, v, o, lse, do, dq, dk, dv, stream)
            lse = np.empty((B * H, problem.q_len), np.float32)
            launch.run(q, k, np.empty_like(k), np.empty_like(q), lse, np.empty_like(q), np.empty_like(q),
                       np.empty_like(k), np.empty_like(k), 0)
        elif getattr(problem, "lse", False):  # a problem asking for the log-sum-exp: its run takes the array
            launch.run(q, k, np.empty_like(k), np.empty_like(q), 0, lse=np.empty((B * H, problem.q_len), np.float32))
        else:
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
    ap.add_argument("--sass", action="store_true",
                    help="print static SASS instruction counts (nvdisasm: PATH, $CUDA_HOME/bin or Triton's copy)")
    ap.add_argument("--page-size", type=int, default=0, help="a paged KV cache with this page size (paged phases)")
    ap.add_argument("--kv-dtype", default="", help="paged: the cache format, float8_e4m3 or int8 (default: --dtype)")
    ap.add_argument("--kv-scale", default="head", help="paged 8-bit cache: tensor, head or token scales")
    ap.add_argument("--varlen", action="store_true", help="a packed ragged batch with cu_seqlens (varlen phases)")
    args = ap.parse_args(argv)
    params = parse_params(args.param)
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
        for rec in compile_phase(name, prob, params if len(args.phases) == 1 else None, keep_cubin=args.sass):
            print(f"{name:18s} {rec['kernel']:24s} regs={rec['regs']} stack={rec.get('stack_bytes')} "
                  f"spill_st={rec.get('spill_stores')} spill_ld={rec.get('spill_loads')} smem={rec['smem_bytes']}"
                  f"{' (LTO link)' if rec.get('lto') else ''}")
            for note in rec.get("notes", []):
                print(f"{'':18s} ptxas: {note}")
            if args.sass:
                ops = sass_counts(rec["cubin"]) if rec.get("cubin") else {}
                keys = ("IMAD.MOV", "IMAD", "FFMA", "FMUL", "FADD", "MUFU", "HGMMA", "WARPGROUP", "BAR", "SYNCS")
                print(f"{'':18s} SASS: " + (", ".join(f"{k} {ops.get(k, 0)}" for k in keys)
                                            + f", total {sum(v for k, v in ops.items() if k != 'IMAD.MOV')}"
                                            if ops else "no nvdisasm found"))
            if args.ptx:
                print(rec["ptx"])
    return 0


EXTRA_HINT = ('offline compilation needs the CUDA compiler libraries (NVRTC, libNVVM, nvJitLink) of the cu12 or cu13 '
              'extra: pip install -e ".[cu12]" (= "numba-cuda[cu12]>=0.30,<0.31"; [cu13] for a CUDA 13 toolchain); '
              'no GPU or driver needed')


def missing_cuda_library(exc: BaseException) -> str | None:
    """The name of the CUDA library whose absence ``exc`` (or an exception in its chain) reports, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = f"{type(exc).__name__}: {exc}"
        m = re.search(r"lib(nvrtc|nvvm|nvJitLink|cudart)[\w.]*", text, re.IGNORECASE)
        if m and ("DynamicLibNotFound" in text or "not found" in text.lower() or "No such file" in text
                  or "cannot open" in text.lower() or "NvrtcSupportError" in text or "NvvmSupportError" in text):
            return f"lib{m.group(1)}"
        if type(exc).__name__ in ("NvrtcSupportError", "NvvmSupportError", "DynamicLibNotFoundError"):
            return type(exc).__name__
        exc = exc.__cause__ or exc.__context__
    return None


def run(argv=None) -> int:
    """:func:`main`, with a missing CUDA compiler library said in one line (exit 2) instead of a traceback."""
    try:
        return main(argv)
    except Exception as exc:  # noqa: BLE001
        lib = missing_cuda_library(exc)
        if lib is None:
            raise
        print(f"{EXTRA_HINT} ({lib} not found)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run())
