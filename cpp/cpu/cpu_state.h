// What CPU kernels share across a forward pass: the thread pool and the KV cache.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <algorithm>
#include <cmath>

#include "core/hot_loop.h"
#include "cpu/scratch.h"
#include "cpu/thread_pool.h"
#include "dispatch/rope_table.h"
#include "kcap/formats.h"
#include "kcap/model_spec.h"

namespace kcap {

// Keys and values of one layer. Values position-major: row p holds v_width values. Keys the same
// where the layer has no values (a multi-head latent attention layer, which keeps its latent and
// rope key as the key row, kv_widths), else (keys_blocked) in blocks of kKeyBlock positions,
// each block k_width x kKeyBlock: element i of position p at
//   (p / kKeyBlock) * kKeyBlock * k_width + i * kKeyBlock + p % kKeyBlock,
// so that one dimension of a KV head's key holds kKeyBlock positions side by side: attention
// multiplies a query by a block's keys as vectors over positions, with no sum across a vector's
// lanes per key.
// Storage grows with the sequence (up to n_ctx), so a long context costs memory only when
// it is used. The element type is a plan parameter: f32 or f16.
struct KvLayer {
    static constexpr int kKeyBlock = 16;
    Format format = Format::F32;
    int64_t k_width = 0;
    int64_t v_width = 0;
    int64_t capacity = 0;  // positions the storage holds (the key blocks may hold a few more)
    // The keys' layout follows from the widths: in blocks where the layer has values.
    bool keys_blocked() const { return v_width > 0; }
    std::vector<float> k32, v32;
    std::vector<uint16_t> k16, v16;

    void reserve_positions(int64_t n_positions);
    void store(int64_t pos, const float* k, const float* v);
    // Where element i of position pos's key sits in k32 or k16 (either layout).
    int64_t key_index(int64_t pos, int64_t i) const {
        return keys_blocked() ? (pos / kKeyBlock) * kKeyBlock * k_width + i * kKeyBlock + pos % kKeyBlock
                              : pos * k_width + i;
    }
    // Elements [offset, offset + n) of the K (not keys_blocked) or V row at pos, as f32: a
    // pointer into the cache when it stores f32, else converted into scratch (n elements).
    const float* k_span(int64_t pos, int64_t offset, int64_t n, float* scratch) const;
    const float* v_span(int64_t pos, int64_t offset, int64_t n, float* scratch) const;
    // keys_blocked: the block of position block * kKeyBlock, elements [offset, offset + n) of its
    // rows (n x kKeyBlock values, element-major), as f32: a pointer into the cache when it stores
    // f32, else converted into scratch (n * kKeyBlock values).
    const float* key_block(int64_t block, int64_t offset, int64_t n, float* scratch) const;
};

struct CpuState {
    explicit CpuState(int n_threads) : pool(n_threads) {}
    ThreadPool pool;
    std::vector<KvLayer> kv;  // one per layer
};

inline CpuState& cpu_state(void* state) { return *static_cast<CpuState*>(state); }

// f32 dot product of two contiguous vectors, written so the compiler vectorizes it.
// The 16 lanes are summed pairwise (lane j with lane j + 8, then + 4, ...), which vectorizes
// too, where a sum lane by lane would be 15 dependent scalar additions per call.
inline float dot_f32(const float* a, const float* b, int64_t n) {
    constexpr int kLanes = 16;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; j < 8; ++j) acc[j] += acc[j + 8];
    for (int j = 0; j < 4; ++j) acc[j] += acc[j + 4];
    for (int j = 0; j < 2; ++j) acc[j] += acc[j + 2];
    float sum = acc[0] + acc[1];
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// out[i] += w * v[i] for i < n, 8 values at a time with all of a step's loads before its stores,
// so that the step vectorizes whatever the compiler can prove about out and v (inlined into
// attention's loops it could prove nothing, and ran the loop value by value).
inline void add_scaled(float* out, const float* v, float w, int64_t n) {
    constexpr int kStep = 8;
    int64_t i = 0;
    for (; i + kStep <= n; i += kStep) {
        float step[kStep];
        for (int l = 0; l < kStep; ++l) step[l] = out[i + l] + w * v[i + l];
        for (int l = 0; l < kStep; ++l) out[i + l] = step[l];
    }
    for (; i < n; ++i) out[i] += w * v[i];
}

// e^x for x in [-87, 88] (unchecked), written so that a loop of it vectorizes (std::exp is a
// library call per value): x = k ln 2 + r with k an integer and |r| <= ln 2 / 2 (ln 2 in two
// parts, the first with few bits so that k times it is exact), e^r by Cephes' expf polynomial,
// times 2^k built in the exponent bits (k in [-126, 127]: a normal power of two). Within 2 ulp
// of e^x (tests/cpp/test_attention.cpp, tests/cpp/test_activation.cpp).
inline float exp_in_range(float x) {
    const float round = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float k = (x * 1.44269504088896341f + round) - round;
    const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float power;
    std::memcpy(&power, &bits, sizeof power);
    return y * power;
}

// exp(x) for x <= 0 (a softmax's scores less their maximum). Below -87 (exp < 2^-125.5, under a
// softmax's largest weight 1 by that much) it gives 0; NaN stays NaN.
inline float exp_nonpositive(float x) {
    const bool in_range = x >= -87.0f;  // false for NaN too
    const float v = exp_in_range(in_range ? x : 0.0f);
    return in_range ? v : (x != x ? x : 0.0f);
}

// e^x with x clamped to [-87, 88] (the activations' sigmoids): it never overflows or leaves the
// normal range (e^-87 is 1.6e-38: what it adds to 1 is nothing); NaN stays NaN.
inline float exp_clamped(float x) {
    const float v = exp_in_range(x >= -87.0f ? (x <= 88.0f ? x : 88.0f) : -87.0f);
    return x != x ? x : v;
}

// v[i] = exp_nonpositive(v[i] - shift) for i < n; returns their sum (in double, in 8 lanes).
inline double exp_shifted(float* v, int64_t n, float shift) {
    constexpr int kLanes = 8;
    double lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
            v[i + j] = exp_nonpositive(v[i + j] - shift);
            lanes[j] += double(v[i + j]);
        }
    double total = 0.0;
    for (int j = 0; j < kLanes; ++j) total += lanes[j];
    for (; i < n; ++i) total += double(v[i] = exp_nonpositive(v[i] - shift));
    return total;
}

