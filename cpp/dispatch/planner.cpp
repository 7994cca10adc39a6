// Builds the stage list of a forward pass from a ModelSpec and routes each stage to a row.
#include "dispatch/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "kcap/errors.h"

namespace kcap {

namespace {
std::string lowercase_name(std::string s) {
    for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}
}  // namespace

const char* buffer_name(Buffer buffer) {
    switch (buffer) {
        case Buffer::None: return "-";
        case Buffer::Residual: return "residual";
        case Buffer::Normed: return "normed";
        case Buffer::Q: return "q";
        case Buffer::K: return "k";
        case Buffer::V: return "v";
        case Buffer::Attn: return "attn";
        case Buffer::Proj: return "proj";
        case Buffer::Gate: return "gate";
        case Buffer::Up: return "up";
        case Buffer::Act: return "act";
        case Buffer::PerLayer: return "per_layer";
        case Buffer::Routing: return "routing";
        case Buffer::Proj2: return "proj2";
        case Buffer::Logits: return "logits";
    }
    return "?";
}

std::string describe_formats(const Stage& stage) {
    static const char* matmul_roles[] = {"W", "bias"};
    static const char* norm_roles[] = {"weight", "bias"};
    std::ostringstream out;
    for (size_t i = 0; i < stage.operands.size(); ++i) {
        const TensorRef* operand = stage.operands[i];
        if (!operand) continue;
        static const char* add_norm_roles[] = {"post_weight", "post_bias", "weight", "bias"};
        static const char* gate_up_roles[] = {"W_gate", "W_up"};
        static const char* qkv_roles[] = {"W_q", "W_k", "W_v", "q_bias", "k_bias", "v_bias"};
        static const char* latent_pair_roles[] = {"W_q", "W_kv_a"};  // a qkv of two: the latent attention's
        static const char* qk_norm_rope_roles[] = {"q_norm", "k_norm", "freq_factors", "sinks"};
        static const char* mla_roles[] = {"kv_a_norm", "W_k_b", "W_v_b", "freq_factors"};
        static const char* experts_roles[] = {"W_gate_exps", "W_up_exps", "W_down_exps", "gate_bias", "up_bias",
                                              "down_bias"};
        const char* role = stage.op == Op::Norm      ? norm_roles[std::min<size_t>(i, 1)]
                           : stage.op == Op::AddNorm ? add_norm_roles[std::min<size_t>(i, 3)]
                           : stage.op == Op::GateUp  ? gate_up_roles[std::min<size_t>(i, 1)]
                           : stage.op == Op::Qkv && stage.operands.size() == 2
                               ? latent_pair_roles[std::min<size_t>(i, 1)]
                           : stage.op == Op::Qkv     ? qkv_roles[std::min<size_t>(i, 5)]
                           : stage.op == Op::QkNormRope || stage.op == Op::Attention
                               ? qk_norm_rope_roles[std::min<size_t>(i, 3)]
                           : stage.op == Op::Rope ? "freq_factors"
                           : stage.op == Op::AttentionMla
                               ? (i == 1 && (stage.features & kMlaKvBCombined) ? "W_kv_b" : mla_roles[std::min<size_t>(i, 3)])
                           : stage.op == Op::MoeRoute
                               ? (i == 0   ? "W_router"
                                  : i == 1 ? "expert_scale"
                                  : i == 2 ? "bias"
                                  : i == 3 ? "choice_bias"
                                           : "norm_weight")
                           : stage.op == Op::MoeExperts && (stage.features & kExpertGateUpMerged) && i < 2
                               ? "W_gate_up_exps"
                           : stage.op == Op::MoeExperts ? experts_roles[std::min<size_t>(i, 5)]
                           : stage.op == Op::MoeSharedGate ? "W_gate"
                           : stage.op == Op::PerLayerEmbed ? (i == 0 ? "table" : i == 1 ? "proj" : "norm")
                                                  : matmul_roles[std::min<size_t>(i, 1)];
        if (out.tellp() > 0) out << " ";
        out << role << "=" << format_name(operand->format);
    }
    if (stage.op == Op::Attention || stage.op == Op::AttentionMla)
        out << (out.tellp() > 0 ? " " : "") << "kv=" << format_name(stage.kv_format);
    return out.str();
}

std::string describe_dims(const Stage& stage) {
    std::ostringstream out;
    switch (stage.op) {
        case Op::MatMul:
        case Op::GateUp: out << "K=" << stage.k << " N=" << stage.n; break;
        case Op::Qkv:
            out << "K=" << stage.k << " N=" << stage.n << "/" << stage.operands[1]->n_rows();
            if (stage.operands.size() > 2) out << "/" << stage.operands[2]->n_rows();
            break;
        case Op::Norm: out << "n=" << stage.k << " groups=" << stage.groups; break;
        case Op::MoeRoute:
            out << "K=" << stage.k << " experts=" << stage.params.n_expert << " used=" << stage.params.n_expert_used;
            if (stage.params.n_expert_groups > 1)
                out << " groups=" << stage.params.n_expert_groups_used << "/" << stage.params.n_expert_groups;
            break;
        case Op::MoeExperts:
            out << "K=" << stage.k << " ff=" << stage.k2 << " experts=" << stage.params.n_expert
                << " used=" << stage.params.n_expert_used;
            break;
        case Op::PerLayerEmbed: out << "K=" << stage.k << " N=" << stage.n << " layers=" << stage.groups; break;
        case Op::Rope:
        case Op::QkNormRope:
            out << "heads=" << stage.params.n_head << "/" << stage.params.n_head_kv
                << " head_dim=" << stage.params.head_dim << " rope_dim=" << stage.params.rope_dim;
            if (stage.params.rope_yarn.factor > 0.0f) out << " yarn=" << stage.params.rope_yarn.factor;
            break;
        case Op::Attention:
            out << "heads=" << stage.params.n_head << "/" << stage.params.n_head_kv
                << " head_dim=" << stage.params.head_dim << "/" << stage.params.head_dim_v
                << " span=" << stage.max_span;
            if (stage.params.sliding_window) out << " window=" << stage.params.sliding_window;
            if (stage.features & (kRopeNormal | kRopeNeox)) out << " rope_dim=" << stage.params.rope_dim;
            if ((stage.features & (kRopeNormal | kRopeNeox)) && stage.params.rope_yarn.factor > 0.0f)
                out << " yarn=" << stage.params.rope_yarn.factor;
            break;
        case Op::AttentionMla:
            out << "heads=" << stage.params.n_head << " head_dim=" << stage.params.head_dim << "/"
                << stage.params.head_dim_v << " kv_lora=" << stage.params.kv_lora_rank
                << " rope_dim=" << stage.params.rope_dim << " span=" << stage.max_span;
            if (stage.params.rope_yarn.factor > 0.0f) out << " yarn=" << stage.params.rope_yarn.factor;
            break;
        default: out << "n=" << stage.n; break;
    }
    return out.str();
}

namespace {

// Collects the stages in execution order with shared defaults filled in.
class StageBuilder {
public:
    StageBuilder(const ModelSpec& spec, const PlanOptions& options) : spec_(spec), options_(options) {}

    std::vector<Stage> build() {
        if (spec_.layers.empty()) throw ModelError("model has no layers");
        if (spec_.n_embd <= 0 || spec_.n_vocab <= 0) throw ModelError("model has no embedding size or vocabulary");
        add_embedding();
        add_per_layer_embedding();
        for (size_t i = 0; i < spec_.layers.size(); ++i) add_layer(static_cast<int>(i), spec_.layers[i]);
        add_head();
        return std::move(stages_);
    }

private:
    Stage& add(int layer, const std::string& name, Op op) {
        stages_.emplace_back();
        Stage& stage = stages_.back();
        stage.layer = layer;
        stage.name = name;
        stage.op = op;
        return stage;
    }

    const TensorRef* tensor(const std::string& name) const { return spec_.optional_tensor(name); }

    // The weight W[N, K] of a matmul must have rows of K elements and N rows.
    void check_matrix(int layer, const TensorRef& w, int64_t k, int64_t n) const {
        if (w.row_length() != k || w.n_rows() != n) {
            std::ostringstream why;
            why << "layer " << layer << ": tensor '" << w.name << "' has shape [" << w.row_length() << ", "
                << w.n_rows() << "], expected [" << k << ", " << n << "]";
            throw ModelError(why.str());
        }
    }

    void check_vector(const TensorRef* t, int64_t n) const {
        if (t && (t->row_length() != n || t->n_rows() != 1))
            throw ModelError("tensor '" + t->name + "' has " + std::to_string(t->row_length()) +
                             " elements, expected " + std::to_string(n));
    }

    void add_norm(int layer, const std::string& name, const std::string& weight, const std::string& bias,
                  Buffer in, Buffer out, int64_t width, int64_t groups, NormKind kind) {
        Stage& stage = add(layer, name, Op::Norm);
        const TensorRef* w = tensor(weight);
        const TensorRef* b = tensor(bias);
        check_vector(w, width);
        check_vector(b, width);
        stage.operands = {w, b};
        stage.input = in;
        stage.output = out;
        stage.k = width;
        stage.n = width * groups;
        stage.groups = groups;
        stage.params.eps = spec_.norm_eps;
        stage.features = (kind == NormKind::RMS ? kRmsNorm : kLayerNorm) | (b ? FeatureMask(kBias) : 0u) |
                         (w ? 0u : FeatureMask(kParameterFreeNorm));
    }

