"""GPU building blocks shared by the phases, each with an exact simulator fallback.

* ``backend.py``          — CUDA or the CUDA simulator, chosen before numba is imported
* ``jit.py``              — the ``kernel`` / ``device`` decorators (fastmath, simulator options)
* ``simulator_fixes.py``  — a race in the simulator's ``cuda.shared.array`` fixed, a block manager that waits instead of polling (installed by ``jit.py``)
* ``warp.py``             — shuffles and warp/quad reductions (per-lane simulator emulation)
* ``device_functions.py`` — online softmax, tile loads, split combine, fragment softmax; constants
* ``ptx_loads.py``        — 16-byte loads and stores (inline PTX), dynamic shared memory
* ``intrinsics.py``       — the index of the inline-PTX intrinsics, re-exported from ``mma_sync.py``,
  ``cp_async.py``, ``loads.py``, ``convert.py``, ``bits.py`` (host bit models) and ``inline_ptx.py`` (plumbing)
* ``prefetch.py``         — L2 prefetch of a global address (decode)
* ``wgmma.py``            — Hopper wgmma and its swizzled shared-memory layouts
* ``pdl.py``              — programmatic dependent launch (griddepcontrol)
* ``split_k.py``          — split-K plan and the log-sum-exp combine kernel
"""
