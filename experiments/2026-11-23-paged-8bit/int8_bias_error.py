"""Offline model (NumPy, no GPU): what leaving int8's +1152 in the f16 codes costs in precision, for the
scores (K) and for P·V (V), against the float64 reference; one row of the target's per-warp work (D128,
2048 keys: KV 16k over 1 split × 8 warps), per-token scales, codes N(0, 30²) clipped as the tests' caches.

    python experiments/2026-11-23-paged-8bit/int8_bias_error.py

The tensor core's float32 accumulation is modelled per mma: the 16 exact products of a k-step (scores)
or a 16-key chunk (P·V) summed exactly, rounded to float32 and added to the float32 accumulator, rounded
to nearest or toward zero (the hardware truncates; its exact behaviour is not modelled). The biased
scores start from −1152·Σq (rounded once); the biased P·V is corrected by −1152·Σp' (p' = p · V scale).
Prints ‖o − ref‖ / ‖ref‖ for (K bias, V bias) ∈ {0, 1152}², for a flat softmax (scores as drawn) and a
peaked one (scores × 8).
"""
import numpy as np

D, N = 128, 2048


def f32(x, toward_zero):
    y = np.asarray(x, np.float64).astype(np.float32)
    if toward_zero:
        y = np.where(np.abs(y.astype(np.float64)) > np.abs(x), np.nextafter(y, np.float32(0)), y)
    return np.asarray(y, np.float32)


def errors(rng, toward_zero, spread):
    q = rng.standard_normal(D).astype(np.float16).astype(np.float64)
    kc = np.clip(np.rint(rng.standard_normal((N, D)) * 30), -127, 127)
    vc = np.clip(np.rint(rng.standard_normal((N, D)) * 30), -127, 127)
    ks, vs = rng.uniform(0.02, 0.04, N), rng.uniform(0.02, 0.04, N)
    scale = np.log2(np.e) / np.sqrt(D) * spread
    s_ref = (kc @ q) * ks * scale
    p_ref = np.exp2(s_ref - s_ref.max())
    o_ref = (p_ref * vs) @ vc / p_ref.sum()
    out = {}
    for kb in (0, 1152):
        for vb in (0, 1152):
            acc = np.full(N, f32(-kb * q.sum(), toward_zero))
            for k in range(0, D, 16):
                acc = f32(acc.astype(np.float64) + (kc[:, k:k + 16] + kb) @ q[k:k + 16], toward_zero)
            s = f32(acc.astype(np.float64) * ks * scale, False).astype(np.float64)
            p = np.exp2(s - s.max())
            pv = p * vs
            o = np.zeros(D, np.float32)
            for j in range(0, N, 16):
                o = f32(o.astype(np.float64) + pv[j:j + 16] @ (vc[j:j + 16] + vb), toward_zero)
            o = (o.astype(np.float64) - np.float32(vb * pv.sum())) / p.sum()
            out[f"K+{kb} V+{vb}"] = float(np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref))
    return out


def main():
    rng = np.random.default_rng(0)
    for toward_zero in (False, True):
        for spread in (1, 8):
            res = errors(rng, toward_zero, spread)
            print(f"{'toward zero' if toward_zero else 'nearest':11s} {'flat' if spread == 1 else 'peaked':6s} "
                  + "  ".join(f"{k}: {v:.1e}" for k, v in res.items()))


if __name__ == "__main__":
    main()
