"""Simulator counts (numba_attn.measure.simcount) on kernels whose counts can be worked out by hand, one phase
pair (smem_kv against fused_rowwise), and the compare / plot of a counted results file."""
import json
import os

import numpy as np
import pytest

from numba_attn.gpu.backend import IS_SIMULATOR

pytestmark = pytest.mark.skipif(not IS_SIMULATOR, reason="the counts are the simulator's")

if IS_SIMULATOR:
    from numba import cuda, float32, uint16, uint32

    from numba_attn.gpu.intrinsics import cp_async16_flat, cp_async_commit, cp_async_wait, ldmatrix_x4, mma_f16
    from numba_attn.gpu.warp import syncwarp, warp_sum
    from numba_attn.gpu.warpspec import named_barrier_sync
    from numba_attn.measure.simcount import counting

    @cuda.jit
    def copy_kernel(a, b):
        i = cuda.grid(1)
        b[i] = a[i]

    @cuda.jit
    def strided_kernel(a, b, stride):
        i = cuda.grid(1)
        b[i] = a[i * stride]

    @cuda.jit
    def transpose_padded(a, b):  # one warp: lane = column; the tile is written by rows, read by columns
        t = cuda.shared.array((32, 33), float32)
        lane = cuda.threadIdx.x
        for r in range(32):
            t[r, lane] = a[r, lane]
        cuda.syncthreads()
        for c in range(32):
            b[c, lane] = t[lane, c]

    @cuda.jit
    def transpose_unpadded(a, b):
        t = cuda.shared.array((32, 32), float32)
        lane = cuda.threadIdx.x
        for r in range(32):
            t[r, lane] = a[r, lane]
        cuda.syncthreads()
        for c in range(32):
            b[c, lane] = t[lane, c]

    @cuda.jit
    def two_way_and_broadcast(b):
        t = cuda.shared.array(64, float32)
        lane = cuda.threadIdx.x
        t[lane] = float32(lane)
        t[lane + 32] = float32(lane)
        cuda.syncthreads()
        b[lane] = t[2 * lane] + t[0]  # stride 2 words: lanes l and l+16 share a bank (2-way); t[0]: a broadcast

    @cuda.jit
    def barriers_kernel(b, n):
        for _ in range(n):
            cuda.syncthreads()
        syncwarp()
        named_barrier_sync(1, 64)
        b[cuda.grid(1)] = warp_sum(float32(1.0))

    @cuda.jit
    def cp_async_kernel(src, dst):
        sh = cuda.shared.array((32, 4), float32)
        lane = cuda.threadIdx.x
        cp_async16_flat(sh, 4 * lane, src, 4 * lane, True)  # 16 bytes per lane, global → shared
        cp_async_commit()
        cp_async_wait(0)
        cuda.syncthreads()
        for j in range(4):
            dst[lane, j] = sh[lane, j]

    @cuda.jit
    def ldmatrix_contiguous(out):
        sh = cuda.shared.array((32, 8), uint16)  # 16-byte rows back to back
        lane = cuda.threadIdx.x
        r = ldmatrix_x4(sh, lane, 0)
        d = mma_f16(r[0], r[1], r[2], r[3], uint32(0), uint32(0), float32(0), float32(0), float32(0), float32(0))
        out[lane] = d[0]

    @cuda.jit
    def ldmatrix_strided(out):
        sh = cuda.shared.array((32, 64), uint16)  # 128-byte rows: the 8 rows of a matrix in the same 4 banks
        lane = cuda.threadIdx.x
        r = ldmatrix_x4(sh, lane, 0)
        out[lane] = r[0]


def _nonzero(c):
    return {k: v for k, v in c.items() if v and k != "sim_count_s"}


