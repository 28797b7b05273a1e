"""Checks radiance's numerics against independent implementations.

The reference for e4m3 and bf16 is ml_dtypes (the dtype library JAX uses),
for fp16 numpy, and for the per-token quant and the W4A8 GEMM a plain numpy
transcription of docs/numerics.md (vLLM's dynamic per-token fp8 quant: scale
max(amax / 448, 1 / (448 * 512)), codes e4m3(x * (1 / scale)) saturated).
Our side is driven through build/tools/radiance-numerics (binary stdin/stdout).
"""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np

from numerics_ref import E4M3, GROUP, e4m3_ref, quant_ref   # tests/numerics_ref.py

np.seterr(invalid="ignore")   # NaN/Inf rows are part of the test

BUILD = os.environ.get("RADIANCE_BUILD", "build")
TOOL = os.path.join(BUILD, "tools", "radiance-numerics")
passed = 0
failed = 0


def run(args, data):
    p = subprocess.run([TOOL, *map(str, args)], input=data, capture_output=True, check=True)
    return p.stdout


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def ours_e4m3(x):
    return np.frombuffer(run(["e4m3-encode"], np.asarray(x, np.float32).tobytes()), np.uint8)


# -- fixed values the issue lists
fixed = {448.0: 0x7E, 1000.0: 0x7E, 256.0: 0x78, 17.0: 0x58, 2.0**-9: 0x01, 2.0**-10: 0x00,
         float("nan"): 0x7F, -448.0: 0xFE, -17.0: 0xD8, 464.0: 0x7E, 1e30: 0x7E, -1e30: 0xFE}
got = ours_e4m3(list(fixed))
for (v, want), g in zip(fixed.items(), got):
    check(f"e4m3({v}) == {want:#04x}", g == want, f"got {g:#04x}")

# -- every e4m3 byte decodes as ml_dtypes says
codes = np.arange(256, dtype=np.uint8)
ours = np.frombuffer(run(["e4m3-decode"], codes.tobytes()), np.float32)
ref = codes.view(E4M3).astype(np.float32)
same = np.array_equal(ours, ref, equal_nan=True)
check("e4m3 decode: all 256 bytes match ml_dtypes", same)

# -- encode: every finite e4m3 value and every midpoint between neighbours
# (the ties), plus every bf16 value in range and random fp32 values
finite = np.sort(np.unique(ref[np.isfinite(ref)]))
mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
bf16_all = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
rng = np.random.default_rng(7)
rand = np.concatenate([rng.standard_normal(200000).astype(np.float32) * s
                       for s in (1e-3, 0.1, 1, 30, 400)])
for name, xs in (("e4m3 values", finite), ("e4m3 ties", mids), ("all bf16 values", bf16_all),
                 ("random fp32", rand)):
    xs = xs[~np.isinf(xs)]
    o, r = ours_e4m3(xs), e4m3_ref(xs)
    bad = np.nonzero(o != r)[0]
    check(f"e4m3 encode: {name} ({xs.size}) match ml_dtypes", bad.size == 0,
          f"{bad.size} differ, first x={xs[bad[0]]!r} ours={o[bad[0]]:#x} ref={r[bad[0]]:#x}"
          if bad.size else "")

# -- bf16 rounding
xs = np.concatenate([rand, mids, np.array([np.nan, np.inf, -np.inf, 3.4e38, -0.0,
                                           1 + 2.0**-8, 1 + 3 * 2.0**-8], np.float32)])
ob = np.frombuffer(run(["bf16-encode"], xs.astype(np.float32).tobytes()), np.uint16)
rb = xs.astype(ml_dtypes.bfloat16).view(np.uint16)
nan = np.isnan(xs)
check("bf16 RNE matches ml_dtypes (finite, inf)", np.array_equal(ob[~nan], rb[~nan]))
check("bf16 of NaN is a quiet NaN", bool(np.all((ob[nan] & 0x7FC0) == 0x7FC0)))