// Rotates the rope_dim values at x in place: Normal style pairs (x[2i], x[2i+1]), NeoX style
// (x[i], x[i + rope_dim/2]), pair i by the angle whose cos and sin are cos_t[i] and sin_t[i].
inline void rotate_pairs(float* x, const float* cos_t, const float* sin_t, int rope_dim, bool neox) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cos_t[i] - x1 * sin_t[i];
        x[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
}

// For positions pos0 .. pos0 + n - 1, rope_dim / 2 cosines then rope_dim / 2 sines each: the
// angles (position * rope_freq_scale) * inv_freq_i in double (dispatch/rope_table.h, as the GPU
// tables), times the attention factor.
inline std::vector<float> rope_cos_sin(const StageParams& p, const float* factors, int64_t pos0, int n) {
    const int half = p.rope_dim / 2;
    const std::vector<double> inv_freq = rope_inv_freqs(p, factors);
    const double scale = rope_attn_factor(p);
    std::vector<float> out(size_t(n) * 2 * half);
    for (int m = 0; m < n; ++m) {
        const double pos = double(pos0 + m) * double(p.rope_freq_scale);
        for (int i = 0; i < half; ++i) {
            out[size_t(m) * 2 * half + i] = float(std::cos(pos * inv_freq[size_t(i)]) * scale);
            out[size_t(m) * 2 * half + half + i] = float(std::sin(pos * inv_freq[size_t(i)]) * scale);
        }
    }
    return out;
}

// tanh(y) = sign(y) (1 - t) / (1 + t) with t = e^-2|y|: within about 1e-7 of tanh(y) (absolute;
// 1 - t cancels near 0, where GELU adds the result to 1).
inline float tanh_clamped(float y) {
    const float t = exp_clamped(-2.0f * std::fabs(y));
    return std::copysign((1.0f - t) / (1.0f + t), y);
}

// The activation functions of FFNs and per-layer gates, shared by every CPU row that applies one:
// SiLU as x / (1 + e^-x) and GELU's tanh form as 0.5 x (1 + tanh(y)), the formulas PyTorch
// evaluates in f32 (GELU as x * sigmoid(2y) would be closer to the real function where tanh(y)
// nears -1, and so farther from the models' reference).
inline float apply_activation(Activation activation, float x) {
    switch (activation) {
        case Activation::SiLU: return x / (1.0f + exp_clamped(-x));
        case Activation::GeluTanh: {
            constexpr float kSqrt2OverPi = 0.7978845608028654f;
            return 0.5f * x * (1.0f + tanh_clamped(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
        }
        case Activation::GeluErf: return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
        case Activation::ReLU: return x > 0.0f ? x : 0.0f;
        case Activation::SwigluOai: break;  // gated only: gated_activation
    }
    return x;
}

// A gated FFN's act(gate) * up; gpt-oss's clamped SwiGLU clamps both (min(gate, limit), up to
// [-limit, limit]) and adds 1 to up, so it stays finite for any finite input.
inline float gated_activation(Activation activation, float gate, float up, float alpha, float limit) {
    if (activation == Activation::SwigluOai) {
        const float g = std::min(gate, limit);
        const float u = std::min(std::max(up, -limit), limit);
        return (u + 1.0f) * (g / (1.0f + exp_clamped(-alpha * g)));
    }
    return apply_activation(activation, gate) * up;
}

// out[i] = act(gate[i]) * up[i] (up null: act(gate[i])) for i < n, one loop per activation so
// that each vectorizes (cpu/activation.cpp).
void activate_span(Activation activation, const float* gate, const float* up, float* out, int64_t n, float alpha,
                   float limit);

}  // namespace kcap
