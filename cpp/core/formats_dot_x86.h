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
#include <limits>
#include <type_traits>

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
    const float offset[2] = {kBias == 0 ? offset_low : offset_low - float(kBias) * scale_low,
                             kBias == 0 ? offset_high : offset_high - float(kBias) * scale_high};
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

// The per-run scales and offsets a kernel stores once per super-block and broadcasts for each
// run: this makes the compiler take them as changed in memory, so that each broadcast is a load
// (done by the load ports, or folded into the FMA as {1to16}) instead of a shuffle of the
// vector it still holds, which competes with the FMAs for the vector ports (GCC forwards the
// stored vector otherwise).
template <class A>
inline void from_memory(A& a) {
    asm volatile("" : "+m"(a));
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

#if KCAP_DOT_WIDE
// f32 activations on AVX-512, formats with 16 codes per scale: the 16 weights a code can stand
// for are one 16-lane table (`table`, built with the same FMA that accumulate_32 applies to each
// code, so each weight is the same f32 value), and vpermps looks each value's weight up. It
// reads the low 4 bits of each 32-bit lane: 16 bytes widened to 32-bit lanes index the low
// nibbles' weights as they are and the high nibbles' after a shift by 4. Per 32 values: one
// table FMA (per scale) and two lookups, where the codes took two conversions and two FMAs.
inline __m512 table_codes() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// acc.lane[k] += table[nibble] * x for the 16 bytes at qs: the low nibbles are the values at
// x_low (lanes 0-15: lane[0]), the high nibbles those at x_high, into lane[high_lane].
inline void accumulate_nibbles(const uint8_t* qs, __m512 table_low, const float* x_low, __m512 table_high,
                               const float* x_high, int low_lane, int high_lane, Accumulators& acc) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    acc.lane[low_lane] =
        _mm512_fmadd_ps(_mm512_permutexvar_ps(bytes, table_low), _mm512_loadu_ps(x_low), acc.lane[low_lane]);
    acc.lane[high_lane] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table_high),
                                          _mm512_loadu_ps(x_high), acc.lane[high_lane]);
}

// A legacy block (values 0-15 in the low nibbles, 16-31 in the high ones) with weights table[code].
inline void accumulate_legacy(const uint8_t* qs, __m512 table, const float* x, Accumulators& acc) {
    accumulate_nibbles(qs, table, x, table, x + 16, 0, 1, acc);
}

template <class X>
constexpr bool kF32Tables = std::is_same_v<X, const float*>;
#else
template <class X>
constexpr bool kF32Tables = false;
#endif

