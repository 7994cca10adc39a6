// The x86 dot_row kernels, compiled once per instruction set: formats_dot_avx2.cpp (AVX2+FMA,
// KCAP_DOT_WIDE 0) and formats_dot_avx512.cpp (AVX-512 with VNNI, KCAP_DOT_WIDE 1), each with
// KCAP_DOT_NS naming its namespace and its own target flags (CMakeLists.txt). Only those two
// files include it; its helpers are in an anonymous namespace, so no copy compiled for one
// instruction set can stand in for another's.
//
// Every format is reduced to the same step: 32 small integer codes in one 256-bit register,
// turned into weights w = code * scale + offset (per 16 values; runs of 16 or 32 elements share
// a scale) and multiplied into the accumulators: four of 8 lanes (AVX2) or two of 16 lanes
// (AVX-512: the first and the last 16 values of each run). Unpacking is a handful of byte
// shifts/masks (pshufb for MXFP4's value table) and the weights never leave registers. Biases
// are folded into the offset (d * (q - 8) becomes fma(q, d, -8d)). The weights are still exactly
// dequantize_row's: scale * code is exact in f32 for every format here (an f16 scale has 11
// significant bits, sub-scales and codes at most 13 more) and -8d is exact, so the one rounding
// of the FMA is the same rounding dequantize_row does. The C++ test checks this with one-hot x.
//
// Accumulation: each lane sums n/32 terms before the final fixed-order reduction (the tests'
// tolerance is derived from that chain length). q8_1 activations: integer products per 4 values
// (maddubs + madd on AVX2, one vpdpbusd on AVX-512 VNNI: the same int32 sums, since the pairs of
// maddubs never saturate here), times d * scale per 16 values.
#include <immintrin.h>

#include <cstring>

#include "core/formats_blocks.h"

namespace kcap {
namespace KCAP_DOT_NS {
namespace {

using namespace blocks;

#if KCAP_DOT_WIDE
struct Accumulators {
    __m512 lane[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};  // values 0-15 and 16-31 of every run
    __m256 q8 = _mm256_setzero_ps();  // q8_1: per 16 values, 4 lanes each half
    float offsets = 0.0f;             // q8_1: the offset terms, one per run (sum of q times offset)