# -- fp16 decode, all 65536 patterns
h = np.arange(65536, dtype=np.uint16)
of = np.frombuffer(run(["f16-decode"], h.tobytes()), np.float32)
check("fp16 decode: all 65536 patterns match numpy",
      np.array_equal(of, h.view(np.float16).astype(np.float32), equal_nan=True))


# -- per-token quant, numpy transcription of the definition (numerics_ref.quant_ref)
M, K = 9, 256
x = (rng.standard_normal((M, K)) * np.array([[1e-6], [1e-3], [0.5], [3], [100], [4e4],
                                              [1], [1], [1]])).astype(ml_dtypes.bfloat16)
x[6, :] = 0                      # all-zero row
x[7, 5] = np.inf                 # Inf row
x[8, 100] = np.nan               # NaN row
out = run(["quant-rows", M, K], x.view(np.uint16).tobytes())
s_o = np.frombuffer(out[:4 * M], np.float32)
c_o = np.frombuffer(out[4 * M:], np.uint8).reshape(M, K)
s_r, c_r = quant_ref(x)
check("per-token scales match the numpy transcription", np.array_equal(s_o, s_r, equal_nan=True))
check("per-token codes match the numpy transcription", np.array_equal(c_o, c_r))
check("all-zero row: scale 1/(448*512), codes 0",
      s_o[6] == np.float32(1 / (448 * 512)) and not c_o[6].any())
check("Inf and NaN rows: NaN scale, codes 0x7F",
      np.isnan(s_o[7]) and np.isnan(s_o[8]) and np.all(c_o[7:] == 0x7F))


# -- the W4A8 GEMM against a float64 dequant reference
def w4a8(xb, qw, sc, bias):
    m, k = xb.shape
    n = qw.shape[0]
    data = (xb.view(np.uint16).tobytes() + qw.astype(np.uint32).tobytes()
            + sc.view(np.uint16).tobytes() + bias.astype(np.float32).tobytes())
    return np.frombuffer(run(["w4a8", m, n, k], data), np.uint16).reshape(m, n)


def bf16_to_f64(u):
    return u.view(ml_dtypes.bfloat16).astype(np.float64)


