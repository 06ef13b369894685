"""Attention variants written in Python: mask and score functions, built-ins, block masks.

``attention(q, k, v, mask_mod=..., score_mod=..., aux=..., block_mask=...)`` runs them; see
:mod:`numba_attn.variants.mods` for the functions' signatures and positions.
"""
import numba_attn.gpu.backend  # noqa: F401  (selects the simulator or the GPU before numba loads)
from numba_attn.variants.blockmask import (EMPTY, FULL, PARTIAL, BlockMask, create_block_mask, draw_block_mask,
                                           host_block_mask)
from numba_attn.variants.library import (alibi, alibi_slopes, causal, dense_mask, document, key_padding, prefix_lm,
                                         sink_tokens, sliding_window, softcap, streaming)
from numba_attn.variants.mods import Mod, Variant, VariantError, and_masks, make_variant, or_masks

__all__ = ["Mod", "Variant", "VariantError", "make_variant", "and_masks", "or_masks", "causal", "sliding_window",
           "softcap", "alibi", "alibi_slopes", "document", "prefix_lm", "key_padding", "sink_tokens", "streaming",
           "dense_mask",
           "BlockMask", "create_block_mask", "host_block_mask", "draw_block_mask", "EMPTY", "PARTIAL", "FULL"]