template <class X>
float dot_q4_0(const BlockQ4_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const float d = load_half(blocks[b].d);
#if KCAP_DOT_WIDE
        if constexpr (kF32Tables<X>) {
            const __m512 table = _mm512_fmadd_ps(table_codes(), _mm512_set1_ps(d), _mm512_set1_ps(0.0f - 8.0f * d));
            accumulate_legacy(blocks[b].qs, table, x + kQK * b, acc);
            continue;
        }
#endif
        accumulate_32<false, 8, false>(legacy_nibbles(blocks[b].qs), d, 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q4_1(const BlockQ4_1* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const float d = load_half(blocks[b].d), m = load_half(blocks[b].m);
#if KCAP_DOT_WIDE
        if constexpr (kF32Tables<X>) {
            accumulate_legacy(blocks[b].qs, _mm512_fmadd_ps(table_codes(), _mm512_set1_ps(d), _mm512_set1_ps(m)),
                              x + kQK * b, acc);
            continue;
        }
#endif
        accumulate_32(legacy_nibbles(blocks[b].qs), d, m, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q5_0(const BlockQ5_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
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
        prefetch_ahead(blocks[b]);
        const __m256i codes = _mm256_or_si256(legacy_nibbles(blocks[b].qs), fifth_bits(blocks[b].qh));
        accumulate_32(codes, load_half(blocks[b].d), load_half(blocks[b].m), x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q8_0(const BlockQ8_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
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
#if KCAP_DOT_WIDE
    if constexpr (kF32Tables<X>) {
        const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(doubled_values));
        alignas(64) float scales[16];
        for (int64_t b0 = 0; b0 < n_blocks; b0 += 16) {
            const int64_t n = n_blocks - b0 < 16 ? n_blocks - b0 : 16;
            for (int64_t i = 0; i < n; ++i) scales[i] = mxfp4_half_scale(blocks[b0 + i].e);
            from_memory(scales);
            for (int64_t i = 0; i < n; ++i) {
                const int64_t b = b0 + i;
                const __m512 weights = _mm512_fmadd_ps(values, _mm512_set1_ps(scales[i]), _mm512_setzero_ps());
                accumulate_legacy(blocks[b].qs, weights, x + kQK * b, acc);
            }
        }
        return acc.total();
    }
#endif
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const __m256i codes = _mm256_shuffle_epi8(table, legacy_nibbles(blocks[b].qs));
        accumulate_32<true, 0, false>(codes, mxfp4_half_scale(blocks[b].e), 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q2_k(const BlockQ2_K* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
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
        prefetch_ahead(blocks[b]);
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

// Q4_K/Q5_K's eight run scales d * scale and offsets -(dmin * min) of a super-block, as vectors.
template <typename Block>
inline void k4_scales_offsets(const Block& block, __m256& scale, __m256& offset) {
    alignas(16) uint8_t scales_mins[16];
    k4_scales_mins(block.scales, scales_mins);
    const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(scales_mins));
    scale = _mm256_mul_ps(_mm256_set1_ps(load_half(block.d)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed)));
    offset = _mm256_mul_ps(_mm256_set1_ps(-load_half(block.dmin)),
                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8))));
}

// Run 2j + nibble's 32 codes: the low (nibble 0) or high nibbles of qs[32j..32j+31] (`packed`),
// with Q5_K's fifth bit (bit `run` of qh[0..31]) above them.
template <bool kFifthBit>
inline __m256i k4_run_codes(__m256i packed, __m256i qh, int nibble, int run) {
    __m256i codes = shift_mask(packed, 4 * nibble, 0x0f);
    if constexpr (kFifthBit) codes = _mm256_or_si256(codes, _mm256_slli_epi16(shift_mask(qh, run, 0x01), 4));
    return codes;
}

// Q4_K and Q5_K share everything but the fifth bit. f32 activations (q8_1 takes the overloads
// below): a super-block's run scales d * scale and offsets -(dmin * min) are computed as vectors
// (the same products) and stored, so that each run's broadcasts are loads.
template <typename Block, bool kFifthBit>
float dot_k4(const Block* blocks, const float* x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Block& block = blocks[b];
        const float* xb = x + kQK_K * b;
        __m256 scale, offset;
        k4_scales_offsets(block, scale, offset);
        alignas(32) float run_scale[8], run_offset[8];
        _mm256_store_ps(run_scale, scale);
        _mm256_store_ps(run_offset, offset);
        from_memory(run_scale);
        from_memory(run_offset);
#if KCAP_DOT_WIDE
        if constexpr (!kFifthBit) {
            // Q4_K on AVX-512: each run's weights as a table (accumulate_nibbles); the 32 bytes
            // of qs for runs 2j and 2j + 1 hold run 2j's codes in their low nibbles and run
            // 2j + 1's in the high ones.
            for (int j = 0; j < 4; ++j) {
                __m512 table[2];
                for (int r = 0; r < 2; ++r)
                    table[r] = _mm512_fmadd_ps(table_codes(), _mm512_set1_ps(run_scale[2 * j + r]),
                                               _mm512_set1_ps(run_offset[2 * j + r]));
                for (int k = 0; k < 2; ++k)
                    accumulate_nibbles(block.qs + 32 * j + 16 * k, table[0], xb + 64 * j + 16 * k, table[1],
                                       xb + 64 * j + 32 + 16 * k, k, k, acc);
            }
            continue;
        }
#endif
        __m256i qh = _mm256_setzero_si256();
        if constexpr (kFifthBit) qh = load_256(block.qh);
        for (int j = 0; j < 4; ++j) {
            const __m256i packed = load_256(block.qs + 32 * j);
            for (int nibble = 0; nibble < 2; ++nibble) {
                const int run = 2 * j + nibble;
                accumulate_32(k4_run_codes<kFifthBit>(packed, qh, nibble, run), run_scale[run], run_offset[run],
                              xb + 32 * run, acc);
            }
        }
    }
    return acc.total();
}

// Q6_K's sixteen group scales d * scale of a super-block, as vectors: groups 0-7 and 8-15.
inline void q6_k_scales(const BlockQ6_K& block, __m256 (&scale)[2]) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.scales));
    const __m256 d = _mm256_set1_ps(load_half(block.d));
    scale[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed)));
    scale[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(packed, 8))));
}

