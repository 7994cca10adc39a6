// GGUF weight formats on the GPU: one decoder per format that turns one 32-element run of a
// block (elements 32*run .. 32*run+31, run < block_elems/32) into floats.
//
// Every matmul and embedding body is written against this interface, so a format is one
// struct here plus one line in KCAP_WEIGHT_FORMATS. The values are the exact dequantized
// weights of formats.h (same products in the same order; a GPU compiler may fuse a multiply
// and an add, a difference of one rounding), so kernels built on them differ from the CPU
// reference only by summation order. Layouts: ggml-common.h (and cpp/core/formats_blocks.h).
//
// Alignment (weights sit in their own device allocation, so a row starts at row * row_bytes):
// blocks of 18, 22, 34, 110, 210 bytes start at even offsets (their words are read with
// kcap_load_u16_u32s_a2 / kcap_load_u32s_a2: aligned 32-bit loads, about one per word; each
// decoder states which bytes of its block those may touch), blocks of 20, 24, 84 bytes and float rows at multiples of 4, Q4_K/Q5_K
// blocks (144, 176 bytes) at multiples of 16; MXFP4 (17 bytes) at any offset, read with
// kcap_load_u8_u32s_a1 (aligned words on CUDA, whose weight allocations are padded for them;
// bytes elsewhere).
#pragma once

#include "kernels/dialect.h"
#include "kernels/formats_list.h"

// Four nibbles (or crumbs) of a word, already masked into bytes, scaled: out[j] = a * b_j + c.
#define KCAP_EMIT4(out, word, a, c)                                  \
    do {                                                             \
        (out)[0] = (a) * kcap_byte_to_float((word), 0) + (c);        \
        (out)[1] = (a) * kcap_byte_to_float((word), 1) + (c);        \
        (out)[2] = (a) * kcap_byte_to_float((word), 2) + (c);        \
        (out)[3] = (a) * kcap_byte_to_float((word), 3) + (c);        \
    } while (0)

struct KcapF32 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 128;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        const KCAP_GLOBAL float* f = reinterpret_cast<const KCAP_GLOBAL float*>(b);
        KCAP_UNROLL for (int i = 0; i < 8; ++i) {
            const float4 v = kcap_load_f32x4(f + 4 * i);
            out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
        }
    }
};

struct KcapF16 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 64;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        KCAP_UNROLL for (int i = 0; i < 16; ++i) {
            const kcap_u32 w = kcap_load_u32(b + 4 * i);
            out[2 * i] = kcap_half_to_float(kcap_u16(w & 0xffffu));
            out[2 * i + 1] = kcap_half_to_float(kcap_u16(w >> 16));
        }
    }
};

struct KcapBF16 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 64;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        KCAP_UNROLL for (int i = 0; i < 16; ++i) {
            const kcap_u32 w = kcap_load_u32(b + 4 * i);
            out[2 * i] = kcap_as_float(w << 16);
            out[2 * i + 1] = kcap_as_float(w & 0xffff0000u);
        }
    }
};

// Q4_0: d * (q - 8); element i < 16 in the low nibble of qs[i], i >= 16 in the high one.
struct KcapQ4_0 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 18;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        kcap_u32 qs[4];  // the whole block, d then qs: 5 loads
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16_u32s_a2<4>(b, qs)));
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 q = qs[w];
            const kcap_u32 lo = q & 0x0f0f0f0fu, hi = (q >> 4) & 0x0f0f0f0fu;
            KCAP_UNROLL for (int j = 0; j < 4; ++j) {
                out[4 * w + j] = d * kcap_byte_to_float_less(lo, j, 8.0f);
                out[16 + 4 * w + j] = d * kcap_byte_to_float_less(hi, j, 8.0f);
            }
        }
    }
};

// Q4_1: d * q + m.
struct KcapQ4_1 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 20;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        const kcap_u32 dm = kcap_load_u32(b);
        const float d = kcap_half_to_float(kcap_u16(dm & 0xffffu));
        const float m = kcap_half_to_float(kcap_u16(dm >> 16));
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 q = kcap_load_u32(b + 4 + 4 * w);
            KCAP_EMIT4(out + 4 * w, q & 0x0f0f0f0fu, d, m);
            KCAP_EMIT4(out + 16 + 4 * w, (q >> 4) & 0x0f0f0f0fu, d, m);
        }
    }
};