    float total() const {
        const __m128 q8_half = _mm_add_ps(_mm256_castps256_ps128(q8), _mm256_extractf128_ps(q8, 1));
        __m128 half = _mm_add_ps(q8_half, _mm_movehl_ps(q8_half, q8_half));
        half = _mm_add_ss(half, _mm_movehdup_ps(half));
        return _mm512_reduce_add_ps(_mm512_add_ps(lane[0], lane[1])) + _mm_cvtss_f32(half) + offsets;
    }
};
#else
struct Accumulators {
    __m256 lane[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float offsets = 0.0f;  // q8_1: the offset terms, one per run (sum of q times offset)

    float total() const {
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(lane[0], lane[1]), _mm256_add_ps(lane[2], lane[3]));
        __m128 half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
        half = _mm_add_ps(half, _mm_movehl_ps(half, half));
        half = _mm_add_ss(half, _mm_movehdup_ps(half));
        return _mm_cvtss_f32(half) + offsets;
    }
};
#endif

// q8_1 activations as the format loops see them: x + e is the view from element e on (every
// call advances by whole 32-element runs).
struct Q8Run {
    Q8View v;
    Q8Run operator+(int64_t e) const { return {{v.q + e, v.d + e / 32, v.sum16 + e / 16}}; }
};

inline __m256 unsigned_bytes_to_float(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 signed_bytes_to_float(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

// acc[k] += ((code[8k..8k+7] - kBias) * scale + offset) * x[8k..8k+7] for the 32 codes (bytes,
// signed or not); the first 16 use (scale_low, offset_low), the last 16 (scale_high,
// offset_high). The bias (a power of two) goes into the FMA's addend: offset - kBias * scale is
// exact (the formats with a bias have no offset).
template <bool kSigned = false, int kBias = 0, bool kOffset = true, bool kOneScale = false>
inline void accumulate_32(__m256i codes, float scale_low, float offset_low, float scale_high, float offset_high,
                          const float* x, Accumulators& acc) {
    const __m128i low = _mm256_castsi256_si128(codes);
    const __m128i high = _mm256_extracti128_si256(codes, 1);
#if KCAP_DOT_WIDE
    const __m128i halves[2] = {low, high};
    const float scale[2] = {scale_low, scale_high};
    const float offset[2] = {offset_low - float(kBias) * scale_low, offset_high - float(kBias) * scale_high};
    for (int k = 0; k < 2; ++k) {
        const __m512i wide = kSigned ? _mm512_cvtepi8_epi32(halves[k]) : _mm512_cvtepu8_epi32(halves[k]);
        const __m512 weight =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(wide), _mm512_set1_ps(scale[k]), _mm512_set1_ps(offset[k]));
        acc.lane[k] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(x + 16 * k), acc.lane[k]);
    }
#else
    const __m128i parts[4] = {low, _mm_unpackhi_epi64(low, low), high, _mm_unpackhi_epi64(high, high)};
    const __m256 scale[2] = {_mm256_set1_ps(scale_low), _mm256_set1_ps(scale_high)};
    const __m256 offset[2] = {_mm256_set1_ps(offset_low - float(kBias) * scale_low),
                              _mm256_set1_ps(offset_high - float(kBias) * scale_high)};
    for (int k = 0; k < 4; ++k) {
        const __m256 code = kSigned ? signed_bytes_to_float(parts[k]) : unsigned_bytes_to_float(parts[k]);
        const __m256 weight = _mm256_fmadd_ps(code, scale[k / 2], offset[k / 2]);
        acc.lane[k] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(x + 8 * k), acc.lane[k]);
    }
#endif
}

// The same for q8_1 activations x = d * q: per 16 values, sum((code - kBias) * q) in int32
// (maddubs on the unsigned codes, or on |code| with q's signs moved for signed ones; pairs stay
// within int16: 2 * 128 * 127; the bias times sum(q) subtracted in int32, so nothing cancels in
// f32), times d * scale; the offsets take d * offset * sum(q) per 16 values. Each 16-value half
// lands in 4 lanes of lane[0] (run after run: the lanes sum n/32 terms).
// kOffset false: the format has no offsets (they are 0), so their term is skipped (it would add
// 0); kOneScale: the two halves share their scale, so one broadcast makes the scale vector.
template <bool kSigned = false, int kBias = 0, bool kOffset = true, bool kOneScale = false>
inline void accumulate_32(__m256i codes, float scale_low, float offset_low, float scale_high, float offset_high,
                          Q8Run x, Accumulators& acc) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.v.q));
    const __m256i unsigned_codes = kSigned ? _mm256_sign_epi8(codes, codes) : codes;
    const __m256i signed_q = kSigned ? _mm256_sign_epi8(q, codes) : q;
#if KCAP_DOT_WIDE
    __m256i quads = _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned_codes, signed_q);  // as maddubs + madd
    if (kBias != 0) {
        const __m256i q_quads = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
        quads = _mm256_sub_epi32(quads, _mm256_mullo_epi32(q_quads, _mm256_set1_epi32(kBias)));
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    // lanes 0-3: values 0-15; 4-7: 16-31
    __m256i quads = _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned_codes, signed_q), ones);
    if (kBias != 0) {
        const __m256i q_quads = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), ones);
        quads = _mm256_sub_epi32(quads, _mm256_mullo_epi32(q_quads, _mm256_set1_epi32(kBias)));
    }
#endif
    const float d = x.v.d[0];
    const __m256 scale = kOneScale ? _mm256_set1_ps(d * scale_low)
                                   : _mm256_setr_ps(d * scale_low, d * scale_low, d * scale_low, d * scale_low,
                                                    d * scale_high, d * scale_high, d * scale_high, d * scale_high);
