"""torch integration: nn.Linear layers served by radianced.

    import radiance, radiance.torch as rt
    client = radiance.Client()
    served = client.load("tests/data/minilm-w4g128")
    report = rt.patch(bert, served)      # every nn.Linear whose name is a layer of `served`
    print(report.replaced, report.left)

``torch.ops.radiance.linear(x, model_key, layer, n)`` is a
``torch.library.custom_op`` with a fake (meta) implementation, so
torch.compile traces through modules that use it and keeps the call as one
opaque node. CPU tensors are served by the daemon through the session's
shared-memory rings. CUDA tensors run in mapped mode (docs/mapped.md): the
model is mapped into this process once (libradiance-gpu, Model.map(); see
mapped() here), and the daemon's W4A8 kernels run on the daemon's copy of the
weights on ``torch.cuda.current_stream()``: no copy, no round trip, nothing
allocated but y, so CUDA graphs capture it (map before capturing: the first
CUDA call maps, and mapping cannot happen inside a capture). A daemon that
cannot map (the cpu backend) refuses a CUDA tensor with its reason.
Inference only: there is no backward.
"""
from __future__ import annotations

import errno
import itertools
import threading
import weakref
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

try:
    import torch
    from torch import nn
except ImportError as e:
    raise ImportError(f"radiance.torch needs PyTorch ({e}): pip install torch, or "
                      f"pip install './python[torch]'") from e

from ._client import Layer, Model
from ._errors import RadianceError
from ._gpu import DEFAULT_MAX_ROWS, MappedModel

# custom ops take tensors and plain values, not Python objects: models are
# named by a key into this table (weak: a patched module holds its Model)
_MODELS: "weakref.WeakValueDictionary[int, Model]" = weakref.WeakValueDictionary()
_KEYS: "weakref.WeakKeyDictionary[Model, int]" = weakref.WeakKeyDictionary()
_next_key = itertools.count(1)
_keys_lock = threading.Lock()
# the mapping CUDA calls of each model use (weak: it goes with its Model)
_MAPPED: "weakref.WeakKeyDictionary[Model, MappedModel]" = weakref.WeakKeyDictionary()
_map_lock = threading.Lock()


def model_key(model: Model) -> int:
    """The int that names `model` to torch.ops.radiance.linear."""
    with _keys_lock:
        k = _KEYS.get(model)
        if k is None:
            k = next(_next_key)
            _KEYS[model] = k
            _MODELS[k] = model
        return k


def mapped(model: Model, max_rows: int = DEFAULT_MAX_ROWS) -> MappedModel:
    """The MappedModel that CUDA calls of `model` use (RadianceLinear, the
    custom op): made on first use with `max_rows` (rows per launch: longer
    inputs are split), kept while the Model lives and is open. Call it
    before capturing a CUDA graph (or run the module once outside the
    capture). A mapping that exists is returned as is, whatever max_rows
    says. Raises what Model.map() raises."""
    with _map_lock:
        m = _MAPPED.get(model)
        if m is None or m.closed:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RadianceError(errno.EBUSY, f"model '{model.name}' is not mapped yet, and "
                                    f"mapping cannot happen while a CUDA graph is captured: call "
                                    f"radiance.torch.mapped(model) (or run the module once) before "
                                    f"capturing")
            m = model.map(max_rows)
            _MAPPED[model] = m
        return m


@torch.library.custom_op("radiance::linear", mutates_args=())
def linear(x: torch.Tensor, model_key: int, layer: int, n: int) -> torch.Tensor:
    """y [..., n] bf16 = layer `layer` of the model named by `model_key`
    (radiance.torch.model_key) applied to x [..., K] (bf16 or fp16): a CPU
    tensor through the daemon, a CUDA tensor mapped (mapped())."""
    model = _MODELS.get(model_key)
    if model is None:
        raise RadianceError(errno.ENOENT, f"no radiance model has key {model_key} (was it "
                                          f"released or garbage-collected?)")
    if x.device.type == "cuda":
        return mapped(model).linear(layer, x)
    return model.linear(layer, x)


