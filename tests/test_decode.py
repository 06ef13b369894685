"""Decode phases (``decode_chunked``, ``decode_split_k``) and the split-K
machinery, in the simulator on tiny shapes: q_len 1 and q_len > 1 with
bottom-right causal alignment, grouped-query attention (one block reading a
KV head for its whole group, and a group split over several row blocks),
float16, uneven splits and splits that receive no key, the log-sum-exp
combine on its own, the lane-group reductions, and the split planner."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba import cuda, float32  # module globals: the simulator swaps `cuda` in a kernel's globals
from numba_attn import Problem, get_phase
from numba_attn.gpu.device_functions import NEG_BIG, combine_splits
from numba_attn.gpu.jit import kernel
from numba_attn.phases.decode.rules import decode_rows, keys_per_group, lanes_per_key, vector_width
from numba_attn.gpu.split_k import make_combine_kernel, split_plan
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure
from numba_attn.gpu.warp import group_sum, strided_max, strided_sum

DECODE = ("decode_chunked", "decode_split_k", "decode_split_k_fused", "decode_split_k_lean")


def _ok(phase, problem, seed=3, **params):
    row = measure(phase, problem, RunConfig(seeds=(seed,), time_kernels=False), **params)
    assert row["status"] == "OK", f"{phase} {problem.label} {params}: {row['status']} {row['reason']}"
    assert row["check"]["unwritten"] == 0
    return row


# -- end to end against the float64 reference ------------------------------------


@pytest.mark.parametrize("phase", DECODE)
def test_single_query_fp32(phase):
    _ok(phase, Problem(batch=2, heads=2, q_len=1, kv_len=45, head_dim=16), warps=2)


@pytest.mark.parametrize("phase", DECODE)
def test_speculative_causal_bottom_right_fp16(phase):
    # 5 new tokens against 26 keys: row i sees keys j <= i + 21; fewer keys than one warp step per warp
    _ok(phase, Problem(batch=1, heads=2, q_len=5, kv_len=26, head_dim=16, dtype="float16", causal=True),
        warps=2, seed=4)


@pytest.mark.parametrize("phase", DECODE)
def test_gqa_group_in_one_block(phase):
    # 4 query heads share one KV head; 2 queries each: 8 rows read one KV head in one block
    p = Problem(batch=1, heads=4, kv_heads=1, q_len=2, kv_len=37, head_dim=32, causal=True)
    assert decode_rows(p, 8) == 8
    _ok(phase, p, warps=2, rows=8, seed=5)


def test_gqa_group_over_row_blocks_fp16():
    # 3 query heads × 3 queries = 9 rows, 4 per block: 3 row blocks, the last one partial
    p = Problem(batch=2, heads=3, kv_heads=1, q_len=3, kv_len=29, head_dim=16, dtype="float16", causal=True)
    _ok("decode_chunked", p, warps=2, rows=4, seed=6)
    _ok("decode_split_k", p, warps=1, rows=4, splits=2, seed=6)


def test_more_lanes_per_key():
    # 4 lanes share a key (two xor-shuffle stages per score), 8 keys per warp step
    p = Problem(batch=1, heads=2, q_len=2, kv_len=41, head_dim=32, causal=True)
    assert (p.head_dim // vector_width(p.dtype)) % 4 == 0
    _ok("decode_chunked", p, warps=2, lanes=4, seed=8)


def test_split_k_uneven_and_empty_splits():
    # 45 keys, 4 splits of chunks rounded up to 16 keys (warps=1, 16 lane groups, 1 key each):
    # 16, 16, 13 and 0 keys; under the causal mask the q_len=3 rows see 43, 44, 45 keys
    p = Problem(batch=1, heads=2, q_len=3, kv_len=45, head_dim=16, causal=True)
    VW = vector_width(p.dtype)
    L = lanes_per_key(p.head_dim, VW, decode_rows(p, 8))
    assert keys_per_group(p.head_dim, L, decode_rows(p, 8), 1) == 1
    S, chunk = split_plan(2, p.kv_len, 32 // L, 132, 4, 256, splits=4)
    sizes = [max(0, min(p.kv_len, (s + 1) * chunk) - s * chunk) for s in range(S)]
    assert sum(sizes) == p.kv_len and 0 in sizes and len(set(sizes) - {0}) > 1, sizes
    _ok("decode_split_k", p, warps=1, splits=4, keys=1, seed=9)
    _ok("decode_split_k_fused", p, warps=1, splits=4, keys=1, seed=9)


def test_split_k_several_keys_per_group_partial_steps():
    # 2 keys per lane group per step (loads of both first, one softmax update): 61 keys over
    # 3 splits of 32 (the last empty), the second split ending inside a step; GQA (group 2 on one KV head), q_len 2
    p = Problem(batch=1, heads=2, kv_heads=1, q_len=2, kv_len=61, head_dim=16, dtype="float16", causal=True)
    launch = get_phase("decode_split_k").plan(p, warps=1, keys=2, splits=3)
    assert "T=2" in launch.notes and "S=3 splits of 32" in launch.notes, launch.notes
    _ok("decode_split_k", p, warps=1, keys=2, splits=3, seed=13)
    _ok("decode_chunked", p, warps=2, keys=3, seed=13)


def test_split_k_single_split_writes_output_directly():
    p = Problem(batch=1, heads=2, q_len=1, kv_len=33, head_dim=16, dtype="float16")
    launch = get_phase("decode_split_k").plan(p, warps=2, splits=1)
    assert len(launch.kernels) == 1 and launch.workspace_bytes == 0
    _ok("decode_split_k", p, warps=2, splits=1, seed=10)


def test_fused_combine_resets_its_counters():
    # the last block of each tile combines and resets the tile's counter: a second launch on
    # the same workspace must again combine exactly once per tile
    from numba_attn.spec.reference import reference

    p = Problem(batch=2, heads=2, kv_heads=1, q_len=2, kv_len=40, head_dim=16, causal=True)
    launch = get_phase("decode_split_k_fused").plan(p, warps=1, splits=3)
    q, k, v = p.inputs(14)
    ref = reference(q, k, v, causal=True, scale=p.sm_scale)
    B, H, Hkv, D = p.batch, p.heads, p.kv_heads, p.head_dim
    qd, kd, vd = (cuda.to_device(a) for a in (q, k, v))
    for _ in range(2):
        od = cuda.to_device(np.full(p.out_shape(), np.nan, np.float32))
        launch(qd.reshape(B * H, p.q_len, D), kd.reshape(B * Hkv, p.kv_len, D), vd.reshape(B * Hkv, p.kv_len, D),
               od.reshape(B * H, p.q_len, D), 0)
        out = od.copy_to_host()
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_supports_reasons():
    ph = get_phase("decode_chunked")
    assert "q_len" in ph.supports(Problem(q_len=9, kv_len=64, head_dim=16))
    assert "multiple of 8" in ph.supports(Problem(q_len=1, kv_len=64, head_dim=12, dtype="float16"))
    assert ph.supports(Problem(q_len=8, kv_len=64, head_dim=16, dtype="float16", causal=True)) is None
    assert "shared memory" in get_phase("decode_split_k").supports(
        Problem(q_len=8, kv_len=64, head_dim=256), warps=8, rows=8)


# -- the combine step on its own -------------------------------------------------


@kernel
def _combine_kernel(part_o, part_lse, out, S):
    row = cuda.blockIdx.x
    d = cuda.threadIdx.x
    out[row, d] = combine_splits(part_o, part_lse, S, row, d)


@pytest.mark.parametrize("S,fixed", [(5, False), (19, False), (5, True), (19, True)])
def test_combine_splits_matches_logsumexp(S, fixed):
    # 19 splits: two unrolled groups of 8 and a tail of 3, empty splits in both parts
    rng = np.random.default_rng(S)
    R, D = 3, 8
    lse = rng.normal(0, 3, (S, R)).astype(np.float32)
    lse[1, :] = NEG_BIG  # a split that saw no key
    lse[4, 0] = NEG_BIG
    if S > 16:
        lse[9, 2] = NEG_BIG
        lse[S - 1, 1] = NEG_BIG
    po = rng.standard_normal((S, R, D)).astype(np.float32)
    po[lse < -1e29] = 0.0
    out = np.zeros((R, D), np.float32)
    if fixed:  # the combine kernel compiled for its split count (all loads in flight at once)
        make_combine_kernel(1, False, S)[R, D](po, lse, out.reshape(R, 1, D), S)
    else:
        _combine_kernel[R, D](po, lse, out, S)
    w = np.where(lse < -1e29, 0.0, np.exp(lse.astype(np.float64) - lse.max(axis=0)))
    want = np.einsum("sr,srd->rd", w, po) / w.sum(axis=0)[:, None]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


# -- lane-group reductions ---------------------------------------------------------


@kernel
def _group_kernel(x, out):
    lane = cuda.threadIdx.x
    out[0, lane] = group_sum(x[lane], 4)
    out[1, lane] = strided_sum(x[lane], 4)
    out[2, lane] = strided_max(x[lane], 8)


def test_group_and_strided_reductions():
    x = np.arange(32, dtype=np.float32) * float32(1.5) - 7
    out = np.zeros((3, 32), np.float32)
    _group_kernel[1, 32](x, out)
    lanes = np.arange(32)
    np.testing.assert_array_equal(out[0], x.reshape(8, 4).sum(axis=1)[lanes // 4])
    np.testing.assert_array_equal(out[1], x.reshape(8, 4).sum(axis=0)[lanes % 4])
    np.testing.assert_array_equal(out[2], x.reshape(4, 8).max(axis=0)[lanes % 8])


# -- the split planner (no kernel) ---------------------------------------------------


def test_split_plan_fills_the_gpu_for_one_sequence():
    S, chunk = split_plan(32, 16384, 32, 132, 4, 256)
    assert S * 32 <= 132 * 4 < (S + 1) * 32  # as many splits as fit in one wave of block slots
    assert S * chunk >= 16384 and chunk % 32 == 0
    assert split_plan(1024, 16384, 32, 132, 4, 256)[0] == 1  # large batch: no split
    assert split_plan(32, 300, 32, 132, 4, 256)[0] == 2  # at least min_keys keys per split


@settings(max_examples=200, deadline=None)
@given(n_blocks=st.integers(1, 4096), kv_len=st.integers(1, 1 << 18), per_round=st.sampled_from([8, 16, 32, 64]),
       sms=st.integers(1, 200), per_sm=st.integers(1, 8), min_keys=st.integers(1, 2048))
def test_split_plan_covers_every_key_once(n_blocks, kv_len, per_round, sms, per_sm, min_keys):
    S, chunk = split_plan(n_blocks, kv_len, per_round, sms, per_sm, min_keys)
    assert S >= 1 and chunk % per_round == 0
    assert S * chunk >= kv_len  # every key has a split; splits are disjoint by construction
    assert (S - 1) * chunk < kv_len + per_round * S  # no more than rounding's worth of empty splits
    assert S <= max(1, math.ceil(kv_len / min_keys))


# -- split-K prefill (same planner and combine) ------------------------------------


def test_split_k_prefill_causal_rows_without_keys_in_a_split():
    # 40 keys in 6 splits of 8 (the last empty); under the causal mask row 0 sees 20 keys,
    # so splits 3 and 4 hold none of its keys; two query blocks, one partial
    p = Problem(batch=1, heads=2, q_len=21, kv_len=40, head_dim=16, causal=True)
    S, chunk = split_plan(4, p.kv_len, 8, 132, 4, 1024, splits=6)
    assert (S, chunk) == (6, 8)
    _ok("split_k_prefill", p, Br=16, Bc=8, splits=6, seed=11)


def test_split_k_prefill_gqa_fp16_auto_splits():
    # few query blocks and a long KV range: the planner splits on its own
    p = Problem(batch=1, heads=2, kv_heads=1, q_len=5, kv_len=70, head_dim=16, dtype="float16")
    launch = get_phase("split_k_prefill").plan(p, Br=16, Bc=16, min_keys=16)
    assert "S=5" in launch.notes and len(launch.kernels) == 2
    _ok("split_k_prefill", p, Br=16, Bc=16, min_keys=16, seed=12)


# -- decode_split_k_lean: the reduce-scatter of the scores ----------------------------


def test_lean_reduce_scatter_then_xor_stages_and_combine_kernel():
    # 16 lanes per key, 2 rows x 1 key per group: one reduce-scatter stage (2 values),
    # then three plain xor stages; S x rows > fuse_max: the combine runs as a second kernel (a GQA group of 2 on
    # one KV head: its 2 rows)
    from numba_attn.phases.decode.p33_decode_split_k_lean import score_plan

    p = Problem(batch=1, heads=2, kv_heads=1, q_len=1, kv_len=50, head_dim=64)
    assert score_plan(16, 2, 1) == (2, 1, 1)
    launch = get_phase("decode_split_k_lean").plan(p, warps=1, lanes=16, keys=1, splits=3, fuse_max=0)
    assert len(launch.kernels) == 2 and "combine kernel" in launch.notes, launch.notes
    _ok("decode_split_k_lean", p, warps=1, lanes=16, keys=1, splits=3, fuse_max=0, seed=15)


def test_lean_full_reduce_scatter_fp16_causal_fused():
    # 8 lanes per key, 4 rows x 2 keys = 8 values: three reduce-scatter stages, no plain
    # stage; q_len 2 causal over a 2-head group (on one KV head); last-block combine
    from numba_attn.phases.decode.p33_decode_split_k_lean import score_plan

    p = Problem(batch=1, heads=2, kv_heads=1, q_len=2, kv_len=45, head_dim=64, dtype="float16", causal=True)
    assert score_plan(8, 4, 2) == (8, 3, 1)
    launch = get_phase("decode_split_k_lean").plan(p, warps=1, lanes=8, keys=2, splits=2)
    assert len(launch.kernels) == 1 and "combine fused" in launch.notes, launch.notes
    _ok("decode_split_k_lean", p, warps=1, lanes=8, keys=2, splits=2, seed=16)


# -- decode_mma: the rows of a KV head as one tensor-core tile ----------------------------


def test_decode_mma_gqa_uneven_and_empty_splits():
    # 4 query heads on one KV head, q_len 2: 8 rows of the m16 tile; 5 forced splits of 32 keys
    # over 61 keys: splits 2-4 receive no key; each warp streams its own 16-key tiles
    p = Problem(batch=1, heads=4, kv_heads=1, q_len=2, kv_len=61, head_dim=32, dtype="float16")
    launch = get_phase("decode_mma").plan(p, warps=2, Bc=16, stages=2, splits=5)
    assert len(launch.kernels) == 2 and "S=5" in launch.notes, launch.notes
    _ok("decode_mma", p, warps=2, Bc=16, stages=2, splits=5, seed=17)
    # the same with the last block of the KV head combining (fuse_max: 5 splits × 8 rows ≤ 64)
    launch = get_phase("decode_mma").plan(p, warps=2, Bc=16, stages=2, splits=5, fuse_max=64)
    assert len(launch.kernels) == 1 and "combine fused" in launch.notes, launch.notes
    _ok("decode_mma", p, warps=2, Bc=16, stages=2, splits=5, fuse_max=64, seed=19)


def test_decode_mma_causal_full_tile_one_split():
    # 16 rows (group 4 × q_len 4, causal bottom-right): a full m16 tile, S = 1 writes the output directly (two
    # sequences of one KV head)
    p = Problem(batch=2, heads=4, kv_heads=1, q_len=4, kv_len=53, head_dim=16, dtype="float16", causal=True)
    launch = get_phase("decode_mma").plan(p, warps=1, Bc=16, stages=3, splits=1)
    assert len(launch.kernels) == 1
    _ok("decode_mma", p, warps=1, Bc=16, stages=3, splits=1, seed=18)


@pytest.mark.parametrize("phase,params", [
    ("decode_mma", dict(warps=2, Bc=16, stages=2, splits=3)),  # the combine kernel (compiled for 3 splits)
    ("decode_mma", dict(warps=1, Bc=16, stages=2, splits=1)),  # one split writes the output
    ("decode_split_k_lean", dict(warps=2, splits=3)),  # the last block combines
    ("decode_split_k_lean", dict(warps=2, splits=3, fuse_max=0)),  # the combine kernel
    ("decode_split_k_lean", dict(warps=1, splits=1)),  # one split writes the output
])
def test_bfloat16(phase, params):
    # GQA group 4 × q_len 2 (causal), bfloat16 q/k/v/o: bf16 mma.sync or bf16 words unpacked by shifts
    p = Problem(batch=1, heads=4, kv_heads=1, q_len=2, kv_len=45, head_dim=32, dtype="bfloat16", causal=True)
    _ok(phase, p, seed=21, **params)


def test_decode_mma_supports():
    ph = get_phase("decode_mma")
    assert "float16" in ph.supports(Problem(q_len=1, kv_len=64, head_dim=32))  # fp32 storage
    assert "16" in ph.supports(Problem(heads=32, kv_heads=1, q_len=1, kv_len=64, head_dim=32, dtype="float16"))
    assert ph.supports(Problem(heads=32, kv_heads=8, q_len=1, kv_len=64, head_dim=128, dtype="float16")) is None


# -- automatic parameters: resolved once, recorded --------------------------------


@pytest.mark.parametrize("phase", DECODE + ("decode_mma",))
def test_automatic_parameters_resolved(phase):
    p = Problem(batch=1, heads=4, kv_heads=1, q_len=1, kv_len=300, head_dim=16, dtype="float16")
    ph = get_phase(phase)
    params = ph.resolve(p)
    for name in ("lanes", "keys", "splits"):
        if name in params:
            assert params[name] > 0, (name, params)
    if "rows" in params:
        assert params["rows"] == min(4, p.group * p.q_len)
    assert ph.resolve(p, params) == params  # idempotent: concrete values pass through
    launch = ph.plan(p, **ph.sim_params)
    assert all(launch.params[k] > 0 for k in ("lanes", "keys", "splits") if k in launch.params)
