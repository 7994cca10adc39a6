// The rows both GPU backends run from the same kernel bodies, declared once (gpu_rows.h).
#include "dispatch/gpu_rows.h"

#include "dispatch/stage.h"
#include "kernels/params.h"

namespace kcap {

// The latent attention bodies' legal dims: whole 32-value runs of the latent and of the query's
// non-rotated part (kcap_mla_rows), the latent's weighted sum in registers (KCAP_MLA_MAX_LORA),
// the cache row and the queries in threadgroup memory (KCAP_MLA_MAX_WIDTH), the rope key's
// values per lane (KCAP_MLA_ROPE_PER_LANE).
std::string mla_rejection(const Stage& stage) {
    const StageParams& p = stage.params;
    const int nope = p.head_dim - p.rope_dim;
    if (p.kv_lora_rank % 32 || nope % 32 || p.kv_lora_rank > KCAP_MLA_MAX_LORA ||
        p.kv_lora_rank + p.rope_dim > KCAP_MLA_MAX_WIDTH || nope > KCAP_MLA_MAX_WIDTH ||
        p.rope_dim > 32 * KCAP_MLA_ROPE_PER_LANE)
        return "kv_lora_rank " + std::to_string(p.kv_lora_rank) + " and the query's non-rotated part " +
               std::to_string(nope) + " must be multiples of 32, kv_lora_rank at most " +
               std::to_string(KCAP_MLA_MAX_LORA) + ", the cache row and the non-rotated part at most " +
               std::to_string(KCAP_MLA_MAX_WIDTH) + ", the rope part at most " + std::to_string(32 * KCAP_MLA_ROPE_PER_LANE);
    return "";
}

namespace {

constexpr FeatureMask kActivationFeatures = kSilu | kGeluTanh | kGeluErf | kRelu;

// Group-limited routing takes one group per lane of the route's simd group.
std::string expert_groups_rejection(const Stage& stage) {
    if (stage.params.n_expert_groups > KCAP_MOE_MAX_GROUPS)
        return std::to_string(stage.params.n_expert_groups) + " expert groups exceed " + std::to_string(KCAP_MOE_MAX_GROUPS);
    return "";
}

struct Family {
    const char* name;      // the row's kernel name after "<backend>."
    bool per_format;       // one row per weight format: "<backend>.<name>.<format>"
    Op op;
    TokenRange tokens;
    int priority;
    std::vector<const char*> launches;
};

const Family& family_of(GpuFamily family) {
    static const Family families[] = {
        {"embed", true, Op::Embed, {1, 0}, 0, {"embed"}},
        {"matvec", true, Op::MatMul, {1, 1}, 1, {"matvec"}},
        {"matmul_tokens", true, Op::MatMul, {1, 0}, 0, {"matmul_tokens"}},
        {"gate_up", true, Op::GateUp, {1, 1}, 1, {"gate_up"}},
        {"gate_up_tokens", true, Op::GateUp, {1, 0}, 0, {"matmul_tokens", "matmul_tokens", "ffn_activation"}},
        {"norm", false, Op::Norm, {1, 0}, 0, {"norm"}},
        {"add_norm", false, Op::AddNorm, {1, 0}, 0, {"add_norm"}},
        {"rope", false, Op::Rope, {1, 0}, 0, {"rope"}},
        {"attention_decode", false, Op::Attention, {1, 1}, 0, {"attention_decode", "(attention_combine)"}},
        {"attention_prefill", false, Op::Attention, {2, 0}, 0, {"(kv_append)", "attention_prefill"}},
        {"attention_mla_decode", false, Op::AttentionMla, {1, 1}, 0,
         {"mla_append_absorb", "mla_attend", "mla_combine", "mla_v_up"}},
        {"attention_mla", false, Op::AttentionMla, {2, 0}, 0,
         {"mla_append_absorb", "mla_attend", "mla_combine", "mla_v_up"}},
        {"ffn_activation", false, Op::FfnActivation, {1, 0}, 0, {"ffn_activation"}},
        {"add", false, Op::Add, {1, 0}, 0, {"add"}},
        {"softcap", false, Op::Softcap, {1, 0}, 0, {"softcap"}},
        {"scale", false, Op::Scale, {1, 0}, 0, {"scale"}},
        {"per_layer_embed", true, Op::PerLayerEmbed, {1, 0}, 0, {"matmul_tokens", "ple_combine"}},
        {"per_layer_gate", false, Op::PerLayerGate, {1, 0}, 0, {"ple_gate"}},
        {"argmax", false, Op::Argmax, {1, 1}, 0, {"argmax_partial", "argmax_final"}},
        {"moe_route", false, Op::MoeRoute, {1, 0}, 0, {"moe_logits", "moe_route"}},
        {"moe_experts", true, Op::MoeExperts, {1, 0}, 0, {"moe_gate_up", "moe_down", "moe_combine"}},
        {"moe_shared_gate", false, Op::MoeSharedGate, {1, 0}, 0, {"moe_shared_gate"}},
    };
    return families[int(family)];
}

}  // namespace

Row gpu_family_row(GpuFamily family, Backend backend, Format format, KernelFn fn, Geometry geometry) {
    const Family& f = family_of(family);
    std::string kernel = std::string(backend_name(backend)) + "." + f.name;
    if (f.per_format) kernel += "." + lowercase(format_name(format));
    Row row = gpu_row(backend, kernel, f.op, fn, geometry);
    row.tokens = f.tokens;
    row.priority = f.priority;
    row.launches.assign(f.launches.begin(), f.launches.end());
    switch (family) {
        case GpuFamily::Embed:
            row.operand_formats = {{format}, {Format::F32, Format::F16}};  // table, learned positions
            row.features = kEmbedScale | kPositionEmbedding;
            row.dims.k_multiple = exact_k_multiple(format);
            break;
        case GpuFamily::Matvec:
        case GpuFamily::MatmulTokens:
            row.operand_formats = {{format}, {Format::F32}};  // W, bias
            row.features = kBias;
            row.dims.k_multiple = exact_k_multiple(format);
            break;
        case GpuFamily::GateUp:
        case GpuFamily::GateUpTokens:
            row.operand_formats = {{format}, {format}};  // W_gate, W_up
            row.features = kActivationFeatures | kGated;
            row.dims.k_multiple = exact_k_multiple(format);
            break;
        case GpuFamily::Norm:
            row.operand_formats = {{Format::F32}, {Format::F32}};
            row.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm;
            break;
        case GpuFamily::AddNorm:  // [post-norm of the branch] + residual add + the next norm
            row.operand_formats = {{Format::F32}, {Format::F32}, {Format::F32}, {Format::F32}};
            row.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm | kResidualScale | kPostNorm;
            break;
        case GpuFamily::Rope:
            row.operand_formats = {{Format::F32}};  // frequency factors
            row.features = kRopeNormal | kRopeNeox | kPartialRotary | kRopeFreqFactors;
            break;
        case GpuFamily::AttentionDecode:
        case GpuFamily::AttentionPrefill:
            // Attention sinks (operand 3, F32 [n_head], after the slots of a fused rope's
            // operands): every body adds exp(sink - max) to its softmax denominator.
            row.operand_formats = {{}, {}, {}, {Format::F32}};
            row.kv_formats = {Format::F32, Format::F16};
            row.features = kSlidingWindow | kAttnSoftcap | kGqa | kKvShared | kSinks;
            row.dims.k_multiple = 4;      // head_dim: K rows are read 4 elements at a time
            row.dims.max_head_dim = 256;  // per-lane value registers (KCAP_ATTN_MAX_HEAD_DIM)
            break;
        case GpuFamily::AttentionMlaDecode:
        case GpuFamily::AttentionMla:
            // The latent's norm weight, W_k_b (or the combined W_kv_b) and W_v_b in any weight
            // format, the rope frequency factors (folded into the rope table).
            row.operand_formats = {{Format::F32}, gpu_weight_formats(), gpu_weight_formats(), {Format::F32}};
            row.kv_formats = {Format::F32, Format::F16};
            row.features = kRopeNormal | kRopeFreqFactors | kRmsNorm | kMlaKvBCombined;
            row.dims.reject_of = &mla_rejection;
            break;
        case GpuFamily::FfnActivation:
            row.features = kActivationFeatures | kGated;
            break;
        case GpuFamily::Add:
            row.features = kResidualScale;
            break;
        case GpuFamily::Scale:
            row.features = kLayerOutputScale;  // also scales the residual stream after a block
            break;
        case GpuFamily::PerLayerEmbed:  // table (any format), projection (this row's), norm
            row.operand_formats = {gpu_weight_formats(), {format}, {Format::F32}};
            row.features = kPerLayerEmbedding | kRmsNorm;
            row.dims.k_multiple = exact_k_multiple(format);
            break;
        case GpuFamily::PerLayerGate:
            row.features = kPerLayerEmbedding | kActivationFeatures;
            break;
        case GpuFamily::MoeRoute:  // the router in any format of whole 32-value runs (llama.cpp keeps it F32)
            row.operand_formats = {gpu_weight_formats(), {Format::F32}};  // the router, per-expert scales
            row.features = kExpertSoftmax | kExpertWeightsNorm | kExpertLogitScale | kPerExpertScale;
            row.dims.k_multiple_of = &run_k_multiple;
            row.dims.max_experts = KCAP_MOE_MAX_EXPERTS;
            row.dims.max_experts_used = KCAP_MOE_MAX_USED;
            break;
        case GpuFamily::MoeExperts:  // gate and up of this row's format, down of any (a Q4_K_M file's Q6_K)
            row.operand_formats = {{format}, {format}, gpu_weight_formats()};
            row.features = kActivationFeatures | kGated | kExpertGateUpMerged | kSharedExpertSum;
            row.dims.k_multiple_of = &exact_k_multiple;  // K, and the experts' FFN width
            row.dims.max_experts_used = KCAP_MOE_MAX_USED;
            break;
        case GpuFamily::MoeSharedGate:
            row.operand_formats = {{Format::F32}};
            row.features = kSharedExpertGate;
            break;
        case GpuFamily::Softcap:
        case GpuFamily::Argmax:
            break;
    }
    return row;
}

void add_moe_route_variants(Row& route) {
    route.operand_formats.push_back({Format::F32});  // 2: the router's bias
    route.operand_formats.push_back({Format::F32});  // 3: the choice bias
    route.features |= kBias | kExpertSigmoid | kExpertGroups | kExpertChoiceBias;
    route.dims.reject_of = &expert_groups_rejection;
}

void add_moe_expert_biases(Row& experts) {
    experts.operand_formats.insert(experts.operand_formats.end(), 3, std::vector<Format>{Format::F32});
    experts.features |= kBias | kSwigluOai;
}

std::vector<std::string> launched_kernels(const Row& row) {
    std::vector<std::string> names;
    for (const std::string& launch : row.launches)
        names.push_back(launch.front() == '(' ? launch.substr(1, launch.size() - 2) : launch);
    return names;
}

}  // namespace kcap
