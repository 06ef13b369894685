"""Phase 26 — ``warp_specialized_tc``: a producer warpgroup with few registers issues the TMA loads; the consumer warpgroups only compute.

Change against ``tma_wgmma`` — the TMA ring, its full/empty mbarriers and the
wgmma loop are the same; what changes is who issues the loads:

* **A producer warpgroup.** The block gets one more warpgroup (warps 0-3)
  before its ``warpgroups`` consumer warpgroups (64 query rows each, 2 by
  default: 384 threads). Its thread 0 runs ahead through every K_j / V_j tile
  of the block: it waits on the stage's "empty" barrier, announces the bytes
  and issues the ``cp.async.bulk.tensor`` loads; its other threads exit. In
  ``tma_wgmma`` the loads were issued by thread 0 of the first consumer
  warpgroup, between its own products, so that warpgroup waited at every
  refill for the slowest one; here no consumer ever waits for another, only
  for data (the full barrier), and the consumers are synchronised with the
  producer by nothing but the mbarriers.
* **Registers move to the consumers.** The producer gives its registers back
  (``setmaxnreg.dec`` to 40 per thread) and the consumers take them
  (``setmaxnreg.inc``: 232 with two consumer warpgroups, 40 + 2·232 ≤ 512
  per-thread registers of the SM's 64K over 128-thread warpgroups), the split
  of FlashAttention-3 (there 24/240); beside three consumers 32 and 160 (its
  split for three). The kernel is compiled with the launch
  bounds of its threads so that ptxas knows the entry budget (168 at 384).
  One consumer warpgroup: no registers are moved (256 threads already have
  255 each).

Head dims, dtypes, causal, GQA, alignment: as ``tma_wgmma`` (one kernel, its
``ws`` option). warpgroups counts the consumers: 3 with 128-key tiles by default at
D=64, 2 at the other head dims up to D=128, 1 above (ptxas gives 384 threads 168 registers each at entry; the consumer
fragments of D > 128 spill unless setmaxnreg is kept, refused); 3 (512
threads, 128 registers each) is refused above D=64.

``uniform`` (off by default: timed, it did not pay here; on in ``ws_overlap``): the warp index is broadcast
from lane 0 (``shfl.sync``), so that ptxas knows it warp-uniform and computes
the wgmma descriptors, the ring stage and parity and the warpgroup's bounds
in the uniform datapath (one ``UIADD3.64`` per wgmma descriptor instead of a
64-bit add in vector registers, two copies and two ``R2UR``): 417 static SASS
instructions a K/V tile instead of 453 at D128 fp16, 377 instead of 393 at
D64, no spills (offline; docs/tensor-core-notes.md, "Uniform warp index").

Prediction (written before measuring): the consumers no longer stall at the
refills and issue no load instructions; with two consumer warpgroups at D=128
(one block of 384 threads per SM, as ``tc_wgmma``'s default of three
computing warpgroups) the tensor cores see one computing warpgroup fewer,
so the gain needs the ping-pong of the next step: ±5% against ``tma_wgmma``
at B1 H32 N4096 D128 fp16 (~0.60–0.66 ms), and the same at D=64.
Whether ptxas honours ``setmaxnreg`` in numba's link step is the first
thing to check on the GPU (the SASS should show ``USETMAXREG``).

Verdict: as predicted at D128, 0.571 ms at B1 H32 N4096 D128 fp16 (H200, CUPTI), 1.04x tma_wgmma, 0.81x SDPA; refuted at D64, 0.445 ms at B4 H32 N2048, 0.82x tma_wgmma (one block per SM); a later run (SDPA the faster of auto and cuDNN in it): 0.521 ms (0.89x SDPA), B2 H16 N8192 causal 1.130 ms (1.00x), B1 H16 N16384 causal 2.138 ms (0.96x), bf16 0.523 ms (0.85x); D64 with Bc=128 0.394 ms (0.82x) [results/tensor-core-tma-nvidia-h200.jsonl]
Verdict (``uniform``, left off): no gain, 0.5697 ms at B1 H32 N4096 D128 fp16, causal B2 H16 N8192 1.1947 ms, D64 B4 H32 N2048 0.4428 ms, against 0.5525, 1.1180 and 0.4533 ms with it off in the same run (1.03x and 1.07x slower, 1.02x faster; the off row of the causal problem had an 11% spread); timed as the out-of-tree copy ws_uniform (experiments/2026-11-23-hopper-tma/uniform_phases.py) (H200, CUPTI) [results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_uniform]
Verdict (128-key tiles, the default at D128 from this run on; out-of-tree copy ws_bc128, experiments/2026-11-23-hopper-tma/d128_phases.py): 2-8 % faster than Bc=64 in one process per problem with SDPA (faster of auto and cuDNN): B1 H32 N4096 D128 fp16 0.5362 against 0.5466 ms (0.87x SDPA), bf16 0.5245 against 0.5420 (0.85x), B1 H16 N16384 fp16 3.965 against 4.309 ms (0.92x), B2 H16 N8192 causal 1.123 against 1.184 ms (0.93x); the prediction was written for the pair with ``uniform`` (0-8 %): 2.8 % at N4096 fp16, its other rows spread 9-18 % and are not read (H200, CUPTI, 3d79620) [results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_bc128]
Verdict (three consumer warpgroups with 128-key tiles, the default at D64 since 0823f82; the producer keeps 32 registers beside them, the consumers 160, the lane index 32-bit: no spill): the fastest D64 setting of eleven timed beside SDPA (experiments/2026-11-26-h200-targets, part c), and 8-13 % faster than tma_wgmma in the same processes: B4 H32 N2048 bf16 0.3247 ms in three processes (0.3172-0.3247; tma_wgmma 0.3510 ms), 0.96x SDPA (the faster of auto and cuDNN, medians); fp16 0.3278 ms (tma_wgmma 0.3538 ms), 0.97x; causal B2 H16 N8192 fp16 0.6901 and 0.6921 ms (tma_wgmma 0.7646 ms), 0.97x; bf16 causal 0.6699 ms, 0.97x; B2 H16 N8192 fp16 1.188 ms (tma_wgmma 1.321 ms), 1.05x. At D128 the same commit: B1 H32 N4096 fp16 0.4862 and 0.4844 ms (0.97x), bf16 0.4766 and 0.4826 ms (0.94x), causal B2 H16 N8192 1.092 ms (0.95x; 1.029 ms and 1.02x the day before, edaa51f, a 13 % spread on the new row) (H200, CUPTI) [results/tensor-core-tma-nvidia-h200.jsonl, rows of tma_wgmma]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma, supports_wgmma
from numba_attn.phases.tensor_core.producer import tma_smem_reason

MAX_CONSUMERS = 3  # consumer warpgroups: with the producer at most 512 threads


def resolve_warp_specialized(problem, warpgroups, Bc, stages, **_):
    """warpgroups=0: three consumer warpgroups at D=64, two (FlashAttention-3's split) at the other head dims up
    to D=128, one above (384 threads have 168 registers each at entry). Bc=0: 128-key tiles at D=64 and D=128
    where the ring of ``stages`` fits, else 64. Measured (H200): at D=128 128-key tiles are 2-8 % faster than 64
    (fp16 and bf16, N 4k-16k, causal or not); at D=64 three consumers with 128-key tiles were the fastest of
    eleven settings of the wgmma phases, 8-13 % faster than ``tma_wgmma`` (with two consumers 128-key tiles were
    slower, 0.394 against 0.365 ms)."""
    if warpgroups < 0:
        raise ValueError("warpgroups (consumer warpgroups per block) must be at least 1 (0: by head_dim)")
    if Bc < 0:
        raise ValueError("Bc (keys per K/V tile) must be positive (0: by head_dim)")
    D = problem.head_dim
    if not Bc:
        Bc = 128 if D in (64, 128) and tma_smem_reason(problem, 128, stages) is None else 64
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
    return (supports_wgmma(problem, warpgroups, Bc, stages, min_stages=2)
            or tma_smem_reason(problem, Bc, stages))


@register_phase(
    name="warp_specialized_tc", order=26,
    title="Tensor cores: a producer warpgroup issues TMA, consumer warpgroups compute (setmaxnreg)",
    parent="tma_wgmma",
    requires_cc="sm_90a",
    description="""
        tma_wgmma with warp specialisation: one extra producer warpgroup (setmaxnreg.dec to
        40 registers) whose thread 0 issues every TMA load of the block, waiting only on the
        empty mbarriers; the consumer warpgroups (setmaxnreg.inc) wait only on the full
        mbarriers and compute. No block barrier after the barriers' initialisation.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 warp-specialized kernels: "
            "producer/consumer warpgroups, setmaxnreg",
    planned_speedup=160.0,
    space={"warpgroups": [1, 2, 3], "Bc": [64, 128], "stages": [2, 3, 4], "uniform": [False, True]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 1, "Bc": 16, "stages": 2},
    supports=supports_warp_specialized,
    resolve=resolve_warp_specialized,
)
def warp_specialized_tc(problem, warpgroups=0, Bc=0, stages=2, uniform=False):
    """tma_wgmma's kernel with ``ws=True``; ``uniform``: the warp index made known warp-uniform, so
    that ptxas builds the wgmma descriptors and the ring counters in the uniform datapath (off by
    default until timed on a GPU; docs/tensor-core-notes.md, "Uniform warp index"). The producer warpgroup:
    :func:`.producer.ws_producer` and its register split (``ws_producer_regs``, ``ws_consumer_regs``)."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="ws", uniform=uniform)
