"""Peers: PyTorch SDPA on the same inputs, checked and timed the same way.

Peers (``peer_names()``): ``torch_sdpa`` (PyTorch choosing the backend); ``torch_sdpa_fp16`` (fp16 copies of the
inputs, checked against a reference on them; skipped for fp16 problems); ``torch_sdpa_flash``,
``torch_sdpa_efficient``, ``torch_sdpa_math``, ``torch_sdpa_cudnn`` (one backend each through
``torch.nn.attention.sdpa_kernel``; a backend that cannot run the problem gives a ``SKIP`` row with PyTorch's
reason). SDPA's backward peers (``backward_peer_names()``) time ``torch.autograd.grad`` through its output.

SDPA runs plain problems: a problem with a mask or score function is ``SKIP`` here and runs on the peers of other
libraries, :mod:`numba_attn.measure.other_peers` (rows by :func:`numba_attn.measure.peer_rows.measure_peer`):
FlashAttention-4 (``fa4``, ``fa4_backward``) and FlexAttention (``torch_flex``, ``torch_flex_backward``), measured
by the helpers below (:func:`torch_inputs`, :func:`first_call`, :func:`check_output`, :func:`check_grads`,
:func:`time_torch_calls`) as SDPA's are; in no default set (``known_peer_names()`` lists every name).

Every peer is timed the way a phase is, by the same code (:func:`numba_attn.measure.timing.timed`: events, graph
replay or CUPTI kernel time; rotated input copies), its output checked against the float64 reference first;
everything a call needs but the call itself is built before the timed region, under ``torch.no_grad()``. Without
torch or a GPU the rows say so (``SKIP``). Every OK row says which SDPA backend ran (``sdpa_backend_ran``, from the
kernel names the profiler saw: :func:`sdpa_backend_from_kernels`; ``sdpa_kernels``), beside PyTorch's own choice
(``sdpa_backend_choice``).
"""
from __future__ import annotations

import contextlib
import warnings

from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, reference
from numba_attn.measure.check import TORCH_REFERENCE_FLOPS, cached_reference, reference_torch
from numba_attn.measure.row_figures import timed_row
from numba_attn.measure.status import ERROR, FAIL, SKIP, summarize_exception
from numba_attn.measure.timing import (KERNEL_NAME_CHARS, TimingConfig, enough_samples, timing_summary, cupti_status,
                                       end_to_end, kernel_events, timed)

BACKENDS = ("flash", "efficient", "math", "cudnn")
PEERS = ("torch_sdpa", "torch_sdpa_fp16") + tuple(f"torch_sdpa_{b}" for b in BACKENDS)
# the backward peers: torch.autograd.grad through SDPA's output (a backward phase's run compares with these)
BACKWARD_PEERS = ("torch_sdpa_backward",) + tuple(f"torch_sdpa_{b}_backward" for b in ("cudnn", "flash", "efficient"))
# peers of other libraries (numba_attn.measure.other_peers): FlashAttention-4 and FlexAttention. Named with --peers
# (or peer_list), never in a default set: their first call compiles (seconds to a minute a problem)
OTHER_PEERS = ("fa4", "torch_flex")
OTHER_BACKWARD_PEERS = ("fa4_backward", "torch_flex_backward")
ALL_PEERS = PEERS + OTHER_PEERS
ALL_BACKWARD_PEERS = BACKWARD_PEERS + OTHER_BACKWARD_PEERS
_BACKEND_ENUM = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH",
                 "cudnn": "CUDNN_ATTENTION"}


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


def backward_peer_names() -> list[str]:
    return list(BACKWARD_PEERS)


def known_peer_names() -> list[str]:
    """Every peer a run may name: SDPA's forward and backward peers, then FlashAttention-4's and FlexAttention's."""
    return list(PEERS + BACKWARD_PEERS + OTHER_PEERS + OTHER_BACKWARD_PEERS)


def peer_backend(name: str) -> str | None:
    """The explicit SDPA backend a peer name asks for (None: PyTorch chooses)."""
    for b in BACKENDS:
        if name in (f"torch_sdpa_{b}", f"torch_sdpa_{b}_backward"):
            return b
    return None


def peer_dtype(name: str, problem: Problem) -> str:
    return "float16" if name == "torch_sdpa_fp16" else problem.dtype


