// Matvec with q8_1 activations (the cuda.matmul_q8.<format> rows; opt-in, EngineOptions::
// activations = "q8_1"): y[n] = W[n, :] . q8_1(x), what llama.cpp's mmvq computes.
//
// q8_1(x): every 32-element run of x becomes d * q, d = amax / 127 (f32), q = round(x / d) as
// int8 (x * (1 / d), ties to even; q = 0 where d is 0 or subnormal): round_q8_1 of kcap/formats.h, the CPU
// rows' rounding. kcap_q8_quantize_quad is it for a run spread over 8 lanes, used by the staged
// matvec and the batch form (the host test holds both to round_q8_1 bit for bit).
//
// Weights are read as codes (KcapCodes<F>::codes8, kernels/quant_codes.h): w = scale * (byte -
// bias) + offset per 16- or 32-element sub-block. Per run and sub-block, sum(byte * q) comes from
// dp4a (kcap_dot4_i8) and sum(q) from the staged run, both exact in int32, so
//   W . q8_1(x) = sum over runs of d * (scale * (sum(byte * q) - bias * sum(q)) + offset * sum(q))
// up to the f32 roundings of those few products and of the sum over runs: the row is checked
// against the CPU row on q8_1(x) with the exact rows' 1e-5 (test_cuda_rows); how far q8_1(x) is
// from x is the option's numerics, stated in the whole-model tests.
//
// Layout as kcap_matvec_staged (kernels/matvec.h): the group stages a chunk of runs, now as
// int8 records, and its teams of `split` parts walk their ROWS rows' runs one lane per run. A
// record is KCAP_Q8_RUN_WORDS words: the 32 codes in 8 words, then sum(q) of elements 0..15 and
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

// All threads of the group: q8_1 of runs [0, n_runs) of x into records (and d) in shared memory,
// a float4 per thread (so lanes 8r .. 8r + 7 of a simd group hold one run), every lane of a simd
// group in every round.
KCAP_FN void kcap_q8_stage_runs(const KcapThread t, const KCAP_GLOBAL float* x, int n_runs,
                                KCAP_SHARED kcap_i32* records, KCAP_SHARED float* scales) {
    const int n4 = n_runs * 8;
    for (int base = 0; base < n4; base += int(t.threads)) {
        const int i = base + int(t.index);
        const bool in = i < n4;
        float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) v = kcap_load_f32x4(x + 4 * kcap_u64(i));
        const KcapQ8Quad q = kcap_q8_quantize_quad(v);
        if (in) {
            KCAP_SHARED kcap_i32* record = records + (i / 8) * KCAP_Q8_RUN_WORDS;
            record[i % 8] = kcap_i32(q.codes);
            if (i % 4 == 0) record[8 + (i % 8) / 4] = q.half_sum;
            if (i % 8 == 0) scales[i / 8] = q.d;
        }
    }
}

// q8_1 of m rows of k values (k a multiple of 32) into separate arrays, for the int8 tensor-core
// tiles (cuda/matmul_q8.cu), which then load codes rather than quantize each tile again:
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
    if (!in) return;
    codes[i] = q.codes;
    if (i % 4 == 0) half_sums[i / 4] = q.half_sum;
    if (i % 8 == 0) d[i / 8] = q.d;
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

// Grid: x = ceil(n / ((simds / split) * ROWS)), y = tokens. MODE and operands as
// kcap_matvec_staged; x and y are token group_y's rows. shared: chunk_runs * (KCAP_Q8_RUN_WORDS + 1)
// + simds * ROWS * (MODE == KCAP_MATVEC_GATE_UP ? 2 : 1) words (cuda_rows::matvec_q8_shared_words).
template <class F, int ROWS, int MODE>
KCAP_FN void kcap_matvec_q8(const KcapThread t, const KcapMatmulParams p, int split, int chunk_runs,
                            const KCAP_GLOBAL kcap_u8* w0, const KCAP_GLOBAL kcap_u8* w1, const KCAP_GLOBAL float* x,
                            const KCAP_GLOBAL float* bias, int activation, KCAP_GLOBAL float* y,
                            KCAP_SHARED kcap_i32* shared) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kMats = MODE == KCAP_MATVEC_GATE_UP ? 2 : 1;
    KCAP_SHARED kcap_i32* records = shared;
    KCAP_SHARED float* scales = reinterpret_cast<KCAP_SHARED float*>(shared + chunk_runs * KCAP_Q8_RUN_WORDS);
    KCAP_SHARED float* partials = scales + chunk_runs;
    x += kcap_u64(t.group_y) * kcap_u64(p.k);
    y += kcap_u64(t.group_y) * kcap_u64(p.n);
    const int team = int(t.simd) / split, part = int(t.simd) % split;
    const int teams = int(t.simds) / split;
    const int row0 = (int(t.group_x) * teams + team) * ROWS;
    const int runs = p.k / 32;
    float acc[kMats][ROWS];
    KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) acc[mat][j] = 0.0f;
    for (int chunk0 = 0; chunk0 < runs; chunk0 += chunk_runs) {
        const int chunk_end = chunk0 + chunk_runs < runs ? chunk0 + chunk_runs : runs;
        if (chunk0 > 0) kcap_barrier();  // everyone is done with the previous chunk
        kcap_q8_stage_runs(t, x + kcap_u64(chunk0) * 32, chunk_end - chunk0, records, scales);
        kcap_barrier();
        if (row0 < p.n) {
            for (int run = chunk0 + part * KCAP_SIMD_WIDTH + int(t.lane); run < chunk_end;
                 run += KCAP_SIMD_WIDTH * split) {
                const KCAP_SHARED kcap_i32* record = records + (run - chunk0) * KCAP_Q8_RUN_WORDS;
                const float d = scales[run - chunk0];
                const unsigned block_offset = unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes);
                KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) {
                    const KCAP_GLOBAL kcap_u8* w = mat == 0 ? w0 : w1;
                    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
                        if (row0 + j < p.n)
                            acc[mat][j] += kcap_q8_run_dot<F>(w + kcap_u64(row0 + j) * p.row_bytes + block_offset,
                                                              run % kRunsPerBlock, record, d);
                    }
                }
            }
        }
    }
    kcap_matvec_finish<ROWS, MODE>(t, p, split, row0, acc, partials, bias, activation, y);
}
