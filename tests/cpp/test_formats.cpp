// ctest for the formats core: half-precision conversions, the format table and row sizes,
// dot_row (every build of it present: portable, AVX2, AVX-512, NEON, SDOT; and the dispatched one
// at every cap_cpu_kernels level) against an f64 sum over dequantize_row, and the
// errors for bad sizes and unknown types. Bit-exactness of dequantize_row against gguf-py is
// checked by tests/python/test_formats.py.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <utility>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/formats_blocks.h"
#include "core/formats_dot_paths.h"
#include "cpu/matmul_f32_gemm.h"
#include "cpu/matmul_q8_pack.h"
#include "cpu/scratch.h"
#include "cpu/thread_pool.h"
#include "kcap/errors.h"
#include "kcap/formats.h"

using kcap::Format;

namespace {

int passed = 0;
int failed = 0;

void check(bool ok, const std::string& what) {
    if (ok) {
        ++passed;
    } else {
        ++failed;
        std::printf("FAIL: %s\n", what.c_str());
    }
}

// True when fn throws kcap::FormatError whose message contains every one of `mentions`.
bool throws_format_error(const std::function<void()>& fn, const std::vector<std::string>& mentions = {}) {
    try {
        fn();
    } catch (const kcap::FormatError& e) {
        const std::string message = e.what();
        for (const std::string& m : mentions)
            if (message.find(m) == std::string::npos) {
                std::printf("  message \"%s\" does not mention \"%s\"\n", message.c_str(), m.c_str());
                return false;
            }
        return true;
    } catch (...) {
        return false;
    }
    return false;
}

uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
}
float float_of(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}
bool is_half_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

void test_half_conversions() {
    // Known values.
    check(kcap::f16_to_f32(0x3c00) == 1.0f, "f16 0x3c00 is 1");
    check(kcap::f16_to_f32(0xc000) == -2.0f, "f16 0xc000 is -2");
    check(kcap::f16_to_f32(0x7bff) == 65504.0f, "f16 0x7bff is 65504");
    check(kcap::f16_to_f32(0x0001) == std::ldexp(1.0f, -24), "f16 0x0001 is 2^-24");
    check(kcap::f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24), "f16 0x03ff is the largest subnormal");
    check(std::isinf(kcap::f16_to_f32(0xfc00)) && kcap::f16_to_f32(0xfc00) < 0, "f16 0xfc00 is -inf");
    check(bits_of(kcap::f16_to_f32(0x8000)) == 0x80000000u, "f16 -0 keeps its sign");
    check(std::isnan(kcap::f16_to_f32(0x7e00)), "f16 0x7e00 is NaN");

    // Every non-NaN half survives f16 -> f32 -> f16; NaN stays NaN.
    int round_trip_failures = 0;
    for (uint32_t h = 0; h <= 0xffff; ++h) {
        const uint16_t back = kcap::f32_to_f16(kcap::f16_to_f32(static_cast<uint16_t>(h)));
        const bool ok = is_half_nan(static_cast<uint16_t>(h)) ? is_half_nan(back) : back == h;
        if (!ok) ++round_trip_failures;
    }
    check(round_trip_failures == 0, "all 65536 halves round-trip (" + std::to_string(round_trip_failures) + " failed)");

    // Rounding to nearest, ties to even: between consecutive positive finite halves h, h+1,
    // the exact midpoint goes to the even one and the floats just either side go to the
    // nearer one. (A midpoint needs 12 significant bits, so it is exact in f32.)
    int rounding_failures = 0;
    for (uint16_t h = 0; h < 0x7bff; ++h) {
        const float low = kcap::f16_to_f32(h), high = kcap::f16_to_f32(static_cast<uint16_t>(h + 1));
        const float mid = low + (high - low) / 2;
        const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
        if (kcap::f32_to_f16(mid) != even) ++rounding_failures;
        if (kcap::f32_to_f16(std::nextafter(mid, 0.0f)) != h) ++rounding_failures;
        if (kcap::f32_to_f16(std::nextafter(mid, 1e9f)) != h + 1) ++rounding_failures;
        if (kcap::f32_to_f16(-mid) != (even | 0x8000)) ++rounding_failures;
    }
    check(rounding_failures == 0, "f32 -> f16 rounds to nearest, ties to even (" + std::to_string(rounding_failures) +
                                      " failed)");

    // Range ends: overflow to inf at and above 65520, underflow to zero at and below 2^-25.
    check(kcap::f32_to_f16(65519.996f) == 0x7bff, "65519.99 rounds to 65504");
    check(kcap::f32_to_f16(65520.0f) == 0x7c00, "65520 rounds to inf");
    check(kcap::f32_to_f16(1e30f) == 0x7c00, "1e30 overflows to inf");
    check(kcap::f32_to_f16(-1e30f) == 0xfc00, "-1e30 overflows to -inf");
    check(kcap::f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000, "2^-25 ties to zero");
    check(kcap::f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001, "just above 2^-25 is 2^-24");
    check(kcap::f32_to_f16(1e-30f) == 0x0000, "1e-30 underflows to zero");
    check(kcap::f32_to_f16(-0.0f) == 0x8000, "-0 keeps its sign");
    check(is_half_nan(kcap::f32_to_f16(std::nanf(""))), "NaN stays NaN");
    check(kcap::f32_to_f16(float_of(0x7f800000u)) == 0x7c00, "inf stays inf");

    check(kcap::bf16_to_f32(0x3f80) == 1.0f, "bf16 0x3f80 is 1");
    check(kcap::bf16_to_f32(0xc0a0) == -5.0f, "bf16 0xc0a0 is -5");
    check(bits_of(kcap::bf16_to_f32(0x0001)) == 0x00010000u, "bf16 subnormal is the high half of the f32");
}