def _sdpa_kwargs(torch, problem: Problem) -> dict:
    """The keyword arguments of a call, built once (the causal bias too), outside any timed region."""
    kw = {"scale": problem.sm_scale}
    if problem.kv_heads != problem.heads:
        kw["enable_gqa"] = True
    if problem.causal:
        if problem.q_len == problem.kv_len:
            kw["is_causal"] = True
        else:  # bottom-right alignment, as the reference
            from torch.nn.attention.bias import causal_lower_right

            kw["attn_mask"] = causal_lower_right(problem.q_len, problem.kv_len)
    return kw


def _sdpa(torch, q, k, v, problem: Problem, kw: dict | None = None):
    kw = _sdpa_kwargs(torch, problem) if kw is None else kw
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


# Kernel name fragments of each SDPA backend (lower case), in the order they are tried: cuDNN's
# fused kernels have "flash" in their names too ("..._sdpa_sm90_flash_fprop_..."), so cuDNN comes
# first; math is a GEMM, a softmax and a GEMM.
SDPA_KERNEL_PATTERNS = (
    ("cudnn", ("cudnn", "native_sdpa", "flash_fprop", "fprop_sdpa")),
    ("flash", ("flash_fwd", "pytorch_flash", "flashattn", "flash::", "flash_attn")),
    ("efficient", ("fmha_cutlass", "memeffattention", "mem_eff", "attentionkernel", "efficient_attention")),
    ("math", ("softmax",)),
)


def sdpa_backend_from_kernels(names) -> str | None:
    """The SDPA backend that launched the kernels ``names`` (``cudnn``, ``flash``, ``efficient``,
    ``math``); ``unknown`` when no name matches a pattern, None when there are no kernels."""
    low = [str(n).lower() for n in names if n]
    if not low:
        return None
    for backend, frags in SDPA_KERNEL_PATTERNS:
        if any(f in n for n in low for f in frags):
            return backend
    return "unknown"


def _backend_choice(torch, q, k, v, kw: dict) -> str | None:
    """PyTorch's choice of backend for these inputs (``torch._fused_sdp_choice``), or None."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return None
    try:
        idx = int(choose(q, k, v, attn_mask=kw.get("attn_mask"), dropout_p=0.0,
                         is_causal=bool(kw.get("is_causal", False)), scale=kw.get("scale"),
                         enable_gqa=bool(kw.get("enable_gqa", False))))
        from torch.nn.attention import SDPBackend

        name = SDPBackend(idx).name
    except Exception:  # noqa: BLE001 - a private function: its signature may change
        return None
    back = {v: k for k, v in _BACKEND_ENUM.items()}
    return back.get(name, name.lower())


def _profiled_kernels(torch, fn, calls: int = 2) -> list[str]:
    """Names of the kernels ``calls`` calls of ``fn`` launch, in order (after one call outside)."""
    from torch.profiler import ProfilerActivity, profile

    fn(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    names = [n for n, _, _ in kernel_events(prof.events())]
    seen = []
    for n in names:  # one call's kernels, in order
        if n not in seen:
            seen.append(n)
    return seen


def _torch_graph_replay(torch, fn, cfg: TimingConfig) -> dict:
    """The graph method for PyTorch calls: ``inner`` calls captured into a ``torch.cuda.CUDAGraph``
    and its replays timed with events (numba's graph builder cannot capture PyTorch's launches)."""
    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
        for i in range(max(1, cfg.warmup)):
            fn(i)
    cur.wait_stream(side)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn(0)
    e1.record()
    e1.synchronize()
    single_ms = e0.elapsed_time(e1)
    inner = int(max(1, min(cfg.max_inner, -(-cfg.batch_ms // max(single_ms, 1e-3)))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(inner):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    import time as _time

    t_start = _time.perf_counter()
    while not enough_samples(samples, t_start, cfg):
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        samples.append(e0.elapsed_time(e1) / inner)
    del graph
    return timing_summary("graph_replay", samples, inner=inner)


def _backend_context(torch, backend: str | None):
    import contextlib

    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enum = getattr(SDPBackend, _BACKEND_ENUM[backend], None)
    if enum is None:
        raise _BackendUnavailable(f"this torch has no SDPBackend.{_BACKEND_ENUM[backend]}")
    return sdpa_kernel([enum])


class _BackendUnavailable(RuntimeError):
    pass


def _graph_or_reason(torch, fn, cfg) -> dict:
    """:func:`_torch_graph_replay`, or ``{"method": None, "graph_error": why}`` when capture fails."""
    try:
        return _torch_graph_replay(torch, fn, cfg)
    except Exception as exc:  # noqa: BLE001 - the row says why
        torch.cuda.synchronize()
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"method": None, "graph_error": f"{type(exc).__name__}: {msg}"[:300]}


@contextlib.contextmanager
def call_context(torch, backend: str | None, grad: bool):
    """What a peer's call needs around it: its SDPA backend (None: PyTorch's choice), the grad mode it was
    timed in, warnings silenced. Held calls (:mod:`numba_attn.measure.regime`) are called again in it later."""
    with _backend_context(torch, backend), warnings.catch_warnings(), torch.set_grad_enabled(grad):
        warnings.simplefilter("ignore")
        yield


def time_torch_calls(torch, fn, cfg, backend: str | None = None) -> dict:
    """``fn(i)`` (PyTorch launches on its current stream) timed as a phase is: the run's method (events, CUPTI
    kernel time, or graph replay through :func:`_torch_graph_replay`), then the end-to-end time of one call.
    ``backend``: the SDPA backend the calls run under (their context when interleaved rounds call them again;
    the grad mode of now is kept too)."""
    from numba import cuda

    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    grad = torch.is_grad_enabled()
    t = timed(fn, stream, cfg.timing, graph=lambda: _graph_or_reason(torch, fn, cfg.timing),
              context=lambda: call_context(torch, backend, grad))
    t["e2e_ms"] = end_to_end(fn, stream)
    return t


def input_sets(problem: Problem, tensors: tuple) -> list[tuple]:
    """``tensors`` and clones of them, the rotated input sets of the timed calls (one set for large problems)."""
    n_sets = 1 if problem.min_bytes() > 180 * 2**20 else 4
    return [tuple(tensors)] + [tuple(t.clone() for t in tensors) for _ in range(n_sets - 1)]


def _unavailable_reason(exc: BaseException, backend: str | None) -> str | None:
    """PyTorch's reason when an explicit backend refuses the problem; None for real errors."""
    msg = str(exc)
    if isinstance(exc, _BackendUnavailable):
        return msg
    if backend is None:
        return None
    if "No available kernel" in msg or "not supported" in msg.lower() or "cudnn" in msg.lower():
        first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
        return f"SDPA backend {backend!r} cannot run this problem: {first[:200]}"
    return None


