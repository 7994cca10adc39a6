// The f32 GEMM of cpu/matmul_f32_gemm.h with AVX-512: per k, the tile's 32 rows in two vectors
// times each of 12 tokens' broadcast activation, into 24 accumulators (rows x tokens) that stay
// in registers over the whole k loop. Compiled with AVX-512 on every x86-64 build
// (CMakeLists.txt) and run only where the CPU has it; raw pointers and intrinsics only, so the
// object defines no inline function the linker could keep for other objects (isa_confined).
#include "core/formats_dot_paths.h"
#include "cpu/matmul_f32_gemm.h"

#if !defined(KCAP_DOT_AVX512)  // the instructions this file is compiled with (formats_dot_paths.h)

namespace kcap {
namespace f32_gemm {
namespace avx512 {
bool compiled() { return false; }
void tile_times_tokens(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t) {}
void store_k_major(const float*, int64_t, int64_t, int64_t, float*) {}
bool decode_span(Format, const uint8_t*, int64_t, float*) { return false; }
void rows_times_tokens(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t) {}
}  // namespace avx512
}  // namespace f32_gemm
}  // namespace kcap

#else

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "core/formats_blocks.h"
#include "cpu/matmul_f32_blocks32.h"

namespace kcap {
namespace f32_gemm {
namespace avx512 {

namespace {

template <int kTokens>
void micro_kernel(const float* tile, int64_t k_len, const float* x, int64_t x_stride, float* out,
                  int64_t out_stride) {
    __m512 acc[2][kTokens];
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_len; ++k) {
        const __m512 w0 = _mm512_loadu_ps(tile + k * kTileRows), w1 = _mm512_loadu_ps(tile + k * kTileRows + 16);
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
            const __m512 b = _mm512_set1_ps(x[t * x_stride + k]);
            acc[0][t] = _mm512_fmadd_ps(w0, b, acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(w1, b, acc[1][t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
        _mm512_storeu_ps(out + t * out_stride, acc[0][t]);
        _mm512_storeu_ps(out + t * out_stride + 16, acc[1][t]);
    }
}

// One 32-value block from its signed values (lo: values 0-15, hi: 16-31, int8) times scale: the
// one product dequantize_row forms (exact).
void scale_32(__m128i lo, __m128i hi, float scale, float* out) {
    const __m512 s = _mm512_set1_ps(scale);
    _mm512_storeu_ps(out, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo))));
    _mm512_storeu_ps(out + 16, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))));
}

// The same from unsigned codes (Q4_1, Q5_1) times scale plus offset: the exact product, then one
// rounding in the FMA, as dequantize_row's multiply then add.
void scale_offset_32(__m128i lo, __m128i hi, float scale, float offset, float* out) {
    const __m512 s = _mm512_set1_ps(scale), m = _mm512_set1_ps(offset);
    _mm512_storeu_ps(out, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m));
    _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m));
}

// Q4_K (and with kFifthBit Q5_K) blocks: run r (values 32r .. 32r + 31) the low (r even) or high
// nibbles of qs[32(r / 2) ..] (Q5_K: with bit r of qh[l] above), times d * scale plus -(dmin * min):
// the products exact, one rounding in the FMA, as dequantize_row's multiply then add.
template <class Block, bool kFifthBit>
void decode_k4(const uint8_t* block, float* out) {
    const auto& b = *reinterpret_cast<const Block*>(block);
    alignas(16) uint8_t scales_mins[16];
    blocks::k4_scales_mins(b.scales, scales_mins);
    alignas(64) float run_scale[8], run_offset[8];
    const __m256 d = _mm256_set1_ps(blocks::load_half(b.d)), minus_dmin = _mm256_set1_ps(-blocks::load_half(b.dmin));
    const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(scales_mins));
    _mm256_store_ps(run_scale, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed))));
    _mm256_store_ps(run_offset,
                    _mm256_mul_ps(minus_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)))));
    const __m128i mask = _mm_set1_epi8(0x0f);
    for (int run = 0; run < 8; ++run) {
        const __m512 scale = _mm512_set1_ps(run_scale[run]), offset = _mm512_set1_ps(run_offset[run]);
        for (int half = 0; half < 2; ++half) {
            __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 32 * (run / 2) + 16 * half));
            q = _mm_and_si128(run % 2 ? _mm_srli_epi16(q, 4) : q, mask);
            if constexpr (kFifthBit) {  // bit `run` of qh[l] above the nibble
                const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh + 16 * half));
                q = _mm_or_si128(q, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, run), _mm_set1_epi8(1)), 4));
            }
            _mm512_storeu_ps(out + 32 * run + 16 * half,
                             _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), offset));
        }
    }
}

