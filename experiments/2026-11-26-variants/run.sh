#!/bin/bash
# variants on the GPU: tests, compute-sanitizer, a timing of visited tiles
cd "$(dirname "$0")/../.."  # the repository root
OUT=${OUT:-experiments/2026-11-26-variants}
export PYTHONPATH=.
export NUMBA_ATTN_BACKEND=cuda
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout 300 python3 -m pytest -q -x --full -p no:cacheprovider tests/test_variants.py -n 8 2>&1 | tail -15 | tee $OUT/tests.txt
cat > /tmp/san.py <<'PY'
import numpy as np, numba_attn as na
from numba_attn import variants as V
rng=np.random.default_rng(0)
q=rng.standard_normal((2,2,37,16)).astype(np.float32); k=rng.standard_normal((2,1,45,16)).astype(np.float32)
doc=(np.arange(45)[None,:]//11+np.arange(2)[:,None]).astype(np.int32)
for ph in ["smem_kv","double_buffer","register_blocked","causal_skip","vectorized","naive","fused_rowwise"]:
    p=na.get_phase(ph)
    o=na.attention(q,k,k,causal=True,phase=ph,mask_mod=V.and_masks(V.sliding_window(9),V.document(doc)),score_mod=V.softcap(3.0),**p.sim_params)
    print(ph, np.isfinite(o).all())
PY
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 /tmp/san.py 2>&1 | tail -12 | tee $OUT/memcheck.txt
cat > /tmp/tm.py <<'PY'
import numpy as np, numba_attn as na
from numba import cuda
from numba_attn import variants as V
rng=np.random.default_rng(0)
def t(N, **kw):
    q,k,v=(cuda.to_device(rng.standard_normal((1,16,N,64)).astype(np.float32)) for _ in range(3))
    f=lambda: na.attention(q,k,v,causal=True,phase="causal_skip",**kw)
    f(); cuda.synchronize()
    s,e=cuda.event(),cuda.event(); s.record()
    for _ in range(5): f()
    e.record(); e.synchronize(); return cuda.event_elapsed_time(s,e)/5
for N in (4096, 16384):
    plain=t(N); win=t(N, mask_mod=V.sliding_window(1023)); soft=t(N, score_mod=V.softcap(30.0))
    bm=V.create_block_mask(V.sliding_window(1023), None, None, N, N, Br=128, Bc=32, causal=True)
    print(f"N={N}: causal {plain:.3f} ms, causal+window1024 {win:.3f} ms (tiles {bm.density():.3f} of the grid), causal+softcap30 {soft:.3f} ms")
PY
timeout 200 python3 /tmp/tm.py 2>&1 | tail -5 | tee $OUT/timing.txt
