"""Prefill on tensor cores: mma.sync (p20) → ldmatrix + cp.async pipeline (p21), tf32 (p22),
Hopper wgmma (p23) and its overlapped variant (p24); a packed ragged batch with cu_seqlens on tc_mma
(p28) and tc_wgmma (p29)."""
