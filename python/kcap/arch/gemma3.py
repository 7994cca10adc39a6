"""Gemma 3 (text): RMSNorm with GGUF-baked (1 + w) weights, QK-norm, post-attention and
post-FFN norms, embeddings scaled by sqrt(n_embd), GELU-tanh gated FFN, NeoX RoPE, and
sliding-window layers interleaved with global ones (5 local : 1 global) whose RoPE bases
differ (local 10000, global from metadata).
"""
from __future__ import annotations

import math

from kcap import _core
from kcap.arch.common import Hyperparameters, block_tensor, new_spec
from kcap.gguf import GGUFFile

ARCHITECTURE = "gemma3"

# Gemma 3 conventions that GGUF files do not carry (llama.cpp hard-codes them too):
# every sixth layer is global, the rest slide; local layers use RoPE base 10000.
SLIDING_WINDOW_PATTERN = 6
LOCAL_ROPE_BASE = 10000.0
# Gemma 3 27B scales queries by 1/sqrt(n_embd / n_head) (query_pre_attn_scalar = 168);
# the other sizes by 1/sqrt(head_dim). 62 layers identifies the 27B model.
GEMMA3_27B_LAYERS = 62


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    spec.embed_scale = math.sqrt(spec.n_embd)
    spec.final_softcap = hp.float("final_logit_softcapping", 0.0) or 0.0

    n_layer = hp.int("block_count")
    n_head = hp.int("attention.head_count")
    n_head_kv = hp.int("attention.head_count_kv", n_head)
    head_dim = hp.int("attention.key_length", spec.n_embd // n_head)
    head_dim_v = hp.int("attention.value_length", head_dim)
    window = hp.int("attention.sliding_window", 0) or 0
    pattern = hp.int("attention.sliding_window_pattern", SLIDING_WINDOW_PATTERN)
    global_base = hp.float("rope.freq_base", 1000000.0)
    local_base = hp.float("rope.freq_base_swa", LOCAL_ROPE_BASE)
    scaling_type = hp.get("rope.scaling.type", "none")
    scaling_factor = hp.float("rope.scaling.factor", 1.0) or 1.0
    global_freq_scale = 1.0 / scaling_factor if scaling_type == "linear" else 1.0
    if scaling_type not in ("none", "linear"):
        raise _core.ModelError(f"{gguf.path}: gemma3 rope scaling '{scaling_type}' is not supported")
    rope_dim = hp.int("rope.dimension_count", head_dim)
    attn_scale = (
        1.0 / math.sqrt(spec.n_embd / n_head) if n_layer == GEMMA3_27B_LAYERS else 1.0 / math.sqrt(head_dim)
    )

    layers = []
    for il in range(n_layer):
        layer = _core.LayerSpec()
        layer.n_head, layer.n_head_kv = n_head, n_head_kv
        layer.head_dim, layer.head_dim_v = head_dim, head_dim_v
        layer.attn_norm = block_tensor(gguf, il, "attn_norm.weight")
        layer.wq = block_tensor(gguf, il, "attn_q.weight")
        layer.wk = block_tensor(gguf, il, "attn_k.weight")
        layer.wv = block_tensor(gguf, il, "attn_v.weight")
        layer.q_norm = block_tensor(gguf, il, "attn_q_norm.weight")
        layer.k_norm = block_tensor(gguf, il, "attn_k_norm.weight")
        layer.wo = block_tensor(gguf, il, "attn_output.weight")
        layer.post_attn_norm = block_tensor(gguf, il, "post_attention_norm.weight")
        layer.ffn_norm = block_tensor(gguf, il, "ffn_norm.weight")
        layer.ffn_gate = block_tensor(gguf, il, "ffn_gate.weight")
        layer.ffn_up = block_tensor(gguf, il, "ffn_up.weight")
        layer.ffn_down = block_tensor(gguf, il, "ffn_down.weight")
        layer.post_ffn_norm = block_tensor(gguf, il, "post_ffw_norm.weight")
        is_global = window == 0 or (il + 1) % pattern == 0
        layer.sliding_window = 0 if is_global else window
        layer.rope_style = _core.RopeStyle.NeoX
        layer.rope_dim = rope_dim
        layer.rope_base = global_base if is_global else local_base
        layer.rope_freq_scale = global_freq_scale if is_global else 1.0
        layer.attn_scale = attn_scale
        layer.attn_softcap = hp.float("attn_logit_softcapping", 0.0) or 0.0
        layer.activation = _core.Activation.GeluTanh
        layer.gated_ffn = True
        layers.append(layer)
    spec.layers = layers
    return spec
