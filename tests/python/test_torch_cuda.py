"""radiance.torch on CUDA tensors: mapped mode (docs/mapped.md). A GPU daemon
holds the shipped checkpoint; this process maps it (Model.map, through
libradiance-gpu) and runs the daemon's kernels on torch's stream. Checked:
bit-identity with the daemon's own results for the same request, the
independent numpy reference (tests/numerics_ref.py), the argument checks,
RadianceLinear and the custom op on CUDA tensors, torch.compile, CUDA graph
capture and replay, other streams, Model.close with a mapping, and the
refusal of a CUDA tensor by a cpu-backend daemon.

Runs where torch with CUDA and libradiance-gpu (make GPU=cuda) exist: the GPU
host (bench/torch_mapped_run.sh); skipped with the reason elsewhere."""
import errno
import os

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this venv (the PyPI "
                            "wheel and its CUDA libraries take ~5 GB; tests/requirements.txt "
                            "leaves it out)")
import radiance  # noqa: E402
import radiance._gpu as rgpu  # noqa: E402
import radiance.torch as rt  # noqa: E402
from conftest import CKPT, _running_daemon  # noqa: E402
from test_numerics import check_floor, layer_ref  # noqa: E402
from test_torch import special_rows  # noqa: E402
import numerics_ref as ref  # noqa: E402
from torch import nn  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device here (torch.cuda.is_available() is False)", allow_module_level=True)
try:
    rgpu.load()
except radiance.RadianceError as _e:
    if os.environ.get("RADIANCE_GPU_LIBRARY"):
        raise
    pytest.skip(f"libradiance-gpu is not available (build with make GPU=cuda and set "
                f"RADIANCE_GPU_LIBRARY): {_e.message}", allow_module_level=True)

BF16 = ml_dtypes.bfloat16
Q = "encoder.layer.0.attention.self.query"
FFN_IN = "encoder.layer.0.intermediate.dense"
FFN_OUT = "encoder.layer.0.output.dense"
LAYERS = [Q, "encoder.layer.2.attention.self.value", "encoder.layer.3.intermediate.dense",
          "encoder.layer.5.output.dense"]


@pytest.fixture(scope="module")
def gpu_daemon():
    with _running_daemon(backend="gpu") as d:
        yield d
        rc = d.stop()
        assert rc == 0, f"radianced exited {rc}:\n{d.log()}"


@pytest.fixture(scope="module")
def gmodel(gpu_daemon):
    with radiance.Client(gpu_daemon.socket, timeout=120) as c:
        yield c.load(CKPT)


@pytest.fixture(scope="module")
def mapped(gmodel):
    m = gmodel.map(max_rows=64)
    yield m
    m.close()


