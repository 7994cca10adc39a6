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

from kcap._core import __version__  # noqa: F401  (pyproject.toml's, compiled into the core)
from kcap._core import cap_cpu_kernels  # noqa: F401  (the widest CPU kernels allowed: avx512, avx2, baseline; on AArch64 dotprod, neon, baseline)


def _cap_cpu_kernels_from_environment() -> None:
    """KCAP_CPU_KERNELS (avx2 or baseline on x86-64, neon or baseline on AArch64) caps the CPU
    kernels for the process (to compare them on one machine, or to rule one out); `kcap explain`
    and `kcap --version` show the result."""
    import os

    widest = os.environ.get("KCAP_CPU_KERNELS")
    if widest:
        try:
            cap_cpu_kernels(widest)
        except Exception as exc:
            raise ValueError(f"KCAP_CPU_KERNELS: {exc}") from None


_cap_cpu_kernels_from_environment()


def cmake_dir() -> str:
    """The folder of kcap's CMake package (libkcap, its headers, kcapConfig.cmake) for a C++ host:
    cmake -DCMAKE_PREFIX_PATH=$(python -c "import kcap; print(kcap.cmake_dir())")."""
    import os

    path = os.path.join(os.path.dirname(__file__), "lib", "cmake", "kcap")
    if not os.path.isfile(os.path.join(path, "kcapConfig.cmake")):
        raise BackendUnavailableError(
            f"kcap's C++ package is not installed in {os.path.dirname(__file__)} (a source checkout, or a build with "
            "KCAP_INSTALL_CPP=OFF); install kcap with pip to get it")
    return path
