"""paged_mma8's ``prefetch`` option (8-bit caches): each warp prefetches into L2 the cache
rows and per-token scales of its step ``prefetch`` rounds ahead. A prefetch changes no value, so the output
must equal paged_mma8's without it bit for bit, and match the float64 reference; the simulator checks
that every prefetched element lies in its array. Tiny shapes (the path needs a head_dim multiple of 64: D 64),
odd and ragged lengths, pages out of order and repeated, a length-0 sequence, pages of one and of two warp
steps, GQA/causal rows. Offline (no GPU): the sm_90a SASS of the int8/token kernel at
D128 P64 holds the prefetches in its key loop and no spill there."""
import numpy as np
import pytest

import numba_attn as na
from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.phases.registry import get_phase
from numba_attn.spec.paged import paged_reference
from numba_attn.spec.problem import PagedProblem

from offline_compile import offline_json

ml_dtypes = pytest.importorskip("ml_dtypes")

SIM = get_phase("paged_mma8").sim_params


def _batch(rng, H, Hkv, D, Nq, kv_dtype, scale, P, NB, table, lens):
    x = [rng.standard_normal((NB, P, Hkv, D), dtype=np.float32) for _ in range(2)]
    if kv_dtype == "float8_e4m3":
        kc, vc = [(a * 40).astype(ml_dtypes.float8_e4m3fn) for a in x]
    else:
        kc, vc = [np.clip(np.rint(a * 30), -127, 127).astype(np.int8) for a in x]
    shape = {"tensor": (), "head": (Hkv,), "token": (NB, P, Hkv)}[scale]
    ks, vs = (np.asarray(rng.uniform(0.02, 0.04, shape), np.float32) for _ in range(2))
    q = rng.standard_normal((len(lens), Nq, H, D), dtype=np.float32).astype(np.float16)  # (B, q_len, H, D)
    return q, kc, vc, ks, vs, np.asarray(table, np.int32), np.asarray(lens, np.int32)


# (P, NB, table, lens): pages of 16 (one warp step per page) and of 32 (two); odd lengths, a partly filled
# last page, repeated and out-of-order pages, a length-0 sequence
LAYOUTS = {
    "P16": (16, 6, [[5, 1, 4], [2, 0, 3], [1, 1, 1]], [41, 23, 0]),
    "P32": (32, 4, [[3, 1, 2], [2, 0, 2], [1, 1, 1]], [77, 35, 0]),
}


