// The host sampler (kcap/engine.h: sample_token): decode_sample on backends without device
// sampling, and the reference the device sampler's bodies are tested against.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kcap/engine.h"
#include "kcap/errors.h"
#include "kernels/sample_uniform.h"

namespace kcap {

int32_t sample_token(const float* logits, int64_t n_vocab, const SampleSettings& s, int64_t position) {
    // The top k by (value descending, index ascending); NaN is never a candidate.
    std::vector<int32_t> order;
    order.reserve(size_t(n_vocab));
    for (int64_t i = 0; i < n_vocab; ++i)
        if (!std::isnan(logits[i])) order.push_back(int32_t(i));
    if (order.empty()) throw NumericalError("sampling: every logit is NaN");
    const size_t k = std::min(order.size(), size_t(std::max(s.top_k, 1)));
    auto before = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), before);
    order.resize(k);
    // llama.cpp's order: top-p and min-p cut on the softmax at temperature 1, then the
    // temperature shapes the draw among the kept candidates. In f32 in the device's order: a
    // candidate exactly at the top-p threshold is kept or not by the same rounding there and here.
    std::vector<float> w(k);
    float total = 0.0f;
    for (size_t r = 0; r < k; ++r) {
        w[r] = std::exp(logits[order[r]] - logits[order[0]]);
        total += w[r];
    }
    // top-p: the smallest prefix whose probability reaches top_p; min-p: p >= min_p * p_max.
    size_t kept = 0;
    float cumulative = 0.0f;
    for (size_t r = 0; r < k; ++r) {
        const float prob = w[r] / total;
        if (prob <= 0.0f || (r > 0 && cumulative >= s.top_p) || prob < s.min_p * (w[0] / total)) break;
        cumulative += prob;
        kept = r + 1;
    }
    const float inv_t = 1.0f / s.temperature;
    float kept_total = 0.0f;
    for (size_t r = 0; r < kept; ++r) {
        w[r] = std::exp((logits[order[r]] - logits[order[0]]) * inv_t);
        kept_total += w[r];
    }
    const float target = kcap_sample_uniform(s.seed, int(position)) * kept_total;
    float running = 0.0f;
    for (size_t r = 0; r < kept; ++r) {
        running += w[r];
        if (target < running) return order[r];
    }
    return kept > 0 ? order[kept - 1] : order[0];  // rounding: the last kept candidate
}

}  // namespace kcap