void test_format_table() {
    struct Expected {
        Format format;
        const char* name;
        int id, block_elems, block_bytes;
    };
    const Expected expected[] = {
        {Format::F32, "F32", 0, 1, 4},       {Format::F16, "F16", 1, 1, 2},
        {Format::Q4_0, "Q4_0", 2, 32, 18},   {Format::Q4_1, "Q4_1", 3, 32, 20},
        {Format::Q5_0, "Q5_0", 6, 32, 22},   {Format::Q5_1, "Q5_1", 7, 32, 24},
        {Format::Q8_0, "Q8_0", 8, 32, 34},   {Format::Q2_K, "Q2_K", 10, 256, 84},
        {Format::Q3_K, "Q3_K", 11, 256, 110}, {Format::Q4_K, "Q4_K", 12, 256, 144},
        {Format::Q5_K, "Q5_K", 13, 256, 176}, {Format::Q6_K, "Q6_K", 14, 256, 210},
        {Format::BF16, "BF16", 30, 1, 2},    {Format::MXFP4, "MXFP4", 39, 32, 17},
    };
    check(kcap::all_formats().size() == sizeof expected / sizeof expected[0], "all_formats lists 14 formats");
    for (const Expected& e : expected) {
        const std::string name = e.name;
        const kcap::FormatInfo& info = kcap::format_info(e.format);
        check(info.name == name && info.block_elems == e.block_elems && info.block_bytes == e.block_bytes,
              name + " geometry");
        check(kcap::format_from_ggml_type(e.id) == e.format, name + " from its GGML id");
        check(kcap::is_supported_ggml_type(e.id), name + " is supported");
        check(kcap::format_from_name(name) == e.format, name + " from its name");
        std::string lower = name;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        check(kcap::format_from_name(lower) == e.format, name + " from its lower-case name");
        check(std::string(kcap::format_name(e.format)) == name, name + " format_name");
        check(kcap::row_bytes(e.format, 0) == 0, name + " empty row");
        check(kcap::row_bytes(e.format, 3 * e.block_elems) == static_cast<size_t>(3 * e.block_bytes),
              name + " row_bytes of 3 blocks");
        if (e.block_elems > 1)
            check(throws_format_error([&] { kcap::row_bytes(e.format, e.block_elems + 1); },
                                      {name, std::to_string(e.block_elems + 1), std::to_string(e.block_elems)}),
                  name + " row_bytes refuses a partial block");
        check(throws_format_error([&] { kcap::row_bytes(e.format, -e.block_elems); }), name + " refuses a negative row");
    }
    check(kcap::row_bytes(Format::Q4_K, 4096) == 16 * 144, "Q4_K 4096-element row is 2304 bytes");

    check(!kcap::is_supported_ggml_type(16), "IQ2_XXS (16) is not supported");
    check(throws_format_error([] { kcap::format_from_ggml_type(16); }, {"16", "IQ2_XXS"}),
          "GGML type 16 is refused by id and name");
    check(throws_format_error([] { kcap::format_from_ggml_type(4); }, {"4"}), "retired GGML type 4 is refused");
    check(throws_format_error([] { kcap::format_from_ggml_type(-1); }, {"-1"}), "negative GGML type is refused");
    check(throws_format_error([] { kcap::format_from_ggml_type(1000); }, {"1000"}), "GGML type 1000 is refused");
    check(throws_format_error([] { kcap::format_from_name("IQ4_XS"); }, {"IQ4_XS", "23"}),
          "a known but unsupported name is refused with its id");
    check(throws_format_error([] { kcap::format_from_name("Q9_Z"); }, {"Q9_Z"}), "an unknown name is refused");
    check(throws_format_error([] { kcap::format_from_name(""); }), "an empty name is refused");
    check(throws_format_error([] { kcap::format_info(static_cast<Format>(16)); }, {"IQ2_XXS"}),
          "format_info refuses an unsupported enum value");
}

// Byte offsets of the f16 scale fields inside one block (random bytes there could be
// inf/NaN; they are overwritten with finite scales).
std::vector<int> half_scale_offsets(Format format) {
    switch (format) {
        case Format::Q4_0: case Format::Q5_0: case Format::Q8_0: return {0};
        case Format::Q4_1: case Format::Q5_1: case Format::Q4_K: case Format::Q5_K: return {0, 2};
        case Format::Q2_K: return {80, 82};
        case Format::Q3_K: return {108};
        case Format::Q6_K: return {208};
        default: return {};
    }
}

// A row of random blocks with finite scales (or, for float formats, finite values of
// moderate size, so that no product overflows).
std::vector<uint8_t> random_row(Format format, int64_t n_elems, std::mt19937& rng) {
    const kcap::FormatInfo& info = kcap::format_info(format);
    std::vector<uint8_t> row(kcap::row_bytes(format, n_elems));
    for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    const int64_t n_blocks = n_elems / info.block_elems;
    for (int64_t b = 0; b < n_blocks; ++b) {
        uint8_t* block = row.data() + b * info.block_bytes;
        switch (format) {
            case Format::F32: {
                const float v = value(rng);
                std::memcpy(block, &v, 4);
                break;
            }
            case Format::F16: {
                const uint16_t h = kcap::f32_to_f16(value(rng));
                std::memcpy(block, &h, 2);
                break;
            }
            case Format::BF16: {
                const uint16_t h = static_cast<uint16_t>(bits_of(value(rng)) >> 16);
                std::memcpy(block, &h, 2);
                break;
            }
            case Format::MXFP4:
                block[0] = static_cast<uint8_t>(110 + rng() % 30);  // scales 2^-17 .. 2^12
                break;
            default:
                for (int offset : half_scale_offsets(format)) {
                    const uint16_t h = kcap::f32_to_f16(value(rng) * (rng() % 2 ? 1.0f : 1e-3f));
                    std::memcpy(block + offset, &h, 2);
                }
        }
    }
    return row;
}

// |dot_row - f64 reference| <= (n/32 + 16) * 2^-24 * sum|w x|. Each build sums with at least
// 32 independent f32 partial sums (partial chunks are zero-padded into them, never summed in
// a scalar tail), so every term goes through at most ceil(n/32) additions in its lane, at
// most 6 in the final fixed-order reduction and 1 rounding of its product; the weights
// themselves are exact (test_dot_one_hot_recovers_weights). Each rounding is at most 2^-24
// relative; 16 covers the fixed terms with margin. For n = 4096 this is 8.6e-6 * sum|w x|.
double dot_tolerance(int64_t n_elems, double magnitude) {
    return (static_cast<double>(n_elems) / 32.0 + 16.0) * std::ldexp(1.0, -24) * magnitude;
}

using DotFunction = float (*)(Format, const void*, const float*, int64_t);

void test_dot_against_dequantize(const char* build, DotFunction dot) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::string worst_summary;
    for (const kcap::FormatInfo& info : kcap::all_formats()) {
        const int block = info.block_elems > 1 ? info.block_elems : 1;
        // One block, a few, Gemma's 640 (a tail after whole groups of 8 blocks), 4096, and odd
        // lengths for the float formats' zero-padded tail: shorter than one 32-element step, one
        // step and a tail, several steps and a tail.
        std::vector<int64_t> lengths = {block, 3 * block, 4096};
        if (block <= 128) lengths.push_back(640);
        if (block == 1) lengths.insert(lengths.end(), {7, 37, 111});
        int worst_failures = 0;
        double worst_ratio = 0.0;
        for (int64_t n : lengths) {
            for (int trial = 0; trial < 8; ++trial) {
                const std::vector<uint8_t> row = random_row(info.format, n, rng);
                std::vector<float> x(n), w(n);
                for (float& v : x) v = normal(rng);
                kcap::dequantize_row(info.format, row.data(), w.data(), n);
                double reference = 0.0, magnitude = 0.0;
                for (int64_t i = 0; i < n; ++i) {
                    reference += static_cast<double>(w[i]) * x[i];
                    magnitude += std::fabs(static_cast<double>(w[i]) * x[i]);
                }
                const double got = dot(info.format, row.data(), x.data(), n);
                const double error = std::fabs(got - reference);
                const double tolerance = dot_tolerance(n, magnitude);
                if (tolerance > 0) worst_ratio = std::max(worst_ratio, error / tolerance);
                if (!(error <= tolerance)) {
                    ++worst_failures;
                    std::printf("  %s %s n=%lld: got %.9g, f64 %.9g, error %.3g > tolerance %.3g\n", build, info.name,
                                static_cast<long long>(n), got, reference, error, tolerance);
                }
            }
        }
        check(worst_failures == 0, std::string(build) + " " + info.name + " within tolerance");
        char ratio[32];
        std::snprintf(ratio, sizeof ratio, " %s %.3f", info.name, worst_ratio);
        worst_summary += ratio;
    }
    std::printf("%s: largest error as a fraction of the tolerance:%s\n", build, worst_summary.c_str());
}

