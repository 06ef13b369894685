"""``torch.ops.numba_attn.attention``: numba-attn's ``attention()`` as a PyTorch operator.

Importing this module registers ``numba_attn::attention`` with ``torch.library.custom_op``
(forward only, no autograd formula)::

    import numba_attn.integrations.torch_op  # registers the operator (imports torch)
    out = torch.ops.numba_attn.attention(q, k, v, causal=True, scale=None, phase=None)

q (B, H, Nq, D) and k, v (B, Hkv, Nk, D) are tensors of one dtype (float32, float16,
bfloat16): CUDA tensors are computed on PyTorch's current stream without copies, CPU tensors in
the simulator (or copied to the GPU and back); the result is a new tensor of q's shape, dtype and
device. ``phase=None`` chooses the phase (:func:`numba_attn.measure.policy.choose_phase`); a name runs that
phase with its default (or tuned) parameters. The fake implementation (an empty tensor like q)
lets ``torch.compile`` trace a function that calls the operator (``fullgraph=True`` works): the
operator is an opaque call in the graph, run eagerly.
"""
# no ``from __future__ import annotations``: custom_op reads the schema from these annotations
from typing import Optional

import torch

from numba_attn.api import attention as _attention

OP_NAME = "numba_attn::attention"


@torch.library.custom_op(OP_NAME, mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None, phase: Optional[str] = None) -> torch.Tensor:
    """Softmax attention of q over k, v by a numba-attn phase (see :func:`numba_attn.attention`)."""
    return _attention(q, k, v, causal=causal, scale=scale, phase=phase)


@attention.register_fake
def _attention_fake(q, k, v, causal=False, scale=None, phase=None):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)
