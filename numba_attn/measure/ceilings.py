"""Measured ceilings: what this device does at best, measured in the same run.

* ``ffma`` — fp32 FMA throughput of the CUDA cores, from a numba kernel: every
  thread runs 16 independent ``cuda.fma`` chains (enough independent work to
  hide the FMA latency), 4 steps per loop iteration so the loop counter costs
  little. 2 FLOP per FMA.
* ``mma_fp16`` / ``mma_tf32`` — tensor-core throughput a numba kernel reaches:
  every warp issues 4 independent chains of ``mma.sync`` (m16n8k16 f16 /
  m16n8k8 tf32, f32 accumulation) through :mod:`numba_attn.gpu.intrinsics`; the
  accumulators are checked against the exact sum. If that kernel cannot run,
  ``torch.matmul`` stands in and the row's ``source`` says so.
* ``wgmma_fp16`` — the same for Hopper's warpgroup MMA (:mod:`numba_attn.gpu.wgmma`):
  every warpgroup issues ``wgmma.mma_async.m64n256k16`` (f16, A in registers,
  B from shared memory, f32 accumulation), 4 per fused call, 2 warpgroups per
  block; the accumulators are checked against the exact sum. sm_90 only (the
  row is SKIP elsewhere). The ``tc_wgmma`` phase is compared with it.
* ``cublas_fp16`` — ``torch.matmul`` (cuBLAS) on 8192² fp16 operands: what the
  vendor library reaches (wgmma on Hopper), for reference; phases are not
  compared with it.
* ``copy`` — device-to-device bandwidth from a numba copy kernel over 1 GiB
  (bytes read + bytes written over the time).

Each ceiling is one row ``{"type": "ceiling", "kind": "ceiling", "name": ...,
"value": ..., "unit": ...}`` in the results file. Phase rows then report the
fraction of the ceiling that applies to them (:func:`ceiling_for`): the FFMA
ceiling for CUDA-core phases (fp32 or fp16 storage), the mma ceiling for
phases computing on tensor cores, copy bandwidth for decode phases.
In the simulator nothing can be measured: the rows say so (``SKIP``).
"""
from __future__ import annotations

import functools
import time

from numba_attn.gpu.backend import BACKEND, IS_SIMULATOR  # first: chooses the backend before numba loads

from numba import cuda, float32, uint32  # noqa: E402  (module globals: the simulator swaps `cuda`)

from numba_attn.measure.timing import TimingConfig, events_batched  # noqa: E402

CEILINGS = ("ffma", "mma_fp16", "mma_tf32", "wgmma_fp16", "copy", "cublas_fp16")
UNITS = {"ffma": "TFLOP/s", "mma_fp16": "TFLOP/s", "mma_tf32": "TFLOP/s", "wgmma_fp16": "TFLOP/s", "copy": "GB/s",
         "cublas_fp16": "TFLOP/s", "cublas_tf32": "TFLOP/s"}

FFMA_CHAINS = 16
FFMA_UNROLL = 4
FFMA_THREADS = 256