// Run s (values 32s..32s+31) of a Q6_K half's 32 codes (0..63; the value is code - 32): the low
// (s < 2) or high nibbles of ql[s & 1] (the half's ql bytes 0-31 and 32-63) with bits 2s..2s+1 of
// the half's qh above them.
inline __m256i q6_k_run_codes(const __m256i (&ql)[2], __m256i qh, int s) {
    const __m256i low = shift_mask(ql[s & 1], s < 2 ? 0 : 4, 0x0f);
    return _mm256_or_si256(low, _mm256_slli_epi16(shift_mask(qh, 2 * s, 0x03), 4));
}

// Q6_K with f32 activations: the 16 scales d * scale computed as vectors per super-block and
// stored, as for Q4_K; the values code - 32 taken as signed bytes, so each weight is one exact
// product (value * scale, as dequantize_row's) with no offset to broadcast.
float dot_q6_k(const BlockQ6_K* blocks, const float* x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const BlockQ6_K& block = blocks[b];
        const float* xb = x + kQK_K * b;
        __m256 group_scale[2];
        q6_k_scales(block, group_scale);
        alignas(32) float scale[16];
        for (int h = 0; h < 2; ++h) _mm256_store_ps(scale + 8 * h, group_scale[h]);
        from_memory(scale);
        for (int half = 0; half < 2; ++half) {
            const __m256i ql[2] = {load_256(block.ql + 64 * half), load_256(block.ql + 64 * half + 32)};
            const __m256i qh = load_256(block.qh + 32 * half);
            for (int s = 0; s < 4; ++s) {
                const int g = 8 * half + 2 * s;  // the 16-value groups of this run of 32
                const __m256i values = _mm256_sub_epi8(q6_k_run_codes(ql, qh, s), _mm256_set1_epi8(32));
                accumulate_32<true, 0, false>(values, scale[g], 0.0f, scale[g + 1], 0.0f, xb + 128 * half + 32 * s,
                                              acc);
            }
        }
    }
    return acc.total();
}

// q8_1 activations, the K-quants of Q4_K_M files a super-block at a time. Integer
// products of one q8_1 block (32 values) give exact int32 sums of 4 products per lane (vpdpbusd
// on AVX-512, maddubs + madd on AVX2); each lane is converted and multiplied into an accumulator
// by its own factor d_x * (d * scale), the same two f32 products the per-run kernels form. The
// factors of a super-block are computed in one vector and moved to the lanes by a permute, so
// a kernel that went run by run (scale unpacking, the mins' terms and broadcasts in scalar code)
// takes a few vector operations per 256 values instead.

inline float reduce_256(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    half = _mm_add_ss(half, _mm_movehdup_ps(half));
    return _mm_cvtss_f32(half);
}