    void add_matmul(int layer, const std::string& name, const std::string& weight, const std::string& bias,
                    Buffer in, Buffer out, int64_t k, int64_t n) {
        Stage& stage = add(layer, name, Op::MatMul);
        const TensorRef& w = spec_.tensor(weight);
        check_matrix(layer, w, k, n);
        const TensorRef* b = tensor(bias);
        check_vector(b, n);
        stage.operands = {&w, b};
        stage.input = in;
        stage.output = out;
        stage.k = k;
        stage.n = n;
        stage.features = b ? FeatureMask(kBias) : 0u;
        stage.input_encoding = options_.activations;
    }

    void add_embedding() {
        Stage& stage = add(-1, "token_embd", Op::Embed);
        const TensorRef& table = spec_.tensor(spec_.token_embd);
        if (table.row_length() != spec_.n_embd || table.n_rows() != spec_.n_vocab)
            throw ModelError("token_embd has shape [" + std::to_string(table.row_length()) + ", " +
                             std::to_string(table.n_rows()) + "], expected [" + std::to_string(spec_.n_embd) +
                             ", " + std::to_string(spec_.n_vocab) + "]");
        const TensorRef* positions = tensor(spec_.position_embd);
        if (positions && (positions->row_length() != spec_.n_embd || positions->n_rows() < options_.n_ctx))
            throw ModelError("position_embd has shape [" + std::to_string(positions->row_length()) + ", " +
                             std::to_string(positions->n_rows()) + "]; it needs " + std::to_string(spec_.n_embd) +
                             " columns and a row for each of the " + std::to_string(options_.n_ctx) +
                             " context positions");
        stage.operands = {&table, positions};
        stage.output = Buffer::Residual;
        stage.k = spec_.n_embd;
        stage.n = spec_.n_embd;
        stage.params.scale = spec_.embed_scale;
        stage.features = (spec_.embed_scale != 1.0f ? FeatureMask(kEmbedScale) : 0u) |
                         (positions ? FeatureMask(kPositionEmbedding) : 0u);
    }

    void add_layer(int il, const LayerSpec& layer) {
        const int64_t d = spec_.n_embd;
        if (layer.n_head <= 0 || layer.n_head_kv <= 0 || layer.head_dim <= 0 || layer.head_dim_v <= 0)
            throw ModelError("layer " + std::to_string(il) + ": head counts and head dims must be positive");
        if (layer.n_head % layer.n_head_kv != 0)
            throw ModelError("layer " + std::to_string(il) + ": " + std::to_string(layer.n_head) +
                             " query heads are not a multiple of " + std::to_string(layer.n_head_kv) + " KV heads");
        const int64_t attn_width = int64_t(layer.n_head) * layer.head_dim_v;

        add_norm(il, "attn_norm", layer.attn_norm, layer.attn_norm_bias, Buffer::Residual, Buffer::Normed, d, 1,
                 spec_.norm_kind);
        if (layer.kv_lora_rank > 0)
            add_mla_attention(il, layer);
        else
            add_attention(il, layer);

        add_matmul(il, "attn_output", layer.wo, layer.bo, Buffer::Attn, Buffer::Proj, attn_width, d);
        if (!layer.post_attn_norm.empty())
            add_norm(il, "post_attention_norm", layer.post_attn_norm, "", Buffer::Proj, Buffer::Proj, d, 1,
                     spec_.norm_kind);
        add_residual(il, "attn_residual", layer.residual_scale);

        add_norm(il, "ffn_norm", layer.ffn_norm, layer.ffn_norm_bias, Buffer::Residual, Buffer::Normed, d, 1,
                 spec_.norm_kind);
        if (layer.n_expert > 0 && layer.expert_dense_branch) {
            // The dense FFN and the experts side by side (Gemma 4): the dense branch into Proj,
            // the experts (reading their own norm of the residual) into Proj2, each normed, then
            // added into Proj.
            add_dense_ffn(il, layer);
            if (!layer.ffn_post_norm_1.empty())
                add_norm(il, "post_ffw_norm_1", layer.ffn_post_norm_1, "", Buffer::Proj, Buffer::Proj, d, 1,
                         spec_.norm_kind);
            add_experts(il, layer, Buffer::Proj2);
            if (!layer.ffn_post_norm_2.empty())
                add_norm(il, "post_ffw_norm_2", layer.ffn_post_norm_2, "", Buffer::Proj2, Buffer::Proj2, d, 1,
                         spec_.norm_kind);
            Stage& sum = add(il, "ffn_branch_add", Op::Add);
            sum.input = Buffer::Proj;
            sum.input2 = Buffer::Proj2;
            sum.output = Buffer::Proj;
            sum.k = sum.n = d;
        } else if (layer.n_expert > 0) {
            add_experts(il, layer, Buffer::Proj);
        } else {
            add_dense_ffn(il, layer);
        }
        if (!layer.post_ffn_norm.empty())
            add_norm(il, "post_ffw_norm", layer.post_ffn_norm, "", Buffer::Proj, Buffer::Proj, d, 1, spec_.norm_kind);
        add_residual(il, "ffn_residual", layer.residual_scale);

        if (!layer.ple_gate.empty()) add_per_layer_input(il, layer);
        if (layer.output_scale != 1.0f) {
            Stage& scale = add(il, "layer_output_scale", Op::Scale);
            scale.input = scale.output = Buffer::Residual;
            scale.k = scale.n = d;
            scale.params.scale = layer.output_scale;
            scale.features = kLayerOutputScale;
        }
    }

    // Q, K and V projections, their norms, the rope and the attention, into Attn.
    void add_attention(int il, const LayerSpec& layer) {
        const int64_t d = spec_.n_embd;
        const int64_t q_width = int64_t(layer.n_head) * layer.head_dim;
        const int64_t k_width = int64_t(layer.n_head_kv) * layer.head_dim;
        const int64_t v_width = int64_t(layer.n_head_kv) * layer.head_dim_v;
        const int64_t attn_width = int64_t(layer.n_head) * layer.head_dim_v;
        add_matmul(il, "attn_q", layer.wq, layer.bq, Buffer::Normed, Buffer::Q, d, q_width);
        const bool shared_kv = layer.kv_source_layer >= 0;
        if (shared_kv) check_kv_source(il, layer);
        if (!shared_kv) {
            add_matmul(il, "attn_k", layer.wk, layer.bk, Buffer::Normed, Buffer::K, d, k_width);
            add_matmul(il, "attn_v", layer.wv, layer.bv, Buffer::Normed, Buffer::V, d, v_width);
        }
        // The V norm (Gemma 4: an RMS norm of each head without weights) reads and writes V only,
        // so it goes before the QK-norms: those and the rope stay adjacent for their fusion
        // (qk_norm_rope, then into the attention).
        if (layer.v_norm && !shared_kv)
            add_norm(il, "attn_v_norm", "", "", Buffer::V, Buffer::V, layer.head_dim_v, layer.n_head_kv, NormKind::RMS);
        // QK-norm is an RMS norm over each head in every family that has it.
        if (!layer.q_norm.empty())
            add_norm(il, "attn_q_norm", layer.q_norm, "", Buffer::Q, Buffer::Q, layer.head_dim, layer.n_head,
                     NormKind::RMS);
        if (!layer.k_norm.empty() && !shared_kv)
            add_norm(il, "attn_k_norm", layer.k_norm, "", Buffer::K, Buffer::K, layer.head_dim, layer.n_head_kv,
                     NormKind::RMS);
        if (layer.rope_style != RopeStyle::None) {
            check_rope(il, layer);
            Stage& rope = add(il, "rope", Op::Rope);
            const TensorRef* factors = tensor(layer.rope_freqs);
            check_vector(factors, layer.rope_dim / 2);
            rope.operands = {factors};
            rope.input = Buffer::Q;
            rope.input2 = shared_kv ? Buffer::None : Buffer::K;  // shared K was rotated by its layer
            rope.k = layer.head_dim;
            rope.n = q_width;
            rope.params.n_head = layer.n_head;
            rope.params.n_head_kv = layer.n_head_kv;
            rope.params.head_dim = layer.head_dim;
            rope.params.rope_dim = layer.rope_dim;
            rope.params.rope_base = layer.rope_base;
            rope.params.rope_freq_scale = layer.rope_freq_scale;
            rope.params.rope_yarn = layer.rope_yarn;
            rope.features = (layer.rope_style == RopeStyle::NeoX ? kRopeNeox : kRopeNormal) |
                            (layer.rope_dim < layer.head_dim ? FeatureMask(kPartialRotary) : 0u) | (factors ? FeatureMask(kRopeFreqFactors) : 0u);
        }
        Stage& attn = add(il, "attention", Op::Attention);
        attn.input = Buffer::Q;
        attn.input2 = shared_kv ? Buffer::None : Buffer::K;
        attn.input3 = shared_kv ? Buffer::None : Buffer::V;
        attn.params.kv_layer = layer.kv_source_layer;
        attn.output = Buffer::Attn;
        attn.k = layer.head_dim;
        attn.n = attn_width;
        attn.params.n_head = layer.n_head;
        attn.params.n_head_kv = layer.n_head_kv;
        attn.params.head_dim = layer.head_dim;
        attn.params.head_dim_v = layer.head_dim_v;
        attn.params.sliding_window = layer.sliding_window;
        attn.params.softcap = layer.attn_softcap;
        attn.params.scale = layer.attn_scale > 0 ? layer.attn_scale : 1.0f / std::sqrt(float(layer.head_dim));
        attn.kv_format = options_.kv_format;
        attn.max_span = layer.sliding_window > 0 ? std::min<int64_t>(layer.sliding_window, options_.n_ctx)
                                                 : options_.n_ctx;
        attn.features = (layer.sliding_window > 0 ? FeatureMask(kSlidingWindow) : 0u) | (layer.attn_softcap > 0 ? FeatureMask(kAttnSoftcap) : 0u) |
                        (layer.n_head != layer.n_head_kv ? FeatureMask(kGqa) : 0u) |
                        (shared_kv ? FeatureMask(kKvShared) : 0u);
        if (const TensorRef* sinks = tensor(layer.attn_sinks)) {
            // Operand 3 (after a fused rope's q_norm, k_norm and freq_factors): a logit per head.
            check_vector(sinks, layer.n_head);
            if (sinks->format != Format::F32)
                throw ModelError("layer " + std::to_string(il) + ": tensor '" + sinks->name + "' must be F32, it is " +
                                 format_name(sinks->format));
            attn.operands = {nullptr, nullptr, nullptr, sinks};
            attn.features |= kSinks;
        }
    }

