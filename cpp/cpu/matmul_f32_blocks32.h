// Internal to the f32 GEMM's two builds (cpp/cpu/matmul_f32_avx512.cpp, matmul_f32_avx2.cpp):
// their decode_span of runs of 32-value blocks, the same code with each build's scale_32 (a
// block's 32 signed int8 values times its scale, stored as f32 in that build's vectors) and
// scale_offset_32 (32 unsigned codes times a scale plus an offset). In an anonymous namespace
// and included only where the build's instructions are on, so each object compiles its own copy
// for its own instructions and defines no symbol the linker could keep for the other
// (tests/cpp/isa_confined.py).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/formats_blocks.h"
#include "kcap/formats.h"

namespace kcap {
namespace f32_gemm {
namespace {

using Scale32 = void (*)(__m128i lo, __m128i hi, float scale, float* out);
using ScaleOffset32 = void (*)(__m128i lo, __m128i hi, float scale, float offset, float* out);

// Q5_0/Q5_1's fifth bits as 0x10 in the byte of their value: bit i of the little-endian u32 qh
// belongs to value i (lo: values 0-15, hi: 16-31). Byte i takes qh's byte i / 8, then tests bit i % 8.
inline void fifth_bits_32(const uint8_t* qh_bytes, __m128i& lo, __m128i& hi) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, sizeof qh);
    const __m128i word = _mm_set1_epi32(static_cast<int>(qh));
    const __m128i bit_of_byte = _mm_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m128i fifth = _mm_set1_epi8(0x10);
    const auto spread = [&](long long byte_a, long long byte_b) {
        const __m128i bytes = _mm_shuffle_epi8(word, _mm_set_epi64x(byte_b, byte_a));
        return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(bytes, bit_of_byte), bit_of_byte), fifth);
    };
    lo = spread(0x0000000000000000ll, 0x0101010101010101ll);
    hi = spread(0x0202020202020202ll, 0x0303030303030303ll);
}

// Blocks of 32 values: Q8_0's values times d; Q4_0's nibbles (value i < 16 the low nibble of
// qs[i], i >= 16 the high nibble of qs[i - 16]) minus 8, Q5_0's with their fifth bits minus 16,
// times d; Q4_1's and Q5_1's codes times d plus m; MXFP4's nibbles through the doubled E2M1
// table times the halved e8m0 scale. Each value the one product (and sum) dequantize_row forms:
// d times a code of at most 8 bits is exact in f32, so the FMA's single rounding is the add's.
// False for other formats or a partial block.
template <Scale32 kScale32, ScaleOffset32 kScaleOffset32>
bool decode_blocks32(Format format, const uint8_t* block, int64_t n_values, float* out) {
    if ((format != Format::Q8_0 && format != Format::Q4_0 && format != Format::MXFP4 && format != Format::Q5_0 &&
         format != Format::Q4_1 && format != Format::Q5_1) ||
        n_values % 32 != 0)
        return false;
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8), sixteen = _mm_set1_epi8(16);
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks::kMXFP4DoubledValues));
    const auto nibbles = [&](const uint8_t* qs, __m128i& lo, __m128i& hi) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        lo = _mm_and_si128(q, low4);
        hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
    };
    for (int i = 0; i < n_values / 32; ++i) {
        float* to = out + 32 * i;
        __m128i lo, hi, lo5, hi5;
        switch (format) {
            case Format::Q8_0: {
                const auto& b = reinterpret_cast<const blocks::BlockQ8_0*>(block)[i];
                kScale32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)), blocks::load_half(b.d), to);
                break;
            }
            case Format::Q4_0: {
                const auto& b = reinterpret_cast<const blocks::BlockQ4_0*>(block)[i];
                nibbles(b.qs, lo, hi);
                kScale32(_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight), blocks::load_half(b.d), to);
                break;
            }
            case Format::Q5_0: {
                const auto& b = reinterpret_cast<const blocks::BlockQ5_0*>(block)[i];
                nibbles(b.qs, lo, hi);
                fifth_bits_32(b.qh, lo5, hi5);
                kScale32(_mm_sub_epi8(_mm_or_si128(lo, lo5), sixteen), _mm_sub_epi8(_mm_or_si128(hi, hi5), sixteen),
                         blocks::load_half(b.d), to);
                break;
            }
            case Format::Q4_1: {
                const auto& b = reinterpret_cast<const blocks::BlockQ4_1*>(block)[i];
                nibbles(b.qs, lo, hi);
                kScaleOffset32(lo, hi, blocks::load_half(b.d), blocks::load_half(b.m), to);
                break;
            }
            case Format::Q5_1: {
                const auto& b = reinterpret_cast<const blocks::BlockQ5_1*>(block)[i];
                nibbles(b.qs, lo, hi);
                fifth_bits_32(b.qh, lo5, hi5);
                kScaleOffset32(_mm_or_si128(lo, lo5), _mm_or_si128(hi, hi5), blocks::load_half(b.d),
                               blocks::load_half(b.m), to);
                break;
            }
            default: {  // MXFP4
                const auto& b = reinterpret_cast<const blocks::BlockMXFP4*>(block)[i];
                nibbles(b.qs, lo, hi);
                kScale32(_mm_shuffle_epi8(table, lo), _mm_shuffle_epi8(table, hi), blocks::mxfp4_half_scale(b.e), to);
                break;
            }
        }
    }
    return true;
}

}  // namespace
}  // namespace f32_gemm
}  // namespace kcap
