"""Phase 50 — ``ws_intra_persistent``: ws_intra_kv in persistent blocks, their work items in balanced rounds.

Change against ``ws_intra_kv`` (``blocks``, ``balanced``: :func:`.scheduler.persistent_items`,
:func:`.scheduler.balanced_items`): one block per SM runs work items one after another, the producer carrying the
ring from one to the next, so the next item's first K/V tiles load while the consumers finish this one and no block
starts or ends between items. An item costs 5.2-5.6 µs beside its tiles against cuDNN's 0.6-1.0 (H200); carrying the
ring took ~1 µs of it in ``ws_persistent``, whose every-G-th item leaves a block 1.38× the average work at N1024
causal. Here the items go out in rounds of G, snaked (forward, then backward), over an order the host picks by
simulating the schedule (:func:`.scheduler.balanced_section`: query blocks longest first, a section of heads at a
time whose K/V fit in half the L2): 1.03× the average at N1024 causal, as without a mask.

Prediction: 1.03-1.06× ``ws_intra_kv`` at B8 H32/8kv N1024 D128, causal and not; 1.00-1.02× at N4096 and N8192.

Verdict: refuted short at first (H200, bf16 GQA: B8 N1024 0.86× ws_intra_kv, causal 0.81×), by a 2.9 µs gap between
items that ``numba-attn trace`` showed: the next item found by subtracting a head's items one at a time. With it
found in a few instructions (:func:`.scheduler.divmod_small`): B8 N1024 0.2815 ms against 0.2834 (1.01×), causal
0.2252 against 0.2136 (0.95×), B1 H32 N4096 fp16 0.98×, N8192 causal fp16 0.9910 against 1.0020 (1.01×), GQA 0.97×.
[results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_intra_kv, ws_intra]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.p47_ws_intra_kv import supports_intra_kv


@register_phase(
    name="ws_intra_persistent", order=50,
    title="Tensor cores: persistent blocks whose work items go out in balanced rounds",
    parent="ws_intra_kv",
    description="""
        ws_intra_kv with one block per SM running its work items one after another, the producer's ring
        carried from one to the next (the next item's K/V load during this one's end); the items go out in
        snaked rounds of one per block over the query blocks longest first, so causal blocks end together.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024) and CUTLASS SM90 persistent kernels; LPT order for causal",
    planned_speedup=175.0,  # ws_intra_kv's 170 and the predicted few percent on short sequences
    **wgmma_registration(supports_intra_kv, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
                         launch_params=("blocks",)),  # blocks: the grid (and the order the host picks)
)
def ws_intra_persistent(problem, warpgroups=0, Bc=0, stages=2, uniform=True, blocks=0):
    """ws_intra_kv's kernel in ``blocks`` persistent blocks (0: one per SM), the items in balanced rounds."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       blocks=blocks, balanced=True)
