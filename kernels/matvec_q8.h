// Matvec with q8_1 activations (the cuda.matmul_q8.<format> rows; opt-in, EngineOptions::
// activations = "q8_1"): y[n] = W[n, :] . q8_1(x), what llama.cpp's mmvq computes.
//
// q8_1(x): every 32-element run of x becomes d * q, d = amax / 127 (f32), q = round(x / d) as
// int8 (x * (1 / d), ties to even; q = 0 where d is 0 or subnormal): round_q8_1 of kcap/formats.h, the CPU
// rows' rounding. kcap_q8_quantize_quad is it for a run spread over 8 lanes, used by the groups of
// the matvec that quantize x themselves (kcap_q8_stage_runs) and by kcap_q8_quantize_rows, which
// quantizes a matmul's input once into the backend's q8_1 scratch (the host test holds both to
// round_q8_1 bit for bit). The matvec takes either: x quantized in every group costs no launch,
// but its instructions are repeated by every group (for the 8B model's 4096-row matrices, as
// many as the products'); quantized once, the groups only copy runs of it. The launcher picks.
//
// Weights are read as codes (KcapCodes<F>::codes8, kernels/quant_codes.h): w = scale * (byte -
// bias) + offset per 16- or 32-element sub-block. Per run and sub-block, sum(byte * q) comes from
// dp4a (kcap_dot4_i8) and sum(q) from the staged run, both exact in int32, so
//   W . q8_1(x) = sum over runs of d * (scale * (sum(byte * q) - bias * sum(q)) + offset * sum(q))
// up to the f32 roundings of those few products and of the sum over runs: the row is checked
// against the CPU row on q8_1(x) with the exact rows' 1e-5 (test_cuda_rows); how far q8_1(x) is
// from x is the option's numerics, stated in the whole-model tests.
//
// Layout as kcap_matvec_staged (kernels/matvec.h): the group stages a chunk of runs as int8
// records, and its teams (KcapMatvecTeams) walk their ROWS rows' blocks one lane per unit (a run,
// or for Q4_K and Q6_K the same 16 positions of the runs that share bytes: KcapQ8Units). A
// record is KCAP_Q8_RUN_WORDS words: the 32 codes in 8 words (in element order, or for MXFP4 in
// the order of its nibbles: kcap_q8_nibble_word), then sum(q) of elements 0..15 and
// 16..31, then 2 words of padding (48 bytes: the 16-byte reads of 8 lanes, one per record, fall in
// 8 different bank groups); each run's d sits in a float array after the records. Grid y = m:
// one row of groups per token (few-token batches run this same body).
#pragma once

#include "kernels/matvec.h"
#include "kernels/quant_codes.h"

#define KCAP_Q8_RUN_WORDS 12
// Below this d (FLT_MIN, the smallest normal float) 1 / d would overflow: such a run (amax under
// 1.5e-36) takes q = 0, as in round_q8_1.
#define KCAP_Q8_MIN_SCALE 1.17549435e-38f

// q8_1 of one float4 of a run whose 8 float4 are held by 8 aligned consecutive lanes of a simd
// group (every lane of the simd group calls it): the run's d, v's four codes packed as bytes, and
// the sum of q over v's 16-element half (its 4 aligned lanes).
struct KcapQ8Quad {
    kcap_u32 codes;
    int half_sum;
    float d;
};
KCAP_FN KcapQ8Quad kcap_q8_quantize_quad(const float4 v) {
    float amax = kcap_fmax(kcap_fmax(v.x < 0.0f ? -v.x : v.x, v.y < 0.0f ? -v.y : v.y),
                           kcap_fmax(v.z < 0.0f ? -v.z : v.z, v.w < 0.0f ? -v.w : v.w));
    amax = kcap_fmax(amax, kcap_simd_shuffle_xor(amax, 1));
    amax = kcap_fmax(amax, kcap_simd_shuffle_xor(amax, 2));
    amax = kcap_fmax(amax, kcap_simd_shuffle_xor(amax, 4));
    KcapQ8Quad out;
    out.d = amax / 127.0f;
    const float id = out.d >= KCAP_Q8_MIN_SCALE ? 1.0f / out.d : 0.0f;
    const int q0 = kcap_round_to_int(v.x * id), q1 = kcap_round_to_int(v.y * id);
    const int q2 = kcap_round_to_int(v.z * id), q3 = kcap_round_to_int(v.w * id);
    int sum = q0 + q1 + q2 + q3;
    sum += kcap_simd_shuffle_xor(sum, 1);
    out.half_sum = sum + kcap_simd_shuffle_xor(sum, 2);
    out.codes = (kcap_u32(q0) & 0xffu) | ((kcap_u32(q1) & 0xffu) << 8) | ((kcap_u32(q2) & 0xffu) << 16) |
                (kcap_u32(q3) << 24);
    return out;
}

