// The int8 GEMM of cpu/matmul_q8_gemm.h with AVX2, for CPUs without AVX-512 VNNI. AVX2 has no
// vpdpbusd: vpmaddubsw multiplies the unsigned code bytes by the signed activation bytes and adds
// neighbouring pairs into saturating int16 lanes, vpmaddwd by ones then adds those pairs into the
// int32 lane of each 16-value group (a 32-byte half step holds 4 values of 8 groups). The int16
// sums must not saturate: with activation codes in [-127, 127] a pair is at most 2 * 127 * the
// largest code byte, so the pairs of all four steps of a super-block are summed in int16 where
// codes stay below 32 (the 4-, 5-bit and MXFP4 codes), of two steps below 64 (Q6_K), and Q8_0's
// signed codes (bytes with 128 added) multiply as |c| times the activation with c's sign (at most
// 2 * 128 * 127 a pair), one step at a time. Every group sum is then the exact int32 the AVX-512
// kernel forms, its f32 steps are the same and the 16 lanes are added in the order of
// _mm512_reduce_add_ps, so both builds give the same results bit for bit.
//
// A micro-kernel of 2 weight rows x up to 2 tokens runs over K once per half of the groups
// (groups 0-7, then 8-15: 4 f32 and 4 int16 accumulators, within the 16 registers). Compiled with
// AVX2 on every x86-64 build (CMakeLists.txt) and run only where the CPU has it; raw pointers and
// intrinsics only, so the object defines no inline function the linker could keep for other
// objects (tests/cpp/isa_confined.py checks).
#include "core/formats_dot_paths.h"
#include "cpu/matmul_q8_gemm.h"

#if !defined(KCAP_DOT_AVX2)  // the instructions this file is compiled with (formats_dot_paths.h)

namespace kcap {
namespace q8_gemm {
namespace avx2 {
bool compiled() { return false; }
void rows_times_tokens(const PackedRows&, const PackedTokens&, int64_t, float*, int64_t) {}
void interleave(const uint8_t*, int64_t, uint8_t*) {}
void q4_k_rows(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*) {}
void q5_k_rows(const uint8_t*, int64_t, int64_t, uint8_t*, float*, float*) {}
void q6_k_rows(const uint8_t*, int64_t, int64_t, uint8_t*, float*) {}
void legacy_rows(Format, const uint8_t*, int64_t, uint8_t*, float*) {}
}  // namespace avx2
}  // namespace q8_gemm
}  // namespace kcap

#else

#include <immintrin.h>

#include <type_traits>

#include "core/formats_blocks.h"