// Q4_K/Q5_K's per-run factors of one super-block against q8_1 blocks xb: factor[r] =
// d_x[r] * (d * scale[r]); the mins' terms d_x[r] * -(dmin * min[r]) * sum(q of run r) added to
// acc_mins (sum(q) of a run from q8_1's sums of 16).
template <typename Block>
inline __m256 k4_factors(const Block& block, Q8Run xb, __m256& acc_mins) {
    __m256 scale, offset;
    k4_scales_offsets(block, scale, offset);
    const __m256 dx = _mm256_loadu_ps(xb.v.d);
    // hadd gives runs (0 1 4 5 2 3 6 7) by 64-bit pairs; the permute puts them in order.
    const __m256i run_sums =
        _mm256_permute4x64_epi64(_mm256_hadd_epi32(load_256(reinterpret_cast<const uint8_t*>(xb.v.sum16)),
                                                   load_256(reinterpret_cast<const uint8_t*>(xb.v.sum16 + 8))),
                                 0xd8);
    acc_mins = _mm256_fmadd_ps(_mm256_mul_ps(dx, offset), _mm256_cvtepi32_ps(run_sums), acc_mins);
    return _mm256_mul_ps(dx, scale);
}

// Q6_K's per-group factors d_x[g / 2] * (d * scale[g]) of one super-block, groups 0-7 in
// low and 8-15 in high.
inline void q6_k_factors(const BlockQ6_K& block, Q8Run xb, __m256& low, __m256& high) {
    const __m256 dx = _mm256_loadu_ps(xb.v.d);
    __m256 scale[2];
    q6_k_scales(block, scale);
    low = _mm256_mul_ps(_mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)), scale[0]);
    high = _mm256_mul_ps(_mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)), scale[1]);
}

#if KCAP_DOT_WIDE
// AVX-512: a chunk c of 64 values (q8_1 blocks 2c and 2c+1) is one register of codes against one
// of q; lanes 0-7 of the sums are block 2c's, 8-15 block 2c+1's (Q6_K: lanes 4g..4g+3 its
// 16-value group 4c + g). Accumulator c for chunk c.

// The same 256 bits in both halves of a register.
inline __m512i both_halves(const uint8_t* p) { return _mm512_broadcast_i64x4(load_256(p)); }

// A value per half of a register, in 16-bit or 8-bit lanes.
inline __m512i halves_epi16(int low, int high) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(short(low))), _mm256_set1_epi16(short(high)), 1);
}
inline __m512i halves_epi8(int low, int high) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8(char(low))), _mm256_set1_epi8(char(high)), 1);
}

// Lanes 0-7 factor[2c], 8-15 factor[2c+1].
inline __m512 chunk_factors(__m256 factor, int c) {
    const __m512i index =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * c)), _mm256_set1_epi32(2 * c + 1), 1);
    return _mm512_permutexvar_ps(index, _mm512_castps256_ps512(factor));
}

inline float reduce_chunks(const __m512 (&acc)[4]) {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// Q4_K and Q5_K: chunk c is runs 2c (low nibbles of qs[32c..]) and 2c+1 (high nibbles); the fifth
// bits (Q5_K) bits 2c and 2c+1 of qh.
template <typename Block, bool kFifthBit>
float dot_k4(const Block* blocks, Q8Run x, int64_t n_blocks) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 acc_mins = _mm256_setzero_ps();
    const __m512i nibble_shift = halves_epi16(0, 4), low4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Block& block = blocks[b];
        const Q8Run xb = x + kQK_K * b;
        const __m256 factor = k4_factors(block, xb, acc_mins);
        __m512i qh = _mm512_setzero_si512();
        if constexpr (kFifthBit) qh = both_halves(block.qh);
        for (int c = 0; c < 4; ++c) {
            __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(both_halves(block.qs + 32 * c), nibble_shift), low4);
            if constexpr (kFifthBit) {
                const __mmask64 fifth = _mm512_test_epi8_mask(qh, halves_epi8(1 << (2 * c), 1 << (2 * c + 1)));
                codes = _mm512_mask_add_epi8(codes, fifth, codes, _mm512_set1_epi8(16));
            }
            const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(xb.v.q + 64 * c));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), chunk_factors(factor, c), acc[c]);
        }
    }
    return reduce_chunks(acc) + reduce_256(acc_mins);
}

