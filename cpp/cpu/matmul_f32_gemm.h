// Internal to cpp/cpu: the f32 GEMM of the CPU's exact matmul rows (cpu.matmul.*) for a call of
// several tokens where the CPU has AVX-512 or AVX2: a tile of kTileRows weight rows, decoded exactly
// (dequantize_row) and stored k-major (tile[k * kTileRows + r]), times every token's f32
// activations, each output one f32 FMA chain over k. The weights are dequantize_row's exactly and
// every sum is f32, so the result differs from dot_row's only in the order of the additions.
#pragma once

#include <cstdint>

#include "kcap/formats.h"

namespace kcap {
namespace f32_gemm {

constexpr int64_t kTileRows = 32;  // two 16-lane vectors of rows per k
inline int64_t tiles(int64_t n_rows) { return (n_rows + kTileRows - 1) / kTileRows; }

// Calls of at most this many tokens, on k a multiple of 16, multiply the decoded rows as they
// are (rows_times_tokens) instead of storing them k-major first: the store's transpose costs
// per weight what the products of a dozen tokens do, and a few tokens a tile is what a mixture
// of experts gives each expert (gpt-oss-20b's exact 128-token prefill: 118-122 -> 148-150
// tok/s on a 2-core AVX-512 VM, docs/benchmarks.md).
constexpr int64_t kRowMajorMaxTokens = 24;

// Whether the GEMM runs on this CPU: compiled, and the CPU has AVX-512 (with VNNI, the level
// kcap.cap_cpu_kernels calls "avx512") or AVX2+FMA ("avx2") and the cap allows it. Checked per
// call, like dot_row's choice of instructions.
bool runs();

// One tile on the calling thread (cpu/matmul.cpp): y[t * y_stride + n] = W[n] . x[t * x_stride ..]
// (+ bias[n]) for n < n_rows <= kTileRows, t < n_tokens; W is n_rows rows of k elements in
// `format`, row_bytes apart, each decoded with dequantize_row (the spans of at most 256 values
// that decode_span takes with the builds' vector code: the same values).
void multiply_tile(Format format, const uint8_t* w, int64_t n_rows, int64_t k, const float* x, int64_t x_stride,
                   int64_t n_tokens, const float* bias, float* y, int64_t y_stride);

// Two builds of the kernel and of the tile's k-major store, each only where the CPU has its
// instructions: AVX-512 (matmul_f32_avx512.cpp) where dot_row runs its AVX-512 kernels, else
// AVX2+FMA (matmul_f32_avx2.cpp) where it runs the AVX2 ones. Both give the same results.
namespace avx512 {
// Whether the library was compiled with the AVX-512 kernel (matmul_f32_avx512.cpp).
bool compiled();
// out[t * out_stride + r] = sum over k < k_len of tile[k * kTileRows + r] * x[t * x_stride + k],
// r < kTileRows, t < tokens. Only where avx512_kernels_in_use().
void tile_times_tokens(const float* tile, int64_t k_len, const float* x, int64_t x_stride, int64_t tokens, float* out,
                       int64_t out_stride);
// tile[i * kTileRows + r] = rows[r * row_stride + i] for i < k, r < 16 (0 for r >= n_rows): 16 of
// the tile's rows (n_rows <= 16 of them given) stored k-major, as tile_times_tokens reads them.
void store_k_major(const float* rows, int64_t n_rows, int64_t k, int64_t row_stride, float* tile);
// out = the n_values <= 256 values at block (256: one Q4_K, Q5_K or Q6_K block; a multiple of 32:
// that many Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or MXFP4 values; a multiple of 16: F16 or BF16 values),
// dequantize_row's bit for bit (vector code; an F16 signaling NaN comes out quiet); false
// (nothing written) for other formats and lengths, which the caller decodes with dequantize_row.
bool decode_span(Format format, const uint8_t* block, int64_t n_values, float* out);
// out[t * out_stride + r] = sum over k of rows[r * k + k'] * x[t * x_stride + k'] for r < n_rows,
// t < tokens, k a multiple of 16: each output 16 FMA chains (lane j takes k' = j mod 16 in order)
// summed by one tree (lanes j + 8, then j + 4, j + 2, j + 1), the same in both builds.
void rows_times_tokens(const float* rows, int64_t n_rows, int64_t k, const float* x, int64_t x_stride, int64_t tokens,
                       float* out, int64_t out_stride);
}  // namespace avx512

namespace avx2 {
// The same with AVX2+FMA (matmul_f32_avx2.cpp): 16 rows x 6 tokens per micro-kernel. Only where
// avx2_kernels_in_use().
bool compiled();
void tile_times_tokens(const float* tile, int64_t k_len, const float* x, int64_t x_stride, int64_t tokens, float* out,
                       int64_t out_stride);
void store_k_major(const float* rows, int64_t n_rows, int64_t k, int64_t row_stride, float* tile);
bool decode_span(Format format, const uint8_t* block, int64_t n_values, float* out);
void rows_times_tokens(const float* rows, int64_t n_rows, int64_t k, const float* x, int64_t x_stride, int64_t tokens,
                       float* out, int64_t out_stride);
}  // namespace avx2

}  // namespace f32_gemm
}  // namespace kcap
