// KV cache storage of the CPU backend (f32 or f16 elements).
#include <algorithm>

#include "cpu/cpu_state.h"
#include "kcap/errors.h"

namespace kcap {

void KvLayer::reserve_positions(int64_t n_positions) {
    if (format == Format::F32) {
        if (int64_t(k32.size()) < n_positions * k_width) {
            int64_t grown = std::max<int64_t>(n_positions, int64_t(k32.size() / std::max<int64_t>(k_width, 1)) * 2);
            k32.resize(grown * k_width);
            v32.resize(grown * v_width);
        }
    } else if (format == Format::F16) {
        if (int64_t(k16.size()) < n_positions * k_width) {
            int64_t grown = std::max<int64_t>(n_positions, int64_t(k16.size() / std::max<int64_t>(k_width, 1)) * 2);
            k16.resize(grown * k_width);
            v16.resize(grown * v_width);
        }
    } else {
        throw FormatError(std::string("KV cache type ") + format_name(format) + " is not supported on cpu");
    }
}

void KvLayer::store(int64_t pos, const float* k, const float* v) {
    if (format == Format::F32) {
        std::copy(k, k + k_width, k32.begin() + pos * k_width);
        std::copy(v, v + v_width, v32.begin() + pos * v_width);
    } else {
        for (int64_t i = 0; i < k_width; ++i) k16[pos * k_width + i] = f32_to_f16(k[i]);
        for (int64_t i = 0; i < v_width; ++i) v16[pos * v_width + i] = f32_to_f16(v[i]);
    }
}

static const float* span_f32(const std::vector<float>& f32, const std::vector<uint16_t>& f16, Format format,
                             int64_t start, int64_t n, float* scratch) {
    if (format == Format::F32) return f32.data() + start;
    for (int64_t i = 0; i < n; ++i) scratch[i] = f16_to_f32(f16[start + i]);
    return scratch;
}

const float* KvLayer::k_span(int64_t pos, int64_t offset, int64_t n, float* scratch) const {
    return span_f32(k32, k16, format, pos * k_width + offset, n, scratch);
}

const float* KvLayer::v_span(int64_t pos, int64_t offset, int64_t n, float* scratch) const {
    return span_f32(v32, v16, format, pos * v_width + offset, n, scratch);
}

}  // namespace kcap
