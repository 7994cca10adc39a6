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
    // Added for the CUDA backend (issue 3): greedy argmax of the logits on the device, the
    // last node of a captured decode step. The planner emits no such stage; a GPU backend
    // routes its own argmax stage through the table like any other.
    Argmax,
    // Top-k sampling of the logits on the device (temperature, top-p, min-p, a seeded draw),
    // the last node of a sampling decode graph; routed by the backend like Argmax.
    Sample,
    PerLayerEmbed,    // per-layer embeddings of each token: table rows + normed projection (PLE)
    PerLayerGate,     // act(gate) * this layer's slice of the per-layer embeddings
    // Fused stages (issue 3): the planner forms them from the stages above only where the
    // backend has a row for the fused op (it never fuses for a backend that lacks one), so the
    // unfused and fused plans compute the same thing.
    AddNorm,          // residual += scale * [post_norm](branch); normed = norm(residual)
    GateUp,           // act(W_gate x) * (W_up x): the gate and up matmuls and the gated activation
    QkNormRope,       // per-head RMS norm of Q and K (their own weights), then rope of both, in place
    Qkv,              // the Q, K and V matmuls of one input (each weight its own format), no biases
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

// Features a stage may require. A row that lacks one of its stage's features is rejected:
// a fallback preserves the feature set or refuses, it never drops one.
enum Feature : uint32_t {
    kRmsNorm = 1u << 0,
    kLayerNorm = 1u << 1,
    kBias = 1u << 2,
    kRopeNormal = 1u << 3,
    kRopeNeox = 1u << 4,
    kPartialRotary = 1u << 5,
    kRopeFreqFactors = 1u << 6,
    kSlidingWindow = 1u << 7,
    kAttnSoftcap = 1u << 8,
    kSinks = 1u << 9,
    kGqa = 1u << 10,
    kSilu = 1u << 11,
    kGeluTanh = 1u << 12,
    kGeluErf = 1u << 13,
    kRelu = 1u << 14,
    kGated = 1u << 15,
    kEmbedScale = 1u << 16,
    kPositionEmbedding = 1u << 17,
    kResidualScale = 1u << 18,
    kParameterFreeNorm = 1u << 19,
    kPerLayerEmbedding = 1u << 20,
    kLayerOutputScale = 1u << 21,
    kKvShared = 1u << 22,  // attention reads another layer's KV cache and stores none
    kPostNorm = 1u << 23,  // add_norm: the branch output is normed (own weight) before the add
};
std::string feature_names(uint32_t features);  // "sliding_window,softcap"

// Dims a row accepts; the planner checks each at plan time, never at token time.
struct LegalDims {
    int64_t k_multiple = 1;  // the inner dimension must be a multiple of this
    int64_t k_max = 0;       // 0: unbounded
    int64_t n_multiple = 1;  // output rows must be a multiple of this
    int max_head_dim = 0;    // 0: unbounded
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
};

struct Stage;
struct KernelCall;
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
    uint32_t features = 0;
    LegalDims dims;
    Geometry geometry;
    // Features a stage must have one of (0: none): the rope-owning attention rows take only the
    // stages the planner folded a rope into, so a plain stage never lands on them.
    uint32_t requires_any = 0;
    int priority = 0;  // the highest-priority row that fits wins
    KernelFn fn = nullptr;  // null where the backend is declared but not compiled in
};

// Every row of every backend, in declaration order.
const std::vector<Row>& capability_table();

// Empty when the row can run the stage; otherwise the reason it cannot.
std::string rejection_reason(const Row& row, const Stage& stage);

// Each backend family file contributes its rows through one of these.
void add_cpu_embed_rows(std::vector<Row>& rows);
void add_cpu_norm_rows(std::vector<Row>& rows);
void add_cpu_matmul_rows(std::vector<Row>& rows);
void add_cpu_rope_rows(std::vector<Row>& rows);
void add_cpu_attention_rows(std::vector<Row>& rows);
void add_cpu_activation_rows(std::vector<Row>& rows);
void add_cpu_elementwise_rows(std::vector<Row>& rows);
void add_cpu_ple_rows(std::vector<Row>& rows);

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

}  // namespace kcap
