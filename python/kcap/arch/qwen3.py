"""Qwen3 (dense): the Llama block with per-head RMS QK-norm and NeoX-style rotary embeddings;
sliding-window attention on the layers attention.sliding_window_pattern marks (as for Qwen2)."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import RMS_DECODER_KEYS, build_rms_decoder
from kcap.gguf import GGUFFile

ARCHITECTURE = "qwen3"
METADATA_KEYS = RMS_DECODER_KEYS
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    return build_rms_decoder(gguf, ARCHITECTURE, _core.RopeStyle.NeoX, _core.Activation.SiLU, qk_norm=True)
