"""DeepSeek V2 and V3 (GGUF architecture deepseek2: DeepSeek-V2, V2-Lite, V2.5, V3, R1 and the
models built on them), as transformers implements DeepseekV2 and DeepseekV3.

Attention is multi-head latent attention (MLA): the query comes from attn_q, or through the
low-rank path attn_q_a -> RMS norm attn_q_a_norm -> attn_q_b (attention.q_lora_rank); the keys
and values of every head come from one compressed row per token, attn_kv_a_mqa x = [latent
(attention.kv_lora_rank values), rope key (rope.dimension_count values, shared by all heads)],
the latent RMS-normed by attn_kv_a_norm. Each head's key is [W_k_b[h] latent, rope key] and its
value W_v_b[h] latent; the rope part of the query and key is each head's last
rope.dimension_count values, rotated in adjacent pairs (transformers' complex rotation in V2,
and V3's rope_interleave, which computes the same scores). kcap caches only the normed latent and
the rotated rope key (kv_lora_rank + rope_dim values per token and layer) and absorbs the
up-projections into the query and output sides (LayerSpec::kv_lora_rank).

Tensor layouts: llama.cpp's converter writes the up-projections split for that absorption,
attn_k_b [qk_nope, kv_lora_rank, n_head] (transposed) and attn_v_b [kv_lora_rank, v_head_dim,
n_head], with attention.key_length = kv_lora_rank + rope dims, attention.value_length =
kv_lora_rank, attention.key_length_mla = qk_nope + rope dims and attention.value_length_mla =
v_head_dim. Files converted before that change have one attn_kv_b [kv_lora_rank, n_head *
(qk_nope + v_head_dim)] (transformers' kv_b_proj) and key_length = qk_nope + rope dims,
value_length = v_head_dim, no *_mla keys; both load.

YaRN (rope.scaling.type yarn) as transformers computes it for DeepSeek: the frequencies blended
over the rope dims, cos and sin unscaled (transformers' attention_factor is mscale /
mscale_all_dim, 1 for every released DeepSeek config, which sets the two equal; the GGUF keeps
only mscale_all_dim, as rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim), and the
attention's 1/sqrt(qk_head_dim) times mscale^2, mscale = 1 + yarn_log_multiplier * ln(factor).
A file without yarn_log_multiplier scales cos and sin by 0.1 ln(factor) + 1 instead, as
transformers does without mscale_all_dim.

The first leading_dense_block_count blocks have a dense SiLU-gated FFN (feed_forward_length);
the others a mixture of experts (expert_feed_forward_length) plus expert_shared_count shared
experts merged into one FFN (ffn_*_shexp) added without a gate. The router: V2 (expert_gating_func
softmax, or absent as in V2 files before the key) takes a softmax over every expert; V3
(sigmoid) each expert's sigmoid, and chooses on those plus exp_probs_b (its score correction
bias) while weighing by the unbiased scores. Group-limited routing (expert_group_count > 1, the
best expert_group_used_count groups): V2's group_limited_greedy scores a group by its largest
probability, V3 by the sum of its two largest biased scores (llama.cpp uses the V3 rule for both).
The chosen weights are renormalized where expert_weights_norm is set, and multiplied by
expert_weights_scale (routed_scaling_factor).

The latent norms use attention.layer_norm_rms_epsilon (as llama.cpp; transformers gives them
its RMSNorm's default 1e-6, which every released DeepSeek config also has as rms_norm_eps).
"""
from __future__ import annotations

import math

from kcap import _core
from kcap.arch.common import (MOE_KEYS, SHARED_EXPERT_KEYS, SPEC_KEYS, ROPE_KEYS, YARN_KEYS, Experts,
                              Hyperparameters, block_tensor, expert_tensor, moe_ffn, new_spec, rope_scaling, rope_yarn)
from kcap.errors import MissingMetadataError, ModelError, UnimplementedMetadataError
from kcap.gguf import GGUFFile

ARCHITECTURE = "deepseek2"
METADATA_KEYS = (*SPEC_KEYS, *ROPE_KEYS, *YARN_KEYS, *MOE_KEYS, *SHARED_EXPERT_KEYS,
                 "attention.head_count", "attention.head_count_kv", "attention.key_length",
                 "attention.value_length", "attention.key_length_mla", "attention.value_length_mla",
                 "attention.q_lora_rank", "attention.kv_lora_rank", "attention.layer_norm_rms_epsilon",
                 "rope.scaling.yarn_log_multiplier", "feed_forward_length", "leading_dense_block_count",
                 "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "expert_group_count",
                 "expert_group_used_count")
