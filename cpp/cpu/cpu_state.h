// What CPU kernels share across a forward pass: the thread pool and the KV cache.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "kcap/formats.h"

namespace kcap {

// Keys and values of one layer, position-major: row p holds n_head_kv * head_dim elements.
// Storage grows with the sequence (up to n_ctx), so a long context costs memory only when
// it is used. The element type is a plan parameter: f32 or f16.
struct KvLayer {
    Format format = Format::F32;
    int64_t k_width = 0;
    int64_t v_width = 0;
    std::vector<float> k32, v32;
    std::vector<uint16_t> k16, v16;

    void reserve_positions(int64_t n_positions);
    void store(int64_t pos, const float* k, const float* v);
    // Elements [offset, offset + n) of the K or V row at pos, as f32: a pointer into the
    // cache when it stores f32, else converted into scratch (n elements).
    const float* k_span(int64_t pos, int64_t offset, int64_t n, float* scratch) const;
    const float* v_span(int64_t pos, int64_t offset, int64_t n, float* scratch) const;
};

struct CpuState {
    explicit CpuState(int n_threads) : pool(n_threads) {}
    ThreadPool pool;
    std::vector<KvLayer> kv;  // one per layer
};

inline CpuState& cpu_state(void* state) { return *static_cast<CpuState*>(state); }

// f32 dot product of two contiguous vectors, written so the compiler vectorizes it.
inline float dot_f32(const float* a, const float* b, int64_t n) {
    constexpr int kLanes = 16;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
    float sum = 0.0f;
    for (int j = 0; j < kLanes; ++j) sum += acc[j];
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

}  // namespace kcap
