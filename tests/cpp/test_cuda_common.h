// Helpers shared by the CUDA tests (test_cuda_rows.cpp on the device, test_cuda_kernels_host.cpp
// everywhere): random weights in any GGUF format, stages, the CPU reference rows, and errors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_state.h"
#include "dispatch/capability.h"
#include "dispatch/stage.h"
#include "kcap/formats.h"

namespace kcap_test {

using namespace kcap;

inline int& failures() {
    static int count = 0;
    return count;
}

#define KCAP_EXPECT(cond, ...)                                  \
    do {                                                        \
        if (!(cond)) {                                          \
            std::printf("FAIL %s:%d: ", __FILE__, __LINE__);    \
            std::printf(__VA_ARGS__);                           \
            std::printf("\n");                                  \
            ++::kcap_test::failures();                          \
        }                                                       \
    } while (0)

// ||got - ref|| / ||ref|| over all values; infinity when got holds a NaN (an unwritten,
// poisoned output) or the sizes differ.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
    if (got.size() != ref.size()) return INFINITY;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        const double d = double(got[i]) - double(ref[i]);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Two Routing buffers of n_tokens rows (n_used expert ids as floats, then their weights): how many
// ids differ, and the relative error of the weights.
struct RoutingDiff {
    int wrong_ids = 0;
    double weights_error = 0.0;
};
inline RoutingDiff routing_diff(const std::vector<float>& got, const std::vector<float>& ref, int n_tokens,
                                int n_used) {
    RoutingDiff d;
    std::vector<float> got_w, ref_w;
    for (int tok = 0; tok < n_tokens; ++tok)
        for (int j = 0; j < n_used; ++j) {
            const size_t at = size_t(tok) * 2 * size_t(n_used);
            d.wrong_ids += got[at + size_t(j)] != ref[at + size_t(j)];
            got_w.push_back(got[at + size_t(n_used + j)]);
            ref_w.push_back(ref[at + size_t(n_used + j)]);
        }
    d.weights_error = relative_error(got_w, ref_w);
    return d;
}

// The error of a matmul relative to its conditioning: ||got - ref|| / ||(|W| |x|)||, the
// scale that reordered f32 sums err against. Plain ||ref|| misleads for one output whose
// terms cancel (a lone dot product near zero).
inline double matmul_error(const std::vector<float>& got, const std::vector<float>& ref, const TensorRef& w,
                           const float* x, int64_t k, int64_t n, int64_t m) {
    std::vector<float> row(static_cast<size_t>(k));
    double num = 0.0, den = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        dequantize_row(w.format, w.row(j), row.data(), k);
        for (int64_t t = 0; t < m; ++t) {
            const float g = got[size_t(t * n + j)];
            if (!std::isfinite(g)) return INFINITY;
            double scale = 0.0;
            for (int64_t i = 0; i < k; ++i) scale += std::fabs(double(row[size_t(i)]) * double(x[t * k + i]));
            const double d = double(g) - double(ref[size_t(t * n + j)]);
            num += d * d;
            den += scale * scale;
        }
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The error of a gate_up output act(g) * u relative to its conditioning: the error the
// gate and up sums may carry (their |W| |x| scales, as matmul_error) propagated through the
// product, |act'(g)| |u| |Wg| |x| + |act(g)| |Wu| |x| with |act'| <= 1.2 (SiLU, GELU).
inline double gate_up_error(const std::vector<float>& got, const std::vector<float>& ref, const TensorRef& gate,
                            const TensorRef& up, const float* x, int64_t k, int64_t n, int64_t m, Activation act) {
    std::vector<float> g_row(static_cast<size_t>(k)), u_row(static_cast<size_t>(k));
    double num = 0.0, den = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        dequantize_row(gate.format, gate.row(j), g_row.data(), k);
        dequantize_row(up.format, up.row(j), u_row.data(), k);
        for (int64_t t = 0; t < m; ++t) {
            const float v = got[size_t(t * n + j)];
            if (!std::isfinite(v)) return INFINITY;
            double g = 0.0, u = 0.0, g_scale = 0.0, u_scale = 0.0;
            for (int64_t i = 0; i < k; ++i) {
                const double xi = double(x[t * k + i]);
                g += double(g_row[size_t(i)]) * xi, u += double(u_row[size_t(i)]) * xi;
                g_scale += std::fabs(double(g_row[size_t(i)]) * xi), u_scale += std::fabs(double(u_row[size_t(i)]) * xi);
            }
            const double a = act == Activation::SiLU ? g / (1.0 + std::exp(-g)) : 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
            const double scale = 1.2 * std::fabs(u) * g_scale + std::fabs(a) * u_scale;
            const double d = double(v) - double(ref[size_t(t * n + j)]);
            num += d * d;
            den += scale * scale;
        }
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    return v;
}

// Byte offsets of the f16 scale fields of each block format (ggml-common.h layouts), which
// random bytes would otherwise fill with huge or non-finite values.
inline std::vector<int> f16_scale_offsets(Format f) {
    switch (f) {
        case Format::Q4_0: case Format::Q5_0: case Format::Q8_0: return {0};
        case Format::Q4_1: case Format::Q5_1: return {0, 2};
        case Format::Q2_K: return {80, 82};
        case Format::Q3_K: return {108};
        case Format::Q4_K: case Format::Q5_K: return {0, 2};
        case Format::Q6_K: return {208};
        default: return {};
    }
}

// A weight tensor [rows][k] of random values in format f, owning its bytes.
struct Weights {
    TensorRef ref;
    std::vector<uint8_t> bytes;
};

inline std::unique_ptr<Weights> random_weights(std::mt19937& rng, Format f, int64_t k, int64_t rows,
                                               const std::string& name = "w") {
    auto w = std::make_unique<Weights>();
    const size_t row_size = row_bytes(f, k);
    w->bytes.resize(row_size * size_t(rows) + 16);
    const float std_dev = 1.0f / std::sqrt(float(k));
    if (f == Format::F32 || f == Format::F16 || f == Format::BF16) {
        const std::vector<float> v = random_floats(rng, size_t(k * rows), std_dev);
        for (size_t i = 0; i < v.size(); ++i) {
            if (f == Format::F32) {
                std::memcpy(w->bytes.data() + 4 * i, &v[i], 4);
            } else if (f == Format::F16) {
                const uint16_t h = f32_to_f16(v[i]);
                std::memcpy(w->bytes.data() + 2 * i, &h, 2);
            } else {
                uint32_t bits;
                std::memcpy(&bits, &v[i], 4);
                const uint16_t h = uint16_t(bits >> 16);
                std::memcpy(w->bytes.data() + 2 * i, &h, 2);
            }
        }
    } else {
        std::uniform_int_distribution<int> byte(0, 255);
        for (auto& b : w->bytes) b = uint8_t(byte(rng));
        const FormatInfo& info = format_info(f);
        const int64_t blocks = (k / info.block_elems) * rows;
        std::uniform_real_distribution<float> scale(0.5f, 1.5f);
        // Max |q * sub-scale| is up to a few hundred in these layouts; aim the product at std_dev.
        const float base = f == Format::Q8_0 ? std_dev / 64.0f
                           : (f == Format::Q4_0 || f == Format::Q4_1 || f == Format::Q5_0 || f == Format::Q5_1)
                               ? std_dev / 8.0f
                               : std_dev / 200.0f;
        for (int64_t b = 0; b < blocks; ++b) {
            uint8_t* block = w->bytes.data() + size_t(b) * info.block_bytes;
            if (f == Format::MXFP4) {
                block[0] = uint8_t(118 + byte(rng) % 6);  // 2^-9 .. 2^-4
                continue;
            }
            for (int offset : f16_scale_offsets(f)) {
                const uint16_t h = f32_to_f16(base * scale(rng) * (offset == 2 && (f == Format::Q4_1 || f == Format::Q5_1) ? -4.0f : 1.0f));
                std::memcpy(block + offset, &h, 2);
            }
        }
    }
    w->ref.name = name;
    w->ref.format = f;
    w->ref.shape = {k, rows};
    w->ref.data = w->bytes.data();
    w->ref.nbytes = row_size * size_t(rows);
    return w;
}

// MXFP4 scale bytes below 2 (values of at most 12 x 2^-128) in one block of every `every`: the
// grouped split-bf16 tiles multiply MXFP4 values as bf16 only where the scale byte lies in [2,
// 248] (cuda/mma_tiles.h, mxfp4_bf16_pairs) and stage any step that meets another block as codes
// and scales, so a weight tensor with such blocks checks both forms. Tiny values keep the outputs
// those of the other blocks.
inline void plant_tiny_mxfp4_scales(Weights& w, int every = 499) {
    if (w.ref.format != Format::MXFP4) return;
    const size_t bytes = format_info(Format::MXFP4).block_bytes;
    const size_t blocks = w.ref.nbytes / bytes;
    for (size_t b = size_t(every / 2); b < blocks; b += size_t(every)) w.bytes[b * bytes] = uint8_t((b / size_t(every)) % 2);
}

inline std::unique_ptr<Weights> float_vector(const std::vector<float>& v, const std::string& name) {
    auto w = std::make_unique<Weights>();
    w->bytes.resize(v.size() * 4);
    std::memcpy(w->bytes.data(), v.data(), v.size() * 4);
    w->ref.name = name;
    w->ref.format = Format::F32;
    w->ref.shape = {int64_t(v.size())};
    w->ref.data = w->bytes.data();
    w->ref.nbytes = w->bytes.size();
    return w;
}

inline const Row& find_row(const std::string& kernel) {
    for (const Row& row : capability_table())
        if (row.kernel == kernel) return row;
    throw std::runtime_error("no row " + kernel);
}

// The CPU reference row of the same op that decodes the same operand formats with the same
// activation encoding (a q8_1 row's twin rounds x itself: cpu.matmul_q8.*), of those that take
// any number of tokens per call.
inline const Row& cpu_twin(const Row& cuda_row) {
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CPU || row.op != cuda_row.op || row.input_encoding != cuda_row.input_encoding ||
            row.tokens.min != 1 || row.tokens.max != 0)
            continue;
        if (!cuda_row.operand_formats.empty() && !row.operand_formats.empty() &&
            row.operand_formats[0] != cuda_row.operand_formats[0])
            continue;
        return row;
    }
    throw std::runtime_error("no CPU twin for " + cuda_row.kernel);
}