def test_coalesced_copy():
    a = cuda.to_device(np.arange(64, dtype=np.float32))
    b = cuda.device_array(64, np.float32)
    with counting() as c:
        copy_kernel[2, 32](a, b)
    # 2 warps × one 4-byte load and one store of 32 consecutive elements: 128 bytes = 4 sectors each
    assert _nonzero(c) == {"sim_launches": 1, "sim_blocks": 2, "sim_gmem_read_bytes": 256, "sim_gmem_write_bytes": 256,
                           "sim_gmem_loads": 2, "sim_gmem_stores": 2, "sim_gmem_read_sectors": 8,
                           "sim_gmem_write_sectors": 8, "sim_gmem_sectors": 16}


def test_strided_loads_touch_a_sector_per_lane():
    a = cuda.to_device(np.arange(32 * 8, dtype=np.float32))
    b = cuda.device_array(32, np.float32)
    with counting() as c:
        strided_kernel[1, 32](a, b, 8)  # 32 bytes apart: every lane in its own sector
    assert (c["sim_gmem_loads"], c["sim_gmem_read_sectors"], c["sim_gmem_read_bytes"]) == (1, 32, 128)
    with counting() as c:
        strided_kernel[1, 32](a, b, 2)  # 8 bytes apart: 256 bytes, 8 sectors
    assert (c["sim_gmem_read_sectors"], c["sim_gmem_write_sectors"]) == (8, 4)
    assert np.array_equal(b.copy_to_host(), np.arange(0, 64, 2, dtype=np.float32))


def test_shared_transpose_bank_conflicts():
    host = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    a, b = cuda.to_device(host), cuda.device_array((32, 32), np.float32)
    with counting() as c:
        transpose_padded[1, 32](a, b)
    assert np.array_equal(b.copy_to_host(), host.T)
    # 32 row stores + 32 column loads, each one wavefront: a row of 33 words puts column c of the 32 rows
    # in 32 different banks
    assert (c["sim_smem_stores"], c["sim_smem_loads"], c["sim_smem_wavefronts"], c["sim_bank_conflicts"]) == \
        (32, 32, 64, 0)
    assert (c["sim_smem_load_bytes"], c["sim_smem_store_bytes"], c["sim_barriers"]) == (4096, 4096, 1)
    with counting() as c:
        transpose_unpadded[1, 32](a, b)
    assert np.array_equal(b.copy_to_host(), host.T)
    # rows of 32 words: a column is 32 words in one bank, 32 wavefronts per load (31 extra), stores 1 each
    assert (c["sim_smem_wavefronts"], c["sim_bank_conflicts"]) == (32 + 32 * 32, 32 * 31)


def test_two_way_conflict_and_broadcast():
    b = cuda.device_array(32, np.float32)
    with counting() as c:
        two_way_and_broadcast[1, 32](b)
    # stores: 2 × 1 wavefront; t[2·lane]: 2 wavefronts (1 conflict); t[0]: 1 wavefront (a broadcast)
    assert (c["sim_smem_loads"], c["sim_smem_stores"], c["sim_smem_wavefronts"], c["sim_bank_conflicts"]) == \
        (2, 2, 5, 1)


def test_barriers_and_warp_instructions():
    b = cuda.device_array(128, np.float32)
    with counting() as c:
        barriers_kernel[2, 64](b, 3)
    assert (c["sim_barriers"], c["sim_named_barriers"], c["sim_syncwarps"]) == (2 * 3, 2, 4)
    assert c["sim_shuffles"] == 4 * 5  # a warp sum is a 5-step butterfly, per warp
    assert np.all(b.copy_to_host() == 32)


