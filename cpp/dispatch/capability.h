// The capability table: one row per executable kernel on one backend.
//
// Every kernel choice in kcap is made by the planner consulting these rows, at load time.
// A row states exactly which formats it decodes per operand (never a family test), which
// dims are legal, and which features it implements; a stage that needs a feature a row
// lacks can never be routed to it. Rows are declared once, next to their kernel (each
// backend file has an add_<backend>_<family>_rows function), and collected here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kcap/formats.h"

namespace kcap {

enum class Backend { CPU, CUDA, Metal };
const char* backend_name(Backend backend);
Backend backend_from_name(const std::string& name);  // throws BackendUnavailableError

enum class Op {
    Embed,            // token ids -> rows of the embedding table, times a scale
    Norm,             // RMS or Layer norm over groups of a row, times weight (+ bias)
    MatMul,           // y[m, n] = W[n, :] . x[m, :] (+ bias[n]); W quantized
    Rope,             // rotary position embedding of Q and K, in place
    Attention,        // append K/V to the cache, then causal (windowed) softmax attention
    FfnActivation,    // act(gate) * up, or act(x) for a non-gated FFN
    Add,              // residual add: out = in + in2
    Softcap,          // cap * tanh(x / cap), the final logit softcap
    Scale,            // out = in * scale (Granite's logit scaling)
    // Greedy argmax of the logits on the device, the last node of a captured decode step. The
    // planner emits no such stage; a GPU backend routes its own argmax stage through the table
    // like any other.
    Argmax,
    // Top-k sampling of the logits on the device (temperature, top-p, min-p, a seeded draw),
    // the last node of a sampling decode graph; routed by the backend like Argmax.
    Sample,
    PerLayerEmbed,    // per-layer embeddings of each token: table rows + normed projection (PLE)
    PerLayerGate,     // act(gate) * this layer's slice of the per-layer embeddings
    // Fused stages: the planner forms them from the stages above only where the
    // backend has a row for the fused op (it never fuses for a backend that lacks one), so the
    // unfused and fused plans compute the same thing.
    AddNorm,          // residual += scale * [post_norm](branch); normed = norm(residual)
    GateUp,           // act(W_gate x) * (W_up x): the gate and up matmuls and the gated activation
    QkNormRope,       // per-head RMS norm of Q and K (their own weights), then rope of both, in place
    // The Q, K and V matmuls of one input (each weight its own format), no biases; or a latent
    // attention's pair (two operands): the query's (first) matmul and the compressed KV row's.
    Qkv,
    // Mixture of experts: the router (its matmul, the gating and the top-k choice of experts
    // and their weights per token), the chosen experts' gated FFNs weighted and summed, and a
    // shared expert's output added under its sigmoid gate.
    MoeRoute,
    MoeExperts,
    MoeSharedGate,
    // Multi-head latent attention (LayerSpec::kv_lora_rank): RMS-norms the latent and rotates the
    // rope key of each new token's compressed KV row, appends that row to the cache (the latent
    // and the rope key, nothing expanded), and attends every query over the cache with the
    // latent's up-projections absorbed: each head's query through its K up-projection into the
    // latent space, its weighted sum of latents through its V up-projection. Operands: the
    // latent's norm weight, W_k_b (or the combined W_kv_b), W_v_b (absent with W_kv_b), the rope
    // frequency factors.
    AttentionMla,
};
const char* op_name(Op op);

// The encoding a matmul row computes with its activation input in. F32: the values as they are.
// Q8_1: each 32-element run rounded to int8 times an f32 scale (amax / 127), llama.cpp's q8_1,
// which its mmvq/mmq kernels use; a row that declares it is chosen only where the plan allows it
// (EngineOptions::activations = "q8_1"), and an F32 row always fits (it is the more precise).
// BF16: a batch's matmul rounds its input and its dequantized weights to bf16 (round to nearest
// even) and multiplies them on the tensor cores with f32 sums, the numerics of a bf16 model in
// PyTorch or of vLLM's GGUF prefill (dequantize, then GEMM); allowed only where the plan's
// activations are "bf16". Rows that declare it run their exact kernels below a token count.
enum class Encoding { F32, Q8_1, BF16 };
const char* encoding_name(Encoding encoding);
Encoding encoding_from_name(const std::string& name);  // throws FormatError
const std::vector<Encoding>& encodings();              // every encoding, for option lists

// Features a stage may require. A row that lacks one of its stage's features is rejected:
// a fallback preserves the feature set or refuses, it never drops one. One list: the enum and
// the names that explain prints come from it. X(enumerator suffix, name).
#define KCAP_FEATURES(X)                                                                           \
    X(RmsNorm, rms_norm)                                                                           \
    X(LayerNorm, layer_norm)                                                                       \
    X(Bias, bias)                                                                                  \
    X(RopeNormal, rope_normal)                                                                     \
    X(RopeNeox, rope_neox)                                                                         \
    X(PartialRotary, partial_rotary)                                                               \
    X(RopeFreqFactors, rope_freq_factors)                                                          \
    X(SlidingWindow, sliding_window)                                                               \
    X(AttnSoftcap, softcap)                                                                        \
    X(Sinks, sinks)                                                                                \
    X(Gqa, gqa)                                                                                    \
    X(Silu, silu)                                                                                  \
    X(GeluTanh, gelu_tanh)                                                                         \
    X(GeluErf, gelu_erf)                                                                           \
    X(Relu, relu)                                                                                  \
    /* gpt-oss's clamped SwiGLU (Activation::SwigluOai) */                                         \
    X(SwigluOai, swiglu_oai)                                                                       \
    X(Gated, gated)                                                                                \
    X(EmbedScale, embed_scale)                                                                     \
    X(PositionEmbedding, position_embedding)                                                       \
    X(ResidualScale, residual_scale)                                                               \
    X(ParameterFreeNorm, parameter_free_norm)                                                      \
    X(PerLayerEmbedding, per_layer_embedding)                                                      \
    X(LayerOutputScale, layer_output_scale)                                                        \
    /* attention reads another layer's KV cache and stores none */                                 \
    X(KvShared, kv_shared)                                                                         \
    /* add_norm: the branch output is normed (own weight) before the add */                        \
    X(PostNorm, post_norm)                                                                         \
    /* a q8_1 matmul whose input the stage before it already rounded into the q8_1 scratch */      \
    X(Q8Input, q8_input)                                                                           \
    /* a stage that also writes its output's q8_1 form for the q8_1 matmuls after it */            \
    X(Q8Output, q8_output)                                                                         \
    /* mixture of experts: a softmax over every expert's logit before the top-k choice */          \
    X(ExpertSoftmax, expert_softmax)                                                               \
    /* the chosen experts' weights renormalized to sum 1 */                                        \
    X(ExpertWeightsNorm, expert_weights_norm)                                                      \
    /* a shared expert's output scaled by sigmoid(w . x) before it is added */                     \
    X(SharedExpertGate, shared_expert_gate)                                                        \
    /* the router's logits times a scalar (params.expert_logit_scale) before the softmax */        \
    X(ExpertLogitScale, expert_logit_scale)                                                        \
    /* each chosen expert's weight times its own entry of a per-expert scale vector (operand 1) */ \
    X(PerExpertScale, per_expert_scale)                                                            \
    /* the experts' gate and up in one tensor: expert e's gate rows, then its up rows */           \
    X(ExpertGateUpMerged, expert_gate_up_merged)                                                   \
    /* mixture of experts: each expert's sigmoid of its logit instead of a softmax (DeepSeek V3) */ \
    X(ExpertSigmoid, expert_sigmoid)                                                               \
    /* group-limited routing: experts only from the best expert_group_used groups */               \
    X(ExpertGroups, expert_groups)                                                                 \
    /* a per-expert bias (operand 3) added to the scores that choose the experts, not to their     \
       weights */                                                                                  \
    X(ExpertChoiceBias, expert_choice_bias)                                                        \
    /* multi-head latent attention with both up-projections in one W_kv_b (the K part untransposed) \
       instead of W_k_b and W_v_b */                                                               \
    X(MlaKvBCombined, mla_kv_b_combined)                                                           \
    /* the experts' weighted sum plus a shared expert's output without a gate (input3), in the     \
       same pass: no separate add */                                                               \
    X(SharedExpertSum, shared_expert_sum)                                                          \
    /* a router that first adds the branch to the residual and RMS-norms it (the add_norm before   \
       it fused in: input Residual, input2 the branch, input3 the normed row it also writes) */    \
    X(AddNormInput, add_norm_input)

enum FeatureIndex : int {
#define KCAP_FEATURE_INDEX(NAME, TEXT) kFeatureIndex##NAME,
    KCAP_FEATURES(KCAP_FEATURE_INDEX)
#undef KCAP_FEATURE_INDEX
    kFeatureCount
};
// A set of features: one bit each.
using FeatureMask = uint64_t;
static_assert(kFeatureCount <= 64, "features are bits of a FeatureMask");
enum Feature : FeatureMask {
#define KCAP_FEATURE_BIT(NAME, TEXT) k##NAME = FeatureMask(1) << kFeatureIndex##NAME,
    KCAP_FEATURES(KCAP_FEATURE_BIT)
#undef KCAP_FEATURE_BIT
};
std::string feature_names(FeatureMask features);  // "sliding_window,softcap"

struct Stage;
struct KernelCall;

// Dims a row accepts; the planner checks each at plan time, never at token time.
struct LegalDims {
    int64_t k_multiple = 1;  // the inner dimension must be a multiple of this
    int64_t k_min = 0;       // the inner dimension must be at least this
    int64_t k_max = 0;       // 0: unbounded
    int64_t n_multiple = 1;  // output rows must be a multiple of this
    int max_head_dim = 0;    // 0: unbounded
    int head_dim_v_multiple = 1;  // attention rows that write whole 32-value runs of each head
    // Attention rows with a body for a few head dims only (head_dim == head_dim_v, one of
    // these); empty: any up to max_head_dim.
    std::vector<int> head_dims;
    int64_t max_span = 0;    // attention keys per query; 0: unbounded (up to the context)
    // Attention rows that apply a NeoX rope themselves (kRopeNeox in their features): the head
    // dims whose halves their bodies pair; empty: any.
    std::vector<int> neox_head_dims;
    // Rows whose weight operands may differ in format (qkv): when set, K must also be a
    // multiple of k_multiple_of(format) for the format of every weight operand.
    int64_t (*k_multiple_of)(Format format) = nullptr;
    int max_experts = 0;       // mixture-of-experts rows: the most experts (0: any)
    int max_experts_used = 0;  // ... and the most chosen per token (0: any)
    // Rows whose kernels need a newer device than the backend's least (thread-block clusters:
    // sm_90), checked against the plan's device (DeviceInfo::sm_version); 0: any.
    int min_sm_version = 0;
    // Rows whose kernels take more threadgroup memory than every device allows: the bytes one
    // group of the stage needs, checked against the plan's device (DeviceInfo).
    int (*shared_bytes_of)(const Stage& stage) = nullptr;
    // A row-specific check of the stage's geometry that the fields above do not express: the
    // reason the row cannot run it, empty when it can.
    std::string (*reject_of)(const Stage& stage) = nullptr;
};

// What the planner knows of the device a plan is for: the rows whose legality or token ranges
// depend on it read this. A CUDA engine plans for its own device; `kcap explain` without one
// plans for the reference device below, and says so.
struct DeviceInfo {
    std::string name = "NVIDIA H200 (reference)";
    bool reference = true;             // not a device that was queried
    int sm_count = 132;                // multiprocessors
    int shared_optin_bytes = 232448;   // threadgroup memory one group may opt in to
    int sm_version = 90;               // compute capability, major * 10 + minor
};

// Tokens per call of one route: [min, max], max 0 for no upper bound.
struct TokenRange {
    int min = 1;
    int max = 0;
    bool contains(int64_t n) const { return n >= min && (max == 0 || n <= max); }
};

using KernelFn = void (*)(const Stage& stage, const KernelCall& call);

// Launch geometry travels with the row; a dispatch site never restates it.
struct Geometry {
    int threads_per_group = 0;
    int rows_per_group = 0;
    int shared_bytes = 0;
};

struct Row {
    std::string kernel;  // unique, e.g. "cpu.matmul.q4_k"
    Op op;
    Backend backend;
    // Allowed exact formats per weight operand position, in the op's operand order.
    std::vector<std::vector<Format>> operand_formats;
    std::vector<Format> kv_formats;  // attention rows: KV cache element types
    Encoding input_encoding = Encoding::F32;  // matmul rows: how the activation input is rounded
    FeatureMask features = 0;
    LegalDims dims;
    Geometry geometry;
    // Features a stage must have one of (0: none): the rope-owning attention rows take only the
    // stages the planner folded a rope into, so a plain stage never lands on them.
    FeatureMask requires_any = 0;
    // Features a stage must have all of (0: none): the rows whose kernels read a q8_1 input
    // another stage wrote, or that write one, take only the stages the planner linked so.
    FeatureMask requires_all = 0;
    // Tokens per call the row's kernels take. The planner routes each stage once per range of
    // tokens per call, at load time; nothing decides a kernel at token time. tokens_min_of,
    // where set, computes the lower bound from the stage and the device instead (a tile shape
    // that pays off only once a batch fills the device).
    TokenRange tokens;
    int (*tokens_min_of)(const Stage& stage, const DeviceInfo& device) = nullptr;
    // The kernels one call of the row launches, in order: what the row's launcher runs, no
    // more and no other (a kernel in parentheses runs only where the stage's geometry needs
    // it, e.g. the combine of a decode attention split over key ranges).
    std::vector<std::string> launches;
    int priority = 0;  // the highest-priority row that fits wins
    KernelFn fn = nullptr;  // null where the backend is declared but not compiled in
};

// The token range of a row for a stage on a device (Row::tokens, or tokens_min_of's bound).
TokenRange row_tokens(const Row& row, const Stage& stage, const DeviceInfo& device);

// Every row of every backend, in declaration order.
const std::vector<Row>& capability_table();

// Empty when the row can run the stage; otherwise the reason it cannot.
// Token counts aside (the planner splits those into ranges), against the plan's device.
std::string rejection_reason(const Row& row, const Stage& stage, const DeviceInfo& device = DeviceInfo());

// Each backend family file contributes its rows through one of these.
void add_cpu_embed_rows(std::vector<Row>& rows);
void add_cpu_norm_rows(std::vector<Row>& rows);
void add_cpu_matmul_rows(std::vector<Row>& rows);
void add_cpu_rope_rows(std::vector<Row>& rows);
void add_cpu_attention_rows(std::vector<Row>& rows);
void add_cpu_activation_rows(std::vector<Row>& rows);
void add_cpu_elementwise_rows(std::vector<Row>& rows);
void add_cpu_ple_rows(std::vector<Row>& rows);
void add_cpu_moe_rows(std::vector<Row>& rows);

// CUDA rows (cuda/rows.cpp). They are in the table in every build, so any machine can plan
// and explain for CUDA; where the backend is not compiled in, their fn is null and an Engine
// on backend "cuda" is refused with BackendUnavailableError.
void add_cuda_embed_rows(std::vector<Row>& rows);
void add_cuda_norm_rows(std::vector<Row>& rows);
void add_cuda_matmul_rows(std::vector<Row>& rows);
void add_cuda_rope_rows(std::vector<Row>& rows);
void add_cuda_attention_rows(std::vector<Row>& rows);
void add_cuda_activation_rows(std::vector<Row>& rows);
void add_cuda_elementwise_rows(std::vector<Row>& rows);
void add_cuda_argmax_rows(std::vector<Row>& rows);
void add_cuda_ple_rows(std::vector<Row>& rows);
void add_cuda_moe_rows(std::vector<Row>& rows);

}  // namespace kcap
