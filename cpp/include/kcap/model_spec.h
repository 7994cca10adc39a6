// ModelSpec: the pure-data description of a model that the planner routes and a backend runs.
//
// Python's arch/<family>.py fills it from GGUF metadata; nothing in the core tests a family
// name. Every architectural difference is a field here (norm kind, QK-norm, post-norms,
// rope style and base per layer, sliding window, softcaps, biases, activation), and every
// field that changes the math becomes a feature the chosen capability row must support.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kcap/formats.h"

namespace kcap {

// A weight tensor as GGUF stores it: raw blocks, never copied or dequantized ahead of time.
// shape is in GGUF order: shape[0] is the row length (the inner/K dimension of a matmul).
struct TensorRef {
    std::string name;
    Format format = Format::F32;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;
    size_t nbytes = 0;

    int64_t row_length() const { return shape.empty() ? 0 : shape[0]; }
    int64_t n_rows() const {
        int64_t rows = 1;
        for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
        return rows;
    }
    const uint8_t* row(int64_t index) const;
};

// Enumerations, each value with its name (explain, the bundle's JSON): one list per enum.
#define KCAP_NORM_KINDS(X) X(RMS, "rms") X(Layer, "layer")
// How a mixture-of-experts router turns its logits into the chosen experts' weights.
// Softmax: a softmax over every expert's logit, then the top n_expert_used (Mixtral, Qwen2/3-MoE,
// DeepSeek V2). Sigmoid: each expert's own sigmoid of its logit (DeepSeek V3).
#define KCAP_EXPERT_GATINGS(X) X(Softmax, "softmax") X(Sigmoid, "sigmoid")
// How group-limited routing scores a group of experts (expert_group_count > 1): Max, the largest
// score in it (DeepSeek V2's group_limited_greedy); TopTwoSum, the sum of its two largest scores
// (DeepSeek V3).
#define KCAP_EXPERT_GROUP_SCORES(X) X(Max, "max") X(TopTwoSum, "top2_sum")
// SwigluOai: gpt-oss's clamped SwiGLU of a gated FFN, (clamp(up, -L, L) + 1) * g * sigmoid(a * g)
// with g = min(gate, L) (L: swiglu_limit, a: swiglu_alpha); gated FFNs only.
#define KCAP_ACTIVATIONS(X) \
    X(SiLU, "silu") X(GeluTanh, "gelu_tanh") X(GeluErf, "gelu_erf") X(ReLU, "relu") X(SwigluOai, "swiglu_oai")
// Normal: rotate adjacent pairs (x[2i], x[2i+1]), as GGUF stores Llama's permuted Q/K.
// NeoX: rotate halves (x[i], x[i + rope_dim/2]), as Gemma, Qwen and GPT-NeoX do.
#define KCAP_ROPE_STYLES(X) X(None, "none") X(Normal, "normal") X(NeoX, "neox")

#define KCAP_ENUM_VALUE(VALUE, NAME) VALUE,
enum class NormKind { KCAP_NORM_KINDS(KCAP_ENUM_VALUE) };
enum class ExpertGating { KCAP_EXPERT_GATINGS(KCAP_ENUM_VALUE) };
enum class ExpertGroupScore { KCAP_EXPERT_GROUP_SCORES(KCAP_ENUM_VALUE) };
enum class Activation { KCAP_ACTIVATIONS(KCAP_ENUM_VALUE) };
enum class RopeStyle { KCAP_ROPE_STYLES(KCAP_ENUM_VALUE) };
#undef KCAP_ENUM_VALUE

const char* norm_kind_name(NormKind kind);
const char* activation_name(Activation activation);
const char* rope_style_name(RopeStyle style);
const char* expert_gating_name(ExpertGating gating);
const char* expert_group_score_name(ExpertGroupScore score);

// The tensor fields of a decoder block, one list: the struct's members, the Python binding and
// the list kcap.model accounts the file's tensors against (kcap._core.LAYER_TENSOR_FIELDS) come
// from it.
#define KCAP_LAYER_TENSOR_FIELDS(X)                                                                \
    X(attn_norm) X(attn_norm_bias) X(wq) X(wk) X(wv) X(bq) X(bk) X(bv)                             \
    /* per-head norms of Q and K (QK-norm) */                                                      \
    X(q_norm) X(k_norm) X(wo) X(bo)                                                                \
    /* multi-head latent attention (kv_lora_rank > 0): the query's low-rank path (wq_a             \
       [n_embd, q_lora_rank], its RMS norm q_a_norm, wq_b [q_lora_rank, n_head * head_dim]; or wq), \
       the compressed KV projection wkv_a [n_embd, kv_lora_rank + rope_dim] and the latent's RMS   \
       norm kv_a_norm [kv_lora_rank], and the up-projections of the latent: wk_b [head_dim -       \
       rope_dim, kv_lora_rank, n_head] (each head's K up-projection, transposed) and wv_b          \
       [kv_lora_rank, head_dim_v, n_head], or both in one wkv_b [kv_lora_rank, n_head *            \
       (head_dim - rope_dim + head_dim_v)] (head h's K rows, then its V rows) */                   \
    X(wq_a) X(q_a_norm) X(wq_b) X(wkv_a) X(kv_a_norm) X(wk_b) X(wv_b) X(wkv_b)                     \
    /* norm of the attention output before the residual add */                                     \
    X(post_attn_norm) X(ffn_norm) X(ffn_norm_bias)                                                 \
    /* attention sinks: a learned logit per query head in the softmax's denominator [n_head] */    \
    X(attn_sinks)                                                                                  \
    X(ffn_gate) X(ffn_up) X(ffn_down) X(ffn_up_bias) X(ffn_down_bias)                              \
    /* norm of the FFN output before the residual add */                                           \
    X(post_ffn_norm)                                                                               \
    /* optional per-frequency divisors (Llama 3 rope scaling) */                                   \
    X(rope_freqs)                                                                                  \
    X(ple_gate) X(ple_proj) X(ple_post_norm)                                                       \
    /* mixture of experts: the router [n_embd, n_expert], the experts' stacked matrices            \
       ([n_embd, n_ff_exp, n_expert] gate and up, [n_ff_exp, n_embd, n_expert] down), a shared      \
       expert and its sigmoid gate [n_embd] */                                                     \
    X(ffn_gate_inp) X(ffn_gate_exps) X(ffn_up_exps) X(ffn_down_exps)                               \
    /* biases of the router [n_expert] and of the experts ([n_ff_exp, n_expert] gate and up,        \
       [n_embd, n_expert] down) (gpt-oss) */                                                       \
    X(ffn_gate_inp_bias) X(ffn_gate_exps_bias) X(ffn_up_exps_bias) X(ffn_down_exps_bias)           \
    /* a bias [n_expert] added to the router's scores for the choice of experts only, not to      \
       their weights (DeepSeek V3's e_score_correction_bias) */                                    \
    X(ffn_exp_probs_b)                                                                             \
    X(ffn_gate_shexp) X(ffn_up_shexp) X(ffn_down_shexp) X(ffn_gate_inp_shexp)                      \
    /* Gemma 4 experts: gate and up in one tensor [n_embd, 2 * n_ff_exp, n_expert] (each           \
       expert's gate rows, then its up rows), the router's input norm weight [n_embd], a scale     \
       per expert [n_expert], and the norms of the dense and expert branches [n_embd] */           \
    X(ffn_gate_up_exps) X(ffn_gate_inp_scale) X(ffn_down_exps_scale)                               \
    X(ffn_post_norm_1) X(ffn_pre_norm_2) X(ffn_post_norm_2)

// The tensor fields of the whole model.
#define KCAP_MODEL_TENSOR_FIELDS(X)                                                                \
    X(token_embd) X(position_embd) X(output_norm) X(output_norm_bias) X(output)                    \
    X(ple_token_embd) X(ple_model_proj) X(ple_proj_norm)

// YaRN rope scaling, as transformers computes it (_compute_yarn_parameters): pair i of the
// rotary dims keeps its frequency below the correction dim of beta_fast rotations in
// original_context positions, takes it divided by factor above that of beta_slow, and blends the
// two linearly between (the bounds floored and ceiled unless truncate is false); cos and sin are multiplied by
// attn_factor (transformers: 0.1 ln(factor) + 1 unless the model gives its own).
#define KCAP_ROPE_YARN_FIELDS(X)                                                                   \
    /* 0: no YaRN */                                                                               \
    X(float, factor, 0.0f)                                                                         \
    X(int, original_context, 0)                                                                    \
    X(float, beta_fast, 32.0f)                                                                     \
    X(float, beta_slow, 1.0f)                                                                      \
    X(float, attn_factor, 1.0f)                                                                    \
    /* the blend's bounds floored and ceiled (transformers' default); false keeps them fractional \
       (gpt-oss) */                                                                                \
    X(bool, truncate, true)

// A scalar field: its type, name and default.
#define KCAP_DECLARE_FIELD(TYPE, NAME, DEFAULT) TYPE NAME = DEFAULT;

struct RopeYarn {
    KCAP_ROPE_YARN_FIELDS(KCAP_DECLARE_FIELD)
};

// The scalar fields of a decoder block, one list (the struct, the Python binding and the bundle's
// JSON come from it).
#define KCAP_LAYER_SCALAR_FIELDS(X)                                                                \
    X(int, n_head, 0)                                                                              \
    X(int, n_head_kv, 0)                                                                           \
    /* of Q and K */                                                                               \
    X(int, head_dim, 0)                                                                            \
    /* of V */                                                                                     \
    X(int, head_dim_v, 0)                                                                          \
    X(RopeStyle, rope_style, RopeStyle::None)                                                      \
    /* leading dims of each head that rotate (partial rotary when < head_dim) */                   \
    X(int, rope_dim, 0)                                                                            \
    X(float, rope_base, 10000.0f)                                                                  \
    /* linear rope scaling: positions are multiplied by this */                                    \
    X(float, rope_freq_scale, 1.0f)                                                                \
    /* YaRN rope scaling (none unless rope_yarn.factor > 0) */                                     \
    X(RopeYarn, rope_yarn, RopeYarn())                                                             \
    /* 0: global attention; else a query at p sees keys p-window < k <= p */                       \
    X(int, sliding_window, 0)                                                                      \
    /* multiplies q.k; 0 means 1/sqrt(head_dim) */                                                 \
    X(float, attn_scale, 0.0f)                                                                     \
    /* softcap * tanh(score / softcap) when > 0 */                                                 \
    X(float, attn_softcap, 0.0f)                                                                   \
    X(Activation, activation, Activation::SiLU)                                                    \
    /* the clamped SwiGLU's parameters (activation swiglu_oai) */                                  \
    X(float, swiglu_alpha, 1.702f)                                                                 \
    X(float, swiglu_limit, 7.0f)                                                                   \
    /* act(gate(x)) * up(x) when true, act(up(x)) otherwise */                                     \
    X(bool, gated_ffn, true)                                                                       \
    /* parameter-free RMS norm of each V head (Gemma 4) */                                         \
    X(bool, v_norm, false)                                                                         \
    /* attention and FFN outputs are scaled before the residual add (Granite) */                   \
    X(float, residual_scale, 1.0f)                                                                 \
    /* Per-layer embedding input (Gemma 4 PLE), after the FFN residual (ple_gate, ple_proj,        \
       ple_post_norm): x += ple_post_norm(ple_proj(act(ple_gate(x)) * ple[layer])) with this       \
       layer's activation. output_scale: the block's output (the residual stream) is multiplied    \
       by this */                                                                                  \
    X(float, output_scale, 1.0f)                                                                   \
    /* KV sharing: >= 0 names an earlier layer whose K/V cache this layer's queries attend to;     \
       the layer then has no K/V projections of its own (Gemma 4 shared-KV layers) */              \
    X(int, kv_source_layer, -1)                                                                    \
    /* Multi-head latent attention (DeepSeek V2/V3) when > 0: the layer caches, per token, the     \
       RMS-normed latent c = kv_a_norm(wkv_a x)[:kv_lora_rank] and the rotated rope key k_r (its   \
       last rope_dim values, one for every head), kv_lora_rank + rope_dim values. Head h's query   \
       (head_dim = nope + rope_dim values: q_n, then q_r, rotated) scores a key by                 \
       q_n . (W_kb[h] c) + q_r . k_r = (W_kb[h]^T q_n) . c + q_r . k_r, and its output is         \
       W_vb[h] (sum_j p_j c_j) (head_dim_v values): the up-projections absorbed into the query   \
       and output sides, so the cache never holds expanded keys or values. The rope part of each \
       head is its last rope_dim values. */                                                        \
    X(int, kv_lora_rank, 0)                                                                        \
    /* Mixture of experts (n_expert > 0: ffn_gate_inp and the *_exps tensors replace the dense     \
       FFN). Per token, the router's logits W_inp . x are gated (expert_gating) and the            \
       n_expert_used largest chosen; their weights, renormalized to sum 1 when                     \
       expert_weights_norm, times expert_weights_scale, weigh the chosen experts' gated FFNs       \
       (this layer's activation): ffn(x) = sum_k w_k down_e(act(gate_e x) * up_e x). A shared      \
       expert (ffn_*_shexp) adds its FFN, times sigmoid(ffn_gate_inp_shexp . x) where that gate    \
       exists. */                                                                                  \
    X(int, n_expert, 0)                                                                            \
    X(int, n_expert_used, 0)                                                                       \
    X(ExpertGating, expert_gating, ExpertGating::Softmax)                                          \
    X(bool, expert_weights_norm, false)                                                            \
    /* group-limited routing (expert_group_count > 1): the experts split into this many equal      \
       groups, each scored (expert_group_score) from its experts' choice scores, and only the      \
       expert_group_used best groups' experts may be chosen */                                     \
    X(int, expert_group_count, 0)                                                                  \
    X(int, expert_group_used, 0)                                                                   \
    X(ExpertGroupScore, expert_group_score, ExpertGroupScore::Max)                                 \
    X(float, expert_weights_scale, 1.0f)                                                           \
    /* Gemma 4's variant. ffn_gate_up_exps (instead of ffn_gate_exps and ffn_up_exps): expert e's  \
       gate is rows [2e * n_ff_exp, (2e + 1) * n_ff_exp) of it, its up the next n_ff_exp rows.     \
       ffn_gate_inp_scale: the router reads its own RMS norm of the residual stream (weight        \
       ffn_gate_inp_scale) instead of the FFN's normed input, and its logits are multiplied by     \
       expert_logit_scale before the softmax. ffn_down_exps_scale: each chosen expert's weight     \
       (after the renormalization) is multiplied by its entry. expert_dense_branch: the dense FFN  \
       (ffn_gate/up/down on ffn_norm's output) runs beside the experts, which read                 \
       ffn_pre_norm_2's norm of the residual; each branch's output is normed (ffn_post_norm_1,     \
       ffn_post_norm_2, where present) and the two added before post_ffn_norm. */                  \
    X(float, expert_logit_scale, 1.0f)                                                             \
    X(bool, expert_dense_branch, false)

// One decoder block. Tensor fields hold names into ModelSpec::tensors; "" means absent.
struct LayerSpec {
    KCAP_LAYER_SCALAR_FIELDS(KCAP_DECLARE_FIELD)
#define KCAP_DECLARE_TENSOR_FIELD(NAME) std::string NAME;
    KCAP_LAYER_TENSOR_FIELDS(KCAP_DECLARE_TENSOR_FIELD)
};

// Values one token adds to a layer's KV cache: n_head_kv * head_dim keys and n_head_kv *
// head_dim_v values, or for multi-head latent attention the latent and the rope key
// (kv_lora_rank + rope_dim, stored as the key row) and no values.
struct KvWidths {
    int64_t k = 0;
    int64_t v = 0;
};
inline KvWidths kv_widths(const LayerSpec& layer) {
    if (layer.kv_lora_rank > 0) return {int64_t(layer.kv_lora_rank) + layer.rope_dim, 0};
    return {int64_t(layer.n_head_kv) * layer.head_dim, int64_t(layer.n_head_kv) * layer.head_dim_v};
}

// The scalar fields of the whole model, one list as for LayerSpec.
#define KCAP_MODEL_SCALAR_FIELDS(X)                                                                \
    /* informational only: printed by explain, never branched on */                                \
    X(std::string, architecture, "")                                                               \
    X(int64_t, n_embd, 0)                                                                          \
    X(int64_t, n_vocab, 0)                                                                         \
    X(int64_t, context_length, 0)                                                                  \
    X(NormKind, norm_kind, NormKind::RMS)                                                          \
    X(float, norm_eps, 1e-6f)                                                                      \
    /* token embeddings are multiplied by this (Gemma: sqrt(n_embd)) */                            \
    X(float, embed_scale, 1.0f)                                                                    \
    X(float, final_softcap, 0.0f)                                                                  \
    /* logits are multiplied by this (Granite: 1 / logits_scaling) */                              \
    X(float, logit_scale, 1.0f)                                                                    \
    /* Per-layer embeddings (Gemma 4 PLE): for each token, ple [n_layer, n_embd_per_layer] =       \
         (rms_norm(ple_proj_norm, (ple_model_proj . e) * ple_model_proj_scale)  (e: the scaled     \
          embedding) + ple_token_embd[id] * ple_token_scale) * ple_combine_scale                   \
       where each layer's slice of n_embd_per_layer values is normed on its own. */                \
    X(int64_t, n_embd_per_layer, 0)                                                                \
    X(float, ple_token_scale, 1.0f)                                                                \
    X(float, ple_model_proj_scale, 1.0f)                                                           \
    X(float, ple_combine_scale, 1.0f)

struct ModelSpec {
    KCAP_MODEL_SCALAR_FIELDS(KCAP_DECLARE_FIELD)

    // Tensor fields (KCAP_MODEL_TENSOR_FIELDS): token_embd; position_embd, learned absolute
    // position embeddings added to the tokens' (GPT-2); output_norm[_bias]; output, the LM head
    // (equal to token_embd when the embeddings are tied); ple_* (see n_embd_per_layer).
    KCAP_MODEL_TENSOR_FIELDS(KCAP_DECLARE_TENSOR_FIELD)

    std::vector<LayerSpec> layers;
    std::map<std::string, TensorRef> tensors;
    // Owners of the memory that TensorRef::data points into (e.g. the Python memory map).
    std::vector<std::shared_ptr<void>> keepalive;

    // Throws ModelError naming the tensor when it is absent.
    const TensorRef& tensor(const std::string& name) const;
    const TensorRef* optional_tensor(const std::string& name) const;
};

}  // namespace kcap
