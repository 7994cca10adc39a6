"""GPT-2: learned absolute position embeddings, LayerNorm with bias, a fused QKV projection
with bias (split into Q, K and V views of the one tensor), biased output and FFN
projections, a non-gated GELU(tanh) FFN, no rotary embeddings."""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import ATTENTION_KEYS, SPEC_KEYS, Hyperparameters, attention_geometry, block_tensor, new_spec
from kcap.errors import ModelError
from kcap.gguf import GGUFFile

ARCHITECTURE = "gpt2"
METADATA_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, "attention.layer_norm_epsilon")
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.Layer
    spec.norm_eps = hp.float("attention.layer_norm_epsilon")
    spec.output_norm_bias = block_or_model(gguf, "output_norm.bias")
    if not spec.output_norm_bias:
        raise ModelError(f"{gguf.path}: missing tensor 'output_norm.bias'")
    if "position_embd.weight" not in gguf.tensors:
        raise ModelError(f"{gguf.path}: missing tensor 'position_embd.weight'")
    spec.position_embd = "position_embd.weight"
    n_head, n_head_kv, head_dim, head_dim_v = attention_geometry(hp, spec.n_embd)
    q_rows, kv_rows = n_head * head_dim, n_head_kv * head_dim
    views = {}
    layers = []
    for il in range(hp.int("block_count")):
        layer = _core.LayerSpec()
        layer.n_head, layer.n_head_kv, layer.head_dim, layer.head_dim_v = n_head, n_head_kv, head_dim, head_dim_v
        t = lambda name, required=True: block_tensor(gguf, il, name, required)  # noqa: E731,B023
        layer.attn_norm, layer.attn_norm_bias = t("attn_norm.weight"), t("attn_norm.bias")
        qkv, qkv_bias = t("attn_qkv.weight"), t("attn_qkv.bias")
        for part, offset, count in (("q", 0, q_rows), ("k", q_rows, kv_rows), ("v", q_rows + kv_rows, kv_rows)):
            views[f"{qkv}[{part}]"] = (qkv, offset, count)
            views[f"{qkv_bias}[{part}]"] = (qkv_bias, offset, count)
        layer.wq, layer.wk, layer.wv = f"{qkv}[q]", f"{qkv}[k]", f"{qkv}[v]"
        layer.bq, layer.bk, layer.bv = f"{qkv_bias}[q]", f"{qkv_bias}[k]", f"{qkv_bias}[v]"
        layer.wo, layer.bo = t("attn_output.weight"), t("attn_output.bias")
        layer.ffn_norm, layer.ffn_norm_bias = t("ffn_norm.weight"), t("ffn_norm.bias")
        layer.ffn_up, layer.ffn_up_bias = t("ffn_up.weight"), t("ffn_up.bias")
        layer.ffn_down, layer.ffn_down_bias = t("ffn_down.weight"), t("ffn_down.bias")
        layer.gated_ffn = False
        layer.activation = _core.Activation.GeluTanh
        layer.rope_style = _core.RopeStyle.None_
        layers.append(layer)
    spec.layers = layers
    spec.views = views
    return spec


def block_or_model(gguf: GGUFFile, name: str) -> str:
    return name if name in gguf.tensors else ""
