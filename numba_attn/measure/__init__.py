"""Check, time and record: a phase on a problem becomes a result row.

The flow, one module per step:

* ``limits`` — what fits: memory a check needs against what is free; device limits (also in the simulator);
* ``check`` — the correctness gate of a launch against the cached float64 reference;
* ``timing`` — events, graph replay, the second method; ``time_launch`` times a checked launch;
* ``row`` — ``measure()``: one phase on one problem → one row (resources, throughput, plausibility);
* ``status`` — OK / FAIL / ERROR / TIMEOUT / SKIP, and which an exception becomes;
* ``sweep`` — ``run()``: phases × problems → rows, with ``config`` (``RunConfig``), ``isolation`` (worker
  processes with time limits) and ``results`` (JSON-lines files, resume);
* ``peers`` (PyTorch SDPA), ``ceilings`` (FFMA, mma, wgmma, copy), ``env`` (the environment record),
  ``bench`` (declared benchmarks behind ``numba-attn bench``), ``offline`` (registers/spills without a GPU).
"""