@pytest.mark.parametrize("kv_dtype,scale,H,Hkv,Nq,layout,params", [
    ("int8", "token", 1, 1, 1, "P16", {"prefetch": 1}),
    ("int8", "token", 2, 1, 2, "P32", {"prefetch": 2}),  # GQA group 2 x q_len 2, causal
    ("float8_e4m3", "tensor", 2, 1, 1, "P32", {"prefetch": 1, "warps": 1}),  # one warp: its next step
])
def test_prefetch_changes_no_value(kv_dtype, scale, H, Hkv, Nq, layout, params, monkeypatch):
    """One split per sequence, so that a warp has steps ahead to prefetch (in the simulator the prefetches are
    counted, each checked to lie in its array, and the output is bit-equal to the path's without them)."""
    from numba_attn.phases.decode import frag8_loads as frag8  # (the loads role holds the prefetch)

    P, NB, table, lens = LAYOUTS[layout]
    q, kc, vc, ks, vs, table, lens = _batch(np.random.default_rng(21), H, Hkv, 64, Nq, kv_dtype, scale, P, NB,
                                            table, lens)
    causal = Nq > 1
    run = dict(causal=causal, k_scale=ks, v_scale=vs, phase="paged_mma8", **{**SIM, "splits": 1})
    calls = []

    def counted(arr, row, n, col, off, _orig=frag8.prefetch_l2_at):
        calls.append(1)
        return _orig(arr, row, n, col, off)

    if IS_SIMULATOR:  # (on the GPU the kernel is compiled: the intrinsic stays)
        monkeypatch.setattr(frag8, "prefetch_l2_at", counted)
    out = na.decode_paged(q, kc, vc, table, lens, **{**run, **params})
    assert calls or not IS_SIMULATOR  # (the simulator's device functions look the name up when they run)
    ref = paged_reference(q, kc, vc, table, lens, causal=causal, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    c = na.check(out, ref, dtype="float16")
    assert c.ok, c.reason
    assert not out[2].astype(np.float32).any()  # the length-0 sequence: zeros
    base = na.decode_paged(q, kc, vc, table, lens, **{**run, **{k: v for k, v in params.items() if k != "prefetch"}})
    if IS_SIMULATOR:  # the same operations in the same order
        assert np.array_equal(out.view(np.uint16), base.view(np.uint16))
    else:  # (two compiled kernels: allowed to differ in the last bits, should the compiler order them apart)
        assert np.abs(out.astype(np.float32) - base.astype(np.float32)).max() < 2e-3


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's bounds check of a prefetch")
def test_simulated_prefetch_checks_its_element():
    from numba import cuda

    from numba_attn.gpu.prefetch import prefetch_l2_at

    words = cuda.to_device(np.zeros((3, 2, 8), np.uint32))  # 48 words: rows of 8 (a row index · 8 + col)
    prefetch_l2_at(words, 5, 8, 4, 3)  # word 47, the last
    with pytest.raises(IndexError):
        prefetch_l2_at(words, 5, 8, 4, 4)
    with pytest.raises(IndexError):
        prefetch_l2_at(words, -1, 8, 0, 0)


def test_prefetch_supports():
    ph = get_phase("paged_mma8")

    def prob(kv_dtype="int8"):
        return PagedProblem(batch=2, heads=4, kv_heads=4, q_len=1, kv_len=300, head_dim=64, dtype="float16",
                            page_size=16, kv_dtype=kv_dtype, kv_scale="token" if kv_dtype else "head")

    assert ph.params["prefetch"] == 0  # off by default
    assert ph.supports(prob(), prefetch=1) is None
    assert ph.resolve(prob(), {"prefetch": 2})["prefetch"] == 2
    assert "no parameter 'prefetch'" in get_phase("paged_split_k").supports(prob(), prefetch=1)
    assert "8-bit caches only" in ph.supports(prob(""), prefetch=1)
    assert "out of range" in ph.supports(prob(), prefetch=5)
    launch = ph.plan(prob(), prefetch=1, **SIM)
    assert "L2 prefetch 1 step ahead" in launch.notes


_OFFLINE = r"""
import json
from numba_attn.measure.offline import compile_phase, disassemble, parse_sass
from numba_attn.spec.problem import PagedProblem
import importlib.util
spec = importlib.util.spec_from_file_location("inflight", "experiments/2026-11-23-paged-8bit/inflight_sass.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
prob = PagedProblem(batch=8, heads=32, kv_heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16",
                    page_size=64, kv_dtype="int8", kv_scale="token")
out = {}
for pf in (0, 1):
    rec = compile_phase("paged_mma8", prob, {"prefetch": pf}, keep_cubin=True)[0]
    text = disassemble(rec["cubin"])
    if text is None:
        out[pf] = None
        continue
    ins, labels = parse_sass(text)
    body = m.main_loop(ins, labels)
    out[pf] = {"regs": rec["regs"], "loop": len(body),
               "spill": (rec.get("spill_stores") or 0) + (rec.get("spill_loads") or 0),
               "prefetch": sum(1 for _, op, _ in body if op.startswith("CCTL") and "PF2" in op),
               "loop_local": sum(1 for _, op, _ in body if op.startswith(("LDL", "STL"))),
               "wide_loads": sum(1 for _, op, _ in body if op.startswith("LDG.E.128"))}
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def offline():
    return offline_json(_OFFLINE, timeout=600)


def test_int8_kernel_has_no_local_memory_offline(offline):
    """The int8/token mma kernel at the target shape (D128, P64, the default prefetch=0) spills nothing (its
    64-bit warp index was kept in local memory across the key loop, 8 bytes, before it became 32-bit), within
    the 128 registers of two 8-warp blocks per SM."""
    base = offline["0"]
    if base is None:
        pytest.skip("no nvdisasm")
    assert base["spill"] == 0 and base["regs"] <= 128


def test_prefetch_in_the_int8_key_loop_offline(offline):
    """At the target shape (int8/token, D128, P64): with prefetch=1 the key loop holds L2 prefetches (4: one
    K and one V line per lane, the K and V scales), the same 8 16-byte loads, no local memory inside it, and
    at most 128 registers (two 8-warp blocks per SM); without it none."""
    if offline["0"] is None:
        pytest.skip("no nvdisasm")
    base, pf = offline["0"], offline["1"]
    assert base["prefetch"] == 0 and pf["prefetch"] >= 2
    assert pf["wide_loads"] == base["wide_loads"] == 8
    assert pf["loop_local"] == 0 and pf["regs"] <= 128
