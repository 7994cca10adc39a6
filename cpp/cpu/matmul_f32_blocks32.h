// Internal to the f32 GEMM's two builds (cpp/cpu/matmul_f32_avx512.cpp, matmul_f32_avx2.cpp):
// their decode_span of runs of 32-value blocks, the same code with each build's scale_32 (a
// block's 32 signed int8 values times its scale, stored as f32 in that build's vectors). In an
// anonymous namespace and included only where the build's instructions are on, so each object
// compiles its own copy for its own instructions and defines no symbol the linker could keep
// for the other (tests/cpp/isa_confined.py).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/formats_blocks.h"
#include "kcap/formats.h"

namespace kcap {
namespace f32_gemm {
namespace {

using Scale32 = void (*)(__m128i lo, __m128i hi, float scale, float* out);

// Blocks of 32 values: Q8_0's values times d, Q4_0's nibbles (value i < 16 the low nibble of
// qs[i], i >= 16 the high nibble of qs[i - 16]) minus 8 times d, MXFP4's nibbles through the
// doubled E2M1 table times the halved e8m0 scale. False for other formats or a partial block.
template <Scale32 kScale32>
bool decode_blocks32(Format format, const uint8_t* block, int64_t n_values, float* out) {
    if ((format != Format::Q8_0 && format != Format::Q4_0 && format != Format::MXFP4) || n_values % 32 != 0)
        return false;
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks::kMXFP4DoubledValues));
    for (int i = 0; i < n_values / 32; ++i) {
        float* to = out + 32 * i;
        if (format == Format::Q8_0) {
            const auto& b = reinterpret_cast<const blocks::BlockQ8_0*>(block)[i];
            kScale32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)), blocks::load_half(b.d), to);
            continue;
        }
        const uint8_t* qs = format == Format::Q4_0 ? reinterpret_cast<const blocks::BlockQ4_0*>(block)[i].qs
                                                   : reinterpret_cast<const blocks::BlockMXFP4*>(block)[i].qs;
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        const __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
        if (format == Format::Q4_0)
            kScale32(_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight),
                     blocks::load_half(reinterpret_cast<const blocks::BlockQ4_0*>(block)[i].d), to);
        else
            kScale32(_mm_shuffle_epi8(table, lo), _mm_shuffle_epi8(table, hi),
                     blocks::mxfp4_half_scale(reinterpret_cast<const blocks::BlockMXFP4*>(block)[i].e), to);
    }
    return true;
}

}  // namespace
}  // namespace f32_gemm
}  // namespace kcap
