"""What the daemon returns through the Python package against an independent
numpy + ml_dtypes transcription of docs/numerics.md (tests/numerics_ref.py):
real layers of the shipped checkpoint, the activations captured from the fp32
model and random ones, bf16 and fp16 inputs, the bf16 pooler, the zero-row
and NaN-row rules. On the CPU backend the result must also be bit-exact with
the C kernel itself (build/tools/radiance-numerics): the daemon path (socket,
rings, arena, the package's copies and reshapes) adds nothing."""
import subprocess

import ml_dtypes
import numpy as np
import pytest

import numerics_ref as ref
from conftest import BACKEND, BUILD, CKPT, DATA, Daemon

BF16 = ml_dtypes.bfloat16
LAYERS = ["encoder.layer.0.attention.self.query", "encoder.layer.2.attention.self.value",
          "encoder.layer.3.intermediate.dense", "encoder.layer.5.output.dense"]


@pytest.fixture(scope="module")
def acts():
    """The captured fp32 inputs and outputs of every linear
    (tests/data/minilm-acts.safetensors: <layer>.x, <layer>.y_fp32)."""
    import minilm

    return minilm.CheckpointTensors(str(DATA / "minilm-acts.safetensors"))


def layer_ref(t, name, xb):
    """(exact float64 y, sum of |terms| for the tolerance) of a W4A8 layer."""
    codes = ref.gptq_codes(t[name + ".qweight"])
    scales = t[name + ".scales"]
    bias = t[name + ".bias"]
    exact = ref.w4a8_exact(xb, codes, scales, bias)
    s, c = ref.quant_ref(xb)
    xq = np.abs(c.view(ref.E4M3).astype(np.float64) * s[:, None])
    absum = xq @ np.abs(ref.dequant(codes, scales)).T + np.abs(np.asarray(bias, np.float64))
    return exact, absum, codes, scales, bias


def check_floor(y, exact, absum, k):
    y64 = np.asarray(y).astype(np.float64)
    ok = ref.bf16_floor_ok(y, exact, absum, k)
    rel = np.linalg.norm(y64 - exact) / np.linalg.norm(exact)
    assert ok.all(), f"{(~ok).sum()} elements off the bf16 floor, rel {rel:.2e}"
    assert rel < 3e-3, rel
    return rel