# issue's example, padded to one group: codes 0..7 then 8 (zero), x = 1 for k < 8
K, N = 128, 1
qw = np.full((N, K // 8), 0x88888888, np.uint32)
qw[0, 0] = 0x76543210
sc = np.ones((N, 1), np.float16)
xb = np.zeros((1, K), ml_dtypes.bfloat16)
xb[0, :8] = 1.0
y = bf16_to_f64(w4a8(xb, qw, sc, np.zeros(N, np.float32)))
check("end to end: qweight 0x76543210, scale 1, x = 1 -> -36", y[0, 0] == -36.0, f"got {y[0, 0]}")

def random_layer(M, N, K):
    """Codes [N, K], the packed qweight, scales, bias and bf16 x [M, K]."""
    codes = rng.integers(0, 16, size=(N, K), dtype=np.uint32)
    qw = np.zeros((N, K // 8), np.uint32)
    for j in range(8):
        qw |= codes[:, j::8] << (4 * j)
    sc = (rng.random((N, K // 128)) * 0.02).astype(np.float16)
    bias = rng.standard_normal(N).astype(np.float32)
    xb = (rng.standard_normal((M, K)) * 2).astype(ml_dtypes.bfloat16)
    return codes, qw, sc, bias, xb


M, N, K = 7, 37, 512
codes, qw, sc, bias, xb = random_layer(M, N, K)
xb[3, :] = 0
y = bf16_to_f64(w4a8(xb, qw, sc, bias))
s_r, c_r = quant_ref(xb)
xq = c_r.view(E4M3).astype(np.float64) * s_r[:, None].astype(np.float64)
w = (codes.astype(np.float64) - 8) * np.repeat(sc.astype(np.float64), 128, axis=1)
ref = xq @ w.T + bias
rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
check(f"w4a8 vs float64 dequant reference: rel Frobenius {rel:.2e} < 3e-3", rel < 3e-3)
check("w4a8 all-zero row gives exactly the bias (bf16)",
      np.array_equal(y[3], bias.astype(ml_dtypes.bfloat16).astype(np.float64)))
elem = np.abs(y - ref) / np.maximum(np.abs(ref), 1e-3)
check(f"w4a8 per-element error within bf16 rounding ({elem.max():.2e} <= 2^-8)",
      elem.max() <= 2.0**-8)


# -- the contract's per-element bound (docs/numerics.md "Contract"), computed
# here from its formula in float64, against kernels/numerics_bound.c
def bound_ours(xb, qw, sc, bias, y, acc):
    m, k = xb.shape
    n = qw.shape[0]
    data = (xb.view(np.uint16).tobytes() + qw.astype(np.uint32).tobytes()
            + sc.view(np.uint16).tobytes() + bias.astype(np.float32).tobytes()
            + y.astype(np.uint16).tobytes())
    p = subprocess.run([TOOL, "w4a8-bound", *map(str, (m, n, k)), acc], input=data, capture_output=True,
                       check=True)
    out = np.frombuffer(p.stdout, np.float64).reshape(2, m, n)
    return out[0], out[1], p.stderr.decode()


def bound_ref(xb, codes, sc, bias, acc):
    s, c = quant_ref(xb)
    q = c.view(E4M3).astype(np.float64)                       # [M, K]
    w = codes.astype(np.float64) - 8                            # [N, K]
    m, k = q.shape
    G = k // GROUP
    scd = sc.astype(np.float64)                                 # [N, G]
    prod = q[:, None, :] * w[None, :, :]                        # [M, N, K]
    steps = np.abs(prod).reshape(m, w.shape[0], G, 4, 32)
    S = steps.sum(axis=(3, 4))                                  # [M, N, G]
    if acc == "fp32":
        e_g = 4 * 2.0**-24 * 128 * S
    else:
        Sj = steps.sum(axis=4)                                  # [M, N, G, 4]
        A = np.cumsum(Sj, axis=3)
        A_prev = A - Sj
        pmax = steps.max(axis=4)
        nz = (steps != 0).sum(axis=4)
        M_ = np.maximum(pmax, A_prev * 1.01)
        E = np.floor(np.log2(np.where(M_ > 0, M_, 1.0)))
        e_g = np.where(nz > 0, 2.0**-12 * ((nz + 1) * 2.0**E + A), 0).sum(axis=3)
    sd = s.astype(np.float64)[:, None]
    e = 1.01 * (np.abs(sd) * (np.abs(scd)[None] * e_g).sum(axis=2)
                + 2.0**-24 * ((G + 3) * np.abs(sd) * (np.abs(scd)[None] * S).sum(axis=2)
                              + np.abs(bias.astype(np.float64))[None]))
    exact = sd * (q[:, None, :] * w[None, :, :] * np.repeat(scd, GROUP, axis=1)[None]).sum(axis=2) \
        + bias.astype(np.float64)[None]
    mag = np.abs(exact) + e
    step = np.where(mag >= 2.0**-126, 2.0**(np.floor(np.log2(np.where(mag > 0, mag, 1.0))) - 7), 2.0**-133)
    return exact, e + step


bcodes, bqw, bsc, bbias, bxb = random_layer(5, 23, 384)
by = w4a8(bxb, bqw, bsc, bbias)
for acc in ("fp32", "fp8-sm90"):
    ex_o, al_o, msg = bound_ours(bxb, bqw, bsc, bbias, by, acc)
    ex_r, al_r = bound_ref(bxb, bcodes, bsc, bbias, acc)
    dex = np.max(np.abs(ex_o - ex_r) / np.maximum(np.abs(ex_r), 1e-30))
    dal = np.max(np.abs(al_o - al_r) / al_r)
    check(f"bound {acc}: y* matches float64 ({dex:.1e} <= 1e-12)", dex <= 1e-12)
    check(f"bound {acc}: allowed matches the documented formula ({dal:.1e} <= 1e-9)", dal <= 1e-9)
    check(f"bound {acc}: the CPU reference is inside it ({msg.strip()})", msg.startswith("w4a8-bound: 0 of"))

print(f"numerics_ref: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
