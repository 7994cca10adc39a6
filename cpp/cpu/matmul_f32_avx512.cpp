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
