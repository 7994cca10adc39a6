"""Gemma 3 (text): RMSNorm with GGUF-baked (1 + w) weights, QK-norm, post-attention and
post-FFN norms, embeddings scaled by sqrt(n_embd), GELU-tanh gated FFN, NeoX RoPE, and
sliding-window layers interleaved with global ones (5 local : 1 global) whose RoPE bases
differ (local 10000, global from metadata).
"""
from __future__ import annotations

import math

from kcap import _core
from kcap.arch.common import ATTENTION_KEYS, ROPE_KEYS, SLIDING_WINDOW_KEYS, SPEC_KEYS, Hyperparameters, \
    attention_geometry, new_spec, rope_scaling, sliding_windows, standard_layer
from kcap.gguf import GGUFFile

ARCHITECTURE = "gemma3"
METADATA_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, *SLIDING_WINDOW_KEYS, "attention.layer_norm_rms_epsilon",
                 "final_logit_softcapping", "attn_logit_softcapping", "rope.freq_base_swa")
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}

# Gemma 3 conventions that GGUF files do not carry (llama.cpp hard-codes them too):
# every sixth layer is global, the rest slide; local layers use RoPE base 10000.
SLIDING_WINDOW_PATTERN = 6
LOCAL_ROPE_BASE = 10000.0
# Gemma 3 27B scales queries by 1/sqrt(n_embd / n_head) (query_pre_attn_scalar = 168);
# the other sizes by 1/sqrt(head_dim). 62 layers identifies the 27B model.
GEMMA3_27B_LAYERS = 62


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    spec.embed_scale = math.sqrt(spec.n_embd)
    spec.final_softcap = hp.float("final_logit_softcapping", 0.0) or 0.0

    n_layer = hp.int("block_count")
    geometry = attention_geometry(hp, spec.n_embd)
    n_head, _, head_dim, _ = geometry
    windows = sliding_windows(hp, n_layer, default_period=SLIDING_WINDOW_PATTERN)
    # Required: without it llama.cpp rotates by 10,000 and transformers by 1,000,000.
    global_base = hp.float("rope.freq_base")
    local_base = hp.float("rope.freq_base_swa", LOCAL_ROPE_BASE)
    global_freq_scale = rope_scaling(hp, gguf)  # scaling applies to the global layers only
    rope_dim = hp.int("rope.dimension_count", head_dim)
    attn_scale = (
        1.0 / math.sqrt(spec.n_embd / n_head) if n_layer == GEMMA3_27B_LAYERS else 1.0 / math.sqrt(head_dim)
    )
    layers = []
    for il in range(n_layer):
        is_global = windows[il] == 0
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX, rope_dim=rope_dim,
                               rope_base=global_base if is_global else local_base,
                               freq_scale=global_freq_scale if is_global else 1.0,
                               activation=_core.Activation.GeluTanh, qk_norm=True, post_norms=True)
        layer.sliding_window = windows[il]
        layer.attn_scale = attn_scale
        layer.attn_softcap = hp.float("attn_logit_softcapping", 0.0) or 0.0
        layers.append(layer)
    spec.layers = layers
    return spec
