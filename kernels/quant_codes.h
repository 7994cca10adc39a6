// GGUF weight formats as scale x integer code + offset, for the bf16 tensor-core matmul rows
// (cuda/matmul_mma.cu). Portable dialect, so the host test (test_cuda_kernels_host) checks
// every decoder here against decode32 of kernels/quant.h.
//
// Every quantized format's weight is w_k = scale_s * q_k + offset_s over a sub-block s of 16 or
// 32 consecutive elements, with q_k a small integer (|q| <= 128) and therefore exact in bf16
// (8 significant bits). KcapCodes<F>::codes32 turns one 32-element run of a block (the same
// run numbering as F::decode32) into
//   q[0..31]           the codes, as floats holding exact small integers (BF16: the values
//                      themselves, exact in bf16 by definition; scale 1, offset 0)
//   scale[h], offset[h] of the sub-block holding elements 16h .. 16h+15 of the run (h = 0, 1;
//                      for 32-element sub-blocks both halves carry the same pair)
// and scale[h] * q[i] + offset[h] reproduces decode32's value: bit for bit for every format
// (the same products in the same order) except Q6_K, where decode32 computes a*q6 + (-32a)
// and the code form a*(q6 - 32); both are one rounding of the same real number when a GPU
// fuses the multiply-add, and differ by at most 1 ulp on a host that does not fuse.
//
// Formats:            code q                        scale            offset          sub
//   Q4_0              nibble - 8       (-8..7)      d                0               32
//   Q4_1              nibble           (0..15)      d                m               32
//   Q5_0              5 bits - 16      (-16..15)    d                0               32
//   Q5_1              5 bits           (0..31)      d                m               32
//   Q8_0              int8             (-128..127)  d                0               32
//   Q2_K              2 bits           (0..3)       d * sc           -(dmin * m)     16
//   Q3_K              3 bits - 4       (-4..3)      d * (sc - 32)    0               16
//   Q4_K              nibble           (0..15)      d * sc           -(dmin * m)     32
//   Q5_K              5 bits           (0..31)      d * sc           -(dmin * m)     32
//   Q6_K              6 bits - 32      (-32..31)    d * sc           0               16
//   MXFP4             2 x e2m1 value   (-12..12)    e8m0 scale / 2   0               32
//   BF16              the value        (bf16)       1                0               32
//
// codes8 (the q8_1 activation rows: dp4a decode, int8 tensor-core prefill; codes32 is derived
// from it, kcap_codes32_from_codes8, for every format but BF16) gives the same run as
// eight words of four bytes each, element 4w + j in byte j of u[w], with the same scale and
// offset pairs: the bytes are the codes plus `bias` (the unbiased bit fields, 0..63, read as
// signed bytes they are the same numbers), except Q8_0 and MXFP4, whose bytes are the signed
// codes themselves (bias 0). So q = byte - bias, and a dot product of codes with int8
// activations x is sum(byte * x) - bias * sum(x), exact in int32. BF16 has no codes8.
// F32 and F16 have no such form (their values need more than bf16's 8 significant bits):
// KcapCodes<F>::factorable is false and no bf16 tensor-core row exists for them.
#pragma once

#include "kernels/quant.h"

// Unfactorable formats (F32, F16): no codes32.
template <class F>
struct KcapCodes {
    static constexpr bool factorable = false;
    static constexpr bool has_codes8 = false;
};

// Four bytes of a word (masked to small integers), minus bias, into q[0..3].
#define KCAP_CODES4(q, word, bias)                             \
    do {                                                       \
        (q)[0] = kcap_byte_to_float_less((word), 0, (bias));   \
        (q)[1] = kcap_byte_to_float_less((word), 1, (bias));   \
        (q)[2] = kcap_byte_to_float_less((word), 2, (bias));   \
        (q)[3] = kcap_byte_to_float_less((word), 3, (bias));   \
    } while (0)