// dot_row_q8_1 (q8_1 activations: the CPU's cpu.matmul_q8.* decode rows) against an f64 sum of
// dequantize_row times the rounded values d * q. Bound: dot_tolerance times 8. The integer
// products are exact (the formats' biases subtracted in int32 too), but a run's result is
// scale * sum(code * q) + offset * sum(q) for the formats with offsets (the K-quants' mins), and
// those two f32 terms can be several times the run's |w x| before they cancel: 8 covers a
// factor 4 of cancellation with the rounding of d * scale on top.
using DotQ8Function = float (*)(Format, const void*, kcap::Q8View, int64_t);

void test_dot_q8_1(const char* build, DotQ8Function dot) {
    std::mt19937 rng(4321);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::string summary;
    int formats = 0;
    for (const kcap::FormatInfo& info : kcap::all_formats()) {
        if (info.format == Format::F32 || info.format == Format::F16 || info.format == Format::BF16) continue;
        ++formats;
        double worst_ratio = 0.0;
        int failures_here = 0;
        for (int64_t n : {int64_t(info.block_elems), int64_t(info.block_elems) * 3,
                          int64_t(640 / info.block_elems) * info.block_elems, int64_t(4096)}) {
            if (n == 0) continue;
            for (int trial = 0; trial < 8; ++trial) {
                const std::vector<uint8_t> row = random_row(info.format, n, rng);
                std::vector<float> x(n), w(n), xr(n);
                for (float& v : x) v = normal(rng);
                if (trial == 0)
                    for (int64_t i = 0; i < 32; ++i) x[i] = 0.0f;  // a run of zeros: d = 0
                if (trial == 1)
                    for (float& v : x) v = std::fabs(v);  // one sign: a bias folded into f32 would cancel
                std::vector<int8_t> q(n);
                std::vector<float> d(n / 32);
                std::vector<int32_t> sum16(n / 16);
                kcap::quantize_q8_1(x.data(), n, q.data(), d.data(), sum16.data());
                kcap::round_q8_1(x.data(), n, xr.data());
                kcap::dequantize_row(info.format, row.data(), w.data(), n);
                double reference = 0.0, magnitude = 0.0;
                for (int64_t i = 0; i < n; ++i) {
                    check(xr[i] == d[i / 32] * static_cast<float>(q[i]), "round_q8_1 is d * q of quantize_q8_1");
                    reference += static_cast<double>(w[i]) * xr[i];
                    magnitude += std::fabs(static_cast<double>(w[i]) * xr[i]);
                }
                const double got = dot(info.format, row.data(), {q.data(), d.data(), sum16.data()}, n);
                const double error = std::fabs(got - reference), tolerance = 8.0 * dot_tolerance(n, magnitude);
                if (tolerance > 0) worst_ratio = std::max(worst_ratio, error / tolerance);
                if (!(error <= tolerance)) {
                    ++failures_here;
                    std::printf("  %s %s n=%lld: got %.9g, f64 %.9g, error %.3g > %.3g\n", build, info.name,
                                static_cast<long long>(n), got, reference, error, tolerance);
                }
            }
        }
        check(failures_here == 0, std::string(build) + " " + info.name + " q8_1 within tolerance");
        char ratio[32];
        std::snprintf(ratio, sizeof ratio, " %s %.3f", info.name, worst_ratio);
        summary += ratio;
    }
    check(formats == 11, "dot_row_q8_1 covers the 11 quantized formats");
    std::printf("%s: largest error as a fraction of the tolerance:%s\n", build, summary.c_str());
}

// n_rows random rows of k elements in `format`, one after another; values gets their decoded weights.
std::vector<uint8_t> random_matrix(Format format, int64_t n_rows, int64_t k, std::mt19937& rng,
                                   std::vector<float>& values) {
    std::vector<uint8_t> w;
    values.resize(size_t(n_rows * k));
    for (int64_t r = 0; r < n_rows; ++r) {
        const std::vector<uint8_t> row = random_row(format, k, rng);
        kcap::dequantize_row(format, row.data(), values.data() + r * k, k);
        w.insert(w.end(), row.begin(), row.end());
    }
    return w;
}

// A GEMM's output y[t * y_stride + r] (r < n_rows, t < n_tokens) against the f64 sums
// bias[r] + w[r] . x[t] (rows of k), within tolerance(sum |w x|); past n_rows y must still hold its
// NaN poison. Returns the failures (the first three printed) and raises worst_ratio to the largest
// error as a fraction of the tolerance.
template <class Tolerance>
int check_gemm_output(const char* what, const char* format, int64_t k, const std::vector<float>& w, const float* x,
                      const std::vector<float>& bias, const std::vector<float>& y, int64_t n_rows, int64_t n_tokens,
                      int64_t y_stride, Tolerance tolerance, double& worst_ratio) {
    int failures = 0;
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < n_rows; ++r) {
            double reference = bias[size_t(r)], magnitude = std::fabs(bias[size_t(r)]);
            for (int64_t i = 0; i < k; ++i) {
                const double p = static_cast<double>(w[size_t(r * k + i)]) * x[t * k + i];
                reference += p;
                magnitude += std::fabs(p);
            }
            const double got = y[size_t(t * y_stride + r)];
            const double error = std::fabs(got - reference), bound = tolerance(magnitude);
            if (bound > 0) worst_ratio = std::max(worst_ratio, error / bound);
            if (!(error <= bound) && ++failures <= 3)
                std::printf("  %s %s k=%lld row %lld token %lld: got %.9g, f64 %.9g, error %.3g > %.3g\n", what, format,
                            static_cast<long long>(k), static_cast<long long>(r), static_cast<long long>(t), got,
                            reference, error, bound);
        }
        for (int64_t r = n_rows; r < y_stride; ++r)
            if (!std::isnan(y[size_t(t * y_stride + r)])) ++failures;  // written past the rows
    }
    return failures;
}