// Stores quad i (values 4i .. 4i + 3) of a row in kcap_q8_quantize_rows' form: its code word, and
// from the first quad of a half / run the half sum / d.
KCAP_FN void kcap_q8_store_quad(const KcapQ8Quad q, int i, KCAP_GLOBAL kcap_u32* codes, KCAP_GLOBAL float* d,
                                KCAP_GLOBAL kcap_i32* half_sums) {
    codes[i] = q.codes;
    if (i % 4 == 0) half_sums[i / 4] = q.half_sum;
    if (i % 8 == 0) d[i / 8] = q.d;
}

// q8_1 of m rows of k values (k a multiple of 32) into separate arrays, the input of the dp4a
// matvec below and of the int8 tensor-core tiles (cuda/matmul_q8.cu), which then load codes:
// codes [m][k] signed bytes (as words), d [m][k / 32], half_sums [m][k / 16] (sum of q over each
// 16 values). Grid: x = ceil(m * k / 4 / threads), a float4 per thread (threads a multiple of 32).
KCAP_FN void kcap_q8_quantize_rows(const KcapThread t, const KCAP_GLOBAL float* x, int m, int k,
                                   KCAP_GLOBAL kcap_u32* codes, KCAP_GLOBAL float* d, KCAP_GLOBAL kcap_i32* half_sums) {
    const int n4 = m * (k / 4);
    const int i = int(t.group_x * t.threads + t.index);
    const bool in = i < n4;  // whole runs: the 8 lanes of a run are all in or all out
    float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in) v = kcap_load_f32x4(x + 4 * kcap_u64(i));
    const KcapQ8Quad q = kcap_q8_quantize_quad(v);  // every lane takes part
    if (in) kcap_q8_store_quad(q, i, codes, d, half_sums);
}

// The code words of a record in the order of MXFP4's nibbles (KcapQ8Units<KcapMXFP4>): byte j
// of a block's code word w holds elements 4w + j (low nibble) and 4w + j + 16 (high), so record
// word 2w holds the codes of elements 4w, 4w + 16, 4w + 1, 4w + 17 and word 2w + 1 those of 4w +
// 2, 4w + 18, 4w + 3, 4w + 19. From the run's code words in element order c[0..7] (word w: 4w ..
// 4w + 3): word 2w is bytes 0, 1 of c[w] and c[w + 4] interleaved, word 2w + 1 bytes 2, 3.
KCAP_FN kcap_u32 kcap_q8_nibble_word(kcap_u32 low_quad, kcap_u32 high_quad, int odd) {
    return kcap_byte_perm(low_quad, high_quad, odd ? 0x7362u : 0x5140u);
}