// The exact (f32-activation) CPU matmul row of a weight format.
inline const Row& cpu_matmul_row(Format f) {
    for (const Row& row : capability_table())
        if (row.backend == Backend::CPU && row.op == Op::MatMul && row.input_encoding == Encoding::F32 &&
            row.operand_formats.at(0) == std::vector<Format>{f})
            return row;
    throw std::runtime_error(std::string("no CPU matmul row for ") + format_name(f));
}

// The weight format a matmul/embed row decodes.
inline Format row_format(const Row& row) { return row.operand_formats.at(0).at(0); }

// Edge sizes of K for a row: the smallest legal, an odd multiple, and a long one; for rows
// that take K below a run of 32 (float formats: the tail path), also whole runs plus a tail
// and a long K just short of a multiple of 32.
inline std::vector<int64_t> k_edges(const Row& row, int64_t longest) {
    const int64_t m = row.dims.k_multiple;
    std::vector<int64_t> ks = {m, 3 * m};
    const int64_t big = (longest / m) * m;
    if (big > 3 * m) ks.push_back(big);
    if (m < 32) {
        ks.push_back(25 * m);  // 100 for m = 4: three runs and a tail of 4
        if (big - m > 25 * m) ks.push_back(big - m);
    }
    return ks;
}

// v rounded to bf16 (nearest even, as __float2bfloat16_rn) for finite v.
inline float bf16_round(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&v, &bits, 4);
    return v;
}