// The CPU's int8 GEMM (cpu/matmul_q8_pack.h: cpu.matmul_q8.* over several tokens where the CPU
// has AVX-512 VNNI or AVX2; the build the cap allows) against the same f64 sums as test_dot_q8_1 (the same bound: its per-group
// f32 steps are those of dot_row_q8_1), for every format with integer codes: row counts that
// fill a 16-row tile or leave part of it, token counts around the 4-token micro-kernel and past
// the 64-token block, and lengths that end inside a 256-value super-block. The output is
// poisoned first, and a token offset into the packed activations is used.
void test_gemm_q8(const std::string& label) {
    if (!kcap::q8_gemm::runs(Format::Q4_K)) {
        std::printf("note: no int8 GEMM for %s (build or CPU); it is not tested\n", label.c_str());
        return;
    }
    std::mt19937 rng(777);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    kcap::ThreadPool pool(2);
    std::string summary;
    int formats = 0;
    for (const kcap::FormatInfo& info : kcap::all_formats()) {
        if (!kcap::q8_gemm::runs(info.format)) continue;
        ++formats;
        double worst_ratio = 0.0;
        int failures_here = 0;
        const int64_t block = info.block_elems;
        for (int64_t k : {block * ((96 + block - 1) / block), int64_t(768), int64_t(2048 + 256 + block)}) {
            if (k % block) continue;
            for (const auto& [n_rows, n_tokens] : {std::pair<int64_t, int64_t>{16, 4}, {19, 7}, {5, 1}, {33, 70}}) {
                const int64_t t0 = 2, all_tokens = n_tokens + t0;
                std::vector<float> wf;
                const std::vector<uint8_t> w = random_matrix(info.format, n_rows, k, rng, wf);
                std::vector<float> x(size_t(all_tokens * k)), xr(x.size());
                for (float& v : x) v = normal(rng);
                for (int64_t i = 0; i < 32; ++i) x[size_t(t0 * k + i)] = 0.0f;  // a run of zeros: d = 0
                if (n_tokens > 1)  // one sign: a bias folded into f32 would cancel
                    for (int64_t i = 0; i < k; ++i) x[size_t((t0 + 1) * k + i)] = std::fabs(x[size_t((t0 + 1) * k + i)]);
                kcap::round_q8_1(x.data(), int64_t(x.size()), xr.data());
                kcap::q8_gemm::Tokens packed;
                packed.pack(x.data(), all_tokens, k, pool);
                std::vector<float> bias(static_cast<size_t>(n_rows));
                for (float& b : bias) b = normal(rng);
                const int64_t y_stride = n_rows + 3;
                std::vector<float> y(size_t(n_tokens * y_stride), std::nanf(""));
                kcap::q8_gemm::multiply(info.format, w.data(), n_rows, k, packed, t0, n_tokens, bias.data(), y.data(),
                                        y_stride, pool);
                failures_here += check_gemm_output(
                    label.c_str(), info.name, k, wf, xr.data() + t0 * k, bias, y, n_rows, n_tokens, y_stride,
                    [&](double magnitude) { return 8.0 * dot_tolerance(k, magnitude); }, worst_ratio);
            }
        }
        check(failures_here == 0, label + " " + info.name + " within tolerance");
        char ratio[32];
        std::snprintf(ratio, sizeof ratio, " %s %.3f", info.name, worst_ratio);
        summary += ratio;
    }
    check(formats == 11, label + " covers the 11 quantized formats");
    std::printf("%s: largest error as a fraction of the tolerance:%s\n", label.c_str(), summary.c_str());
}

// The GEMM's vector packing of Q4_K, Q5_K and Q6_K rows (q4_k_rows, q5_k_rows, q6_k_rows of each
// build the CPU runs) gives exactly CodesOf's codes (interleaved as interleave() does), scales and
// offsets; that of Q8_0, Q4_0 and MXFP4 rows (legacy_rows) CodesOf's codes in order and scales.
void test_gemm_q8_vector_packing() {
    using kcap::blocks::BlockCodes;
    using kcap::blocks::CodesOf;
    std::mt19937 rng(779);
    struct Build {
        const char* name;
        bool runs;
        void (*interleave)(const uint8_t*, int64_t, uint8_t*);
        void (*q4_k_rows)(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*);
        void (*q5_k_rows)(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*);
        void (*q6_k_rows)(const uint8_t*, int64_t, int64_t, uint8_t*, float*);
        void (*legacy_rows)(Format, const uint8_t*, int64_t, uint8_t*, float*);
    };
    namespace g = kcap::q8_gemm;
    const bool avx2_runs = g::avx2::compiled() && (kcap::avx2_kernels_in_use() || kcap::avx512_kernels_in_use());
    const Build builds[] = {
        {"avx512", g::avx512::compiled() && kcap::avx512_kernels_in_use(), g::avx512::interleave,
         g::avx512::q4_k_rows, g::avx512::q5_k_rows, g::avx512::q6_k_rows, g::avx2::legacy_rows},
        {"avx2", avx2_runs, g::avx2::interleave, g::avx2::q4_k_rows, g::avx2::q5_k_rows, g::avx2::q6_k_rows,
         g::avx2::legacy_rows},
    };
    for (const Build& build : builds) {
        if (!build.runs) {
            std::printf("note: no %s int8 GEMM packing here (build or CPU); it is not tested\n", build.name);
            continue;
        }
        for (const Format format : {Format::Q4_K, Format::Q5_K, Format::Q6_K}) {
            const int64_t n_blocks = 5, k = 256 * n_blocks;
            const std::vector<uint8_t> row = random_row(format, k, rng);
            const int64_t block_bytes = kcap::format_info(format).block_bytes;
            std::vector<uint8_t> linear(static_cast<size_t>(k)), want(linear.size()), got(linear.size(), 0xee);
            std::vector<float> want_scale(size_t(k / 16)), want_offset(size_t(k / 16));
            std::vector<float> got_scale(size_t(k / 16), std::nanf("")), got_offset(size_t(k / 16), std::nanf(""));
            for (int64_t b = 0; b < n_blocks; ++b) {
                BlockCodes<256> c;
                if (format == Format::Q4_K)
                    CodesOf<kcap::blocks::BlockQ4_K>::get(
                        *reinterpret_cast<const kcap::blocks::BlockQ4_K*>(row.data() + b * block_bytes), c);
                else if (format == Format::Q5_K)
                    CodesOf<kcap::blocks::BlockQ5_K>::get(
                        *reinterpret_cast<const kcap::blocks::BlockQ5_K*>(row.data() + b * block_bytes), c);
                else
                    CodesOf<kcap::blocks::BlockQ6_K>::get(
                        *reinterpret_cast<const kcap::blocks::BlockQ6_K*>(row.data() + b * block_bytes), c);
                std::memcpy(linear.data() + 256 * b, c.codes, 256);
                std::copy(c.scale, c.scale + 16, want_scale.begin() + 16 * b);
                std::copy(c.offset, c.offset + 16, want_offset.begin() + 16 * b);
            }
            build.interleave(linear.data(), n_blocks, want.data());
            if (format == Format::Q4_K)
                build.q4_k_rows(row.data(), n_blocks, block_bytes, got.data(), got_scale.data(), got_offset.data());
            else if (format == Format::Q5_K)
                build.q5_k_rows(row.data(), n_blocks, block_bytes, got.data(), got_scale.data(), got_offset.data());
            else
                build.q6_k_rows(row.data(), n_blocks, block_bytes, got.data(), got_scale.data());
            const bool offsets = format == Format::Q6_K ||
                                 std::memcmp(want_offset.data(), got_offset.data(), want_offset.size() * 4) == 0;
            check(got == want && std::memcmp(want_scale.data(), got_scale.data(), want_scale.size() * 4) == 0 && offsets,
                  std::string(build.name) + " packs " + kcap::format_info(format).name +
                      " rows as CodesOf's codes, scales and offsets");
        }
        for (const Format format : {Format::Q8_0, Format::Q4_0, Format::MXFP4}) {
            const int64_t n_blocks = 37, k = 32 * n_blocks;
            const std::vector<uint8_t> row = random_row(format, k, rng);
            const int64_t block_bytes = kcap::format_info(format).block_bytes;
            std::vector<uint8_t> want(static_cast<size_t>(k)), got(want.size(), 0xee);
            std::vector<float> want_scale(size_t(k / 16)), got_scale(want_scale.size(), std::nanf(""));
            for (int64_t b = 0; b < n_blocks; ++b) {
                BlockCodes<32> c;
                const uint8_t* block = row.data() + b * block_bytes;
                if (format == Format::Q8_0)
                    CodesOf<kcap::blocks::BlockQ8_0>::get(*reinterpret_cast<const kcap::blocks::BlockQ8_0*>(block), c);
                else if (format == Format::Q4_0)
                    CodesOf<kcap::blocks::BlockQ4_0>::get(*reinterpret_cast<const kcap::blocks::BlockQ4_0*>(block), c);
                else
                    CodesOf<kcap::blocks::BlockMXFP4>::get(*reinterpret_cast<const kcap::blocks::BlockMXFP4*>(block), c);
                std::memcpy(want.data() + 32 * b, c.codes, 32);
                std::copy(c.scale, c.scale + 2, want_scale.begin() + 2 * b);
            }
            build.legacy_rows(format, row.data(), n_blocks, got.data(), got_scale.data());
            check(got == want && std::memcmp(want_scale.data(), got_scale.data(), want_scale.size() * 4) == 0,
                  std::string(build.name) + " unpacks " + kcap::format_info(format).name +
                      " rows as CodesOf's codes and scales");
        }
    }
}

