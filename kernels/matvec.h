// Decode matvec (one token) with the activations staged in threadgroup memory:
//   y[n] = W[n, :] . x (+ bias[n]),  W: [n][k] raw GGUF blocks, f32 x and accumulation.
//
// Why staged: when each lane reads the 32 activations of its own 32-element run straight
// from global memory, one load instruction of a simd group touches 32 different 128-byte
// lines; on the H200 that, not DRAM, bounded the 8B model's matvecs (~0.65 TB/s; staged:
// about 1.1-1.3 TB/s). Here the group first copies a chunk of x into threadgroup memory with
// coalesced loads, each run padded to 36 floats so that the 16-byte reads of 8 lanes (one
// memory wavefront) land in 8 different bank groups, then every simd group reads its runs
// from there and reuses them for ROWS weight rows.
//
// Layout: the group's simds / split teams each own ROWS consecutive rows; lane l of part s
// of a team takes runs 32 s + l, 32 s + l + 32 split, ... of each chunk. The parts of a team
// meet in threadgroup memory at the end. Exact up to summation order, like kcap_matvec.
#pragma once

#include "kernels/activation.h"
#include "kernels/matmul.h"

#define KCAP_MATVEC_RUN_STRIDE 36  // floats per staged run: 32 + 4 of padding

// Floats of threadgroup memory for chunks of chunk_runs runs and simds * sums partials.
KCAP_FN int kcap_matvec_staged_floats(int chunk_runs, int simds, int sums) {
    return chunk_runs * KCAP_MATVEC_RUN_STRIDE + simds * sums;
}

// What a staged matvec writes per output row: y = W x (+ bias), or the gated FFN
// activation act(W_gate x) * (W_up x) of two matrices with the same format and shape.
#define KCAP_MATVEC_PLAIN 0
#define KCAP_MATVEC_GATE_UP 1

// The end of a staged matvec, whatever the activation encoding: each lane holds its runs' partial
// sums acc[mat][j]; the simd group sums them, the parts of a team meet in `partials` (uniform
// over the group: every thread reaches the barrier or none does) and lane 0 of part 0 writes the
// team's rows: y = acc (+ bias), or kcap_gated(act, gate (+ bias), up (+ bias2)) with the clamped
// SwiGLU's alpha and limit (null biases: none).
template <int ROWS, int MODE>
KCAP_FN void kcap_matvec_finish(const KcapThread t, const KcapMatmulParams p, int split, int row0,
                                KCAP_PRIVATE float (&acc)[MODE == KCAP_MATVEC_GATE_UP ? 2 : 1][ROWS],
                                KCAP_SHARED float* partials, const KCAP_GLOBAL float* bias, int activation,
                                KCAP_GLOBAL float* y, const KCAP_GLOBAL float* bias2 = nullptr, float alpha = 0.0f,
                                float limit = 0.0f) {
    constexpr int kMats = MODE == KCAP_MATVEC_GATE_UP ? 2 : 1;
    const int team = int(t.simd) / split, part = int(t.simd) % split;
    KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) acc[mat][j] = kcap_simd_sum(acc[mat][j]);
    if (split > 1) {
        if (t.lane == 0) {
            KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j)
                partials[(int(t.simd) * kMats + mat) * ROWS + j] = acc[mat][j];
        }
        kcap_barrier();
        if (part != 0) return;
        KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
            float total = 0.0f;
            for (int s = 0; s < split; ++s) total += partials[((team * split + s) * kMats + mat) * ROWS + j];
            acc[mat][j] = total;
        }
    }
    if (t.lane != 0) return;
    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
        if (row0 + j >= p.n) continue;
        if (MODE == KCAP_MATVEC_GATE_UP)
            y[row0 + j] = kcap_gated(activation, bias ? acc[0][j] + bias[row0 + j] : acc[0][j],
                                     bias2 ? acc[kMats - 1][j] + bias2[row0 + j] : acc[kMats - 1][j], alpha, limit);
        else
            y[row0 + j] = p.has_bias ? acc[0][j] + bias[row0 + j] : acc[0][j];
    }
}