// All threads of the group: q8_1 of runs [0, n_runs) of x into records (and d) in shared memory,
// a float4 per thread (so lanes 8r .. 8r + 7 of a simd group hold one run), every lane of a simd
// group in every round. NIBBLES: the code words in MXFP4's nibble order (kcap_q8_nibble_word):
// lane 8r + w (w < 4) takes word 2w from its quad and lane 8r + w + 4's, that lane word 2w + 1.
template <bool NIBBLES = false>
KCAP_FN void kcap_q8_stage_runs(const KcapThread t, const KCAP_GLOBAL float* x, int n_runs,
                                KCAP_SHARED kcap_i32* records, KCAP_SHARED float* scales) {
    const int n4 = n_runs * 8;
    for (int base = 0; base < n4; base += int(t.threads)) {
        const int i = base + int(t.index);
        const bool in = i < n4;
        float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) v = kcap_load_f32x4(x + 4 * kcap_u64(i));
        const KcapQ8Quad q = kcap_q8_quantize_quad(v);
        kcap_u32 word = q.codes;
        if (NIBBLES) {
            const kcap_u32 other = kcap_u32(kcap_simd_shuffle_xor(int(q.codes), 4));  // every lane
            const bool high = (i % 8) >= 4;
            word = high ? kcap_q8_nibble_word(other, q.codes, 1) : kcap_q8_nibble_word(q.codes, other, 0);
        }
        if (in) {
            KCAP_SHARED kcap_i32* record = records + (i / 8) * KCAP_Q8_RUN_WORDS;
            record[NIBBLES ? 2 * (i % 4) + (i % 8) / 4 : i % 8] = kcap_i32(word);
            if (i % 4 == 0) record[8 + (i % 8) / 4] = q.half_sum;
            if (i % 8 == 0) scales[i / 8] = q.d;
        }
    }
}

// All threads of the group: runs [0, n_runs) of one token's q8_1 rows (kcap_q8_quantize_rows:
// codes, d and half_sums from that token's run 0) into the matvec's records and scales, two
// threads per run (16 code bytes and a half sum each; the first also the run's d), every lane of
// a simd group in every round. NIBBLES: in MXFP4's nibble order, the two lanes of a run (adjacent
// lanes) swapping their code words, the first writing words 0, 2, 4, 6, the second 1, 3, 5, 7.
template <bool NIBBLES = false>
KCAP_FN void kcap_q8_copy_runs(const KcapThread t, const KCAP_GLOBAL kcap_u32* codes, const KCAP_GLOBAL float* d,
                               const KCAP_GLOBAL kcap_i32* half_sums, int n_runs, KCAP_SHARED kcap_i32* records,
                               KCAP_SHARED float* scales) {
    for (int base = 0; base < 2 * n_runs; base += int(t.threads)) {
        const int i = base + int(t.index);
        const bool in = i < 2 * n_runs;
        const int run = i / 2, half = i % 2;
        uint4 c = {0u, 0u, 0u, 0u};
        if (in) c = kcap_load_u32x4(reinterpret_cast<const KCAP_GLOBAL kcap_u8*>(codes + 8 * run + 4 * half));
        kcap_u32 w[4] = {c.x, c.y, c.z, c.w};
        if (NIBBLES) {
            kcap_u32 other[4];
            KCAP_UNROLL for (int j = 0; j < 4; ++j)
                other[j] = kcap_u32(kcap_simd_shuffle_xor(int(w[j]), 1));  // every lane
            KCAP_UNROLL for (int j = 0; j < 4; ++j)
                w[j] = half ? kcap_q8_nibble_word(other[j], w[j], 1) : kcap_q8_nibble_word(w[j], other[j], 0);
        }
        if (!in) continue;
        KCAP_SHARED kcap_i32* record = records + run * KCAP_Q8_RUN_WORDS;
        KCAP_UNROLL for (int j = 0; j < 4; ++j) record[NIBBLES ? 2 * j + half : 4 * half + j] = kcap_i32(w[j]);
        record[8 + half] = half_sums[2 * run + half];
        if (half == 0) scales[run] = d[run];
    }
}