// Q6_K: half h's 128 values are chunks 2h (low nibbles of ql[64h..64h+63], bits 0-1 and 2-3 of
// qh[32h..32h+31] above them) and 2h+1 (high nibbles, bits 4-5 and 6-7). The bias 32 comes off
// each lane's int32 sum (32 times its sum of q, a second vpdpbusd), so nothing cancels in f32.
float dot_q6_k(const BlockQ6_K* blocks, Q8Run x, int64_t n_blocks) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    const __m512i low4 = _mm512_set1_epi8(0x0f), high2 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
    const __m512i low_pair_shift = halves_epi16(4, 2), high_pair_shift = halves_epi16(0, 2);
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const BlockQ6_K& block = blocks[b];
        const Q8Run xb = x + kQK_K * b;
        __m256 factor_low, factor_high;
        q6_k_factors(block, xb, factor_low, factor_high);
        const __m512 factor = _mm512_insertf32x8(_mm512_castps256_ps512(factor_low), factor_high, 1);
        for (int half = 0; half < 2; ++half) {
            const __m512i ql = _mm512_loadu_si512(block.ql + 64 * half);
            const __m512i qh = both_halves(block.qh + 32 * half);
            const __m512i codes[2] = {
                _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_sllv_epi16(qh, low_pair_shift), high2)),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                _mm512_and_si512(_mm512_srlv_epi16(qh, high_pair_shift), high2))};
            for (int part = 0; part < 2; ++part) {
                const int c = 2 * half + part, g = 4 * c;
                const __m512i q = _mm512_loadu_si512(xb.v.q + 64 * c);
                const __m512i sums = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[part], q),
                                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, q));
                const __m512i group = _mm512_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 2, g + 2, g + 2,
                                                        g + 2, g + 3, g + 3, g + 3, g + 3);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(group, factor), acc[c]);
            }
        }
    }
    return reduce_chunks(acc);
}
#else
// AVX2: one register of codes per q8_1 block (run r of 32 values), all 8 lanes of its sums run
// r's (Q6_K: lanes 0-3 group 2r, 4-7 group 2r+1). Accumulators by run parity.

// Run r's integer sums of 4 products: maddubs pairs (within int16: 2 * 63 * 127) added by madd.
inline __m256i run_sums(__m256i codes, const int8_t* q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
                             _mm256_set1_epi16(1));
}

template <typename Block, bool kFifthBit>
float dot_k4(const Block* blocks, Q8Run x, int64_t n_blocks) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 acc_mins = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Block& block = blocks[b];
        const Q8Run xb = x + kQK_K * b;
        const __m256 factor = k4_factors(block, xb, acc_mins);
        __m256i qh = _mm256_setzero_si256();
        if constexpr (kFifthBit) qh = load_256(block.qh);
        for (int j = 0; j < 4; ++j) {
            const __m256i packed = load_256(block.qs + 32 * j);
            for (int nibble = 0; nibble < 2; ++nibble) {
                const int run = 2 * j + nibble;
                const __m256i codes = k4_run_codes<kFifthBit>(packed, qh, nibble, run);
                const __m256 run_factor = _mm256_permutevar8x32_ps(factor, _mm256_set1_epi32(run));
                acc[nibble] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(run_sums(codes, xb.v.q + 32 * run)), run_factor, acc[nibble]);
            }
        }
    }
    return reduce_256(_mm256_add_ps(acc[0], acc[1])) + reduce_256(acc_mins);
}

