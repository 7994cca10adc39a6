"""gpt-oss (gpt-oss-20b, gpt-oss-120b), as transformers implements GptOss: pre-norm RMSNorm
blocks whose attention has Q/K/V/O biases, a learned sink logit per head in every softmax
(attn_sinks), NeoX rotary embeddings with YaRN scaling that keeps the correction range's
bounds fractional (transformers' truncate = False for gpt-oss), and a sliding window of
gpt-oss.attention.sliding_window on every other layer (the first slides, the second attends
globally, as transformers' default layer_types and llama.cpp's swa pattern 2). The FFN
(its input norm is post_attention_norm) is a mixture of experts: the router's logits plus its
bias, the top expert_used_count, a softmax over those (the renormalized softmax), and each chosen
expert's clamped SwiGLU, (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g) with g = min(gate, 7),
with biases on gate, up and down.
"""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import (MOE_KEYS, RMS_DECODER_KEYS, Hyperparameters, attention_geometry,
                              expert_tensor, mixture_of_experts, moe_ffn, new_spec, rope_scaling, rope_yarn,
                              sliding_windows, standard_layer)
from kcap.errors import ModelError
from kcap.gguf import GGUFFile

ARCHITECTURE = "gpt-oss"
# feed_forward_length: the converter writes the experts' width there too (intermediate_size);
# the experts' own key and tensors are what the plan uses, and they are checked to agree.
METADATA_KEYS = (*RMS_DECODER_KEYS, *MOE_KEYS, "feed_forward_length")
KNOWN_UNUSED_TENSORS: dict[str, str] = {}
# The clamped SwiGLU's constants: transformers' GptOssConfig defaults (swiglu_alpha, swiglu_limit),
# which the GGUF does not carry (llama.cpp uses the same numbers).
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
# Every other layer slides: layer il attends globally when (il + 1) % 2 == 0.
SLIDING_PERIOD = 2


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    geometry = attention_geometry(hp, spec.n_embd)
    n_head = geometry[0]
    n_layer = hp.int("block_count")
    windows = sliding_windows(hp, n_layer, default_period=SLIDING_PERIOD, required=True)
    experts = mixture_of_experts(hp, weights_norm=True, required=True)
    n_ff = hp.int("feed_forward_length", None)
    if n_ff is not None and experts.n_ff is not None and n_ff != experts.n_ff:
        raise ModelError(f"{gguf.path}: {ARCHITECTURE}.feed_forward_length = {n_ff} differs from "
                         f"{ARCHITECTURE}.expert_feed_forward_length = {experts.n_ff}")
    rope_scaling(hp, gguf, allowed=("none", "yarn"))
    yarn = rope_yarn(hp, gguf)
    yarn.truncate = False
    layers = []
    for il in range(n_layer):
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), yarn=yarn,
                               activation=_core.Activation.SwigluOai, biases=True, dense_ffn=False,
                               ffn_norm="post_attention_norm")
        if not layer.bo:
            raise ModelError(f"{gguf.path}: missing tensor 'blk.{il}.attn_output.bias' (gpt-oss has output biases)")
        layer.attn_sinks = expert_tensor(gguf, il, "attn_sinks.weight", (n_head,),
                                         f"the attention sinks: one logit per query head, [n_head {n_head}]")
        moe_ffn(gguf, layer, il, spec.n_embd, experts, ARCHITECTURE)
        n_expert = experts.n_expert
        n_ff_exp = gguf.tensors[layer.ffn_gate_exps].shape[1]
        layer.ffn_gate_inp_bias = expert_tensor(gguf, il, "ffn_gate_inp.bias", (n_expert,),
                                                f"the router's bias: [{ARCHITECTURE}.expert_count = {n_expert}]")
        for field, name, width in (("ffn_gate_exps_bias", "ffn_gate_exps.bias", n_ff_exp),
                                   ("ffn_up_exps_bias", "ffn_up_exps.bias", n_ff_exp),
                                   ("ffn_down_exps_bias", "ffn_down_exps.bias", spec.n_embd)):
            setattr(layer, field, expert_tensor(gguf, il, name, (width, n_expert),
                                                f"[{width}, {ARCHITECTURE}.expert_count = {n_expert}]"))
        layer.swiglu_alpha = SWIGLU_ALPHA
        layer.swiglu_limit = SWIGLU_LIMIT
        layer.sliding_window = windows[il]
        layers.append(layer)
    spec.layers = layers
    return spec