// All threads of a group (a multiple of 8): q8_1 of one row of k values (k a multiple of 32) into
// that row's codes, d and half_sums (kcap_q8_quantize_rows' form), a float4 per thread a round.
// The epilogue of a stage whose output is a q8_1 matmul's input (cuda.add_norm).
KCAP_FN void kcap_q8_quantize_row(const KcapThread t, const KCAP_GLOBAL float* x, int k, KCAP_GLOBAL kcap_u32* codes,
                                  KCAP_GLOBAL float* d, KCAP_GLOBAL kcap_i32* half_sums) {
    const int n4 = k / 4;
    for (int base = 0; base < n4; base += int(t.threads)) {
        const int i = base + int(t.index);
        const bool in = i < n4;  // whole runs: the 8 lanes of a run are all in or all out
        float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) v = kcap_load_f32x4(x + 4 * kcap_u64(i));
        const KcapQ8Quad q = kcap_q8_quantize_quad(v);  // every lane takes part
        if (in) kcap_q8_store_quad(q, i, codes, d, half_sums);
    }
}

// q8_1 of one value per lane where a simd group holds one 32-value run (lane i: value i of the
// run, element e of the row, e % 32 == i), every lane calling: the run's code words (lanes 4k),
// half sums (lanes 16k) and d (lane 0), in kcap_q8_quantize_rows' form and bit for bit its
// rounding (max and integer sums are exact in any order). The epilogue of the decode combine.
KCAP_FN void kcap_q8_quantize_lane(const KcapThread t, float v, kcap_u64 e, KCAP_GLOBAL kcap_u32* codes,
                                   KCAP_GLOBAL float* d, KCAP_GLOBAL kcap_i32* half_sums) {
    const float amax = kcap_simd_max(v < 0.0f ? -v : v);
    const float scale = amax / 127.0f;
    const float id = scale >= KCAP_Q8_MIN_SCALE ? 1.0f / scale : 0.0f;
    const int q = kcap_round_to_int(v * id);
    int sum = q;
    KCAP_UNROLL for (int mask = 1; mask < 16; mask <<= 1) sum += kcap_simd_shuffle_xor(sum, mask);
    const int byte = q & 0xff;
    const int b1 = kcap_simd_shuffle_xor(byte, 1), b2 = kcap_simd_shuffle_xor(byte, 2), b3 = kcap_simd_shuffle_xor(byte, 3);
    if (t.lane % 4 == 0) codes[e / 4] = kcap_u32(byte) | (kcap_u32(b1) << 8) | (kcap_u32(b2) << 16) | (kcap_u32(b3) << 24);
    if (t.lane % 16 == 0) half_sums[e / 16] = sum;
    if (t.lane == 0) d[e / 32] = scale;
}

// One run of weights (run `run` of the block at `block`) against a staged record with scale d.
template <class F>
KCAP_FN float kcap_q8_run_dot(const KCAP_GLOBAL kcap_u8* block, int run, const KCAP_SHARED kcap_i32* record, float d) {
    using C = KcapCodes<F>;
    kcap_u32 u[8];
    float scale[2], offset[2];
    C::codes8(block, run, u, scale, offset);
    int dot0 = 0, dot1 = 0;
    KCAP_UNROLL for (int w = 0; w < 4; ++w) dot0 = kcap_dot4_i8(int(u[w]), record[w], dot0);
    KCAP_UNROLL for (int w = 4; w < 8; ++w) dot1 = kcap_dot4_i8(int(u[w]), record[w], dot1);
    const int sum0 = record[8], sum1 = record[9];
    if (C::bias != 0) dot0 -= C::bias * sum0, dot1 -= C::bias * sum1;
    float s;
    if (C::sub == 32) {
        s = scale[0] * float(dot0 + dot1);
        if (C::has_offset) s += offset[0] * float(sum0 + sum1);
    } else {
        s = scale[0] * float(dot0) + scale[1] * float(dot1);
        if (C::has_offset) s += offset[0] * float(sum0) + offset[1] * float(sum1);
    }
    return d * s;
}

