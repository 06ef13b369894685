"""What the backward phases share: the launch of a backward phase, the causal bounds, the reasons a problem is
refused.

A backward launch runs ``run(q, k, v, o, lse, do, dq, dk, dv, stream=0)`` on device arrays: q, o, do, dq
(B·H, Nq, D); k, v, dk, dv (B·Hkv, Nk, D); lse (B·H, Nq) float32 in natural-log units. dq, dk, dv have the
inputs' dtype; every sum is accumulated in float32. Causal masking is bottom-right aligned: query row i sees
key j when j <= i + Nk - Nq.
"""
from __future__ import annotations

import functools

from numba import cuda, float32

from numba_attn.gpu.jit import device, kernel
from numba_attn.gpu.ptx_loads import STATIC_SMEM_LIMIT
from numba_attn.phases.registry import Launch
from numba_attn.spec.errors import AttentionInputError
from numba_attn.variants.blockmask import device_arrays

SCORE_MOD_REFUSED = ("a score_mod without its derivative: pass score_mod_grad=, a function (score, b, h, q_idx, "
                     "kv_idx, *aux) -> d score_mod / d score (the built-ins softcap and alibi carry theirs)")


def variant_reason(problem) -> str | None:
    """Why a backward phase refuses ``problem``'s variant: a score function without its derivative."""
    variant = getattr(problem, "variant", None)
    if variant is not None and variant.score is not None and variant.score.derivative is None:
        return SCORE_MOD_REFUSED
    return None


@device
def one(s, b, h, q_idx, kv_idx, mods):
    """The derivative of no score function."""
    return float32(1.0)


def score_grad_stage(problem):
    """``dmod(s, b, h, q_idx, kv_idx, mods)``: the derivative of the problem's score function at the scaled
    score s (its arrays after the mask's in ``mods``); 1 without a score function."""
    from numba_attn.variants.mods import python_function, score_stage

    variant = getattr(problem, "variant", None)
    if variant is None or variant.score is None:
        return one
    score = variant.score
    return score_stage((python_function(score.derivative), len(score.aux)),
                       len(variant.mask.aux) if variant.mask else 0)


def mask_stage(problem):
    """The variant stage of a backward kernel: the mask function on every score (no block mask; PLAIN for plain
    attention), ``stage.visible(b, h, q_idx, kv_idx, mods)`` with q_idx = i + Nk − Nq (bottom-right), and the
    score function ``stage.modified(s, b, h, q_idx, kv_idx, mods)`` (``stage.scored``: there is one)."""
    from numba_attn.variants.stages import stages_of

    return stages_of(getattr(problem, "variant", None), listed=False)


def tiled_mask_stage(problem):
    """:func:`mask_stage` with the block mask: ``stage.tile_kind(mods, b, h, qt, kt)`` of the kernels' (Br, Bc)
    tiles (EMPTY: skipped, FULL: no mask function), the mask's (kinds, counts, indices) last in ``mods``
    (:class:`~numba_attn.variants.launching.KernelMods`)."""
    from numba_attn.variants.stages import stages_of

    return stages_of(getattr(problem, "variant", None))


def backward_launch(name: str, run, kernels, workspace_bytes: int = 0, host_aux: bool = False) -> Launch:
    """The :class:`Launch` of backward phase ``name``: ``run(q, k, v, o, lse, do, dq, dk, dv, stream=0, mods=())``
    (``mods``: a variant's arrays, as the call gives them: host arrays, tensors or device arrays; on the device
    unless ``host_aux``, where ``run`` hands them to its :class:`~numba_attn.variants.launching.KernelMods`, which
    keeps their block mask while the same arrays come back); a forward call (q, k, v, o) is refused naming the call
    that runs it."""

    def call(q, k, v, o, *grads, stream=0, mods=()):
        if len(grads) == 6:  # the stream given by position
            *grads, stream = grads
        if len(grads) != 5:  # (q, k, v, o[, stream]): a forward caller
            raise AttentionInputError(f"phase {name!r} computes gradients: numba_attn.attention_backward(q, k, v, "
                                      f"o, lse, do, phase={name!r}) runs it, attention() does not")
        mods = () if mods is None else tuple(mods)
        run(q, k, v, o, *grads, stream, mods if host_aux or not mods else device_arrays(mods, stream))

    return Launch(call, kernels=list(kernels), workspace_bytes=workspace_bytes, replayable=False)


