"""Every head dim a model uses: supports() is exactly what runs.

* the walk: every phase × head_dim 8..256 (step 8) × causal × dtype × GQA through
  ``supports()`` (default and simulator parameters): it never raises, every
  refusal has a reason, and the tensor-core phases accept every multiple of 8
  from 32 to 256 (no launch: cheap);
* in the simulator, a sample of the accepted configurations on tiny shapes
  against the float64 reference: always head_dim 40, 80, 96, 160 and 256 for the
  tensor-core phases (40, 80 and 96 for pingpong and ws_overlap, which stop at 128; 40, 96 and 160 for ws_intra,
  ws_intra_kv, ws_intra_lpt and ws_intra_bulk_o, which stop at 224, and ws_tma_q, ws_tma_q_rows and ws_tma_q_early
  at 160; 40, 160
  and 256 for ws_intra_qs), each with one query head (a GQA group changes the KV head index, not the head dim's
  path: the random draws and tests/test_phases.py run GQA), plus a few drawn at random (the seed is printed; set
  ``NUMBA_ATTN_HEAD_DIM_SEED`` to replay a draw);
* on a GPU (``-m gpu``), head_dim 32 … 256 for every phase × causal × dtype × GQA
  that supports() accepts, on small odd shapes.
"""
import os
import random

import pytest

from numba_attn import Problem, list_phases
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure

PHASES = list_phases()
DTYPES = ("float32", "float16", "bfloat16")
HEAD_DIMS = tuple(range(8, 257, 8))
TENSOR_CORE = ("tc_mma", "tc_pipelined", "tc_tf32", "tc_wgmma", "tc_wgmma_overlap", "tma_wgmma", "warp_specialized_tc",
               "decode_mma")
ALWAYS = (40, 80, 96, 160, 256)  # launched for every tensor-core phase in the simulator
TWO_CONSUMERS = ("pingpong", "ws_overlap")  # up to head_dim 128: the odd head dims models use below it
ALWAYS_TWO = (40, 80, 96)
UP_TO_224 = ("ws_intra", "ws_intra_kv", "ws_intra_lpt", "ws_intra_bulk_o", "ws_tma_q",
             "ws_tma_q_rows", "ws_tma_q_early")  # the held P beside S, O: to D224 (the persistent ones to D160)
ALWAYS_224 = (40, 96, 160)
Q_SHARED = ("ws_intra_qs",)  # Q in shared memory: two consumers up to head_dim 256
ALWAYS_Q_SHARED = (40, 160, 256)
GPU_HEAD_DIMS = (32, 40, 64, 80, 96, 112, 128, 160, 192, 256)
CFG = RunConfig(seeds=(7,))


def problem(phase, D, causal, dtype, gqa, small=True):
    """A problem of ``phase``'s kind: tiny odd lengths (several 16-key tiles, a partial
    last one), one KV head (two query heads with ``gqa``)."""
    heads = 2 if gqa else 1
    if phase.kind == "decode":
        return Problem(batch=1, heads=heads, kv_heads=1, q_len=2 if causal else 1, kv_len=37 if small else 301,
                       head_dim=D, causal=causal, dtype=dtype)
    q_len, kv_len = (5, 21) if small else (77, 131)
    return Problem(batch=1, heads=heads, kv_heads=1, q_len=q_len, kv_len=kv_len if causal else kv_len - 2,
                   head_dim=D, causal=causal, dtype=dtype)


def _grid():
    for D in HEAD_DIMS:
        for causal in (False, True):
            for dtype in DTYPES:
                for gqa in (False, True):
                    yield D, causal, dtype, gqa


@pytest.mark.parametrize("phase", PHASES, ids=[p.name for p in PHASES])
def test_supports_walk(phase):
    """supports() never raises, and every refusal says why."""
    for params in ({}, phase.sim_params):
        for D, causal, dtype, gqa in _grid():
            prob = problem(phase, D, causal, dtype, gqa)
            reason = phase.supports(prob, **params)
            assert reason is None or (isinstance(reason, str) and reason.strip()), (phase.name, prob.label, reason)


@pytest.mark.parametrize("name", TENSOR_CORE)
def test_tensor_cores_accept_every_head_dim(name):
    """The tensor-core phases run every multiple of 8 from 32 to 256 (natively or padded)."""
    phase = next(p for p in PHASES if p.name == name)
    for D in range(32, 257, 8):
        for dtype in phase.dtypes:
            for causal in (False, True):
                prob = problem(phase, D, causal, dtype, gqa=True)
                assert phase.supports(prob) is None, (name, prob.label)