// Q6_K: the bias 32 comes off in int16 before madd (32 times each pair of q: the difference is
// within 2 * 63 * 127 + 2 * 32 * 128), so nothing cancels in f32.
float dot_q6_k(const BlockQ6_K* blocks, Q8Run x, int64_t n_blocks) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i bias = _mm256_set1_epi8(32), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const BlockQ6_K& block = blocks[b];
        const Q8Run xb = x + kQK_K * b;
        __m256 factors[2];
        q6_k_factors(block, xb, factors[0], factors[1]);
        for (int half = 0; half < 2; ++half) {
            const __m256i ql[2] = {load_256(block.ql + 64 * half), load_256(block.ql + 64 * half + 32)};
            const __m256i qh = load_256(block.qh + 32 * half);
            for (int s = 0; s < 4; ++s) {
                const int run = 4 * half + s;
                const __m256i codes = q6_k_run_codes(ql, qh, s);
                const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.v.q + 32 * run));
                const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(codes, q), _mm256_maddubs_epi16(bias, q));
                // lanes 0-3 group 2s of this half's factors, 4-7 group 2s + 1
                const __m256 group_factor = _mm256_permutevar8x32_ps(
                    factors[half], _mm256_setr_epi32(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1));
                acc[s & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), group_factor, acc[s & 1]);
            }
        }
    }
    return reduce_256(_mm256_add_ps(acc[0], acc[1]));
}
#endif

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
// through the accumulators (a scalar tail would be one long rounding chain). kBytes: bytes per
// weight (the prefetch's stride).
template <int kBytes, typename Load, typename LoadOne>
float dot_floats(const uint8_t* src, const float* x, int64_t n, Load load, LoadOne load_one) {
    Accumulators acc;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_ahead(src + kBytes * i, 32 * kBytes);
        float_step(load, src, i, x + i, acc);
    }
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
    return dot_floats<4>(src, x, n, load_f32, [](const uint8_t* p, int64_t i) {
        float w;
        std::memcpy(&w, p + 4 * i, sizeof w);
        return w;
    });
}

float dot_f16(const uint8_t* src, const float* x, int64_t n) {
    return dot_floats<2>(src, x, n, load_f16, [](const uint8_t* p, int64_t i) { return load_half(p + 2 * i); });
}

float dot_bf16(const uint8_t* src, const float* x, int64_t n) {
    return dot_floats<2>(src, x, n, load_bf16, [](const uint8_t* p, int64_t i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, sizeof h);
        return bits_to_float(static_cast<uint32_t>(h) << 16);
    });
}

}  // namespace

bool compiled() { return true; }

// 32 values at a time, 8 lanes a vector in both builds: the largest magnitude (max is exact in
// any order; a NaN is passed over, as std::max(amax, NaN) keeps amax), the same scale and inverse
// as the scalar code, each code the product x * inverse rounded by cvtps_epi32 (the current
// rounding mode: to nearest, ties to even, what std::nearbyint does), and a conversion that
// fails (NaN, infinity: 0x80000000) giving 0 as the scalar float-to-int8 cast's low byte does.
void quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i invalid = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    for (int64_t r = 0; r < n; r += 32) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(x + r + 8 * k);
            amax = _mm256_max_ps(_mm256_and_ps(v[k], magnitude), amax);  // a NaN lane keeps amax
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float scale = _mm_cvtss_f32(m) / 127.0f;
        const float inverse = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
        d[r / 32] = scale;
        const __m256 by = _mm256_set1_ps(inverse);
        __m256i code[4];
        for (int k = 0; k < 4; ++k) {
            const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], by));
            code[k] = _mm256_andnot_si256(_mm256_cmpeq_epi32(c, invalid), c);  // within +-127 now
        }
        // int32 -> int8 (no saturation left to do); the packs interleave 128-bit halves, which
        // the permute puts back in order.
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(code[0], code[1]), _mm256_packs_epi32(code[2], code[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + r),
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        for (int half = 0; half < 2; ++half) {
            const __m256i s8 = _mm256_add_epi32(code[2 * half], code[2 * half + 1]);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            sum16[r / 16 + half] = _mm_cvtsi128_si32(s4);
        }
    }
}

#include "core/formats_dot_dispatch.h"

}  // namespace KCAP_DOT_NS
}  // namespace kcap
