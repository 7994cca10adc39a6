// Elementwise stages: residual add and the final logit softcap.
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

// out = a + b. Grid: x = ceil(count / threads).
KCAP_FN void kcap_add(const KcapThread t, const KcapElementwiseParams p, const KCAP_GLOBAL float* a,
                      const KCAP_GLOBAL float* b, KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.thread;
    if (i < kcap_u64(p.count)) out[i] = a[i] + b[i];
}

// out = cap * tanh(in / cap). Grid: x = ceil(count / threads).
KCAP_FN void kcap_softcap(const KcapThread t, const KcapElementwiseParams p, const KCAP_GLOBAL float* in,
                          KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.thread;
    if (i < kcap_u64(p.count)) out[i] = p.cap * kcap_tanh(in[i] / p.cap);
}