KNOWN_UNUSED_TENSORS: dict[str, str] = {}
# <arch>.expert_gating_func as gguf-py writes it (ExpertGatingFuncType).
GATING = {1: _core.ExpertGating.Softmax, 2: _core.ExpertGating.Sigmoid}


def build(gguf: GGUFFile) -> _core.ModelSpec:
    hp = Hyperparameters(gguf, ARCHITECTURE, METADATA_KEYS)
    path = gguf.path
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    n_layer = hp.int("block_count")
    n_head = hp.int("attention.head_count")
    rope_dim = hp.int("rope.dimension_count")
    kv_lora_rank = hp.int("attention.kv_lora_rank")
    if kv_lora_rank < 1:
        raise ModelError(f"{path}: {ARCHITECTURE}.attention.kv_lora_rank = {kv_lora_rank}: must be at least 1")
    head_dim, head_dim_v = _head_dims(hp, kv_lora_rank, rope_dim)
    if rope_dim < 2 or rope_dim % 2 or rope_dim >= head_dim:
        raise ModelError(f"{path}: {ARCHITECTURE}.rope.dimension_count = {rope_dim}: must be even and smaller than "
                         f"the query head ({head_dim})")
    q_lora_rank = hp.int("attention.q_lora_rank", 0) or 0
    n_dense = hp.int("leading_dense_block_count", 0) or 0
    if not 0 <= n_dense <= n_layer:
        raise ModelError(f"{path}: {ARCHITECTURE}.leading_dense_block_count = {n_dense}: must be 0 .. block_count "
                         f"({n_layer})")
    experts = _experts(hp) if n_dense < n_layer else None

    rope_scaling(hp, gguf, allowed=("none", "yarn"))
    yarn = rope_yarn(hp, gguf) if hp.get("rope.scaling.type", "none") == "yarn" else None
    attn_scale = 1.0 / math.sqrt(head_dim)
    if yarn is not None:
        if hp.get("rope.scaling.yarn_attn_factor", None) is not None:
            raise UnimplementedMetadataError(
                f"{path}: {ARCHITECTURE}.rope.scaling.yarn_attn_factor: kcap implements DeepSeek's YaRN with the "
                "attention factor of its configs (mscale equal to mscale_all_dim), not a given one")
        log_mul = hp.float("rope.scaling.yarn_log_multiplier", None)
        if log_mul is not None:
            yarn.attn_factor = 1.0
            if yarn.factor > 1.0:
                mscale = 1.0 + log_mul * math.log(yarn.factor)
                attn_scale *= mscale * mscale
    elif (hp.float("rope.scaling.yarn_log_multiplier", 0.0) or 0.0) != 0.0:
        raise ModelError(f"{path}: {ARCHITECTURE}.rope.scaling.yarn_log_multiplier without YaRN rope scaling")

    layers = []
    for il in range(n_layer):
        t = lambda name, required=True: block_tensor(gguf, il, name, required)  # noqa: E731
        layer = _core.LayerSpec()
        layer.n_head, layer.n_head_kv = n_head, 1
        layer.head_dim, layer.head_dim_v = head_dim, head_dim_v
        layer.kv_lora_rank = kv_lora_rank
        layer.rope_style = _core.RopeStyle.Normal
        layer.rope_dim = rope_dim
        layer.rope_base = hp.float("rope.freq_base", 10000.0)
        if yarn is not None:
            layer.rope_yarn = yarn
        layer.attn_scale = attn_scale
        layer.attn_norm = t("attn_norm.weight")
        if q_lora_rank:
            layer.wq_a = _matrix(gguf, il, "attn_q_a.weight", spec.n_embd, q_lora_rank, "q_lora_rank")
            layer.q_a_norm = expert_tensor(gguf, il, "attn_q_a_norm.weight", (q_lora_rank,),
                                           f"[{ARCHITECTURE}.attention.q_lora_rank = {q_lora_rank}]")
            layer.wq_b = _matrix(gguf, il, "attn_q_b.weight", q_lora_rank, n_head * head_dim, "n_head * head_dim")
        else:
            layer.wq = _matrix(gguf, il, "attn_q.weight", spec.n_embd, n_head * head_dim, "n_head * head_dim")
        layer.wkv_a = _matrix(gguf, il, "attn_kv_a_mqa.weight", spec.n_embd, kv_lora_rank + rope_dim,
                              "kv_lora_rank + rope dims")
        layer.kv_a_norm = expert_tensor(gguf, il, "attn_kv_a_norm.weight", (kv_lora_rank,),
                                        f"[{ARCHITECTURE}.attention.kv_lora_rank = {kv_lora_rank}]")
        nope = head_dim - rope_dim
        # The file's KV head count follows its layout (kcap reads the layout from the tensors): n_head
        # with the joint attn_kv_b, 1 with the split attn_k_b / attn_v_b (the latent is one shared head).
        joint = f"blk.{il}.attn_kv_b.weight" in gguf.tensors
        if joint and (t("attn_k_b.weight", False) or t("attn_v_b.weight", False)):
            raise ModelError(f"{path}: block {il} has both attn_kv_b and attn_k_b/attn_v_b")
        n_head_kv = hp.int("attention.head_count_kv", None)
        if n_head_kv is not None and n_head_kv != (n_head if joint else 1):
            raise ModelError(f"{path}: {ARCHITECTURE}.attention.head_count_kv = {n_head_kv}; a file with "
                             f"{'attn_kv_b' if joint else 'attn_k_b / attn_v_b'} has "
                             f"{n_head if joint else 1} (n_head {n_head})")
        if joint:
            layer.wkv_b = _matrix(gguf, il, "attn_kv_b.weight", kv_lora_rank, n_head * (nope + head_dim_v),
                                  "n_head * (qk_nope + v_head_dim)")
        else:
            layer.wk_b = expert_tensor(gguf, il, "attn_k_b.weight", (nope, kv_lora_rank, n_head),
                                       f"[qk_nope {nope}, kv_lora_rank {kv_lora_rank}, n_head {n_head}]")
            layer.wv_b = expert_tensor(gguf, il, "attn_v_b.weight", (kv_lora_rank, head_dim_v, n_head),
                                       f"[kv_lora_rank {kv_lora_rank}, v_head_dim {head_dim_v}, n_head {n_head}]")
        layer.wo = t("attn_output.weight")
        layer.ffn_norm = t("ffn_norm.weight")
        layer.activation = _core.Activation.SiLU
        layer.gated_ffn = True
        if il < n_dense:
            layer.ffn_gate, layer.ffn_up, layer.ffn_down = (t("ffn_gate.weight"), t("ffn_up.weight"),
                                                            t("ffn_down.weight"))
        else:
            _moe_layer(gguf, hp, layer, il, spec.n_embd, experts)
        layers.append(layer)
    spec.layers = layers
    return spec