namespace kcap {
namespace q8_gemm {
namespace avx2 {

namespace {

constexpr int kRows = 2;  // weight rows per micro-kernel

// The 16 lanes of lo (groups 0-7) and hi (8-15) added as GCC's _mm512_reduce_add_ps adds a
// vector's 16 lanes: halves, then quarters, then pairs, then the last two.
float reduce_16(__m256 lo, __m256 hi) {
    const __m256 eight = _mm256_add_ps(hi, lo);
    const __m128 four = _mm_add_ps(_mm256_extractf128_ps(eight, 1), _mm256_castps256_ps128(eight));
    const __m128 two = _mm_add_ps(four, _mm_shuffle_ps(four, four, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(two) + _mm_cvtss_f32(_mm_shuffle_ps(two, two, _MM_SHUFFLE(1, 1, 1, 1)));
}

// Rows r0, r0 + 1 of w times tokens t0 .. t0 + kTokens - 1 of x.
template <int kTokens, int kChunk, bool kSigned, bool kOffset, bool kBias>
void micro_kernel(const PackedRows& w, int64_t r0, const PackedTokens& x, int64_t t0, int64_t n_super, float* out,
                  int64_t out_stride) {
    const int64_t k_bytes = n_super * kSuper, n_groups = n_super * kGroups;
    const uint8_t* wc = w.codes + r0 * k_bytes;
    const float* ws = w.scale + r0 * n_groups;
    const float* wo = kOffset ? w.offset + r0 * n_groups : nullptr;
    const int8_t* xc = x.codes + t0 * k_bytes;
    const float* xd = x.d + t0 * n_groups;
    const int32_t* xs = x.sum + t0 * n_groups;
    const float* xo = kOffset ? x.offset_sum + t0 * n_groups : nullptr;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i bias = _mm256_set1_epi32(w.bias);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256 halves[2][kRows][kTokens];
    for (int h = 0; h < 2; ++h) {
        __m256 sums[kRows][kTokens];
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r)
            #pragma GCC unroll 16
            for (int t = 0; t < kTokens; ++t) sums[r][t] = _mm256_setzero_ps();
        for (int64_t s = 0; s < n_super; ++s) {
            __m256i acc[kRows][kTokens];
            #pragma GCC unroll 4
            for (int c = 0; c < 4 / kChunk; ++c) {
                __m256i pairs[kRows][kTokens];
                // A loop, not unrolled: unrolled, GCC interleaves the steps' products and spills
                // registers (the 128-token prefill of the Qwen3 layout 294 -> 325 tok/s).
                #pragma GCC unroll 1
                for (int i = 0; i < kChunk; ++i) {
                    const int64_t at = s * kSuper + 64 * (c * kChunk + i) + 32 * h;
                    __m256i xv[kTokens];
                    #pragma GCC unroll 16
                    for (int t = 0; t < kTokens; ++t)
                        xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + t * k_bytes + at));
                    #pragma GCC unroll 16
                    for (int r = 0; r < kRows; ++r) {
                        __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + r * k_bytes + at));
                        __m256i code = wv;
                        if (kSigned) code = _mm256_xor_si256(wv, flip), wv = _mm256_sign_epi8(code, code);
                        #pragma GCC unroll 16
                        for (int t = 0; t < kTokens; ++t) {
                            const __m256i p = _mm256_maddubs_epi16(wv, kSigned ? _mm256_sign_epi8(xv[t], code) : xv[t]);
                            pairs[r][t] = i == 0 ? p : _mm256_add_epi16(pairs[r][t], p);
                        }
                    }
                }
                #pragma GCC unroll 16
                for (int r = 0; r < kRows; ++r)
                    #pragma GCC unroll 16
                    for (int t = 0; t < kTokens; ++t) {
                        const __m256i quads = _mm256_madd_epi16(pairs[r][t], ones);
                        acc[r][t] = c == 0 ? quads : _mm256_add_epi32(acc[r][t], quads);
                    }
            }
            const int64_t g = s * kGroups + 8 * h;
            __m256 d[kTokens], offset_sum[kTokens];
            __m256i bias_sum[kTokens];
            #pragma GCC unroll 16
            for (int t = 0; t < kTokens; ++t) {
                d[t] = _mm256_loadu_ps(xd + t * n_groups + g);
                if (kBias)
                    bias_sum[t] = _mm256_mullo_epi32(
                        bias, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + t * n_groups + g)));
                if (kOffset) offset_sum[t] = _mm256_loadu_ps(xo + t * n_groups + g);
            }
            #pragma GCC unroll 16
            for (int r = 0; r < kRows; ++r) {
                const __m256 scale = _mm256_loadu_ps(ws + r * n_groups + g);
                const __m256 offset = kOffset ? _mm256_loadu_ps(wo + r * n_groups + g) : _mm256_setzero_ps();
                #pragma GCC unroll 16
                for (int t = 0; t < kTokens; ++t) {
                    const __m256 exact = _mm256_cvtepi32_ps(kBias ? _mm256_sub_epi32(acc[r][t], bias_sum[t]) : acc[r][t]);
                    sums[r][t] = _mm256_fmadd_ps(exact, _mm256_mul_ps(scale, d[t]), sums[r][t]);
                    if (kOffset) sums[r][t] = _mm256_fmadd_ps(offset, offset_sum[t], sums[r][t]);
                }
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r)
            #pragma GCC unroll 16
            for (int t = 0; t < kTokens; ++t) halves[h][r][t] = sums[r][t];
    }
    for (int t = 0; t < kTokens; ++t)
        for (int r = 0; r < kRows; ++r) out[t * out_stride + r] = reduce_16(halves[0][r][t], halves[1][r][t]);
}

template <int kChunk, bool kSigned, bool kOffset, bool kBias>
void all_rows(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride) {
    static_assert(kRowBlock % kRows == 0, "the packed row blocks are whole micro-kernels");
    for (int64_t r0 = 0; r0 < w.rows; r0 += kRows) {
        int64_t t0 = 0;
        for (; t0 + 2 <= x.tokens; t0 += 2)
            micro_kernel<2, kChunk, kSigned, kOffset, kBias>(w, r0, x, t0, n_super, out + t0 * out_stride + r0, out_stride);
        if (t0 < x.tokens)
            micro_kernel<1, kChunk, kSigned, kOffset, kBias>(w, r0, x, t0, n_super, out + t0 * out_stride + r0, out_stride);
    }
}

