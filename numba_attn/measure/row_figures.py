"""What a timed row derives from its kernels and its time: registers, shared and local memory per kernel, the
throughput (TFLOP/s, GB/s), and the physical floors below which a time cannot be right. Forward rows
(:mod:`numba_attn.measure.row`), backward rows (:mod:`numba_attn.measure.backward_row`) and peers use them
alike: ``problem`` is anything with ``flops()`` and ``min_bytes()``."""
from __future__ import annotations

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure.status import FAIL, OK

# Physical floors: nothing on current GPUs moves more than 20 TB/s of HBM or
# does more than 5 PFLOP/s of dense math; a time implying either is a bug.
MAX_PLAUSIBLE_BYTES_PER_S = 20e12
MAX_PLAUSIBLE_FLOPS = 5e15


def kernel_resources(kernels) -> list[dict]:
    """Registers, static shared memory and local memory per compiled kernel."""
    if IS_SIMULATOR:
        return []
    out = []
    for kern in kernels:
        name = getattr(getattr(kern, "py_func", None), "__name__", str(kern))
        for sig, ovl in list(getattr(kern, "overloads", {}).items()):
            row = {"kernel": name}
            for key, attr in (("regs", "regs_per_thread"), ("smem_static", "shared_mem_per_block"),
                              ("local_bytes", "local_mem_per_thread"),
                              ("max_threads", "max_threads_per_block")):
                try:
                    row[key] = int(getattr(ovl, attr))
                except Exception:  # pragma: no cover - introspection is best effort
                    row[key] = None
            out.append(row)
    return out


def summarize_resources(row):
    """The row's ``regs``, ``smem_static``, ``local_bytes``: the largest over its kernels."""
    res = row.get("resources") or []
    if res:
        row["regs"] = max((r.get("regs") or 0) for r in res)
        row["smem_static"] = max((r.get("smem_static") or 0) for r in res)
        row["local_bytes"] = max((r.get("local_bytes") or 0) for r in res)


def timed_row(row, problem, timing: dict):
    """The row with its timing: OK with its throughput, or FAIL when the time cannot be right."""
    row.update(timing)
    row["status"] = OK
    add_throughput(row, problem)
    reason = implausible_reason(row, problem)
    if reason:
        row.update(status=FAIL, reason=reason)


def add_throughput(row, problem):
    """TFLOP/s, GB/s of the minimum bytes, GB/s of the model bytes, from ``time_ms``."""
    t = row.get("time_ms")
    if t and t > 0:
        row["tflops"] = problem.flops() / (t * 1e-3) / 1e12
        row["gbps"] = problem.min_bytes() / (t * 1e-3) / 1e9
        if row.get("model_bytes"):
            row["model_gbps"] = row["model_bytes"] / (t * 1e-3) / 1e9


def implausible_reason(row, problem) -> str:
    """Why a timed row cannot be right (not positive, wrong after timing, below the
    physical floor), or ""."""
    t = row.get("time_ms")
    if t is None or not t > 0:
        return f"time {t} ms is not positive"
    if row.get("post_timing_check"):
        return f"wrong result after timing: {row['post_timing_check']}"
    floor_s = max(problem.min_bytes() / MAX_PLAUSIBLE_BYTES_PER_S, problem.flops() / MAX_PLAUSIBLE_FLOPS)
    if t * 1e-3 < floor_s:
        return f"time {t * 1e3:.2f} µs is below the physical floor {floor_s * 1e6:.2f} µs"
    return ""
