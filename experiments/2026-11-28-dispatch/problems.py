"""The nine problems of issue 42's table (item 4: phase=None within 3 % of the fastest registered phase on each, on
H100 and H200), shared by picks.py and check.py."""
from numba_attn.spec.problem import Problem

NINE = [
    Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="float16"),
    Problem(batch=1, heads=32, q_len=4096, head_dim=128, dtype="bfloat16"),
    Problem(batch=4, heads=32, q_len=2048, head_dim=64, dtype="float16"),
    Problem(batch=2, heads=16, q_len=8192, head_dim=128, dtype="float16", causal=True),
    Problem(batch=1, heads=32, kv_heads=8, q_len=8192, head_dim=128, dtype="bfloat16", causal=True),
    Problem(batch=1, heads=32, q_len=16384, head_dim=128, dtype="float16", causal=True),
    Problem(batch=16, heads=16, q_len=512, head_dim=64, dtype="float16"),
    Problem(batch=8, heads=32, kv_heads=8, q_len=1024, head_dim=128, dtype="bfloat16", causal=True),
    Problem(batch=1, heads=16, q_len=4096, head_dim=256, dtype="float16"),
]

GPUS = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200"}
