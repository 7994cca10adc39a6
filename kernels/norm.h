// RMS and Layer norm bodies: one group per row (a token's hidden row, or one head of it for
// QK-norm); y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * weight (+ bias), mean = 0 for RMS.
// In place is allowed (y == x): every read of a pass finishes at a barrier before any write.
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

// Sum of one value per thread over the group; every thread gets the total. `scratch` holds
// one float per simd group and is free again when this returns.
KCAP_FN float kcap_group_sum(const KcapThread t, float v, KCAP_SHARED float* scratch) {
    v = kcap_simd_sum(v);
    if (t.lane == 0) scratch[t.simd] = v;
    kcap_barrier();
    float total = 0.0f;
    for (unsigned i = 0; i < t.simds; ++i) total += scratch[i];
    kcap_barrier();
    return total;
}

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
        for (int i = int(t.thread); i < p.width; i += int(t.threads)) s += x[i];
        mean = kcap_group_sum(t, s, scratch) / float(p.width);
    }
    float sq = 0.0f;
    for (int i = int(t.thread); i < p.width; i += int(t.threads)) {
        const float c = x[i] - mean;
        sq += c * c;
    }
    const float inv = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / float(p.width) + p.eps);
    for (int i = int(t.thread); i < p.width; i += int(t.threads)) {
        float v = (x[i] - mean) * inv;
        if (p.has_weight) v *= weight[i];
        if (p.has_bias) v += bias[i];
        y[i] = v;
    }
}
