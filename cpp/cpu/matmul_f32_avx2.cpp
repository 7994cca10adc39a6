// The f32 GEMM of cpu/matmul_f32_gemm.h with AVX2+FMA, for CPUs without AVX-512: per k, 16 of the
// tile's 32 rows in two vectors times each of 6 tokens' broadcast activation, into 12 accumulators
// (15 of the 16 registers with the operands), each half of the tile in turn. Every output is the
// same FMA chain over k as the AVX-512 kernel's, so both give the same results bit for bit.
// Compiled with AVX2+FMA on every x86-64 build (CMakeLists.txt) and run only where the CPU has
// them; raw pointers and intrinsics only, so the object defines no inline function the linker
// could keep for other objects (isa_confined).
#include "core/formats_dot_paths.h"
#include "cpu/matmul_f32_gemm.h"

#if !defined(KCAP_DOT_AVX2)  // the instructions this file is compiled with (formats_dot_paths.h)

namespace kcap {
namespace f32_gemm {
namespace avx2 {
bool compiled() { return false; }
void tile_times_tokens(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t) {}
void store_k_major(const float*, int64_t, int64_t, int64_t, float*) {}
bool decode_span(Format, const uint8_t*, int64_t, float*) { return false; }
void rows_times_tokens(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t) {}
}  // namespace avx2
}  // namespace f32_gemm
}  // namespace kcap

#else

#include <immintrin.h>

#include "core/formats_blocks.h"
#include "cpu/matmul_f32_blocks32.h"

namespace kcap {
namespace f32_gemm {
namespace avx2 {

namespace {

constexpr int64_t kHalf = 16;  // rows per pass: two 8-lane vectors

// Rows 0-15 of the tile from `tile` (a half's first row) times kTokens tokens.
template <int kTokens>
void micro_kernel(const float* tile, int64_t k_len, const float* x, int64_t x_stride, float* out,
                  int64_t out_stride) {
    __m256 acc[2][kTokens];
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < k_len; ++k) {
        const __m256 w0 = _mm256_loadu_ps(tile + k * kTileRows), w1 = _mm256_loadu_ps(tile + k * kTileRows + 8);
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) {
            const __m256 b = _mm256_broadcast_ss(x + t * x_stride + k);
            acc[0][t] = _mm256_fmadd_ps(w0, b, acc[0][t]);
            acc[1][t] = _mm256_fmadd_ps(w1, b, acc[1][t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) {
        _mm256_storeu_ps(out + t * out_stride, acc[0][t]);
        _mm256_storeu_ps(out + t * out_stride + 8, acc[1][t]);
    }
}

// One 32-value block from its signed values (lo: values 0-15, hi: 16-31, int8) times scale: the
// one product dequantize_row forms (exact).
void scale_32(__m128i lo, __m128i hi, float scale, float* out) {
    const __m256 s = _mm256_set1_ps(scale);
    const __m128i halves[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i)
        _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[i]))));
}

// The same from unsigned codes (Q4_1, Q5_1) times scale plus offset: the exact product, then one
// rounding in the FMA, as dequantize_row's multiply then add.
void scale_offset_32(__m128i lo, __m128i hi, float scale, float offset, float* out) {
    const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(offset);
    const __m128i halves[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i)
        _mm256_storeu_ps(out + 8 * i, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(halves[i])), m));
}

// Q4_K (and with kFifthBit Q5_K) blocks: run r (values 32r .. 32r + 31) the low (r even) or high
// nibbles of qs[32(r / 2) ..] (Q5_K: with bit r of qh[l] above), times d * scale plus -(dmin * min):
// the products exact, one rounding in the FMA, as dequantize_row's multiply then add.
template <class Block, bool kFifthBit>
void decode_k4(const uint8_t* block, float* out) {
    const auto& b = *reinterpret_cast<const Block*>(block);
    alignas(16) uint8_t scales_mins[16];
    blocks::k4_scales_mins(b.scales, scales_mins);
    alignas(32) float run_scale[8], run_offset[8];
    const __m256 d = _mm256_set1_ps(blocks::load_half(b.d)), minus_dmin = _mm256_set1_ps(-blocks::load_half(b.dmin));
    const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(scales_mins));
    _mm256_store_ps(run_scale, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed))));
    _mm256_store_ps(run_offset,
                    _mm256_mul_ps(minus_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)))));
    const __m128i mask = _mm_set1_epi8(0x0f);
    for (int run = 0; run < 8; ++run) {
        const __m256 scale = _mm256_set1_ps(run_scale[run]), offset = _mm256_set1_ps(run_offset[run]);
        for (int half = 0; half < 2; ++half) {
            __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 32 * (run / 2) + 16 * half));
            q = _mm_and_si128(run % 2 ? _mm_srli_epi16(q, 4) : q, mask);
            if constexpr (kFifthBit) {  // bit `run` of qh[l] above the nibble
                const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh + 16 * half));
                q = _mm_or_si128(q, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, run), _mm_set1_epi8(1)), 4));
            }
            float* to = out + 32 * run + 16 * half;
            _mm256_storeu_ps(to, _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), offset));
            _mm256_storeu_ps(to + 8, _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                                _mm_srli_si128(q, 8))), offset));
        }
    }
}

