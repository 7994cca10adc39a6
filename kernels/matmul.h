// Quantized matmul bodies with f32 activations and f32 accumulation:
//   y[m, n] = W[n, :] . x[m, :] (+ bias[n]),  W: [n][k] raw GGUF blocks, x: [m][k], y: [m][n].
//
// kcap_matmul_tokens (a few tokens, or the exact prefill fallback): each simd group owns ROWS
// consecutive weight rows; lane l takes the 32-element runs l, l+32, ... of the row, and each
// decoded run of weights is reused for TOKENS tokens; the lanes' partial sums meet in
// kcap_simd_sum. The decode matvec (one token) is kernels/matvec.h, on the helpers here.
// Both are exact up to summation order (no activation quantization); the tensor-core prefill
// rows (CUDA only) trade that for speed and declare their own tolerance.
// Float formats (F32/F16/BF16) take any K that is a multiple of 4 (rows and activations stay
// 16-byte aligned for the vector loads of whole runs): the k % 32 elements after the last
// whole run are a tail, one element per lane, read through KcapElem (kcap_matmul_tail*).
// Block formats have no tail (K is a multiple of their block).
#pragma once

#include "kernels/params.h"
#include "kernels/quant.h"

KCAP_FN void kcap_load_x32(const KCAP_GLOBAL float* x, KCAP_PRIVATE float* xs) {
    KCAP_UNROLL for (int i = 0; i < 8; ++i) {
        const float4 v = kcap_load_f32x4(x + 4 * i);
        xs[4 * i] = v.x, xs[4 * i + 1] = v.y, xs[4 * i + 2] = v.z, xs[4 * i + 3] = v.w;
    }
}

// The dot product of N values (a multiple of 4) in four interleaved sums.
template <int N>
KCAP_FN float kcap_dot(const KCAP_PRIVATE float* a, const KCAP_PRIVATE float* b) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    KCAP_UNROLL for (int i = 0; i < N; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    return (s0 + s1) + (s2 + s3);
}
KCAP_FN float kcap_dot16(const KCAP_PRIVATE float* a, const KCAP_PRIVATE float* b) { return kcap_dot<16>(a, b); }
KCAP_FN float kcap_dot32(const KCAP_PRIVATE float* a, const KCAP_PRIVATE float* b) { return kcap_dot<32>(a, b); }

// Adds the tail elements 32 * (k / 32) .. k - 1 of ROWS rows to this lane's sums, one token: lane
// l of a team of `lanes` takes elements 32 * runs + l, + lanes, ...
template <class F, int ROWS>
KCAP_FN void kcap_matmul_tail(int lane, int lanes, const KcapMatmulParams p, int row0, const KCAP_GLOBAL kcap_u8* w,
                              const KCAP_GLOBAL float* x, KCAP_PRIVATE float* acc) {
    for (int e = (p.k / 32) * 32 + lane; e < p.k; e += lanes) {
        const float xv = x[e];
        KCAP_UNROLL for (int j = 0; j < ROWS; ++j)
            if (row0 + j < p.n) acc[j] += KcapElem<F>::load(w + kcap_u64(row0 + j) * p.row_bytes, e) * xv;
    }
}

// Grid: x = ceil(n / (simds * ROWS)), y = ceil(m / TOKENS).
template <class F, int ROWS, int TOKENS>
KCAP_FN void kcap_matmul_tokens(const KcapThread t, const KcapMatmulParams p, const KCAP_GLOBAL kcap_u8* w,
                                const KCAP_GLOBAL float* x, const KCAP_GLOBAL float* bias, KCAP_GLOBAL float* y) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int row0 = int(t.group_x * t.simds + t.simd) * ROWS;
    if (row0 >= p.n) return;
    const int token0 = int(t.group_y) * TOKENS;
    const int runs = p.k / 32;
    float acc[ROWS][TOKENS];
    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) KCAP_UNROLL for (int m = 0; m < TOKENS; ++m) acc[j][m] = 0.0f;
    for (int run = int(t.lane); run < runs; run += KCAP_SIMD_WIDTH) {
        const unsigned block_offset = unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes);
        KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
            if (row0 + j >= p.n) continue;
            float wv[32];
            F::decode32(w + kcap_u64(row0 + j) * p.row_bytes + block_offset, run % kRunsPerBlock, wv);
            KCAP_UNROLL for (int m = 0; m < TOKENS; ++m) {
                if (token0 + m < p.m) {
                    float xs[32];
                    kcap_load_x32(x + kcap_u64(token0 + m) * p.k + 32 * run, xs);
                    acc[j][m] += kcap_dot32(wv, xs);
                }
            }
        }
    }
    const int tail = (p.k / 32) * 32 + int(t.lane);  // the tail: one element per lane
    if (tail < p.k) {
        KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
            if (row0 + j >= p.n) continue;
            const float wv = KcapElem<F>::load(w + kcap_u64(row0 + j) * p.row_bytes, tail);
            KCAP_UNROLL for (int m = 0; m < TOKENS; ++m)
                if (token0 + m < p.m) acc[j][m] += wv * x[kcap_u64(token0 + m) * p.k + tail];
        }
    }
    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
        KCAP_UNROLL for (int m = 0; m < TOKENS; ++m) {
            const float total = kcap_simd_sum(acc[j][m]);
            if (t.lane == 0 && row0 + j < p.n && token0 + m < p.m)
                y[kcap_u64(token0 + m) * p.n + row0 + j] = p.has_bias ? total + bias[row0 + j] : total;
        }
    }
}
