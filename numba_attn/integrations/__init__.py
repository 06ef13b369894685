"""numba-attn inside PyTorch programs: each module here imports torch (and registers what it
provides) on its first import; ``import numba_attn`` imports none of them.

* :mod:`numba_attn.integrations.torch_op` — ``torch.ops.numba_attn.attention``, a PyTorch
  operator (``torch.library.custom_op``, forward only) that traces under ``torch.compile``.
"""
