// Internal to cpp/cpu: the int8 GEMM of the CPU's q8_1 matmul rows (cpu.matmul_q8.*, and the
// experts of cpu.moe_experts_q8 over several tokens), y[t, r] = W[r, :] . q8_1(x[t, :]).
//
// A weight row is decoded once per call into its integer codes (KcapCodes<F>::codes8 of
// kernels/quant_codes.h, the codes the GPU's q8_1 rows use) and then multiplied with every
// token's int8 activations; the sum over each 16-value group stays an exact int32 until one f32
// step per group:
//   sum_g (scale_g * d_g) * (sum_i u_i q_i - bias * sum_i q_i) + offset_g * (d_g * sum_i q_i)
// with u the unsigned code bytes (the signed codes of Q8_0 and MXFP4 plus 128, bias 128), q the
// token's q8_1 codes and d its scale of the 32-value run holding group g. In real arithmetic that
// is W . q8_1(x) exactly; in f32 it differs from the exact matmul of the rounded activations only
// in the order and rounding of the per-group steps.
//
// Operand layout (K padded with zero groups to a multiple of kSuper = 256 values): a 256-value
// super-block is 16 groups of 16, stored as 4 steps of 64 bytes, step j holding values 4j..4j+3
// of each group g at bytes 4g..4g+3. One 512-bit vpdpbusd per step then adds four products of
// each group into that group's lane, and four steps leave each lane with its group's whole sum
// (the AVX2 build: two 32-byte halves of 8 groups, matmul_q8_avx2.cpp).
#pragma once

#include <cstdint>

#include "kcap/formats.h"

namespace kcap {
namespace q8_gemm {

constexpr int64_t kSuper = 256;  // values per super-block
constexpr int64_t kGroups = 16;  // 16-value groups per super-block (one int32 lane each)
constexpr int kRowBlock = 4;     // weight rows per micro-kernel (packed row counts are multiples)

// A block of packed weight rows: codes [rows][n_super * kSuper] in the layout above, scale and
// offset [rows][n_super * kGroups] (offset null for a format without offsets), and the bias the
// code bytes carry (a code is its byte minus bias).
struct PackedRows {
    const uint8_t* codes;
    const float* scale;
    const float* offset;
    int64_t rows;  // a multiple of kRowBlock
    int32_t bias;
    int32_t max_code;  // the largest code byte the format has (AVX2 sums products in int16 below it)
};

// Packed q8_1 activations of `tokens` tokens: codes [tokens][n_super * kSuper] (int8, the same
// layout), and per token and 16-value group its run's scale d, the sum of its codes and
// d * that sum.
struct PackedTokens {
    const int8_t* codes;
    const float* d;
    const int32_t* sum;
    const float* offset_sum;
    int64_t tokens;
};

namespace avx512 {
// Whether the library was compiled with the AVX-512 VNNI GEMM (matmul_q8_avx512.cpp).
bool compiled();
// out[t * out_stride + r] = W[r] . x[t] for r < w.rows, t < x.tokens. Only where
// avx512_kernels_in_use() (the CPU has AVX-512 VNNI and kcap.cap_cpu_kernels allows it).
void rows_times_tokens(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride);
// out = the n_super super-blocks of `linear` (value i of super-block s at byte 256 s + i) in the
// interleaved layout above. Only where avx512_kernels_in_use().
void interleave(const uint8_t* linear, int64_t n_super, uint8_t* out);
// A row of n_blocks Q4_K blocks (block_bytes apart) packed: codes = its codes in the interleaved
// layout (as interleave() of CodesOf's codes), scale and offset its 16 per block (CodesOf's
// values, bit for bit).
void q4_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale,
               float* offset);
// The same for Q5_K (codes 0..31) and Q6_K (codes 0..63, bias 32; no offsets).
void q5_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale,
               float* offset);
void q6_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale);
}  // namespace avx512

namespace avx2 {
// Whether the library was compiled with the AVX2 GEMM (matmul_q8_avx2.cpp): the same results as
// avx512:: bit for bit, from vpmaddubsw products summed in int16 within the codes' bounds.
bool compiled();
// As avx512::rows_times_tokens, interleave, q4_k_rows, q5_k_rows and q6_k_rows, where
// avx2_kernels_in_use().
void rows_times_tokens(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride);
void interleave(const uint8_t* linear, int64_t n_super, uint8_t* out);
void q4_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale,
               float* offset);
void q5_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale,
               float* offset);
void q6_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale);
// n_blocks Q8_0, Q4_0 or MXFP4 blocks (format): linear = their codes in order (CodesOf's), scale
// = the scale of each 16-value group (no offsets). 128-bit code: the AVX-512 build uses it too.
void legacy_rows(Format format, const uint8_t* blocks, int64_t n_blocks, uint8_t* linear, float* scale);
}  // namespace avx2

}  // namespace q8_gemm
}  // namespace kcap
