// Rotary position embedding of Q and K in place. Normal style rotates adjacent pairs
// (x[2i], x[2i+1]); NeoX rotates halves (x[i], x[i + rope_dim/2]); dims past rope_dim stay.
// Angles are not computed here: cos/sin come from a table the host filled in double precision
// exactly as the CPU reference does ([n_ctx][rope_dim/2] of (cos, sin)), so every backend
// rotates by bit-identical factors. Positions are read from device memory (step[0] is the
// position of token 0) so one captured decode graph serves every position.
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

// One thread per (token, head, pair). Grid: x = ceil(total / threads), total = n_tokens *
// (n_head + n_head_kv) * rope_dim / 2.
KCAP_FN void kcap_rope(const KcapThread t, const KcapRopeParams p, const KCAP_GLOBAL kcap_i32* step,
                       const KCAP_GLOBAL float2* cos_sin, KCAP_GLOBAL float* q, KCAP_GLOBAL float* k) {
    const int pairs = p.rope_dim / 2;
    const int heads = p.n_head + p.n_head_kv;
    const kcap_u64 index = kcap_u64(t.group_x) * t.threads + t.index;
    if (index >= kcap_u64(p.n_tokens) * heads * pairs) return;
    const int i = int(index % pairs);
    const int h = int((index / pairs) % heads);
    const int m = int(index / (kcap_u64(pairs) * heads));
    KCAP_GLOBAL float* x = h < p.n_head ? q + (kcap_u64(m) * p.n_head + h) * p.head_dim
                                        : k + (kcap_u64(m) * p.n_head_kv + (h - p.n_head)) * p.head_dim;
    const float2 cs = cos_sin[kcap_u64(step[0] + m) * pairs + i];
    const int a = p.neox ? i : 2 * i;
    const int b = p.neox ? i + pairs : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs.x - x1 * cs.y;
    x[b] = x0 * cs.y + x1 * cs.x;
}

// qk_norm_rope: each head row of Q and K is RMS-normed with its weight (q_weight or k_weight,
// as kcap_norm computes it), then rotated as kcap_rope does. One simd group per head row.
// Grid: x = ceil(n_tokens * (n_head + n_head_kv) / simds); shared: simds * head_dim floats.
KCAP_FN void kcap_qk_norm_rope(const KcapThread t, const KcapRopeParams p, float eps, const KCAP_GLOBAL kcap_i32* step,
                               const KCAP_GLOBAL float2* cos_sin, const KCAP_GLOBAL float* q_weight,
                               const KCAP_GLOBAL float* k_weight, KCAP_GLOBAL float* q, KCAP_GLOBAL float* k,
                               KCAP_SHARED float* shared) {
    const int heads = p.n_head + p.n_head_kv;
    const kcap_u64 row = kcap_u64(t.group_x) * t.simds + t.simd;
    if (row >= kcap_u64(p.n_tokens) * heads) return;  // the whole simd group: no group barrier below
    const int m = int(row / heads);
    const int h = int(row % heads);
    KCAP_GLOBAL float* x = h < p.n_head ? q + (kcap_u64(m) * p.n_head + h) * p.head_dim
                                        : k + (kcap_u64(m) * p.n_head_kv + (h - p.n_head)) * p.head_dim;
    const KCAP_GLOBAL float* w = h < p.n_head ? q_weight : k_weight;
    float sq = 0.0f;
    for (int d = int(t.lane); d < p.head_dim; d += KCAP_SIMD_WIDTH) sq += x[d] * x[d];
    const float inv = kcap_rsqrt(kcap_simd_sum(sq) / float(p.head_dim) + eps);
    KCAP_SHARED float* xs = shared + t.simd * p.head_dim;
    for (int d = int(t.lane); d < p.head_dim; d += KCAP_SIMD_WIDTH) xs[d] = x[d] * inv * w[d];
    kcap_simd_barrier();
    const int pairs = p.rope_dim / 2;
    const KCAP_GLOBAL float2* cs_row = cos_sin + kcap_u64(step[0] + m) * pairs;
    for (int i = int(t.lane); i < pairs; i += KCAP_SIMD_WIDTH) {
        const float2 cs = cs_row[i];
        const int a = p.neox ? i : 2 * i;
        const int b = p.neox ? i + pairs : 2 * i + 1;
        const float x0 = xs[a], x1 = xs[b];
        x[a] = x0 * cs.x - x1 * cs.y;
        x[b] = x0 * cs.y + x1 * cs.x;
    }
    for (int d = p.rope_dim + int(t.lane); d < p.head_dim; d += KCAP_SIMD_WIDTH) x[d] = xs[d];
}
