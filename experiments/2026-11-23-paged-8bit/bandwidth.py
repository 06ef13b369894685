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
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from mma import compare  # noqa: E402  (this directory's runner of variants, shared with mma.py)

VARIANTS = [("paged_split_k", {}), ("paged_split_k", {"prefetch": 1}), ("paged_split_k", {"prefetch": 2})]


def main(argv=None):
    return compare(argv, "bandwidth.py", lambda prob: VARIANTS, peers=("torch_sdpa",),
                   keys=("mma", "prefetch", "warps", "blocks_per_sm", "splits"), doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