// The AVX-512 VNNI and AVX2 builds of the int8 GEMM form the same exact int32 group sums and the
// same f32 steps, so they agree bit for bit (where the CPU runs both: capped at avx2 for the
// second), for every format with integer codes, rows of random codes and rows of each format's
// extreme codes against tokens of extreme codes (the AVX2 build sums products in int16 within
// bounds that those reach: Q8_0's signed codes one step at a time, Q6_K's 64 two, the rest four).
void test_gemm_q8_builds_agree() {
    if (!kcap::avx512_kernels_in_use() || !kcap::q8_gemm::runs(Format::Q4_K)) {
        std::printf("note: the int8 GEMM's AVX-512 and AVX2 builds are not compared here (build or CPU)\n");
        return;
    }
    std::mt19937 rng(778);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    kcap::ThreadPool pool(2);
    int formats = 0;
    for (const kcap::FormatInfo& info : kcap::all_formats()) {
        if (!kcap::q8_gemm::runs(info.format)) continue;
        ++formats;
        const int64_t n_rows = 21, n_tokens = 9, k = 768 + 256;
        std::vector<float> wf;
        std::vector<uint8_t> w = random_matrix(info.format, n_rows, k, rng, wf);
        // The first 4 rows with every code at its largest byte (Q8_0: at -128, MXFP4: at 6), the
        // scales finite; tokens 0 and 1 all +1 and all -1 (codes +-127): the largest int16 sums.
        const size_t row_size = kcap::row_bytes(info.format, k);
        for (size_t i = 0; i < 4 * row_size; ++i)
            w[i] = info.format == Format::Q8_0 ? 0x80 : info.format == Format::MXFP4 ? 0x77 : 0xff;
        for (int64_t b = 0; b < 4 * k / info.block_elems; ++b) {
            uint8_t* block = w.data() + b * info.block_bytes;
            if (info.format == Format::MXFP4) block[0] = 127;
            for (int offset : half_scale_offsets(info.format)) {
                const uint16_t one = kcap::f32_to_f16(1.0f);
                std::memcpy(block + offset, &one, 2);
            }
        }
        std::vector<float> x(size_t(n_tokens * k));
        for (float& v : x) v = normal(rng);
        for (int64_t i = 0; i < k; ++i) x[size_t(i)] = 1.0f, x[size_t(k + i)] = -1.0f;
        for (int64_t i = 0; i < k; ++i) x[size_t(2 * k + i)] = std::fabs(x[size_t(2 * k + i)]);  // one sign
        std::vector<float> wide(size_t(n_tokens * n_rows)), narrow(wide.size(), std::nanf(""));
        kcap::q8_gemm::Tokens packed;
        packed.pack(x.data(), n_tokens, k, pool);
        kcap::q8_gemm::multiply(info.format, w.data(), n_rows, k, packed, 0, n_tokens, nullptr, wide.data(), n_rows,
                                pool);
        kcap::cap_cpu_kernels("avx2");
        check(kcap::q8_gemm::runs(info.format), std::string("the int8 GEMM runs capped at avx2 on ") + info.name);
        kcap::q8_gemm::Tokens packed_narrow;
        packed_narrow.pack(x.data(), n_tokens, k, pool);
        kcap::q8_gemm::multiply(info.format, w.data(), n_rows, k, packed_narrow, 0, n_tokens, nullptr, narrow.data(),
                                n_rows, pool);
        kcap::cap_cpu_kernels("avx512");
        check(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)) == 0,
              std::string("q8_gemm AVX-512 and AVX2 builds agree bit for bit on ") + info.name);
    }
    check(formats == 11, "the int8 GEMM builds are compared on the 11 quantized formats");
}

