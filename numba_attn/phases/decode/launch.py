"""The host side of a split-K decode launch: the workspace (partial outputs, log-sum-exps, counters), the
launch of a split kernel and its combine."""
from __future__ import annotations

import numpy as np
from numba import cuda

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.gpu.split_k import make_combine_kernel, make_combine_lse_kernel
from numba_attn.gpu.warp import WARP_SIZE
from numba_attn.phases.decode.rules import check_alignment, kernel_words, split_layout
from numba_attn.phases.registry import Launch
from numba_attn.variants.launching import KernelMods
from numba_attn.variants.spans import SpanMods
from numba_attn.variants.sinks import wants_lse, with_lse


SPLIT_SIM = {"warps": 2, "splits": 3}  # the split-K decode phases' simulator parameters


def split_registration(supports, resolve, space, sim_params=None, layout="contiguous", launch_params=("splits",),
                       **more):
    """The ``register_phase`` keywords the split-K decode phases share (the split count a launch argument: its
    candidates mostly share kernels; mask/score variants; the log-sum-exp on request) with a phase's own
    ``supports``, ``resolve``, ``space``, simulator parameters and cache ``layout``."""
    return dict(space=space, launch_params=launch_params, sim_params=sim_params or SPLIT_SIM, variants=True, lse=True,
                supports=supports, resolve=resolve, layout=layout, **more)


def split_workspace(S: int, rows: int, D: int):
    """(part_o, part_lse): every split's normalized partial output and log-sum-exp
    per query row (float32); a 1-element stand-in when S = 1 writes the output."""
    if S == 1:
        return cuda.device_array((1, 1, 1), dtype="float32"), cuda.device_array((1, 1), dtype="float32")
    return cuda.device_array((S, rows, D), dtype="float32"), cuda.device_array((S, rows), dtype="float32")


def zeroed_counters(n: int):
    """``n`` int32 zeros on the device: the per-tile split counters of a last-block combine.
    On a GPU they are zeroed by a memset, which does not wait for the device (a copy from the host
    would: every new plan, e.g. each decode step's new kv_len, would drain the queue)."""
    counters = cuda.device_array(n, dtype=np.int32)
    if isinstance(counters, np.ndarray):  # host stand-in (offline compilation)
        counters[:] = 0
    elif IS_SIMULATOR:
        counters.copy_to_device(np.zeros(n, np.int32))
    else:
        from numba.cuda.cudadrv import driver

        driver.device_memset(counters, 0, counters.nbytes)
    return counters


def variant_mods(problem) -> KernelMods:
    """The kernels' ``mods`` of a decode launch (``kernel_mods(stream=...)``: ``()`` without a variant): the
    variant's arrays, then for a contiguous cache with a mask function the key span each KV head's query rows see
    (:class:`~numba_attn.variants.spans.SpanMods`; the split-K kernels divide it among their splits); every
    kernel tests the mask per key it loads."""
    if getattr(problem, "page_size", 0):  # a ragged batch's sequences end at their own lengths: no common span
        return KernelMods(problem, None, None)
    return SpanMods(problem)


def launch_mods(kernel_mods: KernelMods) -> dict:
    """The :class:`Launch` fields of a launch with a variant: its ``kernel_mods`` (a call's own arrays reach the
    kernels), not replayed at new addresses; nothing without one."""
    if kernel_mods.variant is None:
        return {}
    return {"kernel_mods": kernel_mods, "replayable": False}


def combine_kernel(problem, Nq: int, BF16: bool):
    """The combine kernel of a split launch: ``combine(part_o, part_lse, o, S)``, or for a problem that asks for the
    log-sum-exp ``combine(part_o, part_lse, o, S, lse)`` (:func:`~numba_attn.gpu.split_k.make_combine_lse_kernel`)."""
    if wants_lse(problem):
        return make_combine_lse_kernel(Nq, BF16=BF16)
    return make_combine_kernel(Nq, BF16=BF16) if BF16 else make_combine_kernel(Nq)


def combine_args(part_o, part_lse, o, S, lse):
    """The combine kernel's arguments (``lse`` None: a plain call's)."""
    return (part_o, part_lse, o, S) if lse is None else (part_o, part_lse, o, S, lse)


def tile_notes(lanes, keys, rows, warps) -> str:
    """The ``Launch.notes`` of a warp-step decode kernel's tiling."""
    return f"L={lanes} lanes/key, T={keys} keys/group, {rows} rows/block, {warps} warps"


def split_launch(problem, kern, scale, warps, lanes, rows, keys, splits, counters, combine, notes=""):
    """The :class:`Launch` of a split-K kernel: grid (split, row block of a KV head),
    the workspace, with ``counters`` the kernel's per-tile counters (and split
    count) as arguments, with ``combine`` the combine kernel after it (unless one
    split writes the output); the variant's ``mods`` last (``run(..., lse=)``: the (B·H, Nq) log-sum-exp
    array last in them, written by the kernel or the combine)."""
    B, H, Hkv, Nq, Nk, D = (problem.batch, problem.heads, problem.kv_heads, problem.q_len,
                            problem.kv_len, problem.head_dim)
    S = splits
    n_rc, chunk = split_layout(problem, warps, rows, lanes, keys, S)
    final = S == 1
    grid = (S, B * Hkv * n_rc)
    part_o, part_lse = split_workspace(S, B * H * Nq, D)
    kernels = [kern]
    combine = combine and not final
    bf16 = problem.dtype == "bfloat16"
    if combine:
        comb = combine_kernel(problem, Nq, bf16)
        kernels.append(comb)
    cnt = zeroed_counters(B * Hkv * n_rc) if counters else None
    kernel_mods = variant_mods(problem)

    def run(q, k, v, o, stream=0, mods=None, lse=None):
        if bf16:
            k, v = kernel_words(problem, k, v)
        check_alignment(k, v)
        mods = with_lse(kernel_mods(stream=stream) if mods is None else mods, lse)
        if counters:
            kern[grid, warps * WARP_SIZE, stream](q, k, v, o, part_o, part_lse, cnt, scale, Hkv, Nk, chunk, S, mods)
        else:
            kern[grid, warps * WARP_SIZE, stream](q, k, v, o, part_o, part_lse, scale, Hkv, Nk, chunk, mods)
        if combine:
            comb[B * H * Nq, D, stream](*combine_args(part_o, part_lse, o, S, lse))

    return Launch(run, kernels=kernels, workspace_bytes=0 if final else part_o.nbytes + part_lse.nbytes,
                  notes=f"S={S} splits of {chunk} keys, {tile_notes(lanes, keys, rows, warps)}{notes}",
                  **launch_mods(kernel_mods))