// The row-major kernel (rows_times_tokens): kRows rows by kTokens tokens, a 16-lane accumulator
// each, per 16 values of k the rows' and the tokens' vectors (4 + 6 loads for 24 FMAs).
float reduce_16(__m512 v) {
    // Lanes j + 8, then j + 4, j + 2, j + 1: the AVX2 build's tree.
    const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

template <int kRows, int kTokens>
void row_block(const float* rows, int64_t k, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
    __m512 acc[kRows][kTokens];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        __m512 w[kRows];
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) w[r] = _mm512_loadu_ps(rows + r * k + i);
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) {
            const __m512 v = _mm512_loadu_ps(x + t * x_stride + i);
#pragma GCC unroll 8
            for (int r = 0; r < kRows; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], v, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t)
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) out[t * out_stride + r] = reduce_16(acc[r][t]);
}

template <int kRows>
void row_blocks(const float* rows, int64_t k, const float* x, int64_t x_stride, int64_t tokens, float* out,
                int64_t out_stride) {
    int64_t t = 0;
    for (; t + 6 <= tokens; t += 6) row_block<kRows, 6>(rows, k, x + t * x_stride, x_stride, out + t * out_stride, out_stride);
    const float* xt = x + t * x_stride;
    float* ot = out + t * out_stride;
    switch (tokens - t) {
        case 5: row_block<kRows, 5>(rows, k, xt, x_stride, ot, out_stride); break;
        case 4: row_block<kRows, 4>(rows, k, xt, x_stride, ot, out_stride); break;
        case 3: row_block<kRows, 3>(rows, k, xt, x_stride, ot, out_stride); break;
        case 2: row_block<kRows, 2>(rows, k, xt, x_stride, ot, out_stride); break;
        case 1: row_block<kRows, 1>(rows, k, xt, x_stride, ot, out_stride); break;
        default: break;
    }
}

}  // namespace

bool compiled() { return true; }

void rows_times_tokens(const float* rows, int64_t n_rows, int64_t k, const float* x, int64_t x_stride, int64_t tokens,
                       float* out, int64_t out_stride) {
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) row_blocks<4>(rows + r * k, k, x, x_stride, tokens, out + r, out_stride);
    for (; r < n_rows; ++r) row_blocks<1>(rows + r * k, k, x, x_stride, tokens, out + r, out_stride);
}

void store_k_major(const float* rows, int64_t n_rows, int64_t k, int64_t row_stride, float* tile) {
    // 16 rows by 16 values at a time, transposed in registers: 32-bit then 64-bit interleaves give
    // each 128-bit lane L of b[4i + c] rows 4i..4i+3 of column 4L + c; a 4x4 transpose of those
    // lanes (shuffle_f32x4) gives each column's 16 rows.
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 r[16], a[16], b[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j)
            r[j] = j < n_rows ? _mm512_loadu_ps(rows + j * row_stride + i) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int j = 0; j < 8; ++j) {
            a[2 * j] = _mm512_unpacklo_ps(r[2 * j], r[2 * j + 1]);
            a[2 * j + 1] = _mm512_unpackhi_ps(r[2 * j], r[2 * j + 1]);
        }
#pragma GCC unroll 16
        for (int j = 0; j < 4; ++j) {
            const __m512d lo0 = _mm512_castps_pd(a[4 * j]), lo1 = _mm512_castps_pd(a[4 * j + 2]);
            const __m512d hi0 = _mm512_castps_pd(a[4 * j + 1]), hi1 = _mm512_castps_pd(a[4 * j + 3]);
            b[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
            b[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
            b[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
            b[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
        }
#pragma GCC unroll 16
        for (int c = 0; c < 4; ++c) {
            const __m512 t0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44), t1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xee);
            const __m512 t2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44);
            const __m512 t3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xee);
            float* column = tile + (i + c) * kTileRows;  // column 4L + c is k = i + 4L + c
            _mm512_storeu_ps(column, _mm512_shuffle_f32x4(t0, t2, 0x88));
            _mm512_storeu_ps(column + 4 * kTileRows, _mm512_shuffle_f32x4(t0, t2, 0xdd));
            _mm512_storeu_ps(column + 8 * kTileRows, _mm512_shuffle_f32x4(t1, t3, 0x88));
            _mm512_storeu_ps(column + 12 * kTileRows, _mm512_shuffle_f32x4(t1, t3, 0xdd));
        }
    }
    for (; i < k; ++i)
        for (int64_t r = 0; r < 16; ++r) tile[i * kTileRows + r] = r < n_rows ? rows[r * row_stride + i] : 0.0f;
}

