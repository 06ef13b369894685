"""Decode (q_len ≤ 16 against a long KV cache): chunked (p30) → split-K (p31) → fused
combine (p32) → lean inner loop (p33); the query rows of a KV head on tensor cores (p34); paged KV caches:
split-K (p35), tensor cores (p36), a work list (p39), 8-bit codes into mma fragments (p41)."""