// Q5_0: d * (q - 16), q's fifth bit is bit i of the little-endian word qh.
struct KcapQ5_0 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 22;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        kcap_u32 words[5];  // the whole block, d then qh, qs[0..15]: 6 loads
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16_u32s_a2<5>(b, words)));
        const kcap_u32 qh = words[0];
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 q = words[1 + w];
            // Spread the 4 fifth bits of this word's elements into bit 4 of each byte.
            const kcap_u32 h_lo = qh >> (4 * w), h_hi = qh >> (16 + 4 * w);
            const kcap_u32 spread_lo = ((h_lo & 1u) << 4) | ((h_lo & 2u) << 11) | ((h_lo & 4u) << 18) | ((h_lo & 8u) << 25);
            const kcap_u32 spread_hi = ((h_hi & 1u) << 4) | ((h_hi & 2u) << 11) | ((h_hi & 4u) << 18) | ((h_hi & 8u) << 25);
            const kcap_u32 lo = (q & 0x0f0f0f0fu) | spread_lo, hi = ((q >> 4) & 0x0f0f0f0fu) | spread_hi;
            KCAP_UNROLL for (int j = 0; j < 4; ++j) {
                out[4 * w + j] = d * kcap_byte_to_float_less(lo, j, 16.0f);
                out[16 + 4 * w + j] = d * kcap_byte_to_float_less(hi, j, 16.0f);
            }
        }
    }
};

// Q5_1: d * q + m with the fifth bit as in Q5_0.
struct KcapQ5_1 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 24;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        const kcap_u32 dm = kcap_load_u32(b);
        const float d = kcap_half_to_float(kcap_u16(dm & 0xffffu));
        const float m = kcap_half_to_float(kcap_u16(dm >> 16));
        const kcap_u32 qh = kcap_load_u32(b + 4);
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 q = kcap_load_u32(b + 8 + 4 * w);
            const kcap_u32 h_lo = qh >> (4 * w), h_hi = qh >> (16 + 4 * w);
            const kcap_u32 spread_lo = ((h_lo & 1u) << 4) | ((h_lo & 2u) << 11) | ((h_lo & 4u) << 18) | ((h_lo & 8u) << 25);
            const kcap_u32 spread_hi = ((h_hi & 1u) << 4) | ((h_hi & 2u) << 11) | ((h_hi & 4u) << 18) | ((h_hi & 8u) << 25);
            KCAP_EMIT4(out + 4 * w, (q & 0x0f0f0f0fu) | spread_lo, d, m);
            KCAP_EMIT4(out + 16 + 4 * w, ((q >> 4) & 0x0f0f0f0fu) | spread_hi, d, m);
        }
    }
};

// Q8_0: q * d with signed bytes (flipping the sign bit makes them unsigned + 128).
struct KcapQ8_0 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 34;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        kcap_u32 qs[8];  // the whole block, d then qs: 9 loads
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16_u32s_a2<8>(b, qs)));
        KCAP_UNROLL for (int w = 0; w < 8; ++w) {
            const kcap_u32 q = qs[w] ^ 0x80808080u;
            KCAP_UNROLL for (int j = 0; j < 4; ++j) out[4 * w + j] = kcap_byte_to_float_less(q, j, 128.0f) * d;
        }
    }
};

// Q2_K: sixteen runs of 16 with 4-bit scale and min; element 128h + 32s + l is bits 2s..2s+1
// of qs[32h + l]; value = (d * scale) * q - (dmin * min).
struct KcapQ2_K {
    static constexpr int block_elems = 256;
    static constexpr int block_bytes = 84;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* out) {
        const kcap_u32 dd = kcap_load_u32(b + 80);
        const float d = kcap_half_to_float(kcap_u16(dd & 0xffffu));
        const float dmin = kcap_half_to_float(kcap_u16(dd >> 16));
        const int h = run >> 2, s = run & 3;
        KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
            const kcap_u32 sc = b[2 * run + half16];
            const float a = d * float(sc & 0xfu);
            const float c = -(dmin * float(sc >> 4));
            KCAP_UNROLL for (int w = 0; w < 4; ++w) {
                const kcap_u32 q = (kcap_load_u32(b + 16 + 32 * h + 16 * half16 + 4 * w) >> (2 * s)) & 0x03030303u;
                KCAP_EMIT4(out + 16 * half16 + 4 * w, q, a, c);
            }
        }
    }
};

