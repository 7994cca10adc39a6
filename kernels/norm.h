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
