"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (Q/K/V biases, NeoX-style rotary
embeddings) with a mixture of SiLU-gated experts in every block, as transformers'
Qwen2MoeSparseMoeBlock and llama.cpp compute it:

* routed experts: a softmax over the router's logits (ffn_gate_inp), the top
  qwen2moe.expert_used_count experts weighted by their softmax probabilities as they are
  (no renormalization: norm_topk_prob false, which is what llama.cpp computes for qwen2moe);
  expert width qwen2moe.expert_feed_forward_length (ffn_{gate,up,down}_exps);
* a shared expert (ffn_{gate,up,down}_shexp, width qwen2moe.expert_shared_feed_forward_length)
  added to every token's output, scaled by sigmoid(ffn_gate_inp_shexp . x).
"""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import MOE_KEYS, RMS_DECODER_KEYS, SHARED_EXPERT_KEYS, build_rms_decoder
from kcap.gguf import GGUFFile

ARCHITECTURE = "qwen2moe"
METADATA_KEYS = (*RMS_DECODER_KEYS, *MOE_KEYS, *SHARED_EXPERT_KEYS)
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    return build_rms_decoder(gguf, ARCHITECTURE, _core.RopeStyle.NeoX, _core.Activation.SiLU, keys=METADATA_KEYS,
                             experts=dict(weights_norm=False, shared=True, required=True), biases=True)