// How a lane walks a block of weights: a unit at a time. By default a unit is one 32-element run
// (kcap_q8_run_dot). Where runs share bytes (Q4_K: two runs share each qs byte, low and high
// nibble; Q6_K: two runs each ql byte, four each qh byte), a run-at-a-time walk loads those bytes
// two or four times; there a unit is the same 16 positions of every run that shares them, so each
// byte is loaded once, by one lane. records and scales: the block's first run's staged record and d.
template <class F>
struct KcapQ8Units {
    static constexpr int per_block = F::block_elems / 32;
    static constexpr bool nibbles = false;  // records in element order
    static KCAP_FN float dot(const KCAP_GLOBAL kcap_u8* block, int unit, const KCAP_SHARED kcap_i32* records,
                             const KCAP_SHARED float* scales) {
        return kcap_q8_run_dot<F>(block, unit, records + unit * KCAP_Q8_RUN_WORDS, scales[unit]);
    }
};

// Q4_K unit (pair j, half i): qs bytes [32j + 16i, +16) hold elements 16i .. 16i + 15 of run 2j
// (low nibbles) and of run 2j + 1 (high nibbles). Codes 0..15, scale d * sc, offset -dmin * m.
template <>
struct KcapQ8Units<KcapQ4_K> {
    static constexpr int per_block = 8;
    static constexpr bool nibbles = false;
    static KCAP_FN float dot(const KCAP_GLOBAL kcap_u8* b, int unit, const KCAP_SHARED kcap_i32* records,
                             const KCAP_SHARED float* scales) {
        const int j = unit >> 1, i = unit & 1;
        const uint4 q = kcap_load_u32x4(b + 16 + 32 * j + 16 * i);
        const kcap_u32 dd = kcap_load_u32(b);
        const kcap_u32 words[4] = {q.x, q.y, q.z, q.w};
        float sum = 0.0f;
        KCAP_UNROLL for (int r = 0; r < 2; ++r) {
            const int run = 2 * j + r;
            const KCAP_SHARED kcap_i32* record = records + run * KCAP_Q8_RUN_WORDS;
            int dot = 0;
            KCAP_UNROLL for (int w = 0; w < 4; ++w)
                dot = kcap_dot4_i8(int((words[w] >> (4 * r)) & 0x0f0f0f0fu), record[4 * i + w], dot);
            int sc, m;
            kcap_k4_scale_min(b + 4, run, &sc, &m);
            const float scale = kcap_half_to_float(kcap_u16(dd & 0xffffu)) * float(sc);
            const float offset = -(kcap_half_to_float(kcap_u16(dd >> 16)) * float(m));
            sum += scales[run] * (scale * float(dot) + offset * float(record[8 + i]));
        }
        return sum;
    }
};

// Q6_K unit (half h, half i): elements 16i .. 16i + 15 of runs 4h + s, s = 0..3: ql bytes
// [64h + 16i, +16) (low nibbles: s = 0, high: s = 2), [64h + 32 + 16i, +16) (s = 1, 3), qh
// bytes [128 + 32h + 16i, +16) (bits 2s, 2s + 1), scale byte 8h + 2s + i. Codes 0..63, bias 32.
template <>
struct KcapQ8Units<KcapQ6_K> {
    static constexpr int per_block = 4;
    static constexpr bool nibbles = false;
    static KCAP_FN float dot(const KCAP_GLOBAL kcap_u8* b, int unit, const KCAP_SHARED kcap_i32* records,
                             const KCAP_SHARED float* scales) {
        const int h = unit >> 1, i = unit & 1;
        kcap_u32 ql[2][4], qh[4], sc[2];
        kcap_load_u32s_a2<4>(b + 64 * h + 16 * i, ql[0]);
        kcap_load_u32s_a2<4>(b + 64 * h + 32 + 16 * i, ql[1]);
        kcap_load_u32s_a2<4>(b + 128 + 32 * h + 16 * i, qh);
        kcap_load_u32s_a2<2>(b + 192 + 8 * h, sc);  // scale bytes 8h .. 8h + 7 (reads at most to 210)
        const float d = kcap_half_to_float(kcap_u16(kcap_load_u16(b + 208)));
        float sum = 0.0f;
        KCAP_UNROLL for (int s = 0; s < 4; ++s) {
            const KCAP_SHARED kcap_i32* record = records + (4 * h + s) * KCAP_Q8_RUN_WORDS;
            int dot = 0;
            KCAP_UNROLL for (int w = 0; w < 4; ++w) {
                const kcap_u32 code = ((ql[s & 1][w] >> (4 * (s >> 1))) & 0x0f0f0f0fu) |
                                      (((qh[w] >> (2 * s)) & 0x03030303u) << 4);
                dot = kcap_dot4_i8(int(code), record[4 * i + w], dot);
            }
            dot -= 32 * record[8 + i];
            const int byte = 2 * s + i;  // of the scales: word byte / 4, byte byte % 4, signed
            const int scale = kcap_i32(sc[byte >> 2] << (8 * (3 - (byte & 3)))) >> 24;
            sum += scales[4 * h + s] * (float(scale) * float(dot));
        }
        return d * sum;
    }
};

