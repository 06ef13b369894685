"""Why vectorized's launch at head_dim 256 (default tiles) ran out of resources on an H100:
the compiled kernel's registers, local memory and thread limit beside what the launch asks."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from numba import cuda  # noqa: E402

from numba_attn import Problem  # noqa: E402
from numba_attn.measure.check import kernel_views, to_device  # noqa: E402
from numba_attn.phases.cuda_core.p07_vectorized import make_kernel, smem_floats  # noqa: E402
from numba_attn.phases.registry import get_phase  # noqa: E402

for D in (192, 256):
    prob = Problem(batch=1, heads=1, q_len=77, kv_len=129, head_dim=D, dtype="float32")
    ph = get_phase("vectorized")
    params = ph.resolve(prob)
    threads = params["Br"] * D // params["SEG"] + 32 * params["loader_warps"]
    launch = ph.build(prob, **params)
    q, k, v = prob.inputs(seed=1)
    qd, kd, vd = (to_device(x) for x in (q, k, v))
    od = cuda.device_array(prob.out_shape(), dtype=qd.dtype)
    try:
        launch(*kernel_views(prob, qd, kd, vd, od))
        cuda.synchronize()
        status = "launched"
    except Exception as exc:  # noqa: BLE001
        status = f"{type(exc).__name__}: {str(exc)[:80]}"
    kern = make_kernel(D, params["Br"], params["Bc"], params["SEG"], params["loader_warps"], False)
    for sig in kern.overloads:
        print(f"D={D} params={params} threads={threads} dyn_smem={4 * smem_floats(D, params['Br'], params['Bc'])} "
              f"regs={kern.get_regs_per_thread(sig)} local={kern.get_local_mem_per_thread(sig)} "
              f"static_smem={kern.get_shared_mem_per_block(sig)} max_threads={kern.get_max_threads_per_block(sig)} "
              f"-> {status}", flush=True)