void tile_times_tokens(const float* tile, int64_t k_len, const float* x, int64_t x_stride, int64_t tokens, float* out,
                       int64_t out_stride) {
    int64_t t = 0;
    for (; t + 12 <= tokens; t += 12) micro_kernel<12>(tile, k_len, x + t * x_stride, x_stride, out + t * out_stride, out_stride);
    if (tokens - t >= 8) micro_kernel<8>(tile, k_len, x + t * x_stride, x_stride, out + t * out_stride, out_stride), t += 8;
    if (tokens - t >= 4) micro_kernel<4>(tile, k_len, x + t * x_stride, x_stride, out + t * out_stride, out_stride), t += 4;
    if (tokens - t >= 2) micro_kernel<2>(tile, k_len, x + t * x_stride, x_stride, out + t * out_stride, out_stride), t += 2;
    if (tokens - t >= 1) micro_kernel<1>(tile, k_len, x + t * x_stride, x_stride, out + t * out_stride, out_stride);
}

bool decode_span(Format format, const uint8_t* block, int64_t n_values, float* out) {
    if ((format == Format::Q4_K || format == Format::Q5_K || format == Format::Q6_K) && n_values != 256) return false;
    if (format == Format::Q4_K || format == Format::Q5_K) {
        if (format == Format::Q4_K) decode_k4<blocks::BlockQ4_K, false>(block, out);
        else decode_k4<blocks::BlockQ5_K, true>(block, out);
        return true;
    }
    if (format == Format::Q6_K) {
        // Value 128h + 32s + l: the low (s < 2) or high nibble of ql[64h + 32(s & 1) + l] with bits
        // 2s, 2s + 1 of qh[32h + l] above it, minus 32, times d * scale of its 16-value group: the
        // one product dequantize_row forms (exact).
        const auto& b = *reinterpret_cast<const blocks::BlockQ6_K*>(block);
        const __m512 d = _mm512_set1_ps(blocks::load_half(b.d));
        alignas(64) float scale[16];
        _mm512_store_ps(scale, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))))));
        const __m128i low4 = _mm_set1_epi8(0x0f), low2 = _mm_set1_epi8(0x03);
        const __m512i bias = _mm512_set1_epi32(32);
        for (int h = 0; h < 2; ++h)
            for (int s = 0; s < 4; ++s)
                for (int half = 0; half < 2; ++half) {
                    const int l = 16 * half;
                    const __m128i ql = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.ql + 64 * h + 32 * (s & 1) + l));
                    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh + 32 * h + l));
                    const __m128i low = _mm_and_si128(s < 2 ? ql : _mm_srli_epi16(ql, 4), low4);
                    const __m128i high = _mm_and_si128(_mm_srli_epi16(qh, 2 * s), low2);
                    const __m512i code = _mm512_sub_epi32(
                        _mm512_cvtepu8_epi32(_mm_or_si128(low, _mm_slli_epi16(high, 4))), bias);
                    const int value = 128 * h + 32 * s + l;
                    _mm512_storeu_ps(out + value, _mm512_mul_ps(_mm512_set1_ps(scale[value / 16]), _mm512_cvtepi32_ps(code)));
                }
        return true;
    }
    if (format == Format::F16 && n_values % 16 == 0) {  // the conversion instruction: exact, as half_to_float (NaNs made quiet)
        for (int i = 0; i < n_values; i += 16)
            _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2 * i))));
        return true;
    }
    if (format == Format::BF16 && n_values % 16 == 0) {  // the high half of an f32: exact, as dequantize_row
        for (int i = 0; i < n_values; i += 16)
            _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2 * i))), 16)));
        return true;
    }
    return decode_blocks32<scale_32, scale_offset_32>(format, block, n_values, out);
}

}  // namespace avx512
}  // namespace f32_gemm
}  // namespace kcap

#endif