def _head_dims(hp: Hyperparameters, kv_lora_rank: int, rope_dim: int) -> tuple[int, int]:
    """(qk head dim, v head dim): from the *_mla keys where the file has them (key_length and
    value_length then describe the absorbed form), else from key_length and value_length."""
    path = hp.gguf.path
    key_mla = hp.int("attention.key_length_mla", None)
    value_mla = hp.int("attention.value_length_mla", None)
    if (key_mla is None) != (value_mla is None):
        raise MissingMetadataError(f"{path}: {ARCHITECTURE}.attention.key_length_mla and value_length_mla come "
                                   "together; the file has one of them")
    if key_mla is not None:
        key, value = hp.int("attention.key_length", None), hp.int("attention.value_length", None)
        if key is not None and key != kv_lora_rank + rope_dim:
            raise ModelError(f"{path}: {ARCHITECTURE}.attention.key_length = {key}, expected kv_lora_rank + rope "
                             f"dims = {kv_lora_rank + rope_dim} beside key_length_mla")
        if value is not None and value != kv_lora_rank:
            raise ModelError(f"{path}: {ARCHITECTURE}.attention.value_length = {value}, expected kv_lora_rank = "
                             f"{kv_lora_rank} beside value_length_mla")
        return key_mla, value_mla
    return hp.int("attention.key_length"), hp.int("attention.value_length")