// The kernel for the codes' range, their offsets and bias (the formats with offsets have codes
// without a bias; Q8_0's signed codes multiply without one).
template <bool kOffset>
void by_codes(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride) {
    if (w.max_code >= 64)  // Q8_0: signed codes plus 128 (matmul_q8_pack.cpp accepts no other format here)
        all_rows<1, true, kOffset, false>(w, x, n_super, out, out_stride);
    else if (w.max_code >= 32)
        all_rows<2, false, kOffset, true>(w, x, n_super, out, out_stride);
    else if (w.bias != 0)
        all_rows<4, false, kOffset, true>(w, x, n_super, out, out_stride);
    else
        all_rows<4, false, kOffset, false>(w, x, n_super, out, out_stride);
}

// Groups 8h .. 8h + 7 of a super-block (its codes in order: values 128h .. 128h + 127, in r[0..3])
// into the interleaved layout's half h at out (out + 64 j: step j): word 4g + j of the half (group
// g, values 4j..4j+3) goes to word 16 j + g of the super-block. Each register's words reordered
// into pairs (word j of its two groups), then a 4 x 4 transpose of those 64-bit pairs.
void interleave_half(const __m256i (&r)[4], uint8_t* out) {
    const __m256i pair_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i p[4];
    for (int i = 0; i < 4; ++i) p[i] = _mm256_permutevar8x32_epi32(r[i], pair_order);
    const __m256i t0 = _mm256_unpacklo_epi64(p[0], p[1]), t1 = _mm256_unpackhi_epi64(p[0], p[1]);
    const __m256i t2 = _mm256_unpacklo_epi64(p[2], p[3]), t3 = _mm256_unpackhi_epi64(p[2], p[3]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(t0, t2, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64), _mm256_permute2x128_si256(t1, t3, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 128), _mm256_permute2x128_si256(t0, t2, 0x31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 192), _mm256_permute2x128_si256(t1, t3, 0x31));
}

}  // namespace

bool compiled() { return true; }

void interleave(const uint8_t* linear, int64_t n_super, uint8_t* out) {
    for (int64_t s = 0; s < n_super; ++s)
        for (int h = 0; h < 2; ++h) {
            const uint8_t* in = linear + s * kSuper + 128 * h;
            __m256i r[4];
            for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32 * i));
            interleave_half(r, out + s * kSuper + 32 * h);
        }
}

namespace {

// Q4_K rows, and with kFifthBit Q5_K rows (bit r of qh[l] above run r's nibbles).
template <class Block, bool kFifthBit>
void k4_rows(const uint8_t* blocks, int64_t n_blocks, int64_t block_bytes, uint8_t* codes, float* scale, float* offset) {
    // Codes: values 64j .. 64j + 31 are the low nibbles of qs[32j .. 32j + 31], values 64j + 32 ..
    // 64j + 63 the high ones, so each 64 qs bytes give a half's four registers of codes in order.
    // Scales: the eight runs' d * scale and -(dmin * min) as vectors, each lane then doubled onto
    // the run's two 16-value groups.
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i first = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), second = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    for (int64_t s = 0; s < n_blocks; ++s) {
        const auto& block = *reinterpret_cast<const Block*>(blocks + s * block_bytes);
        blocks::prefetch_ahead(block);
        for (int h = 0; h < 2; ++h) {
            __m256i r[4];
            for (int j = 0; j < 2; ++j) {
                const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs + 64 * h + 32 * j));
                r[2 * j] = _mm256_and_si256(q, mask);
                r[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            }
            if constexpr (kFifthBit) {  // r[i] is run 4h + i
                const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh));
                for (int i = 0; i < 4; ++i) {
                    const __m256i bits = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(4 * h + i)),
                                                          _mm256_set1_epi8(1));
                    r[i] = _mm256_or_si256(r[i], _mm256_slli_epi16(bits, 4));
                }
            }
            interleave_half(r, codes + s * kSuper + 32 * h);
        }
        alignas(16) uint8_t scales_mins[16];
        blocks::k4_scales_mins(block.scales, scales_mins);
        const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(scales_mins));
        const __m256 run_scale = _mm256_mul_ps(_mm256_set1_ps(blocks::load_half(block.d)),
                                               _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed)));
        const __m256 run_offset = _mm256_mul_ps(_mm256_set1_ps(-blocks::load_half(block.dmin)),
                                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8))));
        _mm256_storeu_ps(scale + 16 * s, _mm256_permutevar8x32_ps(run_scale, first));
        _mm256_storeu_ps(scale + 16 * s + 8, _mm256_permutevar8x32_ps(run_scale, second));
        _mm256_storeu_ps(offset + 16 * s, _mm256_permutevar8x32_ps(run_offset, first));
        _mm256_storeu_ps(offset + 16 * s + 8, _mm256_permutevar8x32_ps(run_offset, second));
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
    // Half h (values 128h .. 128h + 127) of a block: ql bytes 64h .. 64h + 31 hold the low four
    // bits of its values 0-31 (low nibbles) and 64-95 (high), the next 32 of 32-63 and 96-127; qh
    // bytes 32h .. 32h + 31 the two bits above, at bits 0, 2, 4 and 6 for its four runs of 32.
    // Scales: d * scale.
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
    for (int64_t s = 0; s < n_blocks; ++s) {
        const uint8_t* block = blocks + s * block_bytes;
        blocks::prefetch_ahead(block, int(block_bytes));
        for (int h = 0; h < 2; ++h) {
            const __m256i ql[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h)),
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32))};
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h));
            __m256i r[4];
            for (int run = 0; run < 4; ++run) {
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql[run & 1], run < 2 ? 0 : 4), low4);
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * run), low2);
                r[run] = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
            }
            interleave_half(r, codes + s * kSuper + 32 * h);
        }
        const auto& q6 = *reinterpret_cast<const blocks::BlockQ6_K*>(block);  // the sixteen d * scale
        const __m256 d = _mm256_set1_ps(blocks::load_half(q6.d));
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q6.scales));
        _mm256_storeu_ps(scale + 16 * s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed))));
        _mm256_storeu_ps(scale + 16 * s + 8,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(packed, 8)))));
    }
}

