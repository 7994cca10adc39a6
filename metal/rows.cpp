// The Metal rows of the capability table (declarations in metal/rows.h). Compiled in every
// build: where the Metal backend is not compiled in (KCAP_WITH_METAL undefined, i.e. anywhere
// but an Apple build) each row's fn is null, so plans and `kcap explain --backend metal` work
// on any machine and an Engine on "metal" is refused.
//
// Each row comes from its family's shared declaration (dispatch/gpu_rows.h: the same as the
// CUDA row over the same kernel body), with this backend's launcher and geometry (metal/rows.h);
// its entry points (the names metal/*.metal give their kernels) follow from its launches.
#include "metal/rows.h"

#include "dispatch/gpu_rows.h"

namespace kcap {

#if defined(KCAP_WITH_METAL)
#define KCAP_METAL_FN(launcher) (&launcher)
#else
#define KCAP_METAL_FN(launcher) nullptr
#endif

namespace {

using namespace metal_rows;

struct Declared {
    Row row;
    std::vector<std::string> entries;
};

// The kernel names of a row's launches in the metallib: "kcap_metal_<kernel>", with the weight
// format for the kernels instantiated per format (matmul.metal, embed.metal, ple.metal); a
// per-layer embedding row lists the combine of every table format (entry kPleCombine + the
// table format's index).
std::vector<std::string> entries_of(const Row& row) {
    std::vector<std::string> entries;
    for (const std::string& kernel : launched_kernels(row)) {
        const bool ple = row.op == Op::PerLayerEmbed;
        if (kernel == "ple_combine" || kernel == "moe_logits" || kernel == "moe_down" || kernel == "mla_append_absorb" ||
            kernel == "mla_v_up") {
            // The table, router, down matrix, W_k_b or W_v_b may be of any format: an entry for each.
            for (Format f : gpu_weight_formats()) entries.push_back("kcap_metal_" + kernel + "_" + format_name(f));
        } else if (kernel == "embed" || kernel == "matvec" || kernel == "gate_up" || kernel == "matmul_tokens" ||
                   kernel == "moe_gate_up") {
            const Format f = row.operand_formats[ple ? 1 : 0][0];
            entries.push_back("kcap_metal_" + kernel + "_" + format_name(f));
        } else {
            entries.push_back("kcap_metal_" + kernel);
        }
    }
    return entries;
}

void add(std::vector<Declared>& out, const Row& row) { out.push_back({row, entries_of(row)}); }

void add(std::vector<Declared>& out, GpuFamily family, Format format, KernelFn fn, Geometry geometry) {
    add(out, gpu_family_row(family, Backend::Metal, format, fn, geometry));
}

const std::vector<Declared>& declared() {
    static const std::vector<Declared> rows = [] {
        std::vector<Declared> out;
        const Geometry matvec = {kMatvecSimds * 32, kMatvecSimds * kMatvecRows, kMatvecSharedBytes};
        const Geometry tokens = {kTokensSimds * 32, kTokensSimds * kTokensRows, 0};
        const Geometry elementwise = {kElementwiseThreads, 0, 0};
        // Per format: embed, the exact matmul rows (the decode matvec of kernels/matvec.h for one
        // token, x in host-sized threadgroup memory; the few-token walk of kernels/matmul.h for
        // any count), gate_up (fused for one token; the walk of each matrix and the activation
        // for more), the per-layer embeddings of each projection format and the chosen experts
        // of each gate / up format. Metal has no tensor-core row: its batches run the walk.
#define KCAP_METAL_FORMAT_ROWS(NAME, DECODER)                                                                      \
        add(out, GpuFamily::Embed, Format::NAME, KCAP_METAL_FN(kcap_metal_embed_##NAME), {kEmbedThreads, 1, 0});   \
        add(out, GpuFamily::Matvec, Format::NAME, KCAP_METAL_FN(kcap_metal_matvec_##NAME), matvec);               \
        add(out, GpuFamily::MatmulTokens, Format::NAME, KCAP_METAL_FN(kcap_metal_matmul_tokens_##NAME), tokens);  \
        add(out, GpuFamily::GateUp, Format::NAME, KCAP_METAL_FN(kcap_metal_gate_up_##NAME), matvec);              \
        add(out, GpuFamily::GateUpTokens, Format::NAME, KCAP_METAL_FN(kcap_metal_gate_up_tokens_##NAME), tokens); \
        add(out, GpuFamily::PerLayerEmbed, Format::NAME, KCAP_METAL_FN(kcap_metal_per_layer_embed_##NAME), tokens); \
        {                                                                                                          \
            /* the experts' biases and gpt-oss's clamped SwiGLU too */                                             \
            Row experts = gpu_family_row(GpuFamily::MoeExperts, Backend::Metal, Format::NAME,                      \
                                         KCAP_METAL_FN(kcap_metal_moe_experts_##NAME), matvec);                    \
            add_moe_expert_biases(experts);                                                                        \
            add(out, experts);                                                                                     \
        }
        KCAP_WEIGHT_FORMATS(KCAP_METAL_FORMAT_ROWS)
#undef KCAP_METAL_FORMAT_ROWS
        const Geometry norm = {kNormThreads, 1, kNormScratchFloats * 4};
        add(out, GpuFamily::Norm, Format::F32, KCAP_METAL_FN(kcap_metal_norm), norm);
        add(out, GpuFamily::AddNorm, Format::F32, KCAP_METAL_FN(kcap_metal_add_norm), norm);
        add(out, GpuFamily::Rope, Format::F32, KCAP_METAL_FN(kcap_metal_rope), elementwise);
        // Attention (kernels/attention.h): the flash-decoding decode and its combine for one
        // token, the KV append and the tiled prefill for a chunk, each with attention sinks; a
        // shared-KV layer reads its source layer's cache and appends nothing.
        const Geometry attention = {kAttnMaxSimds * 32, 0, kAttnPrefillSharedBytes};  // prefill's, the most
        add(out, GpuFamily::AttentionDecode, Format::F32, KCAP_METAL_FN(kcap_metal_attention_decode), attention);
        add(out, GpuFamily::AttentionPrefill, Format::F32, KCAP_METAL_FN(kcap_metal_attention_prefill), attention);
        // Multi-head latent attention (kernels/attention_mla.h): one token in key splits fixed at
        // load time, a prefill chunk in one.
        const Geometry mla = {kMlaThreads, 0, kMlaAttendSharedBytes};
        add(out, GpuFamily::AttentionMlaDecode, Format::F32, KCAP_METAL_FN(kcap_metal_attention_mla_decode), mla);
        add(out, GpuFamily::AttentionMla, Format::F32, KCAP_METAL_FN(kcap_metal_attention_mla), mla);
        add(out, GpuFamily::FfnActivation, Format::F32, KCAP_METAL_FN(kcap_metal_ffn_activation), elementwise);
        add(out, GpuFamily::Add, Format::F32, KCAP_METAL_FN(kcap_metal_add), elementwise);
        add(out, GpuFamily::Softcap, Format::F32, KCAP_METAL_FN(kcap_metal_softcap), elementwise);
        add(out, GpuFamily::Scale, Format::F32, KCAP_METAL_FN(kcap_metal_scale), elementwise);
        add(out, GpuFamily::PerLayerGate, Format::F32, KCAP_METAL_FN(kcap_metal_per_layer_gate), elementwise);
        add(out, GpuFamily::Argmax, Format::F32, KCAP_METAL_FN(kcap_metal_argmax), {kArgmaxThreads, 0, 0});
        // The router with its bias, the sigmoid router with its choice bias, group-limited routing.
        Row route = gpu_family_row(GpuFamily::MoeRoute, Backend::Metal, Format::F32, KCAP_METAL_FN(kcap_metal_moe_route),
                                   {kMoeRouteThreads, 0, 0});
        add_moe_route_variants(route);
        add(out, route);
        add(out, GpuFamily::MoeSharedGate, Format::F32, KCAP_METAL_FN(kcap_metal_moe_shared_gate), elementwise);
        return out;
    }();
    return rows;
}

}  // namespace

void add_metal_rows(std::vector<Row>& rows) {
    for (const Declared& d : declared()) rows.push_back(d.row);
}

#if !defined(KCAP_WITH_METAL)
bool metal_device_available() { return false; }  // metal/metal_backend.mm where it is built
#endif

namespace metal_rows {

int moe_combine_entry() { return kMoeDown + int(gpu_weight_formats().size()); }
int moe_route_entry() { return int(gpu_weight_formats().size()); }
int mla_attend_entry() { return int(gpu_weight_formats().size()); }
int mla_combine_entry() { return mla_attend_entry() + 1; }
int mla_v_up_entry(Format format) { return mla_combine_entry() + 1 + ple_combine_index(format); }

int ple_combine_index(Format format) {
    const std::vector<Format> formats = gpu_weight_formats();
    for (size_t i = 0; i < formats.size(); ++i)
        if (formats[i] == format) return int(i);
    return -1;
}

const std::vector<std::string>& entry_points(const std::string& kernel) {
    static const std::vector<std::string> none;
    for (const Declared& d : declared())
        if (d.row.kernel == kernel) return d.entries;
    return none;
}

std::vector<std::pair<std::string, std::vector<std::string>>> all_entry_points() {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (const Declared& d : declared()) out.emplace_back(d.row.kernel, d.entries);
    return out;
}

}  // namespace metal_rows
}  // namespace kcap
