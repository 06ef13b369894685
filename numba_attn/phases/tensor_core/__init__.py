"""Prefill on tensor cores: mma.sync (p20) → ldmatrix + cp.async pipeline (p21), tf32 (p22), Hopper wgmma (p23),
its overlapped variant (p24), its TMA-fed variant (p25), the warp-specialised TMA producer/consumer kernel
(p26), its two consumers taking turns at the tensor cores (p27) and its consumers overlapping the next Q·Kᵀ
with the softmax (p37), both products in FP8 e4m3 (p38), the same on the warp-specialised TMA ring (p42), its
consumers taking turns (p43) or running each softmax under their own P·V (p44), the latter with a scale a tile
(p45), the same schedule in 16 bits (p46) with K and V on barriers of their own (p47), Q in shared memory
(p48) or the causal blocks started longest first (p49), in persistent blocks with balanced rounds (p50), O
copied out by bulk copies (p51), Q brought by the producer's TMA (p52) with its epilogue through row views (p53)
and Q released after the item's last S (p54), at D64 on three consumers' 128-key tiles (p55); FP8 with a share
of its exponentials on the FMA pipe (p56) or O rescaled only when a row's maximum moved (p57);
its blocks persistent, one per SM (p40); a packed ragged batch with cu_seqlens on tc_mma (p28) and tc_wgmma (p29)."""
