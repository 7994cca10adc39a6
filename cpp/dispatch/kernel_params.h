// The one place a routed Stage becomes the plain parameter structs the shared kernel bodies
// read (kernels/params.h). Every GPU backend's launchers (cuda/*.cu, metal/*.mm) and the host
// tests of the bodies call these, so a stage means the same thing to each of them; what stays
// per backend is only geometry and binding.
#pragma once

#include "dispatch/stage.h"
#include "kcap/formats.h"
#include "kernels/params.h"

namespace kcap {

// The stage's K x N matmul of n_tokens rows with the weights of operand `weight`.
inline KcapMatmulParams matmul_params_of(const Stage& stage, size_t weight, int n_tokens, bool has_bias) {
    KcapMatmulParams p;
    p.k = int(stage.k);
    p.n = int(stage.n);
    p.m = n_tokens;
    p.row_bytes = unsigned(row_bytes(stage.operands[weight]->format, stage.k));
    p.has_bias = has_bias;
    return p;
}

// y = W x (+ bias): the bias is operand 1 of a MatMul stage (a gate_up stage's operand 1 is
// its up matrix, never a bias).
inline KcapMatmulParams matmul_params(const Stage& stage, int n_tokens) {
    return matmul_params_of(stage, 0, n_tokens,
                            stage.op == Op::MatMul && stage.operands.size() > 1 && stage.operands[1] != nullptr);
}

// Table rows (operand 0) times the embedding scale, plus learned positions (operand 1) if any.
inline KcapEmbedParams embed_params(const Stage& stage, int n_tokens) {
    KcapEmbedParams p;
    p.n_tokens = n_tokens;
    p.width = int(stage.n);
    p.row_bytes = unsigned(row_bytes(stage.operands[0]->format, stage.n));
    p.scale = stage.params.scale;
    const TensorRef* positions = stage.operands.size() > 1 ? stage.operands[1] : nullptr;
    p.positions = positions ? (positions->format == Format::F16 ? 2 : 1) : 0;
    return p;
}

inline const TensorRef* stage_operand(const Stage& stage, size_t i) {
    return i < stage.operands.size() ? stage.operands[i] : nullptr;
}

// A qkv stage's matrices, operands 0..2: Q, K and V, or a latent attention's pair (two). The
// biases of Q, K and V, where their matmuls had any (kBias), are operands 3..5, null where absent.
inline int qkv_matrices(const Stage& stage) { return stage.operands.size() == 2 ? 2 : 3; }
inline const TensorRef* qkv_bias(const Stage& stage, int which) { return stage_operand(stage, size_t(3 + which)); }

// RMS or Layer norm of stage.groups groups of stage.k per token; operands (weight, bias).
inline KcapNormParams norm_params(const Stage& stage, int n_tokens) {
    KcapNormParams p;
    p.width = int(stage.k);
    p.rows = int(n_tokens * stage.groups);
    p.eps = stage.params.eps;
    p.layer_norm = (stage.features & kLayerNorm) != 0;
    p.has_weight = stage_operand(stage, 0) != nullptr;
    p.has_bias = stage_operand(stage, 1) != nullptr;
    return p;
}

// add_norm: operands (post weight, post bias, weight, bias).
inline KcapAddNormParams add_norm_params(const Stage& stage) {
    KcapAddNormParams p;
    p.width = int(stage.n);
    p.eps = stage.params.eps;
    p.scale = stage.params.scale;
    p.layer_norm = (stage.features & kLayerNorm) != 0;
    p.has_post = (stage.features & kPostNorm) != 0;
    p.has_post_weight = stage_operand(stage, 0) != nullptr;
    p.has_post_bias = stage_operand(stage, 1) != nullptr;
    p.has_weight = stage_operand(stage, 2) != nullptr;
    p.has_bias = stage_operand(stage, 3) != nullptr;
    return p;
}

// Rope (and qk_norm_rope) of Q and, when the call has a K buffer, K: a shared-KV layer has
// none (its source layer rotated the keys it reads).
inline KcapRopeParams rope_params(const Stage& stage, int n_tokens, bool has_k) {
    KcapRopeParams p;
    p.n_tokens = n_tokens;
    p.n_head = stage.params.n_head;
    p.n_head_kv = has_k ? stage.params.n_head_kv : 0;
    p.head_dim = stage.params.head_dim;
    p.rope_dim = stage.params.rope_dim;
    p.neox = (stage.features & kRopeNeox) != 0;
    return p;
}

// Attention over a cache of kv_format; n_splits and min_chunk are the backend's decode split
// geometry. A shared-KV layer (params.kv_layer >= 0) appends nothing.
inline KcapAttentionParams attention_params(const Stage& stage, int n_tokens, Format kv_format, int n_splits,
                                            int min_chunk) {
    const StageParams& s = stage.params;
    KcapAttentionParams p;
    p.n_tokens = n_tokens;
    p.n_head = s.n_head;
    p.n_head_kv = s.n_head_kv;
    p.head_dim = s.head_dim;
    p.head_dim_v = s.head_dim_v;
    p.k_width = s.n_head_kv * s.head_dim;
    p.v_width = s.n_head_kv * s.head_dim_v;
    p.window = s.sliding_window;
    p.scale = s.scale;
    p.softcap = s.softcap;
    p.kv_f16 = kv_format == Format::F16;
    p.n_splits = n_splits;
    p.min_chunk = min_chunk;
    p.append = s.kv_layer >= 0 ? 0 : 1;
    p.rope = (stage.features & kRopeNeox) ? 2 : (stage.features & kRopeNormal) ? 1 : 0;
    p.qk_norm = p.rope && (stage.features & kRmsNorm) ? 1 : 0;
    p.qk_norm_eps = s.eps;
    p.head_blocks = 1;  // the backend's decode may spread a KV head's query heads over more groups
    return p;
}

// add / softcap / scale over n_tokens rows of stage.n values.
inline KcapElementwiseParams elementwise_params(const Stage& stage, int n_tokens) {
    KcapElementwiseParams p;
    p.count = int(int64_t(n_tokens) * stage.n);
    p.activation = 0;
    p.gated = 0;
    p.cap = stage.params.softcap;
    p.scale = stage.params.scale;
    return p;
}

// act(x), or act(gate) * up when gated, over n_tokens rows of stage.n values.
inline KcapElementwiseParams activation_params(const Stage& stage, int n_tokens, bool gated) {
    KcapElementwiseParams p;
    p.count = int(int64_t(n_tokens) * stage.n);
    p.activation = int(stage.params.activation);
    p.gated = gated;
    p.cap = 0.0f;
    p.scale = 1.0f;
    return p;
}

// Per-layer embeddings: the projection is a matmul of operand 1 (no bias) over the stage's K.
inline KcapMatmulParams ple_projection_params(const Stage& stage, int n_tokens) {
    return matmul_params_of(stage, 1, n_tokens, false);
}

inline KcapPleParams ple_params(const Stage& stage, int n_tokens) {
    KcapPleParams p;
    p.n_tokens = n_tokens;
    p.width = int(stage.n);
    p.per = int(stage.n / stage.groups);
    p.table_row_bytes = unsigned(row_bytes(stage.operands[0]->format, stage.n));
    p.eps = stage.params.eps;
    p.proj_scale = stage.params.ple_model_proj_scale;
    p.token_scale = stage.params.ple_token_scale;
    p.combine_scale = stage.params.ple_combine_scale;
    return p;
}

// Per-layer gate: this layer's slice (groups = layer index) of rows stage.k wide.
inline KcapPleGateParams ple_gate_params(const Stage& stage, int n_tokens) {
    KcapPleGateParams p;
    p.n_tokens = n_tokens;
    p.per = int(stage.n);
    p.stride = int(stage.k);
    p.offset = int(stage.groups * stage.n);
    p.activation = int(stage.params.activation);
    return p;
}

// A mixture-of-experts stage (moe_route, moe_experts) over n_tokens tokens: its widths, expert
// counts, and the gating features as flags the router and expert bodies read.
inline KcapMoeParams moe_params(const Stage& stage, int n_tokens) {
    KcapMoeParams p{};
    p.n_tokens = n_tokens;
    p.k = int(stage.k);
    p.ff = int(stage.k2);
    p.n = int(stage.n);
    p.n_expert = stage.params.n_expert;
    p.n_used = stage.params.n_expert_used;
    p.renormalize = (stage.features & kExpertWeightsNorm) != 0;
    p.scale = stage.params.expert_weights_scale;
    p.router_row_bytes = stage.op == Op::MoeRoute ? unsigned(row_bytes(stage.operands[0]->format, stage.k)) : 0u;
    p.logit_scale = (stage.features & kExpertLogitScale) ? stage.params.expert_logit_scale : 1.0f;
    p.expert_scaled = (stage.features & kPerExpertScale) != 0;
    p.gate_up_merged = (stage.features & kExpertGateUpMerged) != 0;
    p.swiglu_alpha = stage.params.swiglu_alpha;
    p.swiglu_limit = stage.params.swiglu_limit;
    p.sigmoid = (stage.features & kExpertSigmoid) != 0;
    p.n_groups = (stage.features & kExpertGroups) ? stage.params.n_expert_groups : 0;
    p.n_groups_used = stage.params.n_expert_groups_used;
    p.group_top2 = stage.params.expert_group_score == ExpertGroupScore::TopTwoSum;
    return p;
}

inline KcapMlaParams mla_params(const Stage& stage, int n_tokens, Format kv_format) {
    const StageParams& s = stage.params;
    KcapMlaParams p{};
    p.n_tokens = n_tokens;
    p.n_head = s.n_head;
    p.lora = s.kv_lora_rank;
    p.rope = s.rope_dim;
    p.nope = s.head_dim - s.rope_dim;
    p.dv = s.head_dim_v;
    p.width = p.lora + p.rope;
    p.scale = s.scale;
    p.eps = s.eps;
    p.kv_f16 = kv_format == Format::F16;
    p.combined = (stage.features & kMlaKvBCombined) != 0;
    const TensorRef& kb = *stage.operands[1];
    const TensorRef& vb = p.combined ? kb : *stage.operands[2];
    p.kb_row_bytes = unsigned(row_bytes(kb.format, kb.row_length()));
    p.vb_row_bytes = unsigned(row_bytes(vb.format, vb.row_length()));
    return p;
}

}  // namespace kcap
