// Internal to cpp/core: the byte layout of every GGUF block kcap decodes, and one decoder
// per format that turns one block into its floats.
//
// The layouts are ggml's (ggml-common.h). The decoders follow gguf-py's quants.py operation
// by operation (same products, same order, f32 throughout) so that a translation unit
// compiled without floating-point contraction reproduces gguf.quants.dequantize bit for bit.
// Every function here has internal linkage on purpose: formats_dequantize.cpp compiles them
// with contraction off (exact), formats_dot.cpp with contraction allowed (fast), and the two
// copies must never be merged by the linker.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace kcap {
namespace blocks {

// Blocks hold only bytes (alignment 1) because GGUF data can start at any offset of a
// memory map; multi-byte fields are read with memcpy, which compiles to a plain load.
constexpr int kQK = 32;    // elements per block of the legacy and MX formats
constexpr int kQK_K = 256; // elements per super-block of the k-quants

// The dot kernels' software prefetch: as a kernel decodes a block, it asks for the cache lines
// kPrefetchAhead bytes further on. A matvec walks its rows in address order, so those are the
// bytes it reads next (the next row's where the row ends sooner). Without it the block loops'
// arithmetic between loads kept too few misses in flight for the hardware prefetcher: on a
// 2-core Xeon VM (AVX-512) one thread streamed a DRAM-resident Q4_K matrix through the q8_1
// kernel at about 6 GB/s of the 13.5 a plain read reaches (bench/cpu_dot_rows.cpp), and the q8_1
// decode of Qwen3-30B-A3B's layout ran at 50 tok/s, 82 with the prefetch (docs/benchmarks.md).
// The int8 GEMM's packing (cpu/matmul_q8_pack.cpp) reads a tile's rows the same way, one after
// the other: gpt-oss-20b's MXFP4 experts' q8_1 prefill went from 156 to 233 tok/s with it.
// Past the end of a matrix the hint touches nothing it must not: a prefetch never faults.
constexpr int kPrefetchAhead = 2048;
// The lines kPrefetchAhead past [at, at + bytes): one hint per 64 bytes, so consecutive calls
// on consecutive blocks (hints at most 64 bytes apart) leave no line out.
static inline void prefetch_ahead(const void* at, int bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(at) + kPrefetchAhead;  // may lie past the object
    for (int line = 0; line < bytes; line += 64) __builtin_prefetch(reinterpret_cast<const void*>(p + line), 0, 3);
}
template <class Block>
static inline void prefetch_ahead(const Block& block) {
    prefetch_ahead(&block, int(sizeof(Block)));
}

struct BlockQ4_0 {
    uint8_t d[2];            // f16 scale
    uint8_t qs[kQK / 2];     // element i < 16 in the low nibble of qs[i], i >= 16 in the high one of qs[i-16]
};
struct BlockQ4_1 {
    uint8_t d[2];            // f16 scale
    uint8_t m[2];            // f16 minimum
    uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
    uint8_t d[2];
    uint8_t qh[4];           // bit i (little-endian u32) is the fifth bit of element i
    uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
    uint8_t d[2];
    uint8_t m[2];
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
    uint8_t d[2];
    int8_t qs[kQK];
};
struct BlockMXFP4 {
    uint8_t e;               // e8m0 shared exponent
    uint8_t qs[kQK / 2];     // e2m1 codes, nibbles split like Q4_0
};
struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];  // per 16 elements: low nibble scale, high nibble min
    uint8_t qs[kQK_K / 4];       // 2-bit codes
    uint8_t d[2];
    uint8_t dmin[2];
};
struct BlockQ3_K {
    uint8_t hmask[kQK_K / 8];    // third bit of each code (set means "no -4 offset")
    uint8_t qs[kQK_K / 4];       // low two bits of each code
    uint8_t scales[12];          // sixteen 6-bit scales
    uint8_t d[2];
};
struct BlockQ4_K {
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[12];          // eight 6-bit scales and eight 6-bit mins
    uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[12];
    uint8_t qh[kQK_K / 8];
    uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];       // low four bits
    uint8_t qh[kQK_K / 4];       // high two bits
    int8_t scales[kQK_K / 16];
    uint8_t d[2];
};

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");
static_assert(sizeof(BlockMXFP4) == 17, "MXFP4 block is 17 bytes");
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block is 84 bytes");
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block is 110 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");