// The codes of codes8's eight words (C = the format's KcapCodes) less their bias, as floats
// (signed bytes, Q8_0 and MXFP4: byte ^ 0x80 reads them as byte + 128).
template <class C>
KCAP_FN void kcap_codes32_from_words(const KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* q) {
    if (C::signed_codes) {  // read as byte + 128
        KCAP_UNROLL for (int w = 0; w < 8; ++w) KCAP_CODES4(q + 4 * w, u[w] ^ 0x80808080u, float(128 + C::bias));
    } else {
        KCAP_UNROLL for (int w = 0; w < 8; ++w) KCAP_CODES4(q + 4 * w, u[w], float(C::bias));
    }
}

// codes32 of a format with codes8: its words' codes (kcap_codes32_from_words).
template <class C>
KCAP_FN void kcap_codes32_from_codes8(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q,
                                      KCAP_PRIVATE float* scale, KCAP_PRIVATE float* offset) {
    kcap_u32 u[8];
    C::codes8(b, run, u, scale, offset);
    kcap_codes32_from_words<C>(u, q);
}

template <>
struct KcapCodes<KcapBF16> {
    static constexpr bool factorable = true;
    static constexpr bool has_codes8 = false;  // bf16 values, not small integers
    static constexpr int sub = 32;
    static constexpr bool has_offset = false;
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        KcapBF16::decode32(b, run, q);
        scale[0] = scale[1] = 1.0f;
        offset[0] = offset[1] = 0.0f;
    }
};

template <>
struct KcapCodes<KcapQ4_0> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = false;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 8;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ4_0>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        kcap_u32 qs[4];
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(kcap_load_u16_u32s_a2<4>(b, qs)));
        offset[0] = offset[1] = 0.0f;
        codes8_of_words(qs, u);
    }
    // The codes of the block's words after its scale (the 16 bytes of nibbles).
    static KCAP_FN void codes8_of_words(const KCAP_PRIVATE kcap_u32* qs, KCAP_PRIVATE kcap_u32* u) {
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            u[w] = qs[w] & 0x0f0f0f0fu;
            u[4 + w] = (qs[w] >> 4) & 0x0f0f0f0fu;
        }
    }
};

template <>
struct KcapCodes<KcapQ4_1> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = true;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ4_1>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const kcap_u32 dm = kcap_load_u32(b);
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(dm & 0xffffu));
        offset[0] = offset[1] = kcap_half_to_float(kcap_u16(dm >> 16));
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 v = kcap_load_u32(b + 4 + 4 * w);
            u[w] = v & 0x0f0f0f0fu;
            u[4 + w] = (v >> 4) & 0x0f0f0f0fu;
        }
    }
};

// The fifth bits of Q5_0/Q5_1 word w (elements 4w..4w+3 and 16+4w..16+4w+3), spread into bit 4
// of each byte, as KcapQ5_0::decode32 does.
KCAP_FN kcap_u32 kcap_q5_spread(kcap_u32 qh, int shift) {
    const kcap_u32 h = qh >> shift;
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

template <>
struct KcapCodes<KcapQ5_0> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = false;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 16;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ5_0>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        kcap_u32 words[5];
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(kcap_load_u16_u32s_a2<5>(b, words)));
        offset[0] = offset[1] = 0.0f;
        codes8_of_words(words, u);
    }
    // The codes of the block's words after its scale (the high bits' word, then the 16 bytes of
    // nibbles).
    static KCAP_FN void codes8_of_words(const KCAP_PRIVATE kcap_u32* words, KCAP_PRIVATE kcap_u32* u) {
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 v = words[1 + w];
            u[w] = (v & 0x0f0f0f0fu) | kcap_q5_spread(words[0], 4 * w);
            u[4 + w] = ((v >> 4) & 0x0f0f0f0fu) | kcap_q5_spread(words[0], 16 + 4 * w);
        }
    }
};