// The row-major kernel (rows_times_tokens): the AVX-512 build's 16 lanes as two 8-lane halves,
// 2 rows by 2 tokens (8 accumulators, 4 row and 2 token vectors: 14 of the 16 registers), the
// same chains and the same tree (lanes j + 8, then j + 4, j + 2, j + 1).
float reduce_16(__m256 low, __m256 high) {
    const __m256 eight = _mm256_add_ps(low, high);
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

template <int kRows, int kTokens>
void row_block(const float* rows, int64_t k, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
    __m256 acc[kRows][kTokens][2];
    for (int r = 0; r < kRows; ++r)
        for (int t = 0; t < kTokens; ++t) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        __m256 w[kRows][2];
        for (int r = 0; r < kRows; ++r)
            w[r][0] = _mm256_loadu_ps(rows + r * k + i), w[r][1] = _mm256_loadu_ps(rows + r * k + i + 8);
        for (int t = 0; t < kTokens; ++t) {
            const __m256 v0 = _mm256_loadu_ps(x + t * x_stride + i), v1 = _mm256_loadu_ps(x + t * x_stride + i + 8);
            for (int r = 0; r < kRows; ++r) {
                acc[r][t][0] = _mm256_fmadd_ps(w[r][0], v0, acc[r][t][0]);
                acc[r][t][1] = _mm256_fmadd_ps(w[r][1], v1, acc[r][t][1]);
            }
        }
    }
    for (int t = 0; t < kTokens; ++t)
        for (int r = 0; r < kRows; ++r) out[t * out_stride + r] = reduce_16(acc[r][t][0], acc[r][t][1]);
}

template <int kRows>
void row_blocks(const float* rows, int64_t k, const float* x, int64_t x_stride, int64_t tokens, float* out,
                int64_t out_stride) {
    int64_t t = 0;
    for (; t + 2 <= tokens; t += 2) row_block<kRows, 2>(rows, k, x + t * x_stride, x_stride, out + t * out_stride, out_stride);
    if (t < tokens) row_block<kRows, 1>(rows, k, x + t * x_stride, x_stride, out + t * out_stride, out_stride);
}

}  // namespace

bool compiled() { return true; }

void rows_times_tokens(const float* rows, int64_t n_rows, int64_t k, const float* x, int64_t x_stride, int64_t tokens,
                       float* out, int64_t out_stride) {
    int64_t r = 0;
    for (; r + 2 <= n_rows; r += 2) row_blocks<2>(rows + r * k, k, x, x_stride, tokens, out + r, out_stride);
    if (r < n_rows) row_blocks<1>(rows + r * k, k, x, x_stride, tokens, out + r, out_stride);
}

void tile_times_tokens(const float* tile, int64_t k_len, const float* x, int64_t x_stride, int64_t tokens, float* out,
                       int64_t out_stride) {
    for (int64_t half = 0; half < kTileRows; half += kHalf) {
        const float* w = tile + half;
        float* y = out + half;
        int64_t t = 0;
        for (; t + 6 <= tokens; t += 6) micro_kernel<6>(w, k_len, x + t * x_stride, x_stride, y + t * out_stride, out_stride);
        switch (tokens - t) {
            case 5: micro_kernel<5>(w, k_len, x + t * x_stride, x_stride, y + t * out_stride, out_stride); break;
            case 4: micro_kernel<4>(w, k_len, x + t * x_stride, x_stride, y + t * out_stride, out_stride); break;
            case 3: micro_kernel<3>(w, k_len, x + t * x_stride, x_stride, y + t * out_stride, out_stride); break;
            case 2: micro_kernel<2>(w, k_len, x + t * x_stride, x_stride, y + t * out_stride, out_stride); break;
            case 1: micro_kernel<1>(w, k_len, x + t * x_stride, x_stride, y + t * out_stride, out_stride); break;
            default: break;
        }
    }
}

