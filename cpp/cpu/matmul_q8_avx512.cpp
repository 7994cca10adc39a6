// The int8 GEMM of cpu/matmul_q8_gemm.h with AVX-512 VNNI: a micro-kernel of 4 weight rows x up
// to 4 tokens keeps 16 int32 accumulators (one per row and token, a lane per 16-value group) over
// a super-block's four vpdpbusd steps, then one f32 step per super-block. Compiled with those
// instructions on every x86-64 build (CMakeLists.txt) and run only where the CPU has them; the
// object uses raw pointers and intrinsics only, so it defines no inline function that the linker
// could keep for other objects (tests/cpp/isa_confined.py checks).
#include "core/formats_dot_paths.h"
#include "cpu/matmul_q8_gemm.h"

#if !defined(KCAP_DOT_AVX512)  // the instructions this file is compiled with (formats_dot_paths.h)

namespace kcap {
namespace q8_gemm {
namespace avx512 {
bool compiled() { return false; }
void rows_times_tokens(const PackedRows&, const PackedTokens&, int64_t, float*, int64_t) {}
void interleave(const uint8_t*, int64_t, uint8_t*) {}
void q4_k_rows(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*) {}
void q5_k_rows(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*) {}
void q6_k_rows(const uint8_t*, int64_t, int64_t, uint8_t*, float*) {}
}  // namespace avx512
}  // namespace q8_gemm
}  // namespace kcap

#else

#if defined(__GNUC__) && !defined(__clang__)
// GCC's AVX-512 intrinsics start some results from _mm512_undefined_*(), which -Wuninitialized
// then reports at every inlined use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <type_traits>

#include "core/formats_blocks.h"

namespace kcap {
namespace q8_gemm {
namespace avx512 {

namespace {

// Rows r0 .. r0+3 of w times tokens t0 .. t0+kTokens-1 of x.
template <int kRows, int kTokens, bool kOffset>
void micro_kernel(const PackedRows& w, int64_t r0, const PackedTokens& x, int64_t t0, int64_t n_super, float* out,
                  int64_t out_stride) {
    const int64_t k_bytes = n_super * kSuper, n_groups = n_super * kGroups;
    const uint8_t* wc = w.codes + r0 * k_bytes;
    const float* ws = w.scale + r0 * n_groups;
    const float* wo = kOffset ? w.offset + r0 * n_groups : nullptr;
    const int8_t* xc = x.codes + t0 * k_bytes;
    const float* xd = x.d + t0 * n_groups;
    const int32_t* xs = x.sum + t0 * n_groups;
    const __m512i bias = _mm512_set1_epi32(w.bias);
    const float* xo = kOffset ? x.offset_sum + t0 * n_groups : nullptr;
    __m512 sums[kRows][kTokens];
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
        #pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) sums[r][t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < n_super; ++s) {
        __m512i acc[kRows][kTokens];
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r)
            #pragma GCC unroll 16
            for (int t = 0; t < kTokens; ++t) acc[r][t] = _mm512_setzero_si512();
        #pragma GCC unroll 16
        for (int j = 0; j < 4; ++j) {
            const int64_t at = s * kSuper + 64 * j;
            __m512i xv[kTokens];
            #pragma GCC unroll 16
            for (int t = 0; t < kTokens; ++t) xv[t] = _mm512_loadu_si512(xc + t * k_bytes + at);
            #pragma GCC unroll 16
            for (int r = 0; r < kRows; ++r) {
                const __m512i wv = _mm512_loadu_si512(wc + r * k_bytes + at);
                #pragma GCC unroll 16
                for (int t = 0; t < kTokens; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv, xv[t]);
            }
        }
        const int64_t g = s * kGroups;
        __m512 d[kTokens], offset_sum[kTokens];
        __m512i bias_sum[kTokens];
        #pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
            d[t] = _mm512_loadu_ps(xd + t * n_groups + g);
            bias_sum[t] = _mm512_mullo_epi32(bias, _mm512_loadu_si512(xs + t * n_groups + g));
            if (kOffset) offset_sum[t] = _mm512_loadu_ps(xo + t * n_groups + g);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) {
            const __m512 scale = _mm512_loadu_ps(ws + r * n_groups + g);
            const __m512 offset = kOffset ? _mm512_loadu_ps(wo + r * n_groups + g) : _mm512_setzero_ps();
            #pragma GCC unroll 16
            for (int t = 0; t < kTokens; ++t) {
                const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][t], bias_sum[t]));
                sums[r][t] = _mm512_fmadd_ps(exact, _mm512_mul_ps(scale, d[t]), sums[r][t]);
                if (kOffset) sums[r][t] = _mm512_fmadd_ps(offset, offset_sum[t], sums[r][t]);
            }
        }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t)
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) out[t * out_stride + r] = _mm512_reduce_add_ps(sums[r][t]);
}

