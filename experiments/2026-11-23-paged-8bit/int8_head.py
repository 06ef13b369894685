"""paged_split_k's default (the ``mma`` path) on the 8-bit caches with a per-head scale at B8 H32 D128 P64,
beside SDPA on the contiguous fp16 twin, one problem per process (its inputs and float64 reference made once,
seed 1): int8/head has never been timed, and fp8/head at KV 32k lost its row to a time limit last run.

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-23-paged-8bit/int8_head.py OUT.jsonl --index I

I indexes the ``paged-8bit`` preset: 9 fp8/head KV 16k, 10 int8/head KV 16k, 13 fp8/head KV 32k, 14 int8/head
KV 32k (B8). CUPTI kernel time; every row correctness-gated against the float64 reference as a runner row is.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from mma import compare  # noqa: E402  (this directory's runner of variants)


def main(argv=None):
    return compare(argv, "int8_head.py", lambda prob: [("paged_split_k", {})], peers=("torch_sdpa",),
                   keys=("mma", "warps", "blocks_per_sm", "splits"), doc=__doc__, preset="paged-8bit")


if __name__ == "__main__":
    sys.exit(main())