template <>
struct KcapCodes<KcapQ5_1> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = true;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ5_1>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const kcap_u32 dm = kcap_load_u32(b);
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(dm & 0xffffu));
        offset[0] = offset[1] = kcap_half_to_float(kcap_u16(dm >> 16));
        const kcap_u32 qh = kcap_load_u32(b + 4);
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 v = kcap_load_u32(b + 8 + 4 * w);
            u[w] = (v & 0x0f0f0f0fu) | kcap_q5_spread(qh, 4 * w);
            u[4 + w] = ((v >> 4) & 0x0f0f0f0fu) | kcap_q5_spread(qh, 16 + 4 * w);
        }
    }
};

template <>
struct KcapCodes<KcapQ8_0> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = false;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = true;  // the bytes are signed codes
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ8_0>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(kcap_load_u16_u32s_a2<8>(b, u)));  // the signed bytes as they are
        offset[0] = offset[1] = 0.0f;
    }
    // The codes of the block's words after its scale: the signed bytes as they are.
    static KCAP_FN void codes8_of_words(const KCAP_PRIVATE kcap_u32* words, KCAP_PRIVATE kcap_u32* u) {
        KCAP_UNROLL for (int w = 0; w < 8; ++w) u[w] = words[w];
    }
};

template <>
struct KcapCodes<KcapQ2_K> {
    static constexpr bool factorable = true;
    static constexpr int sub = 16;
    static constexpr bool has_offset = true;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ2_K>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const kcap_u32 dd = kcap_load_u32(b + 80);
        const float d = kcap_half_to_float(kcap_u16(dd & 0xffffu));
        const float dmin = kcap_half_to_float(kcap_u16(dd >> 16));
        const int h = run >> 2, s = run & 3;
        KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
            const kcap_u32 sc = b[2 * run + half16];
            scale[half16] = d * float(sc & 0xfu);
            offset[half16] = -(dmin * float(sc >> 4));
            KCAP_UNROLL for (int w = 0; w < 4; ++w)
                u[4 * half16 + w] = (kcap_load_u32(b + 16 + 32 * h + 16 * half16 + 4 * w) >> (2 * s)) & 0x03030303u;
        }
    }
};

template <>
struct KcapCodes<KcapQ3_K> {
    static constexpr bool factorable = true;
    static constexpr int sub = 16;
    static constexpr bool has_offset = false;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 4;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ3_K>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16(b + 108)));
        const int h = run >> 2, s = run & 3;
        kcap_u32 hmask[8], qs[8];
        kcap_load_u32s_a2<8>(b, hmask);
        kcap_load_u32s_a2<8>(b + 32 + 32 * h, qs);
        KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
            scale[half16] = d * float(kcap_q3_k_scale(b + 96, 2 * run + half16));
            offset[half16] = 0.0f;
        }
        KCAP_UNROLL for (int w = 0; w < 8; ++w)
            u[w] = ((qs[w] >> (2 * s)) & 0x03030303u) | (((hmask[w] >> run) & 0x01010101u) << 2);
    }
};

template <>
struct KcapCodes<KcapQ4_K> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = true;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ4_K>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const kcap_u32 dd = kcap_load_u32(b);
        int sc, m;
        kcap_k4_scale_min(b + 4, run, &sc, &m);
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(dd & 0xffffu)) * float(sc);
        offset[0] = offset[1] = -(kcap_half_to_float(kcap_u16(dd >> 16)) * float(m));
        const int shift = 4 * (run & 1);
        const KCAP_GLOBAL kcap_u8* qs = b + 16 + 32 * (run >> 1);
        KCAP_UNROLL for (int v = 0; v < 2; ++v) {
            const uint4 w = kcap_load_u32x4(qs + 16 * v);
            u[4 * v] = (w.x >> shift) & 0x0f0f0f0fu;
            u[4 * v + 1] = (w.y >> shift) & 0x0f0f0f0fu;
            u[4 * v + 2] = (w.z >> shift) & 0x0f0f0f0fu;
            u[4 * v + 3] = (w.w >> shift) & 0x0f0f0f0fu;
        }
    }
};