// What a bf16 row multiplies: x rounded to bf16 (the reference of cuda.*_bf16 from the GEMM's
// batch size on).
inline std::vector<float> bf16_values(std::vector<float> x) {
    for (float& v : x) v = bf16_round(v);
    return x;
}

// ... and its weights: each row dequantized (gguf's values, dequantize_row) and rounded to
// bf16, as an F32 matrix of the same shape.
inline std::unique_ptr<Weights> bf16_weights(const TensorRef& w, int64_t k, int64_t rows) {
    std::vector<float> values(size_t(k * rows));
    for (int64_t j = 0; j < rows; ++j) dequantize_row(w.format, w.row(j), values.data() + j * k, k);
    auto out = float_vector(bf16_values(values), w.name + ".bf16");
    out->ref.shape = {k, rows};
    return out;
}

// The values a q8_1 row multiplies (the reference of cuda.matmul_q8.* / cuda.gate_up_q8.*): each
// 32-element run of x as d * q, d = amax / 127 in f32, q = x * (1 / d) rounded to nearest (ties
// to even), 0 where d is 0 or subnormal. kernels/matvec_q8.h's rounding restated; the host test holds the
// kernels' rounding (kernels/matvec_q8.h) to this bit for bit. K must be a multiple of 32.
inline std::vector<float> q8_1_values(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t r = 0; r + 32 <= x.size(); r += 32) {
        float amax = 0.0f;
        for (size_t i = r; i < r + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        const float id = d >= std::numeric_limits<float>::min() ? 1.0f / d : 0.0f;
        for (size_t i = r; i < r + 32; ++i) out[i] = d * std::nearbyint(x[i] * id);
    }
    return out;
}

