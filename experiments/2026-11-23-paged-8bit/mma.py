"""paged_split_k with ``mma`` (8-bit codes straight into tensor-core fragments) against its default on the
8-bit target problems (``wide`` where a KV head has one query row) and SDPA on the contiguous fp16 twin,
one problem per process (its inputs and float64 reference made once, seed 1):

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-23-paged-8bit/mma.py OUT.jsonl --index I

I: 0-3 the B8 H32 D128 P64 targets of ``paged-8bit-short`` (KV 16k fp8/head, 16k int8/token, 32k fp8/head,
32k int8/token), 4 its GQA problem (H32/8kv, KV 32k fp8/head; there also paged_mma). Rows: paged_split_k
(default), paged_split_k mma=True (8 warps, 2 blocks per SM), mma=True with warps=4 blocks_per_sm=4, then
SDPA (auto and cuDNN) on the contiguous twin. CUPTI kernel time; every row correctness-gated against the
float64 reference as a runner row is. Prints one line per row with the bandwidth on the bytes read.
"""
import argparse
import json
import sys

from numba_attn.measure.config import RunConfig
from numba_attn.measure.env import environment
from numba_attn.measure.peers import measure_peer
from numba_attn.measure.results import json_default
from numba_attn.measure.row import measure
from numba_attn.measure.timing import TimingConfig
from numba_attn.spec.problem import PRESETS, contiguous_twin

VARIANTS = [("paged_split_k", {}), ("paged_split_k", {"mma": True}),
            ("paged_split_k", {"mma": True, "warps": 4, "blocks_per_sm": 4})]


def cache_bytes(prob):
    """Bytes of K and V the problem reads (codes, not scales)."""
    per = 1 if getattr(prob, "kv_dtype", "") else 2
    return 2 * prob.batch * prob.kv_heads * prob.kv_len * prob.head_dim * per


def compare(argv, script, variants, peers=("torch_sdpa", "torch_sdpa_cudnn"),
            keys=("wide", "mma", "warps", "blocks_per_sm", "splits"), doc=__doc__, preset="paged-8bit-short"):
    """One problem of ``preset`` (``--index``): the rows of ``variants(problem)`` ((phase,
    params) pairs), then ``peers`` on the contiguous twin, appended to OUT.jsonl after an env line; one
    printed line per row with the bandwidth on the bytes read and the speedup against the first peer."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--index", type=int, required=True)
    a = ap.parse_args(argv)
    prob = PRESETS[preset][a.index]
    cfg = RunConfig(seeds=(1,), timing=TimingConfig(method="cupti", budget_s=1.0))
    twin = contiguous_twin(prob)
    with open(a.out, "a", encoding="utf-8") as f:
        env = environment(" ".join(["python3", f"experiments/2026-11-23-paged-8bit/{script}"] + sys.argv[1:]))
        f.write(json.dumps({"type": "env", **env}, default=json_default) + "\n")
        rows = [(prob, measure(name, prob, cfg, **params)) for name, params in variants(prob)]
        peer_rows = [(twin, measure_peer(name, twin, cfg)) for name in peers]
        peer = peer_rows[0][1].get("time_ms") or float("nan")
        for p, row in rows + peer_rows:
            f.write(json.dumps(row, default=json_default) + "\n")
            f.flush()
            ms = row.get("time_ms") or float("nan")
            extra = {k: row["params"].get(k) for k in keys if k in row["params"]}
            print(f"{row['phase']:<18} {row['label']:<52} {row['status']:<5} {ms:8.4f} ms "
                  f"{cache_bytes(p) / (ms * 1e-3) / 1e12:5.2f} TB/s  {peer / ms:5.3f}x {peers[0]}  {extra}",
                  flush=True)
    return 0


def main(argv=None):
    return compare(argv, "mma.py", lambda prob: VARIANTS + ([("paged_mma", {})] if prob.group > 1 else []))


if __name__ == "__main__":
    sys.exit(main())
