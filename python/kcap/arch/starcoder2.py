"""StarCoder2: LayerNorm with bias, biased Q/K/V/O and FFN projections, a non-gated
GELU(tanh) FFN, NeoX rotary embeddings, optional sliding-window attention (transformers'
Starcoder2 slides every layer; a pattern key, where a file has one, is honoured)."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import ATTENTION_KEYS, ROPE_KEYS, SLIDING_WINDOW_KEYS, SPEC_KEYS, Hyperparameters, \
    attention_geometry, block_tensor, new_spec, rope_scaling, sliding_windows, standard_layer
from kcap.errors import ModelError
from kcap.gguf import GGUFFile

ARCHITECTURE = "starcoder2"
METADATA_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, *SLIDING_WINDOW_KEYS, "attention.layer_norm_epsilon")
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.Layer
    spec.norm_eps = hp.float("attention.layer_norm_epsilon")
    # Every norm and projection of StarCoder2 has a bias (transformers' use_bias; llama.cpp requires them).
    if "output_norm.bias" not in gguf.tensors:
        raise ModelError(f"{gguf.path}: missing tensor 'output_norm.bias'")
    spec.output_norm_bias = "output_norm.bias"
    geometry = attention_geometry(hp, spec.n_embd)
    n_layer = hp.int("block_count")
    windows = sliding_windows(hp, n_layer)
    layers = []
    for il in range(n_layer):
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=rope_scaling(hp, gguf),
                               activation=_core.Activation.GeluTanh, gated_ffn=False, biases=True,
                               norm_biases=True)
        for name in ("attn_output.bias", "ffn_up.bias", "ffn_down.bias"):
            block_tensor(gguf, il, name, required=True)  # read by standard_layer where present
        layer.sliding_window = windows[il]
        layers.append(layer)
    spec.layers = layers
    return spec
