"""What one launch does, counted in the CUDA simulator: memory traffic, bank conflicts, barriers, instructions.

A CPU-only user cannot time a phase, but can count what it does. :func:`counting` is a context manager
that, around one launch in Numba's CUDA simulator, puts counting proxies in the simulator's way and takes
them out again (nothing is installed outside it, and on a GPU it does nothing):

* **global memory** — every kernel argument that is an array (q, k, v, o, workspaces) reaches the kernel as
  the simulator's ``FakeWithinKernelCUDAArray``; inside the context it is a subclass that records each
  element read or written (its byte address in its allocation and its size), and so are its views;
* **shared memory** — ``cuda.shared.array`` (static and dynamic) returns an ``ndarray`` subclass that records
  each element read or written (byte offset in its buffer);
* **the project's intrinsics** — the simulator fallbacks of ``numba_attn.gpu`` (``intrinsics``, ``ptx_loads``,
  ``warp``, ``wgmma``, ``tma``) read and write NumPy arrays directly; each is replaced (its ``__code__``,
  so every reference to it, imported by name or held in a closure, sees the change) by one that records
  the instruction as the GPU executes it — ``cp.async`` as a 16-byte global read and a 16-byte shared write
  per lane, ``ldmatrix`` as one 16-byte shared read per lane, ``ldg4``/``ld_global_v4`` as one 16-byte
  global read, an ``mma`` as one warp instruction — and runs the original with the element recording off;
* **barriers** — ``cuda.syncthreads`` (and ``syncthreads_count/and/or``) per block; named barriers
  (:mod:`numba_attn.gpu.warpspec`) by their completed generations; ``syncwarp`` per warp.

Warp instructions. Every CUDA thread is a Python thread, so the 32 lanes of a warp reach an access one after
the other. An access is identified by its site — the code object and bytecode offset of the calling frame,
and whether it reads or writes which memory — and lane L's k-th execution of a site since the block's last
``syncthreads`` is grouped with the other lanes' k-th execution of it into one warp instruction. That is
exact when the lanes of a warp execute a site equally often and in the same order between two barriers (a
lane that skips the last executions, e.g. a bounds check at a tile's edge, is fine); an access under
data-dependent divergence inside a loop can be grouped with another iteration's.

Per warp instruction:

* global: the bytes, and the distinct 32-byte sectors the lanes' bytes fall in (allocations are taken as
  256-byte aligned, as ``cudaMalloc`` aligns them): a coalesced 4-byte load of 32 lanes is 4 sectors, a
  load with a stride of 32 bytes or more 32;
* shared: the bytes, and the wavefronts: lanes are served in phases — all 32 for accesses up to 4 bytes, half
  warps for 8-byte, quarter warps for 16-byte accesses (``ldmatrix``: one phase per 8×8 matrix) — and a
  phase takes as many wavefronts as the largest number of distinct 4-byte words any of the 32 banks
  (4 bytes wide) holds among its lanes' words (the same word read by several lanes is one: a broadcast).
  Bank conflicts = wavefronts − 1 summed over the phases. Each static shared array is taken to start at a
  128-byte boundary (dynamic shared memory is one buffer, offsets from its start).

Not counted (absent, never estimated): caches (global bytes are what the instructions request, not DRAM
traffic), local arrays (registers or local memory), ``prefetch``, mbarrier operations, the bank behaviour of
a ``wgmma`` operand read or a TMA write (their bytes are counted; their wavefronts are not), and an array
reached without the simulator's wrappers (a raw NumPy view a fallback hands back is re-wrapped for
``rows_head_major``, the one such fallback the phases use).

It is expensive (every element access becomes a Python call and is grouped at the end of each block):
the runner counts one launch per row (:class:`FirstLaunchCounted`).

The hooks (what is recorded, how): :mod:`numba_attn.measure.simhooks`; the arithmetic of the counts
(sectors, wavefronts, bank conflicts): :mod:`numba_attn.measure.simtally`.
"""
from __future__ import annotations

import contextlib
import threading
import time

from numba_attn.gpu.backend import IS_SIMULATOR
from numba_attn.measure.simhooks import HOOK_NAME, SITE_KIND, activate, install, uninstall  # noqa: F401
from numba_attn.measure.simtally import BANK_BYTES, BANKS, SECTOR_BYTES, WARP, add_block, with_sums  # noqa: F401

