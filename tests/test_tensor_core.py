"""The tensor-core phases (tc_mma, tc_pipelined, tc_tf32, tc_wgmma, tc_wgmma_overlap, tma_wgmma,
warp_specialized_tc, pingpong, ws_overlap) against the float64 reference.

In the simulator every mma/ldmatrix is a per-lane fallback and costs a warp
barrier, so the shapes are tiny: one or two 16-row warps per block, 16-key
tiles, head_dim 16/32, lengths that are not multiples of any tile and
q_len != kv_len (bottom-right causal alignment). The output is poisoned
before each run. On a GPU the same tests run the real instructions, and the
GPU-only tests add realistic shapes and look at the compiled code.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from offline_compile import offline_json

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.spec.problem import Problem
from numba_attn.spec.reference import check, poison, reference
from numba_attn.phases.registry import get_phase
from numba_attn.phases.tensor_core import scheduler

from numba import cuda

gpu_only = pytest.mark.skipif(IS_SIMULATOR, reason="needs a CUDA GPU (realistic shapes, SASS)")

try:
    import ml_dtypes  # noqa: F401
    HAVE_BF16 = True
except ImportError:  # pragma: no cover
    HAVE_BF16 = False


def run_phase(name, problem, seed=1, inputs=None, **params):
    """Plan, launch on poisoned output, check against float64; returns (Check, launch). ``inputs``: (q, k, v) in
    place of the problem's random ones."""
    phase = get_phase(name)
    params = {**(phase.sim_params if IS_SIMULATOR else {}), **params}
    q, k, v = problem.inputs(seed) if inputs is None else inputs
    ref = reference(q, k, v, causal=problem.causal, scale=problem.sm_scale)
    launch = phase.plan(problem, **params)
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    # bf16 (ml_dtypes) arrays do not pass numba's buffer protocol on the GPU: move bit patterns
    bits = np.uint16 if q.dtype.itemsize == 2 else q.dtype
    qd, kd, vd = (cuda.to_device(np.ascontiguousarray(a).view(bits)) for a in (q, k, v))
    od = cuda.to_device(poison(np.empty(problem.out_shape(), q.dtype), problem.dtype).view(bits))
    launch(qd.reshape(B * H, problem.q_len, D), kd.reshape(B * Hkv, problem.kv_len, D),
           vd.reshape(B * Hkv, problem.kv_len, D), od.reshape(B * H, problem.q_len, D), 0)
    cuda.synchronize()
    out = od.copy_to_host().view(q.dtype)
    return check(out, ref, dtype=problem.dtype, precision=phase.precision), launch


def tiny(dtype, D=16, causal=False, q_len=37, kv_len=53, heads=2, kv_heads=None):
    return Problem(batch=1, heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, head_dim=D,
                   dtype=dtype, causal=causal)


