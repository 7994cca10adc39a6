"""Gemma 2: RMSNorm with GGUF-baked (1 + w) weights, post-attention and post-FFN norms,
embeddings scaled by sqrt(n_embd), GELU-tanh gated FFN, NeoX RoPE, attention-logit and
final-logit softcapping, and sliding-window attention on every other layer (even layers)."""
from __future__ import annotations

import math

from kcap import _core
from kcap.arch.common import ATTENTION_KEYS, ROPE_KEYS, SPEC_KEYS, Hyperparameters, attention_geometry, new_spec, \
    rope_scaling, standard_layer
from kcap.gguf import GGUFFile

ARCHITECTURE = "gemma2"
# The sliding layers alternate (even layers); a sliding_window_pattern key is not read.
METADATA_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, "attention.layer_norm_rms_epsilon",
                 "final_logit_softcapping", "attn_logit_softcapping", "attention.sliding_window", "attention.scale")
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}

# Gemma 2 27B scales queries by 1/sqrt(n_embd / n_head) (query_pre_attn_scalar = 144); the
# other sizes by 1/sqrt(head_dim). llama.cpp keys this on the 46-layer 27B model too.
GEMMA2_27B_LAYERS = 46
GEMMA2_DEFAULT_WINDOW = 4096
GEMMA2_ATTN_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    spec.embed_scale = math.sqrt(spec.n_embd)
    # Files converted before llama.cpp wrote the softcaps lack them; llama.cpp and transformers'
    # Gemma2Config then cap at 50 (attention) and 30 (final logits).
    spec.final_softcap = hp.float("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP) or 0.0
    geometry = attention_geometry(hp, spec.n_embd)
    n_layer = hp.int("block_count")
    n_head, _, head_dim, _ = geometry
    # Every other layer slides; without the key, llama.cpp and transformers' Gemma2Config use 4096.
    window = hp.int("attention.sliding_window", GEMMA2_DEFAULT_WINDOW) or 0
    default_scale = 1 / math.sqrt(spec.n_embd / n_head) if n_layer == GEMMA2_27B_LAYERS else 1 / math.sqrt(head_dim)
    attn_scale = hp.float("attention.scale", default_scale) or default_scale
    layers = []
    for il in range(n_layer):
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX,
                               rope_dim=hp.int("rope.dimension_count", head_dim),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=rope_scaling(hp, gguf),
                               activation=_core.Activation.GeluTanh, post_norms=True)
        layer.sliding_window = window if il % 2 == 0 else 0
        layer.attn_scale = attn_scale
        layer.attn_softcap = hp.float("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP) or 0.0
        layers.append(layer)
    spec.layers = layers
    return spec
