// RMS and Layer norm bodies: one group per row (a token's hidden row, or one head of it for
// QK-norm); y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * weight (+ bias), mean = 0 for RMS.
// In place is allowed (y == x): every read of a pass finishes at a barrier before any write.
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"
#include "kernels/group.h"

// Grid: x = rows. scratch: one float per simd group.
KCAP_FN void kcap_norm(const KcapThread t, const KcapNormParams p, const KCAP_GLOBAL float* x,
                       const KCAP_GLOBAL float* weight, const KCAP_GLOBAL float* bias, KCAP_GLOBAL float* y,
                       KCAP_SHARED float* scratch) {
    const kcap_u64 row = kcap_u64(t.group_x) * p.width;
    x += row;
    y += row;
    float mean = 0.0f;
    if (p.layer_norm) {
        float s = 0.0f;
        for (int i = int(t.index); i < p.width; i += int(t.threads)) s += x[i];
        mean = kcap_group_sum(t, s, scratch) / float(p.width);
    }
    float sq = 0.0f;
    for (int i = int(t.index); i < p.width; i += int(t.threads)) {
        const float c = x[i] - mean;
        sq += c * c;
    }
    const float inv = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / float(p.width) + p.eps);
    for (int i = int(t.index); i < p.width; i += int(t.threads)) {
        float v = (x[i] - mean) * inv;
        if (p.has_weight) v *= weight[i];
        if (p.has_bias) v += bias[i];
        y[i] = v;
    }
}

// Mean (Layer norm; 0 for RMS) and 1 / sqrt(variance + eps) of one row, read from global
// memory by the whole group (two passes for Layer norm, as the CPU reference does).
KCAP_FN void kcap_row_norm_stats(const KcapThread t, const KCAP_GLOBAL float* x, int width, int layer_norm, float eps,
                                 KCAP_SHARED float* scratch, KCAP_PRIVATE float* mean_out, KCAP_PRIVATE float* inv_out) {
    float mean = 0.0f;
    if (layer_norm) {
        float s = 0.0f;
        for (int i = int(t.index); i < width; i += int(t.threads)) s += x[i];
        mean = kcap_group_sum(t, s, scratch) / float(width);
    }
    float sq = 0.0f;
    for (int i = int(t.index); i < width; i += int(t.threads)) {
        const float c = x[i] - mean;
        sq += c * c;
    }
    *mean_out = mean;
    *inv_out = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / float(width) + eps);
}

// add_norm (KcapAddNormParams). Grid: x = tokens. scratch: one float per simd group. Each
// thread re-reads only the residual values it wrote itself, so no barrier guards them.
KCAP_FN void kcap_add_norm(const KcapThread t, const KcapAddNormParams p, KCAP_GLOBAL float* residual,
                           const KCAP_GLOBAL float* branch, const KCAP_GLOBAL float* post_weight,
                           const KCAP_GLOBAL float* post_bias, const KCAP_GLOBAL float* weight,
                           const KCAP_GLOBAL float* bias, KCAP_GLOBAL float* normed, KCAP_SHARED float* scratch) {
    const kcap_u64 row = kcap_u64(t.group_x) * p.width;
    residual += row;
    branch += row;
    normed += row;
    float post_mean = 0.0f, post_inv = 1.0f;
    if (p.has_post) kcap_row_norm_stats(t, branch, p.width, p.layer_norm, p.eps, scratch, &post_mean, &post_inv);
    float s = 0.0f, sq = 0.0f;
    for (int i = int(t.index); i < p.width; i += int(t.threads)) {
        float v = branch[i];
        if (p.has_post) {
            v = (v - post_mean) * post_inv;
            if (p.has_post_weight) v *= post_weight[i];
            if (p.has_post_bias) v += post_bias[i];
        }
        const float r = p.scale == 1.0f ? residual[i] + v : residual[i] + p.scale * v;
        residual[i] = r;
        s += r;
        sq += r * r;
    }
    float mean = 0.0f;
    if (p.layer_norm) {
        mean = kcap_group_sum(t, s, scratch) / float(p.width);
        sq = 0.0f;
        for (int i = int(t.index); i < p.width; i += int(t.threads)) {
            const float c = residual[i] - mean;
            sq += c * c;
        }
    }
    const float inv = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / float(p.width) + p.eps);
    for (int i = int(t.index); i < p.width; i += int(t.threads)) {
        float v = (residual[i] - mean) * inv;
        if (p.has_weight) v *= weight[i];
        if (p.has_bias) v += bias[i];
        normed[i] = v;
    }
}

// This thread's sum of (x - mean)^2 over its V float4s of a row of n4 float4s (kcap_add_norm_vec's layout).
template <int V>
KCAP_FN float kcap_sum_sq_dev4(const KcapThread t, const KCAP_PRIVATE float4* x, float mean, int n4) {
    float sq = 0.0f;
    KCAP_UNROLL for (int k = 0; k < V; ++k) {
        if (int(t.index) + k * int(t.threads) >= n4) continue;
        const float x0 = x[k].x - mean, x1 = x[k].y - mean, x2 = x[k].z - mean, x3 = x[k].w - mean;
        sq += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3;
    }
    return sq;
}

