// CPU per-layer embeddings (PLE): the per-token input every layer mixes in after its FFN.
//
// per_layer_embed: for each token, with e its scaled embedding (the residual after the
// embedding stage) and L layers of P values each,
//   ple = (rms_norm_per_layer(norm_w, (proj . e) * proj_scale) + table[id] * token_scale) * combine_scale
// per_layer_gate: act(gate) * this layer's P values of ple.
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void per_layer_embed_kernel(const Stage& stage, const KernelCall& call) {
    const TensorRef& table = *stage.operands[0];
    const TensorRef& proj = *stage.operands[1];
    const float* norm_w = reinterpret_cast<const float*>(stage.operands[2]->data);
    const StageParams& p = stage.params;
    const int64_t d = stage.k;
    const int64_t width = stage.n;
    const int64_t n_layer = stage.groups;
    const int64_t per = width / n_layer;
    cpu_state(call.backend_state).pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
        std::vector<float> tok(width), wrow(d);
        for (int64_t m = begin; m < end; ++m) {
            const float* e = call.in + m * d;
            float* out = call.out + m * width;
            for (int64_t j = 0; j < width; ++j) {
                dequantize_row(proj.format, proj.row(j), wrow.data(), d);
                out[j] = dot_f32(wrow.data(), e, d) * p.ple_model_proj_scale;
            }
            dequantize_row(table.format, table.row(call.tokens[m]), tok.data(), width);
            for (int64_t l = 0; l < n_layer; ++l) {
                float* x = out + l * per;
                double sum_sq = 0.0;
                for (int64_t i = 0; i < per; ++i) sum_sq += double(x[i]) * x[i];
                const float inv = float(1.0 / std::sqrt(sum_sq / double(per) + double(p.eps)));
                for (int64_t i = 0; i < per; ++i)
                    x[i] = (x[i] * inv * norm_w[i] + tok[l * per + i] * p.ple_token_scale) * p.ple_combine_scale;
            }
        }
    });
}

void per_layer_gate_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t per = stage.n;
    const int64_t stride = stage.k;
    const int64_t offset = stage.groups * per;
    for (int64_t m = 0; m < call.n_tokens; ++m)
        for (int64_t i = 0; i < per; ++i)
            call.out[m * per + i] =
                apply_activation(stage.params.activation, call.in[m * per + i]) * call.in2[m * stride + offset + i];
}

}  // namespace

void add_cpu_ple_rows(std::vector<Row>& rows) {
    std::vector<Format> any;
    for (const FormatInfo& info : all_formats()) any.push_back(info.format);
    Row embed;
    embed.kernel = "cpu.per_layer_embed";
    embed.op = Op::PerLayerEmbed;
    embed.backend = Backend::CPU;
    embed.operand_formats = {any, any, {Format::F32}};
    embed.features = kPerLayerEmbedding | kRmsNorm;
    embed.fn = per_layer_embed_kernel;
    rows.push_back(embed);

    Row gate;
    gate.kernel = "cpu.per_layer_gate";
    gate.op = Op::PerLayerGate;
    gate.backend = Backend::CPU;
    gate.features = kPerLayerEmbedding | kSilu | kGeluTanh | kGeluErf | kRelu;
    gate.fn = per_layer_gate_kernel;
    rows.push_back(gate);
}

}  // namespace kcap
