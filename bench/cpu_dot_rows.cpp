// dot_row / dot_row_q8_1 of one long row, timed per build of the kernels compiled into this
// library (portable, AVX2, AVX-512, NEON, SDOT: whichever this CPU runs), after checking that
// each build's result agrees with the portable one. A developer's A/B of the kernels in
// isolation; the decode speed of a whole model is bench/cpu_kernels_ab.py's. Under an emulator
// (scripts/neon_check.sh runs it with qemu-aarch64) the times say nothing about real hardware.
//
// Built against the static core, e.g.
//   g++ -O2 -std=c++17 -Icpp/include -Icpp -I. bench/cpu_dot_rows.cpp BUILD/libkcap_core.a -lpthread -o cpu_dot_rows
//   ./cpu_dot_rows [n_elems=4096] [rows=2000] [formats=Q4_0,Q8_0,Q4_K,Q6_K]
//   ./cpu_dot_rows --call-sdot   (runs neon_dotprod::dot_row_q8_1 whatever the CPU has: on a CPU
//                                 without SDOT this must die of SIGILL)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/formats_dot_paths.h"
#include "kcap/formats.h"

namespace {

using kcap::Format;

// Byte offsets of the f16 scales inside a block, set to finite values (random bytes there could
// be inf or NaN).
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

uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
}

// `rows` rows of random blocks (a working set larger than the caches, like a weight matrix).
std::vector<uint8_t> random_rows(Format format, int64_t n_elems, int rows, std::mt19937& rng) {
    const kcap::FormatInfo& info = kcap::format_info(format);
    const size_t row = kcap::row_bytes(format, n_elems);
    std::vector<uint8_t> data(row * rows);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    const size_t n_blocks = data.size() / info.block_bytes;
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    for (size_t i = 0; info.block_elems == 1 && i < n_blocks; ++i) {  // float rows: finite values
        const float v = scale(rng);
        const uint16_t h = format == Format::F16 ? kcap::f32_to_f16(v) : static_cast<uint16_t>(bits_of(v) >> 16);
        if (format == Format::F32) std::memcpy(data.data() + 4 * i, &v, 4);
        else std::memcpy(data.data() + 2 * i, &h, 2);
    }
    for (size_t b = 0; info.block_elems > 1 && b < n_blocks; ++b) {
        uint8_t* block = data.data() + b * info.block_bytes;
        if (format == Format::MXFP4) block[0] = static_cast<uint8_t>(120 + rng() % 8);
        for (int offset : half_scale_offsets(format)) {
            const uint16_t h = kcap::f32_to_f16(scale(rng));
            std::memcpy(block + offset, &h, 2);
        }
    }
    return data;
}

struct Build {
    const char* name;
    bool runs;
    float (*dot)(Format, const void*, const float*, int64_t);            // null: no f32 kernel of its own
    float (*dot_q8)(Format, const void*, kcap::Q8View, int64_t);
};

