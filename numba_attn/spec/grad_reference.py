"""float64 reference gradients of attention, by the explicit formulas (no autograd).

With S = scale · Q Kᵀ, M = score_mod(S) (M = S without one; masked keys −inf), lse_i = log Σ_j exp(M_ij),
P = exp(M − lse), O = P V and the incoming gradient dO:

    dV = Pᵀ dO                      dP = dO Vᵀ
    Delta_i = Σ_d dO_id O_id  (= Σ_j P_ij dP_ij)
    dS = P ∘ (dP − Delta) ∘ score_mod'(S)        dQ = scale · dS K        dK = scale · dSᵀ Q

Grouped-query attention: dK and dV of a KV head are the sums over the query heads that read it. A row
that sees no key has P = 0 and contributes nothing. Causal masking is bottom-right aligned, as
:func:`numba_attn.spec.reference.reference`; a variant's mask_mod hides keys through the same host
evaluation; a score_mod's derivative is its Mod's ``derivative`` (refused without one).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from numba_attn.spec.reference import reference, usable_torch


@dataclass
class Grads:
    """The reference gradients and what the backward reads: O, lse (natural log) and Delta, all float64."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    o: np.ndarray
    lse: np.ndarray
    delta: np.ndarray
    dsinks: np.ndarray | None = None  # (H,) with sinks: the gradient of the sink logits

    def __iter__(self):  # dq, dk, dv = grad_reference(...)
        return iter((self.dq, self.dk, self.dv))


def hidden_keys(b, h, Nq, Nk, causal, host) -> np.ndarray | None:
    """(Nq, Nk) bool: the keys query rows do not see (causal and the variant's mask); None: all seen."""
    hidden = None
    if causal:
        hidden = np.arange(Nk)[None, :] > np.arange(Nq)[:, None] + (Nk - Nq)
    if host is not None:
        seen = host.visible(b, h, Nq, Nk)
        if seen is not None:
            hidden = ~seen if hidden is None else hidden | ~seen
    return hidden


