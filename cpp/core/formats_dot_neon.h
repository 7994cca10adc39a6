// The Arm NEON dot_row kernels, compiled twice: formats_dot_neon.cpp (Advanced SIMD, which every
// AArch64 CPU has: KCAP_DOT_SDOT 0, dot_row and dot_row_q8_1) and formats_dot_neon_dotprod.cpp
// (built with -march=armv8.2-a+dotprod: KCAP_DOT_SDOT 1, dot_row_q8_1 only, as the f32 path has no
// integer products). KCAP_DOT_NS names the namespace. Only those two files include this header;
// its helpers are in an anonymous namespace, so no copy compiled for dotprod can stand in for the
// plain one.
//
// The same reduction as formats_dot_x86.h: 32 small integer codes of a run in two 16-byte
// registers (values 0-15 and 16-31), turned into weights w = code * scale + offset (per 16
// values) and multiplied into the accumulators: eight of 4 lanes, lane[k] taking values
// 4k..4k+3 of every run. Every format's codes, with its bias subtracted in the bytes, fit in int8
// (Q8_0 -128..127, Q6_K -32..31, the rest smaller; the unbiased ones are at most 31), so one
// int8 -> f32 widening serves every format. The weights are exactly dequantize_row's: scale *
// code is exact in f32 (an f16 scale has 11 significant bits, sub-scales and codes at most 13
// more), so the one rounding of the FMA with the offset is the rounding dequantize_row does.
//
// Accumulation: each lane sums n/32 terms before the final fixed-order reduction (the tests'
// tolerance is derived from that chain length). q8_1 activations: per 16 values, the int32 sums of
// code * q (SDOT, vdotq_s32, where built for it; otherwise vmull_s8 products, which fit in int16
// as |code * q| <= 128 * 127, added pairwise into int32 by vpaddlq/vpadalq), times d * scale, into
// lane[0] (values 0-15) and lane[1] (16-31); the offsets take d * offset * sum(q) per 16 values.
#include <arm_neon.h>

#include <cstring>

#include "core/formats_blocks.h"

namespace kcap {
namespace KCAP_DOT_NS {
namespace {

using namespace blocks;

struct Accumulators {
    float32x4_t lane[8];   // lane[k]: values 4k..4k+3 of every run
    float offsets = 0.0f;  // q8_1: the offset terms, one per run (sum of q times offset)

    Accumulators() {
        for (float32x4_t& l : lane) l = vdupq_n_f32(0.0f);
    }

