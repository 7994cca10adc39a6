"""Helpers every architecture module uses to read hyperparameters and name tensors."""
from __future__ import annotations

import math

from kcap import _core
from kcap.errors import MissingMetadataError, ModelError
from kcap.gguf import GGUFFile

_REQUIRED = object()


class Hyperparameters:
    """Typed access to '<arch>.<key>' metadata, with errors that name the missing key."""

    def __init__(self, gguf: GGUFFile, arch: str):
        self.gguf = gguf
        self.arch = arch

    def get(self, key: str, default=_REQUIRED):
        full = f"{self.arch}.{key}"
        if full in self.gguf.metadata:
            return self.gguf.metadata[full]
        if default is _REQUIRED:
            raise MissingMetadataError(f"{self.gguf.path}: missing metadata key '{full}'")
        return default

    def int(self, key: str, default=_REQUIRED) -> int:
        value = self.get(key, default)
        return int(value) if value is not None else None

    def float(self, key: str, default=_REQUIRED) -> float:
        value = self.get(key, default)
        return float(value) if value is not None else None


def block_tensor(gguf: GGUFFile, layer: int, name: str, required: bool = True) -> str:
    """The name 'blk.<layer>.<name>.weight' if the file has it; '' when optional and absent."""
    full = f"blk.{layer}.{name}"
    if full in gguf.tensors:
        return full
    if required:
        raise ModelError(f"{gguf.path}: missing tensor '{full}'")
    return ""


def optional_tensor(gguf: GGUFFile, name: str) -> str:
    return name if name in gguf.tensors else ""


def new_spec(gguf: GGUFFile, hp: Hyperparameters) -> _core.ModelSpec:
    """The fields every decoder family shares: embedding size, vocabulary, context, norm eps."""
    spec = _core.ModelSpec()
    spec.architecture = hp.arch
    spec.n_embd = hp.int("embedding_length")
    if "token_embd.weight" not in gguf.tensors:
        raise ModelError(f"{gguf.path}: missing tensor 'token_embd.weight'")
    spec.token_embd = "token_embd.weight"
    spec.n_vocab = int(gguf.tensors["token_embd.weight"].shape[1])
    spec.context_length = hp.int("context_length")
    spec.output_norm = optional_tensor(gguf, "output_norm.weight")
    if not spec.output_norm:
        raise ModelError(f"{gguf.path}: missing tensor 'output_norm.weight'")
    # Tied embeddings: without an output matrix the LM head is the embedding table.
    spec.output = optional_tensor(gguf, "output.weight") or spec.token_embd
    return spec


def default_head_dim(hp: Hyperparameters, n_embd: int, n_head: int) -> int:
    if n_embd % n_head:
        raise ModelError(f"embedding length {n_embd} is not a multiple of {n_head} heads")
    return n_embd // n_head


def inverse_sqrt(x: float) -> float:
    return 1.0 / math.sqrt(x)
