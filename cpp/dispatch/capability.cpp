// Collects every backend's rows into the one table and checks a row against a stage.
#include "dispatch/capability.h"

#include <algorithm>
#include <sstream>

#include "dispatch/stage.h"
#include "kcap/errors.h"
#include "metal/rows.h"

namespace kcap {

const char* backend_name(Backend backend) {
    switch (backend) {
        case Backend::CPU: return "cpu";
        case Backend::CUDA: return "cuda";
        case Backend::Metal: return "metal";
    }
    return "?";
}

Backend backend_from_name(const std::string& name) {
    if (name == "cpu") return Backend::CPU;
    if (name == "cuda") return Backend::CUDA;
    if (name == "metal") return Backend::Metal;
    throw BackendUnavailableError("unknown backend '" + name + "' (known: cpu, cuda, metal)");
}

const char* encoding_name(Encoding encoding) {
    switch (encoding) {
        case Encoding::F32: return "f32";
        case Encoding::Q8_1: return "q8_1";
        case Encoding::BF16: return "bf16";
    }
    return "?";
}

const std::vector<Encoding>& encodings() {
    static const std::vector<Encoding> all = {Encoding::F32, Encoding::Q8_1, Encoding::BF16};
    return all;
}

Encoding encoding_from_name(const std::string& name) {
    std::string supported;
    for (Encoding e : encodings()) {
        if (name == encoding_name(e)) return e;
        supported += (supported.empty() ? "" : ", ") + std::string(encoding_name(e));
    }
    throw FormatError("unsupported activation encoding '" + name + "' (supported: " + supported + ")");
}

const char* op_name(Op op) {
    switch (op) {
        case Op::Embed: return "embed";
        case Op::Norm: return "norm";
        case Op::MatMul: return "matmul";
        case Op::Rope: return "rope";
        case Op::Attention: return "attention";
        case Op::FfnActivation: return "ffn_activation";
        case Op::Add: return "add";
        case Op::Softcap: return "softcap";
        case Op::Scale: return "scale";
        case Op::Argmax: return "argmax";
        case Op::Sample: return "sample";
        case Op::PerLayerEmbed: return "per_layer_embed";
        case Op::PerLayerGate: return "per_layer_gate";
        case Op::AddNorm: return "add_norm";
        case Op::GateUp: return "gate_up";
        case Op::Qkv: return "qkv";
        case Op::MoeRoute: return "moe_route";
        case Op::MoeExperts: return "moe_experts";
        case Op::MoeSharedGate: return "moe_shared_gate";
        case Op::QkNormRope: return "qk_norm_rope";
        case Op::AttentionMla: return "attention_mla";
    }
    return "?";
}

std::string feature_names(FeatureMask features) {
    static const std::pair<FeatureMask, const char*> names[] = {
#define KCAP_FEATURE_NAME(NAME, TEXT) {k##NAME, #TEXT},
        KCAP_FEATURES(KCAP_FEATURE_NAME)
#undef KCAP_FEATURE_NAME
    };
    std::string out;
    for (const auto& [bit, name] : names) {
        if (features & bit) {
            if (!out.empty()) out += ",";
            out += name;
        }
    }
    return out;
}

TokenRange row_tokens(const Row& row, const Stage& stage, const DeviceInfo& device) {
    TokenRange range = row.tokens;
    if (row.tokens_min_of) range.min = std::max(range.min, row.tokens_min_of(stage, device));
    return range;
}

const std::vector<Row>& capability_table() {
    static const std::vector<Row> table = [] {
        std::vector<Row> rows;
        add_cpu_embed_rows(rows);
        add_cpu_norm_rows(rows);
        add_cpu_matmul_rows(rows);
        add_cpu_rope_rows(rows);
        add_cpu_attention_rows(rows);
        add_cpu_activation_rows(rows);
        add_cpu_elementwise_rows(rows);
        add_cpu_ple_rows(rows);
        add_cpu_moe_rows(rows);
        // CUDA: declared whether or not the backend is compiled in.
        add_cuda_embed_rows(rows);
        add_cuda_norm_rows(rows);
        add_cuda_matmul_rows(rows);
        add_cuda_rope_rows(rows);
        add_cuda_attention_rows(rows);
        add_cuda_activation_rows(rows);
        add_cuda_elementwise_rows(rows);
        add_cuda_argmax_rows(rows);
        add_cuda_ple_rows(rows);
        add_cuda_moe_rows(rows);
        // Metal: declared in every build, compiled only on Apple (metal/rows.cpp).
        add_metal_rows(rows);
        return rows;
    }();
    return table;
}

static std::string format_list(const std::vector<Format>& formats) {
    std::string out = "{";
    for (size_t i = 0; i < formats.size(); ++i) {
        if (i) out += ",";
        out += format_name(formats[i]);
    }
    return out + "}";
}

std::string rejection_reason(const Row& row, const Stage& stage, const DeviceInfo& device) {
    std::ostringstream why;
    if (row.op != stage.op) return std::string("op ") + op_name(row.op) + " != " + op_name(stage.op);
    for (size_t i = 0; i < stage.operands.size(); ++i) {
        const TensorRef* operand = stage.operands[i];
        if (!operand) continue;
        if (i >= row.operand_formats.size()) {
            why << "has no operand " << i << " (" << operand->name << ")";
            return why.str();
        }
        const auto& allowed = row.operand_formats[i];
        if (std::find(allowed.begin(), allowed.end(), operand->format) == allowed.end()) {
            why << "operand " << i << " (" << operand->name << ") is " << format_name(operand->format)
                << ", row decodes " << format_list(allowed);
            return why.str();
        }
    }
    if ((stage.op == Op::Attention || stage.op == Op::AttentionMla) &&
        std::find(row.kv_formats.begin(), row.kv_formats.end(), stage.kv_format) == row.kv_formats.end()) {
        why << "KV cache type " << format_name(stage.kv_format) << " not in " << format_list(row.kv_formats);
        return why.str();
    }
    if (row.input_encoding != Encoding::F32 && row.input_encoding != stage.input_encoding) {
        why << "rounds its input to " << encoding_name(row.input_encoding) << "; the plan keeps "
            << encoding_name(stage.input_encoding) << " activations (activations=" << encoding_name(stage.input_encoding)
            << ")";
        return why.str();
    }
    FeatureMask missing = stage.features & ~row.features;
    if (missing) return "lacks features: " + feature_names(missing);
    if (row.requires_any && !(stage.features & row.requires_any))
        return "takes only stages with one of: " + feature_names(row.requires_any);
    if ((stage.features & row.requires_all) != row.requires_all)
        return "takes only stages with: " + feature_names(row.requires_all);
    const LegalDims& dims = row.dims;
    // K, and the second matmul's inner dimension of a stage that has one (k2: the experts' down
    // projection, operand 2), against the row's multiple and the block of each weight operand
    // multiplied along it (a Q4_K gate and up with a Q8_0 down of 1408-value rows are a
    // DeepSeek-V2-Lite Q4_K_M file's experts).
    const int64_t inner[] = {stage.k, stage.k2};
    for (size_t i = 0; i < 2; ++i) {
        const int64_t k = inner[i];
        if (i == 1 && k == 0) continue;
        if (k % dims.k_multiple != 0) {
            why << "K=" << k << " is not a multiple of " << dims.k_multiple;
            return why.str();
        }
        if (!dims.k_multiple_of) continue;
        for (size_t j = 0; j < stage.operands.size(); ++j) {
            const TensorRef* operand = stage.operands[j];
            const bool along_k2 = stage.op == Op::MoeExperts && j == 2;
            const bool qkv_bias = stage.op == Op::Qkv && j >= 3;  // vectors of n, not multiplied along K
            if (!operand || qkv_bias || along_k2 != (i == 1) || k % dims.k_multiple_of(operand->format) == 0) continue;
            why << "K=" << k << " is not a multiple of " << dims.k_multiple_of(operand->format) << " ("
                << operand->name << " is " << format_name(operand->format) << ")";
            return why.str();
        }
    }
    if (dims.max_experts && stage.params.n_expert > dims.max_experts) {
        why << stage.params.n_expert << " experts exceed " << dims.max_experts;
        return why.str();
    }
    if (dims.max_experts_used && stage.params.n_expert_used > dims.max_experts_used) {
        why << stage.params.n_expert_used << " experts per token exceed " << dims.max_experts_used;
        return why.str();
    }
    if (stage.k < dims.k_min) {
        why << "K=" << stage.k << " is below " << dims.k_min;
        return why.str();
    }
    if (dims.k_max && stage.k > dims.k_max) {
        why << "K=" << stage.k << " exceeds " << dims.k_max;
        return why.str();
    }
    if (stage.n % dims.n_multiple != 0) {
        why << "N=" << stage.n << " is not a multiple of " << dims.n_multiple;
        return why.str();
    }
    if (dims.max_head_dim && (stage.params.head_dim > dims.max_head_dim ||
                              stage.params.head_dim_v > dims.max_head_dim)) {
        why << "head_dim " << stage.params.head_dim << "/" << stage.params.head_dim_v << " exceeds "
            << dims.max_head_dim;
        return why.str();
    }
    if (stage.op == Op::Attention && stage.params.head_dim_v % dims.head_dim_v_multiple != 0) {
        why << "head_dim_v " << stage.params.head_dim_v << " is not a multiple of " << dims.head_dim_v_multiple;
        return why.str();
    }
    if (!dims.head_dims.empty() &&
        (stage.params.head_dim != stage.params.head_dim_v ||
         std::find(dims.head_dims.begin(), dims.head_dims.end(), stage.params.head_dim) == dims.head_dims.end())) {
        why << "head_dim " << stage.params.head_dim << "/" << stage.params.head_dim_v << " is not one of ";
        for (size_t i = 0; i < dims.head_dims.size(); ++i) why << (i ? ", " : "") << dims.head_dims[i];
        why << " (with head_dim_v == head_dim)";
        return why.str();
    }
    // An attention that owns its rope rotates whole heads from a table of head_dim / 2 pairs.
    if (stage.op == Op::Attention && (stage.features & (kRopeNormal | kRopeNeox)) &&
        stage.params.rope_dim != stage.params.head_dim) {
        why << "its rope rotates whole heads: rope_dim " << stage.params.rope_dim << " != head_dim "
            << stage.params.head_dim;
        return why.str();
    }
    if (stage.op == Op::Attention && (stage.features & kRopeNeox) && !dims.neox_head_dims.empty() &&
        std::find(dims.neox_head_dims.begin(), dims.neox_head_dims.end(), stage.params.head_dim) ==
            dims.neox_head_dims.end()) {
        why << "its NeoX rope pairs the halves of head_dim ";
        for (size_t i = 0; i < dims.neox_head_dims.size(); ++i) why << (i ? ", " : "") << dims.neox_head_dims[i];
        why << " only, not " << stage.params.head_dim;
        return why.str();
    }
    if (dims.max_span && stage.max_span > dims.max_span) {
        why << "attention span " << stage.max_span << " exceeds " << dims.max_span;
        return why.str();
    }
    if (dims.reject_of) {
        std::string reason = dims.reject_of(stage);
        if (!reason.empty()) return reason;
    }
    if (dims.min_sm_version && device.sm_version < dims.min_sm_version) {
        why << "needs sm_" << dims.min_sm_version << " or newer; " << device.name << " is sm_" << device.sm_version;
        return why.str();
    }
    if (dims.shared_bytes_of && dims.shared_bytes_of(stage) > device.shared_optin_bytes) {
        why << "needs " << dims.shared_bytes_of(stage) << " bytes of threadgroup memory; " << device.name << " allows "
            << device.shared_optin_bytes;
        return why.str();
    }
    return "";
}

}  // namespace kcap
