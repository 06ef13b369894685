"""Phase 51 — ``ws_intra_bulk_o``: ws_intra_kv's epilogue through shared memory, O copied out a row a bulk copy.

Change against ``ws_intra_kv`` (``o_smem``: :func:`.epilogue.o_store`): a consumer warpgroup divides O by its row
sums and writes it into a staged tile in shared memory (rows padded by 16 bytes, so a quad's eight rows fall on 32
banks) instead of issuing 32 four-byte stores a thread to global memory; after ``fence.proxy.async`` and the
warpgroup's named barrier, its first warp copies the tile out, one ``cp.async.bulk`` a row, and waits only until the
copies have read it. A traced call of ``ws_intra_kv`` (``numba-attn trace``, H200, B8 H32/8kv N1024 D128 bf16) put
its epilogue at 2.26 µs of an item's ~6.9 µs beside its tiles; FlashAttention-3 stages O the same way (by TMA).

Prediction: the epilogue from 2.3 to under 1 µs an item: 1.04-1.07× ``ws_intra_kv`` at B8 H32/8kv N1024 D128 (8 key
tiles an item), 1.01-1.02× at N4096.

Verdict: refuted (H200, bf16 GQA D128): B8 N1024 0.304 ms against ws_intra_kv's 0.287 (0.94×), causal 0.236 against
0.215 (0.91×), B2 N4096 0.913 against 0.899; traced, its epilogue takes 2.7-2.8 µs against 2.2-2.3 (the copies are
issued a lane at a time, and the first warp waits for them to read the tile).
[results/tensor-core-tma-nvidia-h200.jsonl, rows of ws_intra_kv, torch_sdpa_cudnn]
"""
from __future__ import annotations

from numba_attn.gpu.ptx_loads import smem_reason
from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop, resolve_intra
from numba_attn.phases.tensor_core.p47_ws_intra_kv import supports_intra_kv
from numba_attn.phases.tensor_core.pipeline import wgmma_smem_bytes


def supports_bulk_o(problem, warpgroups, Bc, stages, **_):
    """``supports`` of ws_intra_bulk_o: ws_intra_kv's, rows of whole 16-byte chunks, and the staged tiles' room."""
    if problem.head_dim % 8:
        return (f"head_dim {problem.head_dim}: a bulk copy moves whole 16-byte chunks, so O's rows need a head_dim "
                "that is a multiple of 8")
    return supports_intra_kv(problem, warpgroups, Bc, stages) or smem_reason(
        wgmma_smem_bytes(problem.head_dim, Bc, stages, 0, 64 * warpgroups))


@register_phase(
    name="ws_intra_bulk_o", order=51, title="Tensor cores: O staged in shared memory and copied out by bulk copies",
    parent="ws_intra_kv",
    description="""
        ws_intra_kv whose consumers write O, divided by the row sums, into a staged tile in shared memory and
        let the copy engine write it to global memory (one cp.async.bulk a row, issued by the warpgroup's first
        warp), instead of 32 four-byte stores a thread: FlashAttention-3's epilogue.
    """,
    lineage="FlashAttention-3 (Shah et al. 2024): the epilogue through shared memory and TMA",
    planned_speedup=178.0,  # ws_intra_kv's 170 and the predicted ~1.05x on short sequences
    **wgmma_registration(supports_bulk_o, resolve_intra,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 2, "Bc": 16, "stages": 2}),
)
def ws_intra_bulk_o(problem, warpgroups=0, Bc=0, stages=2, uniform=True):
    """ws_intra_kv's kernel with ``o_smem``."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       o_smem=True)