def test_cp_async_counts_a_global_read_and_a_shared_write():
    src = cuda.to_device(np.arange(128, dtype=np.float32))
    dst = cuda.device_array((32, 4), np.float32)
    with counting() as c:
        cp_async_kernel[1, 32](src, dst)
    assert np.array_equal(dst.copy_to_host().reshape(-1), np.arange(128, dtype=np.float32))
    assert c["sim_cp_async"] == 1
    # one cp.async: 512 bytes read (16 sectors), 512 written to shared in 4 quarter-warp wavefronts
    assert (c["sim_gmem_loads"], c["sim_gmem_read_bytes"], c["sim_gmem_read_sectors"]) == (1, 512, 16)
    # sh[lane, j]: lanes 16 bytes apart, 4 lanes per bank: 4 loads × 4 wavefronts (3 extra each)
    assert (c["sim_smem_stores"], c["sim_smem_store_bytes"]) == (1, 512)
    assert (c["sim_smem_loads"], c["sim_smem_wavefronts"], c["sim_bank_conflicts"]) == (4, 4 + 16, 12)
    # dst[lane, j]: 4 stores, each 32 lanes 16 bytes apart = 512 bytes = 16 sectors
    assert (c["sim_gmem_stores"], c["sim_gmem_write_sectors"], c["sim_gmem_write_bytes"]) == (4, 64, 512)


def test_ldmatrix_phases_and_mma():
    out = cuda.device_array(32, np.float32)
    with counting() as c:
        ldmatrix_contiguous[1, 32](out)
    assert (c["sim_ldmatrix"], c["sim_mma"], c["sim_smem_loads"], c["sim_smem_load_bytes"]) == (1, 1, 1, 512)
    assert (c["sim_smem_wavefronts"], c["sim_bank_conflicts"]) == (4, 0)  # one 128-byte wavefront per matrix
    out = cuda.device_array(32, np.uint32)
    with counting() as c:
        ldmatrix_strided[1, 32](out)
    assert (c["sim_smem_wavefronts"], c["sim_bank_conflicts"]) == (32, 28)  # 8 rows in the same 4 banks: 8-way


def test_counting_leaves_nothing_behind():
    from numba.cuda.simulator import kernel as simk
    from numba.cuda.simulator import kernelapi as sima

    from numba_attn.gpu import intrinsics

    code, wrapper, array = intrinsics.cp_async16_flat.__code__, simk.FakeWithinKernelCUDAArray, \
        sima.FakeCUDAShared.array
    with counting():
        assert intrinsics.cp_async16_flat.__code__ is not code
        with pytest.raises(RuntimeError, match="does not nest"):
            with counting():
                pass
    assert intrinsics.cp_async16_flat.__code__ is code
    assert simk.FakeWithinKernelCUDAArray is wrapper and sima.FakeCUDAShared.array is array
    assert "__numba_attn_simcount__" not in vars(intrinsics)


@pytest.fixture(scope="module")
def counted_pair(tmp_path_factory):
    """fused_rowwise and smem_kv on one problem through the runner (one seed), written to a results file."""
    from numba_attn.measure.config import RunConfig
    from numba_attn.measure.row import measure
    from numba_attn.spec.problem import Problem

    prob = Problem(batch=1, heads=2, q_len=12, kv_len=20, head_dim=8)
    cfg = RunConfig(seeds=(1,))
    mp = pytest.MonkeyPatch()
    mp.setenv("NUMBA_ATTN_SIM_COUNTS", "1")  # (what numba-attn run --counts sets)
    try:
        rows = [measure(name, prob, cfg) for name in ("fused_rowwise", "smem_kv")]
    finally:
        mp.undo()
    from numba_attn.measure.row import sim_counts_enabled

    assert sim_counts_enabled() is (os.environ.get("NUMBA_ATTN_SIM_COUNTS") == "1")  # off unless asked for
    path = tmp_path_factory.mktemp("counts") / "sim.jsonl"
    env = {"type": "env", "env_key": "k", "backend": "simulator", "gpu": None, "date": "2026-01-01", "commit": "c"}
    with open(path, "w") as f:
        for r in [env] + rows:
            f.write(json.dumps({**r, "env_key": "k"}) + "\n")
    return prob, rows, str(path)


