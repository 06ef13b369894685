"""Decode over a paged KV cache (issue 18): ``decode_paged`` and the paged phases against
the float64 paged reference, in the simulator, on tiny shapes: block tables with repeated and
out-of-order pages, a page partly filled, a length-0 sequence, GQA, causal q_len 2-4, fp8 e4m3
and int8 caches (bit-exact dequantization) on both paged phases, bfloat16 queries and caches, and
input checks."""
from dataclasses import replace

import numpy as np
import pytest

import numba_attn as na
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure
from numba_attn.phases.registry import get_phase
from numba_attn.spec.errors import AttentionInputError
from numba_attn.spec.paged import dequantize, fp8_e4m3_decode, paged_reference
from numba_attn.spec.problem import PagedProblem, Problem
from numba_attn.gpu.jit import kernel
from numba_attn.phases.decode.kv8 import E4M3_UNIT, e4m3x4_f16x2, e4m3x4_f32, int8x4_f32
from numba import cuda  # noqa: E402  (after numba_attn: the backend is chosen first)

ml_dtypes = pytest.importorskip("ml_dtypes")

ALL_PAGED = [p.name for p in na.list_phases() if p.layout == "paged"]
PAGED = [p for p in ALL_PAGED if p != "paged_mma8"]  # (paged_mma8: 8-bit caches, head_dim a multiple of 64: below)
SIM = {name: get_phase(name).sim_params for name in ALL_PAGED}


def _caches(rng, nb, P, Hkv, D, kv_dtype="", dtype=np.float16):
    x = [rng.standard_normal((nb, P, Hkv, D), dtype=np.float32) for _ in range(2)]
    if kv_dtype == "float8_e4m3":
        return [(a * 40).astype(ml_dtypes.float8_e4m3fn) for a in x]
    if kv_dtype == "int8":
        return [np.clip(np.rint(a * 30), -127, 127).astype(np.int8) for a in x]
    return [a.astype(dtype) for a in x]


def _scales(rng, kind, NB, P, Hkv):
    shape = {"tensor": (), "head": (Hkv,), "token": (NB, P, Hkv)}[kind]
    return (np.asarray(rng.uniform(0.02, 0.04, shape), np.float32),
            np.asarray(rng.uniform(0.02, 0.04, shape), np.float32))


