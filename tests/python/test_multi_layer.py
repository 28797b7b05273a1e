"""Model.linear_multi: several layers of one K on one x in one request,
against a real daemon. Each output must be bit for bit model.linear() on its
layer (one quantization of x changes nothing: it is deterministic) and, on
the captured activations, within the bf16 floor of the independent numpy
transcription of docs/numerics.md (tests/numerics_ref.py). Then what is
refused before anything reaches the daemon, each error naming what and
where."""
import errno

import ml_dtypes
import numpy as np
import pytest

import numerics_ref as ref
import radiance
from conftest import DATA

BF16 = ml_dtypes.bfloat16
L0 = "encoder.layer.0."
Q, K, V = L0 + "attention.self.query", L0 + "attention.self.key", L0 + "attention.self.value"
UP = L0 + "intermediate.dense"          # N 1536, K 384
DOWN = L0 + "output.dense"              # N 384, K 1536


@pytest.fixture(scope="module")
def acts():
    import minilm

    return minilm.CheckpointTensors(str(DATA / "minilm-acts.safetensors"))


def bits(a):
    return np.asarray(a).view(np.uint16)


def rand(shape, seed=0, dtype=BF16):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(dtype)


def test_qkv_matches_single_layers_and_the_reference(model, ckpt_tensors, acts):
    assert model.client.server_info["max_request_layers"] == 8
    xb = np.asarray(acts[Q + ".x"], np.float32).astype(BF16)
    ys = model.linear_multi([Q, K, V], xb)
    assert [y.shape for y in ys] == [(xb.shape[0], 384)] * 3
    for name, y in zip((Q, K, V), ys):
        assert y.dtype == BF16
        assert np.array_equal(bits(y), bits(model.linear(name, xb))), name
        t = ckpt_tensors
        codes = ref.gptq_codes(t[name + ".qweight"])
        scales, bias = t[name + ".scales"], t[name + ".bias"]
        exact = ref.w4a8_exact(xb, codes, scales, bias)
        s, c = ref.quant_ref(xb)
        xq = np.abs(c.view(ref.E4M3).astype(np.float64) * s[:, None])
        absum = xq @ np.abs(ref.dequant(codes, scales)).T + np.abs(np.asarray(bias, np.float64))
        ok = ref.bf16_floor_ok(y, exact, absum, 384)
        assert ok.all(), f"{name}: {(~ok).sum()} elements off the bf16 floor"


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_shapes_order_and_out(model, dtype):
    x = rand((2, 3, 384), seed=4, dtype=dtype)
    up, q = model.linear_multi([UP, model.layer(Q).index], x)
    assert up.shape == (2, 3, 1536) and q.shape == (2, 3, 384)
    assert np.array_equal(bits(up), bits(model.linear(UP, x)))
    assert np.array_equal(bits(q), bits(model.linear(Q, x)))
    out_q = np.empty((2, 3, 384), BF16)
    ys = model.linear_multi([V, Q], x, out=[None, out_q])
    assert ys[1] is out_q
    assert np.array_equal(bits(out_q), bits(q))
    # a non-contiguous x is copied, as for linear()
    xt = np.ascontiguousarray(rand((384, 5), seed=2, dtype=dtype)).T
    assert np.array_equal(bits(model.linear_multi([K], xt)[0]), bits(model.linear(K, xt)))


def test_torch_tensors(model):
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    x = torch.randn(4, 384, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ys = model.linear_multi([Q, K], x)
    assert all(isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 for y in ys)
    assert torch.equal(ys[1], model.linear(K, x))


def expect(code, text, fn, *args, **kw):
    with pytest.raises(radiance.RadianceError) as ei:
        fn(*args, **kw)
    assert ei.value.errno == code, ei.value
    assert text in ei.value.message, ei.value.message


def test_refused(model):
    x = rand((2, 384))
    lm = model.linear_multi
    expect(errno.EINVAL, f"layers[1] ('{DOWN}') has K=1536 but layers[0] ('{Q}') K=384", lm,
           [Q, DOWN], x)
    expect(errno.EINVAL, f"layers[2] ('{Q}') repeats layers[0]", lm, [Q, K, Q], x)
    expect(errno.EINVAL, "at least one layer", lm, [], x)
    # one layer where a list of them goes: a str would be taken letter by
    # letter ("no layer 'e'"), a Layer field by field, an int not at all
    for one in (Q, model.layer(Q), 0):
        expect(errno.EINVAL, f"layers must be a list of layers (names, indexes or Layers), "
               f"not {type(one).__name__}", lm, one, x)
    expect(errno.EINVAL, "out must be a list of one output (or None) per layer, not ndarray",
           lm, [Q, K], x, out=np.empty((2, 384), BF16))
    expect(errno.ENOENT, "has no layer 'nope'", lm, [Q, "nope"], x)
    expect(errno.EINVAL, "the layer takes K=384", lm, [Q, K], rand((2, 100)))
    expect(errno.EINVAL, "out has 1 entries for 2 layers", lm, [Q, K], x, out=[None])
    shared = np.empty((2, 384), BF16)
    expect(errno.EINVAL, "out[0] and out[1] overlap", lm, [Q, K], x, out=[shared, shared])
    # nine distinct layers of K=384 exist: more than the daemon takes
    many = [l.name for l in model.layers if l.K == 384][:9]
    assert len(many) == 9
    expect(errno.EINVAL, "9 layers in one request: 1..8", lm, many, x)
    # the session goes on
    assert np.array_equal(bits(lm([K], x)[0]), bits(model.linear(K, x)))
