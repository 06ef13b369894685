"""One peer's row, whichever library it comes from: PyTorch SDPA's backends (:mod:`numba_attn.measure.peers`), or
FlashAttention-4's and FlexAttention's (:mod:`numba_attn.measure.other_peers`, which builds on the SDPA peers'
inputs, checks and timing)."""
from __future__ import annotations

from numba_attn.measure.other_peers import measure_other_peer
from numba_attn.measure.peers import OTHER_BACKWARD_PEERS, OTHER_PEERS, measure_sdpa_peer
from numba_attn.spec.problem import Problem


def measure_peer(name: str, problem: Problem, cfg) -> dict:
    """The row of peer ``name`` on ``problem`` under the run configuration ``cfg``: checked against float64, then
    timed as the phases are (or SKIP/ERROR with the reason)."""
    if name in OTHER_PEERS + OTHER_BACKWARD_PEERS:
        return measure_other_peer(name, problem, cfg)
    return measure_sdpa_peer(name, problem, cfg)