template <>
struct KcapCodes<KcapQ5_K> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = true;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ5_K>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const kcap_u32 dd = kcap_load_u32(b);
        int sc, m;
        kcap_k4_scale_min(b + 4, run, &sc, &m);
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16(dd & 0xffffu)) * float(sc);
        offset[0] = offset[1] = -(kcap_half_to_float(kcap_u16(dd >> 16)) * float(m));
        const int shift = 4 * (run & 1);
        const KCAP_GLOBAL kcap_u8* qs = b + 48 + 32 * (run >> 1);
        KCAP_UNROLL for (int w = 0; w < 8; ++w)
            u[w] = ((kcap_load_u32(qs + 4 * w) >> shift) & 0x0f0f0f0fu) | (((kcap_load_u32(b + 16 + 4 * w) >> run) & 0x01010101u) << 4);
    }
};

template <>
struct KcapCodes<KcapQ6_K> {
    static constexpr bool factorable = true;
    static constexpr int sub = 16;
    static constexpr bool has_offset = false;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 32;
    static constexpr bool signed_codes = false;  // bytes 0..127: code + bias
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapQ6_K>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16(b + 208)));
        const int h = run >> 2, s = run & 3;
        const int low_shift = s < 2 ? 0 : 4;
        kcap_u32 ql[8], qh[8];
        kcap_load_u32s_a2<8>(b + 64 * h + 32 * (s & 1), ql);
        kcap_load_u32s_a2<8>(b + 128 + 32 * h, qh);
        KCAP_UNROLL for (int half16 = 0; half16 < 2; ++half16) {
            scale[half16] = d * float(int(reinterpret_cast<const KCAP_GLOBAL kcap_i8*>(b + 192)[2 * run + half16]));
            offset[half16] = 0.0f;
        }
        KCAP_UNROLL for (int w = 0; w < 8; ++w) u[w] = ((ql[w] >> low_shift) & 0x0f0f0f0fu) | (((qh[w] >> (2 * s)) & 0x03030303u) << 4);
    }
};

// An MXFP4 block's scale byte e (E8M0, 2^(e - 127)) as the int8 codes' scale: the doubled
// codes (kcap_mxfp4_doubled_bytes) take 2^(e - 128), a normal float from e = 2 (e - 1 in the
// exponent field) and a subnormal below (0x00200000 << e).
KCAP_FN float kcap_mxfp4_scale(kcap_u32 e) { return kcap_as_float(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23)); }

template <>
struct KcapCodes<KcapMXFP4> {
    static constexpr bool factorable = true;
    static constexpr int sub = 32;
    static constexpr bool has_offset = false;
    static constexpr bool has_codes8 = true;
    static constexpr int bias = 0;
    static constexpr bool signed_codes = true;  // the bytes are signed codes
    static KCAP_FN void codes32(const KCAP_GLOBAL kcap_u8* b, int run, KCAP_PRIVATE float* q, KCAP_PRIVATE float* scale,
                                KCAP_PRIVATE float* offset) {
        kcap_codes32_from_codes8<KcapCodes<KcapMXFP4>>(b, run, q, scale, offset);
    }
    static KCAP_FN void codes8(const KCAP_GLOBAL kcap_u8* b, int, KCAP_PRIVATE kcap_u32* u, KCAP_PRIVATE float* scale,
                               KCAP_PRIVATE float* offset) {
        kcap_u32 qs[4];  // the 16 code bytes as words (kcap_load_u8_u32s_a1: any alignment)
        const kcap_u32 e = kcap_load_u8_u32s_a1<4>(b, qs);
        scale[0] = scale[1] = kcap_mxfp4_scale(e);
        offset[0] = offset[1] = 0.0f;
        KCAP_UNROLL for (int w = 0; w < 4; ++w) kcap_mxfp4_doubled_bytes(qs[w], u[w], u[4 + w]);  // signed bytes
    }
};

#undef KCAP_CODES4
