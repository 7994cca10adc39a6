// dequantize_row: the exact decode of a row, bit-identical to gguf.quants.dequantize.
//
// Exactness needs every product and sum rounded to f32 separately, as numpy does. GCC (in
// gnu++ mode) and Clang may fuse "a * b + c" into one FMA with a single rounding. For the
// formats here that happens to change nothing (every scale * code product is exact in f32:
// an f16 scale has 11 significant bits, the sub-scales and codes at most 13 more), but that
// is a property of today's formats, not a guarantee, so contraction is switched off for this
// whole file (decoders included) before formats_blocks.h is read.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/formats_blocks.h"
#include "core/formats_dot_paths.h"
#include "kcap/errors.h"
#include "kcap/formats.h"

namespace kcap {
namespace {

template <typename Block, void (*decode)(const Block&, float*)>
void dequantize_blocks(const void* src, float* dst, int64_t n_blocks, int block_elems) {
    const Block* blocks = static_cast<const Block*>(src);
    for (int64_t b = 0; b < n_blocks; ++b) decode(blocks[b], dst + b * block_elems);
}

void dequantize_f16(const uint8_t* src, float* dst, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(halves));
    }
#endif
    for (; i < n; ++i) dst[i] = blocks::load_half(src + 2 * i);
}

void dequantize_bf16(const uint8_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, sizeof h);
        dst[i] = blocks::bits_to_float(static_cast<uint32_t>(h) << 16);
    }
}

}  // namespace

// One copy, for the baseline: GCC's AVX2+FMA copy of these decoders (KCAP_HOT_LOOP) ran slower
// than the baseline one (an exact prefill, which decodes every weight row it multiplies: 4-5%
// fewer tokens per second on an AMD Zen 4).
void dequantize_row(Format format, const void* src, float* dst, int64_t n_elems) {
    using namespace blocks;
    row_bytes(format, n_elems);  // validates the format and that n_elems fills whole blocks
    const int64_t n_qk = n_elems / kQK;
    const int64_t n_qk_k = n_elems / kQK_K;
    switch (format) {
        case Format::F32:
            std::memcpy(dst, src, static_cast<size_t>(n_elems) * sizeof(float));
            return;
        case Format::F16:
            return dequantize_f16(static_cast<const uint8_t*>(src), dst, n_elems);
        case Format::BF16:
            return dequantize_bf16(static_cast<const uint8_t*>(src), dst, n_elems);
        case Format::Q4_0:
            return dequantize_blocks<BlockQ4_0, decode_q4_0>(src, dst, n_qk, kQK);
        case Format::Q4_1:
            return dequantize_blocks<BlockQ4_1, decode_q4_1>(src, dst, n_qk, kQK);
        case Format::Q5_0:
            return dequantize_blocks<BlockQ5_0, decode_q5_0>(src, dst, n_qk, kQK);
        case Format::Q5_1:
            return dequantize_blocks<BlockQ5_1, decode_q5_1>(src, dst, n_qk, kQK);
        case Format::Q8_0:
            return dequantize_blocks<BlockQ8_0, decode_q8_0>(src, dst, n_qk, kQK);
        case Format::MXFP4:
            return dequantize_blocks<BlockMXFP4, decode_mxfp4>(src, dst, n_qk, kQK);
        case Format::Q2_K:
            return dequantize_blocks<BlockQ2_K, decode_q2_k>(src, dst, n_qk_k, kQK_K);
        case Format::Q3_K:
            return dequantize_blocks<BlockQ3_K, decode_q3_k>(src, dst, n_qk_k, kQK_K);
        case Format::Q4_K:
            return dequantize_blocks<BlockQ4_K, decode_q4_k>(src, dst, n_qk_k, kQK_K);
        case Format::Q5_K:
            return dequantize_blocks<BlockQ5_K, decode_q5_k>(src, dst, n_qk_k, kQK_K);
        case Format::Q6_K:
            return dequantize_blocks<BlockQ6_K, decode_q6_k>(src, dst, n_qk_k, kQK_K);
    }
    throw FormatError("dequantize_row: " + std::string(format_name(format)) + " has no decoder");
}

void portable::quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16) {
    for (int64_t r = 0; r < n; r += 32) {
        float amax = 0.0f;
        for (int64_t i = r; i < r + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float scale = amax / 127.0f;
        const float inverse = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
        d[r / 32] = scale;
        for (int half = 0; half < 2; ++half) {
            int32_t sum = 0;
            for (int64_t i = r + 16 * half; i < r + 16 * half + 16; ++i) {
                q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inverse));
                sum += q[i];
            }
            sum16[r / 16 + half] = sum;
        }
    }
}

// The x86 builds' vector loops where the CPU has them (the same bits; test_formats compares them):
// a q8_1 prefill rounds every matmul input, and the scalar loop called libm's nearbyintf per value.
void quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16) {
    if (n % 32 != 0) throw FormatError("q8_1 rounding needs whole runs of 32 values, got " + std::to_string(n));
    if (avx512_kernels_in_use()) return avx512::quantize_q8_1(x, n, q, d, sum16);
    if (avx2_kernels_in_use()) return avx2::quantize_q8_1(x, n, q, d, sum16);
    portable::quantize_q8_1(x, n, q, d, sum16);
}

void round_q8_1(const float* x, int64_t n, float* out) {
    if (n % 32 != 0) throw FormatError("q8_1 rounding needs whole runs of 32 values, got " + std::to_string(n));
    for (int64_t r = 0; r < n; r += 32) {  // a run at a time: no allocation (out may be x)
        int8_t q[32];
        float d;
        int32_t sum16[2];
        quantize_q8_1(x + r, 32, q, &d, sum16);
        for (int i = 0; i < 32; ++i) out[r + i] = d * static_cast<float>(q[i]);
    }
}

}  // namespace kcap