    void check_rope(int il, const LayerSpec& layer) const {
        if (layer.rope_dim <= 0 || layer.rope_dim > layer.head_dim || layer.rope_dim % 2)
            throw ModelError("layer " + std::to_string(il) + ": rope_dim " + std::to_string(layer.rope_dim) +
                             " must be even and within head_dim " + std::to_string(layer.head_dim));
        const RopeYarn& yarn = layer.rope_yarn;
        if (yarn.factor > 0.0f && (yarn.original_context <= 0 || !(yarn.beta_fast > 0.0f) || !(yarn.beta_slow > 0.0f) ||
                                   !(yarn.attn_factor > 0.0f) || layer.rope_freq_scale != 1.0f))
            throw ModelError("layer " + std::to_string(il) + ": YaRN rope scaling needs an original context, positive " +
                             "betas and attention factor, and no linear scaling besides");
    }

    // Multi-head latent attention (LayerSpec::kv_lora_rank), into Attn: the query (through its
    // low-rank path where the layer has one: attn_q_a into Gate, its RMS norm, attn_q_b) into Q,
    // the compressed KV row (latent and rope key) into K, then attention_mla, which norms and
    // rotates that row, caches it and attends with the up-projections absorbed.
    void add_mla_attention(int il, const LayerSpec& layer) {
        const int64_t d = spec_.n_embd;
        const std::string where = "layer " + std::to_string(il) + ": multi-head latent attention ";
        const int64_t lora = layer.kv_lora_rank, rope = layer.rope_dim, nope = layer.head_dim - layer.rope_dim;
        const int64_t heads = layer.n_head, dv = layer.head_dim_v;
        if (layer.rope_style == RopeStyle::None || nope <= 0)
            throw ModelError(where + "needs a rope part (rope_dim " + std::to_string(rope) +
                             ") smaller than the query head (head_dim " + std::to_string(layer.head_dim) + ")");
        check_rope(il, layer);
        if (layer.sliding_window > 0 || layer.kv_source_layer >= 0 || layer.attn_softcap > 0 ||
            !layer.attn_sinks.empty() || !layer.q_norm.empty() || !layer.k_norm.empty() || layer.v_norm ||
            !layer.wk.empty() || !layer.wv.empty() || !layer.bk.empty() || !layer.bv.empty())
            throw ModelError(where + "takes no sliding window, shared KV, softcap, sinks, QK/V norms or K/V "
                                     "projections of a standard attention");
        const int64_t q_width = heads * layer.head_dim;
        if (!layer.wq_a.empty()) {
            if (!layer.wq.empty() || layer.wq_b.empty() || layer.q_a_norm.empty())
                throw ModelError(where + "takes either wq or the low-rank query wq_a, q_a_norm and wq_b");
            const int64_t q_rank = spec_.tensor(layer.wq_a).n_rows();
            // The compressed KV row right after the query's first matmul: both read the normed
            // row (fuse_qkv makes them one launch).
            add_matmul(il, "attn_q_a", layer.wq_a, "", Buffer::Normed, Buffer::Gate, d, q_rank);
            add_matmul(il, "attn_kv_a_mqa", layer.wkv_a, "", Buffer::Normed, Buffer::K, d, lora + rope);
            add_norm(il, "attn_q_a_norm", layer.q_a_norm, "", Buffer::Gate, Buffer::Gate, q_rank, 1, NormKind::RMS);
            add_matmul(il, "attn_q_b", layer.wq_b, "", Buffer::Gate, Buffer::Q, q_rank, q_width);
        } else {
            add_matmul(il, "attn_q", layer.wq, layer.bq, Buffer::Normed, Buffer::Q, d, q_width);
            add_matmul(il, "attn_kv_a_mqa", layer.wkv_a, "", Buffer::Normed, Buffer::K, d, lora + rope);
        }
        const TensorRef& norm = spec_.tensor(layer.kv_a_norm);
        check_vector(&norm, lora);
        const bool combined = !layer.wkv_b.empty();
        if (combined == (!layer.wk_b.empty() || !layer.wv_b.empty()) || (!combined && (layer.wk_b.empty() || layer.wv_b.empty())))
            throw ModelError(where + "takes either wkv_b or both wk_b and wv_b");
        const TensorRef* kb = nullptr;
        const TensorRef* vb = nullptr;
        if (combined) {
            kb = &spec_.tensor(layer.wkv_b);
            check_matrix(il, *kb, lora, heads * (nope + dv));
        } else {
            kb = &spec_.tensor(layer.wk_b);
            vb = &spec_.tensor(layer.wv_b);
            check_stacked(il, *kb, nope, lora, heads, "(query part, latent, heads)");
            check_stacked(il, *vb, lora, dv, heads, "(latent, value head, heads)");
        }
        if (norm.format != Format::F32)
            throw ModelError("layer " + std::to_string(il) + ": tensor '" + norm.name + "' must be F32, it is " +
                             format_name(norm.format));
        const TensorRef* factors = tensor(layer.rope_freqs);
        check_vector(factors, rope / 2);
        Stage& attn = add(il, "attention_mla", Op::AttentionMla);
        attn.operands = {&norm, kb, vb, factors};
        attn.input = Buffer::Q;
        attn.input2 = Buffer::K;
        attn.output = Buffer::Attn;
        attn.k = layer.head_dim;
        attn.n = heads * dv;
        attn.params.n_head = layer.n_head;
        attn.params.n_head_kv = 1;  // one latent row per token, read by every head
        attn.params.head_dim = layer.head_dim;
        attn.params.head_dim_v = layer.head_dim_v;
        attn.params.kv_lora_rank = layer.kv_lora_rank;
        attn.params.rope_dim = layer.rope_dim;
        attn.params.rope_base = layer.rope_base;
        attn.params.rope_freq_scale = layer.rope_freq_scale;
        attn.params.rope_yarn = layer.rope_yarn;
        attn.params.eps = spec_.norm_eps;
        attn.params.scale = layer.attn_scale > 0 ? layer.attn_scale : 1.0f / std::sqrt(float(layer.head_dim));
        attn.kv_format = options_.kv_format;
        attn.max_span = options_.n_ctx;
        attn.features = (layer.rope_style == RopeStyle::NeoX ? kRopeNeox : kRopeNormal) | kRmsNorm |
                        (factors ? FeatureMask(kRopeFreqFactors) : 0u) | (combined ? FeatureMask(kMlaKvBCombined) : 0u);
    }

    // A stack of one matrix per head, [row length, rows, heads] in GGUF order.
    void check_stacked(int il, const TensorRef& t, int64_t row_length, int64_t rows, int64_t heads,
                       const char* meaning) const {
        if (t.shape.size() != 3 || t.shape[0] != row_length || t.shape[1] != rows || t.shape[2] != heads)
            throw ModelError("layer " + std::to_string(il) + ": tensor '" + t.name + "' has shape " + shape_text(t) +
                             ", expected [" + std::to_string(row_length) + ", " + std::to_string(rows) + ", " +
                             std::to_string(heads) + "] " + meaning);
    }

    // act(gate(x)) * up(x) (or act(up(x))), then down, into Proj.
    void add_dense_ffn(int il, const LayerSpec& layer) {
        const int64_t d = spec_.n_embd;
        const TensorRef& up = spec_.tensor(layer.ffn_up);
        const int64_t n_ff = up.n_rows();
        if (layer.gated_ffn) add_matmul(il, "ffn_gate", layer.ffn_gate, "", Buffer::Normed, Buffer::Gate, d, n_ff);
        add_matmul(il, "ffn_up", layer.ffn_up, layer.ffn_up_bias, Buffer::Normed, Buffer::Up, d, n_ff);
        Stage& act = add(il, "ffn_act", Op::FfnActivation);
        act.input = layer.gated_ffn ? Buffer::Gate : Buffer::Up;
        act.input2 = layer.gated_ffn ? Buffer::Up : Buffer::None;
        act.output = Buffer::Act;
        act.k = n_ff;
        act.n = n_ff;
        act.params.activation = layer.activation;
        act.features = activation_feature(layer.activation) | (layer.gated_ffn ? FeatureMask(kGated) : 0u);
        add_matmul(il, "ffn_down", layer.ffn_down, layer.ffn_down_bias, Buffer::Act, Buffer::Proj, n_ff, d);
    }

