// GGUF tensor formats: block layouts, exact dequantization and fused dot products.
//
// Every format is named exactly (no "is k-quant" family tests). The numeric ids are the
// GGML type ids that GGUF files store, so a tensor's type field maps here without a table.
// Block layouts follow ggml-common.h; dequantization is bit-exact against
// gguf.quants.dequantize (gguf-py), which the test-suite checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kcap {

enum class Format : int {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    BF16 = 30,
    MXFP4 = 39,
};

struct FormatInfo {
    Format format;
    const char* name;     // the GGUF/ggml name, e.g. "Q4_K"
    int block_elems;      // elements per block (1 for float formats)
    int block_bytes;      // bytes per block
};

// All formats kcap decodes, in id order.
const std::vector<FormatInfo>& all_formats();

// Throws kcap::FormatError naming the id when the GGML type is not one kcap decodes.
const FormatInfo& format_info(Format format);
Format format_from_ggml_type(int ggml_type);
Format format_from_name(const std::string& name);  // "Q4_K", "q4_k", "F32", ...
bool is_supported_ggml_type(int ggml_type);
const char* format_name(Format format);

// Bytes of one row of n_elems elements; throws kcap::FormatError when n_elems is not a
// multiple of the block size (a row never splits a block).
size_t row_bytes(Format format, int64_t n_elems);

// Dequantize n_elems elements (a multiple of the block size) from src into dst.
void dequantize_row(Format format, const void* src, float* dst, int64_t n_elems);

// dot(dequantize(src), x) over n_elems elements, accumulated in f32 without materialising
// the dequantized row. This is the exact decode matvec inner loop of the CPU backend.
float dot_row(Format format, const void* src, const float* x, int64_t n_elems);

// q8_1 rounding of activations (EngineOptions::activations = "q8_1"): each 32-value run of x
// becomes d * q with d = amax / 127 (f32) and q = x * (1 / d) rounded to nearest, ties to even
// (q = 0 where d is 0 or subnormal). n must be a multiple of 32.
//   quantize_q8_1: q [n], d [n / 32] and sum16 [n / 16] (the sum of q over each 16 values)
//   round_q8_1:    the values d * q as f32 (out may be x)
void quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16);
void round_q8_1(const float* x, int64_t n, float* out);

// A row of q8_1 activations (quantize_q8_1's arrays).
struct Q8View {
    const int8_t* q;
    const float* d;
    const int32_t* sum16;
};

// dot(dequantize(src), d * q) over n_elems elements, with integer products (the CPU's
// cpu.matmul_q8.* decode rows): W . q8_1(x) up to the f32 roundings of the per-run scales and
// of the sum. Every quantized format; F32, F16, BF16 throw FormatError.
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems);

// Half-precision helpers shared by formats and the KV cache.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);

}  // namespace kcap
