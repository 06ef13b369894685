"""paged_split_k's 8-bit decoders, two codes per load (default) against sixteen (``wide=True``), beside SDPA on the
contiguous fp16 twin, all in one process (each problem's inputs and float64 reference made once, for seed 1):

    NUMBA_ATTN_BACKEND=cuda python3 experiments/2026-11-23-paged-8bit/wide.py OUT.jsonl [--preset paged-8bit-short]

Per problem of the preset: paged_split_k (default), paged_split_k with wide=True, then on the contiguous twin
(spec/problem.py contiguous_twin) decode_split_k_lean and SDPA (auto and cuDNN). CUPTI kernel time for every row;
each row correctness-gated against the float64 reference as in a runner row. Prints one line per row.
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--preset", default="paged-8bit-short")
    a = ap.parse_args(argv)
    cfg = RunConfig(seeds=(1,), timing=TimingConfig(method="cupti", budget_s=1.0))
    with open(a.out, "a", encoding="utf-8") as f:
        env = environment(" ".join(["python3", "experiments/2026-11-23-paged-8bit/wide.py"] + sys.argv[1:]))
        f.write(json.dumps({"type": "env", **env}, default=json_default) + "\n")
        for prob in PRESETS[a.preset]:
            twin = contiguous_twin(prob)
            rows = [measure("paged_split_k", prob, cfg), measure("paged_split_k", prob, cfg, wide=True),
                    measure("decode_split_k_lean", twin, cfg)]
            rows += [measure_peer(name, twin, cfg) for name in ("torch_sdpa", "torch_sdpa_cudnn")]
            for row in rows:
                f.write(json.dumps(row, default=json_default) + "\n")
                f.flush()
                print(f"{row['phase']:<20} {row['label']:<55} {row['status']:<5} "
                      f"{row.get('time_ms') or float('nan'):8.4f} ms  wide={row['params'].get('wide')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
