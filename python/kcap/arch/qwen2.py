"""Qwen2 / Qwen2.5: the Llama block with Q/K/V biases and NeoX-style rotary embeddings."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import build_rms_decoder
from kcap.gguf import GGUFFile

ARCHITECTURE = "qwen2"


def build(gguf: GGUFFile) -> _core.ModelSpec:
    return build_rms_decoder(gguf, ARCHITECTURE, _core.RopeStyle.NeoX, _core.Activation.SiLU, biases=True)
