"""Architecture registry: general.architecture -> the module that builds its ModelSpec.

Each family is one module with an ARCHITECTURE name and build(gguf) -> ModelSpec. The
spec only names tensors; kcap.model registers exactly the tensors it names.
"""
from __future__ import annotations

from kcap.arch import gemma2, gemma3, gemma4, gpt2, granite, llama, qwen2, qwen3, starcoder2
from kcap.errors import UnknownArchitectureError

FAMILIES = {module.ARCHITECTURE: module for module in (gemma2, gemma3, gemma4, gpt2, granite, llama, qwen2, qwen3, starcoder2)}


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


def build_spec(gguf):
    arch = gguf.architecture
    module = FAMILIES.get(arch)
    if module is None:
        raise UnknownArchitectureError(
            f"{gguf.path}: unknown architecture '{arch}' (supported: {', '.join(supported_architectures())})"
        )
    return module.build(gguf)
