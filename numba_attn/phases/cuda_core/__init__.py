"""Prefill on CUDA cores: naive (p00) → fused online softmax → shared-memory tiles → … →
register blocking (p09) → causal tile skipping (p10); split-K prefill (p12)."""