@functools.cache
def _ffma_kernel():
    @cuda.jit(fastmath=False)
    def ffma(out, n_iter, a, b):
        i = cuda.grid(1)
        x0 = float32(i) * float32(1e-9)
        x1 = x0 + float32(1.0)
        x2 = x0 + float32(2.0)
        x3 = x0 + float32(3.0)
        x4 = x0 + float32(4.0)
        x5 = x0 + float32(5.0)
        x6 = x0 + float32(6.0)
        x7 = x0 + float32(7.0)
        x8 = x0 + float32(8.0)
        x9 = x0 + float32(9.0)
        x10 = x0 + float32(10.0)
        x11 = x0 + float32(11.0)
        x12 = x0 + float32(12.0)
        x13 = x0 + float32(13.0)
        x14 = x0 + float32(14.0)
        x15 = x0 + float32(15.0)
        for _ in range(n_iter):
            for _u in range(FFMA_UNROLL):
                x0 = cuda.fma(x0, a, b)
                x1 = cuda.fma(x1, a, b)
                x2 = cuda.fma(x2, a, b)
                x3 = cuda.fma(x3, a, b)
                x4 = cuda.fma(x4, a, b)
                x5 = cuda.fma(x5, a, b)
                x6 = cuda.fma(x6, a, b)
                x7 = cuda.fma(x7, a, b)
                x8 = cuda.fma(x8, a, b)
                x9 = cuda.fma(x9, a, b)
                x10 = cuda.fma(x10, a, b)
                x11 = cuda.fma(x11, a, b)
                x12 = cuda.fma(x12, a, b)
                x13 = cuda.fma(x13, a, b)
                x14 = cuda.fma(x14, a, b)
                x15 = cuda.fma(x15, a, b)
        s = (((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
             + (((x8 + x9) + (x10 + x11)) + ((x12 + x13) + (x14 + x15))))
        if i < out.shape[0]:
            out[i] = s

    return ffma


COPY_THREADS = 512
COPY_BLOCKS_PER_SM = 4  # 2048 resident threads per SM, no waiting blocks


@functools.cache
def _copy_kernel():
    @cuda.jit
    def copy(dst, src):
        """Grid-stride copy, four independent loads in flight per thread before
        their stores (one 4-byte load per thread leaves HBM latency exposed)."""
        step = cuda.gridsize(1)
        n = src.shape[0]
        i = cuda.grid(1)
        while i + 3 * step < n:
            a = src[i]
            b = src[i + step]
            c = src[i + 2 * step]
            d = src[i + 3 * step]
            dst[i] = a
            dst[i + step] = b
            dst[i + 2 * step] = c
            dst[i + 3 * step] = d
            i += 4 * step
        while i < n:
            dst[i] = src[i]
            i += step

    return copy


def copy_pattern(n: int):
    """The copy ceiling's source data: exact small integers (float32 cannot hold
    ``arange(n)`` exactly beyond 2**24)."""
    import numpy as np

    return (np.arange(n, dtype=np.int64) % 1000).astype(np.float32)


def _row(name, **kw) -> dict:
    return {"type": "ceiling", "kind": "ceiling", "name": name, "phase": f"ceiling.{name}",
            "unit": UNITS[name], "backend": BACKEND, **kw}


def ffma_reference(n_threads: int, n_iter: int, a: float, b: float):
    """What the FFMA kernel writes (float32, computed on the host): for tests."""
    import numpy as np

    a, b = np.float32(a), np.float32(b)
    x = np.arange(n_threads, dtype=np.float32) * np.float32(1e-9)
    xs = [x + np.float32(c) for c in range(FFMA_CHAINS)]
    xs[0] = x
    for _ in range(n_iter * FFMA_UNROLL):
        xs = [xx * a + b for xx in xs]
    s = (((xs[0] + xs[1]) + (xs[2] + xs[3])) + ((xs[4] + xs[5]) + (xs[6] + xs[7]))
         + (((xs[8] + xs[9]) + (xs[10] + xs[11])) + ((xs[12] + xs[13]) + (xs[14] + xs[15]))))
    return s


def measure_ffma(timing: TimingConfig | None = None) -> dict:
    import numpy as np

    dev = cuda.get_current_device()
    blocks = int(dev.MULTIPROCESSOR_COUNT) * 16
    n = blocks * FFMA_THREADS
    out = cuda.device_array(n, np.float32)
    kern = _ffma_kernel()
    a, b = float32(0.999999), float32(1e-7)
    stream = cuda.stream()
    n_iter = 4096

    def fn(i, s=stream):
        kern[blocks, FFMA_THREADS, s](out, n_iter, a, b)

    t = events_batched(fn, stream, timing or TimingConfig(min_reps=5, budget_s=0.5))
    # check the arithmetic really ran (a few threads against the host)
    host = out.copy_to_host()
    ref = ffma_reference(8, n_iter, a, b)
    ok = bool(np.allclose(host[:8], ref, rtol=1e-3))
    flop = 2.0 * n * n_iter * FFMA_UNROLL * FFMA_CHAINS
    tflops = flop / (t["time_ms"] * 1e-3) / 1e12
    row = _row("ffma", value=tflops, tflops=tflops, status="OK" if ok else "FAIL",
               reason="" if ok else "FFMA kernel wrote wrong values",
               source=f"numba kernel, {FFMA_CHAINS} independent cuda.fma chains per thread, "
                      f"{blocks}x{FFMA_THREADS} threads", **_timing_fields(t))
    return row


def measure_copy(nbytes: int = 2**30, timing: TimingConfig | None = None) -> dict:
    import numpy as np

    dev = cuda.get_current_device()
    n = nbytes // 4
    host = copy_pattern(n)
    src = cuda.to_device(host)
    dst = cuda.device_array(n, np.float32)
    kern = _copy_kernel()
    blocks = int(dev.MULTIPROCESSOR_COUNT) * COPY_BLOCKS_PER_SM
    stream = cuda.stream()

    def fn(i, s=stream):
        kern[blocks, COPY_THREADS, s](dst, src)

    t = events_batched(fn, stream, timing or TimingConfig(min_reps=5, budget_s=0.5))
    ok = bool(np.array_equal(dst.copy_to_host(), host))
    gbps = 2 * n * 4 / (t["time_ms"] * 1e-3) / 1e9
    del src, dst
    return _row("copy", value=gbps, gbps=gbps, status="OK" if ok else "FAIL",
                reason="" if ok else "copy kernel wrote wrong values", bytes=2 * n * 4,
                source=f"numba grid-stride copy kernel (4 loads in flight per thread), {nbytes / 2**30:g} GiB "
                       f"read + written",
                **_timing_fields(t))


MMA_CHAINS = 4  # independent accumulator sets per warp
MMA_UNROLL = 2
MMA_THREADS = 256


@functools.cache
def _mma_kernel(precision: str):
    """Each warp issues MMA_CHAINS independent chains of ``mma.sync`` (m16n8k16
    f16 or m16n8k8 tf32) on constant fragments; every lane writes the sum of its
    accumulators so the work cannot be dropped."""
    from numba_attn.gpu.intrinsics import mma_f16, mma_tf32

    mma = mma_tf32 if precision == "tf32" else mma_f16

    @cuda.jit
    def mma_loop(out, n_iter, a_bits, b_bits):
        i = cuda.grid(1)
        a = uint32(a_bits)
        b = uint32(b_bits)
        x0 = x1 = x2 = x3 = float32(0.0)
        y0 = y1 = y2 = y3 = float32(0.0)
        z0 = z1 = z2 = z3 = float32(0.0)
        w0 = w1 = w2 = w3 = float32(0.0)
        for _ in range(n_iter):
            for _u in range(MMA_UNROLL):
                x0, x1, x2, x3 = mma(a, a, a, a, b, b, x0, x1, x2, x3)
                y0, y1, y2, y3 = mma(a, a, a, a, b, b, y0, y1, y2, y3)
                z0, z1, z2, z3 = mma(a, a, a, a, b, b, z0, z1, z2, z3)
                w0, w1, w2, w3 = mma(a, a, a, a, b, b, w0, w1, w2, w3)
        s = (x0 + x1 + x2 + x3) + (y0 + y1 + y2 + y3) + (z0 + z1 + z2 + z3) + (w0 + w1 + w2 + w3)
        if i < out.shape[0]:
            out[i] = s

    return mma_loop


def mma_operands(precision: str):
    """(a_bits, b_bits, k, expected accumulator value per mma): every A element
    0.25 and every B element 0.5, so each mma adds k·0.125 to each accumulator."""
    from numba_attn.gpu.intrinsics import f16_bits, tf32_bits

    if precision == "tf32":
        return tf32_bits(0.25), tf32_bits(0.5), 8, 8 * 0.125
    a = f16_bits(0.25)
    b = f16_bits(0.5)
    return (a | (a << 16)), (b | (b << 16)), 16, 16 * 0.125


def _time_chains(kern, blocks, threads, n_iter, a_bits, b_bits, timing):
    """Time ``kern[blocks, threads](out, n_iter, a_bits, b_bits)`` (a chain-of-MMAs
    kernel, one float per thread out): (the timing, ``out`` on the host)."""
    import numpy as np

    out = cuda.device_array(blocks * threads, np.float32)
    stream = cuda.stream()

    def fn(i, s=stream):
        kern[blocks, threads, s](out, n_iter, np.uint32(a_bits), np.uint32(b_bits))

    t = events_batched(fn, stream, timing or TimingConfig(min_reps=5, budget_s=0.5))
    return t, out.copy_to_host()


def measure_mma_numba(precision: str, timing: TimingConfig | None = None) -> dict:
    import numpy as np

    name = f"mma_{precision}"
    dev = cuda.get_current_device()
    blocks = int(dev.MULTIPROCESSOR_COUNT) * 8
    n = blocks * MMA_THREADS
    a_bits, b_bits, k, per_mma = mma_operands(precision)
    n_iter = 256
    t, host = _time_chains(_mma_kernel(precision), blocks, MMA_THREADS, n_iter, a_bits, b_bits, timing)
    expect = 4 * MMA_CHAINS * per_mma * n_iter * MMA_UNROLL
    ok = bool(np.allclose(host, expect, rtol=1e-3))
    n_mma = (n // 32) * n_iter * MMA_UNROLL * MMA_CHAINS
    tflops = 2.0 * 16 * 8 * k * n_mma / (t["time_ms"] * 1e-3) / 1e12
    shape = "m16n8k8 tf32" if precision == "tf32" else "m16n8k16 f16"
    return _row(name, status="OK" if ok else "FAIL", reason="" if ok else "mma kernel wrote wrong values",
                value=tflops, tflops=tflops,
                source=f"numba kernel, mma.sync {shape} (f32 accumulate), {MMA_CHAINS} independent chains "
                       f"per warp, {blocks}x{MMA_THREADS} threads", **_timing_fields(t))


def measure_mma(precision: str, timing: TimingConfig | None = None) -> dict:
    """The tensor-core ceiling a numba kernel can reach (``mma.sync`` through
    :mod:`numba_attn.gpu.intrinsics`); torch's matmul when that is unavailable."""
    try:
        return measure_mma_numba(precision, timing)
    except Exception as exc:  # noqa: BLE001 - fall back to the library ceiling, and say so
        row = measure_cublas(precision, timing, name=f"mma_{precision}")
        row["source"] = f"{row.get('source', '')} [numba mma kernel failed: {type(exc).__name__}: {exc}]"[:400]
        return row


WGMMA_N = 256
WGMMA_KSTEPS = 4
WGMMA_GROUPS = 2  # warpgroups per block


@functools.cache
def _wgmma_kernel():
    """Each warpgroup repeats one fused call of WGMMA_KSTEPS chained
    ``wgmma.mma_async.m64n256k16`` (A = 0.25 in registers, B = 0.5 from a
    shared 256×64 tile); every thread writes the sum of its accumulators."""
    from numba_attn.gpu.wgmma import kmajor_params, make_wgmma_rs

    offs, lbo, sbo = kmajor_params(WGMMA_N, WGMMA_KSTEPS, 128)
    op = make_wgmma_rs("f16", WGMMA_N, False, False, offs, lbo, sbo, 128)
    NA = WGMMA_N // 2
    NW = WGMMA_N * 16 * WGMMA_KSTEPS // 2  # words of the B tile
    NAR = 4 * WGMMA_KSTEPS  # A registers (a closure constant: array shapes must be literals)
    NTH = 128 * WGMMA_GROUPS
    FILL = NW // NTH  # constant trip count: a strided range would divide (a call: ptxas serializes wgmma)

    @cuda.jit
    def wgmma_loop(out, n_iter, a_bits, b_bits):
        sm = cuda.shared.array(NW, uint32, alignment=1024)
        for j in range(FILL):
            sm[j * NTH + cuda.threadIdx.x] = uint32(b_bits)
        cuda.syncthreads()
        a = cuda.local.array(NAR, uint32)
        for j in range(NAR):
            a[j] = uint32(a_bits)
        acc = cuda.local.array(NA, float32)
        for j in range(NA):
            acc[j] = float32(0.0)
        for _ in range(n_iter):
            op(acc, a, 0, sm, 0)
        s = float32(0.0)
        for j in range(NA):
            s += acc[j]
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = s

    return wgmma_loop


def measure_wgmma(timing: TimingConfig | None = None) -> dict:
    import numpy as np

    dev = cuda.get_current_device()
    if tuple(dev.compute_capability) != (9, 0):
        return _row("wgmma_fp16", status="SKIP", value=None,
                    reason=f"wgmma needs sm_90 (device is sm_{dev.compute_capability[0]}{dev.compute_capability[1]})")
    threads = 128 * WGMMA_GROUPS
    blocks = int(dev.MULTIPROCESSOR_COUNT) * 2
    n = blocks * threads
    a_bits, b_bits, k, per_mma = mma_operands("fp16")  # 0.25 · 0.5 over k = 16: +2 per k-step
    n_iter = 256
    t, host = _time_chains(_wgmma_kernel(), blocks, threads, n_iter, a_bits, b_bits, timing)
    expect = (WGMMA_N // 2) * per_mma * WGMMA_KSTEPS * n_iter
    ok = bool(np.allclose(host, expect, rtol=1e-3))
    flops = 2.0 * 64 * WGMMA_N * 16 * WGMMA_KSTEPS * n_iter * (n // 128)
    tflops = flops / (t["time_ms"] * 1e-3) / 1e12
    return _row("wgmma_fp16", status="OK" if ok else "FAIL", reason="" if ok else "wgmma kernel wrote wrong values",
                value=tflops, tflops=tflops,
                source=f"numba kernel, wgmma.mma_async m64n{WGMMA_N}k16 f16 (A in registers, B from shared "
                       f"memory, f32 accumulate), {WGMMA_KSTEPS} per fused call, {blocks}x{threads} threads",
                **_timing_fields(t))


def measure_cublas(precision: str, timing: TimingConfig | None = None, name: str | None = None) -> dict:
    name = name or f"cublas_{precision}"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return _row(name, status="SKIP", reason=f"torch not importable ({type(exc).__name__})", value=None)
    if not torch.cuda.is_available():
        return _row(name, status="SKIP", reason="torch has no CUDA device", value=None)
    from numba import cuda

    n = 8192
    dt = torch.float16 if precision == "fp16" else torch.float32
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
    c = torch.empty(n, n, device="cuda", dtype=dt)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)

        def fn(i):
            torch.matmul(a, b, out=c)

        t = events_batched(fn, stream, timing or TimingConfig(min_reps=5, budget_s=0.5))
        # spot check one entry against float64
        i, j = 17, 4093
        ref = float((a[i].double() * b[:, j].double()).sum())
        got = float(c[i, j])
        ok = abs(got - ref) <= 0.02 * (abs(ref) + 3 * n ** 0.5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    tflops = 2.0 * n ** 3 / (t["time_ms"] * 1e-3) / 1e12
    label = "fp16 operands, fp32 accumulate" if precision == "fp16" else "fp32 operands in TF32 mode"
    return _row(name, status="OK" if ok else "FAIL", reason="" if ok else "matmul result wrong",
                value=tflops, tflops=tflops,
                source=f"torch.matmul (cuBLAS) {n}x{n}x{n}, {label}: library tensor-core throughput",
                torch=torch.__version__, **_timing_fields(t))


def _timing_fields(t: dict) -> dict:
    return {k: t[k] for k in ("method", "time_ms", "time_min_ms", "time_max_ms", "spread", "reps", "inner")
            if k in t}


def measure_all(names=CEILINGS, timing: TimingConfig | None = None) -> list[dict]:
    """One row per ceiling (SKIP rows in the simulator); exceptions become ERROR rows."""
    rows = []
    for name in names:
        if IS_SIMULATOR:
            rows.append(_row(name, status="SKIP", value=None,
                             reason="simulator: no device to measure a ceiling on"))
            continue
        t0 = time.perf_counter()
        try:
            if name == "ffma":
                row = measure_ffma(timing)
            elif name == "copy":
                row = measure_copy(timing=timing)
            elif name.startswith("mma_"):
                row = measure_mma(name[4:], timing)
            elif name == "wgmma_fp16":
                row = measure_wgmma(timing)
            elif name.startswith("cublas_"):
                row = measure_cublas(name[7:], timing)
            else:
                raise ValueError(f"unknown ceiling {name!r} (known: {', '.join(CEILINGS)})")
        except Exception as exc:  # noqa: BLE001
            row = _row(name, status="ERROR", value=None, reason=f"{type(exc).__name__}: {exc}"[:300])
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    return rows


# -- which ceiling applies to a phase -----------------------------------------

TENSOR_CORE_PRECISIONS = ("tf32", "float16", "fp16", "bfloat16", "bf16", "mma")
TENSOR_CORE_WORDS = ("mma", "wmma", "tensor", "tc_", "_tc", "hmma", "wgmma")


def uses_tensor_cores(name: str, precision: str | None) -> bool:
    """True for phases whose ``precision`` or name says they compute on tensor cores."""
    if precision and str(precision).lower() in TENSOR_CORE_PRECISIONS:
        return True
    n = (name or "").lower()
    return any(w in n for w in TENSOR_CORE_WORDS)


def _wgmma_lineage(name: str) -> bool:
    """A wgmma phase: its name or an ancestor's says so (``warp_specialized_tc`` descends from
    ``tma_wgmma``); names outside the registry go by their own name."""
    from numba_attn.phases.registry import get_phase

    seen = 0
    while name and seen < 64:
        if "wgmma" in name.lower():
            return True
        try:
            name = get_phase(name).parent
        except (KeyError, ValueError):
            return False
        seen += 1
    return False


def ceiling_for(row: dict) -> str:
    """The ceiling a row is compared with: ``copy`` for decode phases,
    ``wgmma_fp16`` for wgmma phases, ``mma_tf32``/``mma_fp16`` (numba
    mma.sync) for the other tensor-core phases, ``ffma``
    otherwise. Peers in fp16/bf16 are compared with ``cublas_fp16`` (PyTorch's
    kernels use wgmma, which mma.sync cannot reach); a decode-sized peer
    problem (q_len ≤ 8) with copy bandwidth."""
    if row.get("phase_kind") == "decode":
        return "copy"
    if row.get("kind") == "peer":
        if (row.get("problem") or {}).get("q_len", 1e9) <= 8:
            return "copy"
        dt = (row.get("params") or {}).get("dtype", "float32")
        return "cublas_fp16" if dt in ("float16", "bfloat16") else "ffma"
    if _wgmma_lineage(row.get("phase") or ""):
        return "wgmma_fp16"
    if uses_tensor_cores(row.get("phase", ""), row.get("precision")):
        return "mma_tf32" if str(row.get("precision")).lower() == "tf32" else "mma_fp16"
    return "ffma"


def attach_fractions(row: dict, ceilings: dict) -> None:
    """Add ``ceiling``, ``ceiling_value`` and ``frac_ceiling`` (and ``frac_copy``,
    the achieved share of copy bandwidth at the minimum bytes) to a timed row.
    ``ceilings`` maps a ceiling name to its OK row."""
    if not row.get("time_ms"):
        return
    name = ceiling_for(row)
    c = ceilings.get(name)
    if c is None and name in ("mma_tf32", "cublas_fp16", "wgmma_fp16"):
        name, c = "mma_fp16", ceilings.get("mma_fp16")
    if c is not None and c.get("value"):
        row["ceiling"] = name
        row["ceiling_value"] = c["value"]
        achieved = row.get("gbps") if name == "copy" else row.get("tflops")
        if achieved is not None:
            row["frac_ceiling"] = achieved / c["value"]
    cp = ceilings.get("copy")
    if cp is not None and cp.get("value") and row.get("gbps") is not None:
        row["frac_copy"] = row["gbps"] / cp["value"]
