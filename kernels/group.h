// Reductions over a whole group (threadgroup / thread block): one value per thread in, the
// result in every thread. `scratch` holds one float per simd group and is free again when
// they return (each ends with a barrier, so two calls in a row need nothing in between).
#pragma once

#include "kernels/dialect.h"

KCAP_FN float kcap_group_sum(const KcapThread t, float v, KCAP_SHARED float* scratch) {
    v = kcap_simd_sum(v);
    if (t.lane == 0) scratch[t.simd] = v;
    kcap_barrier();
    float total = 0.0f;
    for (unsigned i = 0; i < t.simds; ++i) total += scratch[i];
    kcap_barrier();
    return total;
}

KCAP_FN float kcap_group_max(const KcapThread t, float v, KCAP_SHARED float* scratch) {
    v = kcap_simd_max(v);
    if (t.lane == 0) scratch[t.simd] = v;
    kcap_barrier();
    float top = scratch[0];
    for (unsigned i = 1; i < t.simds; ++i) top = kcap_fmax(top, scratch[i]);
    kcap_barrier();
    return top;
}
