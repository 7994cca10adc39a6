// CPU RMS and Layer norm over groups of each token's row, times weight (+ bias).
// A group is the whole hidden row for block norms, or one head for QK-norm.
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void norm_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t width = stage.k;
    const int64_t groups = stage.groups;
    const bool layer_norm = stage.features & kLayerNorm;
    const float eps = stage.params.eps;
    const float* weight = stage.operands[0] ? reinterpret_cast<const float*>(stage.operands[0]->data) : nullptr;
    const float* bias = stage.operands.size() > 1 && stage.operands[1]
                            ? reinterpret_cast<const float*>(stage.operands[1]->data)
                            : nullptr;
    cpu_state(call.backend_state).pool.parallel_for(call.n_tokens * groups, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* x = call.in + r * width;
            float* y = call.out + r * width;
            // Accumulate in double: the reference (f64) and f32 refs differ by less than this error.
            double mean = 0.0;
            if (layer_norm) {
                for (int64_t i = 0; i < width; ++i) mean += x[i];
                mean /= double(width);
            }
            double sum_sq = 0.0;
            for (int64_t i = 0; i < width; ++i) {
                double centered = double(x[i]) - mean;
                sum_sq += centered * centered;
            }
            const float inv = float(1.0 / std::sqrt(sum_sq / double(width) + double(eps)));
            const float shift = float(mean);
            for (int64_t i = 0; i < width; ++i) {
                float v = (x[i] - shift) * inv;
                if (weight) v *= weight[i];
                if (bias) v += bias[i];
                y[i] = v;
            }
        }
    });
}

}  // namespace

void add_cpu_norm_rows(std::vector<Row>& rows) {
    Row row;
    row.kernel = "cpu.norm";
    row.op = Op::Norm;
    row.backend = Backend::CPU;
    row.operand_formats = {{Format::F32}, {Format::F32}};
    row.features = kRmsNorm | kLayerNorm | kBias | kParameterFreeNorm;
    row.fn = norm_kernel;
    rows.push_back(row);
}

}  // namespace kcap