# The row fields, with their meaning (also the column table's source: numba_attn.report.table.SIM_COLUMNS).
FIELDS = {
    "sim_launches": "kernel launches of the counted call",
    "sim_blocks": "thread blocks run",
    "sim_gmem_read_bytes": "bytes the kernels' global loads request (elements × size; cp.async and TMA reads "
                           "included; no caches)",
    "sim_gmem_write_bytes": "bytes the kernels' global stores write",
    "sim_gmem_loads": "warp-level global load instructions",
    "sim_gmem_stores": "warp-level global store instructions",
    "sim_gmem_read_sectors": "32-byte sectors the warp-level global loads touch (coalescing: 4 per fully "
                             "coalesced 4-byte load of 32 lanes, 32 per scattered one)",
    "sim_gmem_write_sectors": "32-byte sectors the warp-level global stores touch",
    "sim_gmem_sectors": "read + write sectors",
    "sim_smem_load_bytes": "bytes read from shared memory (ldmatrix, wgmma B operands included)",
    "sim_smem_store_bytes": "bytes written to shared memory (cp.async and TMA writes included)",
    "sim_smem_loads": "warp-level shared load instructions (ld, ldmatrix)",
    "sim_smem_stores": "warp-level shared store instructions (st, cp.async's shared side)",
    "sim_smem_wavefronts": "shared-memory wavefronts of the warp-level loads and stores (bank model above; "
                           "wgmma and TMA not included)",
    "sim_bank_conflicts": "extra wavefronts from bank conflicts: Σ (wavefronts of a phase − 1)",
    "sim_barriers": "cuda.syncthreads completed, summed over blocks",
    "sim_named_barriers": "named barriers (bar.sync) completed, summed over blocks",
    "sim_syncwarps": "warp-level syncwarp instructions",
    "sim_shuffles": "warp-level shuffle instructions (a warp reduction counted as its butterfly's shuffles)",
    "sim_mma": "warp-level mma.sync instructions",
    "sim_ldmatrix": "warp-level ldmatrix.x4 instructions",
    "sim_cp_async": "warp-level cp.async instructions",
    "sim_wgmma": "warpgroup-level wgmma instructions (one fused fence/mma/commit/wait call)",
    "sim_tma": "TMA box loads",
    "sim_gmem_atomics": "atomic operations on global memory (per thread)",
    "sim_smem_atomics": "atomic operations on shared memory (per thread)",
    "sim_count_s": "seconds the counted launch took, counting included (2-6x an uncounted launch)",
}

_enter_lock = threading.Lock()


class _Session:
    """One counting context: the lanes of the block running, the totals, the intrinsics' hooks."""

    def __init__(self):
        self.lock = threading.Lock()
        self.block_lanes = []
        self.totals = dict.fromkeys(FIELDS, 0)
        self.hooks = {}
        self.global_cls = None

    def block_done(self, mgr):
        with self.lock:
            lanes, self.block_lanes = self.block_lanes, []
        add_block(self.totals, lanes, mgr.__dict__.get("_numba_attn_named") or {}, SITE_KIND)

    def fields(self) -> dict:
        return with_sums(self.totals)


@contextlib.contextmanager
def counting():
    """Count what the kernels launched inside do; yields a dict filled with :data:`FIELDS` when the context
    closes (empty on a GPU: nothing is counted there)."""
    result = {}
    if not IS_SIMULATOR:
        yield result
        return
    if not _enter_lock.acquire(blocking=False):
        raise RuntimeError("simcount.counting() does not nest (one launch is counted at a time)")
    sess = _Session()
    undo, codes = [], []
    t0 = time.perf_counter()
    try:
        install(sess, undo, codes)
        activate(sess)
        yield result
        result.update(sess.fields())
        result["sim_count_s"] = round(time.perf_counter() - t0, 3)
    finally:
        activate(None)
        uninstall(undo, codes)
        _enter_lock.release()


class FirstLaunchCounted:
    """``launch`` whose first call is counted (:func:`counting`); later calls run as they are. ``counts``:
    the first call's fields (empty until it finished; ``error`` says why when counting failed)."""

    def __init__(self, launch):
        self.launch = launch
        self.counts = {}
        self.error = None
        self._done = False

    def __getattr__(self, name):
        return getattr(self.launch, name)

    def __call__(self, *args, **kwargs):
        if self._done:
            return self.launch(*args, **kwargs)
        self._done = True
        with counting() as counts:
            out = self.launch(*args, **kwargs)
        self.counts = counts
        return out