template <typename Call>
double nanoseconds_per_row(int rows, int passes, Call call, double& checksum) {
    const auto start = std::chrono::steady_clock::now();
    double sum = 0.0;
    for (int p = 0; p < passes; ++p)
        for (int r = 0; r < rows; ++r) sum += call(r);
    const auto stop = std::chrono::steady_clock::now();
    checksum = sum;
    return std::chrono::duration<double, std::nano>(stop - start).count() / (double(rows) * passes);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--call-sdot") {
        std::vector<uint8_t> row(kcap::row_bytes(Format::Q8_0, 32), 0);
        std::vector<int8_t> q(32, 1);
        float d = 1.0f;
        int32_t sum16[2] = {16, 16};
        std::printf("neon_dotprod compiled: %d; calling it\n", int(kcap::neon_dotprod::compiled()));
        std::fflush(stdout);
        const float got = kcap::neon_dotprod::dot_row_q8_1(Format::Q8_0, row.data(), {q.data(), &d, sum16}, 32);
        std::printf("neon_dotprod::dot_row_q8_1 ran: %g\n", got);
        return 0;
    }
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 4096;
    const int rows = argc > 2 ? std::atoi(argv[2]) : 2000;
    const std::string format_list = argc > 3 ? argv[3] : "Q4_0,Q8_0,Q4_K,Q6_K";
    const int passes = 3;

    const Build builds[] = {
        {"portable", true, kcap::portable::dot_row, kcap::portable::dot_row_q8_1},
        {"avx2", kcap::avx2_kernels_in_use() || kcap::avx512_kernels_in_use(), kcap::avx2::dot_row,
         kcap::avx2::dot_row_q8_1},
        {"avx512", kcap::avx512_kernels_in_use(), kcap::avx512::dot_row, kcap::avx512::dot_row_q8_1},
        {"neon", kcap::neon::compiled(), kcap::neon::dot_row, kcap::neon::dot_row_q8_1},
        {"neon_dotprod", kcap::neon_dotprod_kernels_in_use(), nullptr, kcap::neon_dotprod::dot_row_q8_1},
    };
    std::printf("cpu kernels in use: %s; n = %lld, %d rows x %d passes\n", kcap::cpu_kernels_in_use(),
                static_cast<long long>(n), rows, passes);
    std::printf("%-6s %-13s %14s %14s %16s\n", "format", "build", "f32 ns/row", "q8_1 ns/row", "diff / sum|w x|");

    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    std::vector<int8_t> q(n);
    std::vector<float> d(n / 32);
    std::vector<int32_t> sum16(n / 16);
    kcap::quantize_q8_1(x.data(), n, q.data(), d.data(), sum16.data());
    const kcap::Q8View x8{q.data(), d.data(), sum16.data()};

    std::stringstream formats(format_list);
    std::string name;
    int disagreements = 0;
    while (std::getline(formats, name, ',')) {
        const Format format = kcap::format_from_name(name);
        const size_t row = kcap::row_bytes(format, n);
        const std::vector<uint8_t> data = random_rows(format, n, rows, rng);
        const bool has_q8 = format != Format::F32 && format != Format::F16 && format != Format::BF16;
        for (const Build& build : builds) {
            if (!build.runs || (!build.dot && !has_q8)) continue;
            // Agreement with the portable build on the first rows, as a fraction of sum |w x|:
            // each build is within 8 (n/32 + 16) 2^-24 of that of the exact sum in
            // tests/cpp/test_formats.cpp, so two builds are within twice that of each other.
            double worst = 0.0;
            std::vector<float> w(n);
            for (int r = 0; r < 16 && r < rows; ++r) {
                const void* src = data.data() + row * r;
                kcap::dequantize_row(format, src, w.data(), n);
                double magnitude = 0.0;
                for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(double(w[i]) * x[i]);
                if (magnitude == 0.0) continue;
                if (build.dot) {
                    const double ref = kcap::portable::dot_row(format, src, x.data(), n);
                    worst = std::max(worst, std::fabs(build.dot(format, src, x.data(), n) - ref) / magnitude);
                }
                if (has_q8) {
                    const double ref = kcap::portable::dot_row_q8_1(format, src, x8, n);
                    worst = std::max(worst, std::fabs(build.dot_q8(format, src, x8, n) - ref) / magnitude);
                }
            }
            if (worst > 16.0 * (double(n) / 32.0 + 16.0) * std::ldexp(1.0, -24)) ++disagreements;
            double checksum = 0.0;
            char f32_time[32] = "-", q8_time[32] = "-";
            if (build.dot)
                std::snprintf(f32_time, sizeof f32_time, "%.0f", nanoseconds_per_row(rows, passes, [&](int r) {
                    return build.dot(format, data.data() + row * r, x.data(), n);
                }, checksum));
            if (has_q8)
                std::snprintf(q8_time, sizeof q8_time, "%.0f", nanoseconds_per_row(rows, passes, [&](int r) {
                    return build.dot_q8(format, data.data() + row * r, x8, n);
                }, checksum));
            std::printf("%-6s %-13s %14s %14s %16.2e\n", name.c_str(), build.name, f32_time, q8_time, worst);
        }
    }
    if (disagreements) std::printf("%d builds disagree with the portable one beyond the tests' bound\n", disagreements);
    return disagreements == 0 ? 0 : 1;
}