// MXFP4 unit (one block, one run): its records in nibble order (kcap_q8_nibble_word), so each
// code word's low and high 16 bits select four doubled E2M1 values straight from the table
// (kcap_byte_perm_sx): with the nibble's sign bit as the selector's bit 3, a negative code picks
// the sign of a positive entry (0), and with the sign bits flipped a positive one does. The
// positive codes' magnitudes and the negative codes' magnitudes are two dp4a sums, subtracted:
// 7 ALU instructions a word where building the signed codes in element order took about 16.
template <>
struct KcapQ8Units<KcapMXFP4> {
    static constexpr int per_block = 1;
    static constexpr bool nibbles = true;
    static KCAP_FN float dot(const KCAP_GLOBAL kcap_u8* b, int, const KCAP_SHARED kcap_i32* record,
                             const KCAP_SHARED float* scales) {
        kcap_u32 qs[4];  // the 16 code bytes as words (kcap_load_u8_u32s_a1: any alignment)
        const kcap_u32 e = kcap_load_u8_u32s_a1<4>(b, qs);
        constexpr kcap_u32 kLow = 0x03020100u, kHigh = 0x0C080604u;  // doubled E2M1: 0 1 2 3 4 6 8 12
        int positive = 0, negative = 0;
        KCAP_UNROLL for (int w = 0; w < 4; ++w) {
            const kcap_u32 q = qs[w], flipped = q ^ 0x88888888u;
            positive = kcap_dot4_i8(int(kcap_byte_perm_sx(kLow, kHigh, q)), record[2 * w], positive);
            positive = kcap_dot4_i8(int(kcap_byte_perm_sx(kLow, kHigh, q >> 16)), record[2 * w + 1], positive);
            negative = kcap_dot4_i8(int(kcap_byte_perm_sx(kLow, kHigh, flipped)), record[2 * w], negative);
            negative =
                kcap_dot4_i8(int(kcap_byte_perm_sx(kLow, kHigh, flipped >> 16)), record[2 * w + 1], negative);
        }
        return scales[0] * (kcap_mxfp4_scale(e) * float(positive - negative));
    }
};