static inline float bits_to_float(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// IEEE half -> float, exact for every non-NaN input (subnormals included); NaN stays NaN.
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
    // Zero or subnormal: mantissa * 2^-24 is exact in f32.
    const float magnitude = static_cast<float>(mantissa) * bits_to_float(0x33800000u);
    return sign ? -magnitude : magnitude;
#endif
}

static inline float load_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return half_to_float(h);
}

// Every decoder works in two steps. First the bit fields are unpacked into one byte per
// element with SWAR arithmetic on 64-bit words (8 elements per operation, plain portable
// C++). Then the bytes become floats in plain fixed-length loops that gcc/clang vectorize
// (byte -> int32 -> float, then scale). Element-by-element unpacking loops looked simpler,
// but gcc turned them into scalar code several times slower.

constexpr uint64_t kEveryByte = 0x0101010101010101ull;
constexpr uint64_t kLow4 = 0x0f * kEveryByte;
constexpr uint64_t kLow2 = 0x03 * kEveryByte;
constexpr uint64_t kLow1 = 0x01 * kEveryByte;

static inline uint64_t load_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
static inline void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }

// The SWAR masks are the same in every byte, so shifts and masks do not care about byte
// order, but spread_bits_8's multiply and the u32 fields do.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "kcap's block decoders assume a little-endian host (as GGUF data is)"
#endif

// Eight bits -> eight bytes of 0 or 1, bit k to byte k: copy the byte everywhere, keep bit k
// in byte k, then turn each nonzero byte into 1 (adding 0x7f sets bit 7 exactly when the byte
// is nonzero and never carries into the next byte).
static inline uint64_t spread_bits_8(uint8_t bits) {
    const uint64_t kept = (bits * kEveryByte) & 0x8040201008040201ull;
    return ((kept + 0x7f * kEveryByte) >> 7) & kLow1;
}

// out[i] = scale * (q[i] - bias) for i < kRun.
template <int kRun>
static inline void scale_codes(const uint8_t* __restrict codes, int bias, float scale, float* __restrict out) {
    for (int i = 0; i < kRun; ++i) out[i] = scale * static_cast<float>(static_cast<int>(codes[i]) - bias);
}

// out[i] = scale * q[i] + offset for i < kRun (offset is +m or -(dmin * min): adding -x
// rounds exactly like subtracting x).
template <int kRun>
static inline void scale_codes_offset(const uint8_t* __restrict codes, float scale, float offset,
                                      float* __restrict out) {
    for (int i = 0; i < kRun; ++i) out[i] = scale * static_cast<float>(codes[i]) + offset;
}

// The 16-element runs of Q2_K/Q3_K/Q6_K, taken in pairs: one 32-element loop per pair with
// the scale chosen per half. (A 16-element loop only half-fills 256-bit vectors, and a
// separate scaling pass made gcc shuffle the scales around, 3x slower.)
static inline void scale_pairs_of_16(const uint8_t* __restrict codes, int bias, const float* __restrict run_scale,
                                     float* __restrict out) {
    for (int pair = 0; pair < 8; ++pair) {
        const float low = run_scale[2 * pair], high = run_scale[2 * pair + 1];
        for (int l = 0; l < 32; ++l)
            out[32 * pair + l] =
                (l < 16 ? low : high) * static_cast<float>(static_cast<int>(codes[32 * pair + l]) - bias);
    }
}