// add_norm with the row held in registers: V float4 per thread (value index 4 (index + r threads)
// .. +3, r < V; width % 4 == 0 and width <= 4 V threads), every operand loaded in one batch and
// the row read once, so a token's add_norm is one memory round trip and two group reductions
// (kcap_add_norm walks the row three times). The same per-element arithmetic as kcap_add_norm; the
// sums are taken in another order. normed_out: this thread's normed float4s (zeros past width),
// for an epilogue (cuda.add_norm's q8_1 rows). Grid: x = tokens.
template <int V>
KCAP_FN void kcap_add_norm_vec(const KcapThread t, const KcapAddNormParams p, KCAP_GLOBAL float* residual,
                               const KCAP_GLOBAL float* branch, const KCAP_GLOBAL float* post_weight,
                               const KCAP_GLOBAL float* post_bias, const KCAP_GLOBAL float* weight,
                               const KCAP_GLOBAL float* bias, KCAP_GLOBAL float* normed, KCAP_SHARED float* scratch,
                               KCAP_PRIVATE float4* normed_out) {
    const kcap_u64 row = kcap_u64(t.group_x) * p.width;
    residual += row;
    branch += row;
    normed += row;
    const int n4 = p.width / 4;
    const float4 zero = float4{0.0f, 0.0f, 0.0f, 0.0f};
    float4 b[V], r[V], w[V], c[V], pw[V], pb[V];
    KCAP_UNROLL for (int k = 0; k < V; ++k) {
        const int i = int(t.index) + k * int(t.threads);
        const bool in = i < n4;
        b[k] = in ? kcap_load_f32x4(branch + 4 * i) : zero;
        r[k] = in ? kcap_load_f32x4(residual + 4 * i) : zero;
        w[k] = in && p.has_weight ? kcap_load_f32x4(weight + 4 * i) : zero;
        c[k] = in && p.has_bias ? kcap_load_f32x4(bias + 4 * i) : zero;
        pw[k] = in && p.has_post && p.has_post_weight ? kcap_load_f32x4(post_weight + 4 * i) : zero;
        pb[k] = in && p.has_post && p.has_post_bias ? kcap_load_f32x4(post_bias + 4 * i) : zero;
    }
    const float width = float(p.width);
    if (p.has_post) {
        float post_mean = 0.0f;
        if (p.layer_norm) {
            float s = 0.0f;
            KCAP_UNROLL for (int k = 0; k < V; ++k) s += b[k].x + b[k].y + b[k].z + b[k].w;
            post_mean = kcap_group_sum(t, s, scratch) / width;
        }
        const float sq = kcap_sum_sq_dev4<V>(t, b, post_mean, n4);
        const float post_inv = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / width + p.eps);
        KCAP_UNROLL for (int k = 0; k < V; ++k) {
            float4 v = float4{(b[k].x - post_mean) * post_inv, (b[k].y - post_mean) * post_inv,
                              (b[k].z - post_mean) * post_inv, (b[k].w - post_mean) * post_inv};
            if (p.has_post_weight) v = float4{v.x * pw[k].x, v.y * pw[k].y, v.z * pw[k].z, v.w * pw[k].w};
            if (p.has_post_bias) v = float4{v.x + pb[k].x, v.y + pb[k].y, v.z + pb[k].z, v.w + pb[k].w};
            b[k] = v;
        }
    }
    float s = 0.0f, sq = 0.0f;
    KCAP_UNROLL for (int k = 0; k < V; ++k) {
        const int i = int(t.index) + k * int(t.threads);
        if (i >= n4) continue;
        float4 v = r[k];
        if (p.scale == 1.0f)
            v = float4{v.x + b[k].x, v.y + b[k].y, v.z + b[k].z, v.w + b[k].w};
        else
            v = float4{v.x + p.scale * b[k].x, v.y + p.scale * b[k].y, v.z + p.scale * b[k].z, v.w + p.scale * b[k].w};
        r[k] = v;
        kcap_store_f32x4(residual + 4 * i, v);
        s += v.x + v.y + v.z + v.w;
        sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    float mean = 0.0f;
    if (p.layer_norm) {
        mean = kcap_group_sum(t, s, scratch) / width;
        sq = kcap_sum_sq_dev4<V>(t, r, mean, n4);
    }
    const float inv = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / width + p.eps);
    KCAP_UNROLL for (int k = 0; k < V; ++k) {
        const int i = int(t.index) + k * int(t.threads);
        normed_out[k] = zero;
        if (i >= n4) continue;
        float4 v = float4{(r[k].x - mean) * inv, (r[k].y - mean) * inv, (r[k].z - mean) * inv, (r[k].w - mean) * inv};
        if (p.has_weight) v = float4{v.x * w[k].x, v.y * w[k].y, v.z * w[k].z, v.w * w[k].w};
        if (p.has_bias) v = float4{v.x + c[k].x, v.y + c[k].y, v.z + c[k].z, v.w + c[k].w};
        kcap_store_f32x4(normed + 4 * i, v);
        normed_out[k] = v;
    }
}
