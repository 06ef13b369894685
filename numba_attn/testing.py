"""Test fixtures: deliberately wrong kernels and faulty phases.

Nothing here is registered in the public registry unless asked:

* :func:`buggy_phase` returns an unregistered :class:`~numba_attn.phases.registry.Phase`
  whose kernel has one classic bug (``BUGS``); ``"none"`` is the same kernel
  without a bug, the control. The correctness gate must reject every bug.
* :func:`temporary_phases` registers phases for the duration of a ``with``
  block and removes them afterwards.
* :func:`register_faulty_phases` registers phases that hang, raise, compute
  the wrong answer, ask for more threads or shared memory than a block may
  have, or kill the worker process that measures them; the runner
  calls it in its worker processes through ``RunConfig.worker_setup`` (or
  ``numba-attn run --setup numba_attn.testing:register_faulty_phases``).
"""
from __future__ import annotations

import functools
import os

from numba_attn.gpu import backend  # noqa: F401  (first: chooses CUDA or the simulator before numba is imported)

from numba import cuda, float32  # noqa: E402

from numba_attn.gpu.device_functions import row_key_step, visible_keys
from numba_attn.gpu.jit import kernel
from numba_attn.phases.cuda_core.common import kv_head, row_block_launch, start_row_q
from numba_attn.phases.registry import Launch, Phase, load_all, register_if_absent, unregister
from numba_attn.phases.registry import temporary_phases  # noqa: F401  (re-exported)

# bug name → what it emulates
BUGS = {
    "none": "no bug (control: must pass)",
    "tile_edge": "off-by-one tile edge: the number of key tiles is rounded down, the partial last tile is dropped",
    "stale_tile": "missing barrier, emulated: from the second tile on, rows read the previous tile's K/V "
                  "(what a warp sees when the tile is read before every thread has stored it)",
    "unscaled": "softmax of unscaled scores (the 1/sqrt(d) scale is forgotten)",
    "unnormalized": "the accumulator is never divided by the softmax sum l",
    "unwritten": "the last output column is never written",
    "zeros": "the kernel writes zeros",
}
_BUG_IDS = {name: i for i, name in enumerate(BUGS)}
BUGGY_BC = 4  # key-tile size of the buggy kernels


@functools.cache
def make_buggy_kernel(D: int, Bc: int, causal: bool, bug: int):
    TILE_EDGE, STALE, UNSCALED, UNNORMALIZED, UNWRITTEN, ZEROS = (
        _BUG_IDS["tile_edge"], _BUG_IDS["stale_tile"], _BUG_IDS["unscaled"], _BUG_IDS["unnormalized"],
        _BUG_IDS["unwritten"], _BUG_IDS["zeros"])

    key_step = row_key_step(D)

    @kernel
    def buggy(q, k, v, o, scale, H, G, Nq, Nk, mods):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        bh = cuda.blockIdx.y
        if i >= Nq:
            return
        if bug == ZEROS:
            for d in range(D):
                o[bh, i, d] = float32(0.0)
            return
        kvh = kv_head(bh, H, G)
        sc = float32(1.0) if bug == UNSCALED else scale
        Q_i = cuda.local.array(D, float32)
        O_i = cuda.local.array(D, float32)
        m, l = start_row_q(Q_i, O_i, q, bh, i, sc, True)
        n_keys = visible_keys(i, Nq, Nk, causal)
        n_tiles = n_keys // Bc if bug == TILE_EDGE else (n_keys + Bc - 1) // Bc
        for t in range(n_tiles):
            j0 = t * Bc
            for jj in range(min(Bc, n_keys - j0)):
                j = j0 + jj
                if bug == STALE and t > 0:
                    j = j - Bc
                m, l = key_step(Q_i, O_i, k, v, kvh, j, m, l, (0, 0, 0), mods)
        inv_l = float32(1.0) if bug == UNNORMALIZED else float32(1.0) / l
        for d in range(D):
            if bug == UNWRITTEN and d == D - 1:
                continue
            o[bh, i, d] = O_i[d] * inv_l

    return buggy


