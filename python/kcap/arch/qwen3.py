"""Qwen3 (dense): the Llama block with per-head RMS QK-norm and NeoX-style rotary embeddings."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import build_rms_decoder
from kcap.gguf import GGUFFile

ARCHITECTURE = "qwen3"


def build(gguf: GGUFFile) -> _core.ModelSpec:
    return build_rms_decoder(gguf, ARCHITECTURE, _core.RopeStyle.NeoX, _core.Activation.SiLU, qk_norm=True)