template <bool kOffset>
void all_rows(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride) {
    for (int64_t r0 = 0; r0 < w.rows; r0 += kRowBlock) {
        const auto micro = [&](auto tokens, int64_t t0) {
            micro_kernel<kRowBlock, decltype(tokens)::value, kOffset>(w, r0, x, t0, n_super,
                                                                      out + t0 * out_stride + r0, out_stride);
        };
        int64_t t0 = 0;
        for (; t0 + 4 <= x.tokens; t0 += 4) micro(std::integral_constant<int, 4>(), t0);
        switch (x.tokens - t0) {
            case 3: micro(std::integral_constant<int, 3>(), t0); break;
            case 2: micro(std::integral_constant<int, 2>(), t0); break;
            case 1: micro(std::integral_constant<int, 1>(), t0); break;
            default: break;
        }
    }
}

// One super-block's 256 codes in order (a: values 0-63, b: 64-127, c, d) into the interleaved
// layout at out: as 64 words of 4 values, word 4g + j (group g, values 4j..4j+3 of it) goes to
// word 16j + g. Step j gathers word 4g + j for groups 0-7 from a and b and for groups 8-15 from c
// and d (the same indices), then blends the halves.
void interleave_super(__m512i a, __m512i b, __m512i c, __m512i d, uint8_t* out) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        // lane g: group g % 8 of the pair, word 4 (g % 4) + j of its register (16 + for the second)
        const __m512i index = _mm512_add_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28), _mm512_set1_epi32(j));
        const __m512i low = _mm512_permutex2var_epi32(a, index, b), high = _mm512_permutex2var_epi32(c, index, d);
        _mm512_storeu_si512(out + 64 * j, _mm512_mask_blend_epi32(0xff00, low, high));
    }
}

}  // namespace

bool compiled() { return true; }

void interleave(const uint8_t* linear, int64_t n_super, uint8_t* out) {
    for (int64_t s = 0; s < n_super; ++s) {
        const uint8_t* in = linear + s * kSuper;
        interleave_super(_mm512_loadu_si512(in), _mm512_loadu_si512(in + 64), _mm512_loadu_si512(in + 128),
                         _mm512_loadu_si512(in + 192), out + s * kSuper);
    }
}

