"""PyTorch tensors through attention(): tensors in, tensors out (CPU tensors in the simulator, CUDA
tensors too on a GPU), out=, mixed kinds refused, stream=, the plan cache, and the
``numba_attn::attention`` operator (eager, under ``torch.compile`` and ``torch.library.opcheck``).
Skipped, with the reason, without torch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install -e '.[torch]')")

from numba import cuda  # noqa: E402

import numba_attn.api as api  # noqa: E402
from numba_attn import array_kinds, plans  # noqa: E402
from numba_attn import Problem, attention, check, explain, reference  # noqa: E402
from numba_attn.gpu.backend import IS_SIMULATOR  # noqa: E402
from numba_attn.phases.registry import Phase  # noqa: E402
from numba_attn.spec.errors import AttentionInputError  # noqa: E402

P = Problem(batch=1, heads=2, q_len=5, kv_len=9, head_dim=16)
Q, K, V = P.inputs(1)
SMEM = dict(phase="smem_kv", Br=16, Bc=16)  # small tiles: quick in the simulator
DEVICES = ["cpu"] + (["cuda"] if not IS_SIMULATOR and torch.cuda.is_available() else [])
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _no_plans():
    api.clear_plans()
    yield
    api.clear_plans()


def tensors(arrays, dtype="float32", device="cpu"):
    return tuple(torch.from_numpy(np.asarray(a, np.float32)).to(DTYPES[dtype]).to(device) for a in arrays)


def host(t):
    """A tensor as a NumPy array of its dtype (bfloat16: ml_dtypes')."""
    return array_kinds.tensor_as_numpy("t", t.detach().cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tensors_in_tensors_out(dtype, device):
    q, k, v = tensors((Q, K, V), dtype, device)
    out = attention(q, k, v, causal=True, **SMEM)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.device == q.device
    assert out.shape == q.shape and out.is_contiguous()
    ref = reference(*(host(t) for t in (q, k, v)), causal=True)
    assert check(host(out), ref, dtype=dtype).ok
    assert torch.equal(attention(q, k, v, causal=True, **SMEM), out)  # the cached plan: the same result


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_tensors(device):
    pytest.importorskip("ml_dtypes", reason="bfloat16 inputs are read through ml_dtypes")
    q, k, v = tensors((Q, K, V), "bfloat16", device)
    out = attention(q, k, v, phase="tc_mma", warps=2, Bc=16)
    assert out.dtype == torch.bfloat16 and out.device == q.device
    assert check(host(out), reference(*(host(t) for t in (q, k, v))), dtype="bfloat16").ok


def test_cpu_tensors_are_read_without_a_copy(monkeypatch):
    q, k, v = tensors((Q, K, V))
    seen = []
    real = plans.run

    def spy(plan, kind, q_, k_, v_, out):
        seen.append((q_, k_, v_))
        return real(plan, kind, q_, k_, v_, out)

    monkeypatch.setattr(plans, "run", spy)
    attention(q, k, v, **SMEM)
    qa, ka, va = seen[0]
    assert all(isinstance(a, np.ndarray) and np.shares_memory(a, t.numpy()) for a, t in ((qa, q), (ka, k), (va, v)))


def test_non_contiguous_cpu_tensors_are_copied():
    q, k, v = tensors((Q, K, V))
    q_nc = q.transpose(2, 3).contiguous().transpose(2, 3)
    assert not q_nc.is_contiguous()
    assert torch.equal(attention(q_nc, k, v, **SMEM), attention(q, k, v, **SMEM))


@pytest.mark.parametrize("device", DEVICES)
def test_out_is_written_in_place_and_returned(device):
    q, k, v = tensors((Q, K, V), device=device)
    out = torch.full_like(q, float("nan"))
    for _ in range(2):  # planned, then from the cached plan
        got = attention(q, k, v, out=out, **SMEM)
        assert got is out
        assert check(host(out), reference(Q, K, V)).ok


BAD_OUT = [
    ("shape", lambda q: torch.empty(1, 2, 5, 8), "out has shape (1, 2, 5, 8); it must have q's shape (1, 2, 5, 16)"),
    ("dtype", lambda q: torch.empty(q.shape, dtype=torch.float16),
     "out has dtype float16; it must have q's dtype float32"),
    ("strided", lambda q: torch.empty(1, 2, 16, 5).transpose(2, 3), "out is not C-contiguous"),
    ("kind: NumPy", lambda q: np.empty(Q.shape, np.float32), "out is a NumPy array but q is a CPU tensor"),
    ("kind: device array", lambda q: cuda.device_array(Q.shape, np.float32),
     "out is a numba device array but q is a CPU tensor"),
    ("not an array", lambda q: "out", "out must be a CPU tensor like q (or None); got str"),
    ("aliases q", lambda q: q, "out shares memory with q"),
]


@pytest.mark.parametrize("case,make,msg", BAD_OUT, ids=[c[0] for c in BAD_OUT])
def test_bad_out_is_refused_naming_out(case, make, msg):
    q, k, v = tensors((Q, K, V))
    with pytest.raises(AttentionInputError) as exc:
        attention(q, k, v, out=make(q), **SMEM)
    assert msg in str(exc.value)


MIXED = [
    ("k NumPy", lambda q, k, v: (q, K, v), "k is a NumPy array but q is a CPU tensor"),
    ("v device array", lambda q, k, v: (q, k, cuda.to_device(V)), "v is a numba device array but q is a CPU tensor"),
    ("q NumPy", lambda q, k, v: (Q, k, v), "k is a CPU tensor but q is a NumPy array"),
]


@pytest.mark.parametrize("case,make,msg", MIXED, ids=[c[0] for c in MIXED])
def test_mixed_kinds_are_refused_naming_the_argument(case, make, msg):
    with pytest.raises(AttentionInputError) as exc:
        attention(*make(*tensors((Q, K, V))), **SMEM)
    assert msg in str(exc.value)


def test_tensor_checks_name_the_argument():
    q, k, v = tensors((Q, K, V))
    with pytest.raises(AttentionInputError, match="q has dtype float64"):
        attention(q.double(), k.double(), v.double(), **SMEM)
    with pytest.raises(AttentionInputError, match="k and v must have the same shape"):
        attention(q, k, v[:, :, :4], **SMEM)
    with pytest.raises(AttentionInputError, match="q must be a 4-D array"):
        attention(q[0], k[0], v[0], **SMEM)
    bad = q.clone()
    bad[0, 1, 2, 3] = float("inf")
    for _ in range(2):  # planned, then cached: the scan runs on every call
        with pytest.raises(AttentionInputError, match=r"q contains 1 NaN/Inf value\(s\), the first at \(0, 1, 2, 3\)"):
            attention(bad, k, v, nonfinite="raise", **SMEM)
        attention(q, k, v, nonfinite="raise", **SMEM)
    assert explain(q, k, v, **SMEM).name == "smem_kv"


def test_stream_argument():
    q, k, v = tensors((Q, K, V))
    ref = attention(q, k, v, **SMEM)
    if IS_SIMULATOR:
        s = cuda.stream()  # the simulator's stream: computed at once
    else:
        s = torch.cuda.Stream()
    assert torch.equal(attention(q, k, v, stream=s, **SMEM), ref)
    with pytest.raises(AttentionInputError, match="stream must be None"):
        attention(q, k, v, stream=3.5, **SMEM)


def test_a_cached_plan_is_not_planned_again_and_a_new_shape_is(monkeypatch):
    counts = {"checks": 0, "builds": 0}
    real_plan, real_build = api._plan, Phase.plan
    monkeypatch.setattr(api, "_plan", lambda *a, **kw: counts.__setitem__("checks", counts["checks"] + 1)
                        or real_plan(*a, **kw))
    monkeypatch.setattr(Phase, "plan", lambda self, *a, **kw: counts.__setitem__("builds", counts["builds"] + 1)
                        or real_build(self, *a, **kw))
    q, k, v = tensors((Q, K, V))
    attention(q, k, v, **SMEM)
    attention(q + 1, k, v, **SMEM)  # other data, same plan
    assert counts == {"checks": 1, "builds": 1}
    attention(q[:, :, :3].contiguous(), k, v, **SMEM)
    attention(q.half(), k.half(), v.half(), **SMEM)
    assert counts == {"checks": 3, "builds": 3}


@pytest.mark.skipif(not DEVICES[1:], reason="needs a CUDA GPU with PyTorch's CUDA build")
def test_cuda_tensors_are_refused_when_not_contiguous():
    q, k, v = tensors((Q, K, V), device="cuda")
    with pytest.raises(AttentionInputError, match=r"q is a non-contiguous tensor .*q.contiguous\(\)"):
        attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, **SMEM)
    with pytest.raises(AttentionInputError, match="k is a CPU tensor but q is a CUDA tensor"):
        attention(q, k.cpu(), v, **SMEM)


# -- the PyTorch operator --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def op():
    import numba_attn.integrations.torch_op  # noqa: F401  (registers numba_attn::attention)

    return torch.ops.numba_attn.attention


def test_operator_equals_attention(op):
    q, k, v = tensors((Q, K, V))
    got = op(q, k, v, causal=True, scale=0.3, phase="smem_kv")
    assert torch.equal(got, attention(q, k, v, causal=True, scale=0.3, phase="smem_kv"))
    assert check(host(got), reference(Q, K, V, causal=True, scale=0.3)).ok


def test_operator_traces_under_torch_compile(op):
    q, k, v = tensors((Q, K, V))

    def f(q, k, v):
        return op(q, k, v, causal=True, phase="smem_kv") * 2.0

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v), f(q, k, v))
    torch.library.opcheck(op.default, (q, k, v, True, None, "smem_kv"))
