"""split_k_prefill with a variant: rows that no split saw are 0, the others are the combine's exact answer."""
from __future__ import annotations

import numpy as np
import pytest

import numba_attn as na
from numba_attn import variants as V
from numba_attn.spec.reference import check, reference


def _qkv(B, H, Hkv, Nq, Nk, D, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32)
                 for shape in ((B, H, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D)))


@pytest.mark.parametrize("splits,causal", [(3, False), (3, True), (1, True)])  # splits=1: no combine
def test_forced_splits_give_zero_for_rows_that_no_split_saw(splits, causal):
    B, H, Hkv, Nq, Nk, D = 2, 2, 1, 21, 45, 16
    q, k, v = _qkv(B, H, Hkv, Nq, Nk, D, seed=7)
    lengths = np.array([Nk - 40, Nk], np.int32)  # left padding: the first sequence keeps its last 5 keys only
    mask = V.key_padding(lengths, "left", kv_len=Nk)
    # splits of 16 keys: only the third holds the first sequence's keys; causal: its first 16 rows see none
    out = na.attention(q, k, v, causal=causal, phase="split_k_prefill", splits=splits, Br=16, Bc=16, mask_mod=mask)
    ref = reference(q, k, v, causal=causal, variant=V.make_variant(mask))
    c = check(out, ref)
    assert c.ok, c.reason
    assert np.isfinite(out).all()
    if causal:  # rows i + Nk - Nq < Nk - 5 see no key: exactly 0
        assert not np.any(out[0, :, :Nq - 5])
