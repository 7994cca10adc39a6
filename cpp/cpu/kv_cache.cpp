// KV cache storage of the CPU backend (f32 or f16 elements).
#include <algorithm>

#include "cpu/cpu_state.h"
#include "kcap/errors.h"

namespace kcap {

void KvLayer::reserve_positions(int64_t n_positions) {
    if (format != Format::F32 && format != Format::F16)
        throw FormatError(std::string("KV cache type ") + format_name(format) + " is not supported on cpu");
    if (capacity >= n_positions) return;
    capacity = std::max<int64_t>(n_positions, capacity * 2);
    // Blocked keys: whole blocks (the last one's positions past capacity are never read as keys).
    const int64_t key_rows = keys_blocked() ? (capacity + kKeyBlock - 1) / kKeyBlock * kKeyBlock : capacity;
    if (format == Format::F32) {
        k32.resize(size_t(key_rows * k_width));
        v32.resize(size_t(capacity * v_width));
    } else {
        k16.resize(size_t(key_rows * k_width));
        v16.resize(size_t(capacity * v_width));
    }
}

void KvLayer::store(int64_t pos, const float* k, const float* v) {
    if (format == Format::F32) {
        for (int64_t i = 0; i < k_width; ++i) k32[size_t(key_index(pos, i))] = k[i];
        std::copy(v, v + v_width, v32.begin() + pos * v_width);
    } else {
        for (int64_t i = 0; i < k_width; ++i) k16[size_t(key_index(pos, i))] = f32_to_f16(k[i]);
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

const float* KvLayer::key_block(int64_t block, int64_t offset, int64_t n, float* scratch) const {
    return span_f32(k32, k16, format, block * kKeyBlock * k_width + offset * kKeyBlock, n * kKeyBlock, scratch);
}

}  // namespace kcap
