"""Check, time and record: a phase on a problem becomes a result row.

Modules: ``runner`` (the sweep and one measured row), ``timing`` (events, graphs, the second method),
``peers`` (PyTorch SDPA), ``ceilings`` (FFMA, mma, wgmma, copy), ``env`` (the environment record),
``bench`` (declared benchmarks behind ``numba-attn bench``), ``offline`` (registers/spills without a GPU).
"""
