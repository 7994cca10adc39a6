"""Llama family (Llama 1/2/3, SmolLM, Mixtral, and files that declare general.architecture=llama):
RMSNorm, SiLU gated FFN, rotary embeddings in GGUF's permuted ("normal", adjacent pairs)
layout, GQA, optional Q/K/V/O biases, optional Llama 3 rope frequency factors
(rope_freqs.weight), linear or YaRN rope scaling, tied or untied output.

Mixtral (llama.expert_count > 0): every block's FFN is a mixture of SiLU-gated experts, as
transformers' MixtralSparseMoeBlock and llama.cpp compute it: a softmax over the router's logits
(ffn_gate_inp), the top llama.expert_used_count experts, their weights renormalized to sum 1.
The experts are merged into one 3-D tensor per matrix (ffn_{gate,up,down}_exps); a file with
one tensor per expert (older converters) is refused.
"""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import ATTENTION_KEYS, MOE_KEYS, ROPE_KEYS, SPEC_KEYS, YARN_KEYS, Hyperparameters, \
    attention_geometry, mixture_of_experts, moe_ffn, new_spec, optional_tensor, rope_scaling, rope_yarn, standard_layer
from kcap.errors import ModelError
from kcap.gguf import GGUFFile

ARCHITECTURE = "llama"
METADATA_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, *YARN_KEYS, *MOE_KEYS, "attention.layer_norm_rms_epsilon")
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    geometry = attention_geometry(hp, spec.n_embd)
    # Llama 3 scaling is carried as per-frequency divisors in rope_freqs.weight.
    rope_freqs = optional_tensor(gguf, "rope_freqs.weight")
    if hp.get("rope.scaling.type", "none") == "llama3" and not rope_freqs:
        raise ModelError(f"{gguf.path}: llama3 rope scaling without a rope_freqs.weight tensor")
    freq_scale = rope_scaling(hp, gguf, allowed=("none", "linear", "llama3", "yarn"))
    yarn = rope_yarn(hp, gguf)
    experts = mixture_of_experts(hp, weights_norm=True)  # Mixtral renormalizes the top-k weights
    layers = []
    for il in range(hp.int("block_count")):
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.Normal,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=freq_scale, yarn=yarn,
                               activation=_core.Activation.SiLU, rope_freqs=rope_freqs,
                               dense_ffn=experts is None)
        if experts is not None:
            moe_ffn(gguf, layer, il, spec.n_embd, experts, ARCHITECTURE)
        layers.append(layer)
    spec.layers = layers
    return spec
