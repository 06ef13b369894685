"""Which phase ``phase=None`` runs: the rule of :func:`choose_phase` (the tuning cache, the dispatch
table of :mod:`numba_attn.measure.dispatch` for this GPU model, a measurement on first use
(:mod:`numba_attn.measure.autotune`), the table's entry of another GPU model of the same compute capability,
the Hopper rule, a fixed preference), and the defaults of ``decode_paged()`` and ``attention_varlen()``.
:mod:`numba_attn.api` applies it; its names are importable from there too."""
from __future__ import annotations

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda  # noqa: E402

from numba_attn.phases.registry import list_phases  # noqa: E402
from numba_attn.spec.errors import AttentionInputError  # noqa: E402
from numba_attn.spec.problem import Problem  # noqa: E402


# Never chosen by default: measured slower than its parent tc_wgmma on the H200
# (results/tensor-core-overlap-nvidia-h200.jsonl); run it by name.
NEVER_DEFAULT = ("tc_wgmma_overlap",)
# a mask_mod/score_mod variant's 16-bit prefill phase: the fastest numba-attn phase on every variant timed
# (H200, experiments/2026-11-27-variants-peers: window 1024 at N=32768 1.66 ms against the table's tc_wgmma 2.33)
VARIANT_PREFILL = "warp_specialized_tc"

# The Hopper rule: the 16-bit prefill phase phase=None runs on a GPU of compute capability 9.0 where neither the
# tuning cache nor a dispatch table entry that measured it decides (the first of these that supports the
# problem). Each phase first here was the fastest (within 2 %) at its default parameters on every problem measured
# with it (docs/DEVELOPING.md, "Dispatch", lists the rows; tests/test_autotune.py checks the committed ones).
# ws_tma_q_early first from D80 (Q by the producer's TMA in persistent blocks, released at the item's last S):
# 1.03-1.06x ws_tma_q at B8 H32/8kv N1024 causal and not, level (0.99-1.01x) at B1 H32 N4096, N8192 causal fp16
# and GQA bf16, N16384 causal (H200, experiments/2026-11-28-q-early); ws_tma_q was 1.02-1.32x ws_intra_kv and
# ws_intra on those (experiments/2026-11-28-schedule/tma-q.sh); ws_tma_q second: the same problems, and its
# committed rows count for the rule where its grandchild has none; neither measured above D128
# at D64 ws_tma_q_wide (three consumers on 128-key tiles, Q by TMA): 1.05-1.10x the fastest before it on four
# problems (B4 H32 N2048 fp16 and bf16 causal, B2 H16 N8192 causal, B16 H16 N512; H200, ebc6ae6,
# experiments/2026-11-28-q-early/wide.sh); only D64 (autotune.ONLY_HEAD_DIMS)
HOPPER_PREFILL = ("ws_tma_q_early", "ws_tma_q", "ws_tma_q_wide", "ws_intra", "warp_specialized_tc", "tma_wgmma",
                  "tc_wgmma")
# ws_tma_q_early, ws_intra and ws_intra_kv only above D64, ws_intra_qs only above D128 (autotune.ABOVE_HEAD_DIM, as
# on first use)
# without a mask ws_intra_kv first: 1.02-1.04x ws_intra at B1 H32 N4096 D128 fp16 and bf16 in two runs; causal
# they are level (0.98-1.01x), so ws_intra stays first there (H200, experiments/2026-11-28-ws-intra)
HOPPER_NO_MASK = ("ws_tma_q_early", "ws_tma_q", "ws_intra_kv")
# above D128 ws_intra_qs, then tma_wgmma: at D256 (two consumers with Q in shared memory; one in the others)
# ws_intra_qs 0.425 / 0.417 ms fp16 / bf16 against tma_wgmma's 0.482 / 0.489 and warp_specialized_tc's 0.618,
# causal N8192 0.929 against 1.079 (H200, B1 H16 N4096; experiments/2026-11-28-ws-intra); D136-D248 not measured
HOPPER_ABOVE_D128 = ("ws_intra_qs", "tma_wgmma")
HOPPER_CC = (9, 0)


def hopper_order(problem) -> tuple:
    """The Hopper rule's phases for ``problem``, first choice first."""
    from numba_attn.measure.autotune import above_head_dim

    order = HOPPER_PREFILL if problem.causal else HOPPER_NO_MASK + HOPPER_PREFILL
    if problem.head_dim > 128:
        order = HOPPER_ABOVE_D128 + order
    return tuple(dict.fromkeys(n for n in order if above_head_dim(n, problem.head_dim)))