// The same with an offset per run: out = scale * q + offset.
static inline void scale_offset_pairs_of_16(const uint8_t* __restrict codes, const float* __restrict run_scale,
                                            const float* __restrict run_offset, float* __restrict out) {
    for (int pair = 0; pair < 8; ++pair) {
        const float scale_low = run_scale[2 * pair], scale_high = run_scale[2 * pair + 1];
        const float offset_low = run_offset[2 * pair], offset_high = run_offset[2 * pair + 1];
        for (int l = 0; l < 32; ++l) {
            const bool low_half = l < 16;
            const float scale = low_half ? scale_low : scale_high;
            const float offset = low_half ? offset_low : offset_high;
            out[32 * pair + l] = scale * static_cast<float>(codes[32 * pair + l]) + offset;
        }
    }
}

// Legacy blocks store element i < 16 in the low nibble of qs[i], i >= 16 in the high one.
static inline void unpack_nibbles_32(const uint8_t* __restrict qs, uint8_t* __restrict codes) {
    for (int w = 0; w < 2; ++w) {
        const uint64_t packed = load_u64(qs + 8 * w);
        store_u64(codes + 8 * w, packed & kLow4);
        store_u64(codes + 16 + 8 * w, (packed >> 4) & kLow4);
    }
}

// Q5_0/Q5_1's fifth bits: bit i of the little-endian u32 qh belongs to element i.
static inline void add_fifth_bits_32(const uint8_t* __restrict qh, uint8_t* __restrict codes) {
    for (int w = 0; w < 4; ++w) store_u64(codes + 8 * w, load_u64(codes + 8 * w) | (spread_bits_8(qh[w]) << 4));
}

// Q4_0: d * (q - 8).
static inline void decode_q4_0(const BlockQ4_0& b, float* __restrict out) {
    uint8_t codes[kQK];
    unpack_nibbles_32(b.qs, codes);
    scale_codes<kQK>(codes, 8, load_half(b.d), out);
}

// Q4_1: d * q + m.
static inline void decode_q4_1(const BlockQ4_1& b, float* __restrict out) {
    uint8_t codes[kQK];
    unpack_nibbles_32(b.qs, codes);
    scale_codes_offset<kQK>(codes, load_half(b.d), load_half(b.m), out);
}

// Q5_0: d * (q - 16) with q's fifth bit taken from qh.
static inline void decode_q5_0(const BlockQ5_0& b, float* __restrict out) {
    uint8_t codes[kQK];
    unpack_nibbles_32(b.qs, codes);
    add_fifth_bits_32(b.qh, codes);
    scale_codes<kQK>(codes, 16, load_half(b.d), out);
}

// Q5_1: d * q + m.
static inline void decode_q5_1(const BlockQ5_1& b, float* __restrict out) {
    uint8_t codes[kQK];
    unpack_nibbles_32(b.qs, codes);
    add_fifth_bits_32(b.qh, codes);
    scale_codes_offset<kQK>(codes, load_half(b.d), load_half(b.m), out);
}

// Q8_0: q * d (the same product as d * q).
static inline void decode_q8_0(const BlockQ8_0& b, float* __restrict out) {
    const float d = load_half(b.d);
    for (int i = 0; i < kQK; ++i) out[i] = static_cast<float>(b.qs[i]) * d;
}

// e2m1 code -> twice its value (the factor 2 is folded into the e8m0 "half" scale).
static constexpr int8_t kMXFP4DoubledValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Half of 2^(e - 127): the e8m0 scale with the e2m1 doubling undone. e < 2 lands in the
// f32 subnormal range, so it is built from the mantissa bits.
static inline float mxfp4_half_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
    return bits_to_float(bits);
}

// MXFP4: scale * value, nibbles split like Q4_0. The table values are shifted by +12 into
// bytes so that the shared scale_codes loop applies.
static inline void decode_mxfp4(const BlockMXFP4& b, float* __restrict out) {
    uint8_t nibbles[kQK], codes[kQK];
    unpack_nibbles_32(b.qs, nibbles);
    for (int i = 0; i < kQK; ++i) codes[i] = static_cast<uint8_t>(kMXFP4DoubledValues[nibbles[i]] + 12);
    scale_codes<kQK>(codes, 12, mxfp4_half_scale(b.e), out);
}