#if KCAP_DOT_WIDE
    acc.q8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), scale, acc.q8);
#else
    acc.lane[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), scale, acc.lane[0]);
#endif
    if constexpr (kOffset)
        acc.offsets += d * (offset_low * static_cast<float>(x.v.sum16[0]) + offset_high * static_cast<float>(x.v.sum16[1]));
}

// One scale and offset for all 32 codes.
template <bool kSigned = false, int kBias = 0, bool kOffset = true, class X>
inline void accumulate_32(__m256i codes, float scale, float offset, X x, Accumulators& acc) {
    accumulate_32<kSigned, kBias, kOffset, true>(codes, scale, offset, scale, offset, x, acc);
}

inline __m256i load_256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Byte-wise (v >> shift) & mask for shift < 8: a 16-bit shift drags bits of the neighbouring
// byte in at the top, which the mask removes.
inline __m256i shift_mask(__m256i v, int shift, uint8_t mask) {
    const __m256i shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(static_cast<char>(mask)));
}

// The legacy split: 16 bytes -> low nibbles as codes 0..15, high nibbles as codes 16..31.
inline __m256i legacy_nibbles(const uint8_t* qs) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i low = _mm_and_si128(packed, mask);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
}

// Bit i of a little-endian u32 -> byte i as 0x10 (Q5_0/Q5_1's fifth bit): copy byte i / 8 of
// the word into byte i, then test bit i % 8.
inline __m256i fifth_bits(const uint8_t* qh_bytes) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, sizeof qh);
    const __m256i byte_of_bit = _mm256_setr_epi64x(0x0000000000000000ll, 0x0101010101010101ll,
                                                   0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), byte_of_bit);
    const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