# The fixed preference per (kind, dtype) when no committed results exist for this GPU model:
# the first one that supports the problem (device included) is chosen.
PREFERENCE = {
    ("prefill", "float16"): ("tc_wgmma", "tc_pipelined", "tc_mma"),
    ("prefill", "bfloat16"): ("tc_wgmma", "tc_pipelined", "tc_mma"),
    ("prefill", "float32"): ("register_blocked",),
    ("decode", "float16"): ("decode_split_k_lean",),
    ("decode", "float32"): ("decode_split_k_lean",),
}


def _preference(problem: Problem, kind: str, allow_tf32: bool) -> tuple:
    pref = PREFERENCE.get((kind, problem.dtype), ())
    if kind == "prefill" and problem.dtype == "float32":
        if problem.causal:
            pref = ("causal_skip",) + pref
        if allow_tf32:
            pref = ("tc_tf32",) + pref
    if kind == "decode" and problem.dtype == "float16" and problem.heads > problem.kv_heads:
        pref = ("decode_mma",) + pref
    return pref


def _precision_allowed(ph, allow_tf32: bool) -> bool:
    """A phase computing at a coarser precision than its inputs runs by default only with the caller's consent."""
    return ph.precision is None or (ph.precision == "tf32" and allow_tf32)


_DEVICE_NAMES: dict = {}


def device_name() -> str:
    """The GPU model the dispatch table and the tuning cache are keyed by ("simulator": no table
    entry): the current device's name, read once per device (no nvidia-smi: this runs whenever a
    call plans)."""
    if backend.IS_SIMULATOR:
        return "simulator"
    dev = cuda.get_current_device()
    name = _DEVICE_NAMES.get(dev.id)
    if name is None:
        name = _DEVICE_NAMES[dev.id] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return name


def measured_rows(gpu: str) -> list[tuple[str, dict]]:
    """``(file, row)`` for every OK, timed phase row of the committed results files
    (``results/*.jsonl`` of a source checkout) measured on ``gpu`` with the default parameters:
    what the dispatch table (:mod:`numba_attn.measure.dispatch`) is built from; ``phase=None`` reads
    the table, not these files."""
    from numba_attn.measure.dispatch import measured_rows as rows

    return [(f, r) for f, _env, r in rows(gpu=gpu) if not r.get("requested_params")]