// 128-bit code (SSSE3's pshufb and below): the AVX-512 build's packing calls it too.
void legacy_rows(Format format, const uint8_t* blocks, int64_t n_blocks, uint8_t* linear, float* scale) {
    // Each 32-value block: its codes in order into linear (value i < 16 from the low nibble of
    // qs[i], i >= 16 from the high nibble of qs[i - 16]; Q8_0's signed values plus 128; MXFP4's
    // doubled E2M1 values plus 12 by pshufb) and its scale into both of its 16-value groups.
    const __m128i low4 = _mm_set1_epi8(0x0f), flip = _mm_set1_epi8(static_cast<char>(0x80));
    alignas(16) uint8_t mxfp4[16];
    for (int i = 0; i < 16; ++i) mxfp4[i] = static_cast<uint8_t>(blocks::kMXFP4DoubledValues[i] + 12);
    const __m128i table = _mm_load_si128(reinterpret_cast<const __m128i*>(mxfp4));
    const int block_bytes = int(format_info(format).block_bytes);
    for (int64_t b = 0; b < n_blocks; ++b) {
        blocks::prefetch_ahead(blocks + b * block_bytes, block_bytes);
        __m128i lo, hi;
        float s;
        if (format == Format::Q8_0) {
            const auto& block = reinterpret_cast<const blocks::BlockQ8_0*>(blocks)[b];
            lo = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs)), flip);
            hi = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs + 16)), flip);
            s = blocks::load_half(block.d);
        } else {
            const bool q4_0 = format == Format::Q4_0;
            const uint8_t* qs = q4_0 ? reinterpret_cast<const blocks::BlockQ4_0*>(blocks)[b].qs
                                     : reinterpret_cast<const blocks::BlockMXFP4*>(blocks)[b].qs;
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
            lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
            if (!q4_0) lo = _mm_shuffle_epi8(table, lo), hi = _mm_shuffle_epi8(table, hi);
            s = q4_0 ? blocks::load_half(reinterpret_cast<const blocks::BlockQ4_0*>(blocks)[b].d)
                     : blocks::mxfp4_half_scale(reinterpret_cast<const blocks::BlockMXFP4*>(blocks)[b].e);
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(linear + 32 * b), lo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(linear + 32 * b + 16), hi);
        scale[2 * b] = scale[2 * b + 1] = s;
    }
}

void rows_times_tokens(const PackedRows& w, const PackedTokens& x, int64_t n_super, float* out, int64_t out_stride) {
    if (w.offset)
        by_codes<true>(w, x, n_super, out, out_stride);
    else
        by_codes<false>(w, x, n_super, out, out_stride);
}

}  // namespace avx2
}  // namespace q8_gemm
}  // namespace kcap

#endif
