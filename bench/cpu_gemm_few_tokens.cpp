// The exact f32 GEMM's tile (f32_gemm::multiply_tile: each weight row decoded once, then
// multiplied with every token) against one dot_row per row and token, for 1 to 24 tokens: the
// token counts a mixture of experts gives each expert of a prompt. Weights of one expert's
// matrix (rows x k), small enough to stay in L2, so the times are the kernels' and not DRAM's;
// ns per weight row. A developer's A/B in isolation; bench_cpu.py measures whole models.
//
// Built against the static core, e.g.
//   g++ -O2 -std=c++17 -Icpp/include -Icpp bench/cpu_gemm_few_tokens.cpp BUILD/libkcap_core.a -lpthread -o cpu_gemm_few_tokens
//   ./cpu_gemm_few_tokens [format=Q4_K] [k=2048] [rows=768]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul_f32_gemm.h"
#include "kcap/formats.h"

int main(int argc, char** argv) {
    using namespace kcap;
    const std::string name = argc > 1 ? argv[1] : "Q4_K";
    const int64_t k = argc > 2 ? std::atoll(argv[2]) : 2048, n = argc > 3 ? std::atoll(argv[3]) : 768;
    const FormatInfo* info = nullptr;
    for (const FormatInfo& f : all_formats())
        if (name == f.name) info = &f;
    if (!info || k % info->block_elems || n % f32_gemm::kTileRows) {
        std::fprintf(stderr, "usage: %s [format] [k, whole blocks] [rows, a multiple of %lld]\n", argv[0],
                     static_cast<long long>(f32_gemm::kTileRows));
        return 2;
    }
    if (!f32_gemm::runs()) {
        std::printf("no f32 GEMM on this CPU\n");
        return 0;
    }
    // Random bytes with every 16-bit field a small finite half (0x1000: about 6e-5): the scales
    // of every format are finite; the times do not depend on the values.
    const size_t row_stride = row_bytes(info->format, k);
    std::vector<uint8_t> w(row_stride * size_t(n));
    std::mt19937 rng(1);
    for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
    for (size_t i = 1; i < w.size(); i += 2) w[i] &= 0x13;
    std::printf("%s, k = %lld, %lld rows; ns per row\ntokens  multiply_tile  dot_row per token\n", info->name,
                static_cast<long long>(k), static_cast<long long>(n));
    for (const int tokens : {1, 2, 3, 4, 6, 8, 12, 16, 24}) {
        std::vector<float> x(size_t(tokens * k), 0.25f), y(size_t(tokens * n));
        double best_tile = 1e30, best_dot = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
            auto t0 = std::chrono::steady_clock::now();
            for (int64_t n0 = 0; n0 < n; n0 += f32_gemm::kTileRows)
                f32_gemm::multiply_tile(info->format, w.data() + n0 * row_stride, f32_gemm::kTileRows, k, x.data(), k,
                                        tokens, nullptr, y.data() + n0, n);
            best_tile = std::min(best_tile, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            t0 = std::chrono::steady_clock::now();
            for (int t = 0; t < tokens; ++t)
                for (int64_t r = 0; r < n; ++r)
                    y[size_t(t * n + r)] = dot_row(info->format, w.data() + r * row_stride, x.data() + t * k, k);
            best_dot = std::min(best_dot, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf("%6d  %13.0f  %17.0f\n", tokens, best_tile / double(n) * 1e9, best_dot / double(n) * 1e9);
    }
    return 0;
}