// Where q8_1_values(x) is not determined by x alone: values whose x * (1 / d) lies within
// `margin` codes of a rounding boundary (k + 0.5). A row that computes x itself (the experts'
// activations in a q8_1 plan) sums it in its own f32 order, so two correct rows may round such
// a value a code apart (d apart); a reference allows for it (relative_error_beyond). The f32
// sums of the rows here are within about 1e-6 of each other, 1.3e-4 codes at most.
inline std::vector<char> q8_1_near_boundary(const std::vector<float>& x, double margin = 1e-3) {
    std::vector<char> out(x.size(), 0);
    for (size_t r = 0; r + 32 <= x.size(); r += 32) {
        float amax = 0.0f;
        for (size_t i = r; i < r + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        if (!(d >= std::numeric_limits<float>::min())) continue;
        for (size_t i = r; i < r + 32; ++i) {
            const double codes = double(x[i]) / double(d);
            out[i] = std::fabs(std::fabs(codes - std::floor(codes)) - 0.5) < margin;
        }
    }
    return out;
}

// relative_error of the part of each |got - ref| beyond allow[i] (the most a value may move for
// the roundings that q8_1_near_boundary finds undetermined).
inline double relative_error_beyond(const std::vector<float>& got, const std::vector<float>& ref,
                                    const std::vector<double>& allow) {
    if (got.size() != ref.size() || allow.size() != ref.size()) return INFINITY;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        const double d = std::max(0.0, std::fabs(double(got[i]) - double(ref[i])) - allow[i]);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// m rows of k values (k a multiple of 32) in the q8_1 form of kcap_q8_quantize_rows, what the
// scratch of the q8_1 rows holds (cuda::q8_rows_layout): codes [m][k] signed bytes, four to a
// word, low byte first; d [m][k / 32]; half_sums [m][k / 16], the sum of the codes of each 16
// values. The rounding of q8_1_values; the host test holds it to kcap_q8_quantize_rows bit for bit.
struct Q8Scratch {
    std::vector<uint32_t> codes;
    std::vector<float> d;
    std::vector<int32_t> half_sums;
};
inline Q8Scratch q8_1_scratch(const std::vector<float>& x, int m, int k) {
    Q8Scratch out;
    const size_t n = size_t(m) * size_t(k);
    out.codes.assign(n / 4, 0u);
    out.d.assign(n / 32, 0.0f);
    out.half_sums.assign(n / 16, 0);
    for (size_t r = 0; r + 32 <= n; r += 32) {
        float amax = 0.0f;
        for (size_t i = r; i < r + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        const float id = d >= std::numeric_limits<float>::min() ? 1.0f / d : 0.0f;
        out.d[r / 32] = d;
        for (size_t i = r; i < r + 32; ++i) {
            const int q = int(std::nearbyint(x[i] * id));
            out.codes[i / 4] |= uint32_t(uint8_t(int8_t(q))) << (8 * (i % 4));
            out.half_sums[i / 16] += q;
        }
    }
    return out;
}

inline Stage matmul_stage(const TensorRef* w, const TensorRef* bias, int64_t k, int64_t n) {
    Stage s;
    s.layer = 0;
    s.name = "matmul";
    s.op = Op::MatMul;
    s.operands = {w, bias};
    s.k = k;
    s.n = n;
    s.features = bias ? FeatureMask(kBias) : 0u;
    return s;
}

// Runs a CPU row (the reference) on host buffers.
inline void run_cpu(const Row& row, const Stage& stage, KernelCall call, CpuState& state) {
    call.backend_state = &state;
    row.fn(stage, call);
}

// References of the fused rows, composed of the CPU rows of the stages they replace.

// add_norm: residual (in place) += scale * [post_norm](branch); returns norm(residual).
// stage: the fused stage (operands post weight, post bias, weight, bias; features).
inline std::vector<float> cpu_add_norm(const Stage& fused, int tokens, std::vector<float>& residual,
                                       std::vector<float> branch, CpuState& cpu) {
    const FeatureMask kind = fused.features & (kRmsNorm | kLayerNorm);
    auto norm_stage = [&](const TensorRef* w, const TensorRef* b) {
        Stage s;
        s.op = Op::Norm;
        s.operands = {w, b};
        s.k = s.n = fused.n;
        s.params.eps = fused.params.eps;
        s.features = kind | (b ? FeatureMask(kBias) : 0u) | (w ? 0u : FeatureMask(kParameterFreeNorm));
        return s;
    };
    KernelCall call;
    call.n_tokens = tokens;
    if (fused.features & kPostNorm) {
        std::vector<float> normed_branch(branch.size());
        call.in = branch.data();
        call.out = normed_branch.data();
        run_cpu(find_row("cpu.norm"), norm_stage(fused.operands[0], fused.operands[1]), call, cpu);
        branch = normed_branch;
    }
    Stage add;
    add.op = Op::Add;
    add.k = add.n = fused.n;
    add.params.scale = fused.params.scale;
    std::vector<float> sum(residual.size());
    call.in = residual.data();
    call.in2 = branch.data();
    call.out = sum.data();
    run_cpu(find_row("cpu.add"), add, call, cpu);
    residual = sum;
    std::vector<float> normed(residual.size());
    call.in = residual.data();
    call.in2 = nullptr;
    call.out = normed.data();
    run_cpu(find_row("cpu.norm"), norm_stage(fused.operands[2], fused.operands[3]), call, cpu);
    return normed;
}

// qk_norm_rope: cpu.norm over each head of q and of k (their weights), then cpu.rope; in place.
// stage: the fused stage (operands q_norm, k_norm, factors; rope params; eps).
inline void cpu_qk_norm_rope(const Stage& fused, int tokens, int pos0, std::vector<float>& q, std::vector<float>& k,
                             CpuState& cpu) {
    KernelCall call;
    call.n_tokens = tokens;
    for (int which = 0; which < 2; ++which) {
        Stage norm;
        norm.op = Op::Norm;
        norm.operands = {fused.operands[size_t(which)], nullptr};
        norm.k = fused.params.head_dim;
        norm.groups = which == 0 ? fused.params.n_head : fused.params.n_head_kv;
        norm.n = norm.k * norm.groups;
        norm.params.eps = fused.params.eps;
        norm.features = kRmsNorm;
        std::vector<float>& x = which == 0 ? q : k;
        std::vector<float> y(x.size());
        call.in = x.data();
        call.out = y.data();
        run_cpu(find_row("cpu.norm"), norm, call, cpu);
        x = y;
    }
    Stage rope = fused;
    rope.op = Op::Rope;
    rope.operands = {fused.operands.size() > 2 ? fused.operands[2] : nullptr};
    rope.features = fused.features & ~FeatureMask(kRmsNorm);
    call.in = nullptr;
    call.pos0 = pos0;
    call.out = q.data();
    call.inout2 = k.data();
    run_cpu(find_row("cpu.rope"), rope, call, cpu);
}

// What an attention stage that owns its rope (planner: rope or qk_norm_rope + attention; operands
// q_norm, k_norm, factors) applies to Q and the new K before attending: cpu_qk_norm_rope when it
// has the QK-norm (kRmsNorm), else cpu.rope; in place.
inline void cpu_owned_rope(const Stage& attn, int tokens, int pos0, std::vector<float>& q, std::vector<float>& k,
                           CpuState& cpu) {
    Stage rope = attn;
    rope.features = attn.features & (kRopeNormal | kRopeNeox | kRopeFreqFactors | kPartialRotary | kRmsNorm);
    if (attn.features & kRmsNorm) {
        rope.op = Op::QkNormRope;
        cpu_qk_norm_rope(rope, tokens, pos0, q, k, cpu);
        return;
    }
    rope.op = Op::Rope;
    rope.operands = {attn.operands.size() > 2 ? attn.operands[2] : nullptr};
    KernelCall call;
    call.n_tokens = tokens;
    call.pos0 = pos0;
    call.out = q.data();
    call.inout2 = k.data();
    run_cpu(find_row("cpu.rope"), rope, call, cpu);
}

// The attention stage without the rope it owns (what the CPU reference attends with).
inline Stage without_rope(const Stage& attn) {
    Stage plain = attn;
    plain.features &= ~FeatureMask(kRopeNormal | kRopeNeox | kRopeFreqFactors | kPartialRotary | kRmsNorm);
    plain.operands.clear();
    return plain;
}

// gate_up: act(W_gate x) * (W_up x) through the CPU matmul row of the format and cpu.ffn_activation.
inline std::vector<float> cpu_gate_up(const Row& cpu_matmul, const TensorRef& gate, const TensorRef& up,
                                      const std::vector<float>& x, int64_t k, int64_t n, int m, Activation act,
                                      CpuState& cpu) {
    std::vector<float> g(size_t(m * n)), u(size_t(m * n)), out(size_t(m * n));
    KernelCall call;
    call.n_tokens = m;
    call.in = x.data();
    call.out = g.data();
    run_cpu(cpu_matmul, matmul_stage(&gate, nullptr, k, n), call, cpu);
    call.out = u.data();
    run_cpu(cpu_matmul, matmul_stage(&up, nullptr, k, n), call, cpu);
    Stage s;
    s.op = Op::FfnActivation;
    s.k = s.n = n;
    s.params.activation = act;
    s.features = kGated;
    call.in = g.data();
    call.in2 = u.data();
    call.out = out.data();
    run_cpu(find_row("cpu.ffn_activation"), s, call, cpu);
    return out;
}

}  // namespace kcap_test
