"""all-MiniLM-L6-v2 in torch on the GPU, every linear layer mapped from radianced.

The numpy engine (minilm.py) sends each linear to the daemon through the
rings. This one keeps the activations in device memory: embeddings,
attention, GELU, LayerNorm, mean pooling and normalization run in torch on
the GPU, and the 36 linear layers of a batch are radiance.torch.RadianceLinear
modules, which on CUDA tensors run the daemon's W4A8 kernels in this process
on the daemon's one copy of the weights (mapped mode, docs/mapped.md), on
torch's current stream: no copy, no round trip per layer. The daemon must run
the gpu backend on this GPU.

Tokenization, batching, padding and the comparison with the reference are
minilm.MiniLM's; only forward() and pool() are torch here. The non-linear
tensors come from the same place as there (open_tensors: the daemon's
shared tensors), copied to the device once (about 24 MiB, mostly the word
embeddings, kept bf16).

    enc = TorchMiniLM.from_checkpoint(model, "tests/data/minilm-w4g128", device="cuda")
    emb = enc.encode(sentences)          # numpy [n, 384] float32, unit norm
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F

import radiance.torch as rt
from minilm import MiniLM


class TorchMiniLM(MiniLM):
    """MiniLM with forward() and pool() in torch on `device`; the linear
    layers are RadianceLinear modules of `model` (mapped on CUDA, the
    rings on the CPU). Not thread-safe per instance."""

    def __init__(self, model, tensors: Mapping[str, np.ndarray], config: dict, tokenizer,
                 device: str = "cuda", max_seq_length: int = 256):
        super().__init__(self._unused_linear, tensors, config, tokenizer, max_seq_length)
        self.device = torch.device(device)
        dev = self.device
        f32 = lambda a: torch.from_numpy(np.asarray(a, np.float32)).to(dev)   # noqa: E731
        bf16 = np.asarray(tensors["embeddings.word_embeddings.weight"])
        self.t_word = torch.from_numpy(bf16.view(np.int16).copy()).view(torch.bfloat16).to(dev)
        self.t_pos = f32(self.pos)
        self.t_type0 = f32(self.type0)
        self.t_ln = {n: (f32(w), f32(b)) for n, (w, b) in self.ln.items()}
        self.lin = {l.name: rt.RadianceLinear(model, l) for l in model.layers}
        if self.device.type == "cuda":
            self.mapped = rt.mapped(model)   # map now: the first batch is not the one that pays

    @staticmethod
    def _unused_linear(name, x):
        raise AssertionError("TorchMiniLM runs its linears as RadianceLinear modules")

    @classmethod
    def from_checkpoint(cls, model, directory: str, linear=None, device: str = "cuda",
                        **kw) -> "TorchMiniLM":
        import json
        import os

        from tokenizers import Tokenizer

        from minilm import open_tensors

        if linear is not None:
            raise ValueError("TorchMiniLM runs the model's layers itself: linear= is not taken")
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        return cls(model, open_tensors(model), config, tok, device=device, **kw)

    def linear_t(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, K] -> float32 [rows, N]: rounded to bf16 for the
        kernels, bf16 out widened, as minilm.daemon_linear does."""
        return self.lin[name](x.to(torch.bfloat16)).float()

    @torch.no_grad()
    def forward(self, tok: np.ndarray, mask: np.ndarray) -> torch.Tensor:
        """last_hidden_state [B, L, hidden] float32 on the device, the same
        computation as MiniLM.forward (numpy) step by step."""
        dev = self.device
        B, L = tok.shape
        H, nh = self.hidden, self.heads
        hd = H // nh
        t = torch.from_numpy(tok).to(dev)
        m = torch.from_numpy(mask).to(dev)
        h = self.t_word[t].float() + self.t_pos[:L] + self.t_type0
        h = F.layer_norm(h, (H,), *self.t_ln["embeddings.LayerNorm"], self.eps).reshape(B * L, H)
        bias = ((1.0 - m) * torch.finfo(torch.float32).min)[:, None, None, :]
        scale = 1.0 / math.sqrt(hd)
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."

            def heads(y):
                return y.reshape(B, L, nh, hd).transpose(1, 2)
            q = heads(self.linear_t(p + "attention.self.query", h))
            k = heads(self.linear_t(p + "attention.self.key", h))
            v = heads(self.linear_t(p + "attention.self.value", h))
            probs = torch.softmax(q @ k.transpose(-1, -2) * scale + bias, dim=-1)
            ctx = (probs @ v).transpose(1, 2).reshape(B * L, H)
            a = self.linear_t(p + "attention.output.dense", ctx)
            h = F.layer_norm(a + h, (H,), *self.t_ln[p + "attention.output.LayerNorm"], self.eps)
            f = F.gelu(self.linear_t(p + "intermediate.dense", h))
            o = self.linear_t(p + "output.dense", f)
            h = F.layer_norm(o + h, (H,), *self.t_ln[p + "output.LayerNorm"], self.eps)
        return h.reshape(B, L, H)

    @torch.no_grad()
    def pool(self, h: torch.Tensor, mask: np.ndarray) -> np.ndarray:
        """Mean over the kept tokens and L2 normalization, on the device;
        the embeddings come back to the host as float32."""
        m = torch.from_numpy(mask).to(h.device)[:, :, None]
        e = (h * m).sum(dim=1) / m.sum(dim=1).clamp_min(1e-9)
        return F.normalize(e, dim=1, eps=1e-12).cpu().numpy().astype(np.float32)


def device_memory(mapped: Optional[object] = None) -> dict:
    """What this process holds on its GPU: torch's allocator peak, the
    mapping's scratch, the mapped allocation (the daemon's, not a copy) and
    cudaMemGetInfo's device-wide figures."""
    free, total = torch.cuda.mem_get_info()
    out = {"torch_max_allocated": int(torch.cuda.max_memory_allocated()),
           "device_used": int(total - free), "device_total": int(total)}
    if mapped is not None:
        out.update(mapped_bytes=mapped.mapped_bytes, scratch_bytes=mapped.scratch_bytes,
                   handle=mapped.handle, read_only=mapped.read_only)
    return out