def layout_skip_reason(problem: Problem) -> str | None:
    """Why no peer reads ``problem``'s arrays as they are (a paged cache, a packed batch), or None."""
    if getattr(problem, "page_size", 0):
        return "SDPA reads no paged cache: its row is on the contiguous twin (spec/problem.py contiguous_twin)"
    if getattr(problem, "varlen", False):
        return "SDPA takes no packed ragged batch: its row is on the padded twin (spec/problem.py padded_twin)"
    return None


def skip_reason(problem: Problem, backward: bool = False) -> str | None:
    """Why SDPA has no row on ``problem`` (a paged cache, a packed batch, a variant, no torch with CUDA), or
    None."""
    why = layout_skip_reason(problem)
    if why:
        return why
    if getattr(problem, "variant", None) is not None:
        tail = "_backward" if backward else ""
        return (f"SDPA runs plain problems (no mask or score function): a variant's peers are torch_flex{tail}, "
                f"fa4{tail}")
    return torch_status()


def first_call(torch, backend, row, call, unavailable=None):
    """``call()`` under the SDPA ``backend`` (None: none chosen), synchronized; None with ``row`` SKIP when the
    problem cannot run there (``unavailable(exc)``: the reason, or None for a real error; default: PyTorch's
    reason for an explicit SDPA backend), any other error raised."""
    try:
        with _backend_context(torch, backend), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = call()
            torch.cuda.synchronize()
        return out
    except Exception as exc:  # noqa: BLE001
        why = unavailable(exc) if unavailable is not None else _unavailable_reason(exc, backend)
        if why:
            row.update(status=SKIP, reason=why)
            return None
        raise


def peer_row(name: str, problem: Problem, params: dict, backward: bool = False) -> dict:
    """A peer's row before it is measured: its identity, parameters and the work it is credited with (the
    backward's: :class:`numba_attn.measure.backward_row.BackwardWork`)."""
    work = problem
    if backward:
        from numba_attn.measure.backward_row import BackwardWork

        work = BackwardWork(problem)
    row = {"type": "result", "phase": name, "kind": "peer", "problem": problem.to_dict(), "label": problem.label,
           "params": params, "status": None, "reason": "", "flops": work.flops(), "min_bytes": work.min_bytes()}
    if backward:
        row = {**row, "phase_kind": "backward"}
    return row


TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def torch_inputs(torch, problem: Problem, cfg, dtype: str):
    """``(q, k, v, ref)``: the problem's inputs for the run's first seed as CUDA tensors in ``dtype`` and the
    float64 reference on the inputs the peer sees (recomputed when ``dtype`` rounds them otherwise). e4m3 inputs
    (spec/fp8_inputs.py): their decoded values, in ``dtype``."""
    import numpy as np

    tdt = getattr(torch, TORCH_DTYPES[dtype])
    q, k, v, ref = cached_reference(problem, cfg.seeds[0])
    e4m3 = getattr(problem, "e4m3_inputs", False)
    if e4m3:  # e4m3 codes (spec/fp8_inputs.py): the peer runs on the values they stand for, rounded to its dtype
        q, k, v = problem.decoded(q, k, v)
    tq, tk, tv = (torch.from_numpy(np.asarray(a, dtype=np.float32)).to("cuda", tdt) for a in (q, k, v))
    if dtype != problem.dtype or e4m3:  # the reference must see the inputs the peer sees
        rounded = [t.float().cpu().numpy() for t in (tq, tk, tv)]
        ref = None
        if problem.flops() > TORCH_REFERENCE_FLOPS:
            ref = reference_torch(*rounded, causal=problem.causal, scale=problem.sm_scale)
        if ref is None:
            ref = reference(*rounded, causal=problem.causal, scale=problem.sm_scale)
    return tq, tk, tv, ref


def check_output(row: dict, out, ref, dtype: str) -> bool:
    """``out`` (a tensor of the problem's layout) against the float64 ``ref``; False with ``row`` FAIL."""
    import numpy as np

    c = check(out.float().cpu().numpy().astype(np.dtype(dtype)), ref, dtype=dtype)
    row["check"] = c.to_dict()
    if not c.ok:
        row.update(status=FAIL, reason=f"wrong result: {c.reason}")
    return c.ok


def backward_inputs(torch, problem: Problem, cfg):
    """``(q, k, v, do, ref)`` of a backward peer: CUDA tensors in the problem's dtype (q, k, v leaves that
    require their gradient) and the float64 gradients of the run's last seed (the backward phases' case)."""
    import numpy as np

    from numba_attn.spec.grad_reference import backward_case

    tdt = getattr(torch, TORCH_DTYPES[problem.dtype])
    q, k, v, do, ref = backward_case(problem, cfg.seeds[-1])
    tq, tk, tv = (torch.from_numpy(np.asarray(a, np.float32)).to("cuda", tdt).requires_grad_() for a in (q, k, v))
    tdo = torch.from_numpy(np.asarray(do, np.float32)).to("cuda", tdt)
    return tq, tk, tv, tdo, ref


def check_grads(row: dict, grads, ref, problem: Problem) -> bool:
    """dq, dk, dv (tensors of the problem's layout) against the float64 gradients; the worst check in ``row``,
    False with ``row`` FAIL."""
    from numba_attn.measure.backward_row import GRADS, worst_check
    from numba_attn.spec.problem import numpy_dtype

    dt = numpy_dtype(problem.dtype)
    checks = {n: check(g.float().cpu().numpy().astype(dt), r, dtype=problem.dtype)
              for n, g, r in zip(GRADS, grads, ref)}
    row["rel_err"] = {n: c.rel_err for n, c in checks.items()}
    worst = worst_check(checks)
    row["check"] = worst.to_dict()
    if not worst.ok:
        row.update(status=FAIL, reason=f"wrong gradients: {worst.reason}")
    return worst.ok


