"""Llama family (Llama 1/2/3, SmolLM, and files that declare general.architecture=llama):
RMSNorm, SiLU gated FFN, rotary embeddings in GGUF's permuted ("normal", adjacent pairs)
layout, GQA, optional Q/K/V/O biases, optional Llama 3 rope frequency factors
(rope_freqs.weight), linear rope scaling, tied or untied output.
"""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import Hyperparameters, block_tensor, new_spec, optional_tensor
from kcap.gguf import GGUFFile

ARCHITECTURE = "llama"


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")

    n_layer = hp.int("block_count")
    n_head = hp.int("attention.head_count")
    n_head_kv = hp.int("attention.head_count_kv", n_head)
    head_dim = hp.int("attention.key_length", spec.n_embd // n_head)
    head_dim_v = hp.int("attention.value_length", head_dim)
    rope_dim = hp.int("rope.dimension_count", head_dim)
    rope_base = hp.float("rope.freq_base", 10000.0)
    scaling_type = hp.get("rope.scaling.type", "none")
    scaling_factor = hp.float("rope.scaling.factor", 1.0) or 1.0
    if scaling_type not in ("none", "linear", "llama3"):
        raise _core.ModelError(f"{gguf.path}: llama rope scaling '{scaling_type}' is not supported")
    freq_scale = 1.0 / scaling_factor if scaling_type == "linear" else 1.0
    rope_freqs = optional_tensor(gguf, "rope_freqs.weight")

    layers = []
    for il in range(n_layer):
        layer = _core.LayerSpec()
        layer.n_head, layer.n_head_kv = n_head, n_head_kv
        layer.head_dim, layer.head_dim_v = head_dim, head_dim_v
        layer.attn_norm = block_tensor(gguf, il, "attn_norm.weight")
        layer.wq = block_tensor(gguf, il, "attn_q.weight")
        layer.wk = block_tensor(gguf, il, "attn_k.weight")
        layer.wv = block_tensor(gguf, il, "attn_v.weight")
        layer.bq = block_tensor(gguf, il, "attn_q.bias", required=False)
        layer.bk = block_tensor(gguf, il, "attn_k.bias", required=False)
        layer.bv = block_tensor(gguf, il, "attn_v.bias", required=False)
        layer.wo = block_tensor(gguf, il, "attn_output.weight")
        layer.bo = block_tensor(gguf, il, "attn_output.bias", required=False)
        layer.ffn_norm = block_tensor(gguf, il, "ffn_norm.weight")
        layer.ffn_gate = block_tensor(gguf, il, "ffn_gate.weight")
        layer.ffn_up = block_tensor(gguf, il, "ffn_up.weight")
        layer.ffn_down = block_tensor(gguf, il, "ffn_down.weight")
        layer.rope_style = _core.RopeStyle.Normal
        layer.rope_dim = rope_dim
        layer.rope_base = rope_base
        layer.rope_freq_scale = freq_scale
        layer.rope_freqs = rope_freqs
        layer.activation = _core.Activation.SiLU
        layer.gated_ffn = True
        layers.append(layer)
    spec.layers = layers
    return spec
