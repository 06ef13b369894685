"""Phase 26 — ``warp_specialized_tc``: a producer warpgroup issues the TMA loads; the consumers only compute.

Change against ``tma_wgmma``: one more warpgroup per block, the producer (:func:`.producer.ws_producer`): it
gives its registers back (``setmaxnreg.dec`` to 40) and its thread 0 loads every tile of the block, waiting only
on the empty barriers; the consumer warpgroups take the registers (``setmaxnreg.inc``: 232 beside two) and
wait only for data. ``uniform``: the warp index known warp-uniform to ptxas (off: timed, it did not pay here).

Prediction: ±5% against ``tma_wgmma`` at B1 H32 N4096 D128 fp16 (~0.60–0.66 ms), the same at D=64.

Verdict: 0.486 ms at B1 H32 N4096 D128 fp16 (0.97x SDPA, H200); D64 0.328 ms, 8-13 % faster than tma_wgmma.
[results/tensor-core-tma-nvidia-h200.jsonl, rows of tma_wgmma]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import WS_SPACE, build_wgmma, supports_tma, wgmma_registration
from numba_attn.phases.tensor_core.producer import tma_smem_reason

MAX_CONSUMERS = 3  # consumer warpgroups: with the producer at most 512 threads


def resolve_warp_specialized(problem, warpgroups, Bc, stages, **_):
    """warpgroups=0: three consumer warpgroups at D=64, two (FlashAttention-3's split) at the other head dims up
    to D=128, one above (384 threads have 168 registers each at entry). Bc=0: 128-key tiles at D=64 and D=128
    where the ring of ``stages`` fits, else 64. Measured (H200): at D=128 128-key tiles are 2-8 % faster than 64
    (fp16 and bf16, N 4k-16k, causal or not); at D=64 three consumers with 128-key tiles were the fastest of
    eleven settings of the wgmma phases, 8-13 % faster than ``tma_wgmma`` (with two consumers 128-key tiles were
    slower, 0.394 against 0.365 ms). With a score function Bc=0 is 64 (128-key tiles spill: 84-536 bytes,
    offline sm_90a); a mask-only variant keeps 128 at D=128 (H200: all-FULL mask 0.53 against 0.64 ms,
    window 0.41 against 0.45; a sliding window spills 16 bytes there) and takes 64 at D=64 (40 bytes)."""
    if warpgroups < 0:
        raise ValueError("warpgroups (consumer warpgroups per block) must be at least 1 (0: by head_dim)")
    if Bc < 0:
        raise ValueError("Bc (keys per K/V tile) must be positive (0: by head_dim)")
    D = problem.head_dim
    if not Bc:
        variant = getattr(problem, "variant", None)
        wide = variant is None or (D == 128 and variant.score is None)  # (a score function spills at 128)
        Bc = 128 if D in (64, 128) and wide and tma_smem_reason(problem, 128, stages) is None else 64
    return {"warpgroups": warpgroups or (3 if D == 64 else 2 if D <= 128 else 1), "Bc": Bc, "stages": stages}


def supports_warp_specialized(problem, warpgroups, Bc, stages, **_):
    if warpgroups > MAX_CONSUMERS:
        return (f"warpgroups={warpgroups}: at most {MAX_CONSUMERS} consumer warpgroups (with the producer "
                f"{128 * (MAX_CONSUMERS + 1)} threads per block)")
    if warpgroups == 3 and problem.head_dim > 64:
        return (f"warpgroups=3 at head_dim {problem.head_dim}: 512 threads have 128 registers each at entry, "
                "too few above D=64; use warpgroups ≤ 2")
    if warpgroups == 2 and problem.head_dim > 128:
        return (f"warpgroups=2 at head_dim {problem.head_dim}: 384 threads have 168 registers each at entry "
                "(more only if the link keeps setmaxnreg), the fragments spill above D=128; use warpgroups=1")
    return supports_tma(problem, warpgroups, Bc, stages)


@register_phase(
    name="warp_specialized_tc", order=26,
    title="Tensor cores: a producer warpgroup issues TMA, consumer warpgroups compute (setmaxnreg)",
    parent="tma_wgmma",
    description="""
        tma_wgmma with warp specialisation: one extra producer warpgroup (setmaxnreg.dec to
        40 registers) whose thread 0 issues every TMA load of the block, waiting only on the
        empty mbarriers; the consumer warpgroups (setmaxnreg.inc) wait only on the full
        mbarriers and compute. No block barrier after the barriers' initialisation.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 warp-specialized kernels: "
            "producer/consumer warpgroups, setmaxnreg",
    planned_speedup=160.0,
    **wgmma_registration(supports_warp_specialized, resolve_warp_specialized, WS_SPACE),
)
def warp_specialized_tc(problem, warpgroups=0, Bc=0, stages=2, uniform=False, lazy_rescale=False):
    """tma_wgmma's kernel with ``ws=True``; ``uniform``: the warp index made known warp-uniform, so
    that ptxas builds the wgmma descriptors and the ring counters in the uniform datapath (off by
    default until timed on a GPU; docs/tensor-core-notes.md, "Uniform warp index"); ``lazy_rescale``:
    FlashAttention-4's conditional rescale of O (the running max moves only by more than 2^8; off: measured
    0.98-1.01× on an H100, experiments/2026-11-28-lazy-rescale).
    The producer warpgroup: :func:`.producer.ws_producer` and its register split (``ws_producer_regs``,
    ``ws_consumer_regs``)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="ws", uniform=uniform,
                       lazy_rescale=lazy_rescale)
