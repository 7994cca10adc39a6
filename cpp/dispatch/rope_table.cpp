// See rope_table.h.
#include "dispatch/rope_table.h"

#include <algorithm>
#include <cmath>

namespace kcap {

bool stage_owns_rope(const Stage& stage) {
    return stage.op == Op::Attention && (stage.features & (kRopeNormal | kRopeNeox));
}

const TensorRef* rope_factors(const Stage& stage) {
    // rope: (factors); qk_norm_rope and an attention that owns its rope: (q_norm, k_norm, factors)
    // attention_mla: (kv_a_norm, W_k_b, W_v_b, factors)
    const size_t at = stage.op == Op::Rope ? 0 : stage.op == Op::AttentionMla ? 3 : 2;
    return stage.operands.size() > at ? stage.operands[at] : nullptr;
}

std::vector<double> rope_inv_freqs(const StageParams& p, const float* factors) {
    const int half = p.rope_dim / 2;
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
        inv_freq[size_t(i)] = std::pow(double(p.rope_base), -2.0 * i / double(p.rope_dim));
        if (factors) inv_freq[size_t(i)] /= double(factors[i]);
    }
    const RopeYarn& y = p.rope_yarn;
    if (y.factor > 0.0f) {
        // transformers' find_correction_range (truncated unless truncate is false) and
        // linear_ramp_factor over the pairs.
        const double pi = 3.14159265358979323846;
        const auto correction_dim = [&](double rotations) {
            return double(p.rope_dim) * std::log(double(y.original_context) / (rotations * 2.0 * pi)) /
                   (2.0 * std::log(double(p.rope_base)));
        };
        const double fast = correction_dim(y.beta_fast), slow = correction_dim(y.beta_slow);
        const double low = std::max(y.truncate ? std::floor(fast) : fast, 0.0);
        double high = std::min(y.truncate ? std::ceil(slow) : slow, double(p.rope_dim - 1));
        if (low == high) high += 0.001;  // as transformers: no division by zero
        for (int i = 0; i < half; ++i) {
            const double ramp = std::min(std::max((double(i) - low) / (high - low), 0.0), 1.0);
            const double extrapolation = 1.0 - ramp;  // the share of the original frequency
            const double f = inv_freq[size_t(i)];
            inv_freq[size_t(i)] = f / double(y.factor) * (1.0 - extrapolation) + f * extrapolation;
        }
    }
    return inv_freq;
}

double rope_attn_factor(const StageParams& p) { return p.rope_yarn.factor > 0.0f ? double(p.rope_yarn.attn_factor) : 1.0; }

std::vector<float> rope_cos_sin_table(const Stage& stage, int64_t n_ctx) {
    const StageParams& p = stage.params;
    const int half = p.rope_dim / 2;
    const TensorRef* factor_tensor = rope_factors(stage);
    const std::vector<double> inv_freq =
        rope_inv_freqs(p, factor_tensor ? reinterpret_cast<const float*>(factor_tensor->data) : nullptr);
    const double scale = rope_attn_factor(p);
    std::vector<float> table(static_cast<size_t>(n_ctx) * half * 2);
    for (int64_t pos = 0; pos < n_ctx; ++pos) {
        const double position = double(pos) * double(p.rope_freq_scale);
        for (int i = 0; i < half; ++i) {
            table[(size_t(pos) * half + i) * 2] = float(std::cos(position * inv_freq[size_t(i)]) * scale);
            table[(size_t(pos) * half + i) * 2 + 1] = float(std::sin(position * inv_freq[size_t(i)]) * scale);
        }
    }
    return table;
}

RopeTableKey rope_table_key(const Stage& stage) {
    const StageParams& p = stage.params;
    const TensorRef* factors = rope_factors(stage);
    return {p.rope_base,           p.rope_freq_scale,        p.rope_dim,
            factors ? static_cast<const void*>(factors->data) : nullptr,
            p.rope_yarn.factor,    p.rope_yarn.original_context, p.rope_yarn.beta_fast,
            p.rope_yarn.beta_slow, p.rope_yarn.attn_factor, p.rope_yarn.truncate};
}

}  // namespace kcap