// The 2-bit fields of Q2_K/Q3_K: element 128h + 32s + l sits in bits 2s..2s+1 of qs[32h + l].
static inline void unpack_crumbs_256(const uint8_t* __restrict qs, uint8_t* __restrict codes) {
    for (int half = 0; half < 2; ++half)
        for (int shift = 0; shift < 4; ++shift)
            for (int w = 0; w < 4; ++w)
                store_u64(codes + 128 * half + 32 * shift + 8 * w,
                          (load_u64(qs + 32 * half + 8 * w) >> (2 * shift)) & kLow2);
}

// Q2_K: sixteen runs of 16; element = (d * scale) * q - (dmin * min), both products in f32.
static inline void decode_q2_k(const BlockQ2_K& b, float* __restrict out) {
    const float d = load_half(b.d);
    const float dmin = load_half(b.dmin);
    float run_scale[16], run_offset[16];
    for (int run = 0; run < 16; ++run) {
        run_scale[run] = d * static_cast<float>(b.scales[run] & 0x0f);
        run_offset[run] = -(dmin * static_cast<float>(b.scales[run] >> 4));
    }
    uint8_t codes[kQK_K];
    unpack_crumbs_256(b.qs, codes);
    scale_offset_pairs_of_16(codes, run_scale, run_offset, out);
}

// Q3_K's sixteen signed 6-bit scales: low nibbles in bytes 0..7, high bit pairs in 8..11.
static inline int q3_k_scale(const uint8_t* scales, int i) {
    const int low = (scales[i % 8] >> (4 * (i / 8))) & 0x0f;
    const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
    return (low | (high << 4)) - 32;
}

// Q3_K's codes plus 4: the low two bits, plus 4 where element i's hmask bit is set (bit i / 32
// of hmask[i % 32]).
static inline void q3_k_codes(const BlockQ3_K& b, uint8_t* __restrict codes) {
    unpack_crumbs_256(b.qs, codes);
    for (int bit = 0; bit < 8; ++bit)
        for (int w = 0; w < 4; ++w) {
            uint8_t* dst = codes + 32 * bit + 8 * w;
            store_u64(dst, load_u64(dst) + (((load_u64(b.hmask + 8 * w) >> bit) & kLow1) << 2));
        }
}

// Q3_K: (d * scale) * q, q = the low two bits, minus 4 unless element i's hmask bit is set.
// Stored as q + 4 = low + 4 * bit, which fits a byte.
static inline void decode_q3_k(const BlockQ3_K& b, float* __restrict out) {
    const float d = load_half(b.d);
    float run_scale[16];
    for (int run = 0; run < 16; ++run) run_scale[run] = d * static_cast<float>(q3_k_scale(b.scales, run));
    uint8_t codes[kQK_K];
    q3_k_codes(b, codes);
    scale_pairs_of_16(codes, 4, run_scale, out);
}

