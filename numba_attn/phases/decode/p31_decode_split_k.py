"""Phase 31 — ``decode_split_k``: flash-decoding, the KV range split across blocks.

Change against ``decode_chunked``: that kernel launches ``batch × kv_heads``
blocks, 32 for one sequence of 32 heads — a quarter of the 132 SMs of an
H100/H200, and an SM alone cannot pull much of the chip's bandwidth. Here the
KV range of each (sequence, KV head) is split into ``S`` chunks, one block
each, so that even B=1 launches several blocks per SM:

* ``S = floor(SMs × blocks_per_sm / (batch × kv_heads × row_blocks))`` (all
  blocks resident at once: no partial second wave), at most
  ``ceil(kv_len / min_keys)`` so that no block gets too little work;
  ``S = 1`` (large batches) writes the output as ``decode_chunked`` does;
* a split's keys are ``[s·chunk, min(kv_len, (s+1)·chunk))`` with ``chunk``
  rounded up to whole warp steps, so the last splits can be short or empty
  (they write the empty state: log-sum-exp ``NEG_BIG`` and zeros);
* each block writes its normalized partial output ``O_s`` and log-sum-exp
  ``lse_s`` per query row; a second kernel, one thread per output element,
  combines the splits exactly: ``O = Σ_s exp(lse_s − lse) O_s`` with
  ``lse = log Σ_s exp(lse_s)`` (``numba_attn.gpu.split_k``).

The extra traffic, ``S × rows × D × 4`` bytes written and read once, is tiny
next to the KV cache (B=1, H=32, S=16, D=128: 256 KiB against 268 MiB of fp16
KV at 16k keys).

Prediction: B=1 and the GQA case (8 KV heads) go from ~25–35% of the copy
bandwidth (``decode_chunked``) to ≥ 70% at kv_len ≥ 16k; at 4k the two
launches and the combine cost a few µs; large batches unchanged (S = 1).
Verdict: no row in a committed results file; the development runs (docs/decode-notes.md)
measured 85% of the copy bandwidth at B=1 16k fp16, but 40% for GQA at B=1 (66 short splits, a serial combine).
"""
from __future__ import annotations

from numba_attn.phases.decode.common import check_split, resolve_split, split_k_launch
from numba_attn.phases.registry import register_phase


@register_phase(
    name="decode_split_k", order=31, title="Decode: split-K (flash-decoding) + log-sum-exp combine",
    parent="decode_chunked", kind="decode",
    description="""
        The KV range of every (sequence, KV head) is split over S blocks, S chosen from
        the SM count so that a batch of one still fills the GPU; each block runs the
        decode_chunked loop on its chunk and writes a normalized partial output and its
        log-sum-exp; a second kernel combines the splits exactly. Uneven and empty
        splits are handled; S = 1 writes the output directly.
    """,
    lineage="Flash-Decoding (Dao, Haziza, Massa, Sizov 2023); FlashAttention-2 split-KV; "
            "FlashInfer/vLLM PagedAttention v2 reduction kernel",
    planned_speedup=40.0,
    space={"warps": [4, 8], "rows": [2, 4], "keys": [0, 1, 2, 4], "splits": [0, 4, 8, 16, 32]},
    launch_params=("splits",),  # the split count is a launch argument: its candidates mostly share kernels
    sim_params={"warps": 2, "splits": 3},
    supports=check_split,
    resolve=resolve_split,
)
def decode_split_k(problem, warps=4, lanes=0, rows=4, keys=0, splits=0, blocks_per_sm=4, min_keys=256):
    return split_k_launch(problem, False, warps, lanes, rows, keys, splits, blocks_per_sm)
