// CPU embedding lookup: dequantize one table row per token, times the embedding scale, plus
// the learned position embedding of its position where the model has one.
#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void embed_kernel(const Stage& stage, const KernelCall& call) {
    const TensorRef& table = *stage.operands[0];
    const TensorRef* positions = stage.operands.size() > 1 ? stage.operands[1] : nullptr;
    const int64_t width = stage.n;
    const float scale = stage.params.scale;
    cpu_state(call.backend_state).pool.parallel_for(call.n_tokens, [&](int64_t begin, int64_t end) {
        std::vector<float> row(positions ? width : 0);
        for (int64_t m = begin; m < end; ++m) {
            float* out = call.out + m * width;
            dequantize_row(table.format, table.row(call.tokens[m]), out, width);
            if (scale != 1.0f)
                for (int64_t i = 0; i < width; ++i) out[i] *= scale;
            if (positions) {
                dequantize_row(positions->format, positions->row(call.pos0 + m), row.data(), width);
                for (int64_t i = 0; i < width; ++i) out[i] += row[i];
            }
        }
    });
}

}  // namespace

void add_cpu_embed_rows(std::vector<Row>& rows) {
    // One row per table format: the row decodes exactly the formats it lists.
    for (const FormatInfo& info : all_formats()) {
        Row row;
        row.kernel = std::string("cpu.embed.") + info.name;
        for (auto& c : row.kernel) c = char(std::tolower(c));
        row.op = Op::Embed;
        row.backend = Backend::CPU;
        row.operand_formats = {{info.format}, {Format::F32, Format::F16}};
        row.features = kEmbedScale | kPositionEmbedding;
        row.dims.k_multiple = info.block_elems;
        row.fn = embed_kernel;
        rows.push_back(row);
    }
}

}  // namespace kcap