def grad_reference(q, k, v, do, *, causal=False, scale=None, variant=None, sinks=None) -> Grads:
    """dQ, dK, dV (float64) of attention at q (B, H, Nq, D), k, v (B, Hkv, Nk, D) for the gradient ``do``
    (B, H, Nq, D) of its output. ``variant``: mask and score functions (a score function with its
    ``derivative``). ``sinks`` (H,): sink logits (:func:`~numba_attn.spec.reference.reference`'s): P over the
    keys and the sink, L = logaddexp(lse, sink), and ``dsinks`` = −Σ_{b,i} exp(sink − L_i) Delta_i. Returns
    :class:`Grads` (unpacks as ``dq, dk, dv``; ``lse`` the keys' own, ``o`` the output with the sinks)."""
    if variant is not None and variant.score is not None and variant.score.derivative is None:
        raise ValueError("grad_reference: a score_mod needs its derivative (Mod.derivative)")
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    o, lse = reference(q, k, v, causal=causal, scale=scale, return_lse=True, variant=variant, sinks=sinks)
    norm = lse  # what P is normalized by: the keys' log-sum-exp, with sinks theirs too
    if sinks is not None:
        sink = np.asarray(sinks, np.float64).reshape(1, -1, 1)
        norm = np.logaddexp(lse, sink)
    host = None
    if variant is not None:
        from numba_attn.variants.grid import HostVariant

        host = HostVariant(variant)
    do64 = np.asarray(do, np.float64)
    delta = np.einsum("bhnd,bhnd->bhn", do64, o)  # Delta_i = rowsum(dO ∘ O)
    dq = np.zeros((B, H, Nq, D))
    dk = np.zeros((B, Hkv, Nk, D))
    dv = np.zeros((B, Hkv, Nk, D))
    for b in range(B):
        for h in range(H):
            qh, kh, vh = (np.asarray(a[b, i], np.float64) for a, i in ((q, h), (k, h // G), (v, h // G)))
            s = (qh @ kh.T) * scale
            dmod = None  # score_mod'(S)
            if host is not None and variant.score is not None:
                dmod = host.derivative(s.copy(), b, h)
                s = host.modify(s, b, h)
            hidden = hidden_keys(b, h, Nq, Nk, causal, host)
            finite = np.isfinite(norm[b, h])[:, None]  # a row that sees no key (and no sink): P = 0
            with np.errstate(over="ignore", invalid="ignore"):
                p = np.where(finite, np.exp(s - np.where(finite, norm[b, h][:, None], 0.0)), 0.0)
            if hidden is not None:
                p[hidden] = 0.0
            dov = do64[b, h]
            dv[b, h // G] += p.T @ dov                     # dV = Pᵀ dO
            dp = dov @ vh.T                                # dP = dO Vᵀ
            ds = p * (dp - delta[b, h][:, None])           # dS = P ∘ (dP − Delta)
            if dmod is not None:
                ds = ds * dmod                             #      ∘ score_mod'(S)
            dq[b, h] = scale * (ds @ kh)                   # dQ = scale · dS K
            dk[b, h // G] += scale * (ds.T @ qh)           # dK = scale · dSᵀ Q
    dsinks = None
    if sinks is not None:  # d sink_h = −Σ_{b,i} P_sink,i Delta_i, P_sink = exp(sink − L)
        dsinks = -(np.exp(sink - norm) * np.where(np.isfinite(delta), delta, 0.0)).sum(axis=(0, 2))
    return Grads(dq, dk, dv, o, lse, delta, dsinks)


def grad_reference_torch(q, k, v, do, *, causal=False, scale=None, device="cuda") -> Grads | None:
    """:func:`grad_reference` (no variant) computed with torch in float64 on ``device``, a (batch, head) at a
    time, by the same formulas: for large problems on a GPU. None when torch (or its CUDA) is not usable."""
    torch = usable_torch(device)
    if torch is None:
        return None
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    dev = torch.device(device)
    out = {n: np.zeros(shape) for n, shape in (("dq", (B, H, Nq, D)), ("o", (B, H, Nq, D)), ("dk", (B, Hkv, Nk, D)),
                                                ("dv", (B, Hkv, Nk, D)), ("lse", (B, H, Nq)), ("delta", (B, H, Nq)))}

    def t64(a):
        return torch.from_numpy(np.asarray(a, np.float64)).to(dev)

    hidden = torch.from_numpy(hidden_keys(0, 0, Nq, Nk, causal, None)).to(dev) if causal else None
    with torch.no_grad():
        for b in range(B):
            for h in range(H):
                qh, kh, vh, dov = t64(q[b, h]), t64(k[b, h // G]), t64(v[b, h // G]), t64(do[b, h])
                s = (qh @ kh.T) * scale
                if hidden is not None:
                    s = s.masked_fill(hidden, float("-inf"))
                lse = torch.logsumexp(s, dim=1)
                finite = torch.isfinite(lse)[:, None]
                p = torch.where(finite, torch.exp(s - torch.where(finite, lse[:, None], 0.0)), 0.0)
                o = p @ vh
                delta = (dov * o).sum(dim=1)                 # Delta_i = rowsum(dO ∘ O)
                ds = p * (dov @ vh.T - delta[:, None])        # dS = P ∘ (dP − Delta)
                for name, val in (("o", o), ("lse", lse), ("delta", delta), ("dq", scale * (ds @ kh))):
                    out[name][b, h] = val.cpu().numpy()
                out["dv"][b, h // G] += (p.T @ dov).cpu().numpy()       # dV = Pᵀ dO
                out["dk"][b, h // G] += (scale * (ds.T @ qh)).cpu().numpy()  # dK = scale · dSᵀ Q
    return Grads(out["dq"], out["dk"], out["dv"], out["o"], out["lse"], out["delta"])


def attention_loss(q, k, v, do, *, causal=False, scale=None, variant=None, sinks=None) -> float:
    """Σ O ∘ dO in float64: the scalar whose gradients :func:`grad_reference` returns (finite differences)."""
    o = reference(q, k, v, causal=causal, scale=scale, variant=variant, sinks=sinks)
    return float(np.sum(np.where(np.isfinite(o), o, 0.0) * np.asarray(do, np.float64)))


TORCH_GRAD_REFERENCE_FLOPS = 1e10  # above: the float64 gradients computed by torch on the GPU (when it has one)
_CASES: OrderedDict = OrderedDict()  # (problem, seed) -> backward_case's result, the last two


def backward_case(problem, seed: int):
    """(q, k, v, do, reference) of ``problem`` for ``seed``: its seeded inputs in its dtype, a random dO drawn
    after them, and the float64 :class:`Grads` (o, lse and the gradients; the
    problem's variant applied). The last two are kept (a run's rows of one problem, its phases then its peers,
    share them), read-only."""
    from numba_attn.spec.problem import numpy_dtype

    try:
        key = (problem, seed)
        hash(key)
    except TypeError:  # a variant holding arrays: not kept
        key = None
    if key in _CASES:
        return _CASES[key]
    q, k, v = problem.inputs(seed)
    do = np.random.default_rng(seed + 1000).standard_normal(q.shape).astype(numpy_dtype(problem.dtype))
    variant = getattr(problem, "variant", None)
    ref = None
    if variant is None and problem.flops() > TORCH_GRAD_REFERENCE_FLOPS:  # None without torch's CUDA
        ref = grad_reference_torch(q, k, v, do, causal=problem.causal, scale=problem.scale)
    if ref is None:
        ref = grad_reference(q, k, v, do, causal=problem.causal, scale=problem.scale, variant=variant)
    case = (q, k, v, do, ref)
    if key is not None:
        for a in (q, k, v, do, *(x for x in vars(ref).values() if x is not None)):
            a.flags.writeable = False
        _CASES[key] = case
        while len(_CASES) > 2:
            _CASES.popitem(last=False)
    return case
