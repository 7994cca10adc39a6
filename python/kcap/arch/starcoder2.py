"""StarCoder2: LayerNorm with bias, biased Q/K/V/O and FFN projections, a non-gated
GELU(tanh) FFN, NeoX rotary embeddings, optional sliding-window attention."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import Hyperparameters, attention_geometry, new_spec, rope_scaling, standard_layer
from kcap.gguf import GGUFFile

ARCHITECTURE = "starcoder2"


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.Layer
    spec.norm_eps = hp.float("attention.layer_norm_epsilon")
    spec.output_norm_bias = "output_norm.bias" if "output_norm.bias" in gguf.tensors else ""
    geometry = attention_geometry(hp, spec.n_embd)
    window = hp.int("attention.sliding_window", 0) or 0
    layers = []
    for il in range(hp.int("block_count")):
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=rope_scaling(hp, gguf),
                               activation=_core.Activation.GeluTanh, gated_ffn=False, biases=True,
                               norm_biases=True)
        layer.sliding_window = window
        layers.append(layer)
    spec.layers = layers
    return spec
