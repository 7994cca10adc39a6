"""Architecture registry: general.architecture -> the module that builds its ModelSpec.

Each family is one module with an ARCHITECTURE name, build(gguf) -> ModelSpec, the
metadata keys it reads and implements (METADATA_KEYS), and KNOWN_UNUSED_TENSORS (name
pattern -> why the plan does not need such a tensor; short, usually empty). The spec only names tensors;
kcap.model registers exactly the tensors it names and refuses a file with any other tensor
not on that list (kcap.accounting).
"""
from __future__ import annotations

from kcap.accounting import check_metadata
from kcap.arch import deepseek2, gemma2, gemma3, gemma4, gpt2, gpt_oss, granite, llama, qwen2, qwen2moe, qwen3, \
    qwen3moe, starcoder2
from kcap.errors import ModelError, UnknownArchitectureError

FAMILIES = {module.ARCHITECTURE: module for module in (deepseek2, gemma2, gemma3, gemma4, gpt2, gpt_oss, granite, llama,
                                                       qwen2, qwen2moe, qwen3, qwen3moe, starcoder2)}


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


def family(arch: str, path: str = ""):
    module = FAMILIES.get(arch)
    if module is None:
        raise UnknownArchitectureError(
            f"{path}: unknown architecture '{arch}' (supported: {', '.join(supported_architectures())})"
        )
    return module


def known_unused_tensors(arch: str) -> dict[str, str]:
    """Tensor name patterns the family knows and does not need -> why."""
    return family(arch).KNOWN_UNUSED_TENSORS


def build_spec(gguf):
    """The family's ModelSpec, after refusing metadata that changes the computation and that
    the family does not implement."""
    module = family(gguf.architecture, gguf.path)
    check_metadata(gguf, module.ARCHITECTURE, module.METADATA_KEYS)
    spec = module.build(gguf)
    check_feed_forward_length(gguf, spec)
    return spec


def check_feed_forward_length(gguf, spec) -> None:
    """The dense FFNs' width is read from their tensors; a <arch>.feed_forward_length (one value, or
    one per layer) that disagrees with them marks a broken file, which llama.cpp refuses too."""
    key = f"{gguf.architecture}.feed_forward_length"
    value = gguf.metadata.get(key)
    if value is None:
        return
    for il, layer in enumerate(spec.layers):
        tensor = gguf.tensors.get(layer.ffn_up)
        if tensor is None or len(tensor.shape) != 2:
            continue
        want = value[il] if isinstance(value, list) and il < len(value) else value
        if isinstance(want, int) and not isinstance(want, bool) and want != int(tensor.shape[1]):
            raise ModelError(f"{gguf.path}: {key} = {want}{f' (layer {il})' if isinstance(value, list) else ''} but "
                             f"{layer.ffn_up} has {int(tensor.shape[1])} rows")