// The CPU's exact f32 GEMM tile (cpu/matmul_f32_gemm.h: cpu.matmul.* and cpu.moe_experts_tiles
// over several tokens where the CPU has AVX-512 or AVX2; the build the cap allows) against f64 sums
// over dequantize_row, for every format: a full tile of 32 rows and partial ones, token counts
// through each kernel width (the k-major tile past kRowMajorMaxTokens tokens: AVX-512 12, 8, 4,
// 2, 1, AVX2 6 then the rest; the row-major kernel up to it, where k is a multiple of 16: 6-token
// blocks and remainders of 1 to 5, 4-row blocks and single rows), poisoned output past the rows.
// Each output is one FMA chain over k, or 16 chains over k / 16 and a tree of 4 additions (the
// weights exact, each step one rounding), so the bound is (k + 16) * 2^-24 * sum|w x|.
void test_gemm_f32(const std::string& label) {
    if (!kcap::f32_gemm::runs()) {
        std::printf("note: no f32 GEMM for %s (build or CPU); it is not tested\n", label.c_str());
        return;
    }
    std::mt19937 rng(555);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::string summary;
    check(kcap::f32_gemm::kRowMajorMaxTokens >= 23 && kcap::f32_gemm::kRowMajorMaxTokens < 27,
          "the token counts below reach both the row-major kernel and the k-major tile");
    for (const kcap::FormatInfo& info : kcap::all_formats()) {
        const int64_t block = std::max<int64_t>(32, info.block_elems);
        double worst_ratio = 0.0;
        int failures_here = 0;
        // k past the tile's 256-value decoding spans, ending inside a span (and, for the float
        // formats, which take any k, inside a 16-value transpose).
        const int64_t long_k = info.block_elems == 1 ? 261 : (288 + info.block_elems - 1) / info.block_elems * info.block_elems;
        for (const int64_t k : {block, 3 * block, long_k}) {
            for (const auto& [n_rows, n_tokens] :
                 {std::pair<int64_t, int64_t>{32, 27}, {11, 32}, {32, 28}, {7, 3}, {19, 12}, {32, 13}, {5, 6},
                  {32, 9}, {6, 23}, {32, 22}, {3, 20}}) {
                std::vector<float> wf;
                const std::vector<uint8_t> w = random_matrix(info.format, n_rows, k, rng, wf);
                std::vector<float> x(size_t(n_tokens * k)), bias(static_cast<size_t>(n_rows));
                for (float& v : x) v = normal(rng);
                for (float& b : bias) b = normal(rng);
                const int64_t y_stride = n_rows + 2;
                std::vector<float> y(size_t(n_tokens * y_stride), std::nanf(""));
                kcap::f32_gemm::multiply_tile(info.format, w.data(), n_rows, k, x.data(), k, n_tokens, bias.data(),
                                              y.data(), y_stride);
                failures_here += check_gemm_output(
                    label.c_str(), info.name, k, wf, x.data(), bias, y, n_rows, n_tokens, y_stride,
                    [&](double magnitude) {
                        return (static_cast<double>(k) + 16.0) * std::ldexp(1.0, -24) * magnitude;
                    },
                    worst_ratio);
            }
        }
        check(failures_here == 0, label + " " + info.name + " within tolerance");
        char ratio[32];
        std::snprintf(ratio, sizeof ratio, " %s %.3f", info.name, worst_ratio);
        summary += ratio;
    }
    std::printf("%s: largest error as a fraction of the tolerance:%s\n", label.c_str(), summary.c_str());
}

// The f32 GEMM builds' vector decoders of 256-value spans (decode_span: Q4_K, Q5_K, Q6_K, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, F16, BF16) give dequantize_row's values bit for bit, on random
// blocks (random and tiny scales, every code), and leave other formats to dequantize_row.
void test_gemm_f32_block_decoders() {
    namespace g = kcap::f32_gemm;
    struct Build {
        const char* name;
        bool runs;
        bool (*decode_span)(Format, const uint8_t*, int64_t, float*);
    };
    const Build builds[] = {
        {"avx512", g::avx512::compiled() && kcap::avx512_kernels_in_use(), g::avx512::decode_span},
        {"avx2", g::avx2::compiled() && (kcap::avx2_kernels_in_use() || kcap::avx512_kernels_in_use()),
         g::avx2::decode_span},
    };
    std::mt19937 rng(557);
    for (const Build& build : builds) {
        if (!build.runs) {
            std::printf("note: no %s f32 GEMM block decoder here (build or CPU); it is not tested\n", build.name);
            continue;
        }
        for (const Format format : {Format::Q4_K, Format::Q5_K, Format::Q6_K, Format::Q8_0, Format::Q4_0, Format::Q4_1,
                                    Format::Q5_0, Format::Q5_1, Format::MXFP4, Format::F16, Format::BF16}) {
            const int64_t n_spans = 64;
            const std::vector<uint8_t> row = random_row(format, 256 * n_spans, rng);
            const size_t span_bytes = kcap::row_bytes(format, 256);
            std::vector<float> want(size_t(256 * n_spans)), got(want.size(), std::nanf(""));
            kcap::dequantize_row(format, row.data(), want.data(), 256 * n_spans);
            bool handled = true;
            for (int64_t i = 0; i < n_spans; ++i)
                handled &= build.decode_span(format, row.data() + size_t(i) * span_bytes, 256, got.data() + 256 * i);
            check(handled && std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0,
                  std::string(build.name) + " decode_span gives dequantize_row's " + kcap::format_info(format).name +
                      " values bit for bit");
            // A row's last, shorter span (k = 2880 ends 64 values into one): the 32-value formats
            // and F16/BF16 decode it, the K-quants leave it to dequantize_row (their k is whole blocks).
            const bool k_quant = kcap::format_info(format).block_elems == 256;
            for (const int64_t n : {32, 64, 224}) {
                std::vector<float> part(256, std::nanf(""));
                const bool took = build.decode_span(format, row.data(), n, part.data());
                const bool kept_rest = std::isnan(part[size_t(n)]);
                check(took == !k_quant && (!took || (std::memcmp(want.data(), part.data(), size_t(n) * sizeof(float)) == 0 &&
                                                     kept_rest)),
                      std::string(build.name) + " decode_span of " + std::to_string(n) + " " +
                          kcap::format_info(format).name + " values: " + (k_quant ? "refused" : "dequantize_row's bits"));
            }
        }
        float out[256];
        const std::vector<uint8_t> q3_k = random_row(Format::Q3_K, 256, rng);
        check(!build.decode_span(Format::Q3_K, q3_k.data(), 256, out),
              std::string(build.name) + " decode_span leaves Q3_K to dequantize_row");
    }
}

// The GEMMs' scratch (CacheLineVector) starts on a 64-byte boundary at every size and after it
// grows, so no 64-byte access of a tile straddles two cache lines.
void test_scratch_alignment() {
    bool aligned = true;
    kcap::CacheLineVector<float> grown;
    for (const size_t n : {size_t(1), size_t(17), size_t(1000), size_t(100000), size_t(3000000)}) {
        const kcap::CacheLineVector<uint8_t> bytes(n);
        const kcap::CacheLineVector<float> floats(n);
        grown.resize(grown.size() + n);
        for (const void* p : {static_cast<const void*>(bytes.data()), static_cast<const void*>(floats.data()),
                              static_cast<const void*>(grown.data())})
            aligned &= reinterpret_cast<uintptr_t>(p) % 64 == 0;
    }
    check(aligned, "CacheLineVector data starts on 64-byte boundaries");
}

