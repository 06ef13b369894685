"""paged_split_k's ``mma`` path with and without ``prefetch`` (L2 prefetch of a warp's step 1 or 2 rounds
ahead) on the 8-bit targets (B8 H32 D128 P64, KV 16k/32k, fp8/head and int8/token), beside SDPA on the
contiguous fp16 twin, one problem per process (its inputs and float64 reference made once, seed 1):

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-23-paged-8bit/bandwidth.py OUT.jsonl --index I

I: 0-3, the first four problems of ``paged-8bit-short`` (KV 16k fp8/head, 16k int8/token, 32k fp8/head, 32k
int8/token). Rows: paged_split_k (default: mma, no prefetch), prefetch=1, prefetch=2, then SDPA (auto) on the
twin. CUPTI kernel time; every row correctness-gated against the float64 reference as a runner row is. Prints
one line per row with the bandwidth on the cache bytes read (codes; the per-token scales add 1/32 at D128)
and the speedup against SDPA in the same process.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from numba_attn.measure.config import RunConfig  # noqa: E402
from numba_attn.measure.env import environment  # noqa: E402
from numba_attn.measure.peers import measure_peer  # noqa: E402
from numba_attn.measure.results import json_default  # noqa: E402
from numba_attn.measure.row import measure  # noqa: E402
from numba_attn.measure.timing import TimingConfig  # noqa: E402
from numba_attn.spec.problem import PRESETS, contiguous_twin  # noqa: E402

VARIANTS = [("paged_split_k", {}), ("paged_split_k", {"prefetch": 1}), ("paged_split_k", {"prefetch": 2})]


def cache_bytes(prob):
    """Bytes of K and V the problem reads (codes, not scales)."""
    per = 1 if getattr(prob, "kv_dtype", "") else 2
    return 2 * prob.batch * prob.kv_heads * prob.kv_len * prob.head_dim * per


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--index", type=int, required=True)
    a = ap.parse_args(argv)
    prob = PRESETS["paged-8bit-short"][a.index]
    cfg = RunConfig(seeds=(1,), timing=TimingConfig(method="cupti", budget_s=1.0))
    twin = contiguous_twin(prob)
    with open(a.out, "a", encoding="utf-8") as f:
        env = environment(" ".join(["python3", "experiments/2026-11-23-paged-8bit/bandwidth.py"] + sys.argv[1:]))
        f.write(json.dumps({"type": "env", **env}, default=json_default) + "\n")
        rows = [(prob, measure(name, prob, cfg, **params)) for name, params in VARIANTS]
        rows += [(twin, measure_peer("torch_sdpa", twin, cfg))]
        sdpa = rows[-1][1].get("time_ms") or float("nan")
        for p, row in rows:
            f.write(json.dumps(row, default=json_default) + "\n")
            f.flush()
            ms = row.get("time_ms") or float("nan")
            extra = {k: row["params"].get(k) for k in ("mma", "prefetch", "warps", "blocks_per_sm", "splits")
                     if k in row["params"]}
            print(f"{row['phase']:<14} {row['label']:<52} {row['status']:<5} {ms:8.4f} ms "
                  f"{cache_bytes(p) / (ms * 1e-3) / 1e12:5.2f} TB/s  {sdpa / ms:5.3f}x SDPA  {extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
