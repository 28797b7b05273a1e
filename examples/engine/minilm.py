"""all-MiniLM-L6-v2 sentence encoder on radianced.

Every linear layer (q, k, v, attention output, FFN in and out of the six
blocks: 36 per batch) runs on the daemon through the `radiance` package, q,
k and v of a block in one request (Model.linear_multi: 24 requests per
batch, x quantized once for the three); the
rest is numpy here: embeddings, attention, GELU, LayerNorm, mean pooling and
L2 normalization, the way sentence-transformers computes them (Transformer ->
mean Pooling -> Normalize, max_seq_length 256, padding to the longest
sentence of a batch).

The tensors that are not linear layers (embeddings, LayerNorm weights and
biases) come from the daemon too: open_tensors() gives read-only numpy views
of the model's shared tensors (Model.tensor), the one copy the daemon keeps
in a sealed memfd that every worker maps, so a worker holds no weights of
its own: they are widened to float32 per batch, where they are used. Only
config.json and tokenizer.json are read from the checkpoint directory.
(CheckpointTensors, reading a safetensors file itself, is kept for tests
and references that run without a daemon.)

    import radiance, minilm
    client = radiance.Client()
    model = client.load("tests/data/minilm-w4g128")
    enc = minilm.MiniLM.from_checkpoint(model, "tests/data/minilm-w4g128")
    emb = enc.encode(["A man is playing a guitar.", "Hello"])   # [2, 384] float32, unit norm
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import ml_dtypes
import numpy as np

# ---------------------------------------------------------------------------
# non-linear tensors
# ---------------------------------------------------------------------------
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
              "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_MAX_HEADER = 100 << 20   # safetensors' own limit on the JSON header


class CheckpointTensors(Mapping):
    """The tensors of a checkpoint's safetensors file(s), by name: read-only
    numpy views of a memory map (no copy; pages are shared between the
    processes that map the same file). A safetensors header is 8 bytes of
    little-endian length, then that much JSON naming each tensor's dtype,
    shape and [begin, end) offsets after the header."""

    def __init__(self, directory: str):
        """directory: a checkpoint directory (model.safetensors, or the shards
        model.safetensors.index.json names), or one .safetensors file."""
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.isfile(directory):
            directory, files = os.path.split(directory)
            files = [files]
        elif os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self._where: Dict[str, tuple] = {}
        self._maps = []
        for fn in files:
            path = os.path.join(directory, fn)
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            if mm.size < 8:
                raise ValueError(f"{path}: {mm.size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", mm[:8].tobytes())
            if n > _MAX_HEADER or 8 + n > mm.size:
                raise ValueError(f"{path}: header length {n} does not fit the file ({mm.size} bytes)")
            header = json.loads(mm[8:8 + n].tobytes())
            base = 8 + n
            for name, d in header.items():
                if name == "__metadata__":
                    continue
                dt = _ST_DTYPES.get(d["dtype"])
                if dt is None:
                    raise ValueError(f"{path}: tensor {name}: dtype {d['dtype']} is not supported")
                b, e = d["data_offsets"]
                shape = tuple(int(s) for s in d["shape"])
                want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                if not (0 <= b <= e and base + e <= mm.size and e - b == want):
                    raise ValueError(f"{path}: tensor {name}: offsets [{b}, {e}) do not hold "
                                     f"{d['dtype']}{list(shape)} inside the file")
                self._where[name] = (len(self._maps), base + b, base + e, dt, shape)
            self._maps.append(mm)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            i, b, e, dt, shape = self._where[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in the checkpoint") from None
        return self._maps[i][b:e].view(dt).reshape(shape)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class SharedTensors(Mapping):
    """The daemon's shared tensors of a radiance.Model, by name: read-only
    numpy views of its one copy (Model.tensor), mapped on first use."""

    def __init__(self, model):
        self._model = model
        self._names = [t.name for t in model.tensors]   # maps them (one round trip)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(f"no shared tensor {name!r} in model '{self._model.name}'")
        return self._model.tensor(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def open_tensors(model) -> Mapping[str, np.ndarray]:
    """Where the non-linear tensors come from: the daemon's shared tensors of
    `model` (a radiance.Model). Raises radiance.RadianceError (ENOTSUP) for a
    radianced that predates shared tensors."""
    return SharedTensors(model)


# ---------------------------------------------------------------------------
# the linear layers
# ---------------------------------------------------------------------------
# (layer name, x [rows, K] f32) -> [rows, N] f32, a new array (forward() adds
# the residual to the output of attention.output.dense and output.dense in place)
Linear = Callable[[str, np.ndarray], np.ndarray]


# (layer names of one K, x [rows, K] f32) -> one [rows, N_i] f32 per name
LinearMulti = Callable[[Sequence[str], np.ndarray], List[np.ndarray]]


def widen(y: np.ndarray) -> np.ndarray:
    """bf16 (ml_dtypes.bfloat16) array to a new float32 array, exactly: a
    bf16 is the top half of the float32 of the same value, so its 16 bits
    shifted up are that float32 (NaN and Inf included). One vectorized numpy
    pass, where y.astype(np.float32) goes through ml_dtypes' element-by-element
    cast (about 2x the CPU time here)."""
    return np.left_shift(y.view(np.uint16), 16, dtype=np.uint32).view(np.float32)


def daemon_linear(model) -> Linear:
    """Linear layers served by radianced: x rounded to bf16 (as the daemon
    takes it), y bf16 widened back to float32."""
    def linear(name: str, x: np.ndarray) -> np.ndarray:
        return widen(model.linear(name, x.astype(ml_dtypes.bfloat16)))
    return linear


def daemon_linear_multi(model) -> Optional[LinearMulti]:
    """Several layers of one K on one x in one daemon request
    (Model.linear_multi: one round trip, one quantization of x): q, k and v.
    None when the daemon predates several-layer requests
    (server_info()["max_request_layers"] below 3); MiniLM then calls
    `linear` once per layer, with the same results."""
    if model.client.server_info.get("max_request_layers", 0) < 3:
        return None

    def linear_multi(names: Sequence[str], x: np.ndarray) -> List[np.ndarray]:
        ys = model.linear_multi(list(names), x.astype(ml_dtypes.bfloat16))
        return [widen(y) for y in ys]
    return linear_multi


# ---------------------------------------------------------------------------
# the non-linear parts, in numpy
# ---------------------------------------------------------------------------
# Elementwise work goes over row blocks of about this many float32 (256 KiB),
# so that the temporaries of its dozen numpy passes stay in the L2 cache
# instead of streaming whole [tokens, 1536] arrays through memory each pass.
_BLOCK = 1 << 16


def erf_(z: np.ndarray, a: np.ndarray, t: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """erf of float32 z, in place in z (numpy has none): Abramowitz & Stegun
    7.1.26, absolute error <= 1.5e-7 (evaluated in float32, ~3e-7): at the
    float32 rounding of GELU's result and far below the int4 weights'
    error. a, t and poly: float32 scratch of z's shape."""
    f = np.float32
    np.abs(z, out=a)
    np.multiply(a, f(0.3275911), out=t)
    t += f(1)
    np.divide(f(1), t, out=t)
    np.multiply(t, f(1.061405429), out=poly)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += f(c)
        poly *= t
    np.multiply(a, a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    a *= poly
    np.subtract(f(1), a, out=a)
    return np.copysign(a, z, out=z)


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's "gelu", the exact erf form x/2 (1 + erf(x / sqrt 2)), in place
    in x ([rows, n] float32, C-contiguous: a linear's fresh output), which
    it returns. Row blocks of about _BLOCK elements at a time: this was most
    of the engine's numpy time, and blocked it takes about 2.5x less CPU
    time here (the same float32 operations, so the same bits)."""
    f = np.float32
    rows = max(1, _BLOCK // max(1, x.shape[-1]))
    z, a, t, poly = (np.empty((rows, x.shape[-1]), f) for _ in range(4))
    for i in range(0, x.shape[0], rows):
        xb = x[i:i + rows]
        m = xb.shape[0]
        zb, ab = z[:m], a[:m]
        np.multiply(xb, f(1.0 / math.sqrt(2.0)), out=zb)
        erf_(zb, ab, t[:m], poly[:m])
        zb += f(1)
        np.multiply(xb, f(0.5), out=ab)
        np.multiply(zb, ab, out=xb)
    return x


def layer_norm_(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * w + b over the last axis, in place in
    x ([rows, n] float32, C-contiguous, a temporary of the caller's: the
    residual sum), which it returns. The same float32 operations in the same
    order as on a copy, so the same bits; what it saves is the copy and the
    fresh pages of a new [rows, n] result each call (two a block, 13 a
    batch)."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.square(x).mean(axis=-1, keepdims=True)
    var += np.float32(eps)
    x /= np.sqrt(var)
    x *= w
    x += b
    return x


def softmax_(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in place in x (float32), which it returns
    (the attention scores are a temporary)."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


# ---------------------------------------------------------------------------
class MiniLM:
    """The encoder. `linear` runs the linear layers (daemon_linear(model),
    or any function of the same shape); `tensors` holds the rest;
    `config` is the checkpoint's config.json; `tokenizer` a
    tokenizers.Tokenizer. Not thread-safe per instance (one per thread or
    process); the linear function decides the rest."""

    def __init__(self, linear: Linear, tensors: Mapping[str, np.ndarray], config: dict,
                 tokenizer, max_seq_length: int = 256,
                 linear_multi: Optional[LinearMulti] = None):
        self.linear = linear
        # q, k, v share their input: one call for the three when given
        self.linear_multi = linear_multi or (lambda names, x: [linear(n, x) for n in names])
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.n_layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if config.get("hidden_act", "gelu") != "gelu" or \
                config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only BERT with erf GELU and absolute positions is implemented")
        self.max_seq_length = min(max_seq_length, int(config["max_position_embeddings"]))
        # every tensor stays the view it came as (the daemon's shared pages,
        # bf16 there): rows and vectors are widened to float32 per batch,
        # where they are used, so a worker holds no private copy of any
        self.word = tensors["embeddings.word_embeddings.weight"]
        self.pos = tensors["embeddings.position_embeddings.weight"]
        self.type0 = tensors["embeddings.token_type_embeddings.weight"][0]
        self.ln = {}
        for n in ["embeddings.LayerNorm"] + [f"encoder.layer.{i}.{p}.LayerNorm"
                                             for i in range(self.n_layers)
                                             for p in ("attention.output", "output")]:
            self.ln[n] = (tensors[n + ".weight"], tensors[n + ".bias"])
        self.tokenizer = tokenizer
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.max_seq_length)

    @classmethod
    def from_checkpoint(cls, model, directory: str, linear: Optional[Linear] = None,
                        **kw) -> "MiniLM":
        """The encoder of the checkpoint in `directory` (config.json and
        tokenizer.json only) whose linear layers and other tensors `model`
        (a radiance.Model of the same checkpoint) serves."""
        from tokenizers import Tokenizer

        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        if linear is None:
            linear = daemon_linear(model)
            kw.setdefault("linear_multi", daemon_linear_multi(model))
        return cls(linear, open_tensors(model), config, tok, **kw)

    def tokenize(self, sentences: Sequence[str]) -> List[List[int]]:
        """Token ids of each sentence, [CLS] .. [SEP], truncated to
        max_seq_length: what sentence-transformers feeds the model."""
        return [e.ids for e in self.tokenizer.encode_batch(list(sentences))]

    def batches(self, lengths: Sequence[int], batch_tokens: int) -> List[List[int]]:
        """Sentence indices grouped longest first (as sentence-transformers
        sorts them), each group as many sentences as keep rows x padded
        length within batch_tokens (one sentence at least). forward()
        computes nothing for the padding, but a budget on the padded size
        keeps the [B, L] token and mask arrays (and torch engines, which
        do pad: bench/engine_cpu.py batches them with this) small."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        out: List[List[int]] = []
        for i in order:
            if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= batch_tokens:
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def encode(self, sentences: Sequence[str], batch_tokens: int = 512) -> np.ndarray:
        """Unit-norm sentence embeddings [len(sentences), hidden] float32.
        Sentences are padded to the longest of their batch in the token and
        mask arrays; a batch holds at most batch_tokens padded tokens, and
        forward() works on its real tokens only (one daemon request per
        linear and batch when batch_tokens is at most the daemon's
        max_rows)."""
        ids = self.tokenize(sentences)
        out = np.empty((len(ids), self.hidden), np.float32)
        for group in self.batches([len(t) for t in ids], batch_tokens):
            L = max(len(ids[i]) for i in group)
            tok = np.zeros((len(group), L), np.int64)      # [PAD] is 0
            mask = np.zeros((len(group), L), np.float32)
            for r, i in enumerate(group):
                tok[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            out[group] = self.pool(self.forward(tok, mask), mask)
        return out

    def forward(self, tok: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """last_hidden_state [B, L, hidden] float32 for token ids [B, L] with
        attention mask [B, L] (1 = token, 0 = padding); padding positions
        hold zeros. Everything works on the real tokens alone, [T, hidden]
        (T = mask.sum()): the linear layers get no padding rows (a padded
        token costs a daemon row for nothing), and the attention runs per
        sentence on its own tokens (attention()), so no padding key is
        computed to be masked out. The result of a real token does not
        depend on the padding: its rows are independent in the linears,
        LayerNorm and GELU, and its attention sees only its sentence."""
        B, L = tok.shape
        H = self.hidden
        f32 = np.float32
        real = np.flatnonzero(mask.reshape(-1))            # rows of [B * L] that are tokens
        lengths = np.count_nonzero(mask, axis=1)           # a sentence's rows follow the last's
        h = (self.word[tok.reshape(-1)[real]].astype(f32) + self.pos[:L][real % L].astype(f32)
             + self.type0.astype(f32))
        h = layer_norm_(h, *self._ln("embeddings.LayerNorm"), self.eps)
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            q, k, v = self.linear_multi(
                [p + "attention.self.query", p + "attention.self.key", p + "attention.self.value"], h)
            ctx = self.attention(q, k, v, lengths)
            # the residual sums in place in the linears' fresh outputs (a, o:
            # float32 arrays of our own), then LayerNorm in place in them
            a = np.asarray(self.linear(p + "attention.output.dense", ctx), f32)
            a += h
            h = layer_norm_(a, *self._ln(p + "attention.output.LayerNorm"), self.eps)
            f = gelu(self.linear(p + "intermediate.dense", h))
            o = np.asarray(self.linear(p + "output.dense", f), f32)
            o += h
            h = layer_norm_(o, *self._ln(p + "output.LayerNorm"), self.eps)
        out = np.zeros((B * L, H), np.float32)
        out[real] = h
        return out.reshape(B, L, H)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  lengths: Sequence[int]) -> np.ndarray:
        """Scaled dot-product attention of each sentence over its own
        tokens: q, k, v [T, hidden] float32, the sentences' rows one after
        the other (lengths[b] rows each, sum T); returns the context [T,
        hidden]. The same as padding every sentence to the longest with
        masked keys, as transformers' BERT does (a masked key's weight is
        exactly 0 there), up to float32 rounding.

        Sentences of one length that follow each other (a batch is sorted
        by length) go together; heads are strided views ([g, heads, n,
        head_dim] of the rows, no copy: numpy's matmul hands such strides to
        BLAS); and the scores are made for about _BLOCK of them at a time,
        so that they stay in the cache through the scale, the softmax and
        the product with v."""
        nh = self.heads
        hd = self.hidden // nh
        scale = np.float32(1.0 / math.sqrt(hd))
        q, k, v = (np.ascontiguousarray(y, np.float32) for y in (q, k, v))
        ctx = np.empty(q.shape, np.float32)
        off, b = 0, 0
        while b < len(lengths):
            n, g = int(lengths[b]), 1
            while b + g < len(lengths) and lengths[b + g] == n:
                g += 1
            if n == 0:                              # a mask row without tokens
                b += g
                continue
            qh, kh, vh, ch = (y[off:off + g * n].reshape(g, n, nh, hd).transpose(0, 2, 1, 3)
                              for y in (q, k, v, ctx))
            fit = max(1, _BLOCK // (n * n))         # heads whose scores fit the block
            hstep, sstep = min(nh, fit), max(1, fit // nh)
            for i in range(0, g, sstep):
                for j in range(0, nh, hstep):
                    at = (slice(i, i + sstep), slice(j, j + hstep))
                    scores = np.matmul(qh[at], kh[at].swapaxes(-1, -2))
                    scores *= scale
                    np.matmul(softmax_(scores), vh[at], out=ch[at])
            off += g * n
            b += g
        return ctx

    def _ln(self, name: str):
        """LayerNorm `name`'s (weight, bias), widened to float32 for this use."""
        w, b = self.ln[name]
        return w.astype(np.float32), b.astype(np.float32)

    @staticmethod
    def pool(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean over the tokens the mask keeps, then L2 normalization
        (sentence-transformers' Pooling(mean) and Normalize)."""
        s = (h * mask[:, :, None]).sum(axis=1)
        n = np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        e = s / n
        return (e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)).astype(np.float32)


# ---------------------------------------------------------------------------
# comparing with the reference
# ---------------------------------------------------------------------------
def load_reference(path: str):
    """(sentences, token ids, fp32 embeddings [n, dim]) of
    tests/data/minilm-sentences.json (tools/make_checkpoint.py --sentences)."""
    import base64

    with open(path, encoding="utf-8") as f:
        ref = json.load(f)
    s = ref["sentences"]
    emb = np.stack([np.frombuffer(base64.b64decode(e["embedding"]), "<f4") for e in s])
    return [e["text"] for e in s], [e["token_ids"] for e in s], emb.astype(np.float32), ref


def rankdata(a: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank (scipy's default)."""
    a = np.asarray(a)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size, np.float64)
    ranks[order] = np.arange(1, a.size + 1)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = rankdata(a), rankdata(b)
    ra -= ra.mean()
    rb -= rb.mean()
    return float((ra @ rb) / math.sqrt((ra @ ra) * (rb @ rb)))


def pair_similarities(emb: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair i < j of unit-norm embeddings."""
    sim = emb.astype(np.float64) @ emb.astype(np.float64).T
    i, j = np.triu_indices(len(emb), k=1)
    return sim[i, j]


def reference_pairs(meta: dict) -> np.ndarray:
    """The designed pairs of the reference file: its paraphrase pairs and
    as many unrelated ones, [n, 2] sentence indices."""
    return np.array(meta["paraphrase_pairs"] + meta["unrelated_pairs"], np.int64)


def compare(emb: np.ndarray, ref: np.ndarray, pairs: Optional[np.ndarray] = None) -> dict:
    """cosine of each embedding with its reference (min, mean, argmin), the
    Spearman correlation of the similarities of all sentence pairs with the
    reference's ("spearman"), and with `pairs` ([n, 2] indices, e.g.
    reference_pairs()) the same over those pairs only ("spearman_pairs")."""
    e = emb.astype(np.float64)
    cos = np.sum(e * ref, axis=1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
    out = {"cos": cos, "cos_min": float(cos.min()), "cos_mean": float(cos.mean()),
           "cos_argmin": int(cos.argmin()),
           "spearman": spearman(pair_similarities(emb), pair_similarities(ref))}
    if pairs is not None:
        sim = lambda v: np.sum(v[pairs[:, 0]] * v[pairs[:, 1]], axis=1)   # noqa: E731
        out["spearman_pairs"] = spearman(sim(e), sim(ref.astype(np.float64)))
    return out