def choose_phase(problem: Problem, kind: str | None = None, allow_tf32: bool = False, *, measure: bool = False,
                 autotune: bool | None = None, gpu: str | None = None):
    """``(phase, why, params)``: the phase ``attention(..., phase=None)`` runs, why, and the parameters it runs
    with when the caller gives none (``{}``: the phase's defaults). Among the package's own phases of the kind
    the problem needs (decode when q_len <= 8) that the device supports, never :data:`NEVER_DEFAULT` and never
    one below the input precision unless ``allow_tf32``, the first that decides:

    1. the tuning cache's entry for this GPU model and key (``numba-attn tune``, or a first-use measurement);
    2. for a call about to launch (``measure``) with the measurement on (``autotune``, else
       ``$NUMBA_ATTN_AUTOTUNE``; on with a GPU): the shape class's candidates timed once on a stand-in, the
       fastest kept in the tuning cache (:mod:`numba_attn.measure.autotune`);
    3. the dispatch table's entry (:mod:`numba_attn.measure.dispatch`), then another GPU model's of the same
       compute capability; where the Hopper rule applies, only an entry that timed the rule's phase counts;
    4. the Hopper rule (16-bit prefill on compute capability 9.0: :data:`HOPPER_PREFILL`);
    5. the fixed preference per (kind, dtype), else the most optimized supporting phase.

    A variant takes no tuned entry, measurement or table parameters (its stage changes what fits): its 16-bit
    prefill runs ``VARIANT_PREFILL`` where supported. ``gpu``: the GPU model to choose for (default this
    device's); the simulator matches no entry, takes no Hopper rule, times nothing and counts as compute
    capability 9.0. The whole rule, with its measured reasons: docs/DEVELOPING.md, "Dispatch".
    """
    if kind is None:
        kind = "decode" if problem.q_len <= 8 else "prefill"
    allowed = [p for p in list_phases() if p.is_builtin and p.name not in NEVER_DEFAULT
               and _precision_allowed(p, allow_tf32)]
    candidates = [p for p in allowed if p.kind == kind and p.supports(problem) is None]
    if not candidates:
        candidates = [p for p in allowed if p.supports(problem) is None]
    if not candidates:
        hint = ("; tf32 phases run only with allow_tf32=True"
                if problem.dtype == "float32" and not allow_tf32 else "")
        raise AttentionInputError(f"no phase of the package supports {problem.label}{hint} "
                                  f"(name a phase with phase=... to run another one)")
    gpu = gpu or device_name()
    hit = tuned_choice(problem, None, candidates, gpu)
    if hit:
        return hit[0], _tuned_why(problem, hit[0].name, gpu, hit[2]), hit[1]
    variant = getattr(problem, "variant", None) is not None
    if variant and kind == "prefill":
        for p in candidates:
            if p.name == VARIANT_PREFILL:
                return p, f"a variant's prefill phase ({VARIANT_PREFILL}: the fastest on the variants timed)", {}
    from numba_attn.measure import autotune as first_use
    from numba_attn.measure.dispatch import choose, choose_other

    rule = hopper_rule(problem, kind, candidates, gpu)
    needs = rule.name if rule is not None else None
    later = ""  # what attention() will do where explain() only plans
    if not variant and gpu != "simulator" and first_use.enabled(autotune):
        # before the table: the table's rows were timed at earlier commits (a former default, a configuration
        # that was faster then: 1.10-1.22x the fastest at B1 H32 N16384 causal, H200); this times today's code here
        if measure:
            got = first_use.measure(problem, kind, candidates, gpu)
            if got:
                return got
        else:
            names = [p.name for p in first_use.shortlist(problem, kind, candidates)]
            if names:
                later = (f"; attention() times {', '.join(names)} on its first call of this key and keeps the "
                         f"fastest ({first_use.AUTOTUNE_ENV}=0: never)")
    found = choose(problem, candidates, gpu, needs=needs)
    if found:
        if variant:  # the row's phase; its parameters were measured without the stage
            return found[0], found[2] + " (a variant: the phase's own parameters)", {}
        return found[0], found[2] + later, found[1]
    if rule is not None:
        other = choose_other(problem, candidates, gpu, HOPPER_CC, needs=needs)
        if other:
            if variant:
                return other[0], other[2] + " (a variant: the phase's own parameters)" + later, {}
            return other[0], other[2] + later, other[1]
        return rule, (f"the Hopper rule for 16-bit prefill ({rule.name}: the fastest phase at its defaults on the "
                      f"rows measured with it on H100 and H200; no entry of the dispatch table for {gpu} or "
                      f"another model of compute capability 9.0 measured it on this key){later}"), {}
    for name in _preference(problem, kind, allow_tf32):
        for p in candidates:
            if p.name == name:
                return p, (f"preferred for {kind} {problem.dtype}"
                           f"{' causal' if problem.causal else ''} (no configuration of the dispatch table "
                           f"for {gpu} runs this problem){later}"), {}
    return candidates[-1], "the most optimized phase that supports the problem (roadmap order)" + later, {}


def hopper_rule(problem: Problem, kind: str, candidates, gpu: str):
    """The phase of the Hopper rule (:data:`HOPPER_PREFILL`) for ``problem`` among ``candidates``, or None where
    the rule does not apply: not 16-bit prefill, not a GPU of compute capability 9.0 (the simulator is none)."""
    if gpu == "simulator" or kind != "prefill" or problem.dtype not in ("float16", "bfloat16"):
        return None
    from numba_attn.phases.registry import device_cc

    if device_cc() != HOPPER_CC:
        return None
    names = {p.name: p for p in candidates}
    return next((names[n] for n in hopper_order(problem) if n in names), None)


def _tuned_why(problem: Problem, name: str, gpu: str, path: str) -> str:
    """``explain()``'s reason for a tuning cache entry: "tuned (cache PATH)", or for an entry measured on first
    use "measured on first use (cache PATH: PHASE T ms on PROBLEM)"."""
    from numba_attn.measure.tuning_cache import TuningCache

    try:
        entry = TuningCache(path).lookup(gpu, problem, name) or {}
    except (OSError, ValueError):
        entry = {}
    if entry.get("measured") != "first use":
        return f"tuned (cache {path})"
    from numba_attn.measure.autotune import MARGIN

    t = entry.get("time_ms")
    return (f"measured on first use (cache {path}: {name}{f' {t:.4g} ms' if isinstance(t, (int, float)) else ''} "
            f"on {entry.get('label', '?')}, of {entry.get('of', '?')} timed the earliest within {MARGIN:.0%} of the "
            f"fastest; {entry.get('method', '')})")