// Q3_K's sixteen signed 6-bit scales: low nibbles in bytes 0..7, high bit pairs in 8..11.
KCAP_FN int kcap_q3_k_scale(const KCAP_GLOBAL kcap_u8* scales, int i) {
    const int low = (scales[i % 8] >> (4 * (i / 8))) & 0x0f;
    const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
    return (low | (high << 4)) - 32;
}

// Q3_K: (d * scale) * q, q = two low bits from qs minus 4 unless element's hmask bit is set.
// Layout: hmask [0, 32), qs [32, 96), scales [96, 108), d [108, 110).
struct KcapQ3_K {
    static constexpr int block_elems = 256;
    static constexpr int block_bytes = 110;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* out) {
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16(b + 108)));
        const int h = run >> 2, s = run & 3;
        // 32-byte runs of hmask and qs; the 2 bytes after each that kcap_load_u32s_a2 may read
        // are in the block (at most bytes 96, 97: scales).
        kcap_u32 hmask[8], qs[8];
        kcap_load_u32s_a2<8>(b, hmask);
        kcap_load_u32s_a2<8>(b + 32 + 32 * h, qs);
        KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
            const float a = d * float(kcap_q3_k_scale(b + 96, 2 * run + half16));
            KCAP_UNROLL for (int w = 0; w < 4; ++w) {
                const int l = 16 * half16 + 4 * w;
                const kcap_u32 low = (qs[l / 4] >> (2 * s)) & 0x03030303u;
                const kcap_u32 high = (hmask[l / 4] >> run) & 0x01010101u;
                KCAP_EMIT4(out + l, low | (high << 2), a, -4.0f * a);
            }
        }
    }
};

// Q4_K/Q5_K's eight 6-bit scales and mins packed into 12 bytes (ggml's get_scale_min_k4).
KCAP_FN void kcap_k4_scale_min(const KCAP_GLOBAL kcap_u8* scales, int j, KCAP_PRIVATE int* scale, KCAP_PRIVATE int* min) {
    if (j < 4) {
        *scale = scales[j] & 0x3f;
        *min = scales[j + 4] & 0x3f;
    } else {
        *scale = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

// Q4_K: eight runs of 32; runs 2j and 2j+1 share qs[32j .. 32j+31] (low nibbles, then high);
// value = (d * scale) * q - (dmin * min).
struct KcapQ4_K {
    static constexpr int block_elems = 256;
    static constexpr int block_bytes = 144;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* out) {
        const kcap_u32 dd = kcap_load_u32(b);
        int scale, min;
        kcap_k4_scale_min(b + 4, run, &scale, &min);
        const float a = kcap_half_to_float(kcap_u16(dd & 0xffffu)) * float(scale);
        const float c = -(kcap_half_to_float(kcap_u16(dd >> 16)) * float(min));
        const int shift = 4 * (run & 1);
        const KCAP_GLOBAL kcap_u8* qs = b + 16 + 32 * (run >> 1);
        KCAP_UNROLL for (int v = 0; v < 2; ++v) {
            const uint4 q = kcap_load_u32x4(qs + 16 * v);
            KCAP_EMIT4(out + 16 * v, (q.x >> shift) & 0x0f0f0f0fu, a, c);
            KCAP_EMIT4(out + 16 * v + 4, (q.y >> shift) & 0x0f0f0f0fu, a, c);
            KCAP_EMIT4(out + 16 * v + 8, (q.z >> shift) & 0x0f0f0f0fu, a, c);
            KCAP_EMIT4(out + 16 * v + 12, (q.w >> shift) & 0x0f0f0f0fu, a, c);
        }
    }
};

// Q5_K: Q4_K plus a fifth bit per element: run r's bits are bit r of qh[0..31].
struct KcapQ5_K {
    static constexpr int block_elems = 256;
    static constexpr int block_bytes = 176;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* out) {
        const kcap_u32 dd = kcap_load_u32(b);
        int scale, min;
        kcap_k4_scale_min(b + 4, run, &scale, &min);
        const float a = kcap_half_to_float(kcap_u16(dd & 0xffffu)) * float(scale);
        const float c = -(kcap_half_to_float(kcap_u16(dd >> 16)) * float(min));
        const int shift = 4 * (run & 1);
        const KCAP_GLOBAL kcap_u8* qs = b + 48 + 32 * (run >> 1);
        KCAP_UNROLL for (int w = 0; w < 8; ++w) {
            const kcap_u32 low = (kcap_load_u32(qs + 4 * w) >> shift) & 0x0f0f0f0fu;
            const kcap_u32 high = (kcap_load_u32(b + 16 + 4 * w) >> run) & 0x01010101u;
            KCAP_EMIT4(out + 4 * w, low | (high << 4), a, c);
        }
    }
};