def test_smem_kv_reads_kv_once_per_block_where_fused_rowwise_reads_it_once_per_row(counted_pair):
    prob, (fused, smem), _ = counted_pair
    assert fused["status"] == smem["status"] == "OK"
    assert smem["params"]["Br"] >= prob.q_len  # one block holds every query row of a head
    BH, Nq, Nk, D, f32 = prob.batch * prob.heads, prob.q_len, prob.kv_len, prob.head_dim, 4
    q_bytes = BH * Nq * D * f32
    # fused_rowwise: each query row's thread reads Q's row, and all of K and V
    assert fused["sim_gmem_read_bytes"] == q_bytes + BH * Nq * Nk * 2 * D * f32
    # smem_kv: the block reads every K/V tile once into shared memory, and its Nq rows read it from there
    assert smem["sim_gmem_read_bytes"] == q_bytes + BH * Nk * 2 * D * f32
    assert (fused["sim_gmem_read_bytes"] - q_bytes) == Nq * (smem["sim_gmem_read_bytes"] - q_bytes)
    assert fused["sim_gmem_write_bytes"] == smem["sim_gmem_write_bytes"] == BH * Nq * D * f32
    assert smem["sim_smem_load_bytes"] == BH * Nq * Nk * 2 * D * f32  # what fused_rowwise read from global
    assert fused["sim_barriers"] == 0 and smem["sim_barriers"] > 0
    assert fused["sim_smem_wavefronts"] == 0


def test_compare_and_plot_a_counted_file(counted_pair, tmp_path, capsys):
    from numba_attn import cli
    from numba_attn.report.compare import compare, compare_within, format_comparison
    from numba_attn.report.plots import count_pairs, counts, make_all
    from numba_attn.report.table import table

    prob, (fused, smem), path = counted_pair
    text = table([fused, smem])
    assert "gmem r/w" in text and "bank cf" in text and "barriers" in text
    res = compare_within(path)
    (pair,) = res["pairs"]
    assert (pair["phase"], pair["parent"]) == ("smem_kv", "fused_rowwise")
    gm = pair["counts"]["gmem bytes"]
    assert gm["ratio"] == pytest.approx((smem["sim_gmem_read_bytes"] + smem["sim_gmem_write_bytes"])
                                        / (fused["sim_gmem_read_bytes"] + fused["sim_gmem_write_bytes"]))
    out = format_comparison(res, path)
    assert "smem_kv" in out and "fused_rowwise" in out and "gmem bytes B/A" in out
    assert format_comparison(compare_within(path, ("fused_rowwise", "smem_kv")), path) == out.replace(
        "each phase (B) against its parent (A) on the same problem", "A = fused_rowwise, B = smem_kv, on the same problem")
    both = compare(path, path)
    assert all(p["counts"]["gmem bytes"]["ratio"] == 1.0 for p in both["pairs"])
    assert "gmem bytes B/A" in format_comparison(both)
    assert cli.main(["compare", path, "--parent"]) == 0
    assert "smem_kv" in capsys.readouterr().out
    (cp,) = count_pairs([fused, smem])
    assert cp["values"]["barriers"][2] is None  # the parent has none: "new"
    files = counts(path, str(tmp_path))
    assert [f.rsplit(".", 1)[1] for f in files] == ["png", "svg"]
    assert make_all(path, str(tmp_path / "all")) == [str(tmp_path / "all" / f"counts.{e}") for e in ("png", "svg")]


def _nvrtc_missing() -> bool:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("nvrtc")
        return False
    except Exception:  # noqa: BLE001
        return True


@pytest.mark.skipif(not _nvrtc_missing(), reason="the CUDA compiler libraries are installed here")
def test_offline_without_the_cuda_extra_says_which_extra_in_one_line():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "numba_attn.measure.offline", "smem_kv", "-D", "16", "--q-len", "64"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and '".[cu12]"' in p.stderr and "libnvrtc" in p.stderr