template <class X>
float dot_q4_0(const BlockQ4_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float d = load_half(blocks[b].d);
        accumulate_32<false, 8, false>(legacy_nibbles(blocks[b].qs), d, 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q4_1(const BlockQ4_1* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float d = load_half(blocks[b].d), m = load_half(blocks[b].m);
        accumulate_32(legacy_nibbles(blocks[b].qs), d, m, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q5_0(const BlockQ5_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float d = load_half(blocks[b].d);
        const __m256i codes = _mm256_or_si256(legacy_nibbles(blocks[b].qs), fifth_bits(blocks[b].qh));
        accumulate_32<false, 16, false>(codes, d, 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q5_1(const BlockQ5_1* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const __m256i codes = _mm256_or_si256(legacy_nibbles(blocks[b].qs), fifth_bits(blocks[b].qh));
        accumulate_32(codes, load_half(blocks[b].d), load_half(blocks[b].m), x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q8_0(const BlockQ8_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[b].qs));
        accumulate_32<true, 0, false>(codes, load_half(blocks[b].d), 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_mxfp4(const BlockMXFP4* blocks, X x, int64_t n_blocks) {
    const __m128i doubled_values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMXFP4DoubledValues));
    const __m256i table = _mm256_broadcastsi128_si256(doubled_values);
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const __m256i codes = _mm256_shuffle_epi8(table, legacy_nibbles(blocks[b].qs));
        accumulate_32<true, 0, false>(codes, mxfp4_half_scale(blocks[b].e), 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q2_k(const BlockQ2_K* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const BlockQ2_K& block = blocks[b];
        const float d = load_half(block.d), dmin = load_half(block.dmin);
        const X xb = x + kQK_K * b;
        for (int half = 0; half < 2; ++half) {
            const __m256i packed = load_256(block.qs + 32 * half);
            for (int shift = 0; shift < 4; ++shift) {
                const int run = 8 * half + 2 * shift;  // first of the two 16-element runs
                const uint8_t low = block.scales[run], high = block.scales[run + 1];
                const float scale_low = d * static_cast<float>(low & 0x0f);
                const float offset_low = -(dmin * static_cast<float>(low >> 4));
                const float scale_high = d * static_cast<float>(high & 0x0f);
                const float offset_high = -(dmin * static_cast<float>(high >> 4));
                accumulate_32(shift_mask(packed, 2 * shift, 0x03), scale_low, offset_low, scale_high, offset_high,
                              xb + 128 * half + 32 * shift, acc);
            }
        }
    }
    return acc.total();
}

template <class X>
float dot_q3_k(const BlockQ3_K* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const BlockQ3_K& block = blocks[b];
        const float d = load_half(block.d);
        const X xb = x + kQK_K * b;
        const __m256i hmask = load_256(block.hmask);
        for (int half = 0; half < 2; ++half) {
            const __m256i packed = load_256(block.qs + 32 * half);
            for (int shift = 0; shift < 4; ++shift) {
                const int run = 8 * half + 2 * shift;
                const int hmask_bit = 4 * half + shift;
                // code = low two bits + 4 * hmask bit (0..7); value = code - 4.
                const __m256i high = _mm256_slli_epi16(shift_mask(hmask, hmask_bit, 0x01), 2);
                const __m256i codes = _mm256_or_si256(shift_mask(packed, 2 * shift, 0x03), high);
                const float scale_low = d * static_cast<float>(q3_k_scale(block.scales, run));
                const float scale_high = d * static_cast<float>(q3_k_scale(block.scales, run + 1));
                accumulate_32<false, 4, false>(codes, scale_low, 0.0f, scale_high, 0.0f,
                              xb + 128 * half + 32 * shift, acc);
            }
        }
    }
    return acc.total();
}

// Q4_K and Q5_K share everything but the fifth bit.
template <typename Block, bool kFifthBit, class X>
float dot_k4(const Block* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const Block& block = blocks[b];
        const float d = load_half(block.d), dmin = load_half(block.dmin);
        const X xb = x + kQK_K * b;
        __m256i qh = _mm256_setzero_si256();
        if constexpr (kFifthBit) qh = load_256(block.qh);
        for (int j = 0; j < 4; ++j) {
            const __m256i packed = load_256(block.qs + 32 * j);
            for (int nibble = 0; nibble < 2; ++nibble) {
                const int run = 2 * j + nibble;
                __m256i codes = shift_mask(packed, 4 * nibble, 0x0f);
                if constexpr (kFifthBit)
                    codes = _mm256_or_si256(codes, _mm256_slli_epi16(shift_mask(qh, run, 0x01), 4));
                int scale, min;
                k4_scale_min(block.scales, run, scale, min);
                const float run_scale = d * static_cast<float>(scale);
                const float run_offset = -(dmin * static_cast<float>(min));
                accumulate_32(codes, run_scale, run_offset, xb + 32 * run, acc);
            }
        }
    }
    return acc.total();
}

template <class X>
float dot_q6_k(const BlockQ6_K* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const BlockQ6_K& block = blocks[b];
        const float d = load_half(block.d);
        const X xb = x + kQK_K * b;
        for (int half = 0; half < 2; ++half) {
            const __m256i ql[2] = {load_256(block.ql + 64 * half), load_256(block.ql + 64 * half + 32)};
            const __m256i qh = load_256(block.qh + 32 * half);
            for (int s = 0; s < 4; ++s) {
                const int run = 8 * half + 2 * s;
                // code = 4 low bits | 2 high bits << 4 (0..63); value = code - 32.
                const __m256i low = shift_mask(ql[s & 1], s < 2 ? 0 : 4, 0x0f);
                const __m256i high = _mm256_slli_epi16(shift_mask(qh, 2 * s, 0x03), 4);
                const float scale_low = d * static_cast<float>(block.scales[run]);
                const float scale_high = d * static_cast<float>(block.scales[run + 1]);
                accumulate_32<false, 32, false>(_mm256_or_si256(low, high), scale_low, 0.0f, scale_high, 0.0f,
                                         xb + 128 * half + 32 * s, acc);
            }
        }
    }
    return acc.total();
}

// Float rows: 32 elements per step into the four accumulators. The last n % 32 elements are
// converted into a zero-padded stack buffer and take one more step, so that they too go
// through the accumulators (a scalar tail would be one long rounding chain).
// One step of a float row: the weights of 32 elements from i (Load: 8 at a time on AVX2, 16 on
// AVX-512) times x into the accumulators.
#if KCAP_DOT_WIDE
constexpr int kFloatStep = 16;
template <typename Load>
inline void float_step(Load load, const uint8_t* src, int64_t i, const float* x, Accumulators& acc) {
    for (int k = 0; k < 2; ++k)
        acc.lane[k] = _mm512_fmadd_ps(load(src, i + 16 * k), _mm512_loadu_ps(x + 16 * k), acc.lane[k]);
}
#else
constexpr int kFloatStep = 8;
template <typename Load>
inline void float_step(Load load, const uint8_t* src, int64_t i, const float* x, Accumulators& acc) {
    for (int k = 0; k < 4; ++k)
        acc.lane[k] = _mm256_fmadd_ps(load(src, i + 8 * k), _mm256_loadu_ps(x + 8 * k), acc.lane[k]);
}
#endif

// Float rows: 32 elements per step into the accumulators. The last n % 32 elements are
// converted into a zero-padded stack buffer and take one more step, so that they too go
// through the accumulators (a scalar tail would be one long rounding chain).
template <typename Load, typename LoadOne>
float dot_floats(const uint8_t* src, const float* x, int64_t n, Load load, LoadOne load_one) {
    Accumulators acc;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) float_step(load, src, i, x + i, acc);
    if (i < n) {
        alignas(64) float weights[32] = {};
        alignas(64) float x_tail[32] = {};
        for (int k = 0; i + k < n; ++k) {
            weights[k] = load_one(src, i + k);
            x_tail[k] = x[i + k];
        }
        const auto stacked = [](const uint8_t* p, int64_t j) {
            const float* w = reinterpret_cast<const float*>(p) + j;
#if KCAP_DOT_WIDE
            return _mm512_load_ps(w);
#else
            return _mm256_load_ps(w);
#endif
        };
        float_step(stacked, reinterpret_cast<const uint8_t*>(weights), 0, x_tail, acc);
    }
    return acc.total();
}

#if KCAP_DOT_WIDE
inline __m512 load_f32(const uint8_t* p, int64_t i) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p + 4 * i)); }
inline __m512 load_f16(const uint8_t* p, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
}
inline __m512 load_bf16(const uint8_t* p, int64_t i) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
#else
inline __m256 load_f32(const uint8_t* p, int64_t i) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4 * i)); }
inline __m256 load_f16(const uint8_t* p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
}
inline __m256 load_bf16(const uint8_t* p, int64_t i) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
#endif
static_assert(kFloatStep * (KCAP_DOT_WIDE ? 2 : 4) == 32, "a float step is one 32-element run");

float dot_f32(const uint8_t* src, const float* x, int64_t n) {
    return dot_floats(src, x, n, load_f32, [](const uint8_t* p, int64_t i) {
        float w;
        std::memcpy(&w, p + 4 * i, sizeof w);
        return w;
    });
}

float dot_f16(const uint8_t* src, const float* x, int64_t n) {
    return dot_floats(src, x, n, load_f16, [](const uint8_t* p, int64_t i) { return load_half(p + 2 * i); });
}

float dot_bf16(const uint8_t* src, const float* x, int64_t n) {
    return dot_floats(src, x, n, load_bf16, [](const uint8_t* p, int64_t i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, sizeof h);
        return bits_to_float(static_cast<uint32_t>(h) << 16);
    });
}

}  // namespace

bool compiled() { return true; }

#include "core/formats_dot_dispatch.h"

}  // namespace KCAP_DOT_NS
}  // namespace kcap
