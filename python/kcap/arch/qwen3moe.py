"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head RMS QK-norm, NeoX-style
rotary embeddings, no biases) with a mixture of SiLU-gated experts in every block: a softmax over
the router's logits (ffn_gate_inp), the top qwen3moe.expert_used_count experts, their weights
renormalized to sum 1 (llama.cpp always renormalizes for qwen3moe; transformers does with
norm_topk_prob, which the released models set), expert width qwen3moe.expert_feed_forward_length
(ffn_{gate,up,down}_exps). No shared expert.
"""
from __future__ import annotations

from kcap import _core
from kcap.arch.common import MOE_KEYS, RMS_DECODER_KEYS, build_rms_decoder
from kcap.gguf import GGUFFile

ARCHITECTURE = "qwen3moe"
METADATA_KEYS = (*RMS_DECODER_KEYS, *MOE_KEYS)
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    return build_rms_decoder(gguf, ARCHITECTURE, _core.RopeStyle.NeoX, _core.Activation.SiLU, keys=METADATA_KEYS,
                             experts=dict(weights_norm=True, required=True), qk_norm=True)
