"""Phase 40 — ``ws_persistent``: the warp-specialised kernel with one persistent block per SM, the producer loading the next work item's tiles while the consumers finish this one.

Change against ``warp_specialized_tc``: the grid is no longer one block per
work item (a block of query rows of one head and batch) but one block per
SM, and each block runs its items one after another (item ``blockIdx.x``,
then every ``gridDim.x``-th; query blocks counted from the last, so that
with ``causal`` the longest items go first):

* **The ring goes on across items.** The producer walks the same items as
  the consumers and carries its ring stage and mbarrier phase parity from
  one item to the next: the next item's first K/V tiles are in flight
  while the consumers compute the last tiles of this one and store its O.
  In ``warp_specialized_tc`` every item pays, one after another on its SM,
  a block's retirement and launch, the barriers' initialisation and the
  first tiles' load latency, with the tensor cores idle.
* The consumers carry their stage and parity too; nothing else changes in
  their loop.

Everything else (head dims, dtypes, causal, GQA, the register split) is
``warp_specialized_tc``'s: one kernel, its ``persistent`` option
(``make_wgmma_kernel``), except the D=64 default: two consumer warpgroups
with 64-key tiles, where the parent now takes three with 128-key tiles
(persistent, they spill 56 bytes causal). ``blocks``: the grid (0: one block per SM, never
more blocks than items).

Prediction (written before measuring): the hidden prologue is worth most
where an item is short. At B1 H32 N4096 D128 fp16 (1024 items of 32 tiles
of 128 keys, ~65 µs each) 2-5 % faster than ``warp_specialized_tc`` in the
same process (0.87x SDPA → 0.89-0.91x); at B1 H16 N16384 0-2 %; at D64 B4 H32
N2048 (items of ~22 µs) 4-10 %; causal within ±3 % (a static round-robin of
unequal items against the hidden prologue).

Verdict: refuted at D128, no gain: under Nsight Compute at boost clocks (its clock control off; SM clock 1.76-1.77 GHz) 491-492 µs at B1 H32 N4096 D128 fp16 against warp_specialized_tc's 493 µs (one block per item, wsp_all: 500-501 µs), and 603 µs against 604 µs at its locked base clock; the runner's CUPTI rows (517-540 µs against the parent's 485-562 µs in three processes) cannot resolve it: the parent's own two rows in one process were 16 % apart, the GPU at its 700 W power limit with the SM clock between 1545 and 1980 MHz (H100, ca450db-a68ea81); at N16384 4.184 against 3.836 ms and causal N8192 1.198 against 1.028 ms, one row each. D64 (B4 H32 N2048): the same time with two consumers (446.1 against 446.3 µs) and three (367.4 against 367.2 µs, variant wsp3), bf16 1-3 % faster; causal B2 H16 N8192 8 % faster with two consumers (849.6 against 920.9 µs) and 17 % slower with three (873.4 against 747.3 µs) (H100, CUPTI, d2aa82b) [results/tensor-core-tma-nvidia-h100.jsonl, rows of warp_specialized_tc, ws3, wsp3]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.consumer import plain_mainloop
from numba_attn.phases.tensor_core.kernel import build_wgmma
from numba_attn.phases.tensor_core.p26_warp_specialized_tc import resolve_warp_specialized, supports_warp_specialized


def resolve_persistent(problem, warpgroups, Bc, stages, **_):
    """As ``warp_specialized_tc``'s, but at D=64 two consumer warpgroups with 64-key tiles (its default there
    until three consumers with 128-key tiles became the parent's: here they spill 56 bytes causal, and three
    consumers were 17 % slower causal on the H100)."""
    if problem.head_dim == 64:
        warpgroups, Bc = warpgroups or 2, Bc or 64
    return resolve_warp_specialized(problem, warpgroups, Bc, stages)


@register_phase(
    name="ws_persistent", order=40,
    title="Tensor cores: warp specialisation in persistent blocks, the next item's tiles loaded during this one's end",
    parent="warp_specialized_tc",
    requires_cc="sm_90a",
    description="""
        warp_specialized_tc with one block per SM that runs its work items (query blocks of a
        head and batch) one after another; the producer carries the TMA ring across items, so
        the next item's first K/V tiles load while the consumers finish this one and store O.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 persistent kernels with a static tile scheduler",
    planned_speedup=165.0,  # warp_specialized_tc's 160 and the predicted +2-5 % at D128
    space={"warpgroups": [1, 2, 3], "Bc": [64, 128], "stages": [2, 3, 4], "uniform": [False, True]},
    dtypes=("float16", "bfloat16"),
    head_dims=None,
    sim_params={"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
    supports=supports_warp_specialized,
    resolve=resolve_persistent,
    launch_params=("blocks",),  # the grid only: its candidates share the kernel
)
def ws_persistent(problem, warpgroups=0, Bc=0, stages=2, uniform=False, blocks=0):
    """warp_specialized_tc's kernel in ``blocks`` persistent blocks (0: one per SM), each walking its work items
    (:func:`.scheduler.first_item`, :func:`.scheduler.next_item`) with the ring state carried across them."""
    return build_wgmma(problem, warpgroups, Bc, stages, plain_mainloop, loads="ws", uniform=uniform, blocks=blocks)
