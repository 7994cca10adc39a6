"""Qwen2 / Qwen2.5: the Llama block with Q/K/V biases and NeoX-style rotary embeddings."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import Hyperparameters, attention_geometry, new_spec, rope_scaling, standard_layer
from kcap.gguf import GGUFFile

ARCHITECTURE = "qwen2"


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    geometry = attention_geometry(hp, spec.n_embd)
    spec.layers = [
        standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX,
                       rope_dim=hp.int("rope.dimension_count", geometry[2]),
                       rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=rope_scaling(hp, gguf),
                       activation=_core.Activation.SiLU, biases=True)
        for il in range(hp.int("block_count"))
    ]
    return spec