def _matrix(gguf: GGUFFile, il: int, name: str, k: int, n: int, what: str) -> str:
    return expert_tensor(gguf, il, name, (k, n), f"[{k}, {n}] ({what})")


def _experts(hp: Hyperparameters) -> Experts:
    """The routed experts' counts (required: some block is a mixture of experts)."""
    path = hp.gguf.path
    n_expert = hp.int("expert_count", None)
    used = hp.int("expert_used_count", None)
    for key, value in (("expert_count", n_expert), ("expert_used_count", used)):
        if value is None:
            raise MissingMetadataError(f"{path}: missing metadata key '{ARCHITECTURE}.{key}' (blocks past "
                                       f"leading_dense_block_count are mixtures of experts)")
    if n_expert < 1 or not 0 < used <= n_expert:
        raise ModelError(f"{path}: {ARCHITECTURE}.expert_used_count = {used} must be between 1 and "
                         f"{ARCHITECTURE}.expert_count = {n_expert}")
    norm = hp.get("expert_weights_norm", False)
    if not isinstance(norm, bool):
        raise ModelError(f"{path}: {ARCHITECTURE}.expert_weights_norm = {norm!r}: expected a bool")
    n_shared = hp.int("expert_shared_count", 0) or 0
    if n_shared < 0:
        raise ModelError(f"{path}: {ARCHITECTURE}.expert_shared_count = {n_shared} is negative")
    return Experts(n_expert, used, norm, hp.int("expert_feed_forward_length", None), n_shared > 0, None)


def _moe_layer(gguf: GGUFFile, hp: Hyperparameters, layer, il: int, n_embd: int, experts: Experts) -> None:
    path = gguf.path
    moe_ffn(gguf, layer, il, n_embd, experts, ARCHITECTURE, shared_gate=False)
    # The shared experts are one FFN of expert_shared_count x the experts' width.
    n_shared = hp.int("expert_shared_count", 0) or 0
    if n_shared:
        width = gguf.tensors[layer.ffn_up_shexp].shape[1]
        n_ff = gguf.tensors[layer.ffn_gate_exps].shape[1]
        if width != n_shared * n_ff:
            raise ModelError(f"{path}: tensor 'blk.{il}.ffn_up_shexp.weight' has width {width}, expected "
                             f"{ARCHITECTURE}.expert_shared_count {n_shared} x the experts' width {n_ff}")
    gating = hp.int("expert_gating_func", 1)
    if gating not in GATING:
        raise UnimplementedMetadataError(f"{path}: {ARCHITECTURE}.expert_gating_func = {gating} (kcap implements "
                                         "softmax, 1, and sigmoid, 2)")
    layer.expert_gating = GATING[gating]
    scale = hp.float("expert_weights_scale", 1.0)
    if not scale > 0:
        raise ModelError(f"{path}: {ARCHITECTURE}.expert_weights_scale = {scale}: must be positive")
    layer.expert_weights_scale = scale
    groups = hp.int("expert_group_count", 1) or 1
    groups_used = hp.int("expert_group_used_count", groups) or groups
    if groups > 1:
        if experts.n_expert % groups or not 1 <= groups_used <= groups:
            raise ModelError(f"{path}: {ARCHITECTURE}.expert_group_count = {groups} must divide expert_count = "
                             f"{experts.n_expert}, and expert_group_used_count = {groups_used} be 1 .. {groups}")
        layer.expert_group_count = groups
        layer.expert_group_used = groups_used
        layer.expert_group_score = (_core.ExpertGroupScore.TopTwoSum if layer.expert_gating == _core.ExpertGating.Sigmoid
                                    else _core.ExpertGroupScore.Max)
    bias = f"blk.{il}.exp_probs_b.bias"
    if bias in gguf.tensors:
        if layer.expert_gating != _core.ExpertGating.Sigmoid:
            raise ModelError(f"{path}: tensor '{bias}' (a score correction bias) needs sigmoid gating "
                             f"({ARCHITECTURE}.expert_gating_func = 2)")
        layer.ffn_exp_probs_b = expert_tensor(gguf, il, "exp_probs_b.bias", (experts.n_expert,),
                                              f"[{ARCHITECTURE}.expert_count = {experts.n_expert}]")
