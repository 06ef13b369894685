"""One checked launch of ``paged_split_k`` on int8/head B8 H32 D128 P64 KV 16k with the direct loads and with the
ring, for Nsight Compute (each output compared with the float64 reference first; a wrong one stops the script).
A case name ending in ``_tok`` runs int8 with a per-token scale instead.

    ncu --clock-control none -k regex:paged_split_k --metrics ... python3 experiments/2026-11-26-decode-ring/launch_ring.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from numba_attn.measure.check import check_launch  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402
from numba_attn.spec.problem import PagedProblem  # noqa: E402

PROB = PagedProblem(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64,
                    kv_dtype="int8", kv_scale="head")
TOKEN = PagedProblem(**{**PROB.to_dict(), "kv_scale": "token"})
CASES = {"direct": {}, "ring2": {"stages": 2}, "ring3_b1": {"stages": 3, "blocks_per_sm": 1}}
CASES.update({f"{name}_tok": params for name, params in CASES.items()})


def main(names):
    from numba import cuda

    stream = cuda.stream()
    phase = get_phase("paged_split_k")
    for name in names or CASES:
        prob = TOKEN if name.endswith("_tok") else PROB
        launch = phase.plan(prob, **CASES[name])
        got = check_launch(launch, prob, [1], phase.precision, stream)
        print(f"{name}: {prob.label} params {launch.params}: {'ok' if got.ok else 'WRONG'} "
              f"(rel err {got.worst.rel_err:.2e})", flush=True)
        if not got.ok:
            raise SystemExit(f"{name}: wrong result, {got.worst.reason}")


if __name__ == "__main__":
    main(sys.argv[1:])
