// Elementwise stages: residual add (with an optional branch scale), the final logit softcap
// and the scale (the logit scale, and a block's output scale applied to the residual in place).
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

// out = a + scale * b (scale 1 for a plain residual add). Grid: x = ceil(count / threads).
KCAP_FN void kcap_add(const KcapThread t, const KcapElementwiseParams p, const KCAP_GLOBAL float* a,
                      const KCAP_GLOBAL float* b, KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    if (i < kcap_u64(p.count)) out[i] = p.scale == 1.0f ? a[i] + b[i] : a[i] + p.scale * b[i];
}

// out = in * scale. Grid: x = ceil(count / threads).
KCAP_FN void kcap_scale(const KcapThread t, const KcapElementwiseParams p, const KCAP_GLOBAL float* in,
                        KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    if (i < kcap_u64(p.count)) out[i] = in[i] * p.scale;
}

// out = cap * tanh(in / cap). Grid: x = ceil(count / threads).
KCAP_FN void kcap_softcap(const KcapThread t, const KcapElementwiseParams p, const KCAP_GLOBAL float* in,
                          KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    if (i < kcap_u64(p.count)) out[i] = p.cap * kcap_tanh(in[i] / p.cap);
}