def kernel_bits(xb, codes, scales, bias):
    """The C kernel's output, through tools/radiance-numerics (CPU)."""
    m, k = xb.shape
    n = codes.shape[0]
    qw = np.zeros((n, k // 8), np.uint32)
    for j in range(8):
        qw |= codes[:, j::8].astype(np.uint32) << np.uint32(4 * j)
    sc = np.ascontiguousarray(np.asarray(scales).T).astype(np.float16)
    data = (xb.view(np.uint16).tobytes() + qw.tobytes() + sc.view(np.uint16).tobytes()
            + np.asarray(bias, np.float32).tobytes())
    p = subprocess.run([str(BUILD / "tools" / "radiance-numerics"), "w4a8", str(m), str(n), str(k)],
                       input=data, capture_output=True, check=True)
    return np.frombuffer(p.stdout, np.uint16).reshape(m, n)


@pytest.mark.parametrize("name", LAYERS)
def test_captured_activations(model, ckpt_tensors, acts, name):
    x = np.asarray(acts[name + ".x"], np.float32)
    xb = x.astype(BF16)
    y = model.linear(name, xb)
    exact, absum, codes, scales, bias = layer_ref(ckpt_tensors, name, xb)
    check_floor(y, exact, absum, xb.shape[1])
    if BACKEND == "cpu":
        assert np.array_equal(y.view(np.uint16), kernel_bits(xb, codes, scales, bias))


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_random_inputs_and_scales(model, ckpt_tensors, dtype):
    name = "encoder.layer.1.attention.output.dense"
    rng = np.random.default_rng(3)
    # rows of very different magnitudes: the per-token scale handles each
    mags = np.array([1e-4, 1e-2, 0.3, 1, 7, 60, 3000])[:, None]
    x = (rng.standard_normal((7, 384)) * mags).astype(dtype)
    y = model.linear(name, x)
    exact, absum, codes, scales, bias = layer_ref(ckpt_tensors, name, x)
    check_floor(y, exact, absum, 384)
    if BACKEND == "cpu" and dtype is BF16:
        assert np.array_equal(y.view(np.uint16), kernel_bits(x, codes, scales, bias))


def check_zero_and_nonfinite_rows(model, ckpt_tensors, k):
    """The zero-row and NaN-row rules on a real layer; the finite row within
    check_floor(..., k)."""
    name = "encoder.layer.0.attention.self.key"
    x = np.random.default_rng(5).standard_normal((4, 384)).astype(BF16)
    x[1] = 0
    x[2, 17] = np.inf
    x[3, 300] = np.nan
    y = model.linear(name, x).astype(np.float64)
    bias = np.asarray(ckpt_tensors[name + ".bias"])
    # an all-zero row gives exactly the bias, rounded to bf16
    assert np.array_equal(y[1], bias.astype(np.float32).astype(BF16).astype(np.float64))
    # a row holding Inf or NaN is a NaN row; the others are unaffected
    assert np.isnan(y[2]).all() and np.isnan(y[3]).all()
    exact, absum, *_ = layer_ref(ckpt_tensors, name, x[:1])
    check_floor(y[:1], exact, absum, k)


def test_zero_and_nonfinite_rows(model, ckpt_tensors):
    check_zero_and_nonfinite_rows(model, ckpt_tensors, 384)


def test_bf16_layer(model, ckpt_tensors, acts):
    name = "pooler.dense"
    x = np.asarray(acts[name + ".x"], np.float32).astype(BF16)
    y = model.linear(name, x)
    w = ckpt_tensors[name + ".weight"]
    b = ckpt_tensors[name + ".bias"]
    exact = ref.bf16_linear_exact(x, w, b)
    absum = np.abs(x.astype(np.float64)) @ np.abs(np.asarray(w, np.float64)).T + \
        np.abs(np.asarray(b, np.float64))
    check_floor(y, exact, absum, 384)


def test_w4a8_cost_against_the_fp32_model(model, acts):
    """docs/accuracy.md's "vs fp32" column through Python: what int4
    weights and fp8 activations cost on the captured activations (bound
    0.20 per layer there, the worst measured 0.139)."""
    t = acts
    worst = 0.0
    for l in model.layers:
        x = np.asarray(t[l.name + ".x"], np.float32)
        y = model.linear(l.name, x.astype(BF16)).astype(np.float64)
        yf = np.asarray(t[l.name + ".y_fp32"], np.float64)
        rel = np.linalg.norm(y - yf) / np.linalg.norm(yf)
        worst = max(worst, rel)
        assert rel < 0.20, (l.name, rel)
    assert worst > 0.05   # int4 weights cost something: identical would mean a wrong file


@pytest.mark.skipif(BACKEND != "cpu", reason="a level of the CPU backend")
def test_cpu_avx2_int16_level(ckpt_tensors, acts, monkeypatch, tmp_path):
    """cpu_simd = avx2-int16 (exact integer group sums, docs/numerics.md
    "CPU fast path"): not the C reference's bits, but within its stated
    bound of the float64 definition: one bf16 rounding plus (G + 3) fp32
    roundings of the magnitude sum, G = K / 128 groups (tighter than the
    definition's K), and the zero-row and NaN-row rules."""
    import radiance

    d = Daemon(tmp_path, "--cpu-simd", "avx2-int16")
    try:
        d.start()
    except RuntimeError as e:
        if "has no avx2-int16" in str(e):
            pytest.skip("this CPU has no AVX2")
        raise
    try:
        assert "avx2-int16 kernels" in d.log()
        with radiance.Client(d.socket, timeout=60) as c:
            model = c.load(CKPT)
            differ = 0
            for name in LAYERS:
                xb = np.asarray(acts[name + ".x"], np.float32).astype(BF16)
                y = model.linear(name, xb)
                exact, absum, codes, scales, bias = layer_ref(ckpt_tensors, name, xb)
                check_floor(y, exact, absum, xb.shape[1] // 128 + 3)
                differ += int((y.view(np.uint16) != kernel_bits(xb, codes, scales, bias)).sum())
            print(f"avx2-int16: {differ} outputs differ from the C reference's bits")
            check_zero_and_nonfinite_rows(model, ckpt_tensors, 384 // 128 + 3)
    finally:
        assert d.stop() == 0
