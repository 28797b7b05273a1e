"""An independent numpy + ml_dtypes transcription of docs/numerics.md.

Shared by tests/test_numerics_ref.py (against the C kernels through
build/tools/radiance-numerics) and tests/python/ (against the daemon through
the Python package). Nothing here calls radiance code.
"""
import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
GROUP = 128


def e4m3_ref(x):
    """ml_dtypes' RNE cast, with the saturation the definition adds (ml_dtypes
    turns overflow into NaN) and NaN mapped to the canonical 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    sat = np.clip(x, -448.0, 448.0)
    codes = sat.astype(E4M3).view(np.uint8).copy()
    codes[np.isnan(x)] = 0x7F
    return codes


def quant_ref(xb):
    """Per-token e4m3 quant of x [M, K] (bf16 or fp16): (scales [M] fp32,
    codes [M, K] uint8), as vLLM's dynamic per-token scaled_fp8_quant."""
    x = xb.astype(np.float32)
    with np.errstate(invalid="ignore"):
        amax = np.abs(x).max(axis=1)
        s = np.maximum(amax / np.float32(448.0), np.float32(1.0 / (448.0 * 512.0))).astype(np.float32)
        inv = (np.float32(1.0) / s).astype(np.float32)
        q = (x * inv[:, None]).astype(np.float32)
    c = e4m3_ref(q)
    bad_rows = ~np.all(np.isfinite(x), axis=1)
    s[bad_rows] = np.nan
    c[bad_rows] = 0x7F
    return s, c


def gptq_codes(qweight):
    """auto_round:auto_gptq qweight int32 [K/8, N] -> codes [N, K] (0..15):
    nibble j (bits 4j..4j+3) of word [i, n] is the code of k = 8i + j."""
    qw = np.asarray(qweight).view(np.uint32)
    k8, n = qw.shape
    codes = np.stack([(qw >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1)
    return codes.reshape(k8 * 8, n).T.astype(np.int64)


def dequant(codes, scales):
    """W [N, K] float64 = (code - 8) * scales[k // 128][n] (scales [K/128, N])."""
    sc = np.asarray(scales).astype(np.float64)
    return (codes.astype(np.float64) - 8) * np.repeat(sc.T, GROUP, axis=1)


def w4a8_exact(xb, codes, scales, bias):
    """The W4A8 definition in float64 before the output rounding:
    e4m3(x / s) * s @ W^T + bias, for x [M, K] bf16/fp16; float64 [M, N]."""
    s, c = quant_ref(xb)
    xq = c.view(E4M3).astype(np.float64) * s[:, None].astype(np.float64)
    y = xq @ dequant(codes, scales).T
    if bias is not None:
        y = y + np.asarray(bias).astype(np.float64)
    return y


def bf16_linear_exact(xb, weight, bias):
    """A bf16 layer (no fp8 step) in float64: x @ W^T + bias."""
    y = xb.astype(np.float64) @ np.asarray(weight).astype(np.float64).T
    if bias is not None:
        y = y + np.asarray(bias).astype(np.float64)
    return y


def bf16_floor_ok(y, exact, absum, k):
    """Elements of bf16 y within the definition's own tolerance of exact:
    one bf16 rounding (half an ulp: 2^-9 relative) plus the fp32
    accumulation's freedom of order (at most k * 2^-24 of the sum of the
    terms' magnitudes, `absum`). Returns a boolean array."""
    y = np.asarray(y).astype(np.float64)
    return np.abs(y - exact) <= np.abs(exact) * 2.0 ** -8 + absum * k * 2.0 ** -23 + 1e-30