    // Mixture of experts, into Proj: the router (ffn_router: ids and weights of the chosen
    // experts per token, into Routing), the chosen experts' gated FFNs weighted and summed
    // (ffn_moe), and a shared expert's FFN (into Proj2) added under its gate (ffn_shexp_gate), or,
    // without a gate, planned first and added by the experts' sum.
    // With expert_dense_branch the experts write `out` (Proj2) and read ffn_pre_norm_2's norm of
    // the residual (ffn_pre_norm_2_norm); a router with ffn_gate_inp_scale reads its own norm of
    // the residual (ffn_router_norm) and scales its logits (expert_logit_scale).
    void add_experts(int il, const LayerSpec& layer, Buffer out) {
        const int64_t d = spec_.n_embd;
        const std::string where = "layer " + std::to_string(il) + ": ";
        if (layer.n_expert_used <= 0 || layer.n_expert_used > layer.n_expert)
            throw ModelError(where + std::to_string(layer.n_expert_used) + " experts used per token of " +
                             std::to_string(layer.n_expert) + " (it must be 1 .. the expert count)");
        if (!layer.gated_ffn) throw ModelError(where + "experts without a gate are not supported");
        const TensorRef& router = spec_.tensor(layer.ffn_gate_inp);
        check_matrix(il, router, d, layer.n_expert);
        const bool merged = !layer.ffn_gate_up_exps.empty();
        if (merged && (!layer.ffn_gate_exps.empty() || !layer.ffn_up_exps.empty()))
            throw ModelError(where + "ffn_gate_up_exps and ffn_gate_exps/ffn_up_exps are alternatives, not both");
        const TensorRef& gate = spec_.tensor(merged ? layer.ffn_gate_up_exps : layer.ffn_gate_exps);
        const TensorRef& up = merged ? gate : spec_.tensor(layer.ffn_up_exps);
        const TensorRef& down = spec_.tensor(layer.ffn_down_exps);
        const int64_t ff = gate.n_rows() / layer.n_expert / (merged ? 2 : 1);
        const int64_t gate_rows = merged ? 2 * ff : ff;
        for (const TensorRef* t : {&gate, &up})
            if (t->shape.size() != 3 || t->row_length() != d || t->shape[1] != gate_rows ||
                t->shape[2] != layer.n_expert)
                throw ModelError(where + "tensor '" + t->name + "' has shape " + shape_text(*t) + ", expected [" +
                                 std::to_string(d) + ", " + std::to_string(gate_rows) + ", " +
                                 std::to_string(layer.n_expert) +
                                 (merged ? "] (n_embd, 2 x expert FFN width, experts)"
                                         : "] (n_embd, expert FFN width, experts)"));
        if (down.shape.size() != 3 || down.row_length() != ff || down.shape[1] != d || down.shape[2] != layer.n_expert)
            throw ModelError(where + "tensor '" + down.name + "' has shape " + shape_text(down) + ", expected [" +
                             std::to_string(ff) + ", " + std::to_string(d) + ", " + std::to_string(layer.n_expert) + "]");
        const bool own_norm = !layer.ffn_gate_inp_scale.empty();
        if (own_norm)
            add_norm(il, "ffn_router_norm", layer.ffn_gate_inp_scale, "", Buffer::Residual, Buffer::Normed, d, 1,
                     NormKind::RMS);
        const TensorRef* expert_scale = tensor(layer.ffn_down_exps_scale);
        check_vector(expert_scale, layer.n_expert);
        if (expert_scale && expert_scale->format != Format::F32)
            throw ModelError(where + "tensor '" + expert_scale->name + "' must be F32, it is " +
                             format_name(expert_scale->format));
        // Biases (gpt-oss): the router's [n_expert]; the experts' gate and up [ff, n_expert], down
        // [n_embd, n_expert]; F32, all three experts' or none.
        const TensorRef* router_bias = tensor(layer.ffn_gate_inp_bias);
        check_vector(router_bias, layer.n_expert);
        const TensorRef* gate_bias = tensor(layer.ffn_gate_exps_bias);
        const TensorRef* up_bias = tensor(layer.ffn_up_exps_bias);
        const TensorRef* down_bias = tensor(layer.ffn_down_exps_bias);
        if (bool(gate_bias) != bool(up_bias) || bool(gate_bias) != bool(down_bias) || (gate_bias && merged))
            throw ModelError(where + "expert biases must be given for gate, up and down together (and not with a "
                                     "merged gate_up)");
        for (const auto& [bias, width] : {std::pair{gate_bias, ff}, std::pair{up_bias, ff}, std::pair{down_bias, d}}) {
            if (!bias) continue;
            if (bias->n_rows() * bias->row_length() != width * layer.n_expert || bias->row_length() != width)
                throw ModelError(where + "tensor '" + bias->name + "' has shape " + shape_text(*bias) + ", expected [" +
                                 std::to_string(width) + ", " + std::to_string(layer.n_expert) + "]");
        }
        for (const TensorRef* bias : {router_bias, gate_bias, up_bias, down_bias})
            if (bias && bias->format != Format::F32)
                throw ModelError(where + "tensor '" + bias->name + "' must be F32, it is " + format_name(bias->format));
        // DeepSeek V3's choice bias [n_expert], F32: it moves which experts are chosen, not their weights.
        const TensorRef* choice_bias = tensor(layer.ffn_exp_probs_b);
        check_vector(choice_bias, layer.n_expert);
        if (choice_bias && choice_bias->format != Format::F32)
            throw ModelError(where + "tensor '" + choice_bias->name + "' must be F32, it is " +
                             format_name(choice_bias->format));
        const bool grouped = layer.expert_group_count > 1;
        if (grouped) {
            const int groups = layer.expert_group_count, used = layer.expert_group_used;
            if (layer.n_expert % groups != 0 || used < 1 || used > groups ||
                layer.n_expert_used > used * (layer.n_expert / groups))
                throw ModelError(where + std::to_string(layer.n_expert) + " experts in " + std::to_string(groups) +
                                 " groups, " + std::to_string(used) + " used, cannot give " +
                                 std::to_string(layer.n_expert_used) +
                                 " experts per token (the groups must divide the experts evenly, 1 .. groups used, "
                                 "and hold enough experts)");
            if (layer.expert_group_score == ExpertGroupScore::TopTwoSum &&
                (layer.expert_gating != ExpertGating::Sigmoid || layer.n_expert / groups < 2))
                throw ModelError(where + "a group scored by its two largest scores needs sigmoid gating and at "
                                         "least two experts per group");
        }
        if (choice_bias && layer.expert_gating != ExpertGating::Sigmoid)
            throw ModelError(where + "a choice bias (" + choice_bias->name + ") needs sigmoid gating");
        // A shared expert without a gate (DeepSeek) runs first, into Proj2, and the experts' sum
        // adds it (kSharedExpertSum): one pass over the output instead of a separate add. Only
        // where it reads the same normed input the experts do (no router or branch norm between).
        const bool shared_first = !layer.ffn_up_shexp.empty() && layer.ffn_gate_inp_shexp.empty() && !own_norm &&
                                  !layer.expert_dense_branch && out == Buffer::Proj;
        if (shared_first) add_shared_expert(il, layer, d);
        Stage& route = add(il, "ffn_router", Op::MoeRoute);
        route.operands = {&router, expert_scale, router_bias, choice_bias};
        route.input = Buffer::Normed;
        route.output = Buffer::Routing;
        route.k = d;
        route.n = 2 * int64_t(layer.n_expert_used);  // ids and weights
        route.params.n_expert = layer.n_expert;
        route.params.n_expert_used = layer.n_expert_used;
        route.params.expert_weights_scale = layer.expert_weights_scale;
        route.params.expert_logit_scale = layer.expert_logit_scale;
        if (grouped) {
            route.params.n_expert_groups = layer.expert_group_count;
            route.params.n_expert_groups_used = layer.expert_group_used;
            route.params.expert_group_score = layer.expert_group_score;
        }
        route.features = (layer.expert_gating == ExpertGating::Sigmoid ? kExpertSigmoid : kExpertSoftmax) |
                         (grouped ? FeatureMask(kExpertGroups) : 0u) | (choice_bias ? FeatureMask(kExpertChoiceBias) : 0u) |
                         (layer.expert_weights_norm ? FeatureMask(kExpertWeightsNorm) : 0u) |
                         (layer.expert_logit_scale != 1.0f ? FeatureMask(kExpertLogitScale) : 0u) |
                         (expert_scale ? FeatureMask(kPerExpertScale) : 0u) | (router_bias ? FeatureMask(kBias) : 0u);
        if (own_norm || layer.expert_dense_branch)
            add_norm(il, layer.expert_dense_branch ? "pre_ffw_norm_2" : "ffn_norm_experts", layer.expert_dense_branch ? layer.ffn_pre_norm_2 : layer.ffn_norm, "",
                     Buffer::Residual, Buffer::Normed, d, 1, spec_.norm_kind);
        Stage& experts = add(il, "ffn_moe", Op::MoeExperts);
        experts.operands = {&gate, &up, &down};
        if (gate_bias) experts.operands.insert(experts.operands.end(), {gate_bias, up_bias, down_bias});
        experts.input = Buffer::Normed;
        experts.input2 = Buffer::Routing;
        experts.output = out;
        experts.k = d;
        experts.k2 = ff;
        experts.n = d;
        experts.params = route.params;
        experts.params.activation = layer.activation;
        experts.params.swiglu_alpha = layer.swiglu_alpha;
        experts.params.swiglu_limit = layer.swiglu_limit;
        experts.input_encoding = options_.activations;  // its matrices' inputs, as a matmul's
        experts.features = activation_feature(layer.activation) | kGated | (merged ? FeatureMask(kExpertGateUpMerged) : 0u) |
                           (gate_bias ? FeatureMask(kBias) : 0u);
        if (shared_first) {
            experts.input3 = Buffer::Proj2;
            experts.features |= kSharedExpertSum;
            return;
        }
        if (layer.ffn_up_shexp.empty()) return;
        if (out != Buffer::Proj) throw ModelError(where + "a shared expert beside a dense FFN branch is not supported");
        add_shared_expert(il, layer, d);
        Stage& combine = add(il, "ffn_shexp_gate", Op::MoeSharedGate);
        const TensorRef* shared_gate = tensor(layer.ffn_gate_inp_shexp);
        check_vector(shared_gate, d);
        combine.operands = {shared_gate};
        combine.input = Buffer::Proj;
        combine.input2 = Buffer::Proj2;
        combine.input3 = Buffer::Normed;
        combine.output = Buffer::Proj;
        combine.k = combine.n = d;
        combine.features = shared_gate ? FeatureMask(kSharedExpertGate) : 0u;
    }

