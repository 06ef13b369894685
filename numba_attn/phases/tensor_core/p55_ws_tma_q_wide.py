"""Phase 55 — ``ws_tma_q_wide``: ws_tma_q_early at D64 with three consumers on 128-key tiles.

Change against ``ws_tma_q_early`` (``resolve_warp_specialized``'s D64 tile, now that Q is out of the registers): at
D64 the intra-overlapped loop ran three consumer warpgroups on 64-key tiles, since with Q in registers S, the held
P, O and Q spilled 116 bytes at 128 keys (``ws_intra``'s refusal); ``warp_specialized_tc``, the plain loop, runs
three consumers on 128-key tiles and was the fastest D64 phase (``ws_tma_q`` 0.94× it). With Q's tiles brought by
the producer a consumer holds S (64 registers), the held P (32) and O (32) in its 160: 0 bytes spilled (offline,
sm_90a, causal and not). Only D64 and below; a variant keeps 64-key tiles (a mask's 128-key tile spilled 40 bytes
in ``warp_specialized_tc``).

Prediction: 1.06-1.10× ``ws_tma_q_early``'s D64 tile and 1.00-1.05× ``warp_specialized_tc`` at B4 H32 N2048 D64
fp16 (half the tiles an item, each softmax under its P·V); level at B16 H16 N512.

Verdict: confirmed, above it (H200): B4 H32 N2048 D64 fp16 0.2970 ms against warp_specialized_tc's 0.3225 and
ws_tma_q_early's 0.3418 (1.09×, 1.15×; 0.99× cuDNN), bf16 causal 1.10×, B2 H16 N8192 causal 1.06×, B16 H16 N512
0.0553 against tma_wgmma's 0.0580 (1.05×, 0.84× cuDNN); with two consumers there (``resolve_wide``) 0.0535 ms,
0.87× cuDNN (experiments/2026-11-29-short). [results/tensor-core-tma-nvidia-h200.jsonl]
"""
from __future__ import annotations

from numba_attn.phases.registry import register_phase
from numba_attn.phases.tensor_core.kernel import build_wgmma, wgmma_registration
from numba_attn.phases.tensor_core.p26_warp_specialized_tc import resolve_warp_specialized
from numba_attn.phases.tensor_core.p46_ws_intra import intra_mainloop
from numba_attn.phases.tensor_core.p52_ws_tma_q import supports_tma_q
from numba_attn.phases.tensor_core.pipeline import wgmma_smem_bytes
from numba_attn.phases.tensor_core.producer import smem_reason

MAX_HEAD_DIM = 64  # three consumers (512 threads) only up to D64; above it the kernel is ws_tma_q_early's


def resolve_wide(problem, warpgroups, Bc, stages, **kw):
    """``resolve_warp_specialized``'s tile, except where 192-row blocks would leave a sixteenth of the query rows
    empty: there two consumers (128-row blocks) instead of three. Measured (H200, B16 H16 N512 D64 fp16, where 192-row
    blocks leave 64 of 576 rows empty): 53.5 µs with two consumers against 55.6 with three (cuDNN 46.6, 46.5); at
    N2048 (3 % empty) three are faster (``warp_specialized_tc``'s measurement)."""
    tile = resolve_warp_specialized(problem, warpgroups, Bc, stages, **kw)
    if not warpgroups and tile["warpgroups"] == 3:
        empty = {wg: -problem.q_len % (64 * wg) for wg in (2, 3)}  # padded query rows of the last block
        if empty[3] - empty[2] > problem.q_len / 16:
            tile["warpgroups"] = 2
    return tile


def supports_wide(problem, warpgroups, Bc, stages, **kw):
    """ws_tma_q_early's, up to D64, with 128-key tiles for three consumers (plain attention)."""
    if problem.head_dim > MAX_HEAD_DIM:
        return (f"head_dim {problem.head_dim}: three consumers' tile, only up to D{MAX_HEAD_DIM}; above it this "
                "kernel is ws_tma_q_early's")
    wide = warpgroups == 3 and Bc > 64
    if wide and getattr(problem, "variant", None) is not None:
        return (f"Bc={Bc} with three consumers and a variant: not checked free of spills (warp_specialized_tc's "
                "mask at 128 keys spilled 40 bytes at D64); use Bc=64")
    # (three consumers' S, held P and O at 128 keys: Q out of the registers, 0 bytes spilled at D64, sm_90a)
    return supports_tma_q(problem, warpgroups, 64 if wide else Bc, stages, **kw) or smem_reason(
        wgmma_smem_bytes(problem.head_dim, Bc, stages, 64 * warpgroups) + 32 * stages + 16)


@register_phase(
    name="ws_tma_q_wide", order=55, title="Tensor cores: three consumers on 128-key tiles at D64, Q out of registers",
    parent="ws_tma_q_early",
    description="""
        ws_tma_q_early at head_dim 64 with warp_specialized_tc's tile: three consumer warpgroups on
        128-key tiles, which the intra-overlapped loop could not hold while Q sat in its registers.
    """,
    lineage="FlashAttention-3's D64 configuration (three consumer warpgroups, 128-key tiles; Shah et al. 2024)",
    planned_speedup=195.0,  # ws_tma_q_early's 190 and the predicted few percent at D64
    **wgmma_registration(supports_wide, resolve_wide,
                         {"warpgroups": [2, 3], "Bc": [64, 128], "stages": [2, 3], "uniform": [False, True]},
                         {"warpgroups": 1, "Bc": 16, "stages": 2, "blocks": 2},
                         launch_params=("blocks",)),
)
def ws_tma_q_wide(problem, warpgroups=0, Bc=0, stages=2, uniform=True, blocks=0):
    """ws_tma_q_early's kernel with warp_specialized_tc's choice of consumers and tile."""
    return build_wgmma(problem, warpgroups, Bc, stages, intra_mainloop, loads="ws", uniform=uniform, split_kv=True,
                       blocks=blocks, balanced=True, q_tma=True, o_rows=True, q_early=True)
