"""The presets ``paged-8bit-16k`` and ``paged-8bit-32k`` of parts f-j: B8 H32 D128 P64, int8 per head, int8 per
token and fp8 per head, at 16k and 32k keys a sequence."""
from __future__ import annotations

from numba_attn.spec.problem import PRESETS, PagedProblem

PRESETS["paged-8bit-16k"] = [
    PagedProblem(batch=8, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16", page_size=64,
                 kv_dtype=kd, kv_scale=sc)
    for kd, sc in (("int8", "head"), ("int8", "token"), ("float8_e4m3", "head"))]
PRESETS["paged-8bit-32k"] = [PagedProblem(**{**p.to_dict(), "kv_len": 32768}) for p in PRESETS["paged-8bit-16k"]]