    // The shared expert: a dense gated FFN of its own width, from Normed into Proj2.
    void add_shared_expert(int il, const LayerSpec& layer, int64_t d) {
        const TensorRef& shared_up = spec_.tensor(layer.ffn_up_shexp);
        const int64_t shared_ff = shared_up.n_rows();
        add_matmul(il, "ffn_gate_shexp", layer.ffn_gate_shexp, "", Buffer::Normed, Buffer::Gate, d, shared_ff);
        add_matmul(il, "ffn_up_shexp", layer.ffn_up_shexp, "", Buffer::Normed, Buffer::Up, d, shared_ff);
        Stage& act = add(il, "ffn_shexp_act", Op::FfnActivation);
        act.input = Buffer::Gate;
        act.input2 = Buffer::Up;
        act.output = Buffer::Act;
        act.k = act.n = shared_ff;
        act.params.activation = layer.activation;
        act.features = activation_feature(layer.activation) | kGated;
        add_matmul(il, "ffn_down_shexp", layer.ffn_down_shexp, "", Buffer::Act, Buffer::Proj2, shared_ff, d);
    }

    static std::string shape_text(const TensorRef& t) {
        std::string out = "[";
        for (size_t i = 0; i < t.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(t.shape[i]);
        return out + "]";
    }

    // The source must be an earlier layer that owns its cache and has the same KV geometry.
    void check_kv_source(int il, const LayerSpec& layer) const {
        const int src = layer.kv_source_layer;
        const std::string where = "layer " + std::to_string(il) + ": kv_source_layer " + std::to_string(src);
        if (src >= il) throw ModelError(where + " is not an earlier layer");
        const LayerSpec& source = spec_.layers[size_t(src)];
        if (source.kv_source_layer >= 0) throw ModelError(where + " shares another layer's KV cache itself");
        if (source.n_head_kv != layer.n_head_kv || source.head_dim != layer.head_dim ||
            source.head_dim_v != layer.head_dim_v)
            throw ModelError(where + " has a different KV geometry (heads/head dims)");
    }

    void add_per_layer_embedding() {
        if (spec_.ple_token_embd.empty()) return;
        const int64_t n_layer = int64_t(spec_.layers.size());
        const int64_t per = spec_.n_embd_per_layer;
        if (per <= 0) throw ModelError("per-layer embeddings need n_embd_per_layer > 0");
        const int64_t width = n_layer * per;
        Stage& stage = add(-1, "per_layer_embd", Op::PerLayerEmbed);
        const TensorRef& table = spec_.tensor(spec_.ple_token_embd);
        if (table.row_length() != width || table.n_rows() != spec_.n_vocab)
            throw ModelError("tensor '" + table.name + "' has shape [" + std::to_string(table.row_length()) + ", " +
                             std::to_string(table.n_rows()) + "], expected [" + std::to_string(width) + ", " +
                             std::to_string(spec_.n_vocab) + "]");
        const TensorRef& proj = spec_.tensor(spec_.ple_model_proj);
        check_matrix(-1, proj, spec_.n_embd, width);
        const TensorRef& norm = spec_.tensor(spec_.ple_proj_norm);
        check_vector(&norm, per);
        stage.operands = {&table, &proj, &norm};
        stage.input = Buffer::Residual;
        stage.output = Buffer::PerLayer;
        stage.k = spec_.n_embd;
        stage.n = width;
        stage.groups = n_layer;
        stage.params.eps = spec_.norm_eps;
        stage.params.n_layer = int(n_layer);
        stage.params.ple_token_scale = spec_.ple_token_scale;
        stage.params.ple_model_proj_scale = spec_.ple_model_proj_scale;
        stage.params.ple_combine_scale = spec_.ple_combine_scale;
        stage.features = kPerLayerEmbedding | kRmsNorm;
    }

    // x += ple_post_norm(ple_proj(act(ple_gate(x)) * ple[il]))
    void add_per_layer_input(int il, const LayerSpec& layer) {
        if (spec_.ple_token_embd.empty())
            throw ModelError("layer " + std::to_string(il) + " has a per-layer input gate but the model has no per-layer embeddings");
        const int64_t d = spec_.n_embd;
        const int64_t per = spec_.n_embd_per_layer;
        add_matmul(il, "ple_gate", layer.ple_gate, "", Buffer::Residual, Buffer::Gate, d, per);
        Stage& gate = add(il, "ple_act", Op::PerLayerGate);
        gate.input = Buffer::Gate;
        gate.input2 = Buffer::PerLayer;
        gate.output = Buffer::Act;
        gate.k = int64_t(spec_.layers.size()) * per;  // row stride of the per-layer buffer
        gate.n = per;
        gate.groups = il;  // this layer's slice
        gate.params.activation = layer.activation;
        gate.features = kPerLayerEmbedding | activation_feature(layer.activation);
        add_matmul(il, "ple_proj", layer.ple_proj, "", Buffer::Act, Buffer::Proj, per, d);
        if (!layer.ple_post_norm.empty())
            add_norm(il, "ple_post_norm", layer.ple_post_norm, "", Buffer::Proj, Buffer::Proj, d, 1, spec_.norm_kind);
        add_residual(il, "ple_residual", layer.residual_scale);
    }

    static FeatureMask activation_feature(Activation activation) {
        switch (activation) {
            case Activation::SiLU: return kSilu;
            case Activation::GeluTanh: return kGeluTanh;
            case Activation::GeluErf: return kGeluErf;
            case Activation::ReLU: return kRelu;
            case Activation::SwigluOai: return kSwigluOai;
        }
        return 0;
    }

    // residual += scale * branch output
    void add_residual(int il, const std::string& name, float scale) {
        Stage& stage = add(il, name, Op::Add);
        stage.input = Buffer::Residual;
        stage.input2 = Buffer::Proj;
        stage.output = Buffer::Residual;
        stage.k = stage.n = spec_.n_embd;
        stage.params.scale = scale;
        stage.features = scale != 1.0f ? FeatureMask(kResidualScale) : 0u;
    }

    void add_head() {
        add_norm(-1, "output_norm", spec_.output_norm, spec_.output_norm_bias, Buffer::Residual, Buffer::Normed,
                 spec_.n_embd, 1, spec_.norm_kind);
        add_matmul(-1, "output", spec_.output, "", Buffer::Normed, Buffer::Logits, spec_.n_embd, spec_.n_vocab);
        stages_.back().last_token_only = true;
        if (spec_.final_softcap > 0) {
            Stage& cap = add(-1, "final_softcap", Op::Softcap);
            cap.input = cap.output = Buffer::Logits;
            cap.k = cap.n = spec_.n_vocab;
            cap.params.softcap = spec_.final_softcap;
            cap.last_token_only = true;
        }
        if (spec_.logit_scale != 1.0f) {
            Stage& scale = add(-1, "logit_scale", Op::Scale);
            scale.input = scale.output = Buffer::Logits;
            scale.k = scale.n = spec_.n_vocab;
            scale.params.scale = spec_.logit_scale;
            scale.last_token_only = true;
        }
    }

    const ModelSpec& spec_;
    const PlanOptions& options_;
    std::vector<Stage> stages_;
};

std::string describe_tokens(const TokenRange& range) {
    if (range.max == range.min) return std::to_string(range.min);
    return std::to_string(range.min) + "-" + (range.max ? std::to_string(range.max) : std::string());
}

// The routes of a stage: each candidate row (formats, dims, features fit; not excluded) covers
// its token range clipped to 1 .. max_batch; every elementary interval between the ranges'
// ends takes its highest-priority covering row (the first declared on a tie), and intervals
// with the same row merge. Rejected candidates' reasons go to `rejections`, token counts no
// row takes to `gaps`.
std::vector<Route> plan_routes(const Stage& stage, const PlanOptions& options, std::ostringstream& rejections,
                               std::vector<TokenRange>& gaps) {
    struct Candidate {
        const Row* row;
        TokenRange tokens;
    };
    const int64_t max_batch = std::max(1, options.max_batch);
    std::vector<Candidate> candidates;
    std::vector<int64_t> starts = {1};
    for (const Row& row : capability_table()) {
        if (row.op != stage.op || row.backend != options.backend) continue;
        std::string why;
        if (std::find(options.excluded_kernels.begin(), options.excluded_kernels.end(), row.kernel) !=
            options.excluded_kernels.end())
            why = "excluded by the caller";
        else
            why = rejection_reason(row, stage, options.device);
        if (!why.empty()) {
            rejections << "\n  " << row.kernel << ": " << why;
            continue;
        }
        const TokenRange tokens = row_tokens(row, stage, options.device);
        if (tokens.max && tokens.max < tokens.min) {  // a bound from the stage and device past the row's range
            rejections << "\n  " << row.kernel << ": takes at most " << tokens.max << " tokens per call, and this stage "
                       << "on this device only from " << tokens.min;
            continue;
        }
        if (tokens.min > max_batch) {
            rejections << "\n  " << row.kernel << ": takes " << describe_tokens(tokens)
                       << " tokens per call; calls here have at most " << max_batch;
            continue;
        }
        candidates.push_back({&row, tokens});
        starts.push_back(tokens.min);
        if (tokens.max && tokens.max < max_batch) starts.push_back(tokens.max + 1);
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    std::vector<Route> routes;
    for (size_t i = 0; i < starts.size(); ++i) {
        const int64_t lo = starts[i], hi = i + 1 < starts.size() ? starts[i + 1] - 1 : max_batch;
        const Candidate* best = nullptr;
        for (const Candidate& c : candidates)
            if (c.tokens.contains(lo) && (!best || c.row->priority > best->row->priority)) best = &c;
        if (!best) {
            gaps.push_back({int(lo), int(hi)});
            continue;
        }
        if (!routes.empty() && routes.back().row == best->row && routes.back().tokens.max == lo - 1) {
            routes.back().tokens.max = int(hi);
        } else {
            routes.push_back({{int(lo), int(hi)}, best->row});
        }
    }
    // The last route reaches past max_batch where its row has no bound.
    if (!routes.empty() && gaps.empty()) {
        const Route& last = routes.back();
        for (const Candidate& c : candidates)
            if (c.row == last.row && c.tokens.max == 0) routes.back().tokens.max = 0;
    }
    return routes;
}

// The routes when every token count has a row, else empty.
std::vector<Route> full_routes(const Stage& stage, const PlanOptions& options) {
    std::ostringstream ignored;
    std::vector<TokenRange> gaps;
    std::vector<Route> routes = plan_routes(stage, options, ignored, gaps);
    if (!gaps.empty()) routes.clear();
    return routes;
}

const Row* row_in(const std::vector<Route>& routes, int64_t n) {
    for (const Route& route : routes)
        if (route.tokens.contains(n)) return route.row;
    return nullptr;
}

// Every token count where some route of `lists` changes row: the first of each route.
std::vector<int64_t> route_starts(const std::vector<const std::vector<Route>*>& lists) {
    std::vector<int64_t> starts;
    for (const auto* routes : lists)
        for (const Route& route : *routes) starts.push_back(route.tokens.min);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    return starts;
}

// --- Fusion --------------------------------------------------------------------------------
// A few stage sequences have fused ops (Op::AddNorm, Op::GateUp, Op::QkNormRope, Op::Qkv, and an
// Op::Attention that owns the rope before it). A sequence is replaced by
// its fused stage only where a row of the plan's backend fits that stage (formats, dims,
// features, exclusions); elsewhere the stages stay as they are. Both forms compute the same
// values up to float rounding (an order of summation; for the rope an attention owns, an f16
// cache may then store a K value as the neighbouring half), so fusing is a choice of kernels,
// never of semantics; excluding the fused rows (PlanOptions::excluded_kernels) gives the
// unfused plan.

bool is_row_norm(const Stage& s, Buffer in, Buffer out) {
    return s.op == Op::Norm && s.groups == 1 && s.input == in && s.output == out;
}

// A fused stage replaces its parts only where it has a row for every token count.
bool fits(const Stage& stage, const PlanOptions& options) { return !full_routes(stage, options).empty(); }

// A fused matmul stage keeps the activation encoding of the stages it replaces at every token
// count: its row must round its input as each of theirs would (an exact cuda.qkv for a Q/K/V
// mix with a float format must not replace q8_1 rows for the quantized ones; that would change
// the numbers).
bool fits_keeping_encoding(const Stage& fused, const std::vector<const Stage*>& parts, const PlanOptions& options) {
    const std::vector<Route> routes = full_routes(fused, options);
    if (routes.empty()) return false;
    std::vector<std::vector<Route>> alone;
    std::vector<const std::vector<Route>*> lists = {&routes};
    alone.reserve(parts.size());
    for (const Stage* part : parts) alone.push_back(full_routes(*part, options));
    for (const auto& part : alone) lists.push_back(&part);
    for (const int64_t n : route_starts(lists))
        for (const auto& part : alone) {
            const Row* part_row = row_in(part, n);
            if (part_row && part_row->input_encoding != row_in(routes, n)->input_encoding) return false;
        }
    return true;
}

FeatureMask norm_kind_features(const Stage& norm) { return norm.features & (kRmsNorm | kLayerNorm); }

// [post_norm(proj -> proj)] + add(residual += scale * proj) + norm(residual -> normed)
// -> add_norm. Returns the stages consumed (0: no fusion here).
size_t fuse_add_norm(const std::vector<Stage>& stages, size_t i, const PlanOptions& options, Stage& fused) {
    size_t j = i;
    const Stage* post = nullptr;
    if (is_row_norm(stages[j], Buffer::Proj, Buffer::Proj)) post = &stages[j++];
    if (j + 1 >= stages.size()) return 0;
    const Stage& add = stages[j];
    const Stage& norm = stages[j + 1];
    if (add.op != Op::Add || add.input != Buffer::Residual || add.input2 != Buffer::Proj ||
        add.output != Buffer::Residual || add.last_token_only)
        return 0;
    if (!is_row_norm(norm, Buffer::Residual, Buffer::Normed) || norm.k != add.n) return 0;
    if (post && (norm_kind_features(*post) != norm_kind_features(norm) || post->params.eps != norm.params.eps ||
                 post->k != add.n))
        return 0;
    fused = Stage();
    fused.layer = add.layer;
    fused.name = (post ? post->name + "+" : std::string()) + add.name + "+" + norm.name;
    fused.op = Op::AddNorm;
    fused.operands = {post ? post->operands[0] : nullptr, post ? post->operands[1] : nullptr, norm.operands[0],
                      norm.operands[1]};
    fused.input = Buffer::Residual;
    fused.input2 = Buffer::Proj;
    fused.output = Buffer::Normed;
    fused.k = fused.n = add.n;
    fused.params.eps = norm.params.eps;
    fused.params.scale = add.params.scale;
    fused.features = add.features | norm.features | (post ? post->features | FeatureMask(kPostNorm) : 0u);
    if (!fits(fused, options)) return 0;
    return j + 2 - i;
}

// A matmul of the normed row into `out` on every position, perhaps with a bias (operand 1).
bool is_normed_matmul(const Stage& s, Buffer out) {
    return s.op == Op::MatMul && s.input == Buffer::Normed && s.output == out && !s.last_token_only &&
           !s.operands.empty() && s.operands[0];
}
const TensorRef* matmul_bias(const Stage& s) { return s.operands.size() > 1 ? s.operands[1] : nullptr; }

// The same without a bias: what gate_up and a latent attention's pair fuse.
bool is_plain_matmul(const Stage& s, Buffer out) { return is_normed_matmul(s, out) && !matmul_bias(s); }

// matmul(normed -> gate) + matmul(normed -> up) + gated activation(gate, up -> act) -> gate_up.
size_t fuse_gate_up(const std::vector<Stage>& stages, size_t i, const PlanOptions& options, Stage& fused) {
    if (i + 2 >= stages.size()) return 0;
    const Stage& gate = stages[i];
    const Stage& up = stages[i + 1];
    const Stage& act = stages[i + 2];
    if (!is_plain_matmul(gate, Buffer::Gate) || !is_plain_matmul(up, Buffer::Up)) return 0;
    if (act.op != Op::FfnActivation || !(act.features & kGated) || act.input != Buffer::Gate ||
        act.input2 != Buffer::Up || gate.k != up.k || gate.n != up.n || act.n != gate.n)
        return 0;
    fused = Stage();
    fused.layer = gate.layer;
    fused.name = gate.name + "+" + up.name + "+" + act.name;
    fused.op = Op::GateUp;
    fused.operands = {gate.operands[0], up.operands[0]};
    fused.input = Buffer::Normed;
    fused.input2 = Buffer::Gate;  // scratch of the batched (prefill) path
    fused.input3 = Buffer::Up;
    fused.output = act.output;
    fused.k = gate.k;
    fused.n = gate.n;
    fused.params.activation = act.params.activation;
    fused.features = act.features;
    fused.input_encoding = gate.input_encoding;
    if (!fits_keeping_encoding(fused, {&gate, &up}, options)) return 0;
    return 3;
}

// matmul(normed -> q) + matmul(normed -> k) + matmul(normed -> v) -> qkv (each weight keeps its
// own format). Their biases (Qwen 2, gpt-oss, StarCoder2), where they have any, become operands
// 3..5 (null where a matmul has none) and the stage's kBias: only rows that add them take it.
// Measured on the H200 (gpt-oss-20b's 12-layer slice, whose Q, K and V have biases): one decode
// launch for the three matvecs instead of three, and at 512 tokens one grid of the tiles where
// K's and V's 32 groups each took a launch of its own (bench/results/cuda_h200_qkv_bias.txt).
// The pair of a latent attention, matmul(normed -> Q, or Gate:
// the low-rank query's first matmul) + matmul(normed -> K: the compressed KV row), fuses the
// same way into a qkv of two matrices (no V operand) in q8_1 plans, where the pair rounds x to
// q8_1 once for both. Measured on the H200 (DeepSeek-V2-Lite's Q4_K_M layout, tg128): q8_1 449.7
// -> 456.9 tok/s fused; with f32 activations, which share only the staging of x, 413.7 -> 411.6,
// so exact plans keep the two matmuls.
size_t fuse_qkv(const std::vector<Stage>& stages, size_t i, const PlanOptions& options, Stage& fused) {
    if (i + 1 >= stages.size()) return 0;
    const Stage& q = stages[i];
    const Stage& k = stages[i + 1];
    const Stage* v = i + 2 < stages.size() ? &stages[i + 2] : nullptr;
    if (!is_normed_matmul(k, Buffer::K) || q.k != k.k) return 0;
    const bool triple = v && is_normed_matmul(q, Buffer::Q) && is_normed_matmul(*v, Buffer::V) && q.k == v->k;
    // The latent pair: Q then the attention, or the low-rank query's Gate then its norm.
    const bool latent_pair = !triple && v && options.activations == Encoding::Q8_1 && is_plain_matmul(k, Buffer::K) &&
                             ((is_plain_matmul(q, Buffer::Q) && v->op == Op::AttentionMla) ||
                              (is_plain_matmul(q, Buffer::Gate) && v->op == Op::Norm && v->input == Buffer::Gate));
    if (!triple && !latent_pair) return 0;
    fused = q;
    fused.name = q.name + "+" + k.name + (triple ? "+" + v->name : std::string());
    fused.op = Op::Qkv;
    fused.operands = {q.operands[0], k.operands[0]};
    fused.input2 = Buffer::K;
    fused.input3 = Buffer::None;
    fused.features = q.features & ~FeatureMask(kBias);
    if (triple) {
        fused.operands.push_back(v->operands[0]);
        fused.input3 = Buffer::V;
        if (matmul_bias(q) || matmul_bias(k) || matmul_bias(*v)) {
            fused.operands.insert(fused.operands.end(), {matmul_bias(q), matmul_bias(k), matmul_bias(*v)});
            fused.features = kBias;
        }
    }
    std::vector<const Stage*> parts = {&q, &k};
    if (triple) parts.push_back(v);
    if (!fits_keeping_encoding(fused, parts, options)) return 0;
    return parts.size();
}

// norm(Q per head) + norm(K per head) + rope(Q, K) -> qk_norm_rope (Gemma 3, Qwen 3).
size_t fuse_qk_norm_rope(const std::vector<Stage>& stages, size_t i, const PlanOptions& options, Stage& fused) {
    if (i + 2 >= stages.size()) return 0;
    const Stage& qn = stages[i];
    const Stage& kn = stages[i + 1];
    const Stage& rope = stages[i + 2];
    if (rope.op != Op::Rope || rope.input != Buffer::Q || rope.input2 != Buffer::K) return 0;
    auto head_norm = [&](const Stage& s, Buffer b, int heads) {
        return s.op == Op::Norm && s.input == b && s.output == b && s.groups == heads && s.k == rope.params.head_dim &&
               (s.features & kRmsNorm) && s.operands.size() > 0 && s.operands[0] &&
               (s.operands.size() < 2 || !s.operands[1]);
    };
    if (!head_norm(qn, Buffer::Q, rope.params.n_head) || !head_norm(kn, Buffer::K, rope.params.n_head_kv) ||
        qn.params.eps != kn.params.eps)
        return 0;
    fused = rope;
    fused.name = qn.name + "+" + kn.name + "+" + rope.name;
    fused.op = Op::QkNormRope;
    fused.operands = {qn.operands[0], kn.operands[0], rope.operands.empty() ? nullptr : rope.operands[0]};
    fused.params.eps = qn.params.eps;
    fused.features = rope.features | kRmsNorm;
    if (!fits(fused, options)) return 0;
    return 3;
}

// rope(Q, K) or qk_norm_rope(Q, K) + attention(Q, K, V) -> attention that owns the rope: its
// decode rotates (and QK-norms) the query heads and the new K itself, one launch fewer per
// layer; a prefill chunk still rotates Q and K in place first (cuda/attention.cu). Operands:
// (q_norm, k_norm, freq_factors), absent ones null; features: the attention's and the rope's
// (kRmsNorm: the QK-norm). Not for a shared-KV layer (its rope has no K).
size_t fuse_rope_attention(const std::vector<Stage>& stages, size_t i, const PlanOptions& options, Stage& fused) {
    if (i + 1 >= stages.size()) return 0;
    const Stage& rope = stages[i];
    const Stage& attn = stages[i + 1];
    if ((rope.op != Op::Rope && rope.op != Op::QkNormRope) || rope.input != Buffer::Q || rope.input2 != Buffer::K)
        return 0;
    if (attn.op != Op::Attention || attn.input != Buffer::Q || attn.input2 != Buffer::K || (attn.features & kKvShared) ||
        attn.params.head_dim != rope.params.head_dim || attn.params.n_head != rope.params.n_head ||
        attn.params.n_head_kv != rope.params.n_head_kv)
        return 0;
    fused = attn;
    fused.name = rope.name + "+" + attn.name;
    const bool qk_norm = rope.op == Op::QkNormRope;
    const TensorRef* factors = qk_norm ? (rope.operands.size() > 2 ? rope.operands[2] : nullptr)
                                       : (rope.operands.empty() ? nullptr : rope.operands[0]);
    fused.operands = {qk_norm ? rope.operands[0] : nullptr, qk_norm ? rope.operands[1] : nullptr, factors};
    if (attn.operands.size() > 3) fused.operands.push_back(attn.operands[3]);  // sinks
    fused.params.rope_dim = rope.params.rope_dim;
    fused.params.rope_base = rope.params.rope_base;
    fused.params.rope_freq_scale = rope.params.rope_freq_scale;
    fused.params.rope_yarn = rope.params.rope_yarn;
    if (qk_norm) fused.params.eps = rope.params.eps;
    fused.features = attn.features | rope.features;
    // A prefill chunk of the fused stage runs the rope stage's kernel: it must have a row too
    // (an excluded cuda.rope / cuda.qk_norm_rope keeps the stages apart).
    if (!fits(rope, options) || !fits(fused, options)) return 0;
    return 2;
}

// add_norm(residual += branch; normed = rms_norm(residual) * weight) + the router of the normed
// row -> a router that does the add_norm first (kAddNormInput): operand 4 the norm's weight,
// input Residual, input2 the branch, input3 Normed (still written: the experts read it). Only a
// plain add_norm (RMS with a weight, no bias, post-norm or residual scale). Where a row of the
// backend computes the norm in the router's own launch (CUDA's cuda.moe_route_cluster_norm, one
// token) a decode step saves the add_norm's launch; the other token counts run the add_norm's
// kernel, then the router's.
size_t fuse_add_norm_route(const std::vector<Stage>& stages, size_t i, const PlanOptions& options, Stage& fused) {
    if (i + 1 >= stages.size()) return 0;
    const Stage& add = stages[i];
    const Stage& route = stages[i + 1];
    // Exactly kRmsNorm: a post-norm, a norm bias, a norm without weight and a residual scale are
    // each a feature of their own (so operand 2, the weight, is there and 0, 1 and 3 are not).
    if (add.op != Op::AddNorm || route.op != Op::MoeRoute || add.output != Buffer::Normed ||
        route.input != Buffer::Normed || add.input != Buffer::Residual || add.n != route.k ||
        add.features != FeatureMask(kRmsNorm) || route.operands.size() != 4)
        return 0;
    fused = route;
    fused.name = add.name + "+" + route.name;
    fused.operands.push_back(add.operands[2]);
    fused.input = Buffer::Residual;
    fused.input2 = add.input2;
    fused.input3 = Buffer::Normed;
    fused.params.eps = add.params.eps;
    fused.features = route.features | kAddNormInput;
    if (!fits(fused, options)) return 0;
    return 2;
}

std::vector<Stage> fuse_pairs_and_triples(const std::vector<Stage>& stages, const PlanOptions& options) {
    std::vector<Stage> out;
    for (size_t i = 0; i < stages.size();) {
        Stage fused;
        size_t used = fuse_add_norm(stages, i, options, fused);
        if (!used) used = fuse_gate_up(stages, i, options, fused);
        if (!used) used = fuse_qk_norm_rope(stages, i, options, fused);
        if (!used) used = fuse_qkv(stages, i, options, fused);
        if (used) {
            out.push_back(std::move(fused));
            i += used;
        } else {
            out.push_back(stages[i++]);
        }
    }
    return out;
}

std::vector<Stage> fuse_stages(const std::vector<Stage>& stages, const PlanOptions& options) {
    std::vector<Stage> out = fuse_pairs_and_triples(stages, options);
    // A second pass: the rope stage may itself be the qk_norm_rope just fused, the add_norm
    // before a router the one just fused.
    std::vector<Stage> second;
    for (size_t i = 0; i < out.size();) {
        Stage fused;
        size_t used = fuse_rope_attention(out, i, options, fused);
        if (!used) used = fuse_add_norm_route(out, i, options, fused);
        if (used) {
            second.push_back(std::move(fused));
            i += used;
        } else {
            second.push_back(out[i++]);
        }
    }
    return second;
}

bool is_matmul_op(Op op) { return op == Op::MatMul || op == Op::GateUp || op == Op::Qkv; }

bool all_q8(const std::vector<Route>& routes) {
    if (routes.empty()) return false;
    for (const Route& route : routes)
        if (route.row->input_encoding != Encoding::Q8_1) return false;
    return true;
}

// In a q8_1 plan, a stage whose output feeds q8_1 matmuls right after it also writes that
// output's q8_1 form (kQ8Output) into the backend's q8_1 scratch, which those matmuls then read
// (kQ8Input) instead of rounding the same values again: where the producer has a row that
// writes it and each consumer a q8_1 row that reads it, at every token count. The scratch holds
// one such input at a time, so the consumers are the stages right after the producer that read
// its output, and the rows that read it write no scratch of their own.
void link_q8_inputs(std::vector<Stage>& stages, const PlanOptions& options) {
    if (options.activations != Encoding::Q8_1) return;
    for (size_t i = 0; i + 1 < stages.size(); ++i) {
        const Buffer out = stages[i].output;
        if (out == Buffer::None || out == Buffer::Logits) continue;
        size_t end = i + 1;
        while (end < stages.size() && stages[end].input == out && is_matmul_op(stages[end].op)) ++end;
        if (end == i + 1) continue;
        std::vector<Stage> linked(stages.begin() + long(i), stages.begin() + long(end));
        linked[0].features |= kQ8Output;
        bool ok = fits(linked[0], options);
        for (size_t j = 1; ok && j < linked.size(); ++j) {
            linked[j].features |= kQ8Input;
            ok = all_q8(full_routes(stages[i + j], options)) && all_q8(full_routes(linked[j], options));
        }
        if (ok) std::copy(linked.begin(), linked.end(), stages.begin() + long(i));
    }
}

}  // namespace

std::vector<Route> route_stage(const Stage& stage, const PlanOptions& options) {
    std::ostringstream rejections;
    std::vector<TokenRange> gaps;
    std::vector<Route> routes = plan_routes(stage, options, rejections, gaps);
    if (gaps.empty()) return routes;
    std::ostringstream message;
    message << (stage.layer >= 0 ? "layer " + std::to_string(stage.layer) : std::string("model")) << " stage '"
            << stage.name << "' (" << op_name(stage.op) << "): no " << backend_name(options.backend) << " row fits";
    if (!routes.empty()) {  // some token counts have rows: name those that do not
        message << " calls of";
        for (size_t i = 0; i < gaps.size(); ++i) message << (i ? "," : "") << " " << describe_tokens(gaps[i]);
        message << " tokens";
    }
    message << "; formats [" << describe_formats(stage) << "], dims [" << describe_dims(stage) << "], features ["
            << feature_names(stage.features) << "]. Candidates:";
    for (const Route& route : routes)
        rejections << "\n  " << route.row->kernel << ": fits calls of " << describe_tokens(route.tokens) << " tokens";
    std::string listed = rejections.str();
    message << (listed.empty() ? std::string("\n  (no row implements this op on this backend)") : listed);
    throw RoutingError(message.str());
}

std::vector<Route> find_routes(const Stage& stage, const PlanOptions& options) { return full_routes(stage, options); }

const Row* route(const Stage& stage, const PlanOptions& options, int64_t n) {
    PlanOptions one = options;
    one.max_batch = int(std::max<int64_t>(n, 1));
    return row_in(route_stage(stage, one), n);
}

const Row* find_route(const Stage& stage, const PlanOptions& options, int64_t n) {
    PlanOptions one = options;
    one.max_batch = int(std::max<int64_t>(n, 1));
    std::ostringstream ignored;
    std::vector<TokenRange> gaps;
    const std::vector<Route> routes = plan_routes(stage, one, ignored, gaps);
    return row_in(routes, n);
}

const std::vector<Format>& kv_formats() {
    static const std::vector<Format> formats = {Format::F32, Format::F16};
    return formats;
}

std::string kv_type_name(Format format) { return lowercase_name(format_name(format)); }

Format kv_format_from_name(const std::string& name) {
    std::string supported;
    for (Format f : kv_formats()) {
        if (kv_type_name(f) == name) return f;
        supported += (supported.empty() ? "" : ", ") + kv_type_name(f);
    }
    throw FormatError("unsupported KV cache type '" + name + "' (supported: " + supported + ")");
}

int64_t kv_bytes_per_token(const Stage& stage) {
    const StageParams& p = stage.params;
    int64_t values = 0;
    if (stage.op == Op::AttentionMla)
        values = int64_t(p.kv_lora_rank) + p.rope_dim;
    else if (stage.op == Op::Attention && !(stage.features & kKvShared))
        values = int64_t(p.n_head_kv) * (p.head_dim + p.head_dim_v);
    return values ? int64_t(row_bytes(stage.kv_format, values)) : 0;
}

std::vector<Stage> build_stages(const ModelSpec& spec, const PlanOptions& options) {
    return StageBuilder(spec, options).build();
}

Plan make_plan(const ModelSpec& spec, const PlanOptions& in_options) {
    Plan plan;
    plan.options = in_options;
    if (plan.options.n_ctx <= 0) plan.options.n_ctx = spec.context_length;
    if (spec.context_length > 0 && plan.options.n_ctx > spec.context_length)
        throw ContextOverflowError("n_ctx " + std::to_string(plan.options.n_ctx) +
                                   " exceeds the model's context length " + std::to_string(spec.context_length));
    const auto& kv = kv_formats();
    if (std::find(kv.begin(), kv.end(), plan.options.kv_format) == kv.end())
        throw FormatError("unsupported KV cache type '" + kv_type_name(plan.options.kv_format) + "'");
    plan.buffer_widths.assign(static_cast<size_t>(Buffer::Logits) + 1, 0);
    auto widen = [&](Buffer b, int64_t w) {
        auto& width = plan.buffer_widths[static_cast<size_t>(b)];
        width = std::max(width, w);
    };
    if (plan.options.max_batch < 1) throw ModelError("max_batch must be at least 1");
    std::vector<Stage> stages = fuse_stages(build_stages(spec, plan.options), plan.options);
    link_q8_inputs(stages, plan.options);
    for (Stage& stage : stages) {
        std::vector<Route> routes = route_stage(stage, plan.options);
        widen(stage.input, stage.op == Op::MatMul || stage.op == Op::PerLayerEmbed || stage.op == Op::GateUp ||
                                   stage.op == Op::Qkv || stage.op == Op::MoeRoute || stage.op == Op::MoeExperts
                               ? stage.k
                               : stage.n);
        if (stage.op == Op::MoeExperts) {
            widen(stage.input2, 2 * int64_t(stage.params.n_expert_used));
            if (stage.features & kSharedExpertSum) widen(stage.input3, stage.n);
        }
        if (stage.op == Op::MoeRoute && (stage.features & kAddNormInput)) {
            widen(stage.input2, stage.k);
            widen(stage.input3, stage.k);
        }
        if (stage.op == Op::MoeSharedGate) {
            widen(stage.input2, stage.n);
            widen(stage.input3, stage.k);
        }
        if (stage.op == Op::Qkv) {
            widen(stage.input2, stage.operands[1]->n_rows());
            if (stage.operands.size() > 2) widen(stage.input3, stage.operands[2]->n_rows());
        }
        if (stage.op == Op::Add || stage.op == Op::FfnActivation || stage.op == Op::AddNorm ||
            stage.op == Op::GateUp)
            widen(stage.input2, stage.n);
        if (stage.op == Op::GateUp) widen(stage.input3, stage.n);
        if (stage.op == Op::PerLayerGate) widen(stage.input2, stage.k);
        widen(stage.output, stage.n);
        plan.stages.push_back({std::move(stage), std::move(routes)});
    }
    // Q/K/V widths come from the heads of every layer (rope and attention read them).
    for (const auto& layer : spec.layers) {
        if (layer.kv_source_layer >= 0) {
            widen(Buffer::Q, int64_t(layer.n_head) * layer.head_dim);
            widen(Buffer::Attn, int64_t(layer.n_head) * layer.head_dim_v);
            continue;
        }
        widen(Buffer::Q, int64_t(layer.n_head) * layer.head_dim);
        widen(Buffer::K, int64_t(layer.n_head_kv) * layer.head_dim);
        widen(Buffer::V, int64_t(layer.n_head_kv) * layer.head_dim_v);
        widen(Buffer::Attn, int64_t(layer.n_head) * layer.head_dim_v);
    }
    plan.buffer_widths[static_cast<size_t>(Buffer::None)] = 0;
    return plan;
}

}  // namespace kcap