// The AVX-512 and AVX2 builds of the f32 GEMM form every output by the same FMA chains over k
// (and the row-major kernel by the same tree over its 16 chains), so they agree bit for bit (where
// the CPU runs both: capped at avx2 for the second), past kRowMajorMaxTokens tokens and below.
void test_gemm_f32_builds_agree() {
    if (!kcap::avx512_kernels_in_use() || !kcap::f32_gemm::runs()) {
        std::printf("note: the f32 GEMM's AVX-512 and AVX2 builds are not compared here (build or CPU)\n");
        return;
    }
    std::mt19937 rng(556);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    check(23 <= kcap::f32_gemm::kRowMajorMaxTokens && 29 > kcap::f32_gemm::kRowMajorMaxTokens,
          "the builds are compared on the row-major kernel (23 tokens) and the k-major tile (29)");
    for (const Format format : {Format::Q4_K, Format::F16})
    for (const int64_t n_tokens : {23, 29}) {
        const int64_t n_rows = 29, k = 512;
        std::vector<float> wf;
        const std::vector<uint8_t> w = random_matrix(format, n_rows, k, rng, wf);
        std::vector<float> x(size_t(n_tokens * k));
        for (float& v : x) v = normal(rng);
        std::vector<float> wide(size_t(n_tokens * n_rows)), narrow(wide.size(), std::nanf(""));
        kcap::f32_gemm::multiply_tile(format, w.data(), n_rows, k, x.data(), k, n_tokens, nullptr, wide.data(), n_rows);
        kcap::cap_cpu_kernels("avx2");
        check(kcap::f32_gemm::runs(), "the f32 GEMM runs capped at avx2");
        kcap::f32_gemm::multiply_tile(format, w.data(), n_rows, k, x.data(), k, n_tokens, nullptr, narrow.data(), n_rows);
        kcap::cap_cpu_kernels("avx512");
        check(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)) == 0,
              std::string("f32_gemm AVX-512 and AVX2 builds agree bit for bit on ") + kcap::format_info(format).name +
                  ", " + std::to_string(n_tokens) + " tokens");
    }
}

// dot_row with x = e_i (one-hot) is exactly w_i: every other product is a zero and the sum
// of one value and zeros is exact. This pins the fused decode of every element to
// dequantize_row's value bit for bit (the scale * code products of these formats are exact
// in f32, so folding biases and offsets into FMAs must not change a weight).
void test_dot_one_hot_recovers_weights(const char* build, DotFunction dot) {
    std::mt19937 rng(99);
    for (const kcap::FormatInfo& info : kcap::all_formats()) {
        const int64_t n = info.block_elems > 1 ? 2 * info.block_elems : 70;
        const std::vector<uint8_t> row = random_row(info.format, n, rng);
        std::vector<float> w(n), x(n, 0.0f);
        kcap::dequantize_row(info.format, row.data(), w.data(), n);
        int mismatches = 0;
        for (int64_t i = 0; i < n; ++i) {
            x[i] = 1.0f;
            if (dot(info.format, row.data(), x.data(), n) != w[i]) ++mismatches;
            x[i] = 0.0f;
        }
        check(mismatches == 0, std::string(build) + " " + info.name + ": dot with one-hot x equals the weight (" +
                                   std::to_string(mismatches) + " of " + std::to_string(n) + " differ)");
    }
}

// cap_cpu_kernels takes this architecture's names, widest first, and each level changes what
// cpu_kernels_in_use reports and what the dispatched kcap::dot_row / dot_row_q8_1 run (tested at
// every level against the same reference); a name of another architecture is refused with the
// valid ones listed. The widest level is restored at the end.
void test_cpu_kernel_caps() {
#if defined(__x86_64__) || defined(__i386__)
    const std::vector<std::string> names = {"avx512", "avx2", "baseline"};
    const std::string foreign = "neon";
#elif defined(__aarch64__)
    const std::vector<std::string> names = {"dotprod", "neon", "baseline"};
    const std::string foreign = "avx2";
#else
    const std::vector<std::string> names = {"baseline"};
    const std::string foreign = "avx2";
#endif
    for (const std::string& name : names) {
        kcap::cap_cpu_kernels(name);
        const std::string in_use = kcap::cpu_kernels_in_use();
        std::printf("cap %s: cpu kernels %s\n", name.c_str(), in_use.c_str());
        if (name == "baseline") check(in_use == "baseline", "cap baseline runs the portable loops");
#if defined(__aarch64__)
        if (name == "neon")
            check(in_use == (kcap::neon::compiled() ? "neon" : "baseline"), "cap neon runs NEON without SDOT");
        if (name == "dotprod")
            check(in_use == (kcap::neon_dotprod_kernels_in_use() ? "neon+dotprod" : "neon"),
                  "cap dotprod runs SDOT where the CPU has it");
#endif
        const std::string label = "kcap::dot_row (cap " + name + ", " + in_use + ")";
        test_dot_against_dequantize(label.c_str(), kcap::dot_row);
        const std::string label_q8 = "kcap::dot_row_q8_1 (cap " + name + ", " + in_use + ")";
        test_dot_q8_1(label_q8.c_str(), kcap::dot_row_q8_1);
        test_gemm_f32("f32_gemm (cap " + name + ", " + in_use + ")");
        test_gemm_q8("q8_gemm (cap " + name + ", " + in_use + ")");
    }
    kcap::cap_cpu_kernels(names.front());
    std::string message;
    try {
        kcap::cap_cpu_kernels(foreign);
    } catch (const kcap::Error& e) {
        message = e.what();
    }
    bool lists_names = !message.empty() && message.find(foreign) != std::string::npos;
    for (const std::string& name : names) lists_names &= message.find(name) != std::string::npos;
    check(lists_names, "cap_cpu_kernels('" + foreign + "') is refused, naming this machine's caps: " + message);
}

