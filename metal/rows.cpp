// The Metal rows of the capability table (declarations in metal/rows.h). Compiled in every
// build: where the Metal backend is not compiled in (KCAP_WITH_METAL undefined, i.e. anywhere
// but an Apple build) each row's fn is null, so plans and `kcap explain --backend metal` work
// on any machine and an Engine on "metal" is refused.
//
// Each row is declared once, together with its entry points (the names metal/*.metal give
// their kernels) and its geometry (metal/rows.h), in one `declare` call.
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

Row make_row(const std::string& kernel, Op op, KernelFn fn, Geometry geometry) {
    return gpu_row(Backend::Metal, kernel, op, fn, geometry);
}

void add_embed(std::vector<Declared>& out) {
#define KCAP_EMBED_ROW(NAME, DECODER)                                                                        \
    {                                                                                                        \
        Row row = make_row("metal.embed." + lowercase(#NAME), Op::Embed, KCAP_METAL_FN(kcap_metal_embed_##NAME), \
                           {kEmbedThreads, 1, 0});                                                           \
        row.operand_formats = {{Format::NAME}, {Format::F32, Format::F16}}; /* table, positions */            \
        row.features = kEmbedScale | kPositionEmbedding;                                                     \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                      \
        out.push_back({row, {KCAP_METAL_FORMAT_ENTRY(embed, NAME)}});                                        \
    }
    KCAP_WEIGHT_FORMATS(KCAP_EMBED_ROW)
#undef KCAP_EMBED_ROW
}

void add_matmul(std::vector<Declared>& out) {
    // Exact rows (f32 activations and sums) for any number of tokens: the bodies that
    // cuda.matmul.* runs (kernels/matvec.h for one token, kernels/matmul.h's few-token walk).
    // Entry order: metal_rows::MatmulEntry.
#define KCAP_MATMUL_ROW(NAME, DECODER)                                                                            \
    {                                                                                                             \
        Row row = make_row("metal.matmul." + lowercase(#NAME), Op::MatMul, KCAP_METAL_FN(kcap_metal_matmul_##NAME),   \
                           {kMatvecSimds * 32, kMatvecSimds * kMatvecRows, kMatvecSharedBytes});                   \
        row.operand_formats = {{Format::NAME}, {Format::F32}};                                                    \
        row.features = kBias;                                                                                     \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                           \
        out.push_back({row, {KCAP_METAL_FORMAT_ENTRY(matvec, NAME), KCAP_METAL_FORMAT_ENTRY(matmul_tokens, NAME)}}); \
    }
    KCAP_WEIGHT_FORMATS(KCAP_MATMUL_ROW)
#undef KCAP_MATMUL_ROW
    // Fused gated FFN input (gate and up of one format), as cuda.gate_up.*: one token, both
    // matrices against one staged x with the activation applied to the sums; a batch, the
    // format's few-token walk for each matrix into the gate/up scratch, then the activation
    // (Metal has no tensor-core row to take the batch). Entry order: metal_rows::GateUpEntry.
#define KCAP_GATE_UP_ROW(NAME, DECODER)                                                                           \
    {                                                                                                             \
        Row row = make_row("metal.gate_up." + lowercase(#NAME), Op::GateUp, KCAP_METAL_FN(kcap_metal_gate_up_##NAME), \
                           {kMatvecSimds * 32, kMatvecSimds * kMatvecRows, kMatvecSharedBytes});                   \
        row.operand_formats = {{Format::NAME}, {Format::NAME}};                                                   \
        row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;                                             \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                           \
        out.push_back({row,                                                                                       \
                       {KCAP_METAL_FORMAT_ENTRY(gate_up, NAME), KCAP_METAL_FORMAT_ENTRY(matmul_tokens, NAME),     \
                        KCAP_METAL_ENTRY(ffn_activation)}});                                                      \
    }
    KCAP_WEIGHT_FORMATS(KCAP_GATE_UP_ROW)
#undef KCAP_GATE_UP_ROW
}

void add_norm(std::vector<Declared>& out) {
    Row row = make_row("metal.norm", Op::Norm, KCAP_METAL_FN(kcap_metal_norm), {kNormThreads, 1, kNormScratchFloats * 4});
    row.operand_formats = {{Format::F32}, {Format::F32}};
    row.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm;
    out.push_back({row, {KCAP_METAL_ENTRY(norm)}});
    // Fused, as cuda.add_norm: [post-norm of the branch] + residual add + the next norm, one
    // threadgroup per token (kernels/norm.h kcap_add_norm).
    Row fused = make_row("metal.add_norm", Op::AddNorm, KCAP_METAL_FN(kcap_metal_add_norm),
                         {kNormThreads, 1, kNormScratchFloats * 4});
    fused.operand_formats = {{Format::F32}, {Format::F32}, {Format::F32}, {Format::F32}};
    fused.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm | kResidualScale | kPostNorm;
    out.push_back({fused, {KCAP_METAL_ENTRY(add_norm)}});
}

void add_rope(std::vector<Declared>& out) {
    Row row = make_row("metal.rope", Op::Rope, KCAP_METAL_FN(kcap_metal_rope), {kElementwiseThreads, 0, 0});
    row.operand_formats = {{Format::F32}};
    row.features = kRopeNormal | kRopeNeox | kPartialRotary | kRopeFreqFactors;
    out.push_back({row, {KCAP_METAL_ENTRY(rope)}});
}

void add_attention(std::vector<Declared>& out) {
    // Flash-decoding (split-K) decode + combine, KV append and batched prefill
    // (kernels/attention.h); a shared-KV layer reads its source layer's cache and appends
    // nothing (kKvShared). Entry order: metal_rows::AttentionEntry.
    Row row = make_row("metal.attention", Op::Attention, KCAP_METAL_FN(kcap_metal_attention),
                       {kAttnMaxSimds * 32, 0, kAttnPrefillSharedBytes});  // prefill's, the most
    row.kv_formats = {Format::F32, Format::F16};
    row.features = kSlidingWindow | kAttnSoftcap | kGqa | kKvShared;
    row.dims.k_multiple = 4;      // head_dim: K rows are read 4 elements at a time
    row.dims.max_head_dim = 256;  // per-lane value registers (KCAP_ATTN_MAX_HEAD_DIM)
    row.dims.max_span = 0;        // split-K decode: any span up to the context
    out.push_back({row,
                   {KCAP_METAL_ENTRY(attention_decode), KCAP_METAL_ENTRY(attention_combine),
                    KCAP_METAL_ENTRY(kv_append), KCAP_METAL_ENTRY(attention_prefill)}});
}

void add_activation(std::vector<Declared>& out) {
    Row row = make_row("metal.ffn_activation", Op::FfnActivation, KCAP_METAL_FN(kcap_metal_ffn_activation),
                       {kElementwiseThreads, 0, 0});
    row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;
    out.push_back({row, {KCAP_METAL_ENTRY(ffn_activation)}});
}

void add_elementwise(std::vector<Declared>& out) {
    Row add = make_row("metal.add", Op::Add, KCAP_METAL_FN(kcap_metal_add), {kElementwiseThreads, 0, 0});
    add.features = kResidualScale;
    out.push_back({add, {KCAP_METAL_ENTRY(add)}});
    out.push_back({make_row("metal.softcap", Op::Softcap, KCAP_METAL_FN(kcap_metal_softcap), {kElementwiseThreads, 0, 0}),
                   {KCAP_METAL_ENTRY(softcap)}});
    Row scale = make_row("metal.scale", Op::Scale, KCAP_METAL_FN(kcap_metal_scale), {kElementwiseThreads, 0, 0});
    scale.features = kLayerOutputScale;  // also scales the residual stream after a block
    out.push_back({scale, {KCAP_METAL_ENTRY(scale)}});
}


void add_ple(std::vector<Declared>& out) {
    // As cuda.per_layer_embed.*: one row per projection format (its K multiple is the
    // projection's); the table may be any weight format, so the row lists the combine of each
    // (entry kPleCombine + ple_combine_index), the norm weight F32.
    std::vector<std::string> combines;
#define KCAP_PLE_COMBINE_NAME(NAME, DECODER) combines.push_back(KCAP_METAL_FORMAT_ENTRY(ple_combine, NAME));
    KCAP_WEIGHT_FORMATS(KCAP_PLE_COMBINE_NAME)
#undef KCAP_PLE_COMBINE_NAME
#define KCAP_PLE_ROW(NAME, DECODER)                                                                              \
    {                                                                                                            \
        Row row = make_row("metal.per_layer_embed." + lowercase(#NAME), Op::PerLayerEmbed,                           \
                           KCAP_METAL_FN(kcap_metal_per_layer_embed_##NAME), {kTokensSimds * 32, kTokensSimds * kTokensRows, 0}); \
        row.operand_formats = {gpu_weight_formats(), {Format::NAME}, {Format::F32}};                                 \
        row.features = kPerLayerEmbedding | kRmsNorm;                                                            \
        row.dims.k_multiple = exact_k_multiple(Format::NAME);                                                          \
        std::vector<std::string> entries = {KCAP_METAL_FORMAT_ENTRY(matmul_tokens, NAME)};                       \
        entries.insert(entries.end(), combines.begin(), combines.end());                                         \
        out.push_back({row, entries});                                                                           \
    }
    KCAP_WEIGHT_FORMATS(KCAP_PLE_ROW)
#undef KCAP_PLE_ROW
    Row gate = make_row("metal.per_layer_gate", Op::PerLayerGate, KCAP_METAL_FN(kcap_metal_per_layer_gate),
                        {kElementwiseThreads, 0, 0});
    gate.features = kPerLayerEmbedding | kSilu | kGeluTanh | kGeluErf | kRelu;
    out.push_back({gate, {KCAP_METAL_ENTRY(ple_gate)}});
}

void add_argmax(std::vector<Declared>& out) {
    // Entry order: metal_rows::ArgmaxEntry.
    out.push_back({make_row("metal.argmax", Op::Argmax, KCAP_METAL_FN(kcap_metal_argmax), {kArgmaxThreads, 0, 0}),
                   {KCAP_METAL_ENTRY(argmax_partial), KCAP_METAL_ENTRY(argmax_final)}});
}

const std::vector<Declared>& declared() {
    static const std::vector<Declared> rows = [] {
        std::vector<Declared> out;
        add_embed(out);
        add_norm(out);
        add_matmul(out);
        add_rope(out);
        add_attention(out);
        add_activation(out);
        add_elementwise(out);
        add_ple(out);
        add_argmax(out);
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