def rand(*shape, seed=0, dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def np_bf16(t):
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(BF16)


def bits(t):
    return t.detach().cpu().contiguous().view(torch.int16).numpy()


def test_mapping_info(gmodel, mapped):
    assert mapped.device == torch.cuda.current_device()
    assert mapped.handle == "vmm" and mapped.read_only
    assert mapped.mapped_bytes >= sum(l.bytes for l in gmodel.layers)
    assert mapped.scratch_bytes > 0 and mapped.max_rows == 64
    assert "read-only" in repr(mapped) and gmodel.name in repr(mapped)


@pytest.mark.parametrize("name", LAYERS + ["pooler.dense"])
def test_bit_identical_with_the_daemon(gmodel, mapped, name):
    """The same request (rows, dtype, bits) mapped and through the rings:
    the same kernels on the same weights give the same bits."""
    l = gmodel.layer(name)
    for dtype, seed in ((torch.bfloat16, 1), (torch.float16, 2)):
        x = rand(37, l.K, seed=seed, dtype=dtype)
        y = mapped.linear(name, x.cuda())
        assert y.device.type == "cuda" and y.dtype == torch.bfloat16 and y.shape == (37, l.N)
        assert np.array_equal(bits(y), bits(gmodel.linear(name, x))), (name, dtype)


@pytest.mark.parametrize("name", LAYERS)
def test_against_the_numpy_reference(mapped, ckpt_tensors, name):
    """150 rows in launches of max_rows 64, three leading dimensions, rows
    of very different magnitudes: docs/numerics.md transcribed in numpy."""
    l = mapped.model.layer(name)
    mags = torch.tensor([1e-3, 0.1, 1.0, 30.0]).repeat(38)[:150, None]
    x = (torch.randn(150, l.K, generator=torch.Generator().manual_seed(4)) * mags).to(torch.bfloat16)
    y = mapped.linear(name, x.reshape(2, 75, l.K).cuda())
    assert y.shape == (2, 75, l.N)
    xb = np_bf16(x)
    exact, absum, *_ = layer_ref(ckpt_tensors, name, xb)
    check_floor(np_bf16(y).reshape(150, l.N), exact, absum, l.K)


def test_bf16_layer_against_the_reference(mapped, ckpt_tensors):
    name = "pooler.dense"
    x = rand(9, 384, seed=5)
    y = np_bf16(mapped.linear(name, x.cuda()))
    xb = np_bf16(x)
    w, b = ckpt_tensors[name + ".weight"], ckpt_tensors[name + ".bias"]
    exact = ref.bf16_linear_exact(xb, w, b)
    absum = np.abs(xb.astype(np.float64)) @ np.abs(np.asarray(w, np.float64)).T + \
        np.abs(np.asarray(b, np.float64))
    check_floor(y, exact, absum, 384)


def test_layouts_are_copied_or_refused(gmodel, mapped):
    x = rand(16, 384, seed=6).cuda()
    y = mapped.linear(Q, x)
    # a transposed view and a view at an odd offset (not 16-byte aligned) are copied first
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    assert torch.equal(mapped.linear(Q, xt), y)
    flat = torch.empty(16 * 384 + 1, dtype=torch.bfloat16, device="cuda")
    xo = flat[1:].view(16, 384)
    xo.copy_(x)
    assert xo.data_ptr() % 16 == 2
    assert torch.equal(mapped.linear(Q, xo), y)
    out = torch.empty(16, 384, dtype=torch.bfloat16, device="cuda")
    assert mapped.linear(Q, x, out=out) is out and torch.equal(out, y)
    # the empty input launches nothing
    assert mapped.linear(Q, x[:0]).shape == (0, 384)

    def refused(code, what, *args, **kw):
        with pytest.raises(radiance.RadianceError) as ei:
            mapped.linear(*args, **kw)
        assert ei.value.errno == code and what in ei.value.message, ei.value.message

    refused(errno.EINVAL, "torch.float32", Q, x.float())
    refused(errno.EINVAL, "K=384", Q, rand(4, 1536).cuda())
    refused(errno.EINVAL, "x is on cpu", Q, x.cpu())
    refused(errno.EINVAL, "must be a torch.Tensor", Q, np.zeros((2, 384), BF16))
    refused(errno.ENOENT, "has no layer", "encoder.nothing", x)
    refused(errno.EINVAL, "dtype torch.float32", Q, x, out=torch.empty(16, 384, device="cuda"))
    refused(errno.EINVAL, "shape (8, 384)", Q, x,
            out=torch.empty(8, 384, dtype=torch.bfloat16, device="cuda"))
    refused(errno.EINVAL, "on cpu", Q, x, out=torch.empty(16, 384, dtype=torch.bfloat16))
    refused(errno.EINVAL, "not contiguous", Q, x,
            out=torch.empty(384, 16, dtype=torch.bfloat16, device="cuda").t())
    refused(errno.EINVAL, "not 16-byte aligned", Q, x, out=flat[1:].view(16, 384))
    xx = torch.empty(16, 384, dtype=torch.bfloat16, device="cuda").copy_(x)
    refused(errno.EINVAL, "overlaps x", Q, xx, out=xx)
    with pytest.raises(radiance.RadianceError) as ei:
        gmodel.linear(Q, x)
    assert ei.value.errno == errno.EOPNOTSUPP and "Model.map()" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        mapped.linear_ptr(Q, x.data_ptr() + 2, y.data_ptr(), 16)
    assert ei.value.errno == errno.EINVAL and "16-byte aligned" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        mapped.linear_ptr(Q, x.data_ptr(), y.data_ptr(), 65)
    assert ei.value.errno == errno.E2BIG and "max_rows" in ei.value.message


def quantized(x):
    """(codes torch.uint8 [rows, K], scales torch.float32 [rows]) of x, by the
    numpy transcription of radiance's per-token quant (numerics_ref)."""
    xn = np_bf16(x) if x.dtype == torch.bfloat16 else x.cpu().numpy()
    s, c = ref.quant_ref(xn)
    return torch.from_numpy(c), torch.from_numpy(s)


@pytest.mark.parametrize("name", LAYERS)
def test_linear_fp8_gives_linear_bits(mapped, name):
    """Given the codes and scales linear() makes from x, linear_fp8 returns
    its y bit for bit: 37 rows, then 150 rows (launches of max_rows 64)
    with a leading shape, vLLM's [tokens, 1] scales and uint8 codes."""
    l = mapped.model.layer(name)
    for dtype, rows, seed in ((torch.bfloat16, 37, 30), (torch.float16, 1, 31), (torch.bfloat16, 150, 32)):
        x = rand(rows, l.K, seed=seed, dtype=dtype, scale=3.0)
        c, s = quantized(x)
        want = mapped.linear(name, x.cuda())
        got = mapped.linear_fp8(name, c.cuda().view(torch.float8_e4m3fn), s.cuda())
        assert got.dtype == torch.bfloat16 and got.shape == (rows, l.N)
        assert torch.equal(bits_t(got), bits_t(want)), (name, dtype, rows)
        if rows == 150:
            got = mapped.linear_fp8(name, c.cuda().view(2, 75, l.K), s.cuda().view(2, 75, 1))
            assert got.shape == (2, 75, l.N)
            assert torch.equal(bits_t(got).view(150, l.N), bits_t(want))


def bits_t(t):
    return t.detach().contiguous().view(torch.int16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quant_e4m3_is_radiance_quant(mapped, dtype):
    """radiance.torch.quant_e4m3 on CUDA against the numpy transcription of
    the definition, bit for bit (codes and scales), on ordinary and edge
    rows; then linear_fp8 on its output gives linear(x)'s bits."""
    l = mapped.model.layer(FFN_IN)
    x = special_rows(l.K, dtype, 40)
    codes, scales = rt.quant_e4m3(x.cuda())
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape and codes.is_cuda
    assert scales.dtype == torch.float32 and scales.shape == (40,)
    want_s, want_c = ref.quant_ref(np_bf16(x) if dtype == torch.bfloat16 else x.numpy())
    got_c = codes.view(torch.uint8).cpu().numpy()
    got_s = scales.cpu().numpy()
    bad = np.nonzero((got_c != want_c).any(axis=1))[0]
    assert bad.size == 0, f"codes differ in rows {bad.tolist()}"
    np.testing.assert_array_equal(got_s, want_s)   # exact; NaN (the Inf and NaN rows) where it is
    y = mapped.linear_fp8(FFN_IN, codes, scales)
    assert torch.equal(bits_t(y), bits_t(mapped.linear(FFN_IN, x.cuda())))
    # the refusals
    for bad_x in (x.float().cuda(), torch.tensor(1.0, dtype=dtype), "x"):
        with pytest.raises(radiance.RadianceError) as ei:
            rt.quant_e4m3(bad_x)
        assert ei.value.errno == errno.EINVAL and "quant_e4m3 takes" in ei.value.message


def test_linear_fp8_random_codes_against_the_reference(mapped, ckpt_tensors):
    """Codes no quant made (every e4m3 value but NaN, scales over 8 binades)
    against docs/numerics.md in numpy, within the bf16 floor."""
    name = FFN_IN
    l = mapped.model.layer(name)
    g = np.random.default_rng(33)
    c = g.integers(0, 256, size=(50, l.K), dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0
    s = (np.ldexp(1.0 + g.random(50), -g.integers(2, 10, 50))).astype(np.float32)
    y = mapped.linear_fp8(name, torch.from_numpy(c).cuda(), torch.from_numpy(s).cuda())
    w = ref.dequant(ref.gptq_codes(ckpt_tensors[name + ".qweight"]), ckpt_tensors[name + ".scales"])
    bias = np.asarray(ckpt_tensors[name + ".bias"], np.float64)
    xq = c.view(ref.E4M3).astype(np.float64) * s[:, None].astype(np.float64)
    exact = xq @ w.T + bias
    absum = np.abs(xq) @ np.abs(w).T + np.abs(bias)
    check_floor(np_bf16(y), exact, absum, l.K)


def test_linear_fp8_refusals(mapped):
    l = mapped.model.layer(Q)
    c, s = quantized(rand(8, l.K, seed=34))
    c, s = c.cuda(), s.cuda()
    y = mapped.linear_fp8(Q, c, s)
    # a transposed view and an odd offset are copied first
    ct = c.t().contiguous().t()
    assert not ct.is_contiguous() and torch.equal(mapped.linear_fp8(Q, ct, s), y)
    flat = torch.empty(8 * l.K + 3, dtype=torch.uint8, device="cuda")
    co = flat[3:].view(8, l.K)
    co.copy_(c)
    assert torch.equal(mapped.linear_fp8(Q, co, s), y)
    out = torch.empty(8, l.N, dtype=torch.bfloat16, device="cuda")
    assert mapped.linear_fp8(Q, c, s, out=out) is out and torch.equal(out, y)
    assert mapped.linear_fp8(Q, c[:0], s[:0]).shape == (0, l.N)

    def refused(code, what, *args, **kw):
        with pytest.raises(radiance.RadianceError) as ei:
            mapped.linear_fp8(*args, **kw)
        assert ei.value.errno == code and what in ei.value.message, ei.value.message

    refused(errno.EINVAL, "a bf16 layer takes no fp8 codes", "pooler.dense", c, s)
    refused(errno.EINVAL, "codes have dtype torch.float32", Q, c.float(), s)
    refused(errno.EINVAL, "K=384", Q, torch.zeros(8, 1536, dtype=torch.uint8, device="cuda"), s)
    refused(errno.EINVAL, "scales have dtype torch.float16", Q, c, s.half())
    refused(errno.EINVAL, "scales have shape (7,)", Q, c, s[:7])
    refused(errno.EINVAL, "codes is on cpu", Q, c.cpu(), s)
    refused(errno.EINVAL, "scales is on cpu", Q, c, s.cpu())
    refused(errno.ENOENT, "has no layer", "encoder.nothing", c, s)
    refused(errno.EINVAL, "it is shape (8, 1536)", Q, c, s,
            out=torch.empty(8, 1536, dtype=torch.bfloat16, device="cuda"))
    buf = torch.empty(8 * l.N, dtype=torch.bfloat16, device="cuda")   # out, scales at its start
    sc = buf.view(torch.float32)[:8]
    sc.copy_(s)
    refused(errno.EINVAL, "overlaps scales", Q, c, sc, out=buf.view(8, l.N))
    both = torch.empty(8 * l.N * 2, dtype=torch.uint8, device="cuda")   # y's bytes, codes at their start
    refused(errno.EINVAL, "overlaps codes", Q, both[:8 * l.K].view(8, l.K), s,
            out=both.view(torch.bfloat16).view(8, l.N))


def test_linear_multi_gives_linear_bits(mapped):
    """q, k and v (and the bf16 pooler of the same K) in one call: the bits
    of one linear() per layer; 150 rows go in launches of max_rows 64."""
    names = [Q, "encoder.layer.0.attention.self.key", "encoder.layer.0.attention.self.value"]
    for layers, rows, dtype in ((names, 1, torch.bfloat16), (names, 37, torch.float16),
                                (names[:2] + ["pooler.dense"], 150, torch.bfloat16)):
        x = rand(rows, 384, seed=35 + rows, dtype=dtype).cuda()
        ys = mapped.linear_multi(layers, x)
        assert len(ys) == len(layers)
        for name, y in zip(layers, ys):
            assert torch.equal(bits_t(y), bits_t(mapped.linear(name, x))), (name, rows)
    x = rand(3, 5, 384, seed=36).cuda()
    outs = [torch.empty(3, 5, 384, dtype=torch.bfloat16, device="cuda") for _ in names]
    ys = mapped.linear_multi(names, x, out=outs)
    assert all(a is b for a, b in zip(ys, outs))
    assert torch.equal(outs[2], mapped.linear(names[2], x))

    def refused(code, what, *args, **kw):
        with pytest.raises(radiance.RadianceError) as ei:
            mapped.linear_multi(*args, **kw)
        assert ei.value.errno == code and what in ei.value.message, ei.value.message

    ys = mapped.linear_multi(names, x, out=[outs[0], None, None])
    assert ys[0] is outs[0] and ys[1] is not None and torch.equal(ys[1], mapped.linear(names[1], x))
    refused(errno.EINVAL, "1..8", [], x)
    refused(errno.EINVAL, "layers must be a list", Q, x)
    refused(errno.EINVAL, "repeats layers[0]", [Q, Q], x[:0])   # checked with no rows too
    refused(errno.EINVAL, f"('{FFN_OUT}') has K=1536", [Q, FFN_OUT], x)
    refused(errno.EINVAL, "repeats layers[0]", [Q, Q], x)
    refused(errno.ENOENT, "has no layer", [Q, "encoder.nothing"], x)
    refused(errno.EINVAL, "a list of 3 entries", names, x, out=outs[:2])
    refused(errno.EINVAL, "overlaps out[0]", names[:2], x, out=[outs[0], outs[0]])
    refused(errno.EINVAL, "overlaps x", [Q], x.view(torch.bfloat16), out=[x])


def test_radiance_linear_and_the_custom_op_on_cuda(gmodel):
    m = rt.RadianceLinear(gmodel, FFN_IN)
    x = rand(3, 5, 384, seed=7)
    y = m(x.cuda())
    assert y.device.type == "cuda" and y.dtype == torch.bfloat16 and y.shape == (3, 5, 1536)
    assert np.array_equal(bits(y), bits(m(x)))   # the daemon, through the rings, same request
    y32 = m(x.float().cuda())
    assert y32.dtype == torch.float32 and torch.equal(y32, y.float())
    assert rt.mapped(gmodel).read_only
    # torch.compile keeps the op opaque on CUDA tensors too
    seq = nn.Sequential(rt.RadianceLinear(gmodel, FFN_IN), nn.GELU(),
                        rt.RadianceLinear(gmodel, FFN_OUT))
    xc = rand(6, 384, seed=8).cuda()
    eager = seq(xc)
    explain = torch._dynamo.explain(seq)(xc)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(seq, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(xc), eager)


def test_cuda_graph_capture_and_replay(gmodel):
    seq = nn.Sequential(rt.RadianceLinear(gmodel, FFN_IN), nn.GELU(),
                        rt.RadianceLinear(gmodel, FFN_OUT), rt.RadianceLinear(gmodel, Q))
    static_x = rand(12, 384, seed=9).cuda()
    rt.mapped(gmodel)   # mapped before the capture (the first CUDA call would do it too)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            seq(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = seq(static_x)
    for seed in (10, 11, 12):
        x = rand(12, 384, seed=seed).cuda()
        static_x.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, seq(x)), seed
        # and the daemon computes the same bits for the same three requests
        h = gmodel.linear(FFN_IN, x.cpu())
        h = torch.nn.functional.gelu(h.cuda()).cpu()
        h = gmodel.linear(Q, gmodel.linear(FFN_OUT, h))
        assert np.array_equal(bits(static_y), bits(h)), seed


def test_other_streams_are_ordered(gmodel):
    """Calls alternating between two streams share one scratch: each
    stream waits for the other's last call (MappedModel._order)."""
    mm = rt.mapped(gmodel)
    xs = [rand(64, 384, seed=20 + i).cuda() for i in range(8)]
    want = [mm.linear(Q, x) for x in xs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    got = []
    for i, x in enumerate(xs):
        with torch.cuda.stream(streams[i % 2]):
            got.append(mm.linear(Q, x))
    torch.cuda.synchronize()
    for w, g in zip(want, got):
        assert torch.equal(w, g)


def test_close_unmaps_before_release(gpu_daemon):
    with radiance.Client(gpu_daemon.socket, timeout=60) as c:
        m = c.load(CKPT)
        mm = m.map(max_rows=8)
        mm2 = rt.mapped(m)
        y = rt.RadianceLinear(m, Q)(rand(2, 384).cuda())
        assert y.shape == (2, 384)
        m.close()                # unmaps both, then releases: no EBUSY
        assert mm.closed and mm2.closed
        with pytest.raises(radiance.RadianceError) as ei:
            mm.linear(Q, rand(2, 384).cuda())
        assert ei.value.errno == errno.EBADF


def test_cpu_backend_daemon_refuses_cuda_tensors():
    with _running_daemon(backend="cpu") as d:
        with radiance.Client(d.socket, timeout=60) as c:
            m = c.load(CKPT)
            with pytest.raises(radiance.RadianceError) as ei:
                rt.RadianceLinear(m, Q)(rand(2, 384).cuda())
            e = ei.value
            assert e.errno == errno.EOPNOTSUPP, e
            assert "cannot be mapped" in e.message and "cpu backend" in e.message, e.message
            # the CPU path still works on that daemon
            assert rt.RadianceLinear(m, Q)(rand(2, 384)).shape == (2, 384)


def test_torch_engine_matches_the_numpy_engine(gmodel):
    """examples/engine/minilm_torch.py (torch on the GPU, linears mapped)
    against minilm.py (numpy, linears through the rings) on the same daemon
    and weights: not bit-exact (float32 order of operations on the GPU flips
    a bf16 rounding of some layer input now and then, and a flip that moves
    a row's amax changes its fp8 scale), but the same embeddings to about
    1e-3; and against the fp32 reference within docs/accuracy.md's bounds."""
    import minilm
    import minilm_torch
    import run as runner
    from conftest import DATA

    sentences, _, ref_emb, meta = minilm.load_reference(str(DATA / "minilm-sentences.json"))
    enc = minilm_torch.TorchMiniLM.from_checkpoint(gmodel, str(CKPT), device="cuda")
    assert enc.mapped.read_only
    got = enc.encode(sentences)
    want = minilm.MiniLM.from_checkpoint(gmodel, str(CKPT)).encode(sentences)
    cos = np.sum(got * want, axis=1)
    assert cos.min() > 0.995 and cos.mean() > 0.9995, np.sort(cos)[:5]
    r = minilm.compare(got, ref_emb, minilm.reference_pairs(meta))
    assert r["cos_min"] >= runner.MIN_COS and r["cos_mean"] >= runner.MIN_MEAN_COS, r
    assert r["spearman"] >= runner.MIN_SPEARMAN and r["spearman_pairs"] >= runner.MIN_SPEARMAN_PAIRS


def test_runner_two_cuda_workers(gpu_daemon, tmp_path):
    import json
    import subprocess
    import sys

    from conftest import DATA, REPO

    out = tmp_path / "run.json"
    # the package under test first; what the caller had (cffi from wheels) after
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    p = subprocess.run([sys.executable, str(REPO / "examples/engine/run.py"), "--device", "cuda",
                        "--socket", gpu_daemon.socket, "--workers", "2", "--data", str(DATA),
                        "--daemon-pid", str(gpu_daemon.pid), "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=600)
    print(p.stdout)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    w = r["workers"]
    assert len(w) == 2 and r["failures"] == [] and r["server"]["backend"] != "cpu"
    assert w[0]["pid"] != w[1]["pid"] and w[0]["sentences"] == 66
    # the same kernels on the same weights and the same torch ops: the
    # same bits in both processes
    assert w[0]["embeddings_sha256"] == w[1]["embeddings_sha256"]
    for x in w:
        g = x["gpu"]
        assert g["read_only"] and g["handle"] == "vmm" and g["mapped_bytes"] > 0
    assert "every linear mapped" in p.stdout