void test_dot_special_rows() {
    // An all-zero row is exactly zero; a single-block Q8_0 row with known codes.
    std::vector<uint8_t> zeros(kcap::row_bytes(Format::Q4_K, 512), 0);
    std::vector<float> x(512, 1.0f);
    check(kcap::dot_row(Format::Q4_K, zeros.data(), x.data(), 512) == 0.0f, "zero Q4_K row dots to 0");

    uint8_t q8[34];
    const uint16_t half = kcap::f32_to_f16(0.5f);
    std::memcpy(q8, &half, 2);
    for (int i = 0; i < 32; ++i) q8[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
    float w[32];
    kcap::dequantize_row(Format::Q8_0, q8, w, 32);
    bool values_ok = true;
    for (int i = 0; i < 32; ++i) values_ok &= w[i] == 0.5f * static_cast<float>(i - 16);
    check(values_ok, "Q8_0 block decodes to d * q");
    float ones[32];
    for (float& v : ones) v = 1.0f;
    check(kcap::dot_row(Format::Q8_0, q8, ones, 32) == -8.0f, "Q8_0 known dot: 0.5 * sum(-16..15) = -8");

    // An F32 row at an odd address (GGUF data in a memory map need not be aligned).
    std::vector<uint8_t> storage(1 + 4 * 100);
    std::vector<float> values(100), xs(100, 2.0f);
    for (int i = 0; i < 100; ++i) values[i] = static_cast<float>(i);
    std::memcpy(storage.data() + 1, values.data(), 4 * 100);
    check(kcap::dot_row(Format::F32, storage.data() + 1, xs.data(), 100) == 9900.0f, "F32 row at an odd address");
}

// The x86 builds' quantize_q8_1 gives the portable loop's codes, scales and sums bit for bit:
// random magnitudes from 1e-30 to 1e4 per run, an all-zero run, runs of exact ties (amax 127:
// scale 1, so x.5 rounds to even), a run with NaN and one with an infinity.
void test_quantize_q8_1_builds(const char* name, void (*quantize)(const float*, int64_t, int8_t*, float*, int32_t*)) {
    std::mt19937 rng(811);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t n = 32 * 40;
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t r = 0; r < n / 32; ++r) {
        const float magnitude = std::pow(10.0f, float(int(rng() % 35) - 30));
        for (int i = 0; i < 32; ++i) x[size_t(32 * r + i)] = normal(rng) * magnitude;
    }
    for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = 0.0f;
    for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = i == 0 ? 127.0f : float(int(rng() % 200) - 100) + 0.5f;
    for (int i = 0; i < 32; ++i) x[size_t(96 + i)] = i == 5 ? -127.0f : float(i) - 15.5f;
    x[size_t(128 + 7)] = std::nanf("");
    x[size_t(160 + 20)] = -std::numeric_limits<float>::infinity();
    std::vector<int8_t> want_q(static_cast<size_t>(n)), got_q(static_cast<size_t>(n), 99);
    std::vector<float> want_d(size_t(n / 32)), got_d(size_t(n / 32), -1.0f);
    std::vector<int32_t> want_s(size_t(n / 16)), got_s(size_t(n / 16), -1);
    kcap::portable::quantize_q8_1(x.data(), n, want_q.data(), want_d.data(), want_s.data());
    quantize(x.data(), n, got_q.data(), got_d.data(), got_s.data());
    check(want_q == got_q && std::memcmp(want_d.data(), got_d.data(), want_d.size() * sizeof(float)) == 0 &&
              want_s == got_s,
          std::string(name) + " quantize_q8_1 gives the portable codes, scales and sums bit for bit");
    check(want_q[size_t(64 + 1)] % 2 == 0 && want_d[2] == 1.0f, "the tie run rounds x.5 to even (scale 1)");
}

void test_bad_sizes() {
    std::vector<uint8_t> raw(4096);
    std::vector<float> out(4096), x(4096);
    check(throws_format_error([&] { kcap::dequantize_row(Format::Q4_K, raw.data(), out.data(), 100); },
                              {"Q4_K", "100", "256"}),
          "dequantize_row refuses a partial Q4_K block");
    check(throws_format_error([&] { kcap::dot_row(Format::Q8_0, raw.data(), x.data(), 33); }, {"Q8_0", "33", "32"}),
          "dot_row refuses a partial Q8_0 block");
    check(throws_format_error([&] { kcap::dot_row(Format::MXFP4, raw.data(), x.data(), -32); }),
          "dot_row refuses a negative length");
    check(throws_format_error([&] { kcap::dequantize_row(static_cast<Format>(16), raw.data(), out.data(), 256); },
                              {"IQ2_XXS"}),
          "dequantize_row refuses an unsupported format");
    check(throws_format_error([&] { kcap::dot_row(static_cast<Format>(20), raw.data(), x.data(), 32); },
                              {"IQ4_NL"}),
          "dot_row refuses an unsupported format");
}

}  // namespace

int main() {
    test_half_conversions();
    test_format_table();
    test_dot_against_dequantize("portable::dot_row", kcap::portable::dot_row);
    test_dot_q8_1("portable::dot_row_q8_1", kcap::portable::dot_row_q8_1);
    test_dot_q8_1("kcap::dot_row_q8_1", kcap::dot_row_q8_1);
    test_dot_one_hot_recovers_weights("portable::dot_row", kcap::portable::dot_row);
    // Each x86 build the CPU can run (dot_row itself picks the widest: the AVX2 kernels are
    // tested here on an AVX-512 machine too).
    if (kcap::avx2::compiled() && (kcap::avx2_kernels_in_use() || kcap::avx512_kernels_in_use())) {
        test_dot_against_dequantize("avx2::dot_row", kcap::avx2::dot_row);
        test_dot_q8_1("avx2::dot_row_q8_1", kcap::avx2::dot_row_q8_1);
        test_dot_one_hot_recovers_weights("avx2::dot_row", kcap::avx2::dot_row);
        test_quantize_q8_1_builds("avx2", kcap::avx2::quantize_q8_1);
    } else {
        std::printf("note: no AVX2 dot_row here (build or CPU); it is not tested\n");
    }
    if (kcap::avx512_kernels_in_use()) {
        test_dot_against_dequantize("avx512::dot_row", kcap::avx512::dot_row);
        test_dot_q8_1("avx512::dot_row_q8_1", kcap::avx512::dot_row_q8_1);
        test_dot_one_hot_recovers_weights("avx512::dot_row", kcap::avx512::dot_row);
        test_quantize_q8_1_builds("avx512", kcap::avx512::quantize_q8_1);
    } else {
        std::printf("note: no AVX-512 VNNI dot_row here (build or CPU); it is not tested\n");
    }
    // The AArch64 builds: NEON runs on every such CPU (its widening q8_1 products are tested on
    // a CPU with SDOT too), the SDOT q8_1 kernels where the CPU has them.
    if (kcap::neon::compiled()) {
        test_dot_against_dequantize("neon::dot_row", kcap::neon::dot_row);
        test_dot_q8_1("neon::dot_row_q8_1", kcap::neon::dot_row_q8_1);
        test_dot_one_hot_recovers_weights("neon::dot_row", kcap::neon::dot_row);
    } else {
        std::printf("note: no NEON dot_row here (not an AArch64 build); it is not tested\n");
    }
    if (kcap::neon_dotprod_kernels_in_use()) {
        test_dot_q8_1("neon_dotprod::dot_row_q8_1", kcap::neon_dotprod::dot_row_q8_1);
    } else {
        std::printf("note: no SDOT dot_row_q8_1 here (build or CPU); it is not tested\n");
    }
    std::printf("cpu kernels in use: %s\n", kcap::cpu_kernels_in_use());
    test_dot_against_dequantize("kcap::dot_row", kcap::dot_row);
    test_gemm_f32_builds_agree();
    test_gemm_f32_block_decoders();
    test_scratch_alignment();
    test_gemm_q8_vector_packing();
    test_gemm_q8_builds_agree();
    test_cpu_kernel_caps();
    test_dot_special_rows();
    test_bad_sizes();
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
