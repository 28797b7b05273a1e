"""torch integration: nn.Linear layers served by radianced.

    import radiance, radiance.torch as rt
    client = radiance.Client()
    served = client.load("tests/data/minilm-w4g128")
    report = rt.patch(bert, served)      # every nn.Linear whose name is a layer of `served`
    print(report.replaced, report.left)

``torch.ops.radiance.linear(x, model_key, layer, n)`` is a
``torch.library.custom_op`` with a fake (meta) implementation, so
torch.compile traces through modules that use it and keeps the daemon call
as one opaque node. Only CPU tensors are served (through the session's
shared-memory rings); a CUDA tensor is refused ("mapped mode not yet
available"). Inference only: there is no backward.
"""
from __future__ import annotations

import errno
import itertools
import threading
import weakref
from typing import Dict, Iterable, List, NamedTuple, Optional, Union

try:
    import torch
    from torch import nn
except ImportError as e:
    raise ImportError(f"radiance.torch needs PyTorch ({e}): pip install torch, or "
                      f"pip install './python[torch]'") from e

from ._client import Layer, Model
from ._errors import RadianceError

# custom ops take tensors and plain values, not Python objects: models are
# named by a key into this table (weak: a patched module holds its Model)
_MODELS: "weakref.WeakValueDictionary[int, Model]" = weakref.WeakValueDictionary()
_KEYS: "weakref.WeakKeyDictionary[Model, int]" = weakref.WeakKeyDictionary()
_next_key = itertools.count(1)
_keys_lock = threading.Lock()


def model_key(model: Model) -> int:
    """The int that names `model` to torch.ops.radiance.linear."""
    with _keys_lock:
        k = _KEYS.get(model)
        if k is None:
            k = next(_next_key)
            _KEYS[model] = k
            _MODELS[k] = model
        return k


@torch.library.custom_op("radiance::linear", mutates_args=())
def linear(x: torch.Tensor, model_key: int, layer: int, n: int) -> torch.Tensor:
    """y [..., n] bf16 = layer `layer` of the model named by `model_key`
    (radiance.torch.model_key) applied to x [..., K] (CPU, bf16 or fp16)."""
    model = _MODELS.get(model_key)
    if model is None:
        raise RadianceError(errno.ENOENT, f"no radiance model has key {model_key} (was it "
                                          f"released or garbage-collected?)")
    return model.linear(layer, x)


@linear.register_fake
def _(x: torch.Tensor, model_key: int, layer: int, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n), dtype=torch.bfloat16)


class RadianceLinear(nn.Module):
    """An nn.Linear whose weights live in radianced: layer `layer` of `model`.

    forward(x): x [..., K] on the CPU, any float dtype; float16 is sent as
    is, anything else rounded to bf16 (what the daemon takes); y [..., N]
    comes back bf16 and is cast to x's dtype (bf16 stays bf16), so the
    module drops into an fp32 model. A CUDA tensor raises RadianceError
    EOPNOTSUPP (mapped mode not yet available)."""

    def __init__(self, model: Model, layer: Union[int, str, Layer]):
        super().__init__()
        self.model = model
        self.layer = model.layer(layer)
        self.in_features = self.layer.K
        self.out_features = self.layer.N
        self._key = model_key(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise RadianceError(errno.EOPNOTSUPP, f"layer '{self.layer.name}': x is on {x.device}: "
                                f"mapped mode not yet available, only CPU tensors are served")
        xs = x if x.dtype in (torch.bfloat16, torch.float16) else x.to(torch.bfloat16)
        y = torch.ops.radiance.linear(xs, self._key, self.layer.index, self.layer.N)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def extra_repr(self) -> str:
        l = self.layer
        return (f"'{l.name}', in_features={l.K}, out_features={l.N}, bias={l.bias}, "
                f"kind={l.kind}, model='{self.model.name}'")


class PatchReport(NamedTuple):
    """What patch() did: `replaced` the qualified names now served by the
    daemon, `left` the nn.Linear modules that stay local (no such layer in
    the resident model, or not asked for)."""
    replaced: List[str]
    left: List[str]


def patch(module: nn.Module, model: Model, names: Optional[Iterable[str]] = None) -> PatchReport:
    """Replaces, in place, every nn.Linear of `module` whose qualified name
    (module.named_modules()) is a layer of the resident `model` by a
    RadianceLinear of that layer; with `names`, only those.

    Checks before replacing anything: each replaced Linear's in/out features
    and bias must match the layer's K, N and bias (else a different
    checkpoint: RadianceError EINVAL); a requested name that is not an
    nn.Linear of `module`, or not a layer of `model`, is RadianceError
    ENOENT. The replaced modules' own weights are dropped with them."""
    linears: Dict[str, nn.Linear] = {n: m for n, m in module.named_modules()
                                     if isinstance(m, nn.Linear)}
    layer_names = {l.name for l in model.layers}
    if names is None:
        wanted = [n for n in linears if n in layer_names]
    else:
        wanted = list(dict.fromkeys(names))
        for n in wanted:
            if n not in linears:
                raise RadianceError(errno.ENOENT, f"patch: '{n}' is not an nn.Linear of the "
                                    f"module ({len(linears)} nn.Linear modules)")
            if n not in layer_names:
                raise RadianceError(errno.ENOENT, f"patch: model '{model.name}' has no layer "
                                    f"'{n}'")
    for n in wanted:
        lin, l = linears[n], model.layer(n)
        if (lin.in_features, lin.out_features, lin.bias is not None) != (l.K, l.N, l.bias):
            raise RadianceError(errno.EINVAL, f"patch: '{n}' is nn.Linear({lin.in_features}, "
                                f"{lin.out_features}, bias={lin.bias is not None}), the layer of "
                                f"model '{model.name}' has K={l.K}, N={l.N}, bias={l.bias}")
    for n in wanted:
        parent_name, _, child = n.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, RadianceLinear(model, n))
    done = set(wanted)
    return PatchReport(replaced=wanted, left=[n for n in linears if n not in done])