def measure_sdpa_peer(name: str, problem: Problem, cfg) -> dict:
    """The row of SDPA peer ``name`` (forward or backward); :func:`numba_attn.measure.peer_rows.measure_peer` takes
    every peer's name."""
    if name in BACKWARD_PEERS:
        return measure_backward_peer(name, problem, cfg)
    dtype = peer_dtype(name, problem)
    backend = peer_backend(name)
    row = peer_row(name, problem, {"dtype": dtype, "sdpa_backend": backend or "auto"})
    if name not in PEERS:
        row.update(status=ERROR, reason=f"unknown peer {name!r} (peers: {', '.join(known_peer_names())})")
        return row
    reason = skip_reason(problem)
    if reason:
        row.update(status=SKIP, reason=reason)
        return row
    if name == "torch_sdpa_fp16" and problem.dtype == "float16":
        row.update(status=SKIP, reason="same as torch_sdpa for fp16 problems")
        return row
    try:
        import torch

        row["torch"] = torch.__version__
        tq, tk, tv, ref = torch_inputs(torch, problem, cfg, dtype)
        # the math backend materializes S and P in the input dtype: check memory first
        if backend == "math":
            need = 2 * problem.batch * problem.heads * problem.q_len * problem.kv_len * tq.element_size()
            free, _total = torch.cuda.mem_get_info()
            if need > 0.8 * free:
                row.update(status=SKIP, reason=f"math backend needs {need / 2**30:.1f} GiB for S and P; "
                                               f"{free / 2**30:.1f} GiB free")
                return row
        out = first_call(torch, backend, row, lambda: _sdpa(torch, tq, tk, tv, problem))
        if out is None or not check_output(row, out, ref, dtype):
            return row
        sets = input_sets(problem, (tq, tk, tv))
        kw = _sdpa_kwargs(torch, problem)  # the causal bias and the arguments: built once, not timed
        sdpa = torch.nn.functional.scaled_dot_product_attention

        with _backend_context(torch, backend), warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")

            def fn(i):
                sdpa(*sets[i % len(sets)], **kw)

            if backend is None:
                choice = _backend_choice(torch, tq, tk, tv, kw)
                if choice:
                    row["sdpa_backend_choice"] = choice
            t = time_torch_calls(torch, fn, cfg, backend)
            names = kernel_names(torch, fn, t, row, "sdpa_backend_reason")
            if names is not None:
                row["sdpa_kernels"] = names
                row["sdpa_backend_ran"] = sdpa_backend_from_kernels(names) or "unknown"
            else:
                row["sdpa_backend_ran"] = "unknown"
        t["input_sets"] = len(sets)
        timed_row(row, problem, t)
    except Exception as exc:  # noqa: BLE001
        row.update(status=ERROR, reason=summarize_exception(exc))
    return row


def kernel_names(torch, fn, t: dict, row: dict, reason_key: str) -> list[str] | None:
    """The names of the kernels one call of ``fn`` launches: CUPTI's when it timed them, else from the
    profiler; None (``row[reason_key]`` saying why) when neither can tell."""
    if t.get("cupti_kernels"):
        return [kk["name"] for kk in t["cupti_kernels"]]
    if cupti_status() is not None:
        row[reason_key] = cupti_status()
        return None
    try:
        return [n[:KERNEL_NAME_CHARS] for n in _profiled_kernels(torch, fn)]
    except Exception as exc:  # noqa: BLE001 - the row says why the kernels are unknown
        row[reason_key] = f"profiler failed: {summarize_exception(exc)}"[:300]
        return None


def measure_backward_peer(name: str, problem: Problem, cfg) -> dict:
    """SDPA's backward on the inputs a backward phase's row sees (``torch.autograd.grad`` of an output computed
    once, ``retain_graph``), its gradients checked against the same float64 gradients, then timed the same way
    (the backward's FLOPs: :class:`numba_attn.measure.backward_row.BackwardWork`)."""
    from numba_attn.measure.backward_row import BackwardWork

    backend = peer_backend(name)
    row = peer_row(name, problem, {"dtype": problem.dtype, "sdpa_backend": backend or "auto"}, backward=True)
    reason = skip_reason(problem, backward=True)
    if reason:
        row.update(status=SKIP, reason=reason)
        return row
    try:
        import torch

        row["torch"] = torch.__version__
        tq, tk, tv, tdo, ref = backward_inputs(torch, problem, cfg)
        kw = _sdpa_kwargs(torch, problem)

        def forward_backward():
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kw)
            return out, torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True)

        first = first_call(torch, backend, row, forward_backward)
        if first is None:
            return row
        out, grads = first
        if not check_grads(row, grads, ref, problem):
            return row

        def fn(i):
            torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True)

        with _backend_context(torch, backend), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time_torch_calls(torch, fn, cfg, backend)
        if t.get("cupti_kernels"):
            row["sdpa_kernels"] = [kk["name"] for kk in t["cupti_kernels"]]
        timed_row(row, BackwardWork(problem), t)
    except Exception as exc:  # noqa: BLE001
        row.update(status=ERROR, reason=summarize_exception(exc))
    return row
