// Stage: one step of the forward pass with its operands, dims, parameters and required
// features. The planner builds the stage list from a ModelSpec and routes each stage to a
// capability row; a backend executes the routed stages in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/capability.h"
#include "kcap/model_spec.h"

namespace kcap {

// Activation buffers a stage reads and writes. Each holds up to max_tokens rows.
// Routing: per token, the n_expert_used chosen experts' ids (as floats) then their weights.
// Proj2: a second branch output (a shared expert's), combined into Proj by a later stage.
enum class Buffer { None, Residual, Normed, Q, K, V, Attn, Proj, Gate, Up, Act, PerLayer, Routing, Proj2, Logits };
const char* buffer_name(Buffer buffer);

struct StageParams {
    float eps = 0.0f;       // norms
    float scale = 1.0f;     // embed scale; attention q.k scale
    float softcap = 0.0f;   // attention or final logit softcap
    Activation activation = Activation::SiLU;
    // rope
    int rope_dim = 0;
    float rope_base = 10000.0f;
    float rope_freq_scale = 1.0f;
    RopeYarn rope_yarn;
    // attention geometry
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int head_dim_v = 0;
    int sliding_window = 0;
    int kv_layer = -1;  // attention: the layer whose KV cache is read (-1: its own, appended to)
    // per-layer embeddings
    int n_layer = 0;
    float ple_token_scale = 1.0f;
    float ple_model_proj_scale = 1.0f;
    float ple_combine_scale = 1.0f;
    // mixture of experts
    int n_expert = 0;
    int n_expert_used = 0;
    float expert_weights_scale = 1.0f;
    float expert_logit_scale = 1.0f;  // the router's logits times this before the softmax
    float swiglu_alpha = 1.702f;      // activation swiglu_oai
    float swiglu_limit = 7.0f;
    int n_expert_groups = 0;          // group-limited routing (kExpertGroups)
    int n_expert_groups_used = 0;
    ExpertGroupScore expert_group_score = ExpertGroupScore::Max;
    // multi-head latent attention: the latent's width (head_dim - rope_dim is the query's
    // non-rotated part, head_dim_v each head's output)
    int kv_lora_rank = 0;
};

struct Stage {
    int layer = -1;  // -1: model-level (embedding, final norm, LM head)
    std::string name;  // e.g. "attn_q", "ffn_norm"
    Op op = Op::Add;
    // Weight operands in the op's order (MatMul: W, bias; Norm: weight, bias; Rope: freq
    // factors). A null entry is an absent optional operand.
    std::vector<const TensorRef*> operands;
    Buffer input = Buffer::None;
    Buffer input2 = Buffer::None;
    Buffer input3 = Buffer::None;
    Buffer output = Buffer::None;
    int64_t k = 0;        // inner dimension (matmul K; norm row length; rope/attn head dim)
    int64_t n = 0;        // output width per token
    int64_t groups = 1;   // norm: independent groups per token (per-head QK-norm)
    int64_t k2 = 0;       // moe_experts: the experts' FFN width (the down projection's inner dimension)
    FeatureMask features = 0;
    StageParams params;
    Format kv_format = Format::F32;  // attention: the KV cache element type
    // Matmul stages (MatMul, GateUp, Qkv): the coarsest activation encoding the plan allows.
    Encoding input_encoding = Encoding::F32;
    int64_t max_span = 0;            // attention: most keys one query can see
    // Runs on the last position only (the LM head and what follows it): the first such
    // stage reads the final row of its per-token input.
    bool last_token_only = false;
};

// Operands that are present, for messages: "W=Q4_K bias=F32".
std::string describe_formats(const Stage& stage);
std::string describe_dims(const Stage& stage);

// What a backend passes to a kernel for one invocation of a stage.
struct KernelCall {
    int n_tokens = 0;   // rows of the activation buffers this call covers
    int pos0 = 0;       // position of the first of them in the sequence
    const int32_t* tokens = nullptr;
    const float* in = nullptr;
    const float* in2 = nullptr;
    const float* in3 = nullptr;
    float* out = nullptr;
    float* inout2 = nullptr;  // rope: the K buffer rotated alongside Q; add_norm: the residual
                              // (read and written); gate_up: gate scratch
    float* inout3 = nullptr;  // gate_up: up scratch
    // The per-token buffers of this call hold buffer_rows rows (the call's tokens); a stage
    // that runs on the last position only reads from row row_offset (buffer_rows - 1) of them.
    int buffer_rows = 0;
    int row_offset = 0;
    void* backend_state = nullptr;  // the backend's own context (thread pool, KV cache)
    // What the backend bound to this stage at load time (device copies of its operands, a rope
    // table, the attention split count); null on cpu.
    const void* stage_state = nullptr;
    const Row* row = nullptr;  // the row this call runs (the executor's route for n_tokens)
};

}  // namespace kcap
