// See rope_table.h. Mirrors cpu/rope.cpp: angle = (pos * freq_scale) * base^(-2i/rope_dim)
// [/ factor_i], in double.
#include "cuda/rope_table.h"

#include <cmath>

namespace kcap {

bool stage_owns_rope(const Stage& stage) {
    return stage.op == Op::Attention && (stage.features & (kRopeNormal | kRopeNeox));
}

const TensorRef* rope_factors(const Stage& stage) {
    // rope: (factors); qk_norm_rope and an attention that owns its rope: (q_norm, k_norm, factors)
    const size_t at = stage.op == Op::Rope ? 0 : 2;
    return stage.operands.size() > at ? stage.operands[at] : nullptr;
}

std::vector<float> rope_cos_sin_table(const Stage& stage, int64_t n_ctx) {
    const StageParams& p = stage.params;
    const int half = p.rope_dim / 2;
    const TensorRef* factor_tensor = rope_factors(stage);
    const float* factors = factor_tensor ? reinterpret_cast<const float*>(factor_tensor->data) : nullptr;
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
        inv_freq[size_t(i)] = std::pow(double(p.rope_base), -2.0 * i / double(p.rope_dim));
        if (factors) inv_freq[size_t(i)] /= double(factors[i]);
    }
    std::vector<float> table(static_cast<size_t>(n_ctx) * half * 2);
    for (int64_t pos = 0; pos < n_ctx; ++pos) {
        const double position = double(pos) * double(p.rope_freq_scale);
        for (int i = 0; i < half; ++i) {
            table[(size_t(pos) * half + i) * 2] = float(std::cos(position * inv_freq[size_t(i)]));
            table[(size_t(pos) * half + i) * 2 + 1] = float(std::sin(position * inv_freq[size_t(i)]));
        }
    }
    return table;
}

}  // namespace kcap
