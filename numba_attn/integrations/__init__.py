"""numba-attn inside PyTorch programs and other libraries' models; ``import numba_attn`` imports none of
these modules, and none is needed without torch (the optional extra ``torch``).

* :mod:`numba_attn.integrations.torch_op` — ``torch.ops.numba_attn.attention``, a PyTorch
  operator (``torch.library.custom_op``, forward only) that traces under ``torch.compile``; imports
  torch (and registers the operator) on its first import.
* :mod:`numba_attn.integrations.transformers` — ``register()``: numba-attn as a Hugging Face
  transformers attention implementation (``attn_implementation="numba_attn"``); imports torch and
  transformers when ``register()`` is called.
"""