namespace {

// Q4_K rows, and with kFifthBit Q5_K rows (bit r of qh[l] above run r's nibbles).
template <class Block, bool kFifthBit>
void k4_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale, float* offset) {
    // Codes: values 64j .. 64j + 31 are the low nibbles of qs[32j .. 32j + 31], values 64j + 32 ..
    // 64j + 63 the high ones, so each 64 qs bytes give two 64-value registers of codes in order.
    // Scales: the eight runs' d * scale and -(dmin * min) in one vector, each lane then doubled
    // onto the run's two 16-value groups.
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const __m512i scale_lanes = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i offset_lanes = _mm512_add_epi32(scale_lanes, _mm512_set1_epi32(8));
    for (int64_t s = 0; s < n_blocks; ++s) {
        const auto& block = *reinterpret_cast<const Block*>(blocks + s * block_bytes);
        blocks::prefetch_ahead(block);
        __m512i ordered[4];
        for (int h = 0; h < 2; ++h) {
            const __m512i q = _mm512_loadu_si512(block.qs + 64 * h);
            const __m512i low = _mm512_and_si512(q, mask), high = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);
            ordered[2 * h] = _mm512_shuffle_i64x2(low, high, _MM_SHUFFLE(1, 0, 1, 0));
            ordered[2 * h + 1] = _mm512_shuffle_i64x2(low, high, _MM_SHUFFLE(3, 2, 3, 2));
            if constexpr (kFifthBit) {
                // ordered[2h + i] holds runs 4h + 2i and 4h + 2i + 1: qh twice, each half shifted by its run.
                const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh));
                const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
                for (int i = 0; i < 2; ++i) {
                    const int run = 4 * h + 2 * i;
                    const __m512i counts = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(short(run))),
                                                              _mm256_set1_epi16(short(run + 1)), 1);
                    const __m512i bits = _mm512_and_si512(_mm512_srlv_epi16(both, counts), _mm512_set1_epi8(1));
                    ordered[2 * h + i] = _mm512_or_si512(ordered[2 * h + i], _mm512_slli_epi16(bits, 4));
                }
            }
        }
        interleave_super(ordered[0], ordered[1], ordered[2], ordered[3], codes + s * kSuper);
        alignas(16) uint8_t scales_mins[16];
        blocks::k4_scales_mins(block.scales, scales_mins);
        const __m512 factors = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(blocks::load_half(block.d)),
                                                    _mm512_set1_ps(-blocks::load_half(block.dmin)));
        const __m512 products = _mm512_mul_ps(
            factors, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(scales_mins)))));
        _mm512_storeu_ps(scale + 16 * s, _mm512_permutexvar_ps(scale_lanes, products));
        _mm512_storeu_ps(offset + 16 * s, _mm512_permutexvar_ps(offset_lanes, products));
    }
}

}  // namespace

void q4_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale,
               float* offset) {
    k4_rows<blocks::BlockQ4_K, false>(blocks, n_blocks, block_bytes, codes, scale, offset);
}

void q5_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale,
               float* offset) {
    k4_rows<blocks::BlockQ5_K, true>(blocks, n_blocks, block_bytes, codes, scale, offset);
}

void q6_k_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale) {
    // Half h (values 128h .. 128h + 127) of a block: its 64 ql bytes as one register hold the low
    // four bits of values 128h .. 128h + 63 (low nibbles) and of the next 64 (high nibbles); its
    // 32 qh bytes, shifted by 0 and 2 (then 4 and 6), the two bits above each. Scales: d * scale.
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
    for (int64_t s = 0; s < n_blocks; ++s) {
        const uint8_t* block = blocks + s * block_bytes;
        blocks::prefetch_ahead(block, int(block_bytes));
        __m512i ordered[4];
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(block + 64 * h);
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h));
            const __m512i qh_low = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i qh_high = _mm512_srli_epi16(qh_low, 4);
            ordered[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                             _mm512_slli_epi16(_mm512_and_si512(qh_low, low2), 4));
            ordered[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                                 _mm512_slli_epi16(_mm512_and_si512(qh_high, low2), 4));
        }
        interleave_super(ordered[0], ordered[1], ordered[2], ordered[3], codes + s * kSuper);
        const auto& q6 = *reinterpret_cast<const blocks::BlockQ6_K*>(block);  // the sixteen d * scale
        _mm512_storeu_ps(scale + 16 * s,
                         _mm512_mul_ps(_mm512_set1_ps(blocks::load_half(q6.d)),
                                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(q6.scales))))));
    }
}

void rows_times_tokens(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride) {
    if (w.offset)
        all_rows<true>(w, x, n_super, out, out_stride);
    else
        all_rows<false>(w, x, n_super, out, out_stride);
}

}  // namespace avx512
}  // namespace q8_gemm
}  // namespace kcap

#endif
