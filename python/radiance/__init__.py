"""radiance: Python client of radianced, the daemon that keeps int4 model
weights resident once and serves W4A8 linear layers to many processes.

    import ml_dtypes, numpy as np, radiance

    with radiance.Client() as client:                 # $RADIANCE_SOCKET or the default socket
        model = client.load("tests/data/minilm-w4g128")   # or client.attach("minilm-w4g128")
        x = np.zeros((2, 7, 384), ml_dtypes.bfloat16)     # [..., K] bf16 or float16
        y = model.linear("encoder.layer.0.attention.self.query", x)   # [..., N] bf16
        req = model.submit(0, x)                       # asynchronous
        y2 = req.result()
        emb = model.tensor("embeddings.word_embeddings.weight")   # read-only, the daemon's pages

Every failure raises RadianceError(errno, message). The library is
libradiance.so.0, found through $RADIANCE_LIBRARY, then this package's
directory, then the system loader (see radiance._lib). Model.map() runs
the layers on torch CUDA tensors in this process (mapped mode, through
libradiance-gpu; radiance._gpu). torch support (CPU tensors through the
daemon, CUDA tensors mapped, an nn.Linear replacement, a
torch.compile-opaque custom op) is in radiance.torch. docs/engines.md is the guide.
"""
from ._client import (Client, Layer, Model, OtherTensor, Request, ResidentModel, Tensor,
                      bfloat16, default_socket_path, float16, library_version)
from ._errors import RadianceError
from ._gpu import MappedModel
from ._lib import library_path

__version__ = "0.1.0"

__all__ = ["Client", "Model", "MappedModel", "Layer", "OtherTensor", "Request", "ResidentModel", "Tensor",
           "RadianceError", "bfloat16", "float16", "default_socket_path", "library_path",
           "library_version", "__version__"]