// Grid: x = ceil(n / ((simds / split) * ROWS)), y = 1. chunk_runs: runs staged at a time.
// MODE KCAP_MATVEC_PLAIN: w0 and bias; KCAP_MATVEC_GATE_UP: w0 = gate, w1 = up (same row
// bytes), `activation` as in kcap_gated, with the gate's bias (bias) and up's (bias2) where not
// null. shared: kcap_matvec_staged_floats(chunk_runs, simds, ROWS * (MODE == KCAP_MATVEC_GATE_UP
// ? 2 : 1)) floats.
template <class F, int ROWS, int MODE>
KCAP_FN void kcap_matvec_staged(const KcapThread t, const KcapMatmulParams p, int split, int chunk_runs,
                                const KCAP_GLOBAL kcap_u8* w0, const KCAP_GLOBAL kcap_u8* w1,
                                const KCAP_GLOBAL float* x, const KCAP_GLOBAL float* bias, int activation,
                                KCAP_GLOBAL float* y, KCAP_SHARED float* shared, const KCAP_GLOBAL float* bias2 = nullptr,
                                float alpha = 0.0f, float limit = 0.0f) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kMats = MODE == KCAP_MATVEC_GATE_UP ? 2 : 1;
    KCAP_SHARED float* xs = shared;
    KCAP_SHARED float* partials = shared + chunk_runs * KCAP_MATVEC_RUN_STRIDE;
    const int team = int(t.simd) / split, part = int(t.simd) % split;
    const int teams = int(t.simds) / split;
    const int row0 = (int(t.group_x) * teams + team) * ROWS;
    const int runs = p.k / 32;
    float acc[kMats][ROWS];
    KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) acc[mat][j] = 0.0f;
    for (int chunk0 = 0; chunk0 < runs; chunk0 += chunk_runs) {
        const int chunk_end = chunk0 + chunk_runs < runs ? chunk0 + chunk_runs : runs;
        if (chunk0 > 0) kcap_barrier();  // everyone is done with the previous chunk
        for (int i = int(t.index); i < (chunk_end - chunk0) * 8; i += int(t.threads)) {
            const float4 v = kcap_load_f32x4(x + kcap_u64(chunk0) * 32 + 4 * kcap_u64(i));
            KCAP_SHARED float* to = xs + (i / 8) * KCAP_MATVEC_RUN_STRIDE + 4 * (i % 8);
            to[0] = v.x, to[1] = v.y, to[2] = v.z, to[3] = v.w;
        }
        kcap_barrier();
        if (row0 < p.n) {
            for (int run = chunk0 + part * KCAP_SIMD_WIDTH + int(t.lane); run < chunk_end;
                 run += KCAP_SIMD_WIDTH * split) {
                float xv[32];
                const KCAP_SHARED float* from = xs + (run - chunk0) * KCAP_MATVEC_RUN_STRIDE;
                KCAP_UNROLL for (int i = 0; i < 32; ++i) xv[i] = from[i];
                const unsigned block_offset = unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes);
                KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) {
                    const KCAP_GLOBAL kcap_u8* w = mat == 0 ? w0 : w1;
                    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
                        if (row0 + j < p.n) {
                            float wv[32];
                            F::decode32(w + kcap_u64(row0 + j) * p.row_bytes + block_offset, run % kRunsPerBlock, wv);
                            acc[mat][j] += kcap_dot32(wv, xv);
                        }
                    }
                }
            }
        }
    }
    // Float formats may end in a partial run (K % 32 elements, K a multiple of 4): part 0 of
    // each team takes them from global memory, one per lane (kcap_matmul_tail).
    if (part == 0 && row0 < p.n) {
        kcap_matmul_tail<F, ROWS>(t, p, row0, w0, x, acc[0]);
        if (kMats == 2) kcap_matmul_tail<F, ROWS>(t, p, row0, w1, x, acc[kMats - 1]);
    }
    kcap_matvec_finish<ROWS, MODE>(t, p, split, row0, acc, partials, bias, activation, y, bias2, alpha, limit);
}
