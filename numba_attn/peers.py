"""Peers: PyTorch SDPA on the same inputs, checked and timed the same way.

When torch is not importable the peer rows say so (status SKIP with the
reason) rather than disappearing.
"""
from __future__ import annotations

import time

from .problem import Problem
from .reference import check

PEERS = ("torch_sdpa", "torch_sdpa_fp16")


def torch_status() -> str | None:
    """None when torch with CUDA is usable, else the reason it is not."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return f"torch not importable ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    return None


def peer_names() -> list[str]:
    return list(PEERS)


def _sdpa(torch, q, k, v, problem: Problem):
    F = torch.nn.functional
    kw = {"scale": problem.sm_scale}
    if problem.kv_heads != problem.heads:
        kw["enable_gqa"] = True
    if problem.causal:
        if problem.q_len == problem.kv_len:
            kw["is_causal"] = True
        else:  # bottom-right alignment, as the reference
            from torch.nn.attention.bias import causal_lower_right

            kw["attn_mask"] = causal_lower_right(problem.q_len, problem.kv_len)
    return F.scaled_dot_product_attention(q, k, v, **kw)


def measure_peer(name: str, problem: Problem, cfg) -> dict:
    from .runner import ERROR, FAIL, OK, SKIP, _reference, _summarize_exception, _throughput, _implausible
    from .timing import end_to_end, events_batched

    dtype = "float16" if name.endswith("fp16") else problem.dtype
    row = {"type": "result", "phase": name, "kind": "peer", "problem": problem.to_dict(),
           "label": problem.label, "params": {"dtype": dtype}, "status": None, "reason": "",
           "flops": problem.flops(), "min_bytes": problem.min_bytes()}
    reason = torch_status()
    if reason:
        row.update(status=SKIP, reason=reason)
        return row
    if name.endswith("fp16") and problem.dtype == "float16":
        row.update(status=SKIP, reason="same as torch_sdpa for fp16 problems")
        return row
    try:
        import torch
        from numba import cuda

        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        q, k, v, ref = _reference(problem, cfg.seeds[0])
        import numpy as np

        tq, tk, tv = (torch.from_numpy(np.asarray(a, dtype=np.float32)).to("cuda", tdt) for a in (q, k, v))
        if dtype != problem.dtype:  # the reference must see the inputs the peer sees
            from .reference import reference

            ref = reference(*(t.float().cpu().numpy() for t in (tq, tk, tv)), causal=problem.causal,
                            scale=problem.sm_scale)
        out = _sdpa(torch, tq, tk, tv, problem)
        torch.cuda.synchronize()
        c = check(out.float().cpu().numpy().astype(np.dtype(dtype)), ref, dtype=dtype)
        row["check"] = c.to_dict()
        row["torch"] = torch.__version__
        if not c.ok:
            row.update(status=FAIL, reason=c.reason)
            return row
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        n_sets = 1 if problem.min_bytes() > 180 * 2**20 else 4
        sets = [(tq, tk, tv)] + [tuple(t.clone() for t in (tq, tk, tv)) for _ in range(n_sets - 1)]

        def fn(i):
            _sdpa(torch, *sets[i % len(sets)], problem)

        t = events_batched(fn, stream, cfg.timing)
        t["e2e_ms"] = end_to_end(fn, stream)
        row.update(t)
        row["status"] = OK
        _throughput(row, problem)
        bad = _implausible(row, problem)
        if bad:
            row.update(status=FAIL, reason=bad)
    except Exception as exc:  # noqa: BLE001
        row.update(status=ERROR, reason=_summarize_exception(exc))
    _ = time
    return row
