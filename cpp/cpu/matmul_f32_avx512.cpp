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
}  // namespace avx512
}  // namespace f32_gemm
}  // namespace kcap

#else

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace kcap {
namespace f32_gemm {
namespace avx512 {

namespace {

template <int kTokens>
void micro_kernel(const float* tile, int64_t k_len, const float* x, int64_t x_stride, float* out,
                  int64_t out_stride) {
    __m512 acc[2][kTokens];
    for (int t = 0; t < kTokens; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_len; ++k) {
        const __m512 w0 = _mm512_loadu_ps(tile + k * kTileRows), w1 = _mm512_loadu_ps(tile + k * kTileRows + 16);
        for (int t = 0; t < kTokens; ++t) {
            const __m512 b = _mm512_set1_ps(x[t * x_stride + k]);
            acc[0][t] = _mm512_fmadd_ps(w0, b, acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(w1, b, acc[1][t]);
        }
    }
    for (int t = 0; t < kTokens; ++t) {
        _mm512_storeu_ps(out + t * out_stride, acc[0][t]);
        _mm512_storeu_ps(out + t * out_stride + 16, acc[1][t]);
    }
}

}  // namespace

bool compiled() { return true; }

void store_k_major(const float* rows, int64_t n_rows, int64_t k, int64_t row_stride, float* tile) {
    // 16 rows by 16 values at a time, transposed in registers: 32-bit then 64-bit interleaves give
    // each 128-bit lane L of b[4i + c] rows 4i..4i+3 of column 4L + c; a 4x4 transpose of those
    // lanes (shuffle_f32x4) gives each column's 16 rows.
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        for (int64_t r0 = 0; r0 < kTileRows; r0 += 16) {
            __m512 r[16], a[16], b[16];
            for (int j = 0; j < 16; ++j)
                r[j] = r0 + j < n_rows ? _mm512_loadu_ps(rows + (r0 + j) * row_stride + i) : _mm512_setzero_ps();
            for (int j = 0; j < 8; ++j) {
                a[2 * j] = _mm512_unpacklo_ps(r[2 * j], r[2 * j + 1]);
                a[2 * j + 1] = _mm512_unpackhi_ps(r[2 * j], r[2 * j + 1]);
            }
            for (int j = 0; j < 4; ++j) {
                const __m512d lo0 = _mm512_castps_pd(a[4 * j]), lo1 = _mm512_castps_pd(a[4 * j + 2]);
                const __m512d hi0 = _mm512_castps_pd(a[4 * j + 1]), hi1 = _mm512_castps_pd(a[4 * j + 3]);
                b[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
                b[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
                b[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
                b[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
            }
            for (int c = 0; c < 4; ++c) {
                const __m512 t0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44), t1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xee);
                const __m512 t2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44);
                const __m512 t3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xee);
                float* column = tile + (i + c) * kTileRows + r0;  // column 4L + c is k = i + 4L + c
                _mm512_storeu_ps(column, _mm512_shuffle_f32x4(t0, t2, 0x88));
                _mm512_storeu_ps(column + 4 * kTileRows, _mm512_shuffle_f32x4(t0, t2, 0xdd));
                _mm512_storeu_ps(column + 8 * kTileRows, _mm512_shuffle_f32x4(t1, t3, 0x88));
                _mm512_storeu_ps(column + 12 * kTileRows, _mm512_shuffle_f32x4(t1, t3, 0xdd));
            }
        }
    }
    for (; i < k; ++i)
        for (int64_t r = 0; r < kTileRows; ++r) tile[i * kTileRows + r] = r < n_rows ? rows[r * row_stride + i] : 0.0f;
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

}  // namespace avx512
}  // namespace f32_gemm
}  // namespace kcap

#endif