// Grid: x = ceil(n / (kcap_matvec_group_teams(teams, simds) * ROWS)), y = tokens. MODE and operands as
// kcap_matvec_staged (bias2, alpha, limit: up's bias and the clamped SwiGLU's constants of a
// gate_up); x is either f32 (x_codes null: every group quantizes it) or the tokens'
// q8_1 rows (x_codes, x_d, x_half_sums from kcap_q8_quantize_rows; x unused); y is token group_y's row. shared: chunk_runs * (KCAP_Q8_RUN_WORDS + 1)
// + simds * ROWS * (MODE == KCAP_MATVEC_GATE_UP ? 2 : 1) words (cuda_rows::matvec_q8_shared_words).
template <class F, int ROWS, int MODE, bool TEAMS>
KCAP_FN void kcap_matvec_q8(const KcapThread t, const KcapMatmulParams p, const KcapMatvecTeams teams, int chunk_runs,
                            const KCAP_GLOBAL kcap_u8* w0, const KCAP_GLOBAL kcap_u8* w1,
                            const KCAP_GLOBAL float* x, const KCAP_GLOBAL kcap_u32* x_codes, const KCAP_GLOBAL float* x_d,
                            const KCAP_GLOBAL kcap_i32* x_half_sums, const KCAP_GLOBAL float* bias, int activation,
                            KCAP_GLOBAL float* y, KCAP_SHARED kcap_i32* shared,
                            const KCAP_GLOBAL float* bias2 = nullptr, float alpha = 0.0f, float limit = 0.0f) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kUnits = KcapQ8Units<F>::per_block;
    constexpr int kMats = MODE == KCAP_MATVEC_GATE_UP ? 2 : 1;
    KCAP_SHARED kcap_i32* records = shared;
    KCAP_SHARED float* scales = reinterpret_cast<KCAP_SHARED float*>(shared + chunk_runs * KCAP_Q8_RUN_WORDS);
    KCAP_SHARED float* partials = scales + chunk_runs;
    const bool quantized = x_codes != nullptr;
    if (quantized) {
        x_codes += kcap_u64(t.group_y) * kcap_u64(p.k / 4);
        x_d += kcap_u64(t.group_y) * kcap_u64(p.k / 32);
        x_half_sums += kcap_u64(t.group_y) * kcap_u64(p.k / 16);
    } else {
        x += kcap_u64(t.group_y) * kcap_u64(p.k);
    }
    y += kcap_u64(t.group_y) * kcap_u64(p.n);
    const KcapMatvecTeam me = kcap_matvec_team<ROWS, TEAMS>(t, teams);
    const int lanes = kcap_matvec_team_lanes<TEAMS>(teams), split = kcap_matvec_team_split<TEAMS>(teams);
    const int row0 = me.row0;
    const int runs = p.k / 32;
    float acc[kMats][ROWS];
    KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) acc[mat][j] = 0.0f;
    for (int chunk0 = 0; chunk0 < runs; chunk0 += chunk_runs) {
        const int chunk_end = chunk0 + chunk_runs < runs ? chunk0 + chunk_runs : runs;
        if (chunk0 > 0) kcap_barrier();  // everyone is done with the previous chunk
        if (quantized)
            kcap_q8_copy_runs<KcapQ8Units<F>::nibbles>(t, x_codes + 8 * chunk0, x_d + chunk0, x_half_sums + 2 * chunk0,
                                                       chunk_end - chunk0, records, scales);
        else
            kcap_q8_stage_runs<KcapQ8Units<F>::nibbles>(t, x + kcap_u64(chunk0) * 32, chunk_end - chunk0, records,
                                                        scales);
        kcap_barrier();
        if (row0 < p.n) {
            // Units of the chunk's blocks (chunk0 and chunk_end are multiples of kRunsPerBlock).
            const int unit_end = chunk_end / kRunsPerBlock * kUnits;
            for (int unit = chunk0 / kRunsPerBlock * kUnits + me.part * lanes + me.lane; unit < unit_end;
                 unit += lanes * split) {
                const int block = unit / kUnits, block_run = block * kRunsPerBlock - chunk0;
                const KCAP_SHARED kcap_i32* block_records = records + block_run * KCAP_Q8_RUN_WORDS;
                const unsigned block_offset = unsigned(block) * unsigned(F::block_bytes);
                KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) {
                    const KCAP_GLOBAL kcap_u8* w = mat == 0 ? w0 : w1;
                    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
                        if (row0 + j < p.n)
                            acc[mat][j] += KcapQ8Units<F>::dot(w + kcap_u64(row0 + j) * p.row_bytes + block_offset,
                                                               unit % kUnits, block_records, scales + block_run);
                    }
                }
            }
        }
    }
    kcap_matvec_finish<ROWS, MODE, TEAMS>(t, p, teams, acc, partials, bias, activation, y, bias2, alpha, limit);
}
