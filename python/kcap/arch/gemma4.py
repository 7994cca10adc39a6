"""Gemma 4 (dense text, E2B-style): Gemma 3's block (QK-norm, post-norms, GELU-tanh, NeoX RoPE,
sliding and full layers) with

* per-layer head dims: full layers use key_length/value_length, sliding ones *_swa;
  `attention.sliding_window_pattern` is a bool per layer (true = sliding);
* attention scale 1.0 and a parameter-free RMS norm of V (V-norm);
* a full layer without attn_v (attention_k_eq_v, the larger models) takes V from its K
  projection before the K norm, as transformers and llama.cpp do; its KV head count may differ
  from the sliding layers' (attention.head_count_kv per layer);
* full layers: RoPE over rope.dimension_count with `rope_freqs` (1e30 entries leave pairs
  unrotated: partial rotary, frequencies from the full head dim); sliding: rope.*_swa;
* per-layer embeddings (PLE) mixed in after each FFN, then the block output times
  `layer_output_scale`;
* KV sharing: the last `attention.shared_kv_layers` layers reuse the KV cache of the last
  earlier non-shared layer of the same type (sliding/full);
* per-layer FFN sizes (feed_forward_length may be an array; read from the tensors);
* final logit softcap; tied head. RMSNorm weights are plain multipliers;
* mixture of experts (26B-A4B style, `gemma4.expert_count` > 0): in every block the dense FFN
  and the experts run side by side on the attention residual r:
  dense = post_ffw_norm_1(ffn(ffn_norm(r))), experts = post_ffw_norm_2(moe(pre_ffw_norm_2(r))),
  then post_ffw_norm(dense + experts) joins the residual. The router reads its own RMS norm of r
  (weight ffn_gate_inp.scale) times n_embd^-0.5, takes a softmax over every expert and the top
  expert_used_count, renormalizes their weights to sum 1 and multiplies each by its expert's
  ffn_down_exps.scale entry; the experts' gate and up are one tensor (ffn_gate_up_exps, each
  expert's gate rows first), or two (ffn_gate_exps, ffn_up_exps) where a converter splits them.
"""
from __future__ import annotations

import math

import numpy as np

from kcap import _core
from kcap.arch.common import (MOE_KEYS, SLIDING_WINDOW_KEYS, SPEC_KEYS, Experts, Hyperparameters, block_tensor,
                              expert_tensor, mixture_of_experts, new_spec, standard_layer)
from kcap.errors import ModelError
from kcap.gguf import GGUFFile

ARCHITECTURE = "gemma4"
METADATA_KEYS = (*SPEC_KEYS, *SLIDING_WINDOW_KEYS, "attention.layer_norm_rms_epsilon", "final_logit_softcapping",
                 "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
                 "attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count",
                 "rope.dimension_count_swa", "rope.freq_base", "rope.freq_base_swa", "rope.scaling.type",
                 "attention.shared_kv_layers", "embedding_length_per_layer_input", *MOE_KEYS)
# Tensor name patterns the plan deliberately does not use -> why (none).
KNOWN_UNUSED_TENSORS: dict[str, str] = {}