def sim_params(phase, prob):
    """The phase's simulator tiles, or its defaults where those tiles do not fit ``prob``
    (e.g. tc_tf32's 16-key fp32 tiles above head_dim 184)."""
    return phase.sim_params if phase.supports(prob, **phase.sim_params) is None else {}


def _accepted():
    out = []
    for phase in PHASES:
        for D, causal, dtype, gqa in _grid():
            prob = problem(phase, D, causal, dtype, gqa)
            if phase.supports(prob, **sim_params(phase, prob)) is None:
                out.append((phase, D, causal, dtype, gqa))
    return out


def _sample():
    seed = int(os.environ.get("NUMBA_ATTN_HEAD_DIM_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    accepted = _accepted()
    picked = []

    def one(name, D):  # causal and dtype drawn; one query head (half the blocks of a GQA pair)
        mine = [c for c in accepted if c[0].name == name and c[1] == D]
        return rng.choice([c for c in mine if not c[4]] or mine)

    for name in TENSOR_CORE:  # the head dims models use, on every tensor-core phase
        for D in ALWAYS:
            picked.append(one(name, D))
    for name in TWO_CONSUMERS:
        for D in ALWAYS_TWO:
            picked.append(one(name, D))
    for name in UP_TO_224:
        for D in ALWAYS_224:
            picked.append(one(name, D))
    for name in Q_SHARED:
        for D in ALWAYS_Q_SHARED:
            picked.append(one(name, D))
    others = [c for c in accepted if c not in picked and 24 <= c[1] <= 136]
    picked += rng.sample(others, 4)  # and a few anywhere else, changing from run to run
    return seed, picked


SEED, SAMPLE = _sample()


def _id(c):
    phase, D, causal, dtype, gqa = c
    return f"{phase.name}-D{D}-{dtype}{'-causal' if causal else ''}{'-gqa' if gqa else ''}"


@pytest.mark.simulator
@pytest.mark.parametrize("case", SAMPLE, ids=[_id(c) for c in SAMPLE])
def test_sampled_head_dims_match_reference(case):
    phase, D, causal, dtype, gqa = case
    prob = problem(phase, D, causal, dtype, gqa)
    row = measure(phase, prob, CFG, **sim_params(phase, prob))
    if row["status"] != "OK":  # the test fails either way; say whether the same case fails again
        again = measure(phase, prob, CFG, **sim_params(phase, prob))
        row["reason"] += f" (run again at once: {again['status']}{': ' + again['reason'] if again['reason'] else ''})"
    assert row["status"] == "OK", (f"{phase.name} on {prob.label} (NUMBA_ATTN_HEAD_DIM_SEED={SEED}): "
                                   f"{row['status']}: {row['reason']}")
    assert row["check"]["unwritten"] == 0


def test_sample_seed_is_printed(capsys):
    print(f"head-dim sample: NUMBA_ATTN_HEAD_DIM_SEED={SEED}")
    assert SAMPLE


def _gpu_cases():
    for phase in PHASES:
        for D in GPU_HEAD_DIMS:
            for causal in (False, True):
                for dtype in phase.dtypes:
                    for gqa in (False, True):
                        yield phase, D, causal, dtype, gqa


@pytest.mark.gpu
@pytest.mark.sweep
@pytest.mark.parametrize("phase", PHASES, ids=[p.name for p in PHASES])
def test_gpu_head_dims_match_reference(phase):
    """On the GPU, default parameters: every accepted (head_dim, causal, dtype, GQA) is correct."""
    cfg = RunConfig(seeds=(7,), time_kernels=False, peers=False)
    failures, ran = [], 0
    for _, D, causal, dtype, gqa in (c for c in _gpu_cases() if c[0] is phase):
        prob = problem(phase, D, causal, dtype, gqa, small=False)
        if phase.supports(prob) is not None:
            continue
        row = measure(phase, prob, cfg)
        ran += 1
        if row["status"] != "OK":
            failures.append(f"{prob.label}: {row['status']}: {row['reason']}")
    assert not failures, f"{phase.name}: {len(failures)} of {ran} failed:\n" + "\n".join(failures)