// Q6_K: sixteen runs of 16; element = (d * scale) * (q - 32). In each 128-element half h,
// element 32s + l takes the low (s < 2) or high nibble of ql[64h + 32(s & 1) + l] and bits
// 2s..2s+1 of qh[32h + l]. Layout: ql [0, 128), qh [128, 192), scales [192, 208), d [208, 210).
struct KcapQ6_K {
    static constexpr int block_elems = 256;
    static constexpr int block_bytes = 210;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* out) {
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16(b + 208)));
        const int h = run >> 2, s = run & 3;
        const int low_shift = s < 2 ? 0 : 4;
        // 32-byte runs of ql and qh; the 2 bytes after each that kcap_load_u32s_a2 may read are
        // in the block (at most bytes 192, 193: scales).
        kcap_u32 ql[8], qh[8];
        kcap_load_u32s_a2<8>(b + 64 * h + 32 * (s & 1), ql);
        kcap_load_u32s_a2<8>(b + 128 + 32 * h, qh);
        KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
            const float a = d * float(int(reinterpret_cast<const KCAP_GLOBAL kcap_i8*>(b + 192)[2 * run + half16]));
            KCAP_UNROLL for (int w = 0; w < 4; ++w) {
                const int l = 16 * half16 + 4 * w;
                const kcap_u32 low = (ql[l / 4] >> low_shift) & 0x0f0f0f0fu;
                const kcap_u32 high = (qh[l / 4] >> (2 * s)) & 0x03030303u;
                KCAP_EMIT4(out + l, low | (high << 4), a, -32.0f * a);
            }
        }
    }
};

// MXFP4: e2m1 codes (nibbles split like Q4_0) times the e8m0 scale; the code values are kept
// doubled (integers) and the factor 2 folded into the scale, as formats_blocks.h does.
KCAP_FN float kcap_mxfp4_doubled(kcap_u32 code) {
    const kcap_u32 m = code & 7u;
    const float magnitude = m < 4u ? float(m) : float((2u + (m & 1u)) << ((m >> 1) - 1u));
    return (code & 8u) ? -magnitude : magnitude;
}

// The word of bytes b0 (lowest) .. b3, each taken mod 256 (constant arguments fold away).
KCAP_FN kcap_u32 kcap_bytes4(int b0, int b1, int b2, int b3) {
    return kcap_u32(b0 & 0xff) | (kcap_u32(b1 & 0xff) << 8) | (kcap_u32(b2 & 0xff) << 16) | (kcap_u32(b3 & 0xff) << 24);
}