@linear.register_fake
def _(x: torch.Tensor, model_key: int, layer: int, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n), dtype=torch.bfloat16)


#: vLLM's floor on the per-token scale, 1 / (448 * 512) (kernels/numerics.h)
MIN_SCALE = 1.0 / (448.0 * 512.0)


def quant_e4m3(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """radiance's per-token fp8 quant of x, in torch ops: the codes and
    scales that ``MappedModel.linear_fp8`` takes, equal bit for bit to the
    ones radiance's own quant makes from x (so linear_fp8 on them returns
    ``linear(x)``'s bits).

    x: [..., K] torch.bfloat16 or torch.float16, any device (not copied).
    Returns (codes [..., K] torch.float8_e4m3fn, scales [...] torch.float32),
    new tensors on x's device, enqueued on its current stream.

    The definition (docs/numerics.md "Activations", kernels/numerics.h; the
    form of vLLM's dynamic per-token scaled_fp8_quant), per row:
    amax = max |x| in fp32; s = max(amax / 448, 1 / (448 * 512)); codes =
    e4m3(x * (1 / s)) rounded to nearest even, saturated to +-448. A row
    holding Inf or NaN gets s = NaN and every code 0x7F (its outputs NaN).
    The divisions are tensor by tensor on purpose: torch turns a division
    by a Python number into a multiply by its rounded reciprocal, which
    changes the last bit of some scales.

    Bit-identity holds for these eager ops (tests/python/test_torch_cuda.py
    checks it on CUDA). Under torch.compile a generated kernel may round a
    division differently; its codes and scales are still a valid input of
    linear_fp8 (any codes x scales that stand for x are), just not bit for
    bit linear(x)'s. Raises RadianceError EINVAL for another dtype or a 0-d
    tensor."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float16) \
            or x.dim() == 0:
        what = f"dtype {x.dtype}, shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else \
            type(x).__name__
        raise RadianceError(errno.EINVAL, f"quant_e4m3 takes a torch.bfloat16 or torch.float16 "
                                          f"tensor [..., K]; got {what}")
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax)
    s = torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, MIN_SCALE))
    s = torch.where(bad, torch.full_like(s, float("nan")), s)
    inv = torch.ones_like(s) / s
    q = torch.clamp(xf * inv.unsqueeze(-1), -448.0, 448.0)
    codes = q.to(torch.float8_e4m3fn).view(torch.uint8)
    codes = torch.where(bad.unsqueeze(-1), torch.full_like(codes, 0x7F), codes)
    return codes.view(torch.float8_e4m3fn), s


class RadianceLinear(nn.Module):
    """An nn.Linear whose weights live in radianced: layer `layer` of `model`.

    forward(x): x [..., K], any float dtype; float16 is sent as is,
    anything else rounded to bf16 (what the kernels take); y [..., N] comes
    back bf16 and is cast to x's dtype (bf16 stays bf16), so the module
    drops into an fp32 model. On the CPU the daemon computes it (the
    rings); on CUDA this process does, on the daemon's mapped weights, on
    torch.cuda.current_stream() (mapped(); the first CUDA call maps the model).
    Non-contiguous inputs are copied. Other devices raise RadianceError
    EOPNOTSUPP; a daemon that cannot map raises EOPNOTSUPP with its reason
    on a CUDA tensor."""

    def __init__(self, model: Model, layer: Union[int, str, Layer]):
        super().__init__()
        self.model = model
        self.layer = model.layer(layer)
        self.in_features = self.layer.K
        self.out_features = self.layer.N
        self._key = model_key(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type not in ("cpu", "cuda"):
            raise RadianceError(errno.EOPNOTSUPP, f"layer '{self.layer.name}': x is on {x.device}: "
                                f"CPU tensors are served by the daemon, CUDA tensors mapped; "
                                f"nothing else")
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