def _build_buggy(bug: str):
    def build(problem, threads=32):
        kern = make_buggy_kernel(problem.head_dim, BUGGY_BC, problem.causal, _BUG_IDS[bug])
        return row_block_launch(kern, problem, threads, threads)

    return build


def buggy_phase(bug: str) -> Phase:
    """An unregistered phase whose kernel has the named bug (see ``BUGS``)."""
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; bugs: {', '.join(BUGS)}")
    return Phase(name=f"buggy_{bug}", order=900 + _BUG_IDS[bug], title=f"deliberately wrong: {bug}",
                 parent=None, description=BUGS[bug], lineage="test fixture", planned_speedup=None,
                 build=_build_buggy(bug), params={"threads": 32}, dtypes=("float32",), module=__name__)


# -- faulty phases for the isolation tests --------------------------------------------


@functools.cache
def _hang_kernel():
    @kernel
    def hang(o, n):
        i = 0
        while i >= 0:  # never exits
            i = (i + 1) % n
        o[0, 0, 0] = float32(i)

    return hang


@functools.cache
def _oob_kernel():
    @kernel
    def oob(o, Nq):
        o[0, Nq + cuda.threadIdx.x, 0] = float32(1.0)  # past the end: the simulator raises IndexError

    return oob


BIG_SMEM_FLOATS = 256 * 1024 // 4  # 256 KiB of static shared memory: over what any GPU gives a block (227 KiB on sm_90)


@functools.cache
def _big_smem_kernel():
    @kernel
    def big_smem(o):
        buf = cuda.shared.array(BIG_SMEM_FLOATS, float32)
        buf[cuda.threadIdx.x] = float32(1.0)
        cuda.syncthreads()
        o[0, 0, 0] = buf[0]

    return big_smem


def _big_smem_build(problem):
    kern = _big_smem_kernel()

    def run(q, k, v, o, stream=0):
        kern[1, 32, stream](o)

    return Launch(run, kernels=[kern])


def _hang_build(problem):
    kern = _hang_kernel()

    def run(q, k, v, o, stream=0):
        kern[1, 1, stream](o, 1000)

    return Launch(run, kernels=[kern])


def _raise_build(problem):
    kern = _oob_kernel()

    def run(q, k, v, o, stream=0):
        kern[1, 1, stream](o, problem.q_len)

    return Launch(run, kernels=[kern])


def _too_many_threads_build(problem):
    inner = _build_buggy("none")(problem, threads=2048)
    return inner


DIE_ONCE_ENV = "NUMBA_ATTN_TEST_DIE_ONCE"  # a file path: test_die_once kills its process while it is absent


def _die_build(problem):
    os._exit(17)  # the worker process dies: no row comes back


def _die_once_build(problem):
    marker = os.environ.get(DIE_ONCE_ENV)
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(17)
    return _build_buggy("none")(problem)


def faulty_phases() -> list[Phase]:
    def mk(name, order, desc, build, params=None):
        return Phase(name=name, order=order, title=desc, parent=None, description=desc,
                     lineage="test fixture", planned_speedup=None, build=build, params=params or {},
                     dtypes=("float32",), module=__name__)

    return [
        mk("test_hang", 990, "kernel that never returns", _hang_build),
        mk("test_raise", 991, "kernel that writes out of bounds", _raise_build),
        mk("test_wrong", 992, "kernel with an unscaled softmax", _build_buggy("unscaled"), {"threads": 32}),
        mk("test_too_many_threads", 993, "launch with 2048 threads per block", _too_many_threads_build),
        mk("test_big_smem", 994, "256 KiB of static shared memory per block", _big_smem_build),
        mk("test_die", 995, "kills its worker process", _die_build),
        mk("test_die_once", 996, f"kills its worker process once (when ${DIE_ONCE_ENV} names a file that is "
                                 "absent: it creates it), then a correct kernel", _die_once_build),
    ]


def register_faulty_phases():
    """Register :func:`faulty_phases` in this process (worker processes of tests)."""
    load_all()
    for p in faulty_phases():
        register_if_absent(p)


def unregister_faulty_phases():
    for p in faulty_phases():
        unregister(p.name)