// The doubled e2m1 values (kcap_mxfp4_doubled) plus BIAS of the 8 codes of a word of MXFP4 code
// bytes, as bytes in the order of the nibbles: v[0] = nibbles 0..3 (bytes 0 and 1, low nibble
// first), v[1] = nibbles 4..7. BIAS 0: the signed values; the bf16 tiles take 12 (0..24, bytes
// that fit a bf16 mantissa: cuda/matmul_gemm.cu). Table lookups by byte permutation (one PRMT
// per value on CUDA, where the arithmetic of kcap_mxfp4_doubled took about ten instructions a
// value and bounded gpt-oss's expert matvecs): the 3-bit magnitude picks a byte of BIAS + {0, 1,
// 2, 3, 4, 6, 8, 12} or of BIAS minus them, the sign bit picks between the two.
template <int BIAS = 0>
KCAP_FN void kcap_mxfp4_nibble_bytes(kcap_u32 q, KCAP_PRIVATE kcap_u32* v) {
    const kcap_u32 plus_lo = kcap_bytes4(BIAS, BIAS + 1, BIAS + 2, BIAS + 3);
    const kcap_u32 plus_hi = kcap_bytes4(BIAS + 4, BIAS + 6, BIAS + 8, BIAS + 12);
    const kcap_u32 minus_lo = kcap_bytes4(BIAS, BIAS - 1, BIAS - 2, BIAS - 3);
    const kcap_u32 minus_hi = kcap_bytes4(BIAS - 4, BIAS - 6, BIAS - 8, BIAS - 12);
    KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
        const kcap_u32 n = q >> (16 * half16);  // four nibbles in bits 0..15
        const kcap_u32 magnitude = n & 0x7777u;
        const kcap_u32 positive = kcap_byte_perm(plus_lo, plus_hi, magnitude);
        const kcap_u32 negative = kcap_byte_perm(minus_lo, minus_hi, magnitude);
        v[half16] = kcap_byte_perm(positive, negative, 0x3210u | ((n & 0x8888u) >> 1));
    }
}
// The same values in element order: lo = the low nibbles of bytes 0..3, hi = their high nibbles.
template <int BIAS = 0>
KCAP_FN void kcap_mxfp4_doubled_bytes(kcap_u32 q, KCAP_PRIVATE kcap_u32& lo, KCAP_PRIVATE kcap_u32& hi) {
    kcap_u32 v[2];
    kcap_mxfp4_nibble_bytes<BIAS>(q, v);
    lo = kcap_byte_perm(v[0], v[1], 0x6420u);
    hi = kcap_byte_perm(v[0], v[1], 0x7531u);
}

struct KcapMXFP4 {
    static constexpr int block_elems = 32;
    static constexpr int block_bytes = 17;
    static KCAP_FN void decode32(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE float* out) {
        kcap_u32 qs[4];  // the block's 16 code bytes as words (5 loads on CUDA: any alignment)
        const kcap_u32 e = kcap_load_u8_u32s_a1<4>(b, qs);
        const float scale = kcap_as_float(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
        // Each value v as the float 2^23 + 128 + v (its byte + 128 in the mantissa of 2^23: one
        // byte permute), minus 2^23 + 128 (exact), times scale. The values come in the order of
        // the nibbles; the stores place them (nibble n of word w is element 4w + n / 2, + 16 for
        // a high nibble), so no permute splits low and high nibbles.
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            kcap_u32 v[2];
            kcap_mxfp4_nibble_bytes(qs[w], v);
            KCAP_UNROLL for (int n = 0; n < 8; ++n) {
                const kcap_u32 biased = kcap_byte_perm(v[n / 4] ^ 0x80808080u, 0x4B000000u, kcap_u32(n % 4) | 0x7540u);
                out[4 * w + n / 2 + 16 * (n % 2)] = (kcap_as_float(biased) - 8388736.0f) * scale;
            }
        }
    }
};

// One element e of a row (any e < the row length), for the tails of float rows whose length
// is not a multiple of 32: a run of 32 past the row's end must never be read. Float formats
// load the element itself; block formats decode the run that holds it (their rows are whole
// blocks, so the run exists; their rows never have a tail, so this is no hot path).
template <class F>
struct KcapElem {
    static KCAP_FN float load(const KCAP_GLOBAL kcap_u8* row, int e) {
        float v[32];
        F::decode32(row + unsigned(e / F::block_elems) * unsigned(F::block_bytes), (e % F::block_elems) / 32, v);
        return v[e % 32];
    }
};
template <>
struct KcapElem<KcapF32> {
    static KCAP_FN float load(const KCAP_GLOBAL kcap_u8* row, int e) {
        return reinterpret_cast<const KCAP_GLOBAL float*>(row)[e];
    }
};
template <>
struct KcapElem<KcapF16> {
    static KCAP_FN float load(const KCAP_GLOBAL kcap_u8* row, int e) {
        return kcap_half_to_float(kcap_u16(kcap_load_u16(row + 2 * e)));
    }
};
template <>
struct KcapElem<KcapBF16> {
    static KCAP_FN float load(const KCAP_GLOBAL kcap_u8* row, int e) {
        return kcap_bf16_to_float(kcap_u16(kcap_load_u16(row + 2 * e)));
    }
};