def tuned_choice(problem: Problem, phase, candidates=None, gpu=None):
    """``(phase, params, cache path)`` from the tuning cache (:mod:`numba_attn.measure.tune`) for
    ``problem`` on this GPU model: of ``phase``, or when None the key's best phase if it is among
    ``candidates``; None when no entry matches or its parameters no longer run the problem."""
    from numba_attn.measure.tune import cached_params

    if getattr(problem, "variant", None) is not None:  # tuned without a variant stage (its registers differ)
        return None
    try:
        hit = cached_params(problem, phase.name if phase is not None else None, gpu or device_name())
        if hit is None:
            return None
        name, params, path = hit
        ph = phase if phase is not None else next((p for p in candidates if p.name == name), None)
        if ph is None or ph.supports(problem, **ph.resolve_params(params)) is not None:
            return None
        return ph, params, path
    except (ValueError, TypeError, OSError):
        return None


def pick_phase(problem: Problem, kind: str | None = None, allow_tf32: bool = False):
    """The phase ``phase=None`` runs (see :func:`choose_phase`)."""
    return choose_phase(problem, kind, allow_tf32)[0]


# -- decode over a paged KV cache, prefill of a packed ragged batch -----------------------------

PAGED_DEFAULT = ("paged_mma", "paged_split_k")  # phase=None: the first that supports the problem ...
PAGED_DEFAULT_ONE_ROW = ("paged_split_k", "paged_mma")  # ... or these when a KV head has one query row
PAGED_DEFAULT_RAGGED = ("paged_worklist", "paged_split_k", "paged_mma")  # ... and its lengths differ (16-bit cache)
PAGED_DEFAULT_MMA8 = ("paged_mma8", "paged_split_k", "paged_mma")  # ... or these for an 8-bit cache paged_mma8 reads


def paged_default(problem) -> tuple:
    """The paged phases ``decode_paged(phase=None)`` tries, in order: the tensor-core one first when a
    KV head serves several query rows (GQA group x q_len > 1: its m16 tile is then partly filled);
    the split-K one first for one row per KV head (the m16 tile would be 15/16 padding; H200, fp16,
    B1 H32 KV 4k ragged P64: 0.0198 ms against 0.0295 ms, results/paged-nvidia-h200.jsonl). ``paged_mma8`` first
    for an 8-bit cache it can read (up to 8 rows per KV head: H200, fp8, B8 H32/8kv KV 32k D128 P64,
    0.1493 ms against paged_mma's 0.3242 ms, results/paged-8bit-mma-nvidia-h200.jsonl). With one row per KV head,
    a 16-bit cache and unequal lengths (``mean_len`` set), the work-list phase comes first: it reads a ragged
    batch 3-6 % faster than the split-K one (H200, CUPTI, B8 H32 D128 P64 fp16: KV <= 4k 0.0690 against 0.0733 ms,
    KV <= 32k 0.4687 against 0.4951, B32 KV <= 4k 0.2967 against 0.3069; the H100 alike,
    results/paged-nvidia-h200.jsonl and results/paged-nvidia-h100.jsonl), and 1.5 % slower at equal lengths,
    where the split-K one stays first."""
    from numba_attn.phases.decode.p41_paged_mma8 import mma8_reason

    if mma8_reason(problem) is None:
        return PAGED_DEFAULT_MMA8
    if (problem.heads // problem.kv_heads) * problem.q_len > 1:
        return PAGED_DEFAULT
    return PAGED_DEFAULT_RAGGED if problem.mean_len and not problem.kv_dtype else PAGED_DEFAULT_ONE_ROW


PAGED_MEAN_STEPS = 16  # a ragged batch's mean length is rounded up to 1/16 of its bucket for the split plan


def paged_mean_bucket(seqlens, bucket: int) -> int:
    """``PagedProblem.mean_len`` of a call: 0 when every sequence has one length (the one-wave
    split plan), else the mean length rounded up to a multiple of ``bucket / PAGED_MEAN_STEPS``
    (the plan is cached per rounded mean: lengths that grow by one per decode step change it
    every ``bucket / 16`` steps; the split count it gives is a power of two, so few kernels compile).
    ``seqlens`` is the host copy the input checks read."""
    if seqlens.size == 0 or seqlens.min() == seqlens.max():
        return 0
    step = max(1, bucket // PAGED_MEAN_STEPS)
    return min(bucket, -(-int(seqlens.sum()) // (seqlens.size * step)) * step)


VARLEN_DEFAULT = ("tc_wgmma_varlen", "tc_mma_varlen")  # phase=None: the first that supports the problem
