"""numba-attn inside other libraries' models; each module imports its library (an optional extra) on first use."""
