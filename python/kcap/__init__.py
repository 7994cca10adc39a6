"""kcap: quantized GGUF language models on Apple Metal, NVIDIA CUDA and the CPU.

    import kcap
    model = kcap.load("model.gguf")            # or "hf://ORG/REPO/FILE.gguf"; backend: cuda, metal or cpu
    print(model.generate("The capital of France is", max_tokens=32))
    print(model.chat([{"role": "user", "content": "Hi!"}]))   # models with a chat template
"""
from kcap.errors import (  # noqa: F401
    BackendUnavailableError,
    ContextOverflowError,
    FormatError,
    GGUFError,
    HubError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    KcapError,
    MissingMetadataError,
    ModelError,
    NumericalError,
    RoutingError,
    UnimplementedMetadataError,
    UnknownArchitectureError,
    UnusedTensorError,
)
from kcap.generate import GenerationStats  # noqa: F401
from kcap.model import Model, default_backend, load  # noqa: F401
from kcap import formats  # noqa: F401

__version__ = "0.1.0"
