"""Granite (dense): the Llama block with four multipliers the metadata carries: embeddings
times embedding_scale, attention scores times attention.scale, each attention/FFN output
times residual_scale before the residual add, and logits divided by logit_scale."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import ATTENTION_KEYS, ROPE_KEYS, SPEC_KEYS, Hyperparameters, attention_geometry, new_spec, \
    optional_tensor, rope_scaling, standard_layer
from kcap.errors import ModelError
from kcap.gguf import GGUFFile

ARCHITECTURE = "granite"
METADATA_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, "attention.layer_norm_rms_epsilon", "embedding_scale",
                 "logit_scale", "residual_scale", "attention.scale")
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    spec.embed_scale = hp.float("embedding_scale", 1.0)
    logit_scale = hp.float("logit_scale", 1.0)
    if logit_scale == 0.0:
        raise ModelError(f"{gguf.path}: granite.logit_scale = 0: the logits are divided by it")
    spec.logit_scale = 1.0 / logit_scale
    geometry = attention_geometry(hp, spec.n_embd)
    residual_scale = hp.float("residual_scale", 1.0)
    attn_scale = hp.float("attention.scale", 0.0) or 0.0
    layers = []
    for il in range(hp.int("block_count")):
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.Normal,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=rope_scaling(hp, gguf),
                               activation=_core.Activation.SiLU, rope_freqs=optional_tensor(gguf, "rope_freqs.weight"))
        layer.residual_scale = residual_scale
        layer.attn_scale = attn_scale
        layers.append(layer)
    spec.layers = layers
    return spec