// Q4_K/Q5_K's eight 6-bit scales and mins packed into 12 bytes (ggml's get_scale_min_k4).
static inline void k4_scale_min(const uint8_t* scales, int j, int& scale, int& min) {
    if (j < 4) {
        scale = scales[j] & 0x3f;
        min = scales[j + 4] & 0x3f;
    } else {
        scale = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

// All eight at once, as k4_scale_min gives them: bytes 0-7 of out the scales of runs 0-7, bytes
// 8-15 their mins. Four 32-bit words: scales 0-3 and mins 0-3 are the low six bits of bytes 0-7;
// scales 4-7 (mins 4-7) the low (high) nibbles of bytes 8-11 with the top two bits of bytes 0-3
// (4-7) above them.
static inline void k4_scales_mins(const uint8_t* scales, uint8_t* out) {
    uint32_t w[3];
    std::memcpy(w, scales, sizeof w);
    const uint32_t six = 0x3f3f3f3fu, nibble = 0x0f0f0f0fu, two = 0x03030303u;
    const uint32_t words[4] = {w[0] & six, (w[2] & nibble) | (((w[0] >> 6) & two) << 4), w[1] & six,
                               ((w[2] >> 4) & nibble) | (((w[1] >> 6) & two) << 4)};
    std::memcpy(out, words, sizeof words);
}

// Q4_K/Q5_K low bits: runs 2j and 2j+1 share qs[32j .. 32j+31], low nibbles then high.
static inline void unpack_k4_nibbles_256(const uint8_t* __restrict qs, uint8_t* __restrict codes) {
    for (int j = 0; j < 4; ++j)
        for (int w = 0; w < 4; ++w) {
            const uint64_t packed = load_u64(qs + 32 * j + 8 * w);
            store_u64(codes + 64 * j + 8 * w, packed & kLow4);
            store_u64(codes + 64 * j + 32 + 8 * w, (packed >> 4) & kLow4);
        }
}

// Eight runs of 32: element = (d * scale) * q - (dmin * min), both products in f32. The run
// scales are unpacked first so that the loop over runs has no branch (a branch there stops
// gcc from vectorizing the run loop inside it).
static inline void scale_k4_runs(const uint8_t* __restrict codes, const uint8_t* scales, float d, float dmin,
                                 float* __restrict out) {
    float run_scale[8], run_offset[8];
    for (int run = 0; run < 8; ++run) {
        int scale, min;
        k4_scale_min(scales, run, scale, min);
        run_scale[run] = d * static_cast<float>(scale);
        run_offset[run] = -(dmin * static_cast<float>(min));
    }
    for (int run = 0; run < 8; ++run)
        scale_codes_offset<32>(codes + 32 * run, run_scale[run], run_offset[run], out + 32 * run);
}

// Q4_K: eight runs of 32 four-bit codes.
static inline void decode_q4_k(const BlockQ4_K& b, float* __restrict out) {
    uint8_t codes[kQK_K];
    unpack_k4_nibbles_256(b.qs, codes);
    scale_k4_runs(codes, b.scales, load_half(b.d), load_half(b.dmin), out);
}

// Q5_K's codes: Q4_K's nibbles plus a fifth bit per element; run r's bits are bit r of qh[0..31].
static inline void q5_k_codes(const BlockQ5_K& b, uint8_t* __restrict codes) {
    unpack_k4_nibbles_256(b.qs, codes);
    for (int run = 0; run < 8; ++run)
        for (int w = 0; w < 4; ++w) {
            uint8_t* dst = codes + 32 * run + 8 * w;
            store_u64(dst, load_u64(dst) | (((load_u64(b.qh + 8 * w) >> run) & kLow1) << 4));
        }
}

// Q5_K: Q4_K plus a fifth bit per element.
static inline void decode_q5_k(const BlockQ5_K& b, float* __restrict out) {
    uint8_t codes[kQK_K];
    q5_k_codes(b, codes);
    scale_k4_runs(codes, b.scales, load_half(b.d), load_half(b.dmin), out);
}

// Q6_K's codes (0..63): 4 low bits from ql and 2 high bits from qh. In each 128-element half
// h, element 32s + l takes the low (s < 2) or high nibble of ql[64h + 32(s & 1) + l] and bits
// 2s..2s+1 of qh[32h + l].
static inline void q6_k_codes(const BlockQ6_K& b, uint8_t* __restrict codes) {
    for (int half = 0; half < 2; ++half)
        for (int s = 0; s < 4; ++s)
            for (int w = 0; w < 4; ++w) {
                const uint64_t ql = load_u64(b.ql + 64 * half + 32 * (s & 1) + 8 * w);
                const uint64_t low = (ql >> (s < 2 ? 0 : 4)) & kLow4;
                const uint64_t high = (load_u64(b.qh + 32 * half + 8 * w) >> (2 * s)) & kLow2;
                store_u64(codes + 128 * half + 32 * s + 8 * w, low | (high << 4));
            }
}

// Q6_K: sixteen runs of 16; element = (d * scale) * (q - 32).
static inline void decode_q6_k(const BlockQ6_K& b, float* __restrict out) {
    const float d = load_half(b.d);
    float run_scale[16];
    for (int run = 0; run < 16; ++run) run_scale[run] = d * static_cast<float>(b.scales[run]);
    uint8_t codes[kQK_K];
    q6_k_codes(b, codes);
    scale_pairs_of_16(codes, 32, run_scale, out);
}

// ------------------------------------------------------------------------------------------
// Blocks as integer codes, for the CPU's int8 GEMM (cpu/matmul_q8_gemm.h): element i of a block
// of kElems is scale[i / 16] * (codes[i] - kBias) + offset[i / 16], with codes[i] a byte. The
// codes are the bit fields the decoders above read (the signed codes of Q8_0 plus 128), and
// scale and offset the same f32 products, so in real arithmetic the form is the decoded value.
template <int kElems>
struct BlockCodes {
    uint8_t codes[kElems];
    float scale[kElems / 16];
    float offset[kElems / 16];
};

template <int kElems>
static inline void fill_runs(BlockCodes<kElems>& c, float scale, float offset) {
    for (int g = 0; g < kElems / 16; ++g) c.scale[g] = scale, c.offset[g] = offset;
}

// Per format: the block type, elements per block, the codes' bias, the largest code byte (from
// the codes' bits: MXFP4's doubled E2M1 values plus 12 reach 24), whether offsets are used.
// (The CPU's GEMM packs Q4_K and Q6_K rows with vector code of its own, cpu/matmul_q8_avx*.cpp,
// to the same values.)
template <class Block>
struct CodesOf;

template <>
struct CodesOf<BlockQ4_0> {
    static constexpr int kElems = kQK, kBias = 8, kMax = 15;
    static constexpr bool kOffset = false;
    static void get(const BlockQ4_0& b, BlockCodes<kElems>& c) {
        unpack_nibbles_32(b.qs, c.codes);
        fill_runs(c, load_half(b.d), 0.0f);
    }
};
template <>
struct CodesOf<BlockQ4_1> {
    static constexpr int kElems = kQK, kBias = 0, kMax = 15;
    static constexpr bool kOffset = true;
    static void get(const BlockQ4_1& b, BlockCodes<kElems>& c) {
        unpack_nibbles_32(b.qs, c.codes);
        fill_runs(c, load_half(b.d), load_half(b.m));
    }
};
template <>
struct CodesOf<BlockQ5_0> {
    static constexpr int kElems = kQK, kBias = 16, kMax = 31;
    static constexpr bool kOffset = false;
    static void get(const BlockQ5_0& b, BlockCodes<kElems>& c) {
        unpack_nibbles_32(b.qs, c.codes);
        add_fifth_bits_32(b.qh, c.codes);
        fill_runs(c, load_half(b.d), 0.0f);
    }
};
template <>
struct CodesOf<BlockQ5_1> {
    static constexpr int kElems = kQK, kBias = 0, kMax = 31;
    static constexpr bool kOffset = true;
    static void get(const BlockQ5_1& b, BlockCodes<kElems>& c) {
        unpack_nibbles_32(b.qs, c.codes);
        add_fifth_bits_32(b.qh, c.codes);
        fill_runs(c, load_half(b.d), load_half(b.m));
    }
};
template <>
struct CodesOf<BlockQ8_0> {
    static constexpr int kElems = kQK, kBias = 128, kMax = 255;
    static constexpr bool kOffset = false;
    static void get(const BlockQ8_0& b, BlockCodes<kElems>& c) {
        for (int i = 0; i < kQK; ++i) c.codes[i] = static_cast<uint8_t>(static_cast<uint8_t>(b.qs[i]) ^ 0x80u);
        fill_runs(c, load_half(b.d), 0.0f);
    }
};
template <>
struct CodesOf<BlockMXFP4> {
    static constexpr int kElems = kQK, kBias = 12, kMax = 24;
    static constexpr bool kOffset = false;
    static void get(const BlockMXFP4& b, BlockCodes<kElems>& c) {
        uint8_t nibbles[kQK];
        unpack_nibbles_32(b.qs, nibbles);
        for (int i = 0; i < kQK; ++i) c.codes[i] = static_cast<uint8_t>(kMXFP4DoubledValues[nibbles[i]] + 12);
        fill_runs(c, mxfp4_half_scale(b.e), 0.0f);
    }
};
template <>
struct CodesOf<BlockQ2_K> {
    static constexpr int kElems = kQK_K, kBias = 0, kMax = 3;
    static constexpr bool kOffset = true;
    static void get(const BlockQ2_K& b, BlockCodes<kElems>& c) {
        const float d = load_half(b.d), dmin = load_half(b.dmin);
        for (int run = 0; run < 16; ++run) {
            c.scale[run] = d * static_cast<float>(b.scales[run] & 0x0f);
            c.offset[run] = -(dmin * static_cast<float>(b.scales[run] >> 4));
        }
        unpack_crumbs_256(b.qs, c.codes);
    }
};
template <>
struct CodesOf<BlockQ3_K> {
    static constexpr int kElems = kQK_K, kBias = 4, kMax = 7;
    static constexpr bool kOffset = false;
    static void get(const BlockQ3_K& b, BlockCodes<kElems>& c) {
        const float d = load_half(b.d);
        for (int run = 0; run < 16; ++run) {
            c.scale[run] = d * static_cast<float>(q3_k_scale(b.scales, run));
            c.offset[run] = 0.0f;
        }
        q3_k_codes(b, c.codes);
    }
};
template <class Block>
static inline void k4_runs_of_16(const Block& b, BlockCodes<kQK_K>& c) {
    const float d = load_half(b.d), dmin = load_half(b.dmin);
    uint8_t scales_mins[16];
    k4_scales_mins(b.scales, scales_mins);
    for (int run = 0; run < 8; ++run) {
        c.scale[2 * run] = c.scale[2 * run + 1] = d * static_cast<float>(scales_mins[run]);
        c.offset[2 * run] = c.offset[2 * run + 1] = -(dmin * static_cast<float>(scales_mins[8 + run]));
    }
}
template <>
struct CodesOf<BlockQ4_K> {
    static constexpr int kElems = kQK_K, kBias = 0, kMax = 15;
    static constexpr bool kOffset = true;
    static void get(const BlockQ4_K& b, BlockCodes<kElems>& c) {
        k4_runs_of_16(b, c);
        unpack_k4_nibbles_256(b.qs, c.codes);
    }
};
template <>
struct CodesOf<BlockQ5_K> {
    static constexpr int kElems = kQK_K, kBias = 0, kMax = 31;
    static constexpr bool kOffset = true;
    static void get(const BlockQ5_K& b, BlockCodes<kElems>& c) {
        k4_runs_of_16(b, c);
        q5_k_codes(b, c.codes);
    }
};
template <>
struct CodesOf<BlockQ6_K> {
    static constexpr int kElems = kQK_K, kBias = 32, kMax = 63;
    static constexpr bool kOffset = false;
    static void get(const BlockQ6_K& b, BlockCodes<kElems>& c) {
        const float d = load_half(b.d);
        for (int run = 0; run < 16; ++run) {
            c.scale[run] = d * static_cast<float>(b.scales[run]);
            c.offset[run] = 0.0f;
        }
        q6_k_codes(b, c.codes);
    }
};

}  // namespace blocks
}  // namespace kcap