void store_k_major(const float* rows, int64_t n_rows, int64_t k, int64_t row_stride, float* tile) {
    // 8 rows by 8 values at a time, transposed in registers: 32-bit interleaves, then 64-bit
    // shuffles give each 128-bit half of u[c] (u[4 + c]) rows 0-3 (4-7) of columns c and c + 4;
    // permute2f128 puts each column's 8 rows together.
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        for (int64_t r0 = 0; r0 < 16; r0 += 8) {
            __m256 r[8], t[8], u[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j)
                r[j] = r0 + j < n_rows ? _mm256_loadu_ps(rows + (r0 + j) * row_stride + i) : _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int j = 0; j < 4; ++j) {
                t[2 * j] = _mm256_unpacklo_ps(r[2 * j], r[2 * j + 1]);
                t[2 * j + 1] = _mm256_unpackhi_ps(r[2 * j], r[2 * j + 1]);
            }
#pragma GCC unroll 8
            for (int q = 0; q < 2; ++q) {  // rows 4q .. 4q+3
                u[4 * q] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
                u[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xee);
                u[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
                u[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xee);
            }
#pragma GCC unroll 8
            for (int c = 0; c < 4; ++c) {
                _mm256_storeu_ps(tile + (i + c) * kTileRows + r0, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
                _mm256_storeu_ps(tile + (i + c + 4) * kTileRows + r0, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
            }
        }
    }
    for (; i < k; ++i)
        for (int64_t r = 0; r < 16; ++r) tile[i * kTileRows + r] = r < n_rows ? rows[r * row_stride + i] : 0.0f;
}

bool decode_span(Format format, const uint8_t* block, int64_t n_values, float* out) {
    // As avx512::decode_span, 8 values at a time.
    if ((format == Format::Q4_K || format == Format::Q5_K || format == Format::Q6_K) && n_values != 256) return false;
    if (format == Format::Q4_K || format == Format::Q5_K) {
        if (format == Format::Q4_K) decode_k4<blocks::BlockQ4_K, false>(block, out);
        else decode_k4<blocks::BlockQ5_K, true>(block, out);
        return true;
    }
    if (format == Format::Q6_K) {
        const auto& b = *reinterpret_cast<const blocks::BlockQ6_K*>(block);
        const __m256 d = _mm256_set1_ps(blocks::load_half(b.d));
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
        alignas(32) float scale[16];
        _mm256_store_ps(scale, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed))));
        _mm256_store_ps(scale + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(packed, 8)))));
        const __m128i low4 = _mm_set1_epi8(0x0f), low2 = _mm_set1_epi8(0x03);
        const __m256i bias = _mm256_set1_epi32(32);
        for (int h = 0; h < 2; ++h)
            for (int s = 0; s < 4; ++s)
                for (int half = 0; half < 2; ++half) {
                    const int l = 16 * half;
                    const __m128i ql = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.ql + 64 * h + 32 * (s & 1) + l));
                    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh + 32 * h + l));
                    const __m128i low = _mm_and_si128(s < 2 ? ql : _mm_srli_epi16(ql, 4), low4);
                    const __m128i high = _mm_and_si128(_mm_srli_epi16(qh, 2 * s), low2);
                    const __m128i code = _mm_or_si128(low, _mm_slli_epi16(high, 4));
                    const int value = 128 * h + 32 * s + l;
                    const __m256 group = _mm256_set1_ps(scale[value / 16]);
                    _mm256_storeu_ps(out + value, _mm256_mul_ps(group, _mm256_cvtepi32_ps(
                                                                           _mm256_sub_epi32(_mm256_cvtepu8_epi32(code), bias))));
                    _mm256_storeu_ps(out + value + 8,
                                     _mm256_mul_ps(group, _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                                              _mm256_cvtepu8_epi32(_mm_srli_si128(code, 8)), bias))));
                }
        return true;
    }
    if (format == Format::F16 && n_values % 16 == 0) {  // the conversion instruction: exact, as half_to_float (NaNs made quiet)
        for (int i = 0; i < n_values; i += 8)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * i))));
        return true;
    }
    if (format == Format::BF16 && n_values % 16 == 0) {  // the high half of an f32: exact, as dequantize_row
        for (int i = 0; i < n_values; i += 8)
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * i))), 16)));
        return true;
    }
    return decode_blocks32<scale_32, scale_offset_32>(format, block, n_values, out);
}

}  // namespace avx2
}  // namespace f32_gemm
}  // namespace kcap

#endif