def _per_layer(value, n_layer: int, what: str, count: bool = False) -> list:
    """One value per layer (a list of n_layer, or one value for all); count: each an integer of
    at least 1 (a head count)."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n_layer
    if len(values) != n_layer:
        raise ModelError(f"gemma4 metadata '{what}' has {len(values)} entries for {n_layer} layers")
    if count:
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2**31 - 1:
                raise ModelError(f"gemma4 metadata '{what}' holds {v!r}: expected integers of at least 1")
    return values


def _scalar_tensor(gguf: GGUFFile, name: str) -> float:
    info = gguf.tensors[name]
    if info.type_name != "F32" or int(np.prod(info.shape)) != 1:
        raise ModelError(f"{gguf.path}: tensor '{name}' must be one F32 value, got {info.type_name} {info.shape}")
    return float(np.frombuffer(info.data.tobytes()[:4], dtype="<f4")[0])


def _experts(gguf: GGUFFile, layer: _core.LayerSpec, il: int, n_embd: int, experts: Experts) -> None:
    """The block's expert branch beside its dense FFN, each tensor's shape checked against the
    embedding size and the metadata's expert counts."""
    n_expert = experts.n_expert
    count = f"{ARCHITECTURE}.expert_count = {n_expert}"
    layer.ffn_gate_inp = expert_tensor(gguf, il, "ffn_gate_inp.weight", (n_embd, n_expert),
                                       f"the router: [n_embd {n_embd}, {count}]")
    layer.ffn_gate_inp_scale = expert_tensor(gguf, il, "ffn_gate_inp.scale", (n_embd,),
                                             f"the router's input norm weight: [n_embd {n_embd}]")
    n_ff = experts.n_ff
    width = f"{ARCHITECTURE}.expert_feed_forward_length = {n_ff}" if n_ff else "expert width"
    if f"blk.{il}.ffn_gate_up_exps.weight" in gguf.tensors or f"blk.{il}.ffn_gate_exps.weight" not in gguf.tensors:
        merged = expert_tensor(gguf, il, "ffn_gate_up_exps.weight", (n_embd, 2 * n_ff if n_ff else None, n_expert),
                               f"[n_embd {n_embd}, 2 x {width}, {count}]: each expert's gate rows, then its up rows")
        shape = gguf.tensors[merged].shape
        if shape[1] % 2:
            raise ModelError(f"{gguf.path}: tensor '{merged}' has shape {list(shape)}: an odd number of rows "
                             f"({shape[1]}) per expert cannot hold a gate and an up half")
        n_ff = n_ff or shape[1] // 2
        layer.ffn_gate_up_exps = merged
    else:
        gate = expert_tensor(gguf, il, "ffn_gate_exps.weight", (n_embd, n_ff, n_expert),
                             f"[n_embd {n_embd}, {width}, {count}]")
        n_ff = n_ff or gguf.tensors[gate].shape[1]
        layer.ffn_gate_exps = gate
        layer.ffn_up_exps = expert_tensor(gguf, il, "ffn_up_exps.weight", (n_embd, n_ff, n_expert),
                                          f"[n_embd {n_embd}, {width}, {count}]")
    if not experts.n_ff:
        width = f"expert width {n_ff}"
    layer.ffn_down_exps = expert_tensor(gguf, il, "ffn_down_exps.weight", (n_ff, n_embd, n_expert),
                                        f"[{width}, n_embd {n_embd}, {count}]")
    layer.ffn_down_exps_scale = expert_tensor(gguf, il, "ffn_down_exps.scale", (n_expert,),
                                              f"the experts' output scales: [{count}]")
    for field, name in (("ffn_post_norm_1", "post_ffw_norm_1.weight"), ("ffn_pre_norm_2", "pre_ffw_norm_2.weight"),
                        ("ffn_post_norm_2", "post_ffw_norm_2.weight")):
        setattr(layer, field, expert_tensor(gguf, il, name, (n_embd,), f"a norm of the expert block: [n_embd {n_embd}]"))
    layer.n_expert = n_expert
    layer.n_expert_used = experts.n_expert_used
    layer.expert_gating = _core.ExpertGating.Softmax
    layer.expert_weights_norm = True
    layer.expert_weights_scale = 1.0
    layer.expert_logit_scale = 1.0 / math.sqrt(n_embd)
    layer.expert_dense_branch = True


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    spec.embed_scale = math.sqrt(spec.n_embd)
    # Without the key llama.cpp caps the final logits at 30, as Gemma 4's configuration does.
    spec.final_softcap = hp.float("final_logit_softcapping", 30.0) or 0.0

    n_layer = hp.int("block_count")
    n_head = _per_layer(hp.get("attention.head_count"), n_layer, "attention.head_count", count=True)
    n_head_kv = _per_layer(hp.get("attention.head_count_kv"), n_layer, "attention.head_count_kv", count=True)
    window = hp.int("attention.sliding_window", 0) or 0
    pattern = _per_layer(hp.get("attention.sliding_window_pattern"), n_layer, "attention.sliding_window_pattern")
    head_dim_full = hp.int("attention.key_length")
    head_dim_v_full = hp.int("attention.value_length", head_dim_full)
    head_dim_swa = hp.int("attention.key_length_swa", head_dim_full)
    head_dim_v_swa = hp.int("attention.value_length_swa", head_dim_swa)
    rope_dim_full = hp.int("rope.dimension_count", head_dim_full)
    rope_dim_swa = hp.int("rope.dimension_count_swa", head_dim_swa)
    # Required: without it llama.cpp rotates by 10,000 and transformers by 1,000,000.
    base_full = hp.float("rope.freq_base")
    base_swa = hp.float("rope.freq_base_swa", 10000.0)
    if hp.get("rope.scaling.type", "none") not in ("none",):
        raise ModelError(f"{gguf.path}: gemma4 rope scaling '{hp.get('rope.scaling.type')}' is not supported")
    # The full-attention layers rotate a part of the head given by rope_freqs (proportional rope);
    # llama.cpp requires the tensor, and without it the whole head would rotate.
    rope_freqs = "rope_freqs.weight" if "rope_freqs.weight" in gguf.tensors else ""
    if not rope_freqs and not all(bool(sliding) for sliding in pattern):
        raise ModelError(f"{gguf.path}: missing tensor 'rope_freqs.weight' (the full-attention layers' rotated "
                         "dimensions)")
    if window <= 0 and any(bool(sliding) for sliding in pattern):
        raise ModelError(f"{gguf.path}: gemma4.attention.sliding_window is "
                         f"{'missing' if hp.get('attention.sliding_window', None) is None else window}: the layers "
                         "gemma4.attention.sliding_window_pattern marks as sliding need a positive window")
    n_shared = hp.int("attention.shared_kv_layers", 0) or 0
    if not 0 <= n_shared < n_layer:
        raise ModelError(f"{gguf.path}: gemma4 attention.shared_kv_layers = {n_shared} for {n_layer} layers")
    first_shared = n_layer - n_shared
    experts = mixture_of_experts(hp, weights_norm=True)

    # Per-layer embeddings.
    per = hp.int("embedding_length_per_layer_input", 0) or 0
    if per:
        for name in ("per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"):
            if name not in gguf.tensors:
                raise ModelError(f"{gguf.path}: missing tensor '{name}'")
        spec.ple_token_embd = "per_layer_token_embd.weight"
        spec.ple_model_proj = "per_layer_model_proj.weight"
        spec.ple_proj_norm = "per_layer_proj_norm.weight"
        spec.n_embd_per_layer = per
        spec.ple_token_scale = math.sqrt(per)
        spec.ple_model_proj_scale = 1.0 / math.sqrt(spec.n_embd)
        spec.ple_combine_scale = 1.0 / math.sqrt(2.0)

    layers, folded = [], []
    for il in range(n_layer):
        sliding = bool(pattern[il])
        shared = il >= first_shared
        geometry = (int(n_head[il]), int(n_head_kv[il]),
                    head_dim_swa if sliding else head_dim_full, head_dim_v_swa if sliding else head_dim_v_full)
        layer = standard_layer(gguf, il, geometry, rope_style=_core.RopeStyle.NeoX,
                               rope_dim=rope_dim_swa if sliding else rope_dim_full,
                               rope_base=base_swa if sliding else base_full,
                               rope_freqs="" if sliding else rope_freqs,
                               activation=_core.Activation.GeluTanh, qk_norm=True, post_norms=True,
                               own_kv=not shared, v_from_k=not sliding)
        layer.sliding_window = window if sliding else 0
        layer.attn_scale = 1.0
        layer.v_norm = True
        if shared:
            sources = [j for j in range(first_shared) if bool(pattern[j]) == sliding]
            if not sources:
                raise ModelError(f"{gguf.path}: shared-KV layer {il} has no earlier layer of its type to read")
            layer.kv_source_layer = sources[-1]
        if experts is not None:
            _experts(gguf, layer, il, spec.n_embd, experts)
        if per:
            layer.ple_gate = block_tensor(gguf, il, "inp_gate.weight")
            layer.ple_proj = block_tensor(gguf, il, "proj.weight")
            layer.ple_post_norm = block_tensor(gguf, il, "post_norm.weight")
        scale_name = block_tensor(gguf, il, "layer_output_scale.weight", required=False)
        if scale_name:
            layer.output_scale = _scalar_tensor(gguf, scale_name)
            folded.append(scale_name)
        layers.append(layer)
    spec.layers = layers
    spec.folded_tensors = folded  # read into output_scale: used, not registered
    return spec
