"""Decode on the GPU: where the time goes (main kernel vs combine) and the
decode_split_k_lean variants, side by side with SDPA and the copy bandwidth.

    python3 experiments/2026-11-22-decode-split-k/decode_attrib.py OUT_PREFIX [--set attrib|final] [--deadline-s 270]

Part 1 (``decode_bench.run_problem``): every phase variant is checked against
the float64 reference (poisoned output, before and after timing), then timed
(events around back-to-back launches behind a spin kernel, median of 5).
Part 2 (attribution, ``--set attrib``): for the two-launch configurations the
split kernel and the combine kernel are timed alone, with the arguments the
checked launch uses (read from the launch's closure), plus the one-pass
serial combine that ``combine_splits`` replaced, on the same partials. These
single-kernel times are not outputs and are not checked on their own; the
full launch they come from was checked in part 1.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_bench as db  # noqa: E402  (selects the cuda backend, imports torch)
import torch  # noqa: E402
from numba import cuda, float32  # noqa: E402

from numba_attn.gpu.device_functions import EMPTY_LSE_BELOW, NEG_BIG, merge_state  # noqa: E402
from numba_attn.gpu.jit import device, kernel  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402


@device
def _combine_serial(part_o, part_lse, n_splits, row, d):  # the one-pass merge before commit f70b872
    m = NEG_BIG
    l = float32(0.0)
    acc = float32(0.0)
    for s in range(n_splits):
        lse_s = part_lse[s, row]
        if lse_s > EMPTY_LSE_BELOW:
            m, l, ca, cb = merge_state(m, l, lse_s, float32(1.0))
            acc = acc * ca + cb * part_o[s, row, d]
    return acc / l


@kernel
def combine_serial(part_o, part_lse, o, S, Nq):
    row = cuda.blockIdx.x
    d = cuda.threadIdx.x
    bh = row // Nq
    o[bh, row - bh * Nq, d] = _combine_serial(part_o, part_lse, S, row, d)


P = db.P
GQA1, GQA8 = P(1, 32768, kvh=8), P(8, 32768, kvh=8)
MHA4, MHA16 = P(1, 4096), P(1, 16384)
LEAN = "decode_split_k_lean"
PRESETS_SMALL = db.PRESETS["decode-small"]
SETS = {
    "attrib": {
        "shapes": [GQA1, GQA8, MHA4, MHA16],
        "variants": [("decode_split_k", {}), ("decode_split_k_fused", {}), (LEAN, {}), (LEAN, {"fuse_max": 0}),
                     (LEAN, {"fuse_max": 1 << 20}), (LEAN, {"blocks_per_sm": 3, "keys": 3}),
                     (LEAN, {"warps": 8, "blocks_per_sm": 2})],
        "attrib": [("decode_split_k", {}), (LEAN, {"fuse_max": 0})],
    },
    # after run 1: warps=8, blocks_per_sm=2 is the default of decode_split_k_lean
    "final": {
        "shapes": PRESETS_SMALL + [GQA1, MHA4, P(1, 32768), P(1, 131072), P(1, 16384, "float32"), P(8, 16384)],
        "variants": [("decode_split_k_fused", {}), (LEAN, {}), (LEAN, {"warps": 16, "blocks_per_sm": 1}),
                     (LEAN, {"warps": 4, "blocks_per_sm": 4})],
        "attrib": [(LEAN, {"fuse_max": 0})],
    },
}


def closure(fn):
    out = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # never assigned (e.g. no combine kernel when S = 1)
            pass
    return out


def attribution(p, configs, timer, out):
    q, k, v = db.inputs(p, 1)
    B, H, Hkv, Nq, Nk, D = p.batch, p.heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim
    o = torch.empty_like(q)
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    qv, kv, vv, ov = (cuda.as_cuda_array(t.reshape(s)) for t, s in
                      ((q, (B * H, Nq, D)), (k, (B * Hkv, Nk, D)), (v, (B * Hkv, Nk, D)), (o, (B * H, Nq, D))))
    for name, params in configs:
        launch = get_phase(name).plan(p, **params)
        c = closure(launch.run)
        if c.get("final") or "combine" not in c:
            continue
        kern, grid, nt = c["kern"], c["grid"], c["warps"] * 32
        if name == "decode_split_k":
            args = (qv, kv, vv, ov, c["part_o"], c["part_lse"], c["scale"], Hkv, Nk, c["chunk"])
        else:
            args = (qv, kv, vv, ov, c["part_o"], c["part_lse"], c["counters"], c["scale"], Hkv, Nk, c["chunk"], c["S"])
        rows = B * H * Nq
        t_full = timer(lambda i: launch(qv, kv, vv, ov, stream))
        t_main = timer(lambda i: kern[grid, nt, stream](*args))
        t_comb = timer(lambda i: c["combine"][rows, D, stream](c["part_o"], c["part_lse"], ov, c["S"]))
        t_ser = timer(lambda i: combine_serial[rows, D, stream](c["part_o"], c["part_lse"], ov, c["S"], Nq))
        rec = {"type": "attribution", "label": p.label, "phase": name, "params": params, "notes": launch.notes,
               "full_ms": t_full["time_ms"], "main_ms": t_main["time_ms"], "combine_ms": t_comb["time_ms"],
               "combine_serial_ms": t_ser["time_ms"]}
        out.write(json.dumps(rec) + "\n")
        out.flush()
        db.log(f"ATTRIB {p.label:34s} {name:20s} {json.dumps(params):18s} full {rec['full_ms'] * 1e3:7.1f} µs "
               f"main {rec['main_ms'] * 1e3:7.1f} combine {rec['combine_ms'] * 1e3:6.1f} "
               f"(serial {rec['combine_serial_ms'] * 1e3:6.1f}) [{launch.notes}]")
    del q, k, v, o
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--set", default="attrib")
    ap.add_argument("--deadline-s", type=float, default=270.0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    db.OUT = a.prefix + ".jsonl"
    torch.cuda.set_stream(torch.cuda.Stream())
    dev = cuda.get_current_device()
    env = {"type": "env", "gpu": torch.cuda.get_device_name(), "sm_count": int(dev.MULTIPROCESSOR_COUNT),
           "commit": os.environ.get("NUMBA_ATTN_COMMIT"), "argv": sys.argv[1:],
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    db.emit(env)
    db.log(json.dumps(env))
    timer = db.Timer()
    cp = db.copy_bandwidth(timer)
    db.emit(cp)
    db.log(f"copy bandwidth (torch copy_, 4 GiB, read+write): {cp['gbps']:.0f} GB/s ok={cp['ok']}")
    cfg = SETS[a.set]
    with open(a.prefix + "_attrib.jsonl", "a") as out:
        for p in cfg["shapes"]:
            if time.perf_counter() - t0 > a.deadline_s:
                db.log(f"deadline: stopping before {p.label}")
                break
            db.run_problem(p, cfg["variants"], timer, cp["gbps"])
            if cfg.get("attrib"):
                attribution(p, cfg["attrib"], timer, out)
    db.log(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
