"""kcap: quantized GGUF language models on Apple Metal, NVIDIA CUDA and the CPU.

    import kcap
    model = kcap.load("model.gguf")            # backend: "metal" on a Mac with Metal, else "cpu"
    print(model.generate("The capital of France is", max_tokens=32))
"""
from kcap.errors import (  # noqa: F401
    BackendUnavailableError,
    ContextOverflowError,
    FormatError,
    GGUFError,
    KcapError,
    MissingMetadataError,
    ModelError,
    RoutingError,
    UnimplementedMetadataError,
    UnknownArchitectureError,
    UnusedTensorError,
)
from kcap.model import Model, default_backend, load  # noqa: F401
from kcap import formats  # noqa: F401

__version__ = "0.1.0"