def _run(phase, q, kc, vc, table, lens, causal=False, kv_dtype="", ks=None, vs=None, **params):
    out = na.decode_paged(q, kc, vc, table, lens, causal=causal, k_scale=ks, v_scale=vs, phase=phase,
                          **{**SIM[phase], **params})
    ref = paged_reference(q, kc, vc, table, lens, causal=causal, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    assert out.shape == q.shape and out.dtype == q.dtype
    c = na.check(out, ref, dtype="bfloat16" if q.dtype == ml_dtypes.bfloat16 else "float16")
    assert c.ok, c.reason
    return out, ref


# -- 8-bit formats ---------------------------------------------------------------------------

def test_fp8_e4m3_model_is_bit_exact():
    codes = np.arange(256, dtype=np.uint8)
    ours = fp8_e4m3_decode(codes)
    theirs = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    ok = ~np.isnan(theirs)
    assert np.array_equal(ours[ok].view(np.uint32), theirs[ok].view(np.uint32))  # -0.0 included


def test_int8_mma_decoding_is_exact():
    """paged_mma8's int8 decoding (host model of its ``prmt``s): every code c in every byte position
    gives f16 1152 + c for K (the bias left in, the scores start from −1152·Σq) and, for V, the pairs of
    two keys' codes per dim, 1152 + c before the exact f16 subtraction of 1152."""
    from numba_attn.gpu.intrinsics import byte_perm_reference as prmt

    codes = np.arange(-128, 128, dtype=np.int8)
    rng = np.random.default_rng(4)
    words = np.concatenate([codes.view(np.uint32)] + [rng.permutation(codes).view(np.uint32) for _ in range(3)])
    sign, hi = 0x80808080, 0x64646464

    def f16(w):
        return np.array([w], np.uint32).view(np.float16).astype(np.float64)

    for x in words:
        c = np.array([x], np.uint32).view(np.int8).astype(np.float64)
        y = int(x) ^ sign
        assert list(f16(prmt(y, hi, 0x4240))) == [1152 + c[0], 1152 + c[2]]
        assert list(f16(prmt(y, hi, 0x4341))) == [1152 + c[1], 1152 + c[3]]
    for a, b in zip(words, words[::-1]):
        ca, cb = (np.array([w], np.uint32).view(np.int8).astype(np.float64) for w in (a, b))
        ya = int(a) ^ sign
        for lo, (s0, s1, sb) in ((True, (0x5450, 0x7651, 0x4140)), (False, (0x5452, 0x7653, 0x4342))):
            yb = prmt(int(b) ^ sign, hi, sb)
            d = 0 if lo else 2
            assert list(f16(prmt(ya, yb, s0))) == [1152 + ca[d], 1152 + cb[d]]
            assert list(f16(prmt(ya, yb, s1))) == [1152 + ca[d + 1], 1152 + cb[d + 1]]


def test_device_dequantization_is_bit_exact():
    """Every code in every byte position of a word: e4m3 (four integer instructions to f16 pairs,
    then float32; the values / 256, NaN codes NaN) and int8 (the byte in the mantissa of 2^23)."""
    @kernel
    def decode_all(words, fp8, f16, i8):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < words.size:
            w = words[i]
            fp8[4 * i], fp8[4 * i + 1], fp8[4 * i + 2], fp8[4 * i + 3] = e4m3x4_f32(w)
            f16[2 * i], f16[2 * i + 1] = e4m3x4_f16x2(w)
            i8[4 * i], i8[4 * i + 1], i8[4 * i + 2], i8[4 * i + 3] = int8x4_f32(w)

    rng = np.random.default_rng(3)
    codes = np.concatenate([np.arange(256, dtype=np.uint8)] + [rng.permutation(256).astype(np.uint8)
                                                               for _ in range(3)])  # each code at each position
    words = codes.view(np.uint32)
    fp8, i8 = np.zeros(codes.size, np.float32), np.zeros(codes.size, np.float32)
    f16 = np.zeros(words.size * 2, np.uint32)
    decode_all[4, 64](words, fp8, f16, i8)
    model = fp8_e4m3_decode(codes)
    nan = np.isnan(model)
    assert np.array_equal(np.isnan(fp8), nan)
    assert np.array_equal((fp8[~nan] * float(E4M3_UNIT)).view(np.uint32), model[~nan].view(np.uint32))
    halves = f16.view(np.float16).astype(np.float32) * float(E4M3_UNIT)  # (NaN codes come out finite here)
    assert np.array_equal(halves[~nan].view(np.uint32), model[~nan].view(np.uint32))
    assert np.array_equal(i8, codes.view(np.int8).astype(np.float32))


@pytest.mark.parametrize("phase,params,where", [(p, {}, w) for p in PAGED for w in "vk"] + [
    (p, {"splits": 1}, "k") for p in PAGED if "splits" in SIM[p]] + [  # one split: the block writes o = acc / l
    ("paged_worklist", {"workers": 1}, "k")] + [  # one worker: a block walks both sequences
    ("paged_split_k", {"wide": True}, "v"), ("paged_split_k", {"wide": True}, "k"),  # wide: NaN tests per load
    ("paged_mma8", {}, "v"), ("paged_mma8", {}, "k")])  # paged_mma8: NaN from the conversion
def test_nan_in_an_fp8_cache_propagates(phase, params, where):
    """A NaN code (0x7F) in one key or value of an fp8 cache makes that sequence's output NaN (both
    phases, both dequantization paths, one split or several: a NaN row sum is not an empty
    sequence's zero), and the other sequence stays finite and correct."""
    rng = np.random.default_rng(12)
    B, H, Hkv, D, P = 2, 2, 1, 64 if phase == "paged_mma8" else 16, 16  # (paged_mma8: D a multiple of 64)
    x = rng.standard_normal((3, P, Hkv, D)).astype(np.float32)
    kc = np.clip(x * 20, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    vc = np.clip(rng.standard_normal(x.shape) * 20, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    (vc if where == "v" else kc).view(np.uint8)[1, 3, 0, 5] = 0x7F  # page 1 belongs to sequence 0 only
    table = np.array([[0, 1], [2, 2]], np.int32)
    lens = np.array([30, 12], np.int32)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float16)
    out = na.decode_paged(q, kc, vc, table, lens, k_scale=0.05, v_scale=0.05, phase=phase,
                          **{**SIM[phase], **params})
    assert np.isnan(out[0]).any() and not np.isnan(out[1]).any()
    ref = paged_reference(q[1:], kc, vc, table[1:], lens[1:], kv_dtype="float8_e4m3", k_scale=0.05, v_scale=0.05)
    c = na.check(out[1:], ref, dtype="float16")
    assert c.ok, c.reason


# -- the phases against the reference ----------------------------------------------------------

@pytest.mark.parametrize("phase", PAGED)
def test_repeated_out_of_order_pages_partial_page_and_empty_sequence(phase):
    """Four sequences over 5 pages of 16: out of order, a page shared by two sequences
    (and repeated within one), a partly filled last page, a sequence of length 0 (zeros); GQA group 2 on one KV
    head."""
    rng = np.random.default_rng(1)
    B, H, Hkv, D, P = 4, 2, 1, 16, 16
    kc, vc = _caches(rng, 5, P, Hkv, D)
    table = np.array([[3, 0, 4], [4, 1, 4], [2, 0, 0], [0, 0, 0]], np.int32)
    lens = np.array([40, 37, 9, 0], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    out, _ = _run(phase, q, kc, vc, table, lens)
    assert not out[3].any()  # the empty sequence: zeros


@pytest.mark.parametrize("phase", PAGED)
def test_bfloat16_query_and_cache(phase):
    """bfloat16 q, caches and output (bf16 mma.sync / bf16 words unpacked by shifts), checked at
    bfloat16's tolerance: GQA group 2 (on one KV head), pages out of order and repeated, a partly filled page, a
    length-0 sequence."""
    rng = np.random.default_rng(8)
    B, H, Hkv, D, P = 3, 2, 1, 32, 16
    kc, vc = _caches(rng, 5, P, Hkv, D, dtype=ml_dtypes.bfloat16)
    table = np.array([[3, 0, 3], [4, 1, 2], [0, 0, 0]], np.int32)
    lens = np.array([41, 20, 0], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(ml_dtypes.bfloat16)
    out, _ = _run(phase, q, kc, vc, table, lens)
    assert not out[2].astype(np.float32).any()


@pytest.mark.parametrize("phase,params,P", [
    ("paged_split_k", {"lanes": 2, "keys": 1}, 32),  # a page holds a warp step (16 keys): one index per step
    ("paged_split_k", {"lanes": 1, "keys": 2}, 16),  # a step of 64 keys spans 4 pages: one index per key
    ("paged_mma", {"Bc": 32}, 16),  # a 32-key tile spans two pages: one index per row
    ("paged_mma", {"Bc": 16}, 64),  # 4 tiles per page
    ("paged_split_k", {}, 256),  # the largest page: both sequences in one page each
])
def test_page_smaller_or_larger_than_a_tile(phase, params, P):
    rng = np.random.default_rng(5)
    B, H, Hkv, D = 2, 2, 1, 16
    nb = -(-150 // P) + 1
    kc, vc = _caches(rng, nb, P, Hkv, D)
    table = np.stack([rng.permutation(nb)[: -(-150 // P)] for _ in range(B)]).astype(np.int32)  # shared pages
    lens = np.array([150, 77], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    _run(phase, q, kc, vc, table, lens, **params)


@pytest.mark.parametrize("phase", PAGED)
def test_gqa_causal_speculative(phase):
    """GQA (group 2, on one KV head) with q_len 3, causal (the queries are the sequences' last positions), D 32,
    P 32."""
    rng = np.random.default_rng(2)
    B, H, Hkv, Nq, D, P = 2, 2, 1, 3, 32, 32
    kc, vc = _caches(rng, 4, P, Hkv, D)
    table = np.array([[2, 0], [1, 3]], np.int32)
    lens = np.array([45, 3], np.int32)
    q = rng.standard_normal((B, Nq, H, D), dtype=np.float32).astype(np.float16)
    _run(phase, q, kc, vc, table, lens, causal=True)


@pytest.mark.parametrize("phase", PAGED)
@pytest.mark.parametrize("kv_dtype,scale", [("float8_e4m3", "head"), ("int8", "head"), ("int8", "token")])
def test_8bit_caches(phase, kv_dtype, scale):
    """fp8/int8 caches against the reference on the dequantized cache (float16's tolerance),
    and against the 16-bit cache of the same values (quantization error only). (A scalar scale runs the per-head
    kernel on a (1, Hkv) array of one value, ``paged_scales``: test_nan_in_an_fp8_cache_propagates passes one to
    every phase, test_8bit_paged_mma_pages and test_wide_8bit_paged_split_k too.)"""
    rng = np.random.default_rng(3)
    B, H, Hkv, D, P, NB = 2, 2, 2, 16, 16, 4
    kc, vc = _caches(rng, NB, P, Hkv, D, kv_dtype)
    ks, vs = _scales(rng, scale, NB, P, Hkv)
    table = np.array([[1, 3], [0, 2]], np.int32)
    lens = np.array([29, 17], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    out, ref = _run(phase, q, kc, vc, table, lens, kv_dtype=kv_dtype, ks=ks, vs=vs)
    k16 = dequantize(kc, kv_dtype, ks).astype(np.float16)
    v16 = dequantize(vc, kv_dtype, vs).astype(np.float16)
    out16 = na.decode_paged(q, k16, v16, table, lens, phase=phase, **SIM[phase])
    rel = np.linalg.norm(out.astype(np.float64) - out16) / np.linalg.norm(out16.astype(np.float64))
    assert rel < 5e-3  # the same values: only the fp16 rounding of the dequantized cache differs


@pytest.mark.parametrize("phase", PAGED)
def test_runner_on_paged_problems(phase):
    """The runner checks a paged phase on a PagedProblem (shuffled table, ragged lengths) and
    skips it on a contiguous one; a contiguous phase skips the paged problem."""
    cfg = RunConfig(seeds=(7,))
    p = PagedProblem(batch=3, heads=4, kv_heads=1, q_len=1, kv_len=50, head_dim=16, dtype="float16",
                     page_size=16, ragged=True)
    row = measure(phase, p, cfg, **SIM[phase])
    assert row["status"] == "OK", row["reason"]
    assert measure(phase, Problem(heads=2, q_len=1, kv_len=40, head_dim=16, dtype="float16"), cfg)["status"] == "SKIP"
    assert measure("decode_split_k_lean", p, cfg)["status"] == "SKIP"


@pytest.mark.parametrize("kv_dtype,scale,qdt,params", [
    ("float8_e4m3", "head", np.float16, {"Bc": 32}),  # a 32-key tile over two 16-key pages: index per row
    ("int8", "token", np.float16, {"stages": 3}),
    ("int8", "token", ml_dtypes.bfloat16, {}),
    ("float8_e4m3", "tensor", ml_dtypes.bfloat16, {"splits": 1}),  # one split writes the output
])
def test_8bit_paged_mma_pages(kv_dtype, scale, qdt, params):
    """paged_mma on 8-bit caches: GQA group 2 with q_len 2 (causal), pages out of order and
    repeated, a partly filled page, a length-0 sequence; float16 and bfloat16 queries."""
    rng = np.random.default_rng(9)
    B, H, Hkv, Nq, D, P, NB = 3, 4, 2, 2, 32, 16, 5
    kc, vc = _caches(rng, NB, P, Hkv, D, kv_dtype)
    ks, vs = _scales(rng, scale, NB, P, Hkv)
    table = np.array([[4, 1, 4], [2, 0, 3], [1, 1, 1]], np.int32)
    lens = np.array([45, 21, 0], np.int32)
    q = rng.standard_normal((B, Nq, H, D), dtype=np.float32).astype(qdt)
    out, _ = _run("paged_mma", q, kc, vc, table, lens, causal=True, kv_dtype=kv_dtype, ks=ks, vs=vs, **params)
    assert not out[2].astype(np.float32).any()


def _ragged_8bit(rng, H, Hkv, D, Nq, kv_dtype, scale, qdt=np.float16):
    """An 8-bit paged batch of 3 sequences (page size 16, 5 pages): pages out of order and repeated, a
    partly filled page, a length-0 sequence; returns q, the caches, their scales, the table and the lengths."""
    B, P, NB = 3, 16, 5
    kc, vc = _caches(rng, NB, P, Hkv, D, kv_dtype)
    ks, vs = _scales(rng, scale, NB, P, Hkv)
    table = np.array([[4, 1, 4], [2, 0, 3], [1, 1, 1]], np.int32)
    lens = np.array([45, 21, 0], np.int32)
    q = rng.standard_normal((B, Nq, H, D), dtype=np.float32).astype(qdt)
    return q, kc, vc, ks, vs, table, lens


@pytest.mark.parametrize("kv_dtype,scale,qdt,Nq,params", [
    ("float8_e4m3", "tensor", np.float16, 1, {}),  # D 32: one lane per key, two 16-code loads
    ("float8_e4m3", "head", np.float16, 1, {"lanes": 2}),  # one 16-code load per lane
    ("int8", "head", ml_dtypes.bfloat16, 1, {}),
    ("int8", "token", np.float16, 1, {"lanes": 2, "keys": 2}),
    ("float8_e4m3", "head", ml_dtypes.bfloat16, 2, {}),  # GQA group 2 × q_len 2, causal: 4 rows per block
    ("int8", "token", np.float16, 2, {"rows": 2}),
])
def test_wide_8bit_paged_split_k(kv_dtype, scale, qdt, Nq, params):
    """paged_split_k's ``wide`` path (16 codes per lane per load) on fp8/int8 caches: pages out of
    order and repeated, a partly filled page, a length-0 sequence, GQA group 2 (causal q_len 2),
    float16 and bfloat16 queries; against the reference, and in the first case (per tensor) also against
    the 8-codes-per-load kernel (the other cases run only the reference: twice the simulator's time). Two KV heads
    for the scales per head or per token at q_len 1 (the scales' head index); one (half the blocks) for the
    per-tensor scale and under the causal GQA rows of q_len 2."""
    H, Hkv = (4, 2) if scale != "tensor" and Nq == 1 else (2, 1)
    q, kc, vc, ks, vs, table, lens = _ragged_8bit(np.random.default_rng(10), H, Hkv, 32, Nq, kv_dtype, scale, qdt)
    causal = Nq > 1
    out, _ = _run("paged_split_k", q, kc, vc, table, lens, causal=causal, kv_dtype=kv_dtype, ks=ks, vs=vs,
                  wide=True, **params)
    assert not out[2].astype(np.float32).any()
    if Nq > 1 or scale != "tensor":
        return
    narrow = na.decode_paged(q, kc, vc, table, lens, causal=causal, k_scale=ks, v_scale=vs, phase="paged_split_k",
                             **SIM["paged_split_k"], wide=False)
    assert np.abs(out.astype(np.float32) - narrow.astype(np.float32)).max() < 2e-2


@pytest.mark.parametrize("kv_dtype,scale,H,Hkv,Nq,params", [
    ("float8_e4m3", "head", 2, 2, 1, {}),
    ("int8", "token", 2, 2, 1, {"splits": 1}),  # one split (fused combine of one partial)
    ("float8_e4m3", "tensor", 2, 1, 2, {}),  # GQA group 2 × q_len 2, causal: 4 rows on the mma's N (one scale)
    ("int8", "head", 8, 1, 1, {"warps": 1}),  # 8 rows: every column of the mma
    ("int8", "token", 4, 2, 2, {}),  # int8's biased scores and V scales on P before the shuffles, 4 rows
    ("int8", "token", 4, 4, 1, {"step_heads": 4}),  # a step: 4 tokens × 4 KV heads, per-token scales
    ("float8_e4m3", "head", 2, 2, 1, {"step_heads": 1}),  # 16 tokens of one KV head (the default is 2 here)
    ("int8", "token", 2, 2, 1, {"stages": 3}),  # the cp.async ring, two steps in flight; their scales queued
])
def test_paged_mma8(kv_dtype, scale, H, Hkv, Nq, params):
    """paged_mma8 (8-bit codes straight into mma fragments): pages out of order and
    repeated, a partly filled page, a length-0 sequence, GQA and causal rows, D 64 (two 16-byte chunks
    of K per lane, 8-byte V loads); against the reference, and in the first case also against the kernel
    it replaces (the others run only the reference: twice the simulator's time).
    ``step_heads``: a warp step's 16 rows are tokens × adjacent KV heads, each head's query in its own column (2,
    the default, where a KV head has one query row and kv_heads is even: the first two cases). ``stages``: the
    bytes through a per-warp ring of warp steps in shared memory (``cp.async``; a wait one group short, or the
    fragments read without the ring's swizzle, fail these cases)."""
    q, kc, vc, ks, vs, table, lens = _ragged_8bit(np.random.default_rng(11), H, Hkv, 64, Nq, kv_dtype, scale)
    causal = Nq > 1
    out, _ = _run("paged_mma8", q, kc, vc, table, lens, causal=causal, kv_dtype=kv_dtype, ks=ks, vs=vs, **params)
    assert not out[2].astype(np.float32).any()
    if causal or params or kv_dtype != "float8_e4m3":  # (the cross-check: the first case only)
        return
    # the warp-step kernel of paged_split_k, its parent
    default = na.decode_paged(q, kc, vc, table, lens, causal=causal, k_scale=ks, v_scale=vs, phase="paged_split_k",
                              **SIM["paged_split_k"])
    assert np.abs(out.astype(np.float32) - default.astype(np.float32)).max() < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,scale", [("float8_e4m3", "head"), ("int8", "token")])
def test_mma_at_head_dim_128_on_the_gpu(kv_dtype, scale):
    """paged_mma8 at the target's head_dim and page size (D128, P64: 8 k-steps, 16-byte V loads, one page
    index per step), ragged lengths over several splits, on the device (cvt.rn.f16x2.e4m3x2, mma.sync)."""
    rng = np.random.default_rng(14)
    B, H, D, P, NB = 2, 4, 128, 64, 40
    kc, vc = _caches(rng, NB, P, H, D, kv_dtype)
    ks, vs = _scales(rng, scale, NB, P, H)
    table = rng.permutation(NB)[:2 * 20].reshape(2, 20).astype(np.int32)
    lens = np.array([1250, 777], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    out = na.decode_paged(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, phase="paged_mma8")
    ref = paged_reference(q, kc, vc, table, lens, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    c = na.check(out, ref, dtype="float16")
    assert c.ok, c.reason


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kv_dtype,scale", [("float8_e4m3", "tensor"), ("float8_e4m3", "head"), ("int8", "head"),
                                            ("int8", "token")])
@pytest.mark.parametrize("H,Hkv,Nq,causal", [(4, 4, 1, False), (8, 2, 1, False), (8, 4, 2, True)])
def test_mma_on_the_gpu_every_format(D, kv_dtype, scale, H, Hkv, Nq, causal):
    """paged_mma8 on the device for every cache format it accepts, at both head dims it runs (64, 128), one query
    row per KV head, a GQA group of 4 and speculative causal rows (2 x group 2): the configurations the fp8
    default (``phase=None``) reaches, beside the explicit int8 ones; ragged lengths, out-of-order pages."""
    rng = np.random.default_rng(15)
    B, P, NB = 2, 64, 48
    kc, vc = _caches(rng, NB, P, Hkv, D, kv_dtype)
    ks, vs = _scales(rng, scale, NB, P, Hkv)
    table = rng.permutation(NB).reshape(2, 24).astype(np.int32)
    lens = np.array([1250, 777], np.int32)
    q = rng.standard_normal((B, Nq, H, D), dtype=np.float32).astype(np.float16)
    out = na.decode_paged(q, kc, vc, table, lens, causal=causal, k_scale=ks, v_scale=vs, phase="paged_mma8")
    ref = paged_reference(q, kc, vc, table, lens, causal=causal, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    c = na.check(out, ref, dtype="float16")
    assert c.ok, c.reason
    if kv_dtype == "float8_e4m3":  # the default path: decode_paged(phase=None) reaches the same kernel
        default = na.decode_paged(q, kc, vc, table, lens, causal=causal, k_scale=ks, v_scale=vs)
        assert na.check(default, ref, dtype="float16").ok


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,scale", [("float8_e4m3", "head"), ("int8", "token"), ("int8", "head")])
@pytest.mark.parametrize("step_heads", [2, 4, 8])
def test_mma_step_heads_on_the_gpu(kv_dtype, scale, step_heads):
    """``step_heads`` on the device: warp steps of 16 / step_heads tokens × step_heads KV heads, one query row per
    KV head; ragged lengths, out-of-order pages, against the reference."""
    _mma_ragged_on_the_gpu(np.random.default_rng(16), kv_dtype, scale, 128, step_heads=step_heads)


def _mma_ragged_on_the_gpu(rng, kv_dtype, scale, D, **params):
    """paged_mma8 with ``params`` on the device, B2 H8 (MHA) P64: lengths 1250 and 777 (a partly
    filled last page, several splits), the 48 pages shuffled; against the reference."""
    B, H, P, NB = 2, 8, 64, 48
    kc, vc = _caches(rng, NB, P, H, D, kv_dtype)
    ks, vs = _scales(rng, scale, NB, P, H)
    table = rng.permutation(NB).reshape(2, 24).astype(np.int32)
    lens = np.array([1250, 777], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    out = na.decode_paged(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, phase="paged_mma8", **params)
    ref = paged_reference(q, kc, vc, table, lens, kv_dtype=kv_dtype, k_scale=ks, v_scale=vs)
    c = na.check(out, ref, dtype="float16")
    assert c.ok, c.reason


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,scale", [("float8_e4m3", "head"), ("int8", "token"), ("int8", "head")])
@pytest.mark.parametrize("D,stages,step_heads", [(128, 2, 2), (128, 3, 2), (128, 4, 1), (64, 3, 8), (256, 2, 4)])
def test_mma_stages_on_the_gpu(kv_dtype, scale, D, stages, step_heads):
    """``stages`` on the device: the cache rows (and per-token scales) through a per-warp ``cp.async`` ring of
    ``stages`` warp steps in dynamic shared memory (over 48 KiB from 3 stages at D 128); ragged lengths, out-of-order
    pages, a partly filled last page, at the head dims the ring's swizzle covers differently (64, 128, 256)."""
    _mma_ragged_on_the_gpu(np.random.default_rng(17), kv_dtype, scale, D, stages=stages, step_heads=step_heads)


def test_paged_mma8_supports():
    """paged_mma8 refuses, saying why, what its kernel cannot run; paged_split_k no longer has its options."""
    ph = get_phase("paged_mma8")

    def prob(D=128, kv_dtype="float8_e4m3", dtype="float16", kv_heads=None, q_len=1, P=64, scale="head"):
        return PagedProblem(batch=8, heads=32, kv_heads=kv_heads, q_len=q_len, kv_len=16384, head_dim=D, dtype=dtype,
                            page_size=P, kv_dtype=kv_dtype, kv_scale=scale if kv_dtype else "tensor")

    assert ph.supports(prob()) is None
    assert ph.supports(prob(kv_heads=8, q_len=2)) is None  # 8 rows
    assert "> 8" in ph.supports(prob(kv_heads=8, q_len=4))
    assert "8-bit caches only" in ph.supports(prob(kv_dtype=""))
    assert "supports float16" in ph.supports(prob(dtype="bfloat16"))
    assert "multiple of 64" in ph.supports(prob(D=96))
    assert ph.supports(prob(), step_heads=8) is None
    assert "one query row per KV head" in ph.supports(prob(kv_heads=8), step_heads=2)
    assert "not 1, 2, 4 or 8" in ph.supports(prob(), step_heads=3)
    six = PagedProblem(batch=2, heads=6, q_len=1, kv_len=64, head_dim=128, dtype="float16", page_size=64,
                       kv_dtype="int8")
    assert "does not divide" in ph.supports(six, step_heads=4)
    assert ph.supports(prob(), stages=3) is None
    assert "not 0 (off), 2, 3 or 4" in ph.supports(prob(), stages=1)
    assert "not with prefetch" in ph.supports(prob(), stages=2, prefetch=1, step_heads=1)
    assert "out of range 0..4" in ph.supports(prob(), prefetch=5)
    assert "shared memory" in ph.supports(prob(D=256, kv_dtype="int8"), stages=4, warps=16)
    r = ph.resolve(prob(), {})
    assert r["step_heads"] == 2 and r["prefetch"] == 0 and r["splits"] > 0  # the default: 2 heads a step here
    assert ph.resolve(prob(kv_heads=8), {})["step_heads"] == 1  # a GQA group fills the columns
    assert ph.resolve(prob(), {"prefetch": 1})["step_heads"] == 1
    for name in ("mma", "step_heads", "stages", "prefetch"):  # paged_split_k: the warp-step kernel only
        assert f"no parameter {name!r}" in get_phase("paged_split_k").supports(prob(), **{name: 1})


def test_wide_supports_and_lanes():
    """``wide`` halves the lanes per key of an 8-bit cache; it is refused for a 16-bit cache and
    where a lane's 16 codes do not tile the row."""
    ph = get_phase("paged_split_k")

    def prob(D=128, kv_dtype="float8_e4m3", scale="head"):
        return PagedProblem(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=D, dtype="float16", page_size=64,
                            kv_dtype=kv_dtype, kv_scale=scale)

    assert ph.resolve(prob(), {"wide": True})["lanes"] * 2 == ph.resolve(prob(), {"wide": False})["lanes"] == 8
    # the default (None): wide for an 8-bit cache with one query row per KV head and whole 16-code loads
    assert ph.resolve(prob(), {})["wide"] is True and ph.resolve(prob(), {})["lanes"] == 4
    assert ph.resolve(prob(kv_dtype="int8", scale="token"), {})["wide"] is True
    assert ph.resolve(prob(kv_dtype="", scale="tensor"), {})["wide"] is False
    assert ph.resolve(prob(D=72), {})["wide"] is False
    gqa = PagedProblem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=16384, head_dim=128, dtype="float16",
                       page_size=64, kv_dtype="float8_e4m3", kv_scale="head")
    assert ph.resolve(gqa, {})["wide"] is False  # a GQA group's rows spill with 16 codes per lane
    assert "must be a bool" in ph.supports(prob(), wide="False")  # bool("False") would be True
    assert ph.supports(prob(), wide=True) is None
    assert ph.supports(prob(kv_dtype="int8", scale="token"), wide=True) is None
    assert "8-bit caches only" in ph.supports(prob(kv_dtype="", scale="tensor"), wide=True)
    assert "not a multiple of 16" in ph.supports(prob(D=72), wide=True)
    assert ph.supports(prob(D=72)) is None  # 8 codes per load: 9 chunks
    assert "lanes=4" in ph.supports(prob(D=32), wide=True, lanes=4)  # 2 chunks of 16 codes


def test_paged_mma_supports_8bit():
    ph = get_phase("paged_mma")
    p = PagedProblem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=64, head_dim=24, dtype="float16", page_size=16,
                     kv_dtype="int8", kv_scale="token")
    assert "multiple of 16" in ph.supports(p)
    p = PagedProblem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=64, head_dim=32, dtype="bfloat16", page_size=16,
                     kv_dtype="float8_e4m3", kv_scale="head")
    assert ph.supports(p) is None


def test_runner_8bit_problem():
    p = PagedProblem(batch=2, heads=2, q_len=1, kv_len=40, head_dim=16, dtype="float16", page_size=32,
                     kv_dtype="int8", kv_scale="token", ragged=True)
    row = measure("paged_split_k", p, RunConfig(seeds=(7,)), **SIM["paged_split_k"])
    assert row["status"] == "OK", row["reason"]


# -- input checks --------------------------------------------------------------------------------

def _good():
    rng = np.random.default_rng(4)
    kc, vc = _caches(rng, 3, 16, 1, 16)
    q = np.zeros((2, 1, 2, 16), np.float16)
    return q, kc, vc, np.array([[0, 1], [2, 0]], np.int32), np.array([20, 5], np.int32)


@pytest.mark.parametrize("change,match", [
    (lambda a: a[3].__setitem__((0, 1), 3), r"block_table\[0, 1\] = 3: page index out of range"),
    (lambda a: a[3].__setitem__((1, 0), -1), r"block_table\[1, 0\] = -1"),
    (lambda a: a[4].__setitem__(1, 33), r"cache_seqlens\[1\] = 33 is beyond the block table"),
    (lambda a: a[4].__setitem__(0, -2), r"cache_seqlens\[0\] = -2 is negative"),
    (lambda a: a.__setitem__(3, a[3].astype(np.int64)), "block_table must be int32"),
    (lambda a: a.__setitem__(4, a[4][:1]), r"cache_seqlens must be int32 of shape \(2,\)"),
    (lambda a: a.__setitem__(0, a[0].astype(np.float32)), "q must be float16 or bfloat16"),
    (lambda a: a.__setitem__(1, a[1].astype(np.float32)), "k_cache dtype float32 != v_cache"),
    (lambda a: a.__setitem__(1, a[1][:, :8]), "k_cache .* and v_cache .* differ"),
    (lambda a: [a.__setitem__(i, a[i][:, :8]) for i in (1, 2)], "page_size .* must be one of 16, 32"),
    (lambda a: a.__setitem__(0, a[0][..., :8]), "k_cache head_dim 16 != q head_dim 8"),
])
def test_bad_input_is_refused_before_launch(change, match):
    args = list(_good())
    change(args)
    with pytest.raises(AttentionInputError, match=match):
        na.decode_paged(*args)


def test_8bit_scales_and_causal_lengths_are_checked():
    q, kc, vc, table, lens = _good()
    k8, v8 = (np.clip(np.rint(a.astype(np.float32) * 30), -127, 127).astype(np.int8) for a in (kc, vc))
    with pytest.raises(AttentionInputError, match="k_scale is required for a int8 cache"):
        na.decode_paged(q, k8, v8, table, lens)
    with pytest.raises(AttentionInputError, match=r"v_scale shape \(3,\) != \(1,\)"):
        na.decode_paged(q, k8, v8, table, lens, k_scale=np.ones(1, np.float32), v_scale=np.ones(3, np.float32))
    f8 = kc.astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(AttentionInputError, match="token scale is not supported for float8_e4m3"):
        na.decode_paged(q, f8, f8, table, lens, k_scale=np.ones((3, 16, 1)), v_scale=np.ones((3, 16, 1)))
    with pytest.raises(AttentionInputError, match="k_scale/v_scale are for 8-bit caches"):
        na.decode_paged(q, kc, vc, table, lens, k_scale=1.0, v_scale=1.0)
    q3 = np.zeros((2, 3, 2, 16), np.float16)
    with pytest.raises(AttentionInputError, match=r"causal: cache_seqlens\[1\] = 2 < q_len 3"):
        na.decode_paged(q3, kc, vc, table, np.array([20, 2], np.int32), causal=True)


def test_device_arrays_and_cpu_tensors():
    """numba device arrays in, a device array out; PyTorch CPU tensors (an fp8 cache as
    torch.float8_e4m3fn, a 0-d tensor scale) in, a tensor out."""
    rng = np.random.default_rng(6)
    kc, vc = _caches(rng, 3, 16, 1, 16, "float8_e4m3")
    q = rng.standard_normal((2, 1, 2, 16), dtype=np.float32).astype(np.float16)
    table, lens = np.array([[2, 0], [1, 1]], np.int32), np.array([20, 16], np.int32)
    k16, v16 = kc.astype(np.float16), vc.astype(np.float16)
    out = na.decode_paged(*(cuda.to_device(a) for a in (q, k16, v16, table, lens)), phase="paged_split_k",
                          **SIM["paged_split_k"])
    assert na.check(out.copy_to_host(), paged_reference(q, k16, v16, table, lens), dtype="float16").ok
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8_e4m3fn")
    tk, tv = (torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn) for a in (kc, vc))
    out = na.decode_paged(torch.from_numpy(q), tk, tv, torch.from_numpy(table), torch.from_numpy(lens),
                          k_scale=torch.tensor(0.03), v_scale=0.03, phase="paged_split_k", **SIM["paged_split_k"])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    ref = paged_reference(q, kc, vc, table, lens, kv_dtype="float8_e4m3", k_scale=0.03, v_scale=0.03)
    assert na.check(out.numpy(), ref, dtype="float16").ok


# -- the layout: flash_attn_with_kvcache's q (B, q_len, H, D) -----------------------------------------------------

def _by_hand(q, kc, vc, table, lens, causal):
    """The answer without spec/paged.py: each sequence's keys gathered by hand, q read as (B, q_len, H, D)
    (flash_attn_with_kvcache's layout), the output in the same layout."""
    from numba_attn.spec.reference import reference

    B, Nq, H, D = q.shape
    P, Hkv = kc.shape[1], kc.shape[2]
    out = np.zeros(q.shape)
    for b in range(B):
        rows = [int(table[b, j // P]) * P + j % P for j in range(int(lens[b]))]
        k, v = (c.reshape(-1, Hkv, D)[rows].transpose(1, 0, 2)[None].astype(np.float64) for c in (kc, vc))
        qb = q[b:b + 1].astype(np.float64).transpose(0, 2, 1, 3)  # (1, H, Nq, D)
        out[b] = reference(qb, k, v, causal=causal)[0].transpose(1, 0, 2)
    return out


def _flash_batch(rng, B=2, Nq=3, H=2, Hkv=1, D=16):
    kc, vc = _caches(rng, 4, 16, Hkv, D)
    table = np.array([[2, 0], [1, 3]], np.int32)[:B]
    lens = np.array([27, 19], np.int32)[:B]
    q = rng.standard_normal((B, Nq, H, D), dtype=np.float32).astype(np.float16)
    return q, kc, vc, table, lens


def test_q_is_read_in_flash_attn_layout():
    """q (B, q_len, H, D) with one KV head, causal q_len 3 (the shape flash-attn callers pass): the output is
    (B, q_len, H, D) and matches attention computed by hand in that layout; reading the same array as
    (B, H, q_len, D) would be off by far more than the tolerance (the silent wrong answer this layout removes)."""
    q, kc, vc, table, lens = _flash_batch(np.random.default_rng(31))
    out = na.decode_paged(q, kc, vc, table, lens, causal=True, phase="paged_split_k", **SIM["paged_split_k"])
    want = _by_hand(q, kc, vc, table, lens, causal=True)
    assert out.shape == q.shape
    assert na.check(out, want, dtype="float16").ok
    assert np.allclose(paged_reference(q, kc, vc, table, lens, causal=True), want)
    swapped = _by_hand(q.transpose(0, 2, 1, 3), kc, vc, table, lens, causal=True).transpose(0, 2, 1, 3)
    assert np.abs(swapped - want).max() > 0.1


def test_flash_layout_device_arrays_and_cpu_tensors_transpose():
    """q_len 2 and 2 heads (the two orders differ in memory): numba device arrays (transposed on the device)
    and PyTorch CPU tensors give the NumPy answer, in (B, q_len, H, D)."""
    q, kc, vc, table, lens = _flash_batch(np.random.default_rng(32), B=1, Nq=2)
    want = _by_hand(q, kc, vc, table, lens, causal=True)
    kw = dict(causal=True, phase="paged_split_k", **SIM["paged_split_k"])
    out = na.decode_paged(*(cuda.to_device(a) for a in (q, kc, vc, table, lens)), **kw)
    assert out.shape == q.shape and na.check(out.copy_to_host(), want, dtype="float16").ok
    torch = pytest.importorskip("torch")
    t = na.decode_paged(*(torch.from_numpy(a) for a in (q, kc, vc, table, lens)), **kw)
    assert tuple(t.shape) == q.shape and na.check(t.numpy(), want, dtype="float16").ok


def test_heads_first_q_with_more_kv_heads_is_refused():
    """A q in attention()'s order (B, H, q_len, D) whose q_len is not a multiple of the caches' kv_heads is
    refused naming the layout (with q_len 1 the two orders are one array)."""
    rng = np.random.default_rng(33)
    kc, vc = _caches(rng, 3, 16, 2, 16)
    q = np.zeros((2, 4, 1, 16), np.float16)  # (B, H, q_len, D): read as q_len 4, 1 head
    with pytest.raises(AttentionInputError, match=r"q heads \(1, q.shape\[2\] of q \(batch, q_len, heads, head_dim\)\)"):
        na.decode_paged(q, kc, vc, np.array([[0, 1], [2, 0]], np.int32), np.array([20, 5], np.int32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 0.0, -0.5])
@pytest.mark.parametrize("where", ["k_scale scalar", "v_scale scalar", "k_scale head", "v_scale token"])
def test_non_finite_or_non_positive_scales_are_refused(bad, where):
    """A NaN, infinite, zero or negative k_scale/v_scale (a scalar, or one entry of a per-head or per-token
    array) is refused before launch, the error naming the argument (and the entry)."""
    q, kc, vc, table, lens = _good()
    k8, v8 = (np.clip(np.rint(a.astype(np.float32) * 30), -127, 127).astype(np.int8) for a in (kc, vc))
    name, kind = where.split()
    shape = {"scalar": (), "head": (1,), "token": (3, 16, 1)}[kind]
    scales = {"k_scale": np.full(shape, 0.03, np.float32), "v_scale": np.full(shape, 0.03, np.float32)}
    if kind == "scalar":
        scales[name] = bad
        match = rf"{name} must be finite and > 0, got"
    else:
        scales[name].reshape(-1)[-1] = bad
        match = rf"{name}\[{', '.join(str(s - 1) for s in shape)}\] = .*: every scale must be finite and > 0"
    with pytest.raises(AttentionInputError, match=match):
        na.decode_paged(q, k8, v8, table, lens, **scales)


def test_paged_problem_round_trips_through_a_row():
    """A worker process rebuilds the problem from its row (``Problem.from_dict``): it stays paged."""
    p = PagedProblem(batch=2, heads=2, q_len=1, kv_len=40, head_dim=16, dtype="float16", page_size=32,
                     kv_dtype="int8", kv_scale="token", ragged=True)
    assert Problem.from_dict(p.to_dict()) == p
    assert "paged P32 int8/token ragged" in p.label
    n = int(p.seqlens().sum()) * 2  # keys × KV heads
    assert p.min_bytes() == 2 * (2 * 2 * 1 * 16 * 2) + 2 * n * 16 + 2 * n * 4  # q, o (fp16); K, V (int8); scales


def test_default_phase_order_follows_the_rows_per_kv_head():
    """phase=None: the split-K phase first for one query row per KV head, the tensor-core one otherwise."""
    from numba_attn.api import paged_default
    from numba_attn.spec.problem import PagedProblem

    one = PagedProblem(batch=2, heads=4, q_len=1, kv_len=64, head_dim=16, dtype="float16", page_size=16)
    gqa = PagedProblem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=64, head_dim=16, dtype="float16", page_size=16)
    two = PagedProblem(batch=2, heads=4, q_len=2, kv_len=64, head_dim=16, dtype="float16", page_size=16)
    assert paged_default(one) == ("paged_split_k", "paged_mma")
    assert paged_default(gqa) == paged_default(two) == ("paged_mma", "paged_split_k")
    # unequal lengths (decode_paged sets mean_len): the work list first for one row per KV head, 16-bit caches
    ragged = replace(one, mean_len=48)
    assert paged_default(ragged) == ("paged_worklist", "paged_split_k", "paged_mma")
    assert paged_default(replace(gqa, mean_len=48)) == ("paged_mma", "paged_split_k")
    assert paged_default(replace(ragged, kv_dtype="int8", kv_scale="token")) == ("paged_split_k", "paged_mma")


# -- the split plan of a ragged batch --------------------------------------------------------------

def _resolved_splits(phase, problem):
    ph = get_phase(phase)
    return ph.resolve(problem, ph.resolve_params({}))["splits"]


def test_uniform_lengths_keep_the_one_wave_plan():
    """Every preset problem whose sequences have one length (all non-ragged ones, and a ragged
    batch of one sequence) gets the one-wave split count of ``split_plan`` without lengths."""
    from numba_attn.gpu.split_k import sm_count, split_plan
    from numba_attn.phases.decode.rules import ragged_mean
    from numba_attn.spec.problem import PRESETS

    seen = 0
    for p in {q for name in ("paged", "paged-targets", "paged-8bit") for q in PRESETS[name]}:
        if p.ragged and p.batch > 1:
            assert ragged_mean(p) > 0
            continue
        assert ragged_mean(p) == 0, p.label
        for phase in ("paged_mma", "paged_split_k", "paged_mma8"):
            ph = get_phase(phase)
            if ph.supports(p):
                continue
            prm = ph.resolve_params({})
            if phase == "paged_mma":
                want = split_plan(p.batch * p.kv_heads, p.kv_len, prm["warps"] * prm["Bc"], sm_count(),
                                  prm["blocks_per_sm"], prm["min_keys"])[0]
            elif phase == "paged_mma8":  # one row block per KV head; a block reads step_heads KV heads
                r = ph.resolve(p, prm)
                want = split_plan(p.batch * p.kv_heads // r["step_heads"],
                                  p.kv_len, 1, sm_count(), prm["blocks_per_sm"], prm["min_keys"])[0]
            else:
                r = ph.resolve(p, prm)
                want = split_plan(p.batch * p.kv_heads * -(-p.group * p.q_len // r["rows"]),
                                  p.kv_len, 1, sm_count(), prm["blocks_per_sm"], prm["min_keys"])[0]
            assert _resolved_splits(phase, p) == want, (phase, p.label)
            seen += 1
    assert seen > 20
    uniform = PagedProblem(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64)
    assert _resolved_splits("paged_split_k", uniform) == _resolved_splits("paged_mma", uniform) == 1  # 256 blocks
    assert split_plan(256, 32768, 64, 132, 2, 256, mean_len=32768) == split_plan(256, 32768, 64, 132, 2, 256)


def test_ragged_plan_splits_a_long_sequence():
    """One 32k sequence among seven of 1k at B8 H32 (256 blocks fill the 264 slots of 132 SMs at
    one wave: S = 1): the ragged plan splits it into small items against a slot's share of the
    keys; every (sequence, split) item is empty (an early exit) or at most one chunk."""
    from numba_attn.gpu.split_k import BALANCE, RAGGED_MIN_KEYS, split_plan

    lens = np.array([32768] + [1024] * 7)
    n_blocks, sms, bps, min_keys = 8 * 32, 132, 2, 256
    assert split_plan(n_blocks, 32768, 64, sms, bps, min_keys)[0] == 1
    S, chunk = split_plan(n_blocks, 32768, 64, sms, bps, min_keys, mean_len=lens.mean())
    assert S > 1 and S & (S - 1) == 0 and S * chunk >= 32768 and chunk % 64 == 0
    share = lens.mean() * n_blocks / (sms * bps)  # keys per block slot
    assert chunk <= max(min_keys, RAGGED_MIN_KEYS, share / BALANCE) * 1.01
    # short sequences: splits of at least RAGGED_MIN_KEYS keys (B8 up to 4k: 4 of 1024, not 16 of 256)
    short = np.array([4096, 3000, 2500, 2000, 1500, 1200, 1000, 900])
    assert split_plan(n_blocks, 4096, 64, sms, bps, min_keys, mean_len=short.mean()) == (4, 1024)
    items = [max(0, min(n, (s + 1) * chunk) - s * chunk) for n in lens for s in range(S)]
    assert max(items) <= chunk and sum(items) == lens.sum()
    assert sum(i > 0 for i in items) == sum(-(-n // chunk) for n in lens)
    # min_keys caps it as in the one-wave plan; a forced split count is kept
    assert split_plan(n_blocks, 32768, 64, sms, bps, 16384, mean_len=lens.mean())[0] == 2
    assert split_plan(n_blocks, 32768, 64, sms, bps, min_keys, splits=3, mean_len=lens.mean())[0] == 3
    # the presets' ragged B8 batch (lengths from its seed): both paged phases split it
    p = PagedProblem(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64,
                     ragged=True)
    assert _resolved_splits("paged_split_k", p) > 1 and _resolved_splits("paged_mma", p) > 1


def test_decode_paged_plan_is_cached_per_rounded_mean():
    """decode_paged's problem carries the call's mean length (rounded up to 1/16 of the bucket; 0 for
    equal lengths); two plans with different means and one split count share their kernels."""
    from numba_attn.api import paged_mean_bucket

    assert paged_mean_bucket(np.array([50, 50], np.int32), 64) == 0
    assert paged_mean_bucket(np.array([100, 7, 30], np.int32), 128) == 48
    assert paged_mean_bucket(np.zeros(0, np.int32), 1) == 0
    base = dict(batch=8, heads=32, q_len=1, kv_len=32768, head_dim=128, dtype="float16", page_size=64)
    for phase in PAGED:
        a, b = (get_phase(phase).plan(PagedProblem(**base, mean_len=m)) for m in (14336, 16384))
        assert a.params["splits"] == b.params["splits"] > 1 if "splits" in a.params else phase == "paged_worklist"
        assert all(x is y for x, y in zip(a.kernels, b.kernels)), phase
    assert Problem.from_dict(PagedProblem(**base, mean_len=4096).to_dict()).mean_len == 4096
    assert "mean_len" not in PagedProblem(**base).to_dict()  # rows of problems without it are unchanged


@pytest.mark.parametrize("phase", PAGED)
def test_ragged_plan_runs_correctly(phase, monkeypatch):
    """A ragged batch (one long sequence, a partly filled page, a shared page) with the automatic
    split count on a stand-in GPU of 2 SMs, where the one-wave plan would give one split: the ragged
    plan splits it (several splits past the short sequences' ends), and the output matches the
    reference; the runner's ragged problem likewise."""
    from collections import OrderedDict

    import numba_attn.api as api
    import numba_attn.gpu.split_k as split_k

    monkeypatch.setattr(split_k, "SIMULATOR_SMS", 2)
    monkeypatch.setattr(api, "_PAGED_PLANS", OrderedDict())
    rng = np.random.default_rng(11)
    B, H, Hkv, D, P = 3, 2, 1, 16, 16
    kc, vc = _caches(rng, 9, P, Hkv, D)
    table = np.array([[8, 0, 3, 5, 1, 2, 4, 6], [7, 7, 7, 7, 7, 7, 7, 7], [2, 6, 0, 0, 0, 0, 0, 0]], np.int32)
    lens = np.array([100, 7, 30], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    split = "splits" in SIM[phase]  # (paged_worklist: no splits, one block per SM slot)
    params = {"splits": 0, "min_keys": 16, "blocks_per_sm": 1} if split else {"workers": 0, "blocks_per_sm": 1}
    _run(phase, q, kc, vc, table, lens, **params)
    (key, launch), = api._PAGED_PLANS.items()
    assert key[1].mean_len == 48, launch.notes
    assert launch.params["splits"] >= 4 if split else launch.notes.startswith("2 blocks"), launch.notes
    p = PagedProblem(batch=3, heads=2, kv_heads=1, q_len=1, kv_len=128, head_dim=16, dtype="float16",
                     page_size=16, ragged=True)
    row = measure(phase, p, RunConfig(seeds=(7,), time_kernels=False), **{**SIM[phase], **params})
    assert row["status"] == "OK", row["reason"]
    assert row["params"]["splits"] > 1 if split else row["params"]["workers"] == 0


@pytest.mark.simulator  # (the device function called from the host: the simulator's)
def test_balanced_split_model():
    """``balanced_split`` (paged_split_k's ``balance``): a sequence's n = ⌈Nk / chunk⌉ splits cover its keys
    once, in whole steps of KS keys, none longer than ``chunk``, all but the last of ⌈Nk / n⌉ keys rounded up
    to a step, the last not empty; the splits after them are empty."""
    from numba_attn.phases.decode.p33_decode_split_k_lean import balanced_split

    for KS in (1, 8, 16):
        for chunk in (KS, 3 * KS, 64, 1024):
            for Nk in (0, 1, KS - 1 or 1, chunk, chunk + 1, 2 * chunk - KS, 1100, 3674):
                n = max(1, -(-Nk // chunk))
                ranges = [balanced_split(s, chunk, Nk, KS) for s in range(n + 2)]
                lens = [max(0, hi - lo) for lo, hi in ranges]
                assert sum(lens) == Nk and all(x == 0 for x in lens[n:]), (KS, chunk, Nk, ranges)
                assert all(lo % KS == 0 for lo, _ in ranges[:n]) and max(lens) <= chunk
                assert all(ranges[s][1] == ranges[s + 1][0] for s in range(n - 1))  # consecutive, no gap
                if Nk:  # all but the last of one length, ⌈Nk/n⌉ rounded up to a step; the last not empty
                    ck = lens[0]
                    assert set(lens[:n - 1]) <= {ck} and 0 < lens[n - 1] <= ck < -(-Nk // n) + KS
    assert [balanced_split(s, 1024, 1100, 8) for s in range(3)] == [(0, 552), (552, 1100), (1104, 1100)]


def _batch(rng, P, Hkv, D, dtype, kv_dtype, scale, B, H, Nq, pages=9):
    """Caches of ``pages`` pages (16-bit in the query's dtype, or 8-bit with ``scale`` scales) and a query
    batch, drawn in that order from ``rng``: q, kc, vc, ks, vs (ks, vs None for a 16-bit cache)."""
    qdt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    kc, vc = _caches(rng, pages, P, Hkv, D, kv_dtype, dtype=qdt)
    ks = vs = None
    if kv_dtype:
        ks, vs = _scales(rng, scale, pages, P, Hkv)
    return rng.standard_normal((B, Nq, H, D), dtype=np.float32).astype(qdt), kc, vc, ks, vs


@pytest.mark.parametrize("dtype,kv_dtype,Nq,H", [("float16", "", 1, 2), ("bfloat16", "", 2, 4),
                                                 ("float16", "int8", 1, 2)])
def test_balanced_splits_run_correctly(dtype, kv_dtype, Nq, H):
    """``balance=True``: a long sequence's splits of equal length, a short one's single split, an empty
    sequence and the splits past each end; against the reference (16-bit and 8-bit caches through the warp-step
    kernel, causal GQA rows), and in the first case also against the unbalanced splits (the others run only the
    reference: the cross-check doubles the simulator's time)."""
    # two KV heads for the per-head scales (their head index); a 16-bit cache: one, under half the query heads
    Hkv = 2 if kv_dtype else 1
    q, kc, vc, ks, vs = _batch(np.random.default_rng(12), 16, Hkv, 16, dtype, kv_dtype, "head", 3, H * Hkv // 2, Nq)
    table = np.array([[8, 0, 3, 5, 1, 2, 4, 6], [7, 7, 7, 7, 7, 7, 7, 7], [2, 6, 0, 0, 0, 0, 0, 0]], np.int32)
    lens = np.array([100, 0, 19], np.int32)
    params = {"splits": 3, "warps": 1}
    out, _ = _run("paged_split_k", q, kc, vc, table, lens, causal=Nq > 1, kv_dtype=kv_dtype, ks=ks, vs=vs,
                  balance=True, **params)
    assert not out[1].astype(np.float32).any()
    if dtype != "float16" or kv_dtype:  # (the cross-check: the first case only)
        return
    plain = na.decode_paged(q, kc, vc, table, lens, causal=Nq > 1, k_scale=ks, v_scale=vs, phase="paged_split_k",
                            **{**SIM["paged_split_k"], **params})
    assert np.abs(out.astype(np.float32) - plain.astype(np.float32)).max() < 2e-2


def test_balance_supports_and_notes():
    ph = get_phase("paged_split_k")
    p16 = PagedProblem(batch=2, heads=2, kv_heads=2, q_len=1, kv_len=300, head_dim=16, dtype="float16", page_size=16)
    p8 = PagedProblem(batch=2, heads=2, kv_heads=2, q_len=1, kv_len=300, head_dim=64, dtype="float16", page_size=16,
                      kv_dtype="int8", kv_scale="token")
    assert ph.params["balance"] is False  # off by default
    assert "balanced splits" in ph.plan(p16, balance=True, **SIM["paged_split_k"]).notes
    assert ph.supports(p8, **ph.resolve_params({"balance": True})) is None


@pytest.mark.parametrize("phase,dtype,kv_dtype,Nq,H", [("paged_split_k", "float16", "", 1, 2),
                                                       ("paged_split_k", "bfloat16", "", 2, 2),
                                                       ("paged_worklist", "float16", "", 1, 2),
                                                       ("paged_worklist", "float16", "int8", 1, 2)])
def test_page_index_a_step_ahead(phase, dtype, kv_dtype, Nq, H):
    """``ahead=True``: a warp reads the page index of its next step during this one. Repeated and out-of-order
    pages, an empty sequence, a partly filled last page, splits (shares) starting inside a sequence, warps with
    several steps (one step a page); causal rows, bfloat16, an 8-bit cache read as words: the reference's
    result, and the same bits as ``ahead=False`` (only when the index is loaded changes)."""
    # pages of 64 keys: a page holds a warp step (32 or 64 keys here), so the index is read once per step; two KV
    # heads for the per-token scales (their head index), one (the query heads a GQA group) for a 16-bit cache
    Hkv = 2 if kv_dtype else 1
    q, kc, vc, ks, vs = _batch(np.random.default_rng(14), 64, Hkv, 16, dtype, kv_dtype, "token", 3, H, Nq)
    table = np.array([[8, 0, 3, 5, 1, 2, 4, 6], [7, 7, 7, 7, 7, 7, 7, 7], [2, 6, 2, 0, 0, 0, 0, 0]], np.int32)
    lens = np.array([333, 0, 140], np.int32)
    params = {"warps": 2, **({"splits": 2} if phase == "paged_split_k" else {"workers": 3, "min_keys": 16})}
    out, _ = _run(phase, q, kc, vc, table, lens, causal=Nq > 1, kv_dtype=kv_dtype, ks=ks, vs=vs, ahead=True,
                  **params)
    assert not out[1].astype(np.float32).any()
    plain = na.decode_paged(q, kc, vc, table, lens, causal=Nq > 1, k_scale=ks, v_scale=vs, phase=phase,
                            **{**SIM[phase], **params})
    assert np.array_equal(out.view(np.uint16), plain.view(np.uint16))
    ph = get_phase(phase)
    assert ph.params["ahead"] is False  # off by default
    prob = PagedProblem(batch=2, heads=2, kv_heads=2, q_len=1, kv_len=300, head_dim=64, dtype="float16",
                        page_size=16, kv_dtype="int8", kv_scale="token")
    assert ph.supports(prob, **ph.resolve_params({"ahead": True})) is None
    assert "page index a step ahead" in ph.plan(prob.replace(kv_dtype=""), ahead=True, **SIM[phase]).notes


def test_work_list_model():
    """``work_list`` (``paged_worklist``): every key of every sequence in exactly one item, items in whole
    steps (``lo`` a multiple of KS), a sequence's splits numbered 0 … n_b − 1 in key order with n_b in every
    one of its items, each worker a contiguous run of the batch with at most one step more than a share
    (``⌈steps / W⌉``), one item for an empty sequence, and fewer workers where a share would be under
    ``min_keys``."""
    from numba_attn.phases.decode.paged import work_list

    rng = np.random.default_rng(4)
    cases = [([3674, 1712, 974, 2975, 3575, 1242, 1581, 456], 64, 8), ([40, 37, 9, 0], 16, 3),
             ([0, 0, 5], 8, 4), ([1], 16, 7), ([100, 7, 30], 32, 2)]
    cases += [(rng.integers(0, 300, rng.integers(1, 9)).tolist(), int(rng.choice([8, 16, 64])),
               int(rng.integers(1, 12))) for _ in range(40)]
    for lens, KS, W in cases:
        work, wptr = work_list(lens, KS, W)
        nw = wptr.size - 1
        assert wptr[0] == 0 and wptr[-1] == len(work) and (np.diff(wptr) >= 0).all() and 1 <= nw <= W
        steps = -(-np.asarray(lens) // KS)
        share = -(-int(steps.sum()) // nw) if steps.sum() else 1
        for b, n in enumerate(lens):
            mine = work[work[:, 0] == b]
            assert (mine[:, 1] == np.arange(len(mine))).all() and (mine[:, 4] == len(mine)).all(), (lens, mine)
            if n == 0:
                assert mine.tolist() == [[b, 0, 0, 0, 1]]
                continue
            assert mine[0, 2] == 0 and mine[-1, 3] == n and (mine[1:, 2] == mine[:-1, 3]).all()  # no gap, no overlap
            assert (mine[:, 2] % KS == 0).all() and (mine[:, 2] < mine[:, 3]).all()
        for w in range(nw):
            its = work[wptr[w]:wptr[w + 1]]
            assert (np.diff(its[:, 0]) >= 0).all()  # a run of sequences, in order
            assert sum(-(-(hi - lo) // KS) for _, _, lo, hi, _ in its) <= share
    work, wptr = work_list([300, 300], 16, 8, min_keys=256)
    assert wptr.size - 1 == 3  # 600 keys (38 steps of 16): shares of >= 256 keys, not 8 of 80


def test_worklist_plan_model():
    """``worklist_plan``: items name the KV head of a sequence (b · Hkv + h); every (sequence, KV head)'s keys
    in exactly one run of items; ``flat``: one list over all heads, ``workers`` shares in all, a share crossing
    from one head to the next; else Hkv lists of ``workers`` shares, block h · W + w holding head h's items
    only, the same items as ``work_list``'s for every head."""
    from numba_attn.phases.decode.paged import work_list, worklist_plan

    lens, KS, Hkv = [3674, 1712, 974, 0, 456], 64, 3
    for flat, W in ((True, 11), (False, 4)):
        work, wptr = worklist_plan(lens, Hkv, KS, W, flat=flat)
        assert work.dtype == wptr.dtype == np.int32 and wptr[0] == 0 and wptr[-1] == len(work)
        assert wptr.size - 1 == (W if flat else Hkv * W) and (np.diff(wptr) >= 0).all()
        for kvh in range(len(lens) * Hkv):
            mine = work[work[:, 0] == kvh]
            n = lens[kvh // Hkv]
            assert (mine[:, 1] == np.arange(len(mine))).all() and (mine[:, 4] == len(mine)).all()
            assert mine[-1, 3] == n and mine[0, 2] == 0 and (mine[1:, 2] == mine[:-1, 3]).all()
        blocks = [set(work[wptr[i]:wptr[i + 1], 0] % Hkv) for i in range(wptr.size - 1)]
        if flat:
            assert any(len(b) > 1 for b in blocks)  # a share crossing KV heads
        else:
            base, bptr = work_list(lens, KS, W)
            for h in range(Hkv):
                assert all(b == {h} for b in blocks[h * W:(h + 1) * W])
                part = work[wptr[h * W]:wptr[(h + 1) * W]]
                assert np.array_equal(part[:, 0], base[:, 0] * Hkv + h) and np.array_equal(part[:, 1:], base[:, 1:])


@pytest.mark.parametrize("dtype,kv_dtype,Nq,H,flat", [("float16", "", 1, 2, True), ("bfloat16", "", 2, 4, False),
                                                      ("float16", "int8", 1, 2, False)])
def test_worklist_shares_cross_sequences(dtype, kv_dtype, Nq, H, flat):
    """``paged_worklist`` with three workers (per KV head) whose shares cut through the batch: the long
    sequence read by two blocks (or one share holding it whole, at 64-key steps), a share holding an empty
    sequence (zeros) and two short ones, and (``flat``) shares holding the end of one KV head
    and the start of the next; causal GQA rows, bfloat16, an 8-bit cache read as words; against the
    reference, and in the first case (flat) also against ``paged_split_k`` (the others run only the reference:
    the cross-check doubles the simulator's time)."""
    q, kc, vc, ks, vs = _batch(np.random.default_rng(13), 16, 2, 16, dtype, kv_dtype, "token", 4, H, Nq)
    table = np.array([[8, 0, 3, 5, 1, 2, 4, 6], [7, 7, 7, 7, 7, 7, 7, 7], [2, 6, 0, 0, 0, 0, 0, 0],
                      [5, 4, 0, 0, 0, 0, 0, 0]], np.int32)
    lens = np.array([121, 0, 19, 30], np.int32)
    out, _ = _run("paged_worklist", q, kc, vc, table, lens, causal=Nq > 1, kv_dtype=kv_dtype, ks=ks, vs=vs,
                  workers=3, warps=1, min_keys=16, flat=flat)
    assert not out[1].astype(np.float32).any()
    if not flat:
        return
    plain = na.decode_paged(q, kc, vc, table, lens, causal=Nq > 1, k_scale=ks, v_scale=vs, phase="paged_split_k",
                            **SIM["paged_split_k"])
    assert np.abs(out.astype(np.float32) - plain.astype(np.float32)).max() < 2e-2


def test_worklist_plans_each_call_from_its_host_lengths(monkeypatch):
    """``decode_paged(phase="paged_worklist")`` in a decode loop: the lengths change from call to call (the
    same plan of the launch), each call's work list is planned from that call's lengths as ``decode_paged``
    checked them on the host (``lens=``, no copy back from the device), and every output is right."""
    import numba_attn.phases.decode.paged as paged

    seen = []
    work_list = paged.work_list
    monkeypatch.setattr(paged, "work_list",
                        lambda lens, *a, **k: seen.append(list(lens)) or work_list(lens, *a, **k))
    rng = np.random.default_rng(14)
    B, H, Hkv, D, P = 3, 2, 1, 16, 16
    kc, vc = _caches(rng, 9, P, Hkv, D)
    table = np.array([[8, 0, 3, 5, 1, 2, 4, 6], [7, 7, 7, 7, 7, 7, 7, 7], [2, 6, 0, 0, 0, 0, 0, 0]], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    for lens in ([100, 7, 30], [101, 0, 31], [102, 1, 32]):
        _run("paged_worklist", q, kc, vc, table, np.array(lens, np.int32), workers=3, min_keys=16)
        assert seen[-1] == lens


def test_default_phase_of_a_ragged_batch_is_the_work_list():
    """``decode_paged(phase=None)`` on unequal lengths, one query row per KV head, a 16-bit cache: the plan it makes
    is ``paged_worklist``'s (``paged_default``), and the output is right; equal lengths keep ``paged_split_k``."""
    from numba_attn import api

    rng = np.random.default_rng(15)
    B, H, D, P = 3, 2, 16, 16
    kc, vc = _caches(rng, 9, P, H, D)
    table = np.array([[8, 0, 3, 5], [7, 1, 7, 2], [2, 6, 4, 0]], np.int32)
    q = rng.standard_normal((B, 1, H, D), dtype=np.float32).astype(np.float16)
    for lens, phase in (([50, 9, 33], "paged_worklist"), ([40, 40, 40], "paged_split_k")):
        lens = np.array(lens, np.int32)
        out = na.decode_paged(q, kc, vc, table, lens, warps=2)
        assert next(reversed(api._PAGED_PLANS))[0] == phase
        c = na.check(out, paged_reference(q, kc, vc, table, lens), dtype="float16")
        assert c.ok, c.reason