def run_backward_launch(launch, inputs, grads, stream=0, mods=()):
    """Run a backward phase's launch on device arrays ``inputs`` = (q, k, v, o, lse, do) of shapes (B, H, Nq, D),
    (B, Hkv, Nk, D) twice, q's, (B, H, Nq), q's, writing ``grads`` = (dq, dk, dv): the kernels see rows
    (B·H, Nq, D), (B·Hkv, Nk, D) and lse (B·H, Nq)."""
    q, k, v, o, lse, do = inputs
    B, H, Nq, D = map(int, q.shape)
    Hkv, Nk = int(k.shape[1]), int(k.shape[2])
    rows_q, rows_kv = (B * H, Nq, D), (B * Hkv, Nk, D)
    launch.run(q.reshape(rows_q), k.reshape(rows_kv), v.reshape(rows_kv), o.reshape(rows_q),
               lse.reshape((B * H, Nq)), do.reshape(rows_q),
               grads[0].reshape(rows_q), grads[1].reshape(rows_kv), grads[2].reshape(rows_kv),
               stream=stream, mods=mods)


def refuse(problem, smem_bytes: int = 0) -> str | None:
    """Why a backward phase cannot run ``problem`` with tiles of ``smem_bytes``: over the static shared memory."""
    if smem_bytes > STATIC_SMEM_LIMIT:
        return (f"its shared-memory tiles take {smem_bytes} bytes at head_dim {problem.head_dim}, over the "
                f"{STATIC_SMEM_LIMIT} of a static allocation: choose smaller tiles")
    return None


@device
def kv_head(bh, H, G):
    """The KV head (batch·Hkv index) that query (batch, head) ``bh`` reads: G query heads share one."""
    return (bh // H) * (H // G) + (bh % H) // G


@device
def keys_of_row(i, Nq, Nk, causal):
    """How many keys (0 .. n-1) query row ``i`` sees."""
    if causal:
        return max(0, min(Nk, i + Nk - Nq + 1))
    return Nk


@device
def first_row_of_key(j, Nq, Nk, causal):
    """The first query row that sees key ``j`` (rows before it see none of it)."""
    if causal:
        return max(0, j - (Nk - Nq))
    return 0


@device
def first_q_head(kvh, H, G):
    """The first of the G query heads (batch·H index) that read KV head ``kvh`` (batch·Hkv index)."""
    Hkv = H // G
    return (kvh // Hkv) * H + (kvh % Hkv) * G


@device
def first_q_tile(j, Nq, Nk, causal, Br):
    """The first row of the Br-row Q tile that holds the first query row seeing key ``j`` (causal: tiles before
    it see none of it)."""
    return (first_row_of_key(j, Nq, Nk, causal) // Br) * Br


@functools.cache
def make_q_tile_load(D: int, Br: int, THREADS: int):
    """``load_q_tile(q, do, lse, dl, Q_i, dO_i, lse_i, Delta_i, bh, i0, Nq, tid)``: the Br-row tiles of Q, dO
    (Br × D), lse and Delta of head ``bh`` from row ``i0`` into float32 arrays, zeros past Nq, by THREADS threads."""

    @device
    def load_q_tile(q, do, lse, dl, Q_i, dO_i, lse_i, Delta_i, bh, i0, Nq, tid):
        """Q_i, dO_i, lse_i, Delta_i of rows i0 .. i0 + Br of head bh (zeros past Nq)."""
        for e in range(tid, Br * D, THREADS):
            r, c = e // D, e % D
            row_ok = i0 + r < Nq
            Q_i[r, c] = float32(q[bh, i0 + r, c]) if row_ok else float32(0.0)
            dO_i[r, c] = float32(do[bh, i0 + r, c]) if row_ok else float32(0.0)
        for r in range(tid, Br, THREADS):
            row_ok = i0 + r < Nq
            lse_i[r] = lse[bh, i0 + r] if row_ok else float32(0.0)
            Delta_i[r] = dl[bh, i0 + r] if row_ok else float32(0.0)

    return load_q_tile


@device
def element():
    """(column, row, z): the element a thread of a 2-D block over a 3-D grid computes."""
    return (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y,
            cuda.blockIdx.z)


@functools.cache
def make_delta(D: int, ROWS: int):
    """The preprocess kernel ``delta(o, do, dl, Nq)``, launched on (⌈Nq/ROWS⌉, B·H) blocks of ROWS threads."""

    @kernel
    def delta(o, do, dl, Nq):
        """Delta_i = Σ_d dO_id · O_id (= Σ_j P_ij dP_ij), one thread per query row."""
        i = cuda.blockIdx.x * ROWS + cuda.threadIdx.x
        bh = cuda.blockIdx.y
        if i < Nq:
            acc = float32(0.0)
            for d in range(D):
                acc += float32(o[bh, i, d]) * float32(do[bh, i, d])
            dl[bh, i] = acc

    return delta