CASES = [
    # (one head where a second would be a second MHA head: the head index is the GQA cases' and
    # tests/test_phases.py's)
    ("tc_mma", tiny("float16", D=16, heads=1), {}),
    ("tc_mma", tiny("bfloat16", D=32, causal=True, heads=1), {}),
    ("tc_pipelined", tiny("float16", D=32, causal=True, heads=1), {"stages": 3}),
    ("tc_pipelined", tiny("bfloat16", D=16, heads=2, kv_heads=1), {}),
    ("tc_pipelined", tiny("float16", D=16, causal=True, q_len=45, kv_len=61, heads=1), {"m_tiles": 2, "warps": 1}),
    # 64-key tiles from dynamic shared memory (the D=128 Bc=64 path; dynamic_smem=1 forces it at small D): two tiles
    # at D=32, three (the 2-stage ring reused) at D=16 causal
    ("tc_pipelined", tiny("float16", D=32, q_len=21, kv_len=86, heads=1), {"Bc": 64, "dynamic_smem": 1}),
    ("tc_pipelined", tiny("bfloat16", D=16, causal=True, q_len=37, kv_len=141, heads=1), {"Bc": 64, "dynamic_smem": 1}),
    ("tc_tf32", tiny("float32", D=16, causal=True, heads=1), {}),
    ("tc_tf32", tiny("float32", D=24, q_len=21, kv_len=21), {"warps": 1, "Bc": 8}),
    # wgmma: one warpgroup per block in the simulator; 64/32-byte swizzles at D=32/16, 128 at D=64
    ("tc_wgmma", tiny("float16", D=64, q_len=70, kv_len=75, heads=1, causal=True), {"warpgroups": 1, "Bc": 16}),
    ("tc_wgmma", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"warpgroups": 1, "Bc": 32, "stages": 3}),
    ("tc_wgmma", tiny("float16", D=16, q_len=130, kv_len=37, heads=1), {"warpgroups": 2, "Bc": 16}),
    # the next tile's scores in flight during the softmax: 3 stages, uneven last tile, causal, GQA
    ("tc_wgmma_overlap", tiny("float16", D=64, q_len=70, kv_len=75, heads=1, causal=True), {"warpgroups": 1, "Bc": 16}),
    ("tc_wgmma_overlap", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"warpgroups": 1, "Bc": 32, "stages": 4}),
    # K/V by TMA into the mbarrier ring: 128/64/32-byte swizzled boxes (D=64/32/16), rows past Nk zero-filled,
    # a padded head dim (D=40: a 64-column box, columns past D zero), GQA, bf16, causal tiles skipped by a
    # warpgroup that still waits and releases, 2..4 stages
    ("tma_wgmma", tiny("float16", D=64, q_len=70, kv_len=75, heads=1, causal=True), {"warpgroups": 1, "Bc": 16}),
    ("tma_wgmma", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"warpgroups": 1, "Bc": 32, "stages": 3}),
    ("tma_wgmma", tiny("float16", D=16, q_len=130, kv_len=37, heads=1), {"warpgroups": 2, "Bc": 16}),
    # (two warpgroups: the second past Nq in the Nk=37 case's second block, partly past Nq here, where the first
    # skips the last two of seven tiles and the 3-stage ring wraps twice)
    ("tma_wgmma", tiny("float16", D=16, q_len=100, kv_len=101, heads=1, causal=True),
     {"warpgroups": 2, "Bc": 16, "stages": 3}),
    ("tma_wgmma", tiny("bfloat16", D=40, q_len=21, kv_len=50, heads=2, kv_heads=1, causal=True),
     {"warpgroups": 1, "Bc": 16, "stages": 4}),
    # a producer warpgroup issues every load; 1-3 consumer warpgroups (3: 512 threads), synchronised only
    # by the full/empty mbarriers; causal tiles skipped by a consumer, GQA, bf16, a padded head dim
    ("warp_specialized_tc", tiny("float16", D=64, q_len=70, kv_len=75, heads=1, causal=True),
     {"warpgroups": 1, "Bc": 16}),
    ("warp_specialized_tc", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"warpgroups": 1, "Bc": 32, "stages": 3}),
    ("warp_specialized_tc", tiny("float16", D=16, q_len=130, kv_len=150, heads=1, causal=True),
     {"warpgroups": 2, "Bc": 16}),
    ("warp_specialized_tc", tiny("bfloat16", D=40, q_len=21, kv_len=50, heads=2, kv_heads=1, causal=True),
     {"warpgroups": 1, "Bc": 16, "stages": 4}),
    ("warp_specialized_tc", tiny("float16", D=16, q_len=150, kv_len=40, heads=1), {"warpgroups": 3, "Bc": 16}),
    # two consumers taking turns through named barriers 1 and 2: the second consumer's rows partly or wholly
    # past Nq (its turns empty), GQA, bf16, 2 and 3 stages, one D=128 case (causal, uneven last tile); the
    # causal case where one consumer skips tiles the other computes is test_pingpong_turns_alternate
    ("pingpong", tiny("float16", D=64, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    ("pingpong", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"Bc": 32, "stages": 2}),
    ("pingpong", tiny("float16", D=128, q_len=80, kv_len=95, heads=1, causal=True), {"Bc": 16, "stages": 2}),
    # the consumers' next S issued before this tile's softmax: the second consumer's rows partly past Nq, GQA,
    # bf16, 3 and 4 stages, one causal D=128 case (a consumer skipping the last tiles)
    ("ws_overlap", tiny("float16", D=64, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    ("ws_overlap", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"Bc": 32, "stages": 4}),
    ("ws_overlap", tiny("float16", D=128, q_len=80, kv_len=95, heads=1, causal=True), {"Bc": 16}),
    # each consumer's softmax under its own P·V (the stage of the tile before held until after the softmax): the
    # second consumer's rows partly past Nq, GQA, bf16, 3 and 4 stages, causal D=128 and D=16 with tiles the first
    # consumer skips (held P·V issued after the loop), three consumers
    ("ws_intra", tiny("float16", D=64, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    ("ws_intra", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"Bc": 32, "stages": 4}),
    ("ws_intra", tiny("float16", D=128, q_len=80, kv_len=95, heads=1, causal=True), {"Bc": 16}),
    ("ws_intra", tiny("float16", D=16, q_len=130, kv_len=150, heads=1, causal=True), {"warpgroups": 2, "Bc": 16}),
    ("ws_intra", tiny("bfloat16", D=16, q_len=150, kv_len=40, heads=1), {"warpgroups": 3, "Bc": 16, "uniform": True}),
    # the same with K and V on barriers of their own (two stages: K_j released after S_j, V_j after its P·V; the
    # unseen tiles of the D16 causal case outnumber the stages), three stages, three consumers
    ("ws_intra_kv", tiny("float16", D=64, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    ("ws_intra_kv", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"Bc": 32, "stages": 3}),
    ("ws_intra_kv", tiny("float16", D=128, q_len=80, kv_len=95, heads=1, causal=True), {"Bc": 16}),
    ("ws_intra_kv", tiny("float16", D=16, q_len=130, kv_len=150, heads=1, causal=True), {"warpgroups": 2, "Bc": 16}),
    ("ws_intra_kv", tiny("bfloat16", D=16, q_len=150, kv_len=40, heads=1), {"warpgroups": 3, "Bc": 16}),
    # the causal query blocks counted from the last: several blocks a head (one consumer: 64 rows), GQA, a query
    # block with more keys than queries, bf16 with two consumers; without a mask the kernel is ws_intra_kv's
    ("ws_intra_lpt", tiny("float16", D=16, q_len=300, kv_len=320, heads=2, kv_heads=1, causal=True),
     {"warpgroups": 1, "Bc": 16}),
    ("ws_intra_lpt", tiny("bfloat16", D=64, q_len=200, kv_len=330, heads=1, causal=True), {"warpgroups": 2, "Bc": 32}),
    ("ws_intra_lpt", tiny("float16", D=32, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    # and Q in shared memory (each warpgroup's fragments stored into its swizzled tile, S read from there): the
    # same shapes, a head dim padded to whole k-steps (40) and one of 64-byte rows (32, another swizzle)
    ("ws_intra_qs", tiny("float16", D=64, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    ("ws_intra_qs", tiny("bfloat16", D=32, heads=2, kv_heads=1), {"Bc": 32}),
    ("ws_intra_qs", tiny("float16", D=128, q_len=80, kv_len=95, heads=1, causal=True), {"Bc": 16}),
    ("ws_intra_qs", tiny("float16", D=40, q_len=130, kv_len=150, heads=1, causal=True), {"warpgroups": 2, "Bc": 16}),
    ("ws_intra_qs", tiny("bfloat16", D=16, q_len=150, kv_len=40, heads=1), {"warpgroups": 3, "Bc": 16}),
    # its wide tiles: 176 keys (11 k-steps of P·V, a partial last tile) and D256's 80 (5 k-steps; at D32 here: at
    # D256 the simulated threads' matrix products abort OpenBLAS in this process unless OPENBLAS_NUM_THREADS=1,
    # with which the D256 case passes)
    ("ws_intra_qs", tiny("float16", D=128, q_len=70, kv_len=400, heads=1), {"Bc": 176}),
    ("ws_intra_qs", tiny("bfloat16", D=32, q_len=70, kv_len=170, heads=1, causal=True), {"Bc": 80}),
    # uniform (the warp index broadcast from lane 0; off by default in warp_specialized_tc, on in ws_overlap): the
    # other setting, the same kernels otherwise (only the warp index's source differs, so one case a phase, with
    # every warpgroup's warps: the producer and two consumers, the second partly past Nq, causal; D=16 with tiles
    # the first consumer skips, D=64)
    ("warp_specialized_tc", tiny("float16", D=16, q_len=100, kv_len=101, heads=1, causal=True),
     {"warpgroups": 2, "Bc": 16, "uniform": True}),
    ("ws_overlap", tiny("float16", D=64, q_len=70, kv_len=95, heads=1, causal=True), {"Bc": 16, "uniform": False}),
    # persistent blocks (sim_params: 2 blocks), the ring carried from one work item to the next: 2 items a block
    # (causal, longest first, GQA), an uneven share over a 3-stage ring (its parity wraps inside an item and
    # across items), two consumers with the second past Nq and one block for every item
    ("ws_persistent", tiny("float16", D=16, q_len=100, kv_len=101, heads=2, kv_heads=1, causal=True), {"blocks": 2}),
    ("ws_persistent", tiny("bfloat16", D=32, q_len=40, heads=3, kv_heads=1), {"Bc": 32, "stages": 3, "blocks": 2}),
    ("ws_persistent", tiny("float16", D=16, q_len=70, kv_len=53, heads=2), {"warpgroups": 2, "blocks": 1}),
    # ws_intra_kv's loop in persistent blocks, items in snaked rounds: 10 causal items of 1-5 tiles over 2 blocks
    # (GQA; a block's last item past the others'), 3 blocks over 4 items with two stages of 2 consumers, one block
    ("ws_intra_persistent", tiny("float16", D=16, q_len=300, kv_len=320, heads=2, kv_heads=1, causal=True),
     {"blocks": 2}),
    ("ws_intra_persistent", tiny("bfloat16", D=32, q_len=150, kv_len=90, heads=2), {"warpgroups": 2, "blocks": 3}),
    ("ws_intra_persistent", tiny("float16", D=64, q_len=130, kv_len=140, heads=1, causal=True), {"blocks": 1}),
    # Q brought by the producer's TMA on its own barriers, a phase an item: ws_intra_persistent's cases (10 causal
    # items over 2 blocks, the Q of a 1-tile item loaded after its loop; 3 blocks over 4 items; one block), the second
    # consumer's Q rows past Nq (zero-filled), a head dim padded to whole k-steps (40), 64-byte rows (32)
    ("ws_tma_q", tiny("float16", D=16, q_len=300, kv_len=320, heads=2, kv_heads=1, causal=True), {"blocks": 2}),
    ("ws_tma_q", tiny("bfloat16", D=32, q_len=150, kv_len=90, heads=2), {"warpgroups": 2, "blocks": 3}),
    ("ws_tma_q", tiny("float16", D=64, q_len=130, kv_len=140, heads=1, causal=True), {"blocks": 1}),
    ("ws_tma_q", tiny("float16", D=40, q_len=100, kv_len=75, heads=1), {"warpgroups": 2, "Bc": 16, "blocks": 1}),
    ("ws_tma_q", tiny("bfloat16", D=128, q_len=80, kv_len=95, heads=2, kv_heads=1, causal=True),
     {"Bc": 16, "blocks": 3, "stages": 3}),
    # and its epilogue through the rows' views: rows past Nq (their view any row's, nothing stored), GQA bf16
    ("ws_tma_q_rows", tiny("float16", D=64, q_len=130, kv_len=140, heads=1, causal=True), {"blocks": 1}),
    ("ws_tma_q_rows", tiny("bfloat16", D=40, q_len=100, kv_len=75, heads=2, kv_heads=1),
     {"warpgroups": 2, "Bc": 16, "blocks": 3}),
    # and Q released after the item's last S: 10 causal items over 2 blocks (1-5 tiles), two causal consumers of
    # which the first sees fewer tiles (it releases Q first) and the second's rows pass Nq, GQA bf16 without a mask
    ("ws_tma_q_early", tiny("float16", D=16, q_len=300, kv_len=320, heads=2, kv_heads=1, causal=True), {"blocks": 2}),
    ("ws_tma_q_early", tiny("float16", D=64, q_len=130, kv_len=140, heads=1, causal=True),
     {"warpgroups": 2, "Bc": 16, "blocks": 1}),
    ("ws_tma_q_early", tiny("bfloat16", D=40, q_len=100, kv_len=75, heads=2, kv_heads=1),
     {"warpgroups": 2, "Bc": 16, "blocks": 3}),
    # and three consumers on 128-key tiles at D64 (the real configuration: 3 causal items over 2 blocks, the last
    # consumer's rows past Nq), two at D32 (GQA, rows past Nq)
    ("ws_tma_q_wide", tiny("float16", D=64, q_len=150, kv_len=260, heads=1, causal=True),
     {"warpgroups": 3, "Bc": 128, "blocks": 2}),
    ("ws_tma_q_wide", tiny("bfloat16", D=32, q_len=100, kv_len=75, heads=2, kv_heads=1),
     {"warpgroups": 2, "Bc": 16, "blocks": 3}),
    # O staged in shared memory, a bulk copy a row: the second consumer's rows partly past Nq (rows not copied),
    # GQA bf16 with an odd head_dim of whole 16-byte chunks, causal D=128, three consumers of which the last has
    # no row below Nq
    ("ws_intra_bulk_o", tiny("float16", D=64, q_len=100, kv_len=75, heads=1), {"Bc": 16}),
    ("ws_intra_bulk_o", tiny("bfloat16", D=40, q_len=45, heads=2, kv_heads=1), {"Bc": 32, "stages": 3}),
    ("ws_intra_bulk_o", tiny("float16", D=128, q_len=80, kv_len=95, heads=1, causal=True), {"Bc": 16}),
    ("ws_intra_bulk_o", tiny("bfloat16", D=16, q_len=120, kv_len=40, heads=1), {"warpgroups": 3, "Bc": 16}),
]


@pytest.mark.parametrize("name,problem,params", CASES,
                         ids=[f"{n}-{p.label.replace(' ', '_')}"
                              + {True: "-uniform", False: "-not-uniform"}.get(q.get("uniform"), "")
                              for n, p, q in CASES])
def test_phase_matches_reference(name, problem, params):
    if problem.dtype == "bfloat16" and not HAVE_BF16:
        pytest.skip("ml_dtypes not installed")
    c, _ = run_phase(name, problem, **params)
    assert c.ok, c.reason
    assert c.unwritten == 0


@pytest.mark.parametrize("causal", [False, True])
def test_lazy_rescale_matches_reference_when_the_max_jumps(causal):
    """warp_specialized_tc with lazy_rescale=True (FlashAttention-4's conditional rescale): the even 16-key tiles'
    scores climb by ~96 a step (s·sl2 by ~35 > 8: the running max moves and O is rescaled), the odd ones fall back
    near 0 (it stays: P against the old max); against float64, causal and not, and random inputs (the max
    never moves by 8 after the first tile) too."""
    problem = tiny("float16", D=16, q_len=40, kv_len=100, heads=1, causal=causal)
    rng = np.random.default_rng(5)
    q = (1 + 0.1 * rng.standard_normal((1, 1, 40, 16))).astype(np.float16)
    tile = np.arange(100) // 16
    level = np.where(tile % 2 == 0, 3.0 * tile, 0.0)
    k = (level[None, None, :, None] + 0.1 * rng.standard_normal((1, 1, 100, 16))).astype(np.float16)
    v = rng.standard_normal((1, 1, 100, 16)).astype(np.float16)
    params = {"warpgroups": 1, "Bc": 16, "lazy_rescale": True}
    c, _ = run_phase("warp_specialized_tc", problem, inputs=(q, k, v), **params)
    assert c.ok and c.unwritten == 0, c.reason
    c, _ = run_phase("warp_specialized_tc", problem, **params)
    assert c.ok and c.unwritten == 0, c.reason


def test_supports_reasons():
    f32 = Problem(q_len=64, head_dim=64, dtype="float32")
    assert "dtype" in get_phase("tc_mma").supports(f32)
    assert "dtype" in get_phase("tc_pipelined").supports(f32)
    assert "dtype" in get_phase("tc_tf32").supports(f32.replace(dtype="float16"))
    big = Problem(q_len=64, head_dim=264, dtype="float16")
    assert "head_dim" in get_phase("tc_mma").supports(big)  # every multiple of 8 up to 256 (issue 13)
    assert get_phase("tc_mma").supports(big.replace(head_dim=256)) is None
    d128 = Problem(q_len=64, head_dim=128, dtype="float16")
    assert get_phase("tc_pipelined").supports(d128) is None  # default Bc=64: 64 KiB, dynamic
    assert get_phase("tc_pipelined").supports(d128, Bc=32) is None  # 32 KiB, static
    assert get_phase("tc_pipelined").supports(d128, Bc=64, stages=3) is None  # 96 KiB, dynamic
    assert "shared memory" in get_phase("tc_pipelined").supports(d128, Bc=256, stages=4)  # 512 KiB
    assert get_phase("tc_tf32").supports(Problem(q_len=64, head_dim=64)) is None
    assert "head_dim" in get_phase("tc_wgmma").supports(Problem(q_len=64, head_dim=264, dtype="float16"))
    assert get_phase("tc_wgmma").supports(Problem(q_len=64, head_dim=48, dtype="float16")) is None  # padded to 64
    assert get_phase("tc_wgmma").supports(d128) is None
    assert get_phase("tma_wgmma").supports(d128) is None
    assert get_phase("tma_wgmma").supports(Problem(q_len=64, head_dim=40, dtype="bfloat16")) is None  # 64-col box
    assert "dtype" in get_phase("tma_wgmma").supports(f32.replace(head_dim=64))
    assert "shared memory" in get_phase("tma_wgmma").supports(d128.replace(head_dim=256), Bc=256, stages=4)
    ws = get_phase("warp_specialized_tc")
    assert ws.supports(d128) is None and ws.supports(d128, warpgroups=1) is None
    assert "registers" in ws.supports(d128, warpgroups=3)  # 512 threads: 128 registers each
    assert ws.supports(d128.replace(head_dim=64), warpgroups=3) is None
    assert "registers" in ws.supports(d128.replace(head_dim=192), warpgroups=2)
    assert ws.supports(d128.replace(head_dim=256)) is None  # one consumer warpgroup above D=128
    assert ws.resolve(d128.replace(head_dim=256))["warpgroups"] == 1 and ws.resolve(d128)["warpgroups"] == 2
    # D=64: three consumers with 128-key tiles (the fastest D64 setting measured); ws_persistent keeps two with 64
    assert {k: ws.resolve(d128.replace(head_dim=64))[k] for k in ("warpgroups", "Bc")} == {"warpgroups": 3, "Bc": 128}
    assert {k: ws.resolve(d128.replace(head_dim=32))[k] for k in ("warpgroups", "Bc")} == {"warpgroups": 2, "Bc": 64}
    wsp = get_phase("ws_persistent")
    assert {k: wsp.resolve(d128.replace(head_dim=64))[k] for k in ("warpgroups", "Bc")} == {"warpgroups": 2, "Bc": 64}
    assert wsp.resolve(d128.replace(head_dim=64), {"warpgroups": 3})["warpgroups"] == 3
    assert "consumer warpgroups" in ws.supports(d128, warpgroups=4)
    assert "dtype" in ws.supports(f32)
    pp = get_phase("pingpong")
    assert pp.supports(d128) is None and pp.resolve(d128)["warpgroups"] == 2
    assert pp.supports(d128.replace(head_dim=64, causal=True, dtype="bfloat16")) is None
    assert "exactly 2" in pp.supports(d128, warpgroups=1) and "exactly 2" in pp.supports(d128, warpgroups=3)
    assert "registers" in pp.supports(d128.replace(head_dim=192))
    assert "shared memory" in pp.supports(d128, Bc=256, stages=4)
    assert "dtype" in pp.supports(f32)


def test_persistent_arguments():
    """ws_persistent: a negative block count and the schedules that cannot carry the ring across work items
    are refused by name."""
    from numba_attn.phases.tensor_core.kernel import make_wgmma_kernel
    from numba_attn.phases.tensor_core.p24_tc_wgmma_overlap import overlap_mainloop
    from numba_attn.phases.tensor_core.p27_pingpong import pingpong_mainloop
    from numba_attn.phases.tensor_core.pipeline import wgmma_tiles
    with pytest.raises(ValueError, match="blocks"):
        get_phase("ws_persistent").plan(tiny("float16"), blocks=-1)
    for mainloop in (overlap_mainloop, pingpong_mainloop):
        with pytest.raises(ValueError, match="persistent"):
            make_wgmma_kernel(wgmma_tiles(16, 2, 16, 3), 1, False, False, mainloop, "ws", persistent=True)
    assert get_phase("ws_persistent").parent == "warp_specialized_tc"
    assert get_phase("ws_persistent").requires_cc == "sm_90a"
    with pytest.raises(ValueError, match="balanced"):
        make_wgmma_kernel(wgmma_tiles(16, 2, 16, 3), 1, False, False, balanced=1)
    with pytest.raises(ValueError, match="power of two"):
        scheduler.balanced_items(3)


@pytest.mark.parametrize("grid,n_query_blocks,bh,section", [(3, 5, 2, 1), (4, 3, 8, 4), (5, 8, 4, 2), (7, 1, 6, 2)])
def test_balanced_items_visit_every_item_once(grid, n_query_blocks, bh, section):
    """balanced_items: over its rounds, the grid's blocks take every (query block, head) item exactly once, and
    each round's items are the next ``grid`` of the order (query blocks from the last, ``section`` heads fastest)."""
    item = scheduler.balanced_items(section)

    @cuda.jit
    def walk(seen, rounds, n, BH):
        r = 0
        qb, h = item(0, n)
        while h < BH:
            seen[h, qb] += 1
            rounds[h, qb] = r
            r += 1
            qb, h = item(r, n)

    seen = np.zeros((bh, n_query_blocks), np.int32)
    rounds = np.full((bh, n_query_blocks), -1, np.int32)
    walk[grid, 1](seen, rounds, n_query_blocks, bh)
    assert (seen == 1).all(), seen
    order = sorted(((h // section, qb, h % section) for h in range(bh) for qb in range(n_query_blocks)))
    for i, (sec, qb, e) in enumerate(order):
        assert rounds[sec * section + e, qb] == i // grid


def test_divmod_small_is_exact():
    """divmod_small: the float32 quotient corrected to Python's divmod, at quotients of 0 to beyond 2^24 (where
    float32 no longer holds i exactly) and divisors from 1."""
    cases = np.array([(0, 1), (7, 8), (8, 8), (2047, 8), (2048, 8), (131, 132), (263, 132), (12345, 1), (1 << 24, 3),
                      ((1 << 26) + 5, 7), ((1 << 26) + 6, 7), (999, 1000), (100000, 33)], np.int64)

    @cuda.jit
    def split(c, out):
        j = cuda.grid(1)
        if j < c.shape[0]:
            out[j, 0], out[j, 1] = scheduler.divmod_small(c[j, 0], c[j, 1])

    out = np.full((len(cases), 2), -1, np.int64)
    split[1, 32](cases, out)
    assert [tuple(r) for r in out] == [divmod(int(i), int(n)) for i, n in cases]


@pytest.mark.parametrize("grid,n_query_blocks,bh", [(3, 5, 2), (7, 1, 6), (4, 3, 8)])
def test_persistent_items_visit_every_item_once(grid, n_query_blocks, bh):
    """first_item, next_item: every gridDim.x-th item from blockIdx.x, each (query block, head) exactly once."""
    first, following = scheduler.persistent_items(0)

    @cuda.jit
    def walk(seen, n, BH):
        r, qb, h = first(n)
        while h < BH:
            seen[h, qb] += 1
            r, qb, h = following(r, qb, h, n)

    seen = np.zeros((bh, n_query_blocks), np.int32)
    walk[grid, 1](seen, n_query_blocks, bh)
    assert (seen == 1).all(), seen


def test_balanced_section_evens_out_the_causal_blocks():
    """The host's choice of order: at B8 H32/8kv N1024 causal on 132 SMs the busiest block does at most 1.04x the
    average work (every 132nd item: a block's items alternate between two of the 8 query blocks); one head of 128
    query blocks over 132 blocks needs the heads' longest together (a section of two)."""
    p = Problem(batch=8, heads=32, kv_heads=8, q_len=1024, head_dim=128, causal=True)
    sec = scheduler.balanced_section(p, 8, 132)
    assert scheduler.schedule_load(sec, 8, 256, 132, True) <= 1.04
    p2 = Problem(batch=1, heads=2, q_len=16384, head_dim=128, causal=True)
    assert scheduler.balanced_section(p2, 128, 132) == 2
    assert scheduler.schedule_load(1, 128, 2, 132, True) > 1.5 > 1.01 > scheduler.schedule_load(2, 128, 2, 132, True)


def test_registry_metadata():
    assert get_phase("tc_tf32").precision == "tf32"
    assert get_phase("tc_mma").parent == "smem_kv"
    assert get_phase("tc_pipelined").parent == "tc_mma"
    assert get_phase("tc_tf32").parent == "tc_pipelined"
    assert get_phase("tc_wgmma").parent == "tc_pipelined"
    assert get_phase("tc_wgmma_overlap").parent == "tc_wgmma"
    assert get_phase("tma_wgmma").parent == "tc_wgmma"
    assert get_phase("tma_wgmma").requires_cc == "sm_90a"
    assert get_phase("warp_specialized_tc").parent == "tma_wgmma"
    assert get_phase("warp_specialized_tc").requires_cc == "sm_90a"
    assert get_phase("pingpong").parent == "warp_specialized_tc"
    assert get_phase("pingpong").requires_cc == "sm_90a"
    assert get_phase("pingpong").order == 27


def _launch_args(problem, seed=1):
    q, k, v = problem.inputs(seed)
    B, H, Hkv, D = problem.batch, problem.heads, problem.kv_heads, problem.head_dim
    qd, kd, vd = (cuda.to_device(np.ascontiguousarray(a).view(np.uint16)) for a in (q, k, v))
    od = cuda.to_device(poison(np.empty(problem.out_shape(), q.dtype), problem.dtype).view(np.uint16))
    shapes = [(B * H, problem.q_len, D), (B * Hkv, problem.kv_len, D), (B * Hkv, problem.kv_len, D),
              (B * H, problem.q_len, D)]
    ref = reference(q, k, v, causal=problem.causal, scale=problem.sm_scale)
    return (qd, kd, vd, od), shapes, ref


def test_tma_launch_encodes_maps_once(monkeypatch):
    """A repeated call with the same arrays makes no tensor map; new array objects over the
    same memory reuse the cached maps (keyed by address, shape, strides, box, swizzle)."""
    from numba_attn.gpu import tma as T
    from numba_attn.phases.tensor_core import producer as C

    prob = tiny("float16", D=32, q_len=21, kv_len=40, heads=1)  # (three launches: one head)
    launch = get_phase("tma_wgmma").plan(prob, **get_phase("tma_wgmma").sim_params)
    bufs, shapes, ref = _launch_args(prob)
    made = []
    orig = T.tensor_map
    monkeypatch.setattr(T, "tensor_map", lambda *a, **kw: made.append(a[1:]) or orig(*a, **kw))
    C._TMAPS.clear()
    args = [b.reshape(*s) for b, s in zip(bufs, shapes)]
    launch(*args, 0)
    assert len(made) == 2  # K and V
    launch(*args, 0)
    launch(*[b.reshape(*s) for b, s in zip(bufs, shapes)], 0)  # new objects, same memory
    assert len(made) == 2
    c = check(bufs[3].copy_to_host().view(np.float16), ref, dtype=prob.dtype)
    assert c.ok, c.reason
    # the maps hold K/V's addresses: a replay at other addresses takes the maps of those addresses (derived)
    assert launch.replayable is True and launch.derived is not None
    assert get_phase("tc_wgmma").plan(prob, **get_phase("tc_wgmma").sim_params).derived is None


@pytest.mark.parametrize("problem,warpgroups,stages", [
    (tiny("float16", D=64, q_len=70, kv_len=75, heads=1, causal=True), 1, 3),
    (tiny("float16", D=16, q_len=130, kv_len=150, heads=1, causal=True), 2, 3),
])
def test_tma_with_overlap(problem, warpgroups, stages):
    """The kernel's tma and overlap options together (no registered phase uses both): the next
    tile's scores read the TMA ring, whose full barrier is waited one tile ahead."""
    from numba_attn.phases.tensor_core.kernel import build_wgmma
    from numba_attn.phases.tensor_core.p24_tc_wgmma_overlap import overlap_mainloop

    launch = build_wgmma(problem, warpgroups, 16, stages, overlap_mainloop, loads="tma")
    bufs, shapes, ref = _launch_args(problem)
    launch(*[b.reshape(*s) for b, s in zip(bufs, shapes)], 0)
    c = check(bufs[3].copy_to_host().view(np.float16), ref, dtype=problem.dtype)
    assert c.ok, c.reason
    assert c.unwritten == 0


def test_warp_specialized_register_split():
    """The producer keeps 40 registers per thread (32 beside three consumers); the consumers' share fills the
    SM's 64K registers (512 per thread of a 128-thread warpgroup) in multiples of 8, at most 240."""
    from numba_attn.phases.tensor_core import producer as C
    from numba_attn.phases.tensor_core.consumer import plain_mainloop
    from numba_attn.phases.tensor_core.kernel import make_wgmma_kernel
    from numba_attn.phases.tensor_core.p24_tc_wgmma_overlap import overlap_mainloop
    from numba_attn.phases.tensor_core.p27_pingpong import pingpong_mainloop
    from numba_attn.phases.tensor_core.pipeline import wgmma_tiles

    assert [C.ws_producer_regs(n) for n in (1, 2, 3)] == [40, 40, 32]
    assert [C.ws_consumer_regs(n) for n in (1, 2, 3)] == [240, 232, 160]
    for n in (1, 2, 3):
        assert C.ws_producer_regs(n) + n * C.ws_consumer_regs(n) <= 512 and C.ws_consumer_regs(n) % 8 == 0
    with pytest.raises(ValueError, match="loads"):
        make_wgmma_kernel(wgmma_tiles(64, 2, 64, 2), 1, False, False, plain_mainloop, "producer")
    with pytest.raises(ValueError, match="varlen"):
        make_wgmma_kernel(wgmma_tiles(64, 2, 64, 2), 1, False, False, plain_mainloop, "tma", varlen=True)
    with pytest.raises(ValueError, match="varlen"):
        make_wgmma_kernel(wgmma_tiles(64, 2, 64, 3), 1, False, False, overlap_mainloop, "cp_async", varlen=True)
    for wg, loads in ((2, "tma"), (1, "ws"), (3, "ws"), (2, "cp_async")):
        with pytest.raises(ValueError, match="pingpong"):
            make_wgmma_kernel(wgmma_tiles(64, wg, 64, 3), 1, False, False, pingpong_mainloop, loads)


def test_wide_takes_two_consumers_where_192_row_blocks_leave_rows_empty():
    """ws_tma_q_wide's D64 tile: three consumers (192-row blocks) unless they leave over a sixteenth of the query
    rows empty beyond what 128-row blocks leave; explicit warpgroups are kept."""
    from numba_attn.phases.tensor_core.p55_ws_tma_q_wide import resolve_wide

    def wg(n, warpgroups=0):
        return resolve_wide(Problem(q_len=n, head_dim=64, dtype="float16"), warpgroups, 0, 2)["warpgroups"]

    assert [wg(n) for n in (512, 1024, 640)] == [2, 2, 2]  # 64 of 576, 128 of 1152, 128 of 768 rows empty
    assert [wg(n) for n in (768, 2048, 4096, 8192)] == [3, 3, 3, 3]  # 0, 64 of 2112 (3 %), 4096: 3 %, 8192: 0.8 %
    assert wg(512, 3) == 3 and wg(2048, 2) == 2


@pytest.mark.parametrize("problem,stages", [
    # block 0: consumer 0 (rows 0-63) sees 84 keys, 6 tiles, consumer 1 all 10; block 1: rows 128-129 only,
    # consumer 1 has no row (every turn of it empty). (The turns do not depend on the ring's depth: pingpong's
    # 2-stage ring, with a consumer skipping tiles and one without rows, is in test_phase_matches_reference.)
    (tiny("float16", D=16, q_len=130, kv_len=150, heads=1, causal=True), 3),
])
def test_pingpong_turns_alternate(monkeypatch, problem, stages):
    """The consumers' turns alternate strictly, consumer 0 first, one turn per tile of the block and one
    more (the last P·V), also where a consumer skips tiles (causal) or has no rows: the barriers stay
    balanced and the result is right. Recorded by the first thread of each consumer as it passes its
    own barrier (id 1: consumer 0, id 2: consumer 1)."""
    import threading

    from numba_attn.phases.tensor_core import p27_pingpong as C

    turns = {}
    orig = C.named_barrier_sync

    def sync(bar_id, count):
        orig(bar_id, count)
        t = threading.current_thread()
        if t.threadIdx.x % 128 == 0:
            with lock:
                turns.setdefault(t.blockIdx.x, []).append(int(bar_id))

    lock = threading.Lock()
    if IS_SIMULATOR:
        monkeypatch.setattr(C, "named_barrier_sync", sync)
    c, _ = run_phase("pingpong", problem, Bc=16, stages=stages)
    assert c.ok, c.reason
    assert c.unwritten == 0
    if IS_SIMULATOR:
        kv_end = [min(problem.kv_len, min(b * 128 + 128, problem.q_len) + problem.kv_len - problem.q_len)
                  for b in range(2)]
        assert turns == {b: [1, 2] * ((kv_end[b] + 15) // 16 + 1) for b in range(2)}, turns


def test_tma_maps_are_cached_by_address():
    """The K/V tensor maps are made once per (address, shape, strides, box, swizzle): a repeated
    call makes none; another array, a view at another address or another box gets its own map;
    a misaligned address is refused."""
    from numba_attn.phases.tensor_core import producer as C

    k = cuda.to_device(np.zeros((2, 40, 32), np.uint32))
    box, sw = C.tma_box(64, 16)
    assert (box, sw) == ((1, 16, 32), 128)
    assert C.tma_box(32, 16) == ((1, 16, 16), 64) and C.tma_box(16, 32) == ((1, 32, 8), 32)
    assert C.tma_box(40, 16) == ((1, 16, 32), 128) and C.tma_box(128, 64) == ((1, 64, 32), 128)
    C._TMAPS.clear()
    m = C.kv_tensor_map(k, box, sw)
    assert C.kv_tensor_map(k, box, sw) is m and len(C._TMAPS) == 1
    assert C.kv_tensor_map(k[1:], box, sw) is not m  # the second head's rows: another address and shape
    assert C.kv_tensor_map(k, (1, 32, 32), sw) is not m
    assert len(C._TMAPS) == 3
    bytes_ = cuda.to_device(np.zeros(4 * 40 * 32 + 16, np.uint8))
    with pytest.raises(ValueError, match="16-byte aligned"):
        C.kv_tensor_map(bytes_[4:4 + 4 * 40 * 32].view(np.uint32).reshape(1, 40, 32), box, sw)


# -- offline compile (sm_90a PTX through ptxas, no GPU needed) -------------------------

_OFFLINE = r"""
import json
import re
import numba_attn.measure.offline as off
from numba_attn.spec.problem import Problem
res = {}


def named_bars(ptx):  # (op, id, count) of each two-operand bar.sync / bar.arrive, through the ids' mov.u32
    movs, out = {}, set()
    for ln in ptx.splitlines():
        m = re.match(r"\s*mov\.u32\s+(%r\d+),\s*(\d+);", ln)
        if m:
            movs[m.group(1)] = int(m.group(2))
        m = re.match(r"\s*(bar\.(?:sync|arrive))\s+(%r\d+),\s*(%r\d+);", ln)
        if m:
            out.add((m.group(1), movs.get(m.group(2)), movs.get(m.group(3))))
    return sorted(out, key=str)


def record(name, D, causal, params=None):
    rec = off.compile_phase(name, Problem(batch=1, heads=32, q_len=4096, head_dim=D, dtype="float16",
                                          causal=causal), params)[0]
    ptx = rec.pop("ptx")
    rec["ops"] = sorted({ln.split()[0] for ln in ptx.splitlines()
                         if ln.strip().startswith(("cp.async", "mbarrier.", "setmaxnreg", "bar.sync", "bar.arrive",
                                                   "call", "shfl.sync.idx"))})
    rec["bars"] = named_bars(ptx)
    return rec


# (D=64 and D=128 of each family member share their code but for the tile sizes: the causal D=128 kernels, the
# most registers, stand for both)
for name, D, causal in (("tma_wgmma", 128, False), ("warp_specialized_tc", 128, False), ("pingpong", 128, True),
                        ("ws_overlap", 128, True), ("ws_persistent", 128, True), ("ws_intra", 128, True),
                        ("ws_intra_kv", 128, True), ("ws_intra_qs", 128, True), ("ws_intra_qs", 128, False),
                        ("ws_intra_qs", 256, False), ("ws_intra_lpt", 128, True), ("ws_intra_persistent", 128, False),
                        ("ws_intra_bulk_o", 128, True), ("ws_tma_q", 128, True), ("ws_tma_q", 128, False),
                        ("ws_tma_q_rows", 128, True), ("ws_tma_q_early", 128, True), ("ws_tma_q_wide", 64, True),
                        ("ws_tma_q_wide", 64, False)):
    # (ws_intra_qs: 128 keys causal, 176 without a mask; D256. ws_intra_persistent causal spills 40 bytes: its card)
    res[f"{name}-D{D}" + ("-causal" if causal else "")] = record(name, D, causal)
# the option uniform=True (the warp index broadcast by shfl.sync) on the two phases that expose it; where it is the
# phase's default (ws_overlap), the kernel compiled above with the default parameters is that one
from numba_attn.phases.registry import get_phase
for name, D, causal in (("warp_specialized_tc", 128, True), ("ws_overlap", 128, True)):
    key = f"{name}-D{D}" + ("-causal" if causal else "")
    same = get_phase(name).params.get("uniform") is True and key in res
    res[key + "-uniform"] = res[key] if same else record(name, D, causal, {"uniform": True})
# three warpgroups (384 threads): the block size as launch bounds; the registers fit 65536 / 384 (one
# configuration, 128-key tiles: 64-key ones get the same bound and differ only in the tile constants). Two: no bound
for wg, bc, st in ((3, 128, 2), (2, 64, 3)):
    rec = off.compile_phase("tc_wgmma", Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float16",
                                                causal=True), {"warpgroups": wg, "Bc": bc, "stages": st})[0]
    ptx = rec.pop("ptx")
    rec["maxntid"] = [ln.split(None, 1)[1].strip() for ln in ptx.splitlines() if ln.startswith(".maxntid")]
    res[f"tc_wgmma-wg{wg}-bc{bc}-st{st}"] = rec
# tc_wgmma_varlen at D=128 causal (three warpgroups, 168 registers): the ring stage recomputed, no spill
from numba_attn.spec.problem import VarlenProblem
rec = off.compile_phase("tc_wgmma_varlen", VarlenProblem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float16",
                                                         causal=True))[0]
rec.pop("ptx")
res["varlen-tc_wgmma_varlen-D128-causal"] = rec
print("JSON" + json.dumps(res))
"""


@functools.cache
def _offline_tma_results():
    return offline_json(_OFFLINE)


def test_offline_tma_phases_assemble_without_spills():
    """tma_wgmma, warp_specialized_tc, pingpong, ws_overlap, ws_persistent and the ws_intra family at D=128 fp16
    (default parameters; causal only but tma_wgmma, warp_specialized_tc, ws_intra_persistent and ws_intra_qs, which
    also runs its 176-key tiles and D256) compile for sm_90a and
    assemble with no spills; the loads are TMA (no cp.async of 16
    bytes), no call, one bar.sync (after the barriers' initialisation) and no named barrier but in pingpong and
    ws_intra_qs (a warpgroup's, after its Q tile is stored);
    the producer/consumer kernels move registers."""
    res = {k: v for k, v in _offline_tma_results().items() if not k.startswith(("tc_wgmma-", "varlen-"))}
    for key, rec in res.items():
        assert rec["regs"] is not None and rec.get("spill_stores", 0) == 0, (key, rec)
        ops = set(rec["ops"])
        assert "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ops, key
        assert {"mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                "mbarrier.arrive.shared::cta.b64"} <= ops, key
        assert not any(op.startswith(("cp.async.cg", "cp.async.ca", "call")) for op in ops), (key, ops)
        if key.startswith(("warp_specialized_tc", "pingpong", "ws_overlap", "ws_persistent", "ws_intra",
                           "ws_tma_q")):
            assert {"setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32"} <= ops, key
        if key.startswith(("ws_intra_qs", "ws_intra_bulk_o")):  # one named barrier a warpgroup (128 threads): its
            assert "bar.arrive" not in ops and {b[2] for b in rec["bars"]} == {128}, (key, rec["bars"])  # Q or O tile
        elif not key.startswith("pingpong"):  # no named barrier but the block barrier
            assert "bar.arrive" not in ops and rec["bars"] == [], (key, rec["bars"])
        if rec.get("lto"):  # linked as numba links it: ptxas keeps setmaxnreg and serializes no wgmma
            assert rec["notes"] == [], (key, rec["notes"])


def test_offline_uniform_option_assembles_without_spills():
    """warp_specialized_tc and ws_overlap with uniform=True (D=128 causal: the most registers): the warp
    index comes from shfl.sync (idx, lane 0); no spills, no ptxas note (setmaxnreg kept, no serialized wgmma)
    (the TMA, mbarrier and register checks of test_offline_tma_phases_assemble_without_spills cover them too)."""
    res = _offline_tma_results()
    for key in ("warp_specialized_tc-D128-causal-uniform", "ws_overlap-D128-causal-uniform"):
        rec = res[key]
        assert rec["regs"] is not None and rec.get("spill_stores", 0) == 0 and rec.get("spill_loads", 0) == 0, (key, rec)
        assert any(op.startswith("shfl.sync.idx") for op in rec["ops"]), (key, rec["ops"])
        if rec.get("lto"):
            assert rec["notes"] == [], (key, rec["notes"])


def test_offline_pingpong_named_barriers():
    """pingpong at D=128 causal (the most registers): the turns are bar.sync / bar.arrive on
    named barriers 1 and 2 with 256 threads (both consumers), and it assembles without spills."""
    res = _offline_tma_results()
    for key in ("pingpong-D128-causal",):
        rec = res[key]
        assert rec["regs"] is not None and rec.get("spill_stores", 0) == 0, (key, rec)
        assert {"bar.arrive", "bar.sync"} <= set(rec["ops"]), key
        bars = {tuple(b) for b in rec["bars"]}
        assert {("bar.sync", 1, 256), ("bar.sync", 2, 256), ("bar.arrive", 1, 256), ("bar.arrive", 2, 256)} <= bars, \
            (key, bars)
        assert {b[1] for b in bars} <= {1, 2, None} and {b[2] for b in bars} == {256}, (key, bars)


def test_offline_three_warpgroups_carry_launch_bounds():
    """tc_wgmma with 3 warpgroups compiles with the block size as launch bounds and fits 65536 registers
    per block (on an H200, 190 and 233 registers a thread did not launch: supports() accepted them); at 2
    warpgroups no bound is set."""
    res = _offline_tma_results()
    for key in ("tc_wgmma-wg3-bc128-st2",):
        assert res[key]["maxntid"] == ["384, 1, 1"], (key, res[key])
        assert res[key]["regs"] * 384 <= 65536, (key, res[key])
    assert res["tc_wgmma-wg2-bc64-st3"]["maxntid"] == []


def test_offline_varlen_d128_causal_without_spills():
    """tc_wgmma_varlen at D=128 causal fp16 (three warpgroups: at most 168 registers a thread) assembles
    without spills and without a ptxas note: its ring stage is recomputed from the tile index, not carried
    from tile to tile (carried, 24 bytes of spills)."""
    rec = _offline_tma_results()["varlen-tc_wgmma_varlen-D128-causal"]
    assert rec["regs"] is not None and rec["regs"] <= 168, rec
    assert rec.get("spill_stores", 0) == 0 and rec.get("spill_loads", 0) == 0, rec
    assert rec["notes"] == [], rec["notes"]


# -- GPU only ---------------------------------------------------------------------


GPU_CASES = [
    ("tc_mma", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16", causal=True)),
    ("tc_mma", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16")),
    ("tc_pipelined", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16", causal=True)),
    ("tc_pipelined", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16", causal=True)),
    ("tc_pipelined", Problem(batch=1, heads=8, kv_heads=2, q_len=640, head_dim=64, dtype="float16")),
    ("tc_pipelined-MT2", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16",
                                 causal=True)),
    ("tc_tf32", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, causal=True)),
    ("tc_tf32", Problem(batch=1, heads=4, q_len=777, head_dim=128)),
    ("tc_wgmma", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16", causal=True)),
    ("tc_wgmma", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16", causal=True)),
    ("tc_wgmma", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128, dtype="float16")),
    ("tc_wgmma_overlap", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16",
                                 causal=True)),
    ("tc_wgmma_overlap", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128,
                                 dtype="bfloat16")),
    ("tma_wgmma", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16", causal=True)),
    ("tma_wgmma", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16", causal=True)),
    ("tma_wgmma", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128, dtype="float16")),
    ("tma_wgmma", Problem(batch=1, heads=2, q_len=300, kv_len=333, head_dim=96, dtype="float16")),
    ("warp_specialized_tc", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16",
                                    causal=True)),
    ("warp_specialized_tc", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16", causal=True)),
    ("warp_specialized_tc", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128,
                                    dtype="float16")),
    ("pingpong", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16", causal=True)),
    ("pingpong", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16", causal=True)),
    ("pingpong", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128, dtype="float16")),
    # uniform=True (off by default): the warp index broadcast from lane 0
    ("warp_specialized_tc-uniform", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64,
                                            dtype="float16", causal=True)),
    ("warp_specialized_tc-uniform", Problem(batch=1, heads=4, q_len=777, head_dim=128, dtype="bfloat16",
                                            causal=True)),
    ("ws_overlap-uniform", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16",
                                   causal=True)),
    ("ws_overlap-uniform", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128,
                                   dtype="float16")),
    # persistent blocks: one per SM over 512 items (about 4 each), and 7 blocks (-b7) over 24 and 40 items
    ("ws_persistent", Problem(batch=2, heads=16, kv_heads=4, q_len=2000, kv_len=2100, head_dim=128,
                              dtype="bfloat16", causal=True)),
    ("ws_persistent-b7", Problem(batch=2, heads=3, q_len=1000, kv_len=1300, head_dim=64, dtype="float16",
                                 causal=True)),
    ("ws_persistent-b7", Problem(batch=1, heads=8, kv_heads=2, q_len=640, kv_len=901, head_dim=128,
                                 dtype="float16")),
]


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("name,problem", GPU_CASES, ids=[f"{n}-{p.label.replace(' ', '_')}" for n, p in GPU_CASES])
def test_phase_gpu_shapes(name, problem):
    params = {}
    if name.endswith("-MT2"):
        name, params = name[:-4], {"m_tiles": 2}
    if name.endswith("-uniform"):
        name, params = name[:-8], {"uniform": True}
    if name.endswith("-b7"):
        name, params = name[:-3], {"blocks": 7}
    for seed in (1, 2):
        c, launch = run_phase(name, problem, seed=seed, **params)
        assert c.ok, c.reason
    kern = launch.kernels[0]
    for sig, ov in kern.overloads.items():
        assert ov.local_mem_per_thread == 0, "fragments spilled to local memory"
        sass = kern.inspect_sass(sig)
        assert ("HGMMA" if "wgmma" in name or name in ("warp_specialized_tc", "pingpong", "ws_overlap",
                                                      "ws_persistent") else "HMMA") in sass
        if name in ("warp_specialized_tc", "pingpong"):  # whether numba's link step keeps setmaxnreg: for the notes
            print(name, problem.label, "registers at entry:", ov.regs_per_thread,
                  "USETMAXREG in the SASS:", "USETMAXREG" in sass)
        if name == "pingpong":  # the turns: named barriers other than the block's (BAR.SYNC 0x0)
            assert "BAR.ARV" in sass, "no bar.arrive in the SASS"
        if name in ("tma_wgmma", "warp_specialized_tc", "pingpong", "ws_overlap", "ws_persistent"):
            assert "UTMALDG" in sass and "LDGSTS" not in sass
        elif name != "tc_mma":
            assert "LDGSTS" in sass
        if name == "tc_pipelined":
            assert "LDSM" in sass


@pytest.mark.full  # (a kernel compiled and assembled offline: 12 s of the quick tier)
def test_offline_sass_counts_of_a_wgmma_kernel():
    """``python -m numba_attn.measure.offline PHASE --sass``: the static SASS counts of the linked kernel
    (nvdisasm), here warp_specialized_tc at D=128 with its default 128-key tiles: its 16 HGMMA (8 of Q·Kᵀ, 8 of
    P·V) and register copies counted apart (``IMAD.MOV``)."""
    res = offline_json(
        "import json\n"
        "import numba_attn.measure.offline as off\n"
        "from numba_attn.spec.problem import Problem\n"
        "if off.nvdisasm_path() is None:\n"
        "    print('JSON null')\n"
        "else:\n"
        "    rec = off.compile_phase('warp_specialized_tc', Problem(batch=1, heads=32, q_len=4096, head_dim=128,"
        " dtype='float16'), keep_cubin=True)[0]\n"
        "    print('JSON' + json.dumps(off.sass_counts(rec['cubin'])))\n")
    if res is None:
        pytest.skip("no nvdisasm (CUDA toolkit or Triton)")
    assert res["HGMMA"] == 16 and 0 < res["IMAD.MOV"] < res["IMAD"]


def test_bulk_copies_of_o_refuse_rows_off_16_byte_boundaries():
    """ws_intra_bulk_o's output rows are bulk-copy targets: contiguous and 16-byte aligned, else a ValueError naming
    o (a strided output would be written out of place on the GPU)."""
    from numba_attn.phases.tensor_core.kernel import check_bulk_rows

    check_bulk_rows(np.zeros((2, 5, 4), np.uint32))  # rows of 16 bytes
    check_bulk_rows(cuda.to_device(np.zeros((2, 5, 4), np.uint32)))  # a device array (no itemsize of its own)
    with pytest.raises(ValueError, match="^o: "):
        check_bulk_rows(np.zeros((2, 5, 3), np.uint32))  # rows of 12 bytes
    with pytest.raises(ValueError, match="^o: "):
        check_bulk_rows(np.zeros((2, 4, 5), np.uint32).transpose(0, 2, 1))  # not contiguous along a row