    // A fixed pairwise order: 3 vector additions, then the 4 lanes (vaddvq: 2 more).
    float total() const {
        float32x4_t fold[4];
        for (int k = 0; k < 4; ++k) fold[k] = vaddq_f32(lane[k], lane[k + 4]);
        const float32x4_t sum = vaddq_f32(vaddq_f32(fold[0], fold[2]), vaddq_f32(fold[1], fold[3]));
        return vaddvq_f32(sum) + offsets;
    }
};

// q8_1 activations as the format loops see them: x + e is the view from element e on (every
// call advances by whole 32-element runs).
struct Q8Run {
    Q8View v;
    Q8Run operator+(int64_t e) const { return {{v.q + e, v.d + e / 32, v.sum16 + e / 16}}; }
};

// 32 bytes of a run: values 0-15 and 16-31.
struct Bytes32 {
    uint8x16_t low, high;
};

inline Bytes32 load_32(const uint8_t* p) { return {vld1q_u8(p), vld1q_u8(p + 16)}; }

// Byte-wise (v >> shift) & mask (vshlq by a negative count shifts right: the count need not be
// an immediate).
inline Bytes32 shift_mask(Bytes32 v, int shift, uint8_t mask) {
    const int8x16_t count = vdupq_n_s8(static_cast<int8_t>(-shift));
    const uint8x16_t keep = vdupq_n_u8(mask);
    return {vandq_u8(vshlq_u8(v.low, count), keep), vandq_u8(vshlq_u8(v.high, count), keep)};
}

inline Bytes32 shift_left(Bytes32 v, int shift) {
    const int8x16_t count = vdupq_n_s8(static_cast<int8_t>(shift));
    return {vshlq_u8(v.low, count), vshlq_u8(v.high, count)};
}

inline Bytes32 bitwise_or(Bytes32 a, Bytes32 b) { return {vorrq_u8(a.low, b.low), vorrq_u8(a.high, b.high)}; }

// The codes minus the format's bias, as signed bytes (the subtraction wraps in u8 exactly as it
// would in s8; every result lies in -128..127).
template <int kBias>
inline int8x16_t signed_codes(uint8x16_t codes) {
    if (kBias == 0) return vreinterpretq_s8_u8(codes);
    return vreinterpretq_s8_u8(vsubq_u8(codes, vdupq_n_u8(static_cast<uint8_t>(kBias))));
}

#if !KCAP_DOT_SDOT
// acc.lane[4h + k] += ((code - kBias) * scale_h + offset_h) * x[16h + 4k ..] for the 32 codes,
// h = 0 for values 0-15 (scale_low, offset_low), 1 for 16-31 (scale_high, offset_high).
template <int kBias>
inline void accumulate_32(Bytes32 codes, float scale_low, float offset_low, float scale_high, float offset_high,
                          const float* x, Accumulators& acc) {
    const int8x16_t halves[2] = {signed_codes<kBias>(codes.low), signed_codes<kBias>(codes.high)};
    const float scale[2] = {scale_low, scale_high};
    const float offset[2] = {offset_low, offset_high};
    for (int h = 0; h < 2; ++h) {
        const int16x8_t wide[2] = {vmovl_s8(vget_low_s8(halves[h])), vmovl_high_s8(halves[h])};
        const float32x4_t scale_v = vdupq_n_f32(scale[h]), offset_v = vdupq_n_f32(offset[h]);
        for (int k = 0; k < 4; ++k) {
            const int32x4_t code = k % 2 == 0 ? vmovl_s16(vget_low_s16(wide[k / 2])) : vmovl_high_s16(wide[k / 2]);
            const float32x4_t weight = vfmaq_f32(offset_v, vcvtq_f32_s32(code), scale_v);
            acc.lane[4 * h + k] = vfmaq_f32(acc.lane[4 * h + k], weight, vld1q_f32(x + 16 * h + 4 * k));
        }
    }
}
#endif

// The four int32 sums of a * b over 16 signed bytes (each the sum of 4 products; which products
// share a lane differs between the two forms, the total does not).
inline int32x4_t products_16(int8x16_t a, int8x16_t b) {
#if KCAP_DOT_SDOT
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    const int16x8_t low = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t high = vmull_high_s8(a, b);
    return vpadalq_s16(vpaddlq_s16(low), high);
#endif
}

// The same for q8_1 activations x = d * q: per 16 values, sum((code - kBias) * q) in int32 (the
// bias subtracted in the bytes, so nothing cancels in f32), times d * scale; the offsets take
// d * offset * sum(q) per 16 values.
template <int kBias>
inline void accumulate_32(Bytes32 codes, float scale_low, float offset_low, float scale_high, float offset_high,
                          Q8Run x, Accumulators& acc) {
    const int32x4_t low = products_16(signed_codes<kBias>(codes.low), vld1q_s8(x.v.q));
    const int32x4_t high = products_16(signed_codes<kBias>(codes.high), vld1q_s8(x.v.q + 16));
    const float d = x.v.d[0];
    acc.lane[0] = vfmaq_f32(acc.lane[0], vcvtq_f32_s32(low), vdupq_n_f32(d * scale_low));
    acc.lane[1] = vfmaq_f32(acc.lane[1], vcvtq_f32_s32(high), vdupq_n_f32(d * scale_high));
    acc.offsets += d * (offset_low * static_cast<float>(x.v.sum16[0]) + offset_high * static_cast<float>(x.v.sum16[1]));
}

// One scale and offset for all 32 codes.
template <int kBias = 0, class X>
inline void accumulate_32(Bytes32 codes, float scale, float offset, X x, Accumulators& acc) {
    accumulate_32<kBias>(codes, scale, offset, scale, offset, x, acc);
}

// The legacy split: 16 bytes -> low nibbles as codes 0..15, high nibbles as codes 16..31.
inline Bytes32 legacy_nibbles(const uint8_t* qs) {
    const uint8x16_t packed = vld1q_u8(qs);
    return {vandq_u8(packed, vdupq_n_u8(0x0f)), vshrq_n_u8(packed, 4)};
}

// Bit i of a little-endian u32 -> byte i as 0x10 (Q5_0/Q5_1's fifth bit): copy byte i / 8 of
// the word into byte i (a table lookup), then test bit i % 8.
inline Bytes32 fifth_bits(const uint8_t* qh_bytes) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, sizeof qh);
    const uint8x16_t word = vreinterpretq_u8_u32(vdupq_n_u32(qh));
    const uint8x16_t bit_of_byte = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
    const uint8x16_t byte_of_bit[2] = {vcombine_u8(vdup_n_u8(0), vdup_n_u8(1)),
                                       vcombine_u8(vdup_n_u8(2), vdup_n_u8(3))};
    uint8x16_t bits[2];
    for (int h = 0; h < 2; ++h) {
        const uint8x16_t set = vtstq_u8(vqtbl1q_u8(word, byte_of_bit[h]), bit_of_byte);
        bits[h] = vandq_u8(set, vdupq_n_u8(0x10));
    }
    return {bits[0], bits[1]};
}

template <class X>
float dot_q4_0(const BlockQ4_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        accumulate_32<8>(legacy_nibbles(blocks[b].qs), load_half(blocks[b].d), 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q4_1(const BlockQ4_1* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        accumulate_32(legacy_nibbles(blocks[b].qs), load_half(blocks[b].d), load_half(blocks[b].m), x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q5_0(const BlockQ5_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Bytes32 codes = bitwise_or(legacy_nibbles(blocks[b].qs), fifth_bits(blocks[b].qh));
        accumulate_32<16>(codes, load_half(blocks[b].d), 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q5_1(const BlockQ5_1* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Bytes32 codes = bitwise_or(legacy_nibbles(blocks[b].qs), fifth_bits(blocks[b].qh));
        accumulate_32(codes, load_half(blocks[b].d), load_half(blocks[b].m), x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_q8_0(const BlockQ8_0* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Bytes32 codes = load_32(reinterpret_cast<const uint8_t*>(blocks[b].qs));  // int8 bit patterns
        accumulate_32(codes, load_half(blocks[b].d), 0.0f, x + kQK * b, acc);
    }
    return acc.total();
}

template <class X>
float dot_mxfp4(const BlockMXFP4* blocks, X x, int64_t n_blocks) {
    const uint8x16_t table = vld1q_u8(reinterpret_cast<const uint8_t*>(kMXFP4DoubledValues));
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const Bytes32 nibbles = legacy_nibbles(blocks[b].qs);
        const Bytes32 codes = {vqtbl1q_u8(table, nibbles.low), vqtbl1q_u8(table, nibbles.high)};  // int8 values
        accumulate_32(codes, mxfp4_half_scale(blocks[b].e), 0.0f, x + kQK * b, acc);
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
            const Bytes32 packed = load_32(block.qs + 32 * half);
            for (int shift = 0; shift < 4; ++shift) {
                const int run = 8 * half + 2 * shift;  // first of the two 16-element runs
                const uint8_t low = block.scales[run], high = block.scales[run + 1];
                const float scale_low = d * static_cast<float>(low & 0x0f);
                const float offset_low = -(dmin * static_cast<float>(low >> 4));
                const float scale_high = d * static_cast<float>(high & 0x0f);
                const float offset_high = -(dmin * static_cast<float>(high >> 4));
                accumulate_32<0>(shift_mask(packed, 2 * shift, 0x03), scale_low, offset_low, scale_high, offset_high,
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
        const Bytes32 hmask = load_32(block.hmask);
        for (int half = 0; half < 2; ++half) {
            const Bytes32 packed = load_32(block.qs + 32 * half);
            for (int shift = 0; shift < 4; ++shift) {
                const int run = 8 * half + 2 * shift;
                // code = low two bits + 4 * hmask bit (0..7); value = code - 4.
                const Bytes32 high = shift_left(shift_mask(hmask, 4 * half + shift, 0x01), 2);
                const Bytes32 codes = bitwise_or(shift_mask(packed, 2 * shift, 0x03), high);
                const float scale_low = d * static_cast<float>(q3_k_scale(block.scales, run));
                const float scale_high = d * static_cast<float>(q3_k_scale(block.scales, run + 1));
                accumulate_32<4>(codes, scale_low, 0.0f, scale_high, 0.0f, xb + 128 * half + 32 * shift, acc);
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
        prefetch_ahead(blocks[b]);
        const Block& block = blocks[b];
        const float d = load_half(block.d), dmin = load_half(block.dmin);
        const X xb = x + kQK_K * b;
        Bytes32 qh = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if constexpr (kFifthBit) qh = load_32(block.qh);
        for (int j = 0; j < 4; ++j) {
            const Bytes32 packed = load_32(block.qs + 32 * j);
            for (int nibble = 0; nibble < 2; ++nibble) {
                const int run = 2 * j + nibble;
                Bytes32 codes = shift_mask(packed, 4 * nibble, 0x0f);
                if constexpr (kFifthBit) codes = bitwise_or(codes, shift_left(shift_mask(qh, run, 0x01), 4));
                int scale, min;
                k4_scale_min(block.scales, run, scale, min);
                accumulate_32(codes, d * static_cast<float>(scale), -(dmin * static_cast<float>(min)), xb + 32 * run,
                              acc);
            }
        }
    }
    return acc.total();
}

template <class X>
float dot_q6_k(const BlockQ6_K* blocks, X x, int64_t n_blocks) {
    Accumulators acc;
    for (int64_t b = 0; b < n_blocks; ++b) {
        prefetch_ahead(blocks[b]);
        const BlockQ6_K& block = blocks[b];
        const float d = load_half(block.d);
        const X xb = x + kQK_K * b;
        for (int half = 0; half < 2; ++half) {
            const Bytes32 ql[2] = {load_32(block.ql + 64 * half), load_32(block.ql + 64 * half + 32)};
            const Bytes32 qh = load_32(block.qh + 32 * half);
            for (int s = 0; s < 4; ++s) {
                const int run = 8 * half + 2 * s;
                // code = 4 low bits | 2 high bits << 4 (0..63); value = code - 32.
                const Bytes32 low = shift_mask(ql[s & 1], s < 2 ? 0 : 4, 0x0f);
                const Bytes32 high = shift_left(shift_mask(qh, 2 * s, 0x03), 4);
                const float scale_low = d * static_cast<float>(block.scales[run]);
                const float scale_high = d * static_cast<float>(block.scales[run + 1]);
                accumulate_32<32>(bitwise_or(low, high), scale_low, 0.0f, scale_high, 0.0f, xb + 128 * half + 32 * s,
                                  acc);
            }
        }
    }
    return acc.total();
}

#if !KCAP_DOT_SDOT
// One step of a float row: the weights of 32 elements from i (Load: 4 at a time) times x into
// the eight accumulators.
template <typename Load>
inline void float_step(Load load, const uint8_t* src, int64_t i, const float* x, Accumulators& acc) {
    for (int k = 0; k < 8; ++k) acc.lane[k] = vfmaq_f32(acc.lane[k], load(src, i + 4 * k), vld1q_f32(x + 4 * k));
}

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
        alignas(16) float weights[32] = {};
        alignas(16) float x_tail[32] = {};
        for (int k = 0; i + k < n; ++k) {
            weights[k] = load_one(src, i + k);
            x_tail[k] = x[i + k];
        }
        const auto stacked = [](const uint8_t* p, int64_t j) { return vld1q_f32(reinterpret_cast<const float*>(p) + j); };
        float_step(stacked, reinterpret_cast<const uint8_t*>(weights), 0, x_tail, acc);
    }
    return acc.total();
}

// Byte loads: GGUF rows in a memory map need not be aligned to their element size.
inline float32x4_t load_f32(const uint8_t* p, int64_t i) { return vreinterpretq_f32_u8(vld1q_u8(p + 4 * i)); }
inline float32x4_t load_f16(const uint8_t* p, int64_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p + 2 * i)));  // exact, subnormals included
}
inline float32x4_t load_bf16(const uint8_t* p, int64_t i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u8(vld1_u8(p + 2 * i)), 16));
}

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
#endif  // !KCAP_DOT_SDOT

}  // namespace

bool compiled() { return true; }

#define KCAP_DOT_Q8_ONLY KCAP_DOT_SDOT
#include "core/formats_dot_dispatch.h"
#undef KCAP_DOT_Q8_ONLY

}  // namespace KCAP_DOT_NS
}  // namespace kcap
